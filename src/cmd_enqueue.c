/* leash enqueue: one task from the command line, or many from a JSONL file through COPY. */
#include "commands.h"
#include "enqueue.h"
#include "lifecycle.h"
#include "migrate.h"
#include "queue.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ANALYZE_AFTER_ROWS 1000
/* A line longer than this is refused (a task description is small; the payload of a line
   is copied several times on its way to the table). --max-line-bytes changes it. */
#define DEFAULT_MAX_LINE_BYTES ((size_t)4 << 20)
#define MAX_LINE_BYTES_LIMIT ((size_t)1 << 30)

static const char usage[] =
  "usage: leash enqueue [OPTIONS] PAYLOAD_JSON\n"
  "       leash enqueue [OPTIONS] --file F.jsonl     (F = - reads standard input)\n\n"
  "Adds one task (prints its id) or one task per line (prints the count). A line is an\n"
  "object with \"payload\" and optional tenant_id, shard_key, batch, run_after, delay,\n"
  "max_attempts, max_crashes, priority, dedup_key, budget, max_snoozes, backoff_base,\n"
  "backoff_cap; the options below are the defaults for what a line leaves out. Every line is\n"
  "checked before anything is written; one bad line rejects the whole file. A task whose dedup\n"
  "key (per tenant) a pending or leased task holds is skipped: the single form prints the\n"
  "existing id, and the count of skipped tasks goes to stderr.\n\n"
  "options:\n"
  "  --tenant T            tenant_id (default '" LIFECYCLE_DEFAULT_TENANT "'; tenant, shard, "
  "batch <= " LIFECYCLE_STR(LIFECYCLE_MAX_TENANT_BYTES) " bytes)\n"
  "  --shard K             shard_key (default 'task:<id>', unique: no accidental serialising)\n"
  "  --delay S             runnable after S (seconds, or 500ms, 5m, 2h, 1d)\n"
  "  --run-after TS        runnable after the timestamp TS\n"
  "  --max-attempts N      attempts before the task goes dead (default "
  LIFECYCLE_STR(LIFECYCLE_DEFAULT_MAX_ATTEMPTS) ", at most "
  LIFECYCLE_STR(LIFECYCLE_MAX_MAX_ATTEMPTS) ")\n"
  "  --max-crashes N       crashed executions before it is quarantined (1-"
  LIFECYCLE_STR(LIFECYCLE_MAX_MAX_CRASHES) ", default "
  LIFECYCLE_STR(LIFECYCLE_DEFAULT_MAX_CRASHES) ")\n"
  "  --priority N          higher runs first within the tenant's share (-1000 to 1000,\n"
  "                        default 0; a line's \"priority\" beats it)\n"
  "  --max-snoozes N       snoozes (leash.snooze) before a snooze spends an attempt (0-"
  LIFECYCLE_STR(LIFECYCLE_MAX_MAX_SNOOZES) ", default " LIFECYCLE_STR(LIFECYCLE_DEFAULT_MAX_SNOOZES) ")\n"
  "  --backoff-base B      this task's retries wait least(cap, B ^ attempts) s, jittered\n"
  "                        (1 to 1000; default: the worker's --backoff-base)\n"
  "  --backoff-cap S       this task's longest backoff (0 to 1d; default: the worker's)\n"
  "  --batch NAME          batch name, e.g. nightly-2026-11-29\n"
  "  --dedup-key K         single form: skip (print the existing id) while a task of the\n"
  "                        tenant with key K is pending or leased (<= "
  LIFECYCLE_STR(LIFECYCLE_MAX_DEDUP_KEY_BYTES) " bytes)\n"
  "  --budget NAME         the budget the task's calls use: claims skip it while that\n"
  "                        budget is paused (README \"Budgets\"; a line's \"budget\" beats it)\n"
  "  --file F              read JSONL from F\n"
  "  --max-line-bytes SIZE refuse a line longer than SIZE (default 4MB; KB, MB, GB units)\n\n";

enum {
  OPT_TENANT = OPT_COMMAND_BASE, OPT_SHARD, OPT_DELAY, OPT_RUN_AFTER, OPT_MAX_ATTEMPTS,
  OPT_BATCH, OPT_FILE, OPT_MAX_CRASHES, OPT_MAX_LINE_BYTES, OPT_PRIORITY, OPT_DEDUP_KEY,
  OPT_BUDGET, OPT_MAX_SNOOZES, OPT_BACKOFF_BASE, OPT_BACKOFF_CAP,
};

