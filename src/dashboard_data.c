/* dashboard_data: the dashboard's statements (see dashboard_data.h for their costs). */
#include "dashboard_data.h"
#include "cli.h"
#include "lifecycle.h"
#include "log.h"
#include "queue.h"
#include "report.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DASH_REQUEUE_CHUNK 5000   /* as leash requeue --dead */
#define DASH_PAUSE_MAX_S (365.0 * 86400)
#define DASH_CHECK_MARGIN "5 seconds"
#define DASH_MAX_CANARIES 5
/* A running batch's page (live_fmt, live_minutes_fmt): the durations are those of the
   batch's newest DASH_LIVE_SAMPLE attempts among the queue's newest DASH_LIVE_SCAN; the
   dead reasons those of at most DASH_LIVE_DEAD of its dead rows; the chart reads the
   queue's newest DASH_LIVE_MINUTES attempts of the last hour. Each attempt read is checked
   against its task's batch by key: a look reads at most about DASH_LIVE_SCAN +
   DASH_LIVE_MINUTES + DASH_LIVE_DEAD queue rows, whatever the batch's size. */
#define DASH_LIVE_SAMPLE 2000
#define DASH_LIVE_SCAN 5000
#define DASH_LIVE_DEAD 10000
#define DASH_LIVE_MINUTES 10000

/* The batches worth showing: those with open rows, found by a skip scan of batch_open_idx
   (one probe per batch, however many rows are open), the newest DASH_MAX_BATCHES by their
   last id in <table>_batch_totals (sql/021: a row per batch and inserting backend, kept by
   the INSERT and DELETE triggers), and $1 when asked for. Each with its total and whether it
   has open rows (one probe of batch_open_idx). No pass over any batch's rows here: a
   finished batch's counts come from its kept report, an open one's from a count of its rows
   (open_counts_fmt). Newest first. %1$s: the table, %2$d the limit, %3$s batch_totals. */
static const char batches_fmt[] =
  "WITH RECURSIVE open(batch) AS ("
  "  (SELECT batch FROM %1$s WHERE status IN (" SQL_PENDING ", " SQL_LEASED ")"
  "      AND batch IS NOT NULL ORDER BY batch LIMIT 1)"
  "  UNION ALL"
  "  SELECT (SELECT q.batch FROM %1$s q WHERE q.status IN (" SQL_PENDING ", " SQL_LEASED ")"
  "             AND q.batch IS NOT NULL AND q.batch > o.batch ORDER BY q.batch LIMIT 1)"
  "    FROM open o WHERE o.batch IS NOT NULL),"
  "     tot AS (SELECT batch, sum(total)::bigint AS total, max(last_id) AS last_id"
  "               FROM %3$s GROUP BY batch),"
  "     pick AS (SELECT batch FROM (SELECT batch FROM open WHERE batch IS NOT NULL LIMIT %2$d) o"
  "              UNION SELECT batch FROM (SELECT batch FROM tot ORDER BY last_id DESC"
  "                                        LIMIT %2$d) n"
  "              UNION SELECT $1::text WHERE $1::text IS NOT NULL)"
  "SELECT coalesce(json_agg(json_build_object('batch', p.batch, 'total', coalesce(t.total, 0),"
  "         'open', EXISTS (SELECT 1 FROM %1$s q WHERE q.batch = p.batch"
  "                          AND q.status IN (" SQL_PENDING ", " SQL_LEASED ")))"
  "         ORDER BY t.last_id DESC NULLS LAST, p.batch), '[]')::text"
  "  FROM (SELECT batch FROM pick ORDER BY batch = $1::text DESC NULLS LAST, batch"
  "         LIMIT 2 * %2$d + 1) p LEFT JOIN tot t USING (batch)";

/* A running batch's counts, exact and without a pass over its rows (sql/024): the total
   from batch_totals (its triggers write in the inserting transaction, so one statement sees
   the rows and their total in one snapshot), the open rows through batch_open_idx (index
   entries: an index-only scan once a vacuum has passed), the leased ones among all the
   table's leased rows (one_lease_per_shard: as many as the fleet has slots; "batch || ''"
   keeps batch_open_idx out of this one), the dead through batch_dead_idx, and done as the
   rest. Costs grow with the batch's open and dead rows, never with its done ones. Columns of
   CTE k: total, open, leased, dead, lo, hi, first_at. %1$s table, %2$s batch_totals. */
#define LIVE_COUNTS_CTE                                                                     \
  "tot AS (SELECT coalesce(sum(total), 0)::bigint AS total, min(first_id) AS lo,"            \
  "               max(last_id) AS hi, min(first_at) AS first_at"                             \
  "          FROM %2$s WHERE batch = $1::text),"                                             \
  " k AS (SELECT tot.*,"                                                                     \
  "         (SELECT count(*) FROM %1$s WHERE batch = $1::text"                               \
  "            AND status IN (" SQL_PENDING ", " SQL_LEASED ")) AS open,"                     \
  "         (SELECT count(*) FROM %1$s WHERE status = " SQL_LEASED                            \
  "            AND batch || '' = $1::text) AS leased,"                                       \
  "         (SELECT count(*) FROM %1$s WHERE batch = $1::text AND status = " SQL_DEAD ")"     \
  "           AS dead"                                                                       \
  "         FROM tot)"

/* A list entry's counts for an open batch (LIVE_COUNTS_CTE). */
static const char live_counts_fmt[] =
  "WITH " LIVE_COUNTS_CTE
  " SELECT json_build_object('total', total, 'pending', open - leased, 'leased', leased,"
  "         'done', total - open - dead, 'dead', dead)::text FROM k";

