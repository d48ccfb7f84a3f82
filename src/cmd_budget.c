/* leash budget: provider budgets, stored in <table>_budgets so every process shares them
   (sql/014_budgets.sql). */
#include "commands.h"
#include "migrate.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUDGET_NAME_MAX 200   /* the column's CHECK */
#define PAUSE_MAX_S 86400.0

static const char usage[] =
  "usage: leash budget set NAME [--rpm N] [--tpm N] [--concurrency N] [--window D]\n"
  "       leash budget show [NAME] [--json]\n"
  "       leash budget pause NAME --for DURATION [--reason TEXT]\n"
  "       leash budget resume NAME\n"
  "       leash budget delete NAME\n\n"
  "A budget limits the calls scripts make to a provider, for every process and pod at\n"
  "once: scripts name it on a call (leash.http.request{..., budget = NAME, tokens = N}) or\n"
  "around a block (leash.budget.hold). Limits count a sliding minute, as providers do. A\n"
  "429 or 503 on a budgeted call pauses the budget for the fleet for as long as the provider\n"
  "asked (Retry-After or its rate-limit reset headers); tasks waiting on it give their slot\n"
  "back after --budget-wait and spend no attempt. A name no one has set has no limits.\n\n"
  "  set NAME              create or change limits (options not given stay as they are)\n"
  "  show [NAME]           limits, the last minute's use, calls in flight, pauses, totals\n"
  "  pause NAME            no grants until --for has passed (extends, never shortens)\n"
  "  resume NAME           end a pause now\n"
  "  delete NAME           forget the budget and its window (it has no limits again)\n\n"
  "options:\n"
  "  --rpm N               requests per minute (an integer >= 1, or none)\n"
  "  --tpm N               tokens per minute (an integer >= 1, or none)\n"
  "  --concurrency N       calls in flight at once (an integer >= 1, or none)\n"
  "  --window DURATION     the sliding window rpm and tpm count (default 1m; e.g. 1s for a\n"
  "                        per-second limit: --rpm is then requests per second)\n"
  "  --for DURATION        how long a pause lasts (500ms, 30s, 5m, 2h; at most 24h)\n"
  "  --reason TEXT         why, shown by show and status (at most 300 bytes)\n"
  "  --json                show as one JSON object (fields documented in README.md)\n\n";

enum { OPT_RPM = OPT_COMMAND_BASE, OPT_TPM, OPT_CONCURRENCY, OPT_FOR, OPT_REASON, OPT_JSON,
       OPT_WINDOW };

/* $1 name, $2..$4 the limits as text: NULL = keep, '' = none, else the number; $5 the
   window in seconds (NULL = keep). %s: the budgets table. */
static const char set_fmt[] =
  "INSERT INTO %s AS b (name, rpm, tpm, concurrency, window_s) "
  "VALUES ($1, nullif($2, '')::int, nullif($3, '')::bigint, nullif($4, '')::int, "
  "        coalesce($5::float8, 60)) "
  "ON CONFLICT (name) DO UPDATE SET "
  "  rpm = CASE WHEN $2 IS NULL THEN b.rpm ELSE nullif($2, '')::int END, "
  "  tpm = CASE WHEN $3 IS NULL THEN b.tpm ELSE nullif($3, '')::bigint END, "
  "  concurrency = CASE WHEN $4 IS NULL THEN b.concurrency ELSE nullif($4, '')::int END, "
  "  window_s = coalesce($5::float8, b.window_s), aimd = NULL, updated_at = now() "
  "RETURNING coalesce(b.rpm::text, 'none'), coalesce(b.tpm::text, 'none'), "
  "          coalesce(b.concurrency::text, 'none'), b.window_s::text";

/* %s: <table>_budget_pause. $1 name, $2 seconds, $3 reason. */
static const char pause_fmt[] = "SELECT round(%s($1, $2::float8, $3)::numeric, 1)::text";

/* %s: <table>_budget_resume. A row (true) when the budget exists. */
static const char resume_fmt[] = "SELECT 1 WHERE %s($1)";

/* %s: the budgets table, <table>_unhold (its tasks are no longer held). */
static const char delete_fmt[] =
  "WITH d AS (DELETE FROM %s WHERE name = $1 RETURNING name) "
  "SELECT %s('budget', name, 'provider') FROM d";