/* Defaults from the flags, as text parameters ($1..$6 of insert_fmt), NULL when not given. */
struct defaults {
  const char *tenant, *shard, *run_after, *delay, *max_attempts, *batch;
  const char *max_crashes;   /* $8 */
  const char *priority;      /* $9 */
  const char *dedup_key;     /* $10 (the single form only) */
  const char *budget;        /* $11 */
  const char *backoff_base, *backoff_cap, *max_snoozes;   /* $12, $13, $14 */
  char delay_buf[32], cap_buf[32];
};

/* The rows of both paths for queue_insert_sql; %s is the row source with columns line, doc
   (the task's JSON object) and run_after (a typed timestamp or NULL). The id is drawn first
   so a default shard can name it; ids follow line order. A line's field beats the flag ($1
   tenant, $2 shard, $3 run-after, $4 delay, $5 max-attempts, $6 batch, $8 max-crashes,
   $9 priority, $10 dedup key, $11 budget, $12 backoff-base, $13 backoff-cap, $14
   max-snoozes; $7 the table); what both leave out gets the insert's defaults. A line's
   priority and max_snoozes went through numeric: the check takes any whole number (1e2,
   3.0), int's input does not. */
static const char rows_fmt[] =
  "SELECT v.id, coalesce(v.doc->>'tenant_id', $1) AS tenant_id, "
  "       coalesce(v.doc->>'shard_key', $2) AS shard_key, v.doc->'payload' AS payload, "
  "       coalesce(v.run_after, now() + make_interval(secs => (v.doc->>'delay')::float8), "
  "                $3::timestamptz, now() + make_interval(secs => $4::float8)) AS run_after, "
  "       coalesce((v.doc->>'max_attempts')::int, $5::int) AS max_attempts, "
  "       CASE WHEN v.doc ? 'batch' THEN v.doc->>'batch' ELSE $6 END AS batch, "
  "       coalesce((v.doc->>'max_crashes')::int, $8::int) AS max_crashes, "
  "       coalesce((v.doc->>'priority')::numeric::int, $9::int) AS priority, "
  "       coalesce(v.doc->>'dedup_key', $10::text) AS dedup_key, "
  "       CASE WHEN v.doc ? 'budget' THEN v.doc->>'budget' ELSE $11 END AS budget, "
  "       coalesce((v.doc->>'backoff_base')::float8, $12::float8) AS backoff_base, "
  "       coalesce((v.doc->>'backoff_cap')::float8, $13::float8) AS backoff_cap, "
  "       coalesce((v.doc->>'max_snoozes')::numeric::int, $14::int) AS max_snoozes "
  "  FROM (SELECT nextval(pg_get_serial_sequence($7, 'id')) AS id, w.* FROM (%s) w) v";

/* The INSERT for rows from `source` (skipping live dedup keys when dedup); malloc'd, NULL
   when out of memory. */
static char *insert_sql(const struct db_table *t, const char *source, int dedup)
{
  size_t n = sizeof rows_fmt + strlen(source);
  char *rows = malloc(n);
  if (!rows)
    return NULL;
  snprintf(rows, n, rows_fmt, source);
  char *sql = dedup ? queue_insert_dedup_sql(t->qualified, rows)
                    : queue_insert_sql(t->qualified, rows);
  free(rows);
  return sql;
}

static int enqueue_one(struct cli *g, PGconn *c, const struct db_table *t,
                       const struct defaults *d, const char *payload);
static char *dedup_lock_sql(PGconn *c, const struct db_table *t, const char *keys);
static int enqueue_file(struct cli *g, PGconn *c, const struct db_table *t,
                        const struct defaults *d, const char *path, size_t max_line);
static int read_line(FILE *f, char **buf, size_t *cap, size_t max, size_t *len);
static int db_data_error(struct cli *g, const char *err, int from_flags);
static int check_defaults(struct cli *g, const struct defaults *d);

