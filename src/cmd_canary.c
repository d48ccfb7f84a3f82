/* leash canary: start, watch, promote, roll back or abort the table's canary (sql/018). */
#include "canary.h"
#include "commands.h"
#include "migrate.h"
#include "queue.h"
#include "script.h"
#include "secrets.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
  "usage: leash canary start NEXT.lua --share P% [--min-tasks N] [--max-fatal-rate-delta D]\n"
  "                          [--max-retry-rate-delta D] [--auto-promote|--wait-promote]\n"
  "                          [--lua-path DIR]...\n"
  "       leash canary status [--json]\n"
  "       leash canary promote | rollback | abort\n\n"
  "Runs a candidate script for a share of the tasks on every `leash run` of the table, beside\n"
  "the current version, and judges it from the attempt history of all pods. start loads the\n"
  "candidate as `leash check` does and stores its text and version in the database (at most\n"
  "one canary runs per table); each worker loads that text within a second, with modules from\n"
  "its own folders (put the candidate beside the running script). A task runs the candidate\n"
  "when a hash of its id falls under the share, on every pod and every attempt.\n\n"
  "The verdict (one for the fleet, taken in SQL): the candidate's failure rate (fatal, crash,\n"
  "lost), retry rate and the two together against the current version's since the start,\n"
  "each by a one-sided two-proportion z-test: before min-tasks candidate executions a\n"
  "rollback needs z > 3.09 (p < 0.001, at least 20 executions each side), from min-tasks on\n"
  "z > 2.326 (p < 0.01), and the rate difference above its threshold (below; the larger for\n"
  "the two together). A candidate not worse after min-tasks is\n"
  "promoted (--auto-promote, the default) or waits for `leash canary promote`. A rollback gives\n"
  "the tasks whose last attempt failed on the candidate that attempt back: pending again, so\n"
  "they run on the current version. abort drops the candidate and gives nothing back.\n\n"
  "options:\n"
  "  --share P%              percent of tasks, 1..100 (the % is optional)\n"
  "  --min-tasks N           candidate executions before it can pass (default 200)\n"
  "  --max-fatal-rate-delta D  failure-rate difference that counts, 0..1 (default 0.02)\n"
  "  --max-retry-rate-delta D  retry-rate difference that counts, 0..1 (default 0.05)\n"
  "  --auto-promote          promote a candidate that passes (default)\n"
  "  --wait-promote          a candidate that passes waits for `leash canary promote`\n"
  "  --lua-path DIR          module folder for start's check (repeatable)\n"
  "  --json                  status as one JSON object\n\n";

enum { OPT_SHARE = OPT_COMMAND_BASE, OPT_MIN_TASKS, OPT_FAIL_DELTA, OPT_RETRY_DELTA,
       OPT_AUTO, OPT_WAIT, OPT_LUA_PATH, OPT_JSON };

#define MAX_LUA_PATH 64

static int canary_start_cmd(struct cli *g, PGconn *c, const struct db_table *t,
                            const char *path, const char *const *lua_path, int nlua_path,
                            long share, long min_tasks, double fail_delta, double retry_delta,
                            int auto_promote);
static int canary_status_cmd(struct cli *g, PGconn *c, const struct db_table *t, int json);
static int canary_decide_cmd(struct cli *g, PGconn *c, const struct db_table *t,
                             const char *state);
static void tell_workers(PGconn *c, const struct db_table *t);

static int parse_delta(struct cli *g, const char *name, const char *s, double *out)
{
  char *end;
  double v = strtod(s, &end);
  if (!*s || *end || !isfinite(v) || v < 0 || v > 1)
    return cli_usage_error(g, "%s must be a rate difference between 0 and 1, not '%s'", name, s);
  *out = v;
  return 0;
}

static const char *who(void)
{
  const char *u = getenv("USER");
  return u && *u ? u : "unknown";
}

