/* report: a scope's summary in one statement, printed as text or JSON. See report.h. */
#include "report.h"

#include "lifecycle.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Dead tasks are also counted by last_cause (quarantined, bad_row, script_error, ...;
   'unknown' for rows settled before 010), and crashes are summed over the scope.
   %s is the queue table, then REPORT_EXAMPLE_IDS and REPORT_TOP_REASONS, then the usage
   table (sql/014: tokens and cost of budgeted calls, by budget and model). $1 tenants (text[] or NULL), $2 batch, $3 the table's quoted name
   (for regclass). Built as JSON by PostgreSQL so that C only formats it. Dead reasons are
   grouped by the first line of last_error (a Lua traceback's first line names the place
   and the message), cut at 200 characters. Durations are those of done tasks' last attempt:
   from run_started_at (when handle started, written at settle by 011) to finished_at (every
   settle); rows settled before 011 have no run_started_at and count from started_at (the
   claim), as they did. The waits, of done tasks too: claim to start (run_started_at -
   started_at, in the process's ready buffer and setup) and pickup (started_at - the moment
   the row became runnable, greatest(created_at, run_after): the last attempt's run_after;
   a row claimed "before" that was written by hand, and is left out rather than shown as a
   negative wait). */
static const char report_fmt[] =
  "WITH s AS MATERIALIZED ("
  "  SELECT id, status, attempts, started_at, finished_at, crashes,"
  "         CASE WHEN status = " SQL_DONE " AND finished_at IS NOT NULL"
  "                   AND run_started_at IS NOT NULL AND started_at IS NOT NULL"
  "              THEN extract(epoch FROM run_started_at - started_at)::float8 END AS sw,"
  "         CASE WHEN status = " SQL_DONE " AND finished_at IS NOT NULL"
  "                   AND started_at >= greatest(created_at, run_after)"
  "              THEN extract(epoch FROM started_at - greatest(created_at, run_after))::float8"
  "         END AS pw,"
  "         CASE WHEN status = " SQL_DEAD " THEN coalesce(last_cause, 'unknown') END AS cause,"
  "         CASE WHEN status = " SQL_DONE " AND finished_at IS NOT NULL"
  "                   AND coalesce(run_started_at, started_at) IS NOT NULL"
  "              THEN extract(epoch FROM finished_at - coalesce(run_started_at, started_at))"
  "                   ::float8 END AS d,"
  "         CASE WHEN status = " SQL_DEAD
  "              THEN coalesce(nullif(left(split_part(last_error, E'\\n', 1), 200), ''),"
  "                            '(no message)') END AS reason"
  "    FROM %s"
  "   WHERE ($1::text[] IS NULL OR tenant_id = ANY ($1::text[]))"
  "     AND ($2::text IS NULL OR batch = $2::text)"
  "), a AS ("
  "  SELECT count(*) AS total,"
  "         count(*) FILTER (WHERE status = " SQL_PENDING ") AS pending,"
  "         count(*) FILTER (WHERE status = " SQL_LEASED ") AS leased,"
  "         count(*) FILTER (WHERE status = " SQL_DONE ") AS done,"
  "         count(*) FILTER (WHERE status = " SQL_DEAD ") AS dead,"
  "         coalesce(sum(greatest(attempts - 1, 0)), 0) AS retries,"
  "         count(*) FILTER (WHERE attempts > 1) AS retried_tasks,"
  "         count(d) AS timed,"
  "         percentile_disc(0.5) WITHIN GROUP (ORDER BY d) AS p50,"
  "         percentile_disc(0.95) WITHIN GROUP (ORDER BY d) AS p95,"
  "         max(d) AS dmax,"
  "         count(sw) AS sw_n,"
  "         percentile_disc(0.5) WITHIN GROUP (ORDER BY sw) AS sw50,"
  "         percentile_disc(0.95) WITHIN GROUP (ORDER BY sw) AS sw95,"
  "         max(sw) AS swmax,"
  "         count(pw) AS pw_n,"
  "         percentile_disc(0.5) WITHIN GROUP (ORDER BY pw) AS pw50,"
  "         percentile_disc(0.95) WITHIN GROUP (ORDER BY pw) AS pw95,"
  "         max(pw) AS pwmax,"
  "         min(started_at) AS first_claim,"
  "         max(finished_at) FILTER (WHERE status IN (" SQL_DONE ", " SQL_DEAD ")) AS last_finish,"
  "         count(DISTINCT reason) AS reasons,"
  "         coalesce(sum(crashes), 0) AS crashes,"
  "         count(*) FILTER (WHERE crashes > 0) AS crashed_tasks"
  "    FROM s"
  ")"
  "SELECT json_build_object("
  "  'table', $3::regclass::text,"
  "  'tenants', to_json($1::text[]),"
  "  'batch', $2::text,"
  "  'counts', json_build_object(" SQL_PENDING ", a.pending, " SQL_LEASED ", a.leased,"
  "                              " SQL_DONE ", a.done, " SQL_DEAD ", a.dead),"
  "  'total', a.total,"
  "  'settled', a.pending + a.leased = 0,"
  "  'attempts', (SELECT coalesce(json_object_agg(k.attempts, k.n ORDER BY k.attempts), '{}')"
  "                 FROM (SELECT attempts, count(*) AS n FROM s GROUP BY attempts) k),"
  "  'retries', a.retries,"
  "  'retried_tasks', a.retried_tasks,"
  "  'crashes', a.crashes,"
  "  'crashed_tasks', a.crashed_tasks,"
  "  'dead_causes', (SELECT coalesce(json_object_agg(k.cause, k.n ORDER BY k.n DESC, k.cause),"
  "                                  '{}')"
  "                    FROM (SELECT cause, count(*) AS n FROM s WHERE status = " SQL_DEAD
  "                           GROUP BY cause) k),"
  "  'duration_s', json_build_object('count', a.timed, 'p50', a.p50, 'p95', a.p95,"
  "                                  'max', a.dmax),"
  "  'dead_reasons', (SELECT coalesce(json_agg(json_build_object('reason', r.reason,"
  "                                     'count', r.n, 'example_ids', r.ids)"
  "                                   ORDER BY r.n DESC, r.reason), '[]')"
  "                     FROM (SELECT reason, count(*) AS n,"
  "                                  (array_agg(id ORDER BY id))[1:%d] AS ids"
  "                             FROM s WHERE status = " SQL_DEAD " GROUP BY reason"
  "                            ORDER BY count(*) DESC, reason LIMIT %d) r),"
  "  'dead_reasons_total', a.reasons,"
  "  'first_claim_at', to_char(a.first_claim AT TIME ZONE 'UTC',"
  "                            'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
  "  'last_finish_at', to_char(a.last_finish AT TIME ZONE 'UTC',"
  "                            'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
  "  'wall_s', extract(epoch FROM a.last_finish - a.first_claim)::float8,"
  "  'pickup_wait_s', json_build_object('count', a.pw_n, 'p50', a.pw50, 'p95', a.pw95,"
  "                                     'max', a.pwmax),"
  "  'start_wait_s', json_build_object('count', a.sw_n, 'p50', a.sw50, 'p95', a.sw95,"
  "                                    'max', a.swmax),"
  "  'usage', (SELECT coalesce(json_agg(json_build_object('budget', k.budget, 'model', k.model,"
  "                              'calls', k.calls, 'input_tokens', k.i, 'output_tokens', k.o,"
  "                              'tokens', k.t, 'cost', round(k.c, 6),"
  "                              'sync_cost', round(k.sc, 6))"
  "                            ORDER BY k.budget COLLATE \"C\", k.model COLLATE \"C\"), '[]')"
  "              FROM (SELECT u.budget, u.model, count(*) AS calls, sum(u.input_tokens) AS i,"
  "                           sum(u.output_tokens) AS o, sum(u.tokens) AS t, sum(u.cost) AS c,"
  "                           sum(u.sync_cost) AS sc"
  "                      FROM %s u"
  "                     WHERE ($1::text[] IS NULL OR u.tenant_id = ANY ($1::text[]))"
  "                       AND ($2::text IS NULL OR u.batch = $2::text)"
  "                     GROUP BY u.budget, u.model) k)"
  ")::text FROM a";