/* Every budget (or $1's) as JSON built by PostgreSQL, in one snapshot. %s: budgets, calls. */
static const char show_fmt[] =
  "SELECT json_build_object('budgets', coalesce(json_agg(json_build_object("
  "    'name', b.name, 'rpm', b.rpm, 'tpm', b.tpm, 'concurrency', b.concurrency,"
  "    'window_s', b.window_s,"
  "    'effective_concurrency', floor(b.aimd)::int,"
  "    'requests_in_window', coalesce(w.n, 0), 'tokens_in_window', coalesce(w.tokens, 0),"
  "    'in_flight', coalesce(w.active, 0),"
  "    'paused', coalesce(b.paused_until > now(), false),"
  "    'paused_for_s', CASE WHEN b.paused_until > now()"
  "                         THEN round(extract(epoch FROM b.paused_until - now())::numeric, 1)"
  "                    END,"
  "    'pause_reason', CASE WHEN b.paused_until > now() THEN b.pause_reason END,"
  "    'requests', b.requests, 'tokens', b.tokens, 'refused', b.refused)"
  "    ORDER BY b.name COLLATE \"C\"), '[]'))::text "
  "  FROM %s b "
  "  LEFT JOIN LATERAL ("
  "    SELECT count(*) FILTER (WHERE c.at >= now() - make_interval(secs => b.window_s)) AS n,"
  "           sum(c.tokens) FILTER (WHERE c.at >= now() - make_interval(secs => b.window_s))"
  "             AS tokens,"
  "           count(*) FILTER (WHERE NOT c.released AND c.hold_until > now()) AS active"
  "      FROM %s c WHERE c.budget = b.name) w ON true "
  " WHERE $1::text IS NULL OR b.name = $1";

static int check_name(struct cli *g, const char *name);
static int check_limit(struct cli *g, const char *flag, const char *arg, long long max);
static int run_sql(struct cli *g, PGconn *c, const char *fmt, const char *a, const char *b,
                   int n, const char *const *params, PGresult **out);
static int show(struct cli *g, PGconn *c, const char *budgets, const char *calls,
                const char *name, int as_json);

