/* leash pause / leash resume: holds on a tenant, a batch or a budget, which claims skip
   (sql/013_holds.sql). The tasks stay pending; running ones finish. */
#include "commands.h"
#include "lifecycle.h"
#include "migrate.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAUSE_MAX_S (365.0 * 86400)

static const char pause_usage[] =
  "usage: leash pause (--tenant T | --batch B | --budget NAME) [--for DURATION] [--reason TEXT]\n"
  "       leash pause --list [--json]\n\n"
  "Claims skip the scope's tasks until it is resumed (or --for has passed): they stay\n"
  "pending and cost the claims nothing while they wait; tasks already running finish. Every\n"
  "worker sees the pause at its next claim. Pausing a paused scope extends it (a pause with\n"
  "no end stays without one) and replaces the reason.\n\n"
  "options:\n"
  "  --tenant T            the tenant's tasks\n"
  "  --batch B             the batch's tasks\n"
  "  --budget NAME         the tasks enqueued with --budget NAME (a provider's pause does the\n"
  "                        same by itself: see leash budget)\n"
  "  --for DURATION        end the pause by itself after DURATION (30s, 10m, 2h; default: none)\n"
  "  --reason TEXT         why, shown by --list (at most 300 bytes)\n"
  "  --list                the scopes paused now: kind, scope, by, pending tasks, until, reason\n"
  "  --json                --list as one JSON object\n\n";

static const char resume_usage[] =
  "usage: leash resume (--tenant T | --batch B | --budget NAME)\n\n"
  "Lifts a pause made by leash pause (or a budget's): the scope's tasks are claimed again at\n"
  "once (idle workers are woken). A budget's provider pause is lifted too; a spend cap is\n"
  "lifted by raising it (leash spend cap).\n\n"
  "options:\n"
  "  --tenant T            the tenant's tasks\n"
  "  --batch B             the batch's tasks\n"
  "  --budget NAME         the tasks enqueued with --budget NAME\n\n";

enum { OPT_TENANT = OPT_COMMAND_BASE, OPT_BATCH, OPT_BUDGET, OPT_FOR, OPT_REASON, OPT_LIST,
       OPT_JSON };

/* %s: <table>_hold. $1 kind, $2 scope, $3 seconds (NULL: none), $4 reason. */
static const char hold_fmt[] =
  "SELECT %s($1, $2, 'pause', now() + make_interval(secs => $3::float8), $4)";

/* %s: <table>_unhold, then <table>_budget_resume (a budget's provider pause goes too; a spend
   cap stays until it is raised). */
static const char unhold_fmt[] =
  "SELECT %s($1, $2, 'pause') OR ($1 = 'budget' AND %s($2))";

/* The holds as JSON, with the pending tasks each covers (counted from the row's own columns:
   a scan of the pending rows, fine for a command). %s: holds, the queue. */
static const char list_fmt[] =
  "SELECT json_build_object('holds', coalesce(json_agg(json_build_object("
  "    'kind', h.kind, 'scope', h.scope, 'by', h.source,"
  "    'until', to_char(h.until AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
  "    'reason', h.reason, 'pending', ("
  "      SELECT count(*) FROM %s q WHERE q.status = " SQL_PENDING
  "         AND CASE h.kind WHEN 'tenant' THEN q.tenant_id WHEN 'batch' THEN q.batch"
  "                         ELSE q.budget END = h.scope))"
  "    ORDER BY h.kind, h.scope COLLATE \"C\"), '[]'))::text "
  "  FROM %s h WHERE h.until IS NULL OR h.until > now()";

struct scope {
  const char *kind, *value;
};

/* EXIT_OK to go on, or the exit status (after --help too: *stop set). */
static int parse(struct cli *g, int argc, char **argv, int pausing, struct scope *s,
                 double *for_s, const char **reason, int *list, int *as_json, int *stop);