/* Per version: %s the attempts table, the queue table, the usage table; $1 tenants, $2
   batch, $3 the table's quoted name. A task is in scope by its row (tenant, batch). An
   attempt with no version ran no script of ours (a lease lost before its worker settled it:
   reaped, cancelled) and is counted under version null. fatal: kind dead and no crash (the
   script's fatal, a bad row); crash: it counted in crashes (a reaped lease too); dead: the
   tasks this version's attempts left dead, over the version's tasks. run_s as in
   cmd_inspect.c (never below 0). Usage joins by task, attempt and the lease's time. */
static const char by_version_fmt[] =
  "WITH h AS MATERIALIZED ("
  "  SELECT a.task_id, a.version, a.label, a.kind, a.status, a.crashed, a.finished_at,"
  "         greatest(extract(epoch FROM a.finished_at - a.run_started_at), 0)::float8 AS run_s,"
  "         us.tokens, us.cost"
  "    FROM %s a JOIN %s q ON q.id = a.task_id"
  "    LEFT JOIN LATERAL (SELECT sum(u.tokens)::bigint AS tokens, sum(u.cost) AS cost"
  "                         FROM %s u WHERE u.task_id = a.task_id AND u.attempt = a.attempt"
  "                          AND u.at >= a.claimed_at AND u.at <= a.finished_at) us ON true"
  "   WHERE ($1::text[] IS NULL OR q.tenant_id = ANY ($1::text[]))"
  "     AND ($2::text IS NULL OR q.batch = $2::text)"
  "), v AS ("
  "  SELECT version, max(label) AS label, count(DISTINCT task_id) AS tasks, count(*) AS attempts,"
  "         count(*) FILTER (WHERE kind = " SQL_DONE ") AS done,"
  "         count(*) FILTER (WHERE kind = 'retry') AS retry,"
  "         count(*) FILTER (WHERE kind = " SQL_DEAD " AND NOT crashed) AS fatal,"
  "         count(*) FILTER (WHERE kind = 'snooze') AS snooze,"
  "         count(*) FILTER (WHERE kind = 'wait') AS wait,"
  "         count(*) FILTER (WHERE crashed) AS crash,"
  "         count(*) FILTER (WHERE kind = 'lost') AS lost,"
  "         count(DISTINCT task_id) FILTER (WHERE status = " SQL_DEAD ") AS dead,"
  "         count(run_s) AS timed,"
  "         percentile_disc(0.5) WITHIN GROUP (ORDER BY run_s) AS p50,"
  "         percentile_disc(0.95) WITHIN GROUP (ORDER BY run_s) AS p95,"
  "         sum(tokens)::bigint AS tokens, sum(cost) AS cost,"
  "         min(finished_at) AS first_at, max(finished_at) AS last_at"
  "    FROM h GROUP BY version"
  ")"
  "SELECT json_build_object("
  "  'table', $3::regclass::text, 'tenants', to_json($1::text[]), 'batch', $2::text,"
  "  'by', 'version',"
  "  'versions', coalesce((SELECT json_agg(json_build_object("
  "      'version', v.version, 'label', v.label, 'tasks', v.tasks, 'attempts', v.attempts,"
  "      'counts', json_build_object('done', v.done, 'retry', v.retry, 'fatal', v.fatal,"
  "                                  'snooze', v.snooze, 'wait', v.wait, 'crash', v.crash,"
  "                                  'lost', v.lost,"
  "                                  'dead', v.dead),"
  "      'rates', json_build_object("
  "          'done', round(v.done::numeric / v.attempts, 4),"
  "          'retry', round(v.retry::numeric / v.attempts, 4),"
  "          'fatal', round(v.fatal::numeric / v.attempts, 4),"
  "          'snooze', round(v.snooze::numeric / v.attempts, 4),"
  "          'wait', round(v.wait::numeric / v.attempts, 4),"
  "          'crash', round(v.crash::numeric / v.attempts, 4),"
  "          'lost', round(v.lost::numeric / v.attempts, 4),"
  "          'dead', round(v.dead::numeric / v.tasks, 4)),"
  "      'duration_s', json_build_object('count', v.timed, 'p50', v.p50, 'p95', v.p95),"
  "      'tokens', v.tokens, 'cost', round(v.cost, 6),"
  "      'first_at', to_char(v.first_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
  "      'last_at', to_char(v.last_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))"
  "      ORDER BY v.first_at, v.version) FROM v), '[]'))::text";