int cmd_enqueue(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "shard", required_argument, NULL, OPT_SHARD },
    { "delay", required_argument, NULL, OPT_DELAY },
    { "run-after", required_argument, NULL, OPT_RUN_AFTER },
    { "max-attempts", required_argument, NULL, OPT_MAX_ATTEMPTS },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "file", required_argument, NULL, OPT_FILE },
    { "max-crashes", required_argument, NULL, OPT_MAX_CRASHES },
    { "max-line-bytes", required_argument, NULL, OPT_MAX_LINE_BYTES },
    { "priority", required_argument, NULL, OPT_PRIORITY },
    { "dedup-key", required_argument, NULL, OPT_DEDUP_KEY },
    { "budget", required_argument, NULL, OPT_BUDGET },
    { "max-snoozes", required_argument, NULL, OPT_MAX_SNOOZES },
    { "backoff-base", required_argument, NULL, OPT_BACKOFF_BASE },
    { "backoff-cap", required_argument, NULL, OPT_BACKOFF_CAP },
    { NULL, 0, NULL, 0 },
  };
  struct defaults d = { 0 };
  const char *file = NULL;
  size_t max_line = DEFAULT_MAX_LINE_BYTES;
  int opt, rc;
  long n;
  double secs;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_TENANT:
    case OPT_SHARD:
      if (*optarg == '\0')
        return cli_usage_error(g, "--%s must not be empty", opt == OPT_TENANT ? "tenant" : "shard");
      *(opt == OPT_TENANT ? &d.tenant : &d.shard) = optarg;
      if ((rc = check_defaults(g, &d)) != EXIT_OK)   /* here: a variable's error names it */
        return rc;
      break;
    case OPT_DELAY:
      if (cli_parse_duration(optarg, &secs) != 0)
        return cli_usage_error(g, "--delay: '%s' is not a duration (e.g. 30, 500ms, 5m, 2h)", optarg);
      snprintf(d.delay_buf, sizeof d.delay_buf, "%.3f", secs);
      d.delay = d.delay_buf;
      break;
    case OPT_RUN_AFTER:
      d.run_after = optarg;
      if ((rc = check_defaults(g, &d)) != EXIT_OK)
        return rc;
      break;
    case OPT_MAX_ATTEMPTS:
      if (cli_parse_int(optarg, 1, LIFECYCLE_MAX_MAX_ATTEMPTS, &n) != 0)
        return cli_usage_error(g, "--max-attempts must be an integer from 1 to %d, not '%s'",
                               LIFECYCLE_MAX_MAX_ATTEMPTS, optarg);
      d.max_attempts = optarg;
      break;
    case OPT_BATCH:
      d.batch = optarg;
      if ((rc = check_defaults(g, &d)) != EXIT_OK)
        return rc;
      break;
    case OPT_BUDGET:
      d.budget = optarg;
      if ((rc = check_defaults(g, &d)) != EXIT_OK)
        return rc;
      break;
    case OPT_DEDUP_KEY:
      d.dedup_key = optarg;
      break;
    case OPT_MAX_CRASHES:
      if (cli_parse_int(optarg, 1, LIFECYCLE_MAX_MAX_CRASHES, &n) != 0)
        return cli_usage_error(g, "--max-crashes must be an integer from 1 to %d, not '%s'",
                               LIFECYCLE_MAX_MAX_CRASHES, optarg);
      d.max_crashes = optarg;
      break;
    case OPT_PRIORITY:
      if (cli_parse_int(optarg, ENQUEUE_PRIORITY_MIN, ENQUEUE_PRIORITY_MAX, &n) != 0)
        return cli_usage_error(g, "--priority must be an integer from %d to %d, not '%s'",
                               ENQUEUE_PRIORITY_MIN, ENQUEUE_PRIORITY_MAX, optarg);
      d.priority = optarg;
      break;
    case OPT_MAX_SNOOZES:
      if (cli_parse_int(optarg, 0, LIFECYCLE_MAX_MAX_SNOOZES, &n) != 0)
        return cli_usage_error(g, "--max-snoozes must be an integer from 0 to %d, not '%s'",
                               LIFECYCLE_MAX_MAX_SNOOZES, optarg);
      d.max_snoozes = optarg;
      break;
    case OPT_BACKOFF_BASE:
      if (enqueue_check_backoff_base(optarg) != 0)
        return cli_usage_error(g, "--backoff-base must be a number from %g to %g, not '%s'",
                               LIFECYCLE_MIN_BACKOFF_BASE, LIFECYCLE_MAX_BACKOFF_BASE, optarg);
      d.backoff_base = optarg;
      break;
    case OPT_BACKOFF_CAP:
      if (cli_parse_duration(optarg, &secs) != 0 || secs < 0 || secs > LIFECYCLE_MAX_BACKOFF_CAP_S)
        return cli_usage_error(g, "--backoff-cap must be a duration from 0 to 1d (e.g. 30, 5m, "
                               "2h), not '%s'", optarg);
      snprintf(d.cap_buf, sizeof d.cap_buf, "%.17g", secs);
      d.backoff_cap = d.cap_buf;
      break;
    case OPT_FILE:
      file = optarg;
      break;
    case OPT_MAX_LINE_BYTES:
      if (cli_parse_size(optarg, 2, MAX_LINE_BYTES_LIMIT, &max_line) != 0)
        return cli_usage_error(g, "--max-line-bytes must be a size from 2 bytes to 1G "
                               "(e.g. 65536, 512k, 4M), not '%s'", optarg);
      break;
    }
  }
  if (d.delay && d.run_after)
    return cli_usage_error(g, "give either --delay or --run-after, not both");
  if ((rc = check_defaults(g, &d)) != EXIT_OK)
    return rc;
  int positional = argc - optind;
  if (file && d.dedup_key)
    return cli_usage_error(g, "--dedup-key is for the single form; give each line its own "
                              "\"dedup_key\"");
  if (file && positional > 0)
    return cli_usage_error(g, "give either --file or a PAYLOAD_JSON argument, not both");
  if (!file && positional != 1)
    return cli_usage_error(g, positional ? "too many arguments (quote the JSON payload)"
                                         : "missing PAYLOAD_JSON (or --file F)");

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "enqueue", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX];
  if (migrate_check(c, &t, err, sizeof err) != 0)
    rc = cli_runtime_error(g, "%s", err);
  else if (file)
    rc = enqueue_file(g, c, &t, &d, file, max_line);
  else
    rc = enqueue_one(g, c, &t, &d, argv[optind]);
  cli_close(c, &t);
  return rc;
}