/* A running batch's report, in report.c's shape where the page reads it, for a cost that
   does not grow with the batch's done rows (the report's pass costs 190-390 ms per 100,000
   rows): the exact counts above; durations (p50, p95, max of done attempts, from handle's
   start) from the batch's newest DASH_LIVE_SAMPLE attempts among the queue's newest
   DASH_LIVE_SCAN (the attempt history by finished_at, each in the batch's id range checked
   against its task's batch by key), so a sample, said so in "live"; the last finish from
   the same attempts; the first claim from the batch's attempts among the queue's first
   1,000 to finish after it was enqueued (the earliest claim among them: a task claimed
   before them all and still running is missed, so approximate, said so); dead
   reasons from at most DASH_LIVE_DEAD of its dead rows (exact when it has no more dead).
   Retries, usage and the attempts' distribution need a pass over the batch's rows or calls:
   null here, counted once the batch finishes. %1$s table, %2$s batch_totals, %3$s attempts,
   %4$d DASH_LIVE_SAMPLE, %5$d DASH_LIVE_DEAD, %6$d REPORT_EXAMPLE_IDS, %7$d
   REPORT_TOP_REASONS, %8$d DASH_LIVE_SCAN. The inner LIMITs are subqueries of their own so
   that the planner walks attempts_finished_idx (given the id range, it would rather read
   the batch's attempts by key and sort them: all of them). */
static const char live_fmt[] =
  "WITH " LIVE_COUNTS_CTE ","
  " s AS MATERIALIZED (SELECT a.kind, a.finished_at,"
  "         greatest(extract(epoch FROM a.finished_at - coalesce(a.run_started_at,"
  "                                                              a.claimed_at)), 0)::float8 AS d"
  "       FROM k, LATERAL (SELECT a.* FROM (SELECT * FROM %3$s"
  "                                          ORDER BY finished_at DESC LIMIT %8$d) a"
  "                         WHERE a.task_id BETWEEN k.lo AND k.hi"
  "                          AND EXISTS (SELECT 1 FROM %1$s q WHERE q.id = a.task_id"
  "                                        AND q.batch = $1::text)"
  "                        ORDER BY a.finished_at DESC LIMIT %4$d) a),"
  " f AS (SELECT min(x.claimed_at) AS first_claim"
  "       FROM k, LATERAL (SELECT a.claimed_at FROM (SELECT * FROM %3$s"
  "                                                   WHERE finished_at >= k.first_at"
  "                                                   ORDER BY finished_at LIMIT 1000) a"
  "                         WHERE a.task_id BETWEEN k.lo AND k.hi"
  "                          AND EXISTS (SELECT 1 FROM %1$s q WHERE q.id = a.task_id"
  "                                        AND q.batch = $1::text)"
  "                        ORDER BY a.finished_at LIMIT 100) x),"
  " a AS (SELECT count(*) AS sampled, count(d) FILTER (WHERE kind = " SQL_DONE ") AS timed,"
  "         percentile_disc(0.5) WITHIN GROUP (ORDER BY d) FILTER (WHERE kind = " SQL_DONE ")"
  "           AS p50,"
  "         percentile_disc(0.95) WITHIN GROUP (ORDER BY d) FILTER (WHERE kind = " SQL_DONE ")"
  "           AS p95,"
  "         max(d) FILTER (WHERE kind = " SQL_DONE ") AS dmax,"
  "         max(finished_at) FILTER (WHERE kind IN (" SQL_DONE ", " SQL_DEAD ")) AS last_finish"
  "       FROM s),"
  " dr AS MATERIALIZED (SELECT id, coalesce(nullif(left(split_part(last_error, E'\\n', 1),"
  "                                                     200), ''), '(no message)') AS reason"
  "       FROM %1$s WHERE batch = $1::text AND status = " SQL_DEAD " LIMIT %5$d)"
  " SELECT json_build_object("
  "  'batch', $1::text,"
  "  'counts', json_build_object(" SQL_PENDING ", k.open - k.leased, " SQL_LEASED ", k.leased,"
  "                              " SQL_DONE ", k.total - k.open - k.dead, " SQL_DEAD ", k.dead),"
  "  'total', k.total,"
  "  'settled', k.open = 0,"
  "  'retries', NULL, 'retried_tasks', NULL, 'usage', NULL,"
  "  'duration_s', json_build_object('count', a.timed, 'p50', a.p50, 'p95', a.p95,"
  "                                  'max', a.dmax),"
  "  'dead_reasons', (SELECT coalesce(json_agg(json_build_object('reason', r.reason,"
  "                                     'count', r.n, 'example_ids', r.ids)"
  "                                   ORDER BY r.n DESC, r.reason), '[]')"
  "                     FROM (SELECT reason, count(*) AS n, (array_agg(id ORDER BY id))[1:%6$d]"
  "                             AS ids FROM dr GROUP BY reason"
  "                            ORDER BY count(*) DESC, reason LIMIT %7$d) r),"
  "  'dead_reasons_total', (SELECT count(DISTINCT reason) FROM dr),"
  "  'first_claim_at', to_char(f.first_claim AT TIME ZONE 'UTC',"
  "                            'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
  "  'last_finish_at', to_char(a.last_finish AT TIME ZONE 'UTC',"
  "                            'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
  "  'wall_s', extract(epoch FROM a.last_finish - f.first_claim)::float8,"
  "  'live', json_build_object('attempts_read', a.sampled, 'attempts_limit', %4$d,"
  "                            'scan_limit', %8$d,"
  "                            'dead_read', (SELECT count(*) FROM dr), 'dead_limit', %5$d))::text"
  "  FROM k, a, f";