static void print_text(const json_t *r, FILE *out);
static void print_versions(const json_t *r, FILE *out);
static int print_result(PGresult *res, int as_json, void (*text)(const json_t *, FILE *),
                        FILE *out, char *err, size_t errlen);
static json_int_t get_int(const json_t *o, const char *key);
static void print_seconds(FILE *out, const char *label, const json_t *v);

int report_print(PGconn *c, const struct db_table *t, const char *tenants, const char *batch,
                 int as_json, FILE *out, char *err, size_t errlen)
{
  char sql[sizeof report_fmt + 1024];
  char *usage = db_table_object(t, c, "usage", 1);
  if (!usage) {
    snprintf(err, errlen, "report: out of memory");
    return -1;
  }
  snprintf(sql, sizeof sql, report_fmt, t->qualified, REPORT_EXAMPLE_IDS, REPORT_TOP_REASONS,
           usage);
  free(usage);
  const char *params[] = { tenants, batch, t->qualified };
  PGresult *res = db_exec(c, sql, 3, params, err, errlen);
  if (!res)
    return -1;
  return print_result(res, as_json, print_text, out, err, errlen);
}

int report_print_by_version(PGconn *c, const struct db_table *t, const char *tenants,
                            const char *batch, int as_json, FILE *out, char *err, size_t errlen)
{
  char *attempts = db_table_object(t, c, "attempts", 1), *usage = db_table_object(t, c, "usage", 1);
  size_t n = sizeof by_version_fmt + (attempts ? strlen(attempts) : 0) + strlen(t->qualified) +
             (usage ? strlen(usage) : 0);
  char *sql = attempts && usage ? malloc(n) : NULL;
  if (!sql) {
    free(attempts);
    free(usage);
    snprintf(err, errlen, "report: out of memory");
    return -1;
  }
  snprintf(sql, n, by_version_fmt, attempts, t->qualified, usage);
  free(attempts);
  free(usage);
  const char *params[] = { tenants, batch, t->qualified };
  PGresult *res = db_exec(c, sql, 3, params, err, errlen);
  free(sql);
  if (!res)
    return -1;
  return print_result(res, as_json, print_versions, out, err, errlen);
}