int cmd_budget(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "rpm", required_argument, NULL, OPT_RPM },
    { "tpm", required_argument, NULL, OPT_TPM },
    { "concurrency", required_argument, NULL, OPT_CONCURRENCY },
    { "for", required_argument, NULL, OPT_FOR },
    { "reason", required_argument, NULL, OPT_REASON },
    { "json", no_argument, NULL, OPT_JSON },
    { "window", required_argument, NULL, OPT_WINDOW },
    { NULL, 0, NULL, 0 },
  };
  const char *limits[3] = { NULL, NULL, NULL };   /* rpm, tpm, concurrency */
  const char *reason = NULL;
  double for_s = -1, window_s = -1;
  int as_json = 0, opt, rc;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_RPM:
    case OPT_TPM:
    case OPT_CONCURRENCY: {
      static const char *const flags[] = { "--rpm", "--tpm", "--concurrency" };
      int k = opt - OPT_RPM;
      if ((rc = check_limit(g, flags[k], optarg, k == 1 ? 1000000000000LL : 2147483647LL)) != 0)
        return rc;
      limits[k] = strcmp(optarg, "none") == 0 ? "" : optarg;
      break;
    }
    case OPT_FOR:
      if (cli_parse_duration(optarg, &for_s) != 0 || !(for_s > 0) || for_s > PAUSE_MAX_S)
        return cli_usage_error(g, "--for must be a duration above 0 and at most 24h "
                               "(e.g. 90s, 5m), not '%s'", optarg);
      break;
    case OPT_REASON:
      if (strlen(optarg) > 300)
        return cli_usage_error(g, "--reason is %zu bytes; at most 300", strlen(optarg));
      reason = optarg;
      break;
    case OPT_JSON: as_json = 1; break;
    case OPT_WINDOW:
      if (cli_parse_duration(optarg, &window_s) != 0 || !(window_s >= 0.1) || window_s > 86400)
        return cli_usage_error(g, "--window must be a duration from 100ms to 24h (e.g. 1s, "
                               "1m), not '%s'", optarg);
      break;
    }
  }
  if (optind >= argc)
    return cli_usage_error(g, "missing what to do: set, show, pause, resume or delete");
  const char *sub = argv[optind++];
  int args = argc - optind;
  const char *name = args > 0 ? argv[optind] : NULL;
  int is_set = !strcmp(sub, "set"), is_show = !strcmp(sub, "show"),
      is_pause = !strcmp(sub, "pause"), is_resume = !strcmp(sub, "resume"),
      is_delete = !strcmp(sub, "delete");
  if (!is_set && !is_show && !is_pause && !is_resume && !is_delete)
    return cli_usage_error(g, "unknown action '%s' (set, show, pause, resume or delete)", sub);
  if (args > 1 || (!is_show && args != 1))
    return cli_usage_error(g, args ? "%s takes one budget NAME" : "%s: missing the budget NAME",
                           sub);
  if ((limits[0] || limits[1] || limits[2] || window_s >= 0) && !is_set)
    return cli_usage_error(g, "--rpm, --tpm, --concurrency and --window go with set");
  if ((for_s >= 0 || reason) && !is_pause)
    return cli_usage_error(g, "--for and --reason go with pause");
  if (is_pause && for_s < 0)
    return cli_usage_error(g, "pause: missing --for DURATION");
  if (as_json && !is_show)
    return cli_usage_error(g, "--json goes with show");
  if (name && (rc = check_name(g, name)) != EXIT_OK)
    return rc;

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "budget", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX];
  char *budgets = db_table_object(&t, c, "budgets", 1);
  char *calls = db_table_object(&t, c, "budget_calls", 1);
  char *pause_f = db_table_object(&t, c, "budget_pause", 1);
  char *resume_f = db_table_object(&t, c, "budget_resume", 1);
  char *unhold_f = db_table_object(&t, c, "unhold", 1);
  PGresult *r = NULL;
  if (migrate_check(c, &t, err, sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
  } else if (!budgets || !calls || !pause_f || !resume_f || !unhold_f) {
    rc = cli_runtime_error(g, "out of memory");
  } else if (is_show) {
    rc = show(g, c, budgets, calls, name, as_json);
  } else if (is_set) {
    char win[32];
    snprintf(win, sizeof win, "%.3f", window_s);
    const char *params[] = { name, limits[0], limits[1], limits[2], window_s >= 0 ? win : NULL };
    if ((rc = run_sql(g, c, set_fmt, budgets, NULL, 5, params, &r)) == EXIT_OK)
      printf("budget %s: rpm %s, tpm %s, concurrency %s, window %s s\n", name,
             PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 3));
  } else if (is_pause) {
    char secs[32];
    snprintf(secs, sizeof secs, "%.3f", for_s);
    const char *params[] = { name, secs, reason ? reason : "leash budget pause" };
    if ((rc = run_sql(g, c, pause_fmt, pause_f, NULL, 3, params, &r)) == EXIT_OK)
      printf("budget %s: paused for %s s\n", name, PQgetvalue(r, 0, 0));
  } else {
    const char *params[] = { name };
    if ((rc = is_resume ? run_sql(g, c, resume_fmt, resume_f, NULL, 1, params, &r)
                        : run_sql(g, c, delete_fmt, budgets, unhold_f, 1, params, &r)) == EXIT_OK) {
      if (PQntuples(r) == 0)
        rc = cli_data_error(g, "no budget named '%s'", name);
      else
        printf("budget %s: %s\n", name, is_resume ? "resumed" : "deleted");
    }
  }
  PQclear(r);
  free(budgets);
  free(calls);
  free(pause_f);
  free(resume_f);
  free(unhold_f);
  cli_close(c, &t);
  return rc;
}

/* The bounds of the column's CHECK, and no control characters (names are printed). */
static int check_name(struct cli *g, const char *name)
{
  size_t len = strlen(name);
  if (len == 0 || len > BUDGET_NAME_MAX)
    return cli_usage_error(g, "a budget NAME is 1 to %d bytes (this one is %zu)",
                           BUDGET_NAME_MAX, len);
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    if (*p < 0x20 || *p == 0x7f)
      return cli_usage_error(g, "a budget NAME may not hold control characters");
  return EXIT_OK;
}

static int check_limit(struct cli *g, const char *flag, const char *arg, long long max)
{
  long n;
  if (strcmp(arg, "none") == 0)
    return EXIT_OK;
  if (cli_parse_int(arg, 1, (long)max, &n) != 0)
    return cli_usage_error(g, "%s must be an integer from 1 to %lld, or none, not '%s'", flag,
                           max, arg);
  return EXIT_OK;
}