/* A running batch's settles per minute over the last hour, from the attempt history (every
   settle, not each row's last: a running batch's rows are not read): done, dead, and
   retried (retry or snooze), the batch's among the queue's newest DASH_LIVE_MINUTES
   attempts of the hour; when the queue had more, the oldest minute read is left out (it
   would be short) and "truncated" says so. %1$s table, %2$s batch_totals, %3$s attempts, %4$d the limit. */
static const char live_minutes_fmt[] =
  "WITH tot AS (SELECT min(first_id) AS lo, max(last_id) AS hi FROM %2$s WHERE batch = $1::text),"
  " s AS MATERIALIZED (SELECT date_trunc('minute', a.finished_at) AS m, a.kind"
  "       FROM tot, LATERAL (SELECT * FROM %3$s WHERE finished_at > now() - interval '1 hour'"
  "                           ORDER BY finished_at DESC LIMIT %4$d) a"
  "      WHERE a.task_id BETWEEN tot.lo AND tot.hi"
  "        AND EXISTS (SELECT 1 FROM %1$s q WHERE q.id = a.task_id AND q.batch = $1::text)),"
  " n AS (SELECT count(*) AS n, min(finished_at) AS oldest FROM (SELECT finished_at FROM %3$s"
  "         WHERE finished_at > now() - interval '1 hour'"
  "         ORDER BY finished_at DESC LIMIT %4$d) x),"
  " cut AS (SELECT CASE WHEN n >= %4$d THEN date_trunc('minute', oldest) END AS m FROM n)"
  "SELECT json_build_object('now', extract(epoch FROM date_trunc('minute', now()))::bigint,"
  "  'truncated', (SELECT m IS NOT NULL FROM cut), 'from_attempts', true,"
  "  'rows', coalesce(json_agg(json_build_object('t', extract(epoch FROM m)::bigint,"
  "           'done', d, 'dead', x, 'retried', r) ORDER BY m), '[]'))::text"
  "  FROM (SELECT m, count(*) FILTER (WHERE kind = " SQL_DONE ") AS d,"
  "               count(*) FILTER (WHERE kind = " SQL_DEAD ") AS x,"
  "               count(*) FILTER (WHERE kind IN ('retry', 'snooze')) AS r"
  "          FROM s WHERE m > coalesce((SELECT m FROM cut), '-infinity') GROUP BY m) g";

/* A finished batch's kept report (sql/021), when it still holds: no open row, the same
   total, and no attempt of an id in the batch's range ended after it was last checked (read
   through attempts_finished_idx: the attempts since the last look). A report that holds is
   checked again from now - DASH_CHECK_MARGIN (an attempt's finished_at is its
   transaction's start, and a settle that began before this look may commit after it; a
   settle is one statement, the cycle, so its transaction is milliseconds old when it
   commits: 5 s is ample). So a batch finished in the last 5 s is counted afresh.
   Columns: the report or NULL, open. %1$s table, %2$s batch_totals, %3$s batch_reports,
   %4$s attempts. $1 the batch. */
static const char kept_fmt[] =
  "WITH tot AS (SELECT sum(total)::bigint AS total, min(first_id) AS lo, max(last_id) AS hi"
  "               FROM %2$s WHERE batch = $1::text),"
  "     o AS (SELECT EXISTS (SELECT 1 FROM %1$s q WHERE q.batch = $1::text"
  "                           AND q.status IN (" SQL_PENDING ", " SQL_LEASED ")) AS open),"
  "     v AS (SELECT r.report FROM %3$s r, tot, o"
  "            WHERE r.batch = $1::text AND NOT o.open AND r.total = tot.total"
  "              AND r.checked_at > now() - interval '6 hours'"
  "              AND NOT EXISTS (SELECT 1 FROM %4$s a WHERE a.finished_at > r.checked_at"
  "                                AND a.task_id BETWEEN tot.lo AND tot.hi)),"
  "     u AS (UPDATE %3$s r SET checked_at = now() - interval '" DASH_CHECK_MARGIN "'"
  "            WHERE r.batch = $1::text AND EXISTS (SELECT 1 FROM v)"
  "              AND r.checked_at < now() - interval '" DASH_CHECK_MARGIN "')"
  "SELECT (SELECT report::text FROM v), o.open FROM o";

/* Keeps a finished batch's report: $1 batch, $2 total, $3 the report. %s batch_reports. */
static const char keep_fmt[] =
  "INSERT INTO %s AS r (batch, total, report, computed_at, checked_at)"
  " VALUES ($1::text, $2::bigint, $3::jsonb, now(), now() - interval '" DASH_CHECK_MARGIN "')"
  " ON CONFLICT (batch) DO UPDATE SET total = excluded.total, report = excluded.report,"
  "   computed_at = excluded.computed_at, checked_at = excluded.checked_at";

/* The batch to compare $1 with ("tonight against last night"): the latest batch enqueued
   before it (by first id) whose name is the same once every run of digits is read as one
   (night-2026-12-01 and night-2026-11-30), else the latest before it whatever its name (the
   previous run). Columns: batch, how ('name' or 'previous'). %s batch_totals. */
