/* leash inspect: one task's row, its stored steps, and what is known of its history. */
#include "commands.h"
#include "migrate.h"
#include "report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
  "usage: leash inspect ID [--json]\n\n"
  "Prints a task's row (every column: status, attempts, last_error, last_cause, crashes and\n"
  "max_crashes, priority, is_head, lease_token, run_started_at, payload, result, ...), the\n"
  "last attempt's timings (last_attempt_s: run_started_at, or the claim for rows settled\n"
  "before it was recorded, to finished_at; start_wait_s: claim to start; pickup_wait_s:\n"
  "runnable to claimed), the steps stored for it (leash.step results, kept while the task\n"
  "is pending, leased or dead), and its history: every execution in claim order (attempt,\n"
  "lease token, outcome kind and cause, the status it left, worker, script version and\n"
  "label, queue wait, run time, error, and the tokens and cost of its budgeted calls).\n\n"
  "options:\n"
  "  --json                one JSON object: {\"task\": the row, \"steps\": [...], \"history\":\n"
  "                        [...], \"timings\": {\"last_attempt_s\", \"start_wait_s\",\n"
  "                        \"pickup_wait_s\"}}\n\n";

enum { OPT_JSON = OPT_COMMAND_BASE };

/* The last attempt's timings, as columns of q: its run from when handle started (the claim,
   for rows settled before run_started_at was recorded), the wait from claim to start, and
   the wait from runnable (greatest(created_at, run_after)) to claimed. NULL when a bound is
   missing (never claimed, not finished) or the order is impossible (a row edited by hand). */
#define TIMINGS \
  "extract(epoch FROM q.finished_at - coalesce(q.run_started_at, q.started_at))::float8 " \
  "  AS last_attempt_s, " \
  "extract(epoch FROM q.run_started_at - q.started_at)::float8 AS start_wait_s, " \
  "CASE WHEN q.started_at >= greatest(q.created_at, q.run_after) " \
  "     THEN extract(epoch FROM q.started_at - greatest(q.created_at, q.run_after))::float8 " \
  "END AS pickup_wait_s "

/* %s: the table. */
static const char row_fmt[] = "SELECT q.*, " TIMINGS " FROM %s q WHERE q.id = $1::bigint";

/* %s: the steps table. */
static const char steps_fmt[] =
  "SELECT name, attempt, created_at, result::text FROM %s "
  " WHERE task_id = $1::bigint ORDER BY created_at, name";

/* The attempt history (sql/016) of task $1, in claim order (tokens come from one
   sequence). run_s: from when handle started to the end (NULL when it never started; the
   start is the claim's server time plus the worker's monotonic delay, so a run shorter than
   the clocks' skew shows 0, never below). Tokens
   and cost: the usage rows (sql/014) of the same task and attempt written while that lease
   ran (an attempt number repeats after a snooze or a requeue; the lease's time tells them
   apart). %s: the attempts table, then the usage table. */
#define HISTORY_SELECT(attempts, usage) \
  "SELECT a.attempt, a.lease_token, a.kind, a.cause, a.status, a.worker, a.version, " \
  "       a.label, a.queue_wait_s, " \
  "       greatest(extract(epoch FROM a.finished_at - a.run_started_at), 0)::float8 AS run_s, " \
  "       a.claimed_at, a.run_started_at, a.finished_at, a.crashed, a.error, " \
  "       us.tokens, us.cost " \
  "  FROM " attempts " a LEFT JOIN LATERAL ( " \
  "       SELECT sum(u.tokens)::bigint AS tokens, sum(u.cost) AS cost FROM " usage " u " \
  "        WHERE u.task_id = a.task_id AND u.attempt = a.attempt " \
  "          AND u.at >= a.claimed_at AND u.at <= a.finished_at) us ON true " \
  " WHERE a.task_id = $1::bigint "

static const char history_fmt[] = HISTORY_SELECT("%s", "%s") " ORDER BY a.lease_token";

/* %s: the steps table, the attempts table, the usage table, then the table. The row as
   PostgreSQL renders it (every column, the payload's numbers exactly as stored), pasted into
   one object. */
static const char json_fmt[] =
  "SELECT '{\"task\":' || row_to_json(q)::text || ',\"steps\":' || "
  "       coalesce((SELECT '[' || string_agg(row_to_json(s)::text, ',' "
  "                                          ORDER BY s.created_at, s.name) || ']' "
  "                   FROM (SELECT name, attempt, created_at, result FROM %s "
  "                          WHERE task_id = q.id) s), '[]') || "
  "       ',\"history\":' || "
  "       coalesce((SELECT json_agg(row_to_json(h) ORDER BY h.lease_token)::text "
  "                   FROM (" HISTORY_SELECT("%s", "%s") ") h), '[]') || "
  "       ',\"timings\":' || "
  "       (SELECT row_to_json(t)::text FROM (SELECT " TIMINGS ") t) || '}' "
  "  FROM %s q WHERE q.id = $1::bigint";

static void print_text(PGresult *row, PGresult *steps, PGresult *hist);
static void print_value(const char *v, int indent);

