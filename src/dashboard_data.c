/* dashboard_data: the dashboard's statements (see dashboard_data.h for their costs). */
#include "dashboard_data.h"
#include "cli.h"
#include "lifecycle.h"
#include "queue.h"
#include "report.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DASH_REQUEUE_CHUNK 5000   /* as leash requeue --dead */
#define DASH_PAUSE_MAX_S (365.0 * 86400)

/* The batches worth showing: those with open rows, found by a skip scan of batch_open_idx
   (one probe per batch, however many rows are open), those among the newest 10,000 rows
   (the primary key, backwards), and $1 when asked for; each counted through batch_idx (the
   cost of leash status --batch, per batch listed). Newest first. %1$s: the table. */
static const char batches_fmt[] =
  "WITH RECURSIVE open(batch) AS ("
  "  (SELECT batch FROM %1$s WHERE status IN (" SQL_PENDING ", " SQL_LEASED ")"
  "      AND batch IS NOT NULL ORDER BY batch LIMIT 1)"
  "  UNION ALL"
  "  SELECT (SELECT q.batch FROM %1$s q WHERE q.status IN (" SQL_PENDING ", " SQL_LEASED ")"
  "             AND q.batch IS NOT NULL AND q.batch > o.batch ORDER BY q.batch LIMIT 1)"
  "    FROM open o WHERE o.batch IS NOT NULL),"
  "     recent AS (SELECT batch FROM (SELECT batch, id FROM %1$s ORDER BY id DESC LIMIT 10000) r"
  "                 WHERE batch IS NOT NULL GROUP BY batch ORDER BY max(id) DESC LIMIT %2$d),"
  "     pick AS (SELECT batch FROM (SELECT batch FROM open WHERE batch IS NOT NULL LIMIT %2$d) o"
  "              UNION SELECT batch FROM recent"
  "              UNION SELECT $1::text WHERE $1::text IS NOT NULL)"
  "SELECT coalesce(json_agg(json_build_object('batch', p.batch, 'total', k.total,"
  "         'pending', k.pending, 'leased', k.leased, 'done', k.done, 'dead', k.dead)"
  "         ORDER BY k.last_id DESC NULLS LAST), '[]')::text"
  "  FROM (SELECT batch FROM pick ORDER BY batch = $1::text DESC NULLS LAST, batch"
  "         LIMIT %2$d + 1) p"
  " CROSS JOIN LATERAL (SELECT count(*) AS total,"
  "         count(*) FILTER (WHERE q.status = " SQL_PENDING ") AS pending,"
  "         count(*) FILTER (WHERE q.status = " SQL_LEASED ") AS leased,"
  "         count(*) FILTER (WHERE q.status = " SQL_DONE ") AS done,"
  "         count(*) FILTER (WHERE q.status = " SQL_DEAD ") AS dead, max(q.id) AS last_id"
  "    FROM %1$s q WHERE q.batch = p.batch) k";

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

/* One task: the row, its steps (results cut at 2,000 bytes), and its attempt history when a
   table for it exists ($2, probed with to_regclass: a later migration adds it). %s: the
   steps table, then the queue. */
static const char task_fmt[] =
  "SELECT json_build_object('task', row_to_json(q),"
  "  'steps', (SELECT coalesce(json_agg(json_build_object('name', s.name, 'attempt', s.attempt,"
  "              'created_at', s.created_at, 'result', left(s.result::text, 2000))"
  "              ORDER BY s.created_at, s.name), '[]')"
  "              FROM (SELECT * FROM %s WHERE task_id = q.id ORDER BY created_at, name"
  "                     LIMIT 200) s),"
  "  'history_table', to_regclass($2::text)::text)::text"
  "  FROM %s q WHERE q.id = $1::bigint";

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