static const char previous_fmt[] =
  "WITH tot AS (SELECT batch, min(first_id) AS first_id FROM %s GROUP BY batch),"
  "     me AS (SELECT first_id, regexp_replace(batch, '[0-9]+', '#', 'g') AS shape"
  "              FROM tot WHERE batch = $1::text)"
  "SELECT b, how FROM ("
  "  (SELECT t.batch AS b, 'name' AS how, 0 AS o FROM tot t, me"
  "    WHERE t.first_id < me.first_id AND regexp_replace(t.batch, '[0-9]+', '#', 'g') = me.shape"
  "    ORDER BY t.first_id DESC LIMIT 1)"
  "  UNION ALL"
  "  (SELECT t.batch, 'previous', 1 FROM tot t, me WHERE t.first_id < me.first_id"
  "    ORDER BY t.first_id DESC LIMIT 1)) x ORDER BY o LIMIT 1";

/* The latest canaries (sql/018), running first: the numbers of a running one as leash
   canary status computes them (its attempts since it started), a decided one's as decided.
   %1$s canaries, %2$s canary_numbers. */
static const char canaries_fmt[] =
  "SELECT coalesce(json_agg(json_build_object('id', c.id, 'state', c.state,"
  "         'version', left(c.version, 12), 'label', c.label, 'script_name', c.script_name,"
  "         'share', c.share, 'min_tasks', c.min_tasks, 'started_at', c.started_at,"
  "         'decided_at', c.decided_at, 'decided_by', c.decided_by,"
  "         'given_back', c.given_back,"
  "         'numbers', CASE WHEN c.state = 'running' THEN %2$s(c.id) ELSE c.decision END)"
  "         ORDER BY c.state = 'running' DESC, c.id DESC), '[]')::text"
  "  FROM (SELECT * FROM %1$s ORDER BY state = 'running' DESC, id DESC LIMIT %3$d) c";

/* A batch's settles per minute over the last hour, by each row's last settle (finished_at):
   done, dead, and retried (pending again after a settle: waiting for its retry or snooze).
   A row counts once, at its last settle. %s: the table. */
static const char minutes_fmt[] =
  "SELECT json_build_object('now', extract(epoch FROM date_trunc('minute', now()))::bigint,"
  "  'rows', coalesce(json_agg(json_build_object('t', extract(epoch FROM m)::bigint,"
  "           'done', d, 'dead', x, 'retried', r) ORDER BY m), '[]'))::text"
  "  FROM (SELECT date_trunc('minute', finished_at) AS m,"
  "               count(*) FILTER (WHERE status = " SQL_DONE ") AS d,"
  "               count(*) FILTER (WHERE status = " SQL_DEAD ") AS x,"
  "               count(*) FILTER (WHERE status = " SQL_PENDING ") AS r"
  "          FROM %s WHERE batch = $1::text AND finished_at > now() - interval '1 hour'"
  "         GROUP BY 1) s";

/* Who runs what now: leased rows only (one_lease_per_shard covers them), at most 5,000. */
static const char workers_fmt[] =
  "SELECT coalesce(json_agg(json_build_object('worker', w.lease_owner, 'tasks', w.n,"
  "         'ids', w.ids) ORDER BY w.lease_owner), '[]')::text"
  "  FROM (SELECT lease_owner, count(*) AS n, (array_agg(id ORDER BY id))[1:%d] AS ids"
  "          FROM (SELECT lease_owner, id FROM %s WHERE status = " SQL_LEASED " LIMIT 5000) l"
  "         GROUP BY lease_owner ORDER BY lease_owner LIMIT 100) w";

/* The holds claims skip now (as leash status shows them). %s: the holds table. */
static const char holds_fmt[] =
  "SELECT coalesce(json_agg(json_build_object('kind', h.kind, 'scope', h.scope,"
  "         'by', h.source, 'left_s', round(extract(epoch FROM h.until - now())::numeric, 1),"
  "         'reason', h.reason) ORDER BY h.kind, h.scope COLLATE \"C\", h.source), '[]')::text"
  "  FROM (SELECT * FROM %s WHERE until IS NULL OR until > now()"
  "         ORDER BY kind, scope COLLATE \"C\", source LIMIT 100) h";

/* Budgets with their window's use (as leash status). %s: budgets, budget calls. */
static const char budgets_fmt[] =
  "SELECT coalesce(json_agg(json_build_object('name', b.name, 'rpm', b.rpm,"
  "         'calls', coalesce(w.n, 0), 'tpm', b.tpm, 'tokens', coalesce(w.tokens, 0),"
  "         'in_flight', coalesce(w.active, 0), 'window_s', b.window_s,"
  "         'paused_s', CASE WHEN b.paused_until > now()"
  "           THEN round(extract(epoch FROM b.paused_until - now())::numeric, 1) END)"
  "         ORDER BY b.name COLLATE \"C\"), '[]')::text"
  "  FROM (SELECT * FROM %s ORDER BY name COLLATE \"C\" LIMIT 100) b LEFT JOIN LATERAL ("
  "    SELECT count(*) FILTER (WHERE c.at >= now() - make_interval(secs => b.window_s)) AS n,"
  "           sum(c.tokens) FILTER (WHERE c.at >= now() - make_interval(secs => b.window_s))"
  "             AS tokens,"
  "           count(*) FILTER (WHERE NOT c.released AND c.hold_until > now()) AS active"
  "      FROM %s c WHERE c.budget = b.name) w ON true";

/* One task: the row, its steps (results cut at 2,000 bytes), and its attempt history
   (sql/016: one row per execution, the newest 200, oldest first; errors cut at 2,000
   bytes; run_s from handle's start to the end, never below 0, as leash inspect). %1$s: the
   steps table, %2$s the queue, %3$s the attempts. */