/* Both reports' server answer is one JSON value: printed as it is for --json, else by text.
   Takes res (cleared here). */
static int print_result(PGresult *res, int as_json, void (*text)(const json_t *, FILE *),
                        FILE *out, char *err, size_t errlen)
{
  json_error_t je;
  json_t *r = json_loads(PQgetvalue(res, 0, 0), 0, &je);
  PQclear(res);
  if (!r) {
    snprintf(err, errlen, "report: unreadable JSON from the server: %s", je.text);
    return -1;
  }
  if (as_json) {
    char *s = json_dumps(r, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s)
      fprintf(out, "%s\n", s);
    free(s);
  } else {
    text(r, out);
  }
  fflush(out);
  json_decref(r);
  return 0;
}

/* One block per version, first seen first:
     version 0ecbf8f0cc53 (v1): 3 tasks, 5 attempts
       done 2 (40.0%), retry 2 (40.0%), fatal 1 (20.0%), snooze 0, wait 0, crash 0, lost 0; dead 1 task (33.3%)
       run p50 6ms, p95 10ms (5 attempts timed); tokens 1200, cost 0.0120 */
static void print_versions(const json_t *r, FILE *out)
{
  const json_t *tenants = json_object_get(r, "tenants");
  const char *batch = json_string_value(json_object_get(r, "batch"));
  fprintf(out, "report by version, table %s", json_string_value(json_object_get(r, "table")));
  if (batch)
    fprintf(out, ", batch %s", batch);
  for (size_t i = 0; i < json_array_size(tenants); i++)
    fprintf(out, "%s%s", i ? "," : ", tenants ", json_string_value(json_array_get(tenants, i)));
  fprintf(out, "\n");
  const json_t *vs = json_object_get(r, "versions"), *v;
  size_t k;
  if (json_array_size(vs) == 0)
    fprintf(out, "no attempts recorded\n");
  json_array_foreach(vs, k, v) {
    const char *ver = json_string_value(json_object_get(v, "version"));
    const char *label = json_string_value(json_object_get(v, "label"));
    const json_t *n = json_object_get(v, "counts"), *rt = json_object_get(v, "rates");
    char line[512];
    /* A label is the script's text (checked at load: no control characters); cut anyway so
       a hand-written row cannot forge a line. */
    snprintf(line, sizeof line, "version %.12s%s%.64s%s: %lld task%s, %lld attempt%s\n",
             ver ? ver : "(none: leases lost before a settle)", label ? " (" : "",
             label ? label : "", label ? ")" : "", (long long)get_int(v, "tasks"),
             get_int(v, "tasks") == 1 ? "" : "s", (long long)get_int(v, "attempts"),
             get_int(v, "attempts") == 1 ? "" : "s");
    for (char *p = line; *p && p[1]; p++)
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        *p = '?';
    fputs(line, out);
    static const char *const kinds[] = { "done", "retry", "fatal", "snooze", "wait", "crash",
                                          "lost" };
    fprintf(out, " ");
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
      fprintf(out, "%s %s %lld (%.1f%%)", i ? "," : "", kinds[i],
              (long long)get_int(n, kinds[i]),
              100 * json_number_value(json_object_get(rt, kinds[i])));
    fprintf(out, "; dead %lld task%s (%.1f%%)\n", (long long)get_int(n, "dead"),
            get_int(n, "dead") == 1 ? "" : "s", 100 * json_number_value(json_object_get(rt, "dead")));
    const json_t *d = json_object_get(v, "duration_s");
    fprintf(out, "  ");
    print_seconds(out, "run p50", json_object_get(d, "p50"));
    print_seconds(out, ", p95", json_object_get(d, "p95"));
    fprintf(out, " (%lld attempt%s timed)", (long long)get_int(d, "count"),
            get_int(d, "count") == 1 ? "" : "s");
    const json_t *tok = json_object_get(v, "tokens"), *cost = json_object_get(v, "cost");
    if (json_is_integer(tok))
      fprintf(out, "; tokens %lld", (long long)json_integer_value(tok));
    if (json_is_number(cost))
      fprintf(out, ", cost %.4f", json_number_value(cost));
    fprintf(out, "\n");
  }
}