/* fmt with a (and b) pasted, run with params; the result in *out. */
static int run_sql(struct cli *g, PGconn *c, const char *fmt, const char *a, const char *b,
                   int n, const char *const *params, PGresult **out)
{
  size_t len = strlen(fmt) + strlen(a) * 2 + (b ? strlen(b) : 0) + 1;
  char *sql = malloc(len), err[DB_ERR_MAX];
  if (!sql)
    return cli_runtime_error(g, "out of memory");
  if (b)
    snprintf(sql, len, fmt, a, b);
  else
    snprintf(sql, len, fmt, a, a);
  *out = db_exec(c, sql, n, params, err, sizeof err);
  free(sql);
  if (*out)
    return EXIT_OK;
  if (strncmp(db_last_sqlstate(), "22", 2) == 0 || strncmp(db_last_sqlstate(), "23", 2) == 0)
    return cli_data_error(g, "%s; nothing was written", err);
  return cli_runtime_error(g, "%s", err);
}

static int show(struct cli *g, PGconn *c, const char *budgets, const char *calls,
                const char *name, int as_json)
{
  PGresult *r;
  const char *params[] = { name };
  int rc = run_sql(g, c, show_fmt, budgets, calls, 1, params, &r);
  if (rc != EXIT_OK)
    return rc;
  json_error_t je;
  json_t *o = json_loads(PQgetvalue(r, 0, 0), 0, &je);
  PQclear(r);
  if (!o)
    return cli_runtime_error(g, "unreadable JSON from the server: %s", je.text);
  json_t *list = json_object_get(o, "budgets"), *e;
  if (name && json_array_size(list) == 0) {
    json_decref(o);
    return cli_data_error(g, "no budget named '%s'", name);
  }
  if (as_json) {
    return cli_print_json(g, o);   /* compact, one line, as status and report print theirs */
  }
  size_t i;
  printf("%-24s %15s %19s %11s  %s\n", "budget", "rpm (used)", "tpm (used)", "in flight",
         "state");
  json_array_foreach(list, i, e) {
    char rpm[40], tpm[48], conc[40], state[400];
    json_t *lim;
    long long used_r = json_integer_value(json_object_get(e, "requests_in_window"));
    long long used_t = json_integer_value(json_object_get(e, "tokens_in_window"));
    long long fl = json_integer_value(json_object_get(e, "in_flight"));
    if (json_is_integer(lim = json_object_get(e, "rpm")))
      snprintf(rpm, sizeof rpm, "%lld (%lld)", (long long)json_integer_value(lim), used_r);
    else
      snprintf(rpm, sizeof rpm, "- (%lld)", used_r);
    if (json_is_integer(lim = json_object_get(e, "tpm")))
      snprintf(tpm, sizeof tpm, "%lld (%lld)", (long long)json_integer_value(lim), used_t);
    else
      snprintf(tpm, sizeof tpm, "- (%lld)", used_t);
    json_t *eff = json_object_get(e, "effective_concurrency");
    lim = json_object_get(e, "concurrency");
    if (json_is_integer(eff))
      snprintf(conc, sizeof conc, "%lld/%lld", fl, (long long)json_integer_value(eff));
    else if (json_is_integer(lim))
      snprintf(conc, sizeof conc, "%lld/%lld", fl, (long long)json_integer_value(lim));
    else
      snprintf(conc, sizeof conc, "%lld", fl);
    if (json_is_true(json_object_get(e, "paused"))) {
      const char *why = json_string_value(json_object_get(e, "pause_reason"));
      snprintf(state, sizeof state, "paused %.1f s: %s",
               json_number_value(json_object_get(e, "paused_for_s")), why ? why : "");
      for (char *p = state; *p; p++)   /* a reason cannot forge a line or move the cursor */
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
          *p = '?';
    } else
      snprintf(state, sizeof state, "%s", json_is_integer(eff) ? "ramping up after a refusal"
                                                               : "open");
    printf("%-24s %15s %19s %11s  %s\n", json_string_value(json_object_get(e, "name")), rpm,
           tpm, conc, state);
  }
  json_decref(o);
  return EXIT_OK;
}