int cmd_canary(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "share", required_argument, NULL, OPT_SHARE },
    { "min-tasks", required_argument, NULL, OPT_MIN_TASKS },
    { "max-fatal-rate-delta", required_argument, NULL, OPT_FAIL_DELTA },
    { "max-retry-rate-delta", required_argument, NULL, OPT_RETRY_DELTA },
    { "auto-promote", no_argument, NULL, OPT_AUTO },
    { "wait-promote", no_argument, NULL, OPT_WAIT },
    { "lua-path", required_argument, NULL, OPT_LUA_PATH },
    { "json", no_argument, NULL, OPT_JSON },
    { NULL, 0, NULL, 0 },
  };
  const char *lua_path[MAX_LUA_PATH], *share_arg = NULL;
  int nlua_path = 0, json = 0, autop = 0, waitp = 0, opt, rc, start_only = 0;
  long share = 0, min_tasks = 200;
  double fail_delta = 0.02, retry_delta = 0.05;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_SHARE: {
      share_arg = optarg;
      char buf[32];
      size_t n = strlen(optarg);
      if (n > 0 && n < sizeof buf && optarg[n - 1] == '%')
        n--;
      snprintf(buf, sizeof buf, "%.*s", (int)(n < sizeof buf ? n : sizeof buf - 1), optarg);
      if (n == 0 || n >= sizeof buf || cli_parse_int(buf, 1, 100, &share) != 0)
        return cli_usage_error(g, "--share must be a percent from 1 to 100 (e.g. 10%%), not '%s'",
                               optarg);
      start_only = 1;
      break;
    }
    case OPT_MIN_TASKS:
      if (cli_parse_int(optarg, 1, 1000000000L, &min_tasks) != 0)
        return cli_usage_error(g, "--min-tasks must be an integer >= 1, not '%s'", optarg);
      start_only = 1;
      break;
    case OPT_FAIL_DELTA:
      if ((rc = parse_delta(g, "--max-fatal-rate-delta", optarg, &fail_delta)) != 0)
        return rc;
      start_only = 1;
      break;
    case OPT_RETRY_DELTA:
      if ((rc = parse_delta(g, "--max-retry-rate-delta", optarg, &retry_delta)) != 0)
        return rc;
      start_only = 1;
      break;
    case OPT_AUTO: autop = 1; start_only = 1; break;
    case OPT_WAIT: waitp = 1; start_only = 1; break;
    case OPT_LUA_PATH:
      if (nlua_path == MAX_LUA_PATH)
        return cli_usage_error(g, "at most %d --lua-path options", MAX_LUA_PATH);
      lua_path[nlua_path++] = optarg;
      start_only = 1;
      break;
    case OPT_JSON: json = 1; break;
    }
  }
  if (optind >= argc)
    return cli_usage_error(g, "say what to do: start, status, promote, rollback or abort");
  const char *sub = argv[optind];
  int is_start = strcmp(sub, "start") == 0;
  if (!is_start && strcmp(sub, "status") != 0 && strcmp(sub, "promote") != 0 &&
      strcmp(sub, "rollback") != 0 && strcmp(sub, "abort") != 0)
    return cli_usage_error(g, "unknown action '%s' (start, status, promote, rollback, abort)",
                           sub);
  if (!is_start && start_only)
    return cli_usage_error(g, "only start takes --share, --min-tasks, --max-*-delta, "
                              "--auto-promote, --wait-promote and --lua-path");
  if (json && strcmp(sub, "status") != 0)
    return cli_usage_error(g, "only status takes --json");
  if (is_start) {
    if (argc - optind != 2)
      return cli_usage_error(g, argc - optind < 2 ? "missing NEXT.lua" : "too many arguments");
    if (!share_arg)
      return cli_usage_error(g, "start needs --share P%% (the percent of tasks to run it)");
    if (autop && waitp)
      return cli_usage_error(g, "give either --auto-promote or --wait-promote, not both");
  } else if (argc - optind != 1) {
    return cli_usage_error(g, "unexpected argument '%s'", argv[optind + 1]);
  }

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "canary", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX];
  if (migrate_check(c, &t, err, sizeof err) != 0)
    rc = cli_runtime_error(g, "%s", err);
  else if (is_start)
    rc = canary_start_cmd(g, c, &t, argv[optind + 1], lua_path, nlua_path, share, min_tasks,
                          fail_delta, retry_delta, !waitp);
  else if (strcmp(sub, "status") == 0)
    rc = canary_status_cmd(g, c, &t, json);
  else
    rc = canary_decide_cmd(g, c, &t,
                           strcmp(sub, "promote") == 0    ? "promoted"
                           : strcmp(sub, "rollback") == 0 ? "rolled_back"
                                                          : "aborted");
  cli_close(c, &t);
  return rc;
}