void report_format_duration(double secs, char *buf, size_t buflen)
{
  if (!isfinite(secs) || secs < 0) {
    snprintf(buf, buflen, "-");
    return;
  }
  if (secs < 1) {
    snprintf(buf, buflen, "%.0fms", secs * 1000);
    return;
  }
  if (secs < 60) {
    snprintf(buf, buflen, "%.1fs", secs);
    return;
  }
  long long s = llround(secs);
  if (s < 3600)
    snprintf(buf, buflen, "%lldm %llds", s / 60, s % 60);
  else if (s < 86400)
    snprintf(buf, buflen, "%lldh %lldm", s / 3600, s % 3600 / 60);
  else
    snprintf(buf, buflen, "%lldd %lldh", s / 86400, s % 86400 / 3600);
}

static json_int_t get_int(const json_t *o, const char *key)
{
  return json_integer_value(json_object_get(o, key));
}

/* "label  1.2s" or "label  -" when v is null. */
static void print_seconds(FILE *out, const char *label, const json_t *v)
{
  char buf[32];
  if (json_is_number(v))
    report_format_duration(json_number_value(v), buf, sizeof buf);
  else
    snprintf(buf, sizeof buf, "-");
  fprintf(out, "%s %s", label, buf);
}

static void print_text(const json_t *r, FILE *out)
{
  const json_t *counts = json_object_get(r, "counts");
  const json_t *tenants = json_object_get(r, "tenants");
  const char *batch = json_string_value(json_object_get(r, "batch"));

  fprintf(out, "report     table %s", json_string_value(json_object_get(r, "table")));
  if (batch)
    fprintf(out, ", batch %s", batch);
  if (json_array_size(tenants) > 0) {
    fprintf(out, ", tenant%s ", json_array_size(tenants) > 1 ? "s" : "");
    for (size_t i = 0; i < json_array_size(tenants); i++)
      fprintf(out, "%s%s", i ? "," : "", json_string_value(json_array_get(tenants, i)));
  }
  fprintf(out, "\n");

  json_int_t open = get_int(counts, STATUS_PENDING) + get_int(counts, STATUS_LEASED);
  fprintf(out, "tasks      %lld: done %lld, dead %lld, pending %lld, leased %lld%s\n",
          (long long)get_int(r, "total"), (long long)get_int(counts, STATUS_DONE),
          (long long)get_int(counts, STATUS_DEAD), (long long)get_int(counts, STATUS_PENDING),
          (long long)get_int(counts, STATUS_LEASED), open ? " (not settled yet)" : "");

  const char *key;
  const json_t *v;
  fprintf(out, "attempts  ");
  json_object_foreach((json_t *)json_object_get(r, "attempts"), key, v)
    fprintf(out, " %s: %lld", key, (long long)json_integer_value(v));
  fprintf(out, "\n");
  fprintf(out, "retries    %lld (on %lld task%s)\n", (long long)get_int(r, "retries"),
          (long long)get_int(r, "retried_tasks"), get_int(r, "retried_tasks") == 1 ? "" : "s");

  if (get_int(r, "crashes") > 0)
    fprintf(out, "crashes    %lld (on %lld task%s)\n", (long long)get_int(r, "crashes"),
            (long long)get_int(r, "crashed_tasks"), get_int(r, "crashed_tasks") == 1 ? "" : "s");
  const json_t *causes = json_object_get(r, "dead_causes");
  if (json_object_size(causes) > 0) {
    fprintf(out, "dead causes");
    int first = 1;
    json_object_foreach((json_t *)causes, key, v) {
      fprintf(out, "%s %s %lld", first ? "" : ",", key, (long long)json_integer_value(v));
      first = 0;
    }
    fprintf(out, "\n");
  }

  const json_t *d = json_object_get(r, "duration_s");
  if (get_int(d, "count") > 0) {
    fprintf(out, "duration  ");
    print_seconds(out, " p50", json_object_get(d, "p50"));
    print_seconds(out, ", p95", json_object_get(d, "p95"));
    print_seconds(out, ", max", json_object_get(d, "max"));
    fprintf(out, " (%lld done task%s, last attempt from its start)\n",
            (long long)get_int(d, "count"), get_int(d, "count") == 1 ? "" : "s");
  } else {
    fprintf(out, "duration   - (no done task with timings)\n");
  }
  /* Where the time before the run went: waiting to be claimed, then claimed but not yet
     started (the ready buffer, a slot's setup). One line; the second half only for rows
     that recorded their start. */
  const json_t *pw = json_object_get(r, "pickup_wait_s"), *sw = json_object_get(r, "start_wait_s");
  if (get_int(pw, "count") > 0) {
    fprintf(out, "waits     ");
    print_seconds(out, " pickup p50", json_object_get(pw, "p50"));
    print_seconds(out, ", p95", json_object_get(pw, "p95"));
    if (get_int(sw, "count") > 0) {
      print_seconds(out, "; claim to start p50", json_object_get(sw, "p50"));
      print_seconds(out, ", p95", json_object_get(sw, "p95"));
    }
    fprintf(out, "\n");
  }

  const json_t *wall = json_object_get(r, "wall_s");
  if (json_is_number(wall)) {
    print_seconds(out, "wall      ", wall);
    fprintf(out, " (first claim %s, last finish %s)\n",
            json_string_value(json_object_get(r, "first_claim_at")),
            json_string_value(json_object_get(r, "last_finish_at")));
  } else {
    fprintf(out, "wall       - (nothing claimed and finished yet)\n");
  }

  json_t *use = json_object_get(r, "usage"), *u;
  size_t k;
  json_array_foreach(use, k, u) {
    const char *model = json_string_value(json_object_get(u, "model"));
    json_t *cost = json_object_get(u, "cost"), *sync = json_object_get(u, "sync_cost");
    char line[600], costs[80] = "no price";
    /* Provider batches (sql/022) keep what the calls would have cost synchronously. */
    if (json_is_number(cost) && json_is_number(sync))
      snprintf(costs, sizeof costs, "cost %.4f at batch prices (%.4f synchronously)",
               json_number_value(cost), json_number_value(sync));
    else if (json_is_number(cost))
      snprintf(costs, sizeof costs, "cost %.4f", json_number_value(cost));
    snprintf(line, sizeof line, "%s %s/%s: %lld calls, %lld tokens, %s\n",
             k ? "          " : "usage     ", json_string_value(json_object_get(u, "budget")),
             model ? model : "-", (long long)get_int(u, "calls"), (long long)get_int(u, "tokens"),
             costs);
    for (char *p = line; *p && p[1]; p++)   /* names cannot forge a line */
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        *p = '?';
    fputs(line, out);
  }

  const json_t *reasons = json_object_get(r, "dead_reasons");
  if (json_array_size(reasons) == 0)
    return;
  fprintf(out, "dead reasons (most frequent first):\n");
  for (size_t i = 0; i < json_array_size(reasons); i++) {
    const json_t *e = json_array_get(reasons, i), *ids = json_object_get(e, "example_ids");
    fprintf(out, "  %6lld  %s\n          e.g. id", (long long)get_int(e, "count"),
            json_string_value(json_object_get(e, "reason")));
    for (size_t j = 0; j < json_array_size(ids); j++)
      fprintf(out, "%s %lld", j ? "," : "", (long long)json_integer_value(json_array_get(ids, j)));
    fprintf(out, "\n");
  }
  json_int_t more = get_int(r, "dead_reasons_total") - (json_int_t)json_array_size(reasons);
  if (more > 0)
    fprintf(out, "  (and %lld more reason%s)\n", (long long)more, more == 1 ? "" : "s");
}