static int enqueue_one(struct cli *g, PGconn *c, const struct db_table *t,
                       const struct defaults *d, const char *payload)
{
  json_error_t je;
  json_t *j = json_loads(payload, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES |
                         JSON_DECODE_INT_AS_REAL, &je);
  if (!j)
    return cli_data_error(g, "PAYLOAD_JSON is not valid JSON (column %d): %s", je.column, je.text);
  int isnull = json_is_null(j);
  json_decref(j);
  if (isnull)
    return cli_data_error(g, "PAYLOAD_JSON must not be null");

  /* The payload's own text goes into the row (jsonb keeps big numbers exact). */
  size_t n = strlen(payload) + 16;
  char *doc = malloc(n);
  int dedup = d->dedup_key != NULL;
  char *sql = insert_sql(t, "SELECT 1 AS line, $15::jsonb AS doc, NULL::timestamptz AS run_after",
                         dedup);
  char *lock = dedup ? dedup_lock_sql(c, t, "SELECT $1::text AS tenant_id, $2::text AS dedup_key")
                     : NULL;
  char *find = dedup ? queue_dedup_find_sql(t->qualified) : NULL;
  int rc = EXIT_RUNTIME;
  if (!doc || !sql || (dedup && (!lock || !find))) {
    rc = cli_runtime_error(g, "out of memory");
    goto out;
  }
  snprintf(doc, n, "{\"payload\":%s}", payload);
  const char *params[] = { d->tenant, d->shard, d->run_after, d->delay, d->max_attempts,
                           d->batch, t->qualified, d->max_crashes, d->priority, d->dedup_key,
                           d->budget, d->backoff_base, d->backoff_cap, d->max_snoozes, doc };
  const char *keys[] = { d->tenant, d->dedup_key };
  char err[DB_ERR_MAX];
  PGresult *r;
  if (!dedup) {
    r = db_exec(c, sql, 15, params, err, sizeof err);
    if (!r) {
      rc = db_data_error(g, err, 1);
      goto out;
    }
    printf("%s\n", PQgetvalue(r, 0, 0));
    PQclear(r);
    rc = EXIT_OK;
    goto out;
  }
  /* Lock, look and insert (sql/015_sql_api.sql says why this is one row per key). */
  if (db_command(c, "BEGIN", err, sizeof err) != 0 ||
      !(r = db_exec(c, lock, 2, keys, err, sizeof err))) {
    rc = cli_runtime_error(g, "%s", err);
    goto rollback;
  }
  PQclear(r);
  if (!(r = db_exec(c, sql, 15, params, err, sizeof err))) {
    rc = db_data_error(g, err, 1);
    goto rollback;
  }
  int inserted = PQntuples(r) == 1;
  char id[32];
  snprintf(id, sizeof id, "%s", inserted ? PQgetvalue(r, 0, 0) : "");
  PQclear(r);
  if (!inserted) {
    if (!(r = db_exec(c, find, 2, keys, err, sizeof err))) {
      rc = cli_runtime_error(g, "%s", err);
      goto rollback;
    }
    snprintf(id, sizeof id, "%s", PQntuples(r) ? PQgetvalue(r, 0, 0) : "?");
    PQclear(r);
  }
  if (db_command(c, "COMMIT", err, sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
    goto out;
  }
  printf("%s\n", id);
  if (!inserted)
    fprintf(stderr, "leash enqueue: 1 skipped: task %s has this dedup key and is pending or "
                    "leased\n", id);
  rc = EXIT_OK;
  goto out;
rollback:
  db_command(c, "ROLLBACK", err, sizeof err);
out:
  free(doc);
  free(sql);
  free(lock);
  free(find);
  return rc;
}

/* Reads and checks every line, then in one transaction: COPY into a temporary stage, one
   INSERT … SELECT into the queue. Nothing is written unless every line is good. */
static int enqueue_file(struct cli *g, PGconn *c, const struct db_table *t,
                        const struct defaults *d, const char *path, size_t max_line)
{
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
  if (!f)
    return cli_data_error(g, "cannot open %s: %m", path);
  char *line = NULL, *sql = NULL;
  size_t linecap = 0;
  struct buf copy = { 0 };
  long *lines = NULL;   /* COPY row (0-based) -> file line, to name the line in errors */
  size_t rows = 0, rowscap = 0;
  long line_no = 0;
  int got;
  size_t len;
  char err[DB_ERR_MAX];
  int rc = EXIT_RUNTIME;
  const char *name = strcmp(path, "-") == 0 ? "stdin" : path;

  /* getline cannot tell a line it could not hold (ENOMEM) from the end of the file: the
     lines after it were dropped and a prefix enqueued. */
  while ((got = read_line(f, &line, &linecap, max_line, &len)) > 0) {
    line_no++;
    char *run_after = NULL;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
      len--;
    enum enqueue_verdict v = enqueue_check_line(line, len, &run_after, err, sizeof err);
    if (v == ENQUEUE_LINE_BLANK)
      continue;
    if (v == ENQUEUE_LINE_BAD) {
      rc = cli_data_error(g, "%s line %ld: %s; nothing was enqueued", name, line_no, err);
      goto out;
    }
    if (rows == rowscap) {
      rowscap = rowscap ? rowscap * 2 : 1024;
      long *nl = realloc(lines, rowscap * sizeof *lines);
      if (!nl) {
        free(run_after);
        rc = cli_runtime_error(g, "out of memory");
        goto out;
      }
      lines = nl;
    }
    lines[rows++] = line_no;
    int bad = enqueue_copy_row(&copy, line_no, line, len, run_after);
    free(run_after);
    if (bad) {
      rc = cli_runtime_error(g, "out of memory");
      goto out;
    }
  }
  if (got == -2) {
    rc = cli_data_error(g, "%s line %ld: longer than %zu bytes (--max-line-bytes); nothing "
                         "was enqueued", name, line_no + 1, max_line);
    goto out;
  }
  if (got < 0) {
    rc = cli_runtime_error(g, "cannot read %s at line %ld: %m; nothing was enqueued", name,
                           line_no + 1);
    goto out;
  }
  if (rows == 0) {
    printf("0\n");
    rc = EXIT_OK;
    goto out;
  }

  if (db_command(c, "BEGIN", err, sizeof err) != 0 ||
      db_command(c, "CREATE TEMP TABLE leash_enqueue_stage (line bigint, doc jsonb, "
                    "run_after timestamptz) ON COMMIT DROP", err, sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
    goto rollback;
  }
  PGresult *r = PQexec(c, "COPY pg_temp.leash_enqueue_stage (line, doc, run_after) FROM STDIN");
  int copying = PQresultStatus(r) == PGRES_COPY_IN;
  PQclear(r);
  if (!copying || PQputCopyData(c, copy.s, (int)copy.len) != 1 || PQputCopyEnd(c, NULL) != 1) {
    db_one_line(PQerrorMessage(c), err, sizeof err);
    rc = cli_runtime_error(g, "COPY failed: %s", err);
    goto rollback;
  }
  r = PQgetResult(c);
  if (PQresultStatus(r) != PGRES_COMMAND_OK) {
    /* The stage's run_after is typed, so a bad timestamp fails here, with COPY's row. */
    const char *ctx = PQresultErrorField(r, PG_DIAG_CONTEXT);
    const char *at = ctx ? strstr(ctx, ", line ") : NULL;
    long row = at ? atol(at + 7) : 0;
    const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    db_one_line(primary ? primary : PQresultErrorMessage(r), err, sizeof err);
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (row >= 1 && (size_t)row <= rows && state && strncmp(state, "22", 2) == 0)
      rc = cli_data_error(g, "%s line %ld: %s; nothing was enqueued", name, lines[row - 1],
                          err);
    else
      rc = cli_runtime_error(g, "COPY failed: %s", err);
    PQclear(r);
    while ((r = PQgetResult(c)) != NULL)
      PQclear(r);
    goto rollback;
  }
  PQclear(r);
  /* Lines with a dedup key take the key's lock first (a statement of its own: the insert's
     snapshot must follow the locks), and the insert skips the live ones. */
  r = db_exec(c, "SELECT EXISTS (SELECT 1 FROM pg_temp.leash_enqueue_stage "
                 "WHERE doc ? 'dedup_key')", 0, NULL, err, sizeof err);
  if (!r) {
    rc = cli_runtime_error(g, "%s", err);
    goto rollback;
  }
  int dedup = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  PQclear(r);
  if (dedup) {
    char *lock = dedup_lock_sql(c, t, "SELECT coalesce(doc->>'tenant_id', $1) AS tenant_id, "
                                      "doc->>'dedup_key' AS dedup_key "
                                      "FROM pg_temp.leash_enqueue_stage");
    const char *tenant[] = { d->tenant };
    r = lock ? db_exec(c, lock, 1, tenant, err, sizeof err) : NULL;
    if (!lock)
      snprintf(err, sizeof err, "out of memory");
    free(lock);
    if (!r) {
      rc = cli_runtime_error(g, "%s", err);
      goto rollback;
    }
    PQclear(r);
  }
  sql = insert_sql(t, "SELECT * FROM pg_temp.leash_enqueue_stage ORDER BY line OFFSET 0", dedup);
  if (!sql) {
    rc = cli_runtime_error(g, "out of memory");
    goto rollback;
  }
  const char *params[] = { d->tenant, d->shard, d->run_after, d->delay, d->max_attempts,
                           d->batch, t->qualified, d->max_crashes, d->priority, NULL,
                           d->budget, d->backoff_base, d->backoff_cap, d->max_snoozes };
  r = db_exec(c, sql, 14, params, err, sizeof err);
  if (!r) {
    rc = db_data_error(g, err, 0);
    goto rollback;
  }
  long inserted = PQntuples(r);
  PQclear(r);
  if (db_command(c, "COMMIT", err, sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
    goto out;
  }
  printf("%ld\n", inserted);
  if (dedup)
    fprintf(stderr, "leash enqueue: %ld skipped: their dedup key was pending or leased, or "
                    "repeated an earlier line's\n", (long)rows - inserted);
  rc = EXIT_OK;
  /* A big batch changes the table more than autoanalyze notices in time, and a claim
     planned on statistics from before it can be slow: refresh them now (cheap, sampled).
     A role that does not own the table gets a warning from the server, which is fine. */
  if (inserted >= ANALYZE_AFTER_ROWS) {
    size_t n = strlen(t->qualified) + 16;
    char *analyze = malloc(n);
    if (analyze) {
      snprintf(analyze, n, "ANALYZE %s", t->qualified);
      if (db_command(c, analyze, err, sizeof err) != 0)
        fprintf(stderr, "leash enqueue: warning: %s\n", err);
      free(analyze);
    }
  }
  goto out;
rollback:
  db_command(c, "ROLLBACK", err, sizeof err);
out:
  if (f != stdin)
    fclose(f);
  free(line);
  buf_free(&copy);
  free(lines);
  free(sql);
  return rc;
}

/* Reads one line (its newline kept) into *buf, growing it up to max bytes of line. Returns
   1 with *len, 0 at the end of the file (ferror told apart from feof), -1 on a read error or
   out of memory (errno says which), -2 when the line is longer than max. */
static int read_line(FILE *f, char **buf, size_t *cap, size_t max, size_t *len)
{
  size_t n = 0;
  int ch;
  errno = 0;
  while ((ch = getc_unlocked(f)) != EOF) {
    if (n >= max && ch != '\n')   /* the newline itself does not count */
      return -2;
    if (n + 2 > *cap) {
      size_t nc = *cap ? *cap * 2 : 4096;
      if (nc > max + 2)
        nc = max + 2;
      char *nb = realloc(*buf, nc);
      if (!nb) {
        errno = ENOMEM;
        return -1;
      }
      *buf = nb;
      *cap = nc;
    }
    (*buf)[n++] = (char)ch;
    if (ch == '\n')
      break;
  }
  if (ch == EOF && ferror(f))
    return -1;
  if (n == 0)
    return 0;
  (*buf)[n] = '\0';
  *len = n;
  return 1;
}

/* The flags' values against the bounds a line's fields have (enqueue.c): a default that
   could not be claimed must not reach the table either. */
static int check_defaults(struct cli *g, const struct defaults *d)
{
  char err[DB_ERR_MAX];
  const struct { const char *flag, *field, *value; } keys[] = {
    { "--tenant", "tenant_id", d->tenant },
    { "--shard", "shard_key", d->shard },
    { "--batch", "batch", d->batch },
    { "--dedup-key", "dedup_key", d->dedup_key },
    { "--budget", "budget", d->budget },
  };
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    if (keys[i].value &&
        enqueue_check_key(keys[i].field, keys[i].value, strlen(keys[i].value), err, sizeof err))
      return cli_usage_error(g, "%s: %s", keys[i].flag, err);
  if (d->run_after && enqueue_check_run_after("--run-after", d->run_after, err, sizeof err))
    return cli_usage_error(g, "%s", err);
  return EXIT_OK;
}

/* A value PostgreSQL refused (SQLSTATE class 22: a bad --run-after timestamp, say) is the
   user's input: a usage error when it can only have come from the flags (with the hint), a
   data error (one line) when a file's lines were written too; anything else is a runtime
   failure. */
static int db_data_error(struct cli *g, const char *err, int from_flags)
{
  if (strncmp(db_last_sqlstate(), "22", 2) == 0) {
    /* The primary message only: libpq's "ERROR:  " prefix and the CONTEXT part (which
       names this file's SQL parameters, "$3", not the user's option) would not help. */
    const char *m = strncmp(err, "ERROR:  ", 8) == 0 ? err + 8 : err;
    const char *ctx = strstr(m, " CONTEXT:");
    int n = ctx ? (int)(ctx - m) : (int)strlen(m);
    if (from_flags)
      return cli_usage_error(g, "%.*s; nothing was enqueued", n, m);
    return cli_data_error(g, "%.*s; nothing was enqueued", n, m);
  }
  return cli_runtime_error(g, "%s", err);
}

/* The dedup locks for the keys of `keys` (see queue_dedup_lock_sql); NULL when out of memory. */
static char *dedup_lock_sql(PGconn *c, const struct db_table *t, const char *keys)
{
  char *fn = db_table_object(t, c, "dedup_lock", 1);
  char *sql = fn ? queue_dedup_lock_sql(fn, keys) : NULL;
  free(fn);
  return sql;
}