char *dash_overview_json(PGconn *c, const struct db_table *t, const char *batch, char *err,
                         size_t errlen)
{
  json_t *o = json_object(), *batches = NULL;
  char *holds = db_table_object(t, c, "holds", 1);
  char *budgets = db_table_object(t, c, "budgets", 1);
  char *calls = db_table_object(t, c, "budget_calls", 1);
  char *sql = NULL, *out = NULL;
  if (!o || !holds || !budgets || !calls) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  size_t n = sizeof batches_fmt + 5 * strlen(t->qualified) + 64;
  if (!(sql = malloc(n))) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  snprintf(sql, n, batches_fmt, t->qualified, DASH_MAX_BATCHES);
  const char *p1[] = { batch };
  if (!(batches = json_query(c, sql, 1, p1, err, errlen)))
    goto done;
  /* The batch shown: the one asked for, else the first with open rows, else the newest. */
  const char *shown = batch;
  size_t i;
  json_t *b;
  json_array_foreach(batches, i, b) {
    if (shown)
      break;
    if (json_integer_value(json_object_get(b, "pending")) +
          json_integer_value(json_object_get(b, "leased")) > 0)
      shown = json_string_value(json_object_get(b, "batch"));
  }
  if (!shown && json_array_size(batches) > 0)
    shown = json_string_value(json_object_get(json_array_get(batches, 0), "batch"));
  json_object_set_new(o, "selected", shown ? json_string(shown) : json_null());
  json_t *report = json_null(), *minutes = json_null();
  if (shown) {
    if (!(report = batch_report(c, t, shown, err, errlen)))
      goto done_batches;
    free(sql);
    n = sizeof minutes_fmt + strlen(t->qualified);
    if (!(sql = malloc(n))) {
      json_decref(report);
      snprintf(err, errlen, "out of memory");
      goto done_batches;
    }
    snprintf(sql, n, minutes_fmt, t->qualified);
    const char *p[] = { shown };
    if (!(minutes = json_query(c, sql, 1, p, err, errlen))) {
      json_decref(report);
      goto done_batches;
    }
  }
  json_object_set_new(o, "report", report);
  json_object_set_new(o, "minutes", minutes);
  json_object_set(o, "batches", batches);
  json_t *s;
  free(sql);
  n = sizeof workers_fmt + strlen(t->qualified) + 16;
  if (!(sql = malloc(n)))
    goto oom;
  snprintf(sql, n, workers_fmt, DASH_WORKER_IDS, t->qualified);
  if (!(s = json_query(c, sql, 0, NULL, err, errlen)))
    goto done_batches;
  json_object_set_new(o, "workers", s);
  if (!(s = section(c, holds_fmt, holds, NULL, err, errlen)))
    goto done_batches;
  json_object_set_new(o, "holds", s);
  if (!(s = section(c, budgets_fmt, budgets, calls, err, errlen)))
    goto done_batches;
  json_object_set_new(o, "budgets", s);
  out = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(9));
  if (!out)
    goto oom;
  goto done_batches;
oom:
  snprintf(err, errlen, "out of memory");
done_batches:
  json_decref(batches);
done:
  json_decref(o);
  free(sql);
  free(holds);
  free(budgets);
  free(calls);
  return out;
}

char *dash_task_json(PGconn *c, const struct db_table *t, long long id, int *missing,
                     char *err, size_t errlen)
{
  *missing = 0;
  char *steps = db_table_object(t, c, "steps", 1);
  char *hist = db_table_object(t, c, "attempts", 1);
  char *out = NULL, *sql = NULL;
  size_t n = sizeof task_fmt + (steps ? strlen(steps) : 0) + strlen(t->qualified);
  if (!steps || !hist || !(sql = malloc(n))) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  snprintf(sql, n, task_fmt, steps, t->qualified);
  char ids[32];
  snprintf(ids, sizeof ids, "%lld", id);
  const char *p[] = { ids, hist };
  PGresult *r = db_exec(c, sql, 2, p, err, errlen);
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