static const char task_fmt[] =
  "SELECT json_build_object('task', row_to_json(q),"
  "  'steps', (SELECT coalesce(json_agg(json_build_object('name', s.name, 'attempt', s.attempt,"
  "              'created_at', s.created_at, 'result', left(s.result::text, 2000))"
  "              ORDER BY s.created_at, s.name), '[]')"
  "              FROM (SELECT * FROM %1$s WHERE task_id = q.id ORDER BY created_at, name"
  "                     LIMIT 200) s),"
  "  'attempts', (SELECT coalesce(json_agg(json_build_object('attempt', a.attempt,"
  "              'lease_token', a.lease_token, 'worker', a.worker,"
  "              'version', left(a.version, 12), 'label', a.label, 'kind', a.kind,"
  "              'cause', a.cause, 'status', a.status, 'error', left(a.error, 2000),"
  "              'crashed', a.crashed, 'queue_wait_s', round(a.queue_wait_s::numeric, 3),"
  "              'claimed_at', a.claimed_at, 'finished_at', a.finished_at,"
  "              'run_s', round(greatest(extract(epoch FROM a.finished_at - a.run_started_at),"
  "                                      0)::numeric, 3))"
  "              ORDER BY a.finished_at, a.lease_token), '[]')"
  "              FROM (SELECT * FROM %3$s WHERE task_id = q.id"
  "                     ORDER BY finished_at DESC, lease_token DESC LIMIT 200) a),"
  "  'attempts_total', (SELECT count(*) FROM %3$s WHERE task_id = q.id))::text"
  "  FROM %2$s q WHERE q.id = $1::bigint";

/* malloc'd printf (positional arguments allowed); NULL when out of memory. */
static char *sqlf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *sqlf(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s) {
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  return s;
}

/* Runs sql (one row, one JSON text column) and parses it; NULL with err. */
static json_t *json_query(PGconn *c, const char *sql, int n, const char *const *p, char *err,
                          size_t errlen)
{
  PGresult *r = db_exec(c, sql, n, p, err, errlen);
  if (!r)
    return NULL;
  json_t *j = NULL;
  if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
    json_error_t je;
    j = json_loads(PQgetvalue(r, 0, 0), JSON_DECODE_ANY, &je);
    if (!j)
      snprintf(err, errlen, "cannot read the database's JSON: %s", je.text);
  } else {
    snprintf(err, errlen, "no row");
  }
  PQclear(r);
  return j;
}

static json_t *section(PGconn *c, const char *fmt, const char *a, const char *b, char *err,
                       size_t errlen)
{
  char *sql = malloc(strlen(fmt) + strlen(a) + (b ? strlen(b) : 0) + 32);
  if (!sql) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  sprintf(sql, fmt, a, b);
  json_t *j = json_query(c, sql, 0, NULL, err, errlen);
  free(sql);
  return j;
}

/* report.c's JSON for the batch, through a memory stream (the same statement as leash
   report --batch B --json). */
static json_t *batch_report(PGconn *c, const struct db_table *t, const char *batch, char *err,
                            size_t errlen)
{
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  int rc = report_print(c, t, NULL, batch, 1, f, err, errlen);
  fclose(f);
  json_t *j = NULL;
  if (rc == 0) {
    json_error_t je;
    if (!(j = json_loads(text, 0, &je)))
      snprintf(err, errlen, "cannot read the report: %s", je.text);
  }
  free(text);
  return j;
}

/* The names of the tables and functions the overview reads (db_table_object). */
struct names {
  char *totals, *reports, *attempts, *canaries, *numbers, *holds, *budgets, *calls;
};

static void names_free(struct names *n)
{
  free(n->totals), free(n->reports), free(n->attempts), free(n->canaries);
  free(n->numbers), free(n->holds), free(n->budgets), free(n->calls);
}

static int names_get(PGconn *c, const struct db_table *t, struct names *n)
{
  n->totals = db_table_object(t, c, "batch_totals", 1);
  n->reports = db_table_object(t, c, "batch_reports", 1);
  n->attempts = db_table_object(t, c, "attempts", 1);
  n->canaries = db_table_object(t, c, "canaries", 1);
  n->numbers = db_table_object(t, c, "canary_numbers", 1);
  n->holds = db_table_object(t, c, "holds", 1);
  n->budgets = db_table_object(t, c, "budgets", 1);
  n->calls = db_table_object(t, c, "budget_calls", 1);
  return n->totals && n->reports && n->attempts && n->canaries && n->numbers && n->holds &&
         n->budgets && n->calls ? 0 : -1;
}

/* One statement of one JSON value, from a malloc'd SQL text (freed here). */
static json_t *json_sql(PGconn *c, char *sql, int n, const char *const *p, char *err,
                        size_t errlen)
{
  if (!sql) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  json_t *j = json_query(c, sql, n, p, err, errlen);
  free(sql);
  return j;
}

/* Whether live counts can be right: a total below the open and dead rows counted (rows
   moved into the batch by hand, UPDATE ... SET batch, which the totals do not see) would
   show a negative done; then the batch is counted by a pass instead. Rows moved out of it
   by hand are not seen (README "Dashboard"). */
static int live_holds(json_t *o)
{
  json_t *k = json_object_get(o, "counts");
  return json_integer_value(json_object_get(k ? k : o, STATUS_DONE)) >= 0;
}

/* A batch's report: the kept one while it holds (kept_fmt); else, for a finished batch,
   computed now and kept; for an open one its live report (live_fmt) when full is set, else
   NULL with *open set and no error (the caller counts its rows instead: live_counts_fmt). *kept: it was the kept one.
   NULL with err on a failure. */