/* Loads the candidate as `leash check` does: a script that would not run is refused here. */
static int canary_start_cmd(struct cli *g, PGconn *c, const struct db_table *t,
                            const char *path, const char *const *lua_path, int nlua_path,
                            long share, long min_tasks, double fail_delta, double retry_delta,
                            int auto_promote)
{
  atomic_int stopping;
  atomic_init(&stopping, 0);
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  struct script_host sh = {
    .worker_id = "canary", .stopping = &stopping, .wake_mu = &mu, .wake_cv = &cv,
    .memory_limit = 256u * 1024 * 1024, .lua_path = lua_path, .nlua_path = nlua_path,
  };
  char err[2048];
  size_t len = 0;
  char *text = script_read_file(path, &len, err, sizeof err);
  struct script *s = text ? script_load_text(path, text, len, &sh, err, sizeof err) : NULL;
  if (!s) {
    char *clean = secrets_found(err, strlen(err)) ? secrets_redact(err) : NULL;
    int rc = cli_data_error(g, "%s", clean ? clean : err);
    free(clean);
    free(text);
    return rc;
  }
  if (strlen(text) != len) {
    script_free(s);
    free(text);
    return cli_data_error(g, "%s has a NUL byte: the database keeps the candidate as text", path);
  }
  char *tbl = db_table_object(t, c, "canaries", 1);
  char sql[512], sharev[16], minv[24], fd[32], rd[32];
  snprintf(sql, sizeof sql,
           "INSERT INTO %s (script, script_name, version, label, share, min_tasks, "
           "max_fail_delta, max_retry_delta, auto_promote, started_by) "
           "VALUES ($1, $2, $3, NULLIF($4, ''), $5::int, $6::int, $7::float8, $8::float8, "
           "$9::boolean, $10) RETURNING id", tbl ? tbl : "");
  snprintf(sharev, sizeof sharev, "%ld", share);
  snprintf(minv, sizeof minv, "%ld", min_tasks);
  snprintf(fd, sizeof fd, "%.17g", fail_delta);
  snprintf(rd, sizeof rd, "%.17g", retry_delta);
  const char *params[] = { text, path, script_version(s), script_label(s), sharev, minv, fd,
                           rd, auto_promote ? "true" : "false", who() };
  PGresult *r = tbl ? db_exec(c, sql, 10, params, err, sizeof err) : NULL;
  int rc;
  if (r) {
    printf("canary %s started: version %s on %ld%% of tasks, min %ld executions, %s\n",
           PQgetvalue(r, 0, 0), script_version(s), share, min_tasks,
           auto_promote ? "promoted automatically when it passes"
                        : "waits for `leash canary promote` when it passes");
    PQclear(r);
    rc = EXIT_OK;
    tell_workers(c, t);
  } else if (tbl && strcmp(db_last_sqlstate(), "23505") == 0) {
    rc = cli_data_error(g, "a canary is already running on this table: `leash canary status`, "
                           "then promote, rollback or abort it first");
  } else {
    rc = cli_runtime_error(g, "%s", tbl ? err : "out of memory");
  }
  free(tbl);
  script_free(s);
  free(text);
  return rc;
}