static int print_list(struct cli *g, PGconn *c, const struct db_table *t, int as_json);
static int run(struct cli *g, const char *role, int pausing, int argc, char **argv);

int cmd_pause(struct cli *g, int argc, char **argv)
{
  return run(g, "pause", 1, argc, argv);
}

int cmd_resume(struct cli *g, int argc, char **argv)
{
  return run(g, "resume", 0, argc, argv);
}

static int run(struct cli *g, const char *role, int pausing, int argc, char **argv)
{
  struct scope s = { NULL, NULL };
  double for_s = -1;
  const char *reason = NULL;
  int list = 0, as_json = 0, stop = 0, rc;
  if ((rc = parse(g, argc, argv, pausing, &s, &for_s, &reason, &list, &as_json, &stop)) != EXIT_OK ||
      stop)
    return rc;
  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, role, &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX];
  char *a = db_table_object(&t, c, pausing ? "hold" : "unhold", 1);
  char *b = db_table_object(&t, c, "budget_resume", 1);
  char *sql = NULL;
  if (migrate_check(c, &t, err, sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
  } else if (!a || !b) {
    rc = cli_runtime_error(g, "out of memory");
  } else if (list) {
    rc = print_list(g, c, &t, as_json);
  } else {
    size_t n = sizeof unhold_fmt + strlen(a) + strlen(b) + sizeof hold_fmt;
    if (!(sql = malloc(n))) {
      rc = cli_runtime_error(g, "out of memory");
    } else {
      char secs[32];
      snprintf(secs, sizeof secs, "%.3f", for_s);
      if (pausing)
        snprintf(sql, n, hold_fmt, a);
      else
        snprintf(sql, n, unhold_fmt, a, b);
      const char *pp[] = { s.kind, s.value, for_s >= 0 ? secs : NULL,
                           reason ? reason : "leash pause" };
      PGresult *r = db_exec(c, sql, pausing ? 4 : 2, pp, err, sizeof err);
      if (!r) {
        rc = strncmp(db_last_sqlstate(), "22", 2) == 0 || strncmp(db_last_sqlstate(), "23", 2) == 0
               ? cli_data_error(g, "%s; nothing was changed", err)
               : cli_runtime_error(g, "%s", err);
      } else {
        if (pausing && for_s >= 0)
          printf("paused %s %s for %g s\n", s.kind, s.value, for_s);
        else if (pausing)
          printf("paused %s %s until resumed\n", s.kind, s.value);
        else
          printf(strcmp(PQgetvalue(r, 0, 0), "t") == 0 ? "resumed %s %s\n"
                                                      : "%s %s was not paused\n",
                 s.kind, s.value);
        PQclear(r);
      }
    }
  }
  free(sql);
  free(a);
  free(b);
  cli_close(c, &t);
  return rc;
}