static json_t *batch_report_kept(PGconn *c, const struct db_table *t, const struct names *nm,
                                 const char *batch, int full, int *open, int *kept, char *err,
                                 size_t errlen)
{
  *open = 0, *kept = 0;
  err[0] = '\0';
  char *sql = sqlf(kept_fmt, t->qualified, nm->totals, nm->reports, nm->attempts);
  if (!sql) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  const char *p[] = { batch };
  PGresult *r = db_exec(c, sql, 1, p, err, errlen);
  free(sql);
  if (!r)
    return NULL;
  json_t *rep = NULL;
  if (!PQgetisnull(r, 0, 0)) {
    json_error_t je;
    if (!(rep = json_loads(PQgetvalue(r, 0, 0), 0, &je)))
      snprintf(err, errlen, "cannot read a kept report: %s", je.text);
    *kept = rep != NULL;
  }
  *open = strcmp(PQgetvalue(r, 0, 1), "t") == 0;
  PQclear(r);
  if (rep || err[0] || (*open && !full))
    return rep;
  if (*open) {   /* running: its live report (live_fmt), never a pass over its rows */
    char *live = sqlf(live_fmt, t->qualified, nm->totals, nm->attempts, DASH_LIVE_SAMPLE,
                      DASH_LIVE_DEAD, REPORT_EXAMPLE_IDS, REPORT_TOP_REASONS,
                      DASH_LIVE_SCAN);
    if (!(rep = json_sql(c, live, 1, p, err, errlen)) || live_holds(rep))
      return rep;
    json_decref(rep);
    return batch_report(c, t, batch, err, errlen);
  }
  if (!(rep = batch_report(c, t, batch, err, errlen)))
    return NULL;
  /* Kept only when it is a finished batch's (it may have opened since the probe), and one
     with rows: a GET of any ?batch= name must not add rows to the table. */
  if (json_is_true(json_object_get(rep, "settled")) && !*open &&
      json_integer_value(json_object_get(rep, "total")) > 0) {
    char total[32], *text = json_dumps(rep, JSON_COMPACT | JSON_REAL_PRECISION(17));
    char *keep = text ? sqlf(keep_fmt, nm->reports) : NULL;
    snprintf(total, sizeof total, "%lld",
             (long long)json_integer_value(json_object_get(rep, "total")));
    const char *kp[] = { batch, total, text };
    PGresult *k = keep ? db_exec(c, keep, 3, kp, err, errlen) : NULL;
    /* Not kept is only slower next time: the report itself is right. */
    if (!k)
      log_warn("dashboard: a finished batch's report not kept: %s", keep ? err : "out of memory");
    PQclear(k);
    free(keep);
    free(text);
    err[0] = '\0';
  }
  return rep;
}

/* A list entry's counts, from a report's. */
static void counts_from_report(json_t *b, json_t *rep)
{
  json_t *k = json_object_get(rep, "counts");
  static const char *const keys[] = { "pending", "leased", "done", "dead" };
  json_object_set(b, "total", json_object_get(rep, "total"));
  for (size_t i = 0; i < 4; i++)
    json_object_set(b, keys[i], json_object_get(k, keys[i]));
}

/* The batch shown, compared: the previous batch of its name's shape or the previous run
   (previous_fmt), with its report's figures. json null when there is none. */
static json_t *previous_batch(PGconn *c, const struct db_table *t, const struct names *nm,
                              const char *shown, char *err, size_t errlen)
{
  char *sql = sqlf(previous_fmt, nm->totals);
  if (!sql) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  const char *p[] = { shown };
  PGresult *r = db_exec(c, sql, 1, p, err, errlen);
  free(sql);
  if (!r)
    return NULL;
  if (PQntuples(r) == 0) {
    PQclear(r);
    return json_null();
  }
  json_t *o = json_pack("{s:s,s:s}", "batch", PQgetvalue(r, 0, 0), "how", PQgetvalue(r, 0, 1));
  PQclear(r);
  int open, kept;
  json_t *rep = o ? batch_report_kept(c, t, nm, json_string_value(json_object_get(o, "batch")),
                                      1, &open, &kept, err, errlen)
                  : NULL;
  if (!rep) {
    json_decref(o);
    return NULL;
  }
  static const char *const keys[] = { "total", "counts", "wall_s", "duration_s",
                                      "first_claim_at", "last_finish_at", "settled" };
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    json_object_set(o, keys[i], json_object_get(rep, keys[i]));
  json_decref(rep);
  return o;
}