static int canary_status_cmd(struct cli *g, PGconn *c, const struct db_table *t, int json)
{
  char err[DB_ERR_MAX];
  char *text = canary_status_json(c, t, err, sizeof err);
  if (!text)
    return cli_runtime_error(g, "%s", err);
  if (json) {
    printf("%s\n", text);
    free(text);
    return EXIT_OK;
  }
  json_t *o = json_loads(text, 0, NULL);
  free(text);
  if (!json_is_object(o)) {
    printf("no canary\n");
    json_decref(o);
    return EXIT_OK;
  }
  json_t *n = json_object_get(o, "numbers");
#define S(obj, k) \
  (json_is_string(json_object_get(obj, k)) ? json_string_value(json_object_get(obj, k)) : "-")
#define I(obj, k) ((long long)json_integer_value(json_object_get(obj, k)))
  printf("canary %lld: %s\n  version    %s (%s)\n  share      %lld%%, min %lld executions, %s\n"
         "  started    %s by %s\n  decided    %s by %s\n  given back %lld tasks\n"
         "  candidate  %lld executions, %lld failed, %lld retried\n"
         "  current    %lld executions, %lld failed, %lld retried\n  verdict    %s: %s\n",
         I(o, "id"), S(o, "state"), S(o, "version"), S(o, "script_name"), I(o, "share"),
         I(o, "min_tasks"), json_is_true(json_object_get(o, "auto_promote")) ? "auto-promote"
                                                                            : "wait-promote",
         S(o, "started_at"), S(o, "started_by"), S(o, "decided_at"), S(o, "decided_by"),
         I(o, "given_back"), I(n, "candidate_executions"), I(n, "candidate_failed"),
         I(n, "candidate_retried"), I(n, "current_executions"), I(n, "current_failed"),
         I(n, "current_retried"), S(n, "verdict"), S(n, "reason"));
#undef S
#undef I
  json_decref(o);
  return EXIT_OK;
}

/* The workers poll a changed canary at once (their lease thread hears the NOTIFY); without
   it they find it on their next poll (CANARY_IDLE_POLL_S), so a failure only costs time. */
static void tell_workers(PGconn *c, const struct db_table *t)
{
  char err[DB_ERR_MAX];
  (void)queue_notify_canary(c, t, err, sizeof err);
}

/* By hand: the running canary's state, with the numbers as they stand; a rollback gives
   back at once (the workers keep giving back what settles later). */
static int canary_decide_cmd(struct cli *g, PGconn *c, const struct db_table *t,
                             const char *state)
{
  char *tbl = db_table_object(t, c, "canaries", 1);
  char *fn = db_table_object(t, c, "canary_numbers", 1);
  char *gb = db_table_object(t, c, "canary_give_back", 1);
  if (!tbl || !fn || !gb) {
    free(tbl);
    free(fn);
    free(gb);
    return cli_runtime_error(g, "out of memory");
  }
  char sql[1024];
  snprintf(sql, sizeof sql,
           "WITH d AS (UPDATE %s SET state = $1, decided_at = now(), decided_by = $2, "
           "             decision = %s(id) || jsonb_build_object('reason', 'by hand: ' || $2) "
           "            WHERE state = 'running' RETURNING id) "
           "SELECT id FROM d", tbl, fn);
  char err[DB_ERR_MAX];
  const char *params[] = { state, who() };
  PGresult *r = db_exec(c, sql, 2, params, err, sizeof err);
  int rc = EXIT_OK;
  if (!r) {
    rc = cli_runtime_error(g, "%s", err);
  } else if (PQntuples(r) == 0) {
    rc = cli_data_error(g, "no canary is running on this table");
  } else {
    char id[32];
    snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
    long long back = 0;
    if (strcmp(state, "rolled_back") == 0) {
      snprintf(sql, sizeof sql, "SELECT %s($1::bigint)", gb);
      const char *p[] = { id };
      PGresult *b = db_exec(c, sql, 1, p, err, sizeof err);
      if (!b) {
        rc = cli_runtime_error(g, "rolled back, but the give-back failed (the workers retry "
                                  "it): %s", err);
      } else {
        back = atoll(PQgetvalue(b, 0, 0));
        PQclear(b);
      }
    }
    if (rc == EXIT_OK) {
      tell_workers(c, t);
      if (strcmp(state, "rolled_back") == 0)
        printf("canary %s rolled_back: %lld task%s given back\n", id, back,
               back == 1 ? "" : "s");
      else
        printf("canary %s %s\n", id, state);
    }
  }
  PQclear(r);
  free(tbl);
  free(fn);
  free(gb);
  return rc;
}