int cmd_inspect(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "json", no_argument, NULL, OPT_JSON },
    { NULL, 0, NULL, 0 },
  };
  int as_json = 0, opt, rc;
  long id;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_JSON: as_json = 1; break;
    }
  }
  if (argc - optind != 1)
    return cli_usage_error(g, optind < argc ? "one task id only" : "missing the task ID");
  const char *ids = argv[optind];
  if (cli_parse_int(ids, 1, 9223372036854775807L, &id) != 0)
    return cli_usage_error(g, "ID must be a task id (an integer >= 1), not '%s'", ids);

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "inspect", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX], idbuf[24];
  snprintf(idbuf, sizeof idbuf, "%ld", id);
  const char *params[] = { idbuf };
  char *steps_t = NULL, *attempts_t = NULL, *usage_t = NULL, *sql = NULL;
  PGresult *row = NULL, *steps = NULL, *hist = NULL;
  rc = EXIT_RUNTIME;
  if (migrate_check(c, &t, err, sizeof err) != 0)
    goto fail;
  if (!(steps_t = db_table_object(&t, c, "steps", 1)) ||
      !(attempts_t = db_table_object(&t, c, "attempts", 1)) ||
      !(usage_t = db_table_object(&t, c, "usage", 1))) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  size_t n = sizeof json_fmt + sizeof history_fmt + sizeof row_fmt + strlen(t.qualified) +
             strlen(steps_t) + 2 * strlen(attempts_t) + 2 * strlen(usage_t);
  if (!(sql = malloc(n))) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  if (as_json) {
    snprintf(sql, n, json_fmt, steps_t, attempts_t, usage_t, t.qualified);
    if (!(row = db_exec(c, sql, 1, params, err, sizeof err)))
      goto fail;
  } else {
    /* Row and steps from one snapshot. */
    if (db_command(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", err, sizeof err) != 0)
      goto fail;
    snprintf(sql, n, row_fmt, t.qualified);
    if (!(row = db_exec(c, sql, 1, params, err, sizeof err)))
      goto fail;
    snprintf(sql, n, steps_fmt, steps_t);
    if (!(steps = db_exec(c, sql, 1, params, err, sizeof err)))
      goto fail;
    snprintf(sql, n, history_fmt, attempts_t, usage_t);
    if (!(hist = db_exec(c, sql, 1, params, err, sizeof err)))
      goto fail;
    db_command(c, "COMMIT", err, sizeof err);
  }
  if (PQntuples(row) == 0) {
    rc = cli_runtime_error(g, "no task with id %ld in %s", id, g->table);
    goto out;
  }
  if (as_json)
    printf("%s\n", PQgetvalue(row, 0, 0));
  else
    print_text(row, steps, hist);
  rc = EXIT_OK;
  goto out;
fail:
  rc = cli_runtime_error(g, "%s", err);
out:
  PQclear(row);
  PQclear(steps);
  PQclear(hist);
  free(sql);
  free(steps_t);
  free(attempts_t);
  free(usage_t);
  cli_close(c, &t);
  return rc;
}

/* Every column, name padded to the longest; NULL shows as "-". Then the steps, then one
   line per attempt (and its error below it, indented). */
static void print_text(PGresult *row, PGresult *steps, PGresult *hist)
{
  int width = 0, nf = PQnfields(row);
  for (int i = 0; i < nf; i++)
    if ((int)strlen(PQfname(row, i)) > width)
      width = (int)strlen(PQfname(row, i));
  for (int i = 0; i < nf; i++) {
    printf("%-*s  ", width, PQfname(row, i));
    print_value(PQgetisnull(row, 0, i) ? "-" : PQgetvalue(row, 0, i), width + 2);
  }
  int ns = PQntuples(steps);
  printf("%-*s  %d stored%s\n", width, "steps", ns, ns ? ":" : "");
  for (int i = 0; i < ns; i++) {
    printf("  %s  (attempt %s, %s)  ", PQgetvalue(steps, i, 0), PQgetvalue(steps, i, 1),
           PQgetvalue(steps, i, 2));
    print_value(PQgetisnull(steps, i, 3) ? "null" : PQgetvalue(steps, i, 3), 4);
  }
  int nh = PQntuples(hist);
  printf("%-*s  %d attempt%s%s\n", width, "history", nh, nh == 1 ? "" : "s", nh ? ":" : "");
  for (int i = 0; i < nh; i++) {
#define H(col) (PQgetisnull(hist, i, col) ? "-" : PQgetvalue(hist, i, col))
    char wait[32] = "-", run[32] = "-";
    if (!PQgetisnull(hist, i, 8))
      report_format_duration(atof(PQgetvalue(hist, i, 8)), wait, sizeof wait);
    if (!PQgetisnull(hist, i, 9))
      report_format_duration(atof(PQgetvalue(hist, i, 9)), run, sizeof run);
    /* The version's first 12 digits name it for people; --json has all 64. */
    printf("  #%s  %s/%s -> %s%s  token %s  worker %s  version %.12s%s%s%s  wait %s  run %s"
           "  at %s", H(0), H(2), H(3), H(4), strcmp(H(13), "t") == 0 ? " (crash)" : "",
           H(1), H(5), H(6), PQgetisnull(hist, i, 7) ? "" : " (", PQgetisnull(hist, i, 7)
           ? "" : H(7), PQgetisnull(hist, i, 7) ? "" : ")", wait, run, H(12));
    if (!PQgetisnull(hist, i, 15))
      printf("  tokens %s  cost %s", H(15), H(16));
    putchar('\n');
    if (!PQgetisnull(hist, i, 14)) {
      printf("      ");
      print_value(H(14), 6);
    }
#undef H
  }
}

/* Prints v and a newline; lines after the first are indented, so a traceback stays readable. */
static void print_value(const char *v, int indent)
{
  for (const char *p = v; *p; p++) {
    putchar(*p);
    if (*p == '\n' && p[1])
      printf("%*s", indent, "");
  }
  putchar('\n');
}