char *dash_overview_json(PGconn *c, const struct db_table *t, const char *batch, char *err,
                         size_t errlen)
{
  struct names nm = { 0 };
  json_t *o = json_object(), *batches = NULL, *report = NULL, *s;
  char *out = NULL;
  if (!o || names_get(c, t, &nm) != 0) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  const char *p1[] = { batch };
  if (!(batches = json_sql(c, sqlf(batches_fmt, t->qualified, DASH_MAX_BATCHES, nm.totals), 1,
                           p1, err, errlen)))
    goto done;
  /* The batch shown: the one asked for, else the first with open rows, else the newest. */
  const char *shown = batch;
  size_t i;
  json_t *b;
  json_array_foreach(batches, i, b) {
    if (!shown && json_is_true(json_object_get(b, "open")))
      shown = json_string_value(json_object_get(b, "batch"));
  }
  if (!shown && json_array_size(batches) > 0)
    shown = json_string_value(json_object_get(json_array_get(batches, 0), "batch"));
  json_object_set_new(o, "selected", shown ? json_string(shown) : json_null());
  json_t *minutes = json_null(), *previous = json_null();
  int open = 0, kept = 0;
  if (shown) {
    if (!(report = batch_report_kept(c, t, &nm, shown, 1, &open, &kept, err, errlen)))
      goto done;
    json_object_set_new(report, "kept", json_boolean(kept));
    /* Settles of the last hour: none when the batch has been finished for longer. */
    const char *last = json_string_value(json_object_get(report, "last_finish_at"));
    int recent = open || !last;
    if (!recent) {
      const char *p[] = { last };
      PGresult *r = db_exec(c, "SELECT $1::timestamptz > now() - interval '1 hour'", 1, p,
                            err, errlen);
      if (!r)
        goto done;
      recent = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
      PQclear(r);
    }
    const char *p[] = { shown };
    if (recent) {
      char *sql = open ? sqlf(live_minutes_fmt, t->qualified, nm.totals, nm.attempts,
                              DASH_LIVE_MINUTES)
                       : sqlf(minutes_fmt, t->qualified);
      if (!(minutes = json_sql(c, sql, 1, p, err, errlen)))
        goto done;
    } else if (!(minutes = json_pack("{s:I,s:[]}", "now", (json_int_t)0, "rows"))) {
      goto oom;
    }
    json_object_set_new(o, "minutes", minutes);
    if (!(previous = previous_batch(c, t, &nm, shown, err, errlen)))
      goto done;
  } else {
    json_object_set_new(o, "minutes", minutes);
  }
  json_object_set(o, "report", report ? report : json_null());
  json_object_set_new(o, "previous", previous);
  /* Each listed batch's counts: the shown one's report, a kept report, or (open) a count. */
  json_array_foreach(batches, i, b) {
    const char *name = json_string_value(json_object_get(b, "batch"));
    int bo, bk;
    json_t *rep = NULL;
    if (shown && report && strcmp(name, shown) == 0) {
      counts_from_report(b, report);
      json_object_set_new(b, "kept", json_boolean(kept));
      continue;
    }
    if (!(rep = batch_report_kept(c, t, &nm, name, 0, &bo, &bk, err, errlen)) && err[0])
      goto done;
    if (rep) {
      counts_from_report(b, rep);
      json_decref(rep);
    } else {
      const char *p[] = { name };
      json_t *k = json_sql(c, sqlf(live_counts_fmt, t->qualified, nm.totals), 1, p, err,
                           errlen);
      if (!k)
        goto done;
      if (!live_holds(k)) {   /* counted by a pass instead */
        json_decref(k);
        if (!(rep = batch_report(c, t, name, err, errlen)))
          goto done;
        counts_from_report(b, rep);
        json_decref(rep);
        json_object_set_new(b, "kept", json_false());
        continue;
      }
      json_object_update(b, k);
      json_decref(k);
    }
    json_object_set_new(b, "kept", json_boolean(bk));
  }
  json_object_set(o, "batches", batches);
  if (!(s = json_sql(c, sqlf(workers_fmt, DASH_WORKER_IDS, t->qualified), 0, NULL, err, errlen)))
    goto done;
  json_object_set_new(o, "workers", s);
  if (!(s = section(c, holds_fmt, nm.holds, NULL, err, errlen)))
    goto done;
  json_object_set_new(o, "holds", s);
  if (!(s = section(c, budgets_fmt, nm.budgets, nm.calls, err, errlen)))
    goto done;
  json_object_set_new(o, "budgets", s);
  if (!(s = json_sql(c, sqlf(canaries_fmt, nm.canaries, nm.numbers, DASH_MAX_CANARIES), 0,
                     NULL, err, errlen)))
    goto done;
  json_object_set_new(o, "canaries", s);
  if ((out = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(9))))
    goto done;
oom:
  snprintf(err, errlen, "out of memory");
done:
  json_decref(report);
  json_decref(batches);
  json_decref(o);
  names_free(&nm);
  return out;
}

char *dash_task_json(PGconn *c, const struct db_table *t, long long id, int *missing,
                     char *err, size_t errlen)
{
  *missing = 0;
  char *steps = db_table_object(t, c, "steps", 1);
  char *hist = db_table_object(t, c, "attempts", 1);
  char *out = NULL, *sql = steps && hist ? sqlf(task_fmt, steps, t->qualified, hist) : NULL;
  if (!sql) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  char ids[32];
  snprintf(ids, sizeof ids, "%lld", id);
  const char *p[] = { ids };
  PGresult *r = db_exec(c, sql, 1, p, err, errlen);
  if (!r)
    goto done;
  if (PQntuples(r) == 0) {
    *missing = 1;
    snprintf(err, errlen, "no such task: %lld", id);
  } else if (!(out = strdup(PQgetvalue(r, 0, 0)))) {
    snprintf(err, errlen, "out of memory");
  }
  PQclear(r);
done:
  free(sql);
  free(steps);
  free(hist);
  return out;
}