static int parse(struct cli *g, int argc, char **argv, int pausing, struct scope *s,
                 double *for_s, const char **reason, int *list, int *as_json, int *stop)
{
  static const struct option pause_opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "budget", required_argument, NULL, OPT_BUDGET },
    { "for", required_argument, NULL, OPT_FOR },
    { "reason", required_argument, NULL, OPT_REASON },
    { "list", no_argument, NULL, OPT_LIST },
    { "json", no_argument, NULL, OPT_JSON },
    { NULL, 0, NULL, 0 },
  };
  static const struct option resume_opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "budget", required_argument, NULL, OPT_BUDGET },
    { NULL, 0, NULL, 0 },
  };
  const struct option *opts = pausing ? pause_opts : resume_opts;
  int opt, rc, scopes = 0;
  g->usage = pausing ? pause_usage : resume_usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP) {
      *stop = 1;
      return rc;
    }
    switch (opt) {
    case OPT_TENANT:
    case OPT_BATCH:
    case OPT_BUDGET: {
      static const char *const kinds[] = { "tenant", "batch", "budget" };
      static const char *const fields[] = { "tenant_id", "batch", "budget" };
      int k = opt - OPT_TENANT;
      size_t len = strlen(optarg);
      size_t max = k == 0 ? LIFECYCLE_MAX_TENANT_BYTES
                 : k == 1 ? LIFECYCLE_MAX_BATCH_BYTES : LIFECYCLE_MAX_BUDGET_BYTES;
      if (len == 0 || len > max)
        return cli_usage_error(g, "--%s must be 1 to %zu bytes (the %s column's bounds)",
                               kinds[k], max, fields[k]);
      s->kind = kinds[k];
      s->value = optarg;
      scopes++;
      break;
    }
    case OPT_FOR:
      if (cli_parse_duration(optarg, for_s) != 0 || !(*for_s > 0) || *for_s > PAUSE_MAX_S)
        return cli_usage_error(g, "--for must be a duration above 0 and at most a year "
                               "(e.g. 90s, 10m, 2h), not '%s'", optarg);
      break;
    case OPT_REASON:
      if (strlen(optarg) > 300)
        return cli_usage_error(g, "--reason is %zu bytes; at most 300", strlen(optarg));
      *reason = optarg;
      break;
    case OPT_LIST:
    case OPT_JSON:
      *(opt == OPT_LIST ? list : as_json) = 1;
      break;
    }
  }
  if (optind < argc)
    return cli_usage_error(g, "unexpected argument '%s'", argv[optind]);
  if (*as_json && !*list)
    return cli_usage_error(g, "--json goes with --list");
  if (*list && (scopes || *for_s >= 0 || *reason))
    return cli_usage_error(g, "--list takes no scope, --for or --reason");
  if (!*list && scopes != 1)
    return cli_usage_error(g, scopes ? "give one scope: --tenant, --batch or --budget"
                                     : "missing the scope: --tenant T, --batch B or --budget NAME");
  return EXIT_OK;
}

static int print_list(struct cli *g, PGconn *c, const struct db_table *t, int as_json)
{
  char err[DB_ERR_MAX];
  char *holds = db_table_object(t, c, "holds", 1);
  size_t n = sizeof list_fmt + strlen(t->qualified) + (holds ? strlen(holds) : 0);
  char *sql = holds ? malloc(n) : NULL;
  if (!sql) {
    free(holds);
    return cli_runtime_error(g, "out of memory");
  }
  snprintf(sql, n, list_fmt, t->qualified, holds);
  free(holds);
  PGresult *r = db_exec(c, sql, 0, NULL, err, sizeof err);
  free(sql);
  if (!r)
    return cli_runtime_error(g, "%s", err);
  json_error_t je;
  json_t *o = json_loads(PQgetvalue(r, 0, 0), 0, &je);
  PQclear(r);
  if (!o)
    return cli_runtime_error(g, "unreadable JSON from the server: %s", je.text);
  if (as_json) {
    return cli_print_json(g, o);   /* compact, one line, as status and report print theirs */
  }
  json_t *list = json_object_get(o, "holds"), *e;
  size_t i;
  printf("%-7s %-30s %-9s %9s  %-27s  %s\n", "kind", "scope", "by", "pending", "until",
         "reason");
  json_array_foreach(list, i, e) {
    char line[1200];
    const char *until = json_string_value(json_object_get(e, "until"));
    const char *why = json_string_value(json_object_get(e, "reason"));
    snprintf(line, sizeof line, "%-7s %-30s %-9s %9lld  %-27s  %s",
             json_string_value(json_object_get(e, "kind")),
             json_string_value(json_object_get(e, "scope")),
             json_string_value(json_object_get(e, "by")),
             (long long)json_integer_value(json_object_get(e, "pending")),
             until ? until : "resumed by hand", why ? why : "");
    for (char *p = line; *p; p++)   /* names and reasons cannot forge a line */
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        *p = '?';
    printf("%s\n", line);
  }
  json_decref(o);
  return EXIT_OK;
}