/* {"ok": ok, "message": msg} */
static int answer(int status, char **json, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
static int answer(int status, char **json, const char *fmt, ...)
{
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *o = json_pack("{s:b,s:s}", "ok", status == 200, "message", msg);
  *json = o ? json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
  json_decref(o);
  return status;
}

/* A database failure: a data error (22xxx, 23xxx: a value the functions refuse) is the
   caller's 400, anything else 500. */
static int db_failure(char **json, const char *err)
{
  int bad = strncmp(db_last_sqlstate(), "22", 2) == 0 || strncmp(db_last_sqlstate(), "23", 2) == 0;
  return answer(bad ? 400 : 500, json, "%s; nothing was changed", err);
}

static int one_scope(const struct dash_action *a, int with_budget, const char **kind,
                     const char **value)
{
  int n = 0;
  if (a->batch && *a->batch)
    n++, *kind = "batch", *value = a->batch;
  if (a->tenant && *a->tenant)
    n++, *kind = "tenant", *value = a->tenant;
  if (with_budget && a->budget && *a->budget)
    n++, *kind = "budget", *value = a->budget;
  if (with_budget && a->kind && a->scope && *a->scope) {
    n++, *value = a->scope;
    *kind = !strcmp(a->kind, "tenant") ? "tenant" : !strcmp(a->kind, "batch") ? "batch"
          : !strcmp(a->kind, "budget") ? "budget" : NULL;
    if (!*kind)
      return -1;
  }
  return n;
}

static int requeue_or_cancel(PGconn *c, const struct db_table *t, int cancel,
                             const struct dash_action *a, char **json)
{
  char err[DB_ERR_MAX], ids[48] = "";
  long id = 0;
  const char *kind = NULL, *value = NULL;
  int scopes = one_scope(a, 0, &kind, &value);
  if (a->id && *a->id) {
    if (cli_parse_int(a->id, 1, 9223372036854775807L, &id) != 0)
      return answer(400, json, "id must be a task id (an integer >= 1)");
    snprintf(ids, sizeof ids, "{%ld}", id);
    scopes++;
  }
  if (scopes != 1)
    return answer(400, json, "give one of id, batch or tenant");
  if (cancel) {
    long long pending = 0, leased = 0;
    if (queue_cancel(c, t, id ? ids : NULL, kind && !strcmp(kind, "batch") ? value : NULL,
                     kind && !strcmp(kind, "tenant") ? value : NULL, &pending, &leased, err,
                     sizeof err) != 0)
      return db_failure(json, err);
    return answer(200, json, "cancelled %lld pending and %lld running task%s", pending, leased,
                  pending + leased == 1 ? "" : "s");
  }
  long long count = 0;
  if (id) {
    PGresult *r = queue_requeue_ids(c, t, ids, NULL, NULL, err, sizeof err);
    if (!r)
      return db_failure(json, err);
    int ok = PQntuples(r) == 1 && PQgetisnull(r, 0, 1);
    char why[256];
    snprintf(why, sizeof why, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 1) : "no such task");
    PQclear(r);
    if (!ok)
      return answer(409, json, "task %ld not requeued (only dead tasks are): %s", id, why);
    return answer(200, json, "requeued task %ld", id);
  }
  if (queue_requeue_dead(c, t, strcmp(kind, "tenant") == 0 ? value : NULL,
                         strcmp(kind, "batch") == 0 ? value : NULL, DASH_REQUEUE_CHUNK, &count,
                         err, sizeof err) != 0)
    return answer(500, json, "%s (after %lld requeued)", err, count);
  return answer(200, json, "requeued %lld dead task%s", count, count == 1 ? "" : "s");
}

/* leash pause / leash resume's statements (cmd_pause.c), restated: $1 kind, $2 scope, $3
   seconds or NULL, $4 reason. */
static const char hold_fmt[] =
  "SELECT %s($1, $2, 'pause', now() + make_interval(secs => $3::float8), $4)";
static const char unhold_fmt[] = "SELECT %s($1, $2, 'pause') OR ($1 = 'budget' AND %s($2))";

static int pause_or_resume(PGconn *c, const struct db_table *t, int pausing,
                           const struct dash_action *a, char **json)
{
  const char *kind = NULL, *value = NULL;
  if (one_scope(a, 1, &kind, &value) != 1)
    return answer(400, json, "give one of batch, tenant or budget");
  double for_s = -1;
  char secs[32];
  if (pausing && a->for_s && *a->for_s) {
    if (cli_parse_duration(a->for_s, &for_s) != 0 || for_s <= 0 || for_s > DASH_PAUSE_MAX_S)
      return answer(400, json, "for must be a duration (30s, 10m, 2h) of at most a year");
    snprintf(secs, sizeof secs, "%.3f", for_s);
  }
  char *fa = db_table_object(t, c, pausing ? "hold" : "unhold", 1);
  char *fb = db_table_object(t, c, "budget_resume", 1);
  size_t n = sizeof unhold_fmt + sizeof hold_fmt + (fa ? strlen(fa) : 0) + (fb ? strlen(fb) : 0);
  char *sql = fa && fb ? malloc(n) : NULL;
  int status;
  if (!sql) {
    status = answer(500, json, "out of memory");
  } else {
    if (pausing)
      snprintf(sql, n, hold_fmt, fa);
    else
      snprintf(sql, n, unhold_fmt, fa, fb);
    const char *p[] = { kind, value, for_s >= 0 ? secs : NULL, "leash dashboard" };
    char err[DB_ERR_MAX];
    PGresult *r = db_exec(c, sql, pausing ? 4 : 2, p, err, sizeof err);
    if (!r) {
      status = db_failure(json, err);
    } else if (pausing) {
      status = answer(200, json, "paused %s %s%s%s", kind, value, for_s >= 0 ? " for " : "",
                      for_s >= 0 ? a->for_s : " until resumed");
    } else {
      int was = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
      status = answer(200, json, was ? "resumed %s %s" : "%s %s was not paused", kind, value);
    }
    PQclear(r);
  }
  free(sql);
  free(fa);
  free(fb);
  return status;
}

int dash_action_run(PGconn *c, const struct db_table *t, const char *action,
                    const struct dash_action *a, char **json)
{
  if (strcmp(action, "requeue") == 0 || strcmp(action, "cancel") == 0)
    return requeue_or_cancel(c, t, action[0] == 'c', a, json);
  if (strcmp(action, "pause") == 0 || strcmp(action, "resume") == 0)
    return pause_or_resume(c, t, action[0] == 'p', a, json);
  return answer(404, json, "no such action");
}
