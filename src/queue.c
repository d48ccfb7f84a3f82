/* queue: the lifecycle's statements. See queue.h, sql/010_outcome_causes.sql (the cycle and
   the reaper) and docs/ARCHITECTURE.md. */
#include "queue.h"

#include "buf.h"
#include "lifecycle.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct queue {
  char *depth_sql, *leader_sql;
  char *heartbeat_sql, *reap_sql, *reap_rows_sql, *release_sql, *open_sql, *cycle_sql;
  char *cycle_rows_sql, *repair_sql;
  char *owner;
  /* This process's place in the tenants' ring (sql/011): the tenant of its last claim and
     how many more that tenant may take before the next one's turn. */
  char *ring;
  int ring_left;
  int chained;                  /* the last cycle's leases made by its settle (sql/029) */
  char visibility[32];
  double visibility_s;
  /* The run's backoff for retries without a delay (--backoff-base/-cap/-jitter), as the
     cycle's last three parameters; a row's own backoff_base/backoff_cap beat them (012). */
  char backoff[3][32];
};

static char *format_sql(const char *fmt, const char *a);
static char *format_sql2(const char *fmt, const char *a);
static char *format_sql_ab(const char *fmt, const char *a, const char *b);
static char *key_array(const struct lease_key *keys, int n, int tokens);
static struct task *task_from_cycle_row(PGresult *r, int i, double now, double visibility);
static void ring_keep(struct queue *q, PGresult *r, int row);

struct queue *queue_new(PGconn *c, const struct db_table *t, const char *owner,
                        double visibility_s)
{
  struct queue *q = calloc(1, sizeof *q);
  char *reap = db_table_object(t, c, "reap", 1), *release = db_table_object(t, c, "release", 1);
  char *cycle = db_table_object(t, c, "cycle", 1);
  char *cycle_rows = db_table_object(t, c, "cycle_rows", 1);
  char *reap_rows = db_table_object(t, c, "reap_rows", 1);
  char *repair = db_table_object(t, c, "repair_heads", 1);
  char *budgets = db_table_object(t, c, "budgets", 1);
  if (!q || !reap || !release || !cycle || !cycle_rows || !reap_rows || !repair)
    goto fail;
  /* How many were reaped, and of those how many went dead as quarantined or exhausted. */
#define REAP_COUNTS "SELECT count(*), count(*) FILTER (WHERE status = " SQL_DEAD " AND cause = " \
                    "'quarantined'), count(*) FILTER (WHERE status = " SQL_DEAD " AND cause <> " \
                    "'quarantined') FROM %s()"
  q->reap_sql = format_sql(REAP_COUNTS, reap);
  q->reap_rows_sql = format_sql(REAP_COUNTS, reap_rows);
#undef REAP_COUNTS
  /* Only pending and leased rows: both have partial indexes, done/dead are never read. */
  q->depth_sql = budgets ? format_sql_ab(
    "SELECT count(*) FILTER (WHERE status = " SQL_PENDING " AND run_after <= now()), "
    "       count(*) FILTER (WHERE status = " SQL_PENDING " AND run_after > now()), "
    "       count(*) FILTER (WHERE status = " SQL_LEASED "), "
    "       coalesce(extract(epoch FROM now() - min(run_after) "
    "                FILTER (WHERE status = " SQL_PENDING " AND run_after <= now())), -1)::float8, "
    "       (SELECT count(*) FROM %s WHERE paused_until > now()) "
    "  FROM %s WHERE status IN (" SQL_PENDING ", " SQL_LEASED ")", budgets, t->qualified)
    : NULL;
  /* The metrics leader's lock (metrics.h): a session lock per table, on the lease thread's
     connection, so it goes when the process or its connection does. */
  q->leader_sql = format_sql(
    "SELECT pg_try_advisory_lock(hashtextextended('leash.metrics' || chr(31) || "
    "%s::regclass::oid::text, 0))", t->literal);
  /* The cycle and its row-by-row fallback (sql/010) take the same arguments, but for the
     cycle's last: how many next rows its settle may lease (sql/029; the fallback leases
     none there). */
#define CYCLE_SELECT                                                                          \
  "SELECT settled, id, attempts, max_attempts, tenant_id, shard_key, batch, payload, waited, " \
  "       status, cause, token, ring, ring_left "                                            \
  "FROM %s($1, $2::bigint[], $3::bigint[], $4::text[], $5::float8[], $6::text[], "           \
  "$7::jsonb[], $8::text[], $9::boolean[], $10::float8[], $11::int, $12::float8, "            \
  "$13::text[], $14, $15, $16::int, $17::float8, $18::float8, $19::float8, $20::text[], "     \
  "$21::text[], $22::float8[]"
  q->cycle_sql = format_sql(CYCLE_SELECT ", $23::int)", cycle);
  q->cycle_rows_sql = format_sql(CYCLE_SELECT ")", cycle_rows);
#undef CYCLE_SELECT
  q->release_sql = format_sql("SELECT count(*) FROM %s($1, $2::bigint[], $3::bigint[])", release);
  q->repair_sql = format_sql("SELECT %s()", repair);
  /* Only a lease that has not expired is renewed: once expired, another claimer may already
     hold the shard, and reviving it would make two leases of one shard. Rows locked right
     now (our own dispatcher settling them) are skipped, not waited for: a heartbeat that
     never waits cannot deadlock with a settle, and a skipped row is "unknown", not lost. */
  q->heartbeat_sql = format_sql2(
    "WITH mine AS ("
    "  SELECT q.id FROM %s q WHERE q.id = ANY ($1::bigint[]) FOR UPDATE SKIP LOCKED"
    "), renewed AS ("
    "  UPDATE %s q SET locked_until = now() + make_interval(secs => $4::float8) "
    "    FROM unnest($1::bigint[], $2::bigint[]) AS u(id, token), mine m "
    "   WHERE q.id = u.id AND m.id = q.id AND q.lease_token = u.token AND q.lease_owner = $3 "
    "     AND q.status = " SQL_LEASED " AND q.locked_until > now() "
    "  RETURNING q.id"
    ") SELECT m.id, r.id IS NOT NULL FROM mine m LEFT JOIN renewed r ON r.id = m.id",
    t->qualified);
  q->open_sql = format_sql(
    "SELECT EXISTS (SELECT 1 FROM %s WHERE status IN (" SQL_PENDING ", " SQL_LEASED ") "
    "  AND ($1::text[] IS NULL OR tenant_id = ANY ($1::text[])) "
    "  AND ($2::text IS NULL OR batch = $2))", t->qualified);
  q->owner = strdup(owner);
  queue_set_backoff(q, LIFECYCLE_BACKOFF_BASE, LIFECYCLE_BACKOFF_CAP_S, LIFECYCLE_BACKOFF_JITTER);
  q->visibility_s = visibility_s;
  snprintf(q->visibility, sizeof q->visibility, "%.3f", visibility_s);
  if (!q->reap_sql || !q->release_sql || !q->heartbeat_sql || !q->open_sql || !q->owner ||
      !q->cycle_sql || !q->depth_sql || !q->leader_sql || !q->cycle_rows_sql || !q->reap_rows_sql ||
      !q->repair_sql)
    goto fail;
  free(repair);
  free(budgets);
  free(cycle);
  free(cycle_rows);
  free(reap);
  free(reap_rows);
  free(release);
  return q;
fail:
  free(repair);
  free(budgets);
  free(cycle);
  free(cycle_rows);
  free(reap);
  free(reap_rows);
  free(release);
  queue_free(q);
  return NULL;
}

void queue_set_backoff(struct queue *q, double base, double cap, double jitter)
{
  /* %.17g: the value the flag gave, not a rounding of it (the agreement tests compare). */
  snprintf(q->backoff[0], sizeof q->backoff[0], "%.17g", base);
  snprintf(q->backoff[1], sizeof q->backoff[1], "%.17g", cap);
  snprintf(q->backoff[2], sizeof q->backoff[2], "%.17g", jitter);
}

void queue_free(struct queue *q)
{
  if (!q)
    return;
  free(q->heartbeat_sql);
  free(q->reap_sql);
  free(q->reap_rows_sql);
  free(q->cycle_rows_sql);
  free(q->release_sql);
  free(q->open_sql);
  free(q->cycle_sql);
  free(q->depth_sql);
  free(q->leader_sql);
  free(q->repair_sql);
  free(q->owner);
  free(q->ring);
  free(q);
}

#define SETTLE_ARRAYS 12

/* The array parameters of a settle ({ids}, {tokens}, {kinds}, {delays}, {errors},
   {results}, {causes}, {crashed}, {run_s}: seconds from the claim to the run's start;
   for the attempt history (sql/016): {versions}, {labels}, {waited}: the claim's queue wait)
   for the first n tasks of list. 0, or -1 when out of
   memory (arrays freed). */
static int settle_arrays(struct task *list, int n, struct buf a[SETTLE_ARRAYS])
{
  int i = 0;
  memset(a, 0, SETTLE_ARRAYS * sizeof a[0]);
  for (int k = 0; k < SETTLE_ARRAYS; k++)
    buf_add(&a[k], "{", 1);
  for (struct task *t = list; t && i < n; t = t->next, i++) {
    const char *sep = i ? "," : "";
    buf_printf(&a[0], "%s%lld", sep, (long long)t->id);
    buf_printf(&a[1], "%s%lld", sep, (long long)t->token);
    buf_printf(&a[2], "%s%s", sep, lifecycle_kind_sql(t->out.kind));
    if ((t->out.kind == OUTCOME_RETRY || t->out.kind == OUTCOME_SNOOZE) && t->out.delay >= 0)
      buf_printf(&a[3], "%s%.3f", sep, t->out.delay);
    else
      buf_printf(&a[3], "%sNULL", sep);
    buf_puts(&a[4], sep);
    if (t->out.error)
      buf_add_array_elem(&a[4], t->out.error);
    else
      buf_puts(&a[4], "NULL");
    buf_puts(&a[5], sep);
    if (t->out.result)
      buf_add_array_elem(&a[5], t->out.result);
    else
      buf_puts(&a[5], "NULL");
    /* Cause names are lower-case words: no quoting needed. */
    buf_printf(&a[6], "%s%s", sep, lifecycle_cause_name(t->out.cause));
    buf_printf(&a[7], "%s%s", sep, lifecycle_cause_is_crash(t->out.cause) ? "t" : "f");
    if (t->run_start > 0)
      buf_printf(&a[8], "%s%.6f", sep, t->run_start - t->claimed_at);
    else
      buf_printf(&a[8], "%sNULL", sep);
    /* A version is 64 hex digits: no quoting needed. A label is the script's text. */
    buf_printf(&a[9], "%s%s", sep, t->version[0] ? t->version : "NULL");
    buf_puts(&a[10], sep);
    if (t->label[0])
      buf_add_array_elem(&a[10], t->label);
    else
      buf_puts(&a[10], "NULL");
    buf_printf(&a[11], "%s%.6f", sep, t->waited);
  }
  int oom = 0;
  for (int k = 0; k < SETTLE_ARRAYS; k++) {
    buf_add(&a[k], "}", 1);
    oom |= a[k].oom;
  }
  if (oom) {
    for (int k = 0; k < SETTLE_ARRAYS; k++)
      buf_free(&a[k]);
    return -1;
  }
  return 0;
}

/* Sets applied[i] (SETTLED_*) for each task of list from the cycle's settled rows (id in
   column 1, the status written in 9, the cause in 10; 'leased' means "write it again"); tasks
   no row names stay SETTLED_LATE. A process holds one lease of a task at a time when it
   settles (a lost one is dropped before), so the id alone finds the outcome.
   Returns 0, or -1 when out of memory. */
static int mark_applied(PGresult *r, struct task *list, int n, char *applied)
{
  struct lease_key *keys = malloc((size_t)n * sizeof *keys);
  if (!keys)
    return -1;
  int i = 0;
  for (struct task *t = list; t && i < n; t = t->next, i++)
    keys[i] = (struct lease_key){ .id = t->id, .token = t->token, .pos = i };
  queue_keys_sort(keys, n);
  memset(applied, SETTLED_LATE, (size_t)n);
  for (int row = 0; row < PQntuples(r); row++) {
    if (PQgetisnull(r, row, 0) || strcmp(PQgetvalue(r, row, 0), "t") != 0)
      continue;
    int k = queue_keys_find(keys, n, strtoll(PQgetvalue(r, row, 1), NULL, 10), -1);
    if (k < 0)
      continue;
    const char *status = PQgetvalue(r, row, 9);
    const char *cause = PQgetvalue(r, row, 10);
    applied[keys[k].pos] =
      strcmp(status, STATUS_LEASED) == 0                            ? SETTLED_AGAIN
      : strcmp(status, STATUS_DONE) == 0                            ? SETTLED_DONE
      : strcmp(status, STATUS_PENDING) == 0                         ? SETTLED_PENDING
      : strcmp(cause, lifecycle_cause_name(CAUSE_QUARANTINED)) == 0 ? SETTLED_QUARANTINED
      : strcmp(cause, lifecycle_cause_name(CAUSE_BAD_ROW)) == 0     ? SETTLED_BAD_ROW
                                                                    : SETTLED_DEAD;
  }
  free(keys);
  return 0;
}

int queue_cycle(struct queue *q, PGconn *c, struct task *list, int n, char *applied,
                const struct queue_scope *s, int want, int chain, struct task **out,
                double *next_due, char *err, size_t errlen)
{
  struct buf a[SETTLE_ARRAYS];
  char nbuf[16], left[16], cbuf[16];
  *out = NULL;
  if (settle_arrays(list, n, a) != 0) {
    snprintf(err, errlen, "out of memory building a settle");
    return -1;
  }
  snprintf(nbuf, sizeof nbuf, "%d", want);
  snprintf(left, sizeof left, "%d", q->ring_left);
  snprintf(cbuf, sizeof cbuf, "%d", n > 0 && chain > 0 ? chain : 0);
  const char *params[] = { q->owner, a[0].s, a[1].s, a[2].s, a[3].s, a[4].s, a[5].s, a[6].s,
                           a[7].s, a[8].s, nbuf, q->visibility, s->tenants, s->batch, q->ring,
                           left, q->backoff[0], q->backoff[1], q->backoff[2], a[9].s,
                           a[10].s, a[11].s, cbuf };
  /* The fallback takes all but the last. */
  enum { NPARAMS = sizeof params / sizeof params[0], NPARAMS_ROWS = NPARAMS - 1 };
  double now = task_now();
  PGresult *r = db_exec_prepared(c, "leash_cycle", q->cycle_sql, NPARAMS, params, err, errlen);
  if (!r && PQstatus(c) == CONNECTION_OK && queue_row_error(db_last_sqlstate())) {
    /* One row's data made the whole statement fail (sql/010: a shard key the index cannot
       hold, attempts at INT_MAX, a user trigger raising). The same cycle
       row by row in subtransactions sets that row aside and writes and claims the rest; the
       fast path keeps no subtransaction for it. */
    log_warn("cycle failed on a row (%s); retrying it row by row", err);
    r = db_exec_prepared(c, "leash_cycle_rows", q->cycle_rows_sql, NPARAMS_ROWS, params, err,
                         errlen);
  }
  for (int k = 0; k < SETTLE_ARRAYS; k++)
    buf_free(&a[k]);
  if (!r)
    return -1;
  if (n > 0 && mark_applied(r, list, n, applied) != 0) {
    /* Written, but which outcome matched is unknown: report none as written (counted
       nowhere, no late warnings); the rows themselves are settled. */
    memset(applied, -1, (size_t)n);
  }
  int claimed = 0;
  struct task **tail = out;
  *next_due = -1;
  q->chained = 0;
  for (int row = 0; row < PQntuples(r); row++) {
    if (PQgetisnull(r, row, 0)) {   /* the claim's last row: next due time, ring place */
      if (!PQgetisnull(r, row, 8))
        *next_due = atof(PQgetvalue(r, row, 8));
      ring_keep(q, r, row);
      continue;
    }
    if (strcmp(PQgetvalue(r, row, 0), "t") == 0)
      continue;
    struct task *t = task_from_cycle_row(r, row, now, q->visibility_s);
    if (!t) {
      /* The rows are leased already; they come back when their leases expire. */
      snprintf(err, errlen, "out of memory reading claimed tasks");
      break;
    }
    *tail = t;
    tail = &t->next;
    claimed++;
    q->chained += !PQgetisnull(r, row, 9);   /* status 'leased': the settle leased it */
  }
  PQclear(r);
  return claimed;
}

int queue_chained(const struct queue *q) { return q->chained; }

/* The ring place from the claim's last row (columns 12 and 13). Out of memory keeps the old
   place: fairness then restarts from there, nothing else depends on it. */
static void ring_keep(struct queue *q, PGresult *r, int row)
{
  if (PQgetisnull(r, row, 12)) {
    free(q->ring);
    q->ring = NULL;
    q->ring_left = 0;
    return;
  }
  char *ring = strdup(PQgetvalue(r, row, 12));
  if (!ring)
    return;
  free(q->ring);
  q->ring = ring;
  q->ring_left = PQgetisnull(r, row, 13) ? 0 : atoi(PQgetvalue(r, row, 13));
}

int queue_heartbeat(struct queue *q, PGconn *c, struct lease_key *keys, int n, char *renewed,
                    char *err, size_t errlen)
{
  queue_keys_sort(keys, n);
  char *id_list = key_array(keys, n, 0), *tok_list = key_array(keys, n, 1);
  int rc = -1;
  if (!id_list || !tok_list) {
    snprintf(err, errlen, "out of memory building a heartbeat");
    goto out;
  }
  const char *params[] = { id_list, tok_list, q->owner, q->visibility };
  PGresult *r = db_exec(c, q->heartbeat_sql, 4, params, err, errlen);
  memset(renewed, HEARTBEAT_UNKNOWN, (size_t)n);
  if (!r && PQstatus(c) == CONNECTION_OK && queue_row_error(db_last_sqlstate())) {
    /* One row refuses its renewal (a user trigger, say): renew the others one by one, or
       every lease of this process would lapse and count as a crash. The refusing one stays
       unknown, so its local deadline decides. */
    log_warn("heartbeat failed on a row (%s); renewing one by one", err);
    for (int k = 0; k < n; k++) {
      char id1[32], tok1[32];
      snprintf(id1, sizeof id1, "{%lld}", (long long)keys[k].id);
      snprintf(tok1, sizeof tok1, "{%lld}", (long long)keys[k].token);
      const char *one[] = { id1, tok1, q->owner, q->visibility };
      PGresult *r1 = db_exec(c, q->heartbeat_sql, 4, one, err, errlen);
      if (!r1) {
        if (PQstatus(c) != CONNECTION_OK || !queue_row_error(db_last_sqlstate()))
          goto out;
        continue;
      }
      if (PQntuples(r1) > 0)
        renewed[k] = strcmp(PQgetvalue(r1, 0, 1), "t") == 0 ? HEARTBEAT_RENEWED : HEARTBEAT_LOST;
      PQclear(r1);
    }
    rc = 0;
    goto out;
  }
  if (!r)
    goto out;
  for (int row = 0; row < PQntuples(r); row++) {
    long long id = strtoll(PQgetvalue(r, row, 0), NULL, 10);
    char answer = strcmp(PQgetvalue(r, row, 1), "t") == 0 ? HEARTBEAT_RENEWED : HEARTBEAT_LOST;
    /* One row per id; should a task be held twice (a lost lease and its re-claim), both
       entries get the answer. */
    for (int k = queue_keys_find(keys, n, id, -1); k >= 0 && k < n && keys[k].id == id; k++)
      renewed[k] = answer;
  }
  PQclear(r);
  rc = 0;
out:
  free(id_list);
  free(tok_list);
  return rc;
}

static int key_cmp(const void *a, const void *b)
{
  const struct lease_key *x = a, *y = b;
  if (x->id != y->id)
    return x->id < y->id ? -1 : 1;
  return (x->token > y->token) - (x->token < y->token);
}

void queue_keys_sort(struct lease_key *keys, int n)
{
  if (n > 1)
    qsort(keys, (size_t)n, sizeof *keys, key_cmp);
}

int queue_keys_find(const struct lease_key *keys, int n, int64_t id, int64_t token)
{
  int lo = 0, hi = n;   /* the first key >= (id, token); a negative token sorts first */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (keys[mid].id < id || (keys[mid].id == id && keys[mid].token < token))
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < n && keys[lo].id == id && (token < 0 || keys[lo].token == token))
    return lo;
  return -1;
}

int queue_row_error(const char *sqlstate)
{
  static const char *const classes[] = { "22", "23", "54", "P0" };   /* <table>_row_error */
  for (size_t i = 0; sqlstate && i < sizeof classes / sizeof classes[0]; i++)
    if (strncmp(sqlstate, classes[i], 2) == 0)
      return 1;
  return 0;
}

int queue_reap(struct queue *q, PGconn *c, long long dead[2], char *err, size_t errlen)
{
  PGresult *r = db_exec(c, q->reap_sql, 0, NULL, err, errlen);
  if (!r && PQstatus(c) == CONNECTION_OK && queue_row_error(db_last_sqlstate())) {
    log_warn("reap failed on a row (%s); reaping row by row", err);
    r = db_exec(c, q->reap_rows_sql, 0, NULL, err, errlen);
  }
  if (!r)
    return -1;
  int n = atoi(PQgetvalue(r, 0, 0));
  dead[0] = atoll(PQgetvalue(r, 0, 1));
  dead[1] = atoll(PQgetvalue(r, 0, 2));
  PQclear(r);
  return n;
}

int queue_repair_heads(struct queue *q, PGconn *c, char *err, size_t errlen)
{
  PGresult *r = db_exec(c, q->repair_sql, 0, NULL, err, errlen);
  if (!r)
    return -1;
  int n = atoi(PQgetvalue(r, 0, 0));
  PQclear(r);
  return n;
}

int queue_release(struct queue *q, PGconn *c, const struct lease_key *keys, int n, char *err,
                  size_t errlen)
{
  char *id_list = key_array(keys, n, 0), *tok_list = key_array(keys, n, 1);
  int rc = -1;
  if (!id_list || !tok_list) {
    snprintf(err, errlen, "out of memory building a release");
    goto out;
  }
  const char *params[] = { q->owner, id_list, tok_list };
  PGresult *r = db_exec(c, q->release_sql, 3, params, err, errlen);
  if (r) {
    rc = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
  }
out:
  free(id_list);
  free(tok_list);
  return rc;
}

int queue_depth(struct queue *q, PGconn *c, struct queue_depth *out, char *err, size_t errlen)
{
  PGresult *r = db_exec(c, q->depth_sql, 0, NULL, err, errlen);
  if (!r)
    return -1;
  out->runnable = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
  out->scheduled = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
  out->leased = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
  out->oldest_runnable_s = atof(PQgetvalue(r, 0, 3));
  out->budgets_paused = strtoll(PQgetvalue(r, 0, 4), NULL, 10);
  PQclear(r);
  return 0;
}

int queue_metrics_leader(struct queue *q, PGconn *c, char *err, size_t errlen)
{
  PGresult *r = db_exec(c, q->leader_sql, 0, NULL, err, errlen);
  if (!r)
    return -1;
  int got = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  PQclear(r);
  return got;
}

int queue_scope_open(struct queue *q, PGconn *c, const struct queue_scope *s, char *err,
                     size_t errlen)
{
  const char *params[] = { s->tenants, s->batch };
  PGresult *r = db_exec(c, q->open_sql, 2, params, err, errlen);
  if (!r)
    return -1;
  int open = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  PQclear(r);
  return open;
}

/* The wake-up channel of the table named by $1: "leash_<table oid>". The one spelling in C;
   sql/002's trigger and the reap/release/cycle functions compute the same name. */
#define CHANNEL_OF_1 "('leash_' || $1::regclass::oid::text)"

char *queue_listen_sql(PGconn *c, const struct db_table *t, char *err, size_t errlen)
{
  const char *params[] = { t->qualified };
  PGresult *r = db_exec(c, "SELECT " CHANNEL_OF_1, 1, params, err, errlen);
  if (!r)
    return NULL;
  char *out = NULL;
  const char *channel = PQgetvalue(r, 0, 0);
  char *quoted = PQescapeIdentifier(c, channel, strlen(channel));
  if (quoted) {
    out = format_sql("LISTEN %s", quoted);
    PQfreemem(quoted);
  }
  PQclear(r);
  if (!out)
    snprintf(err, errlen, "out of memory");
  return out;
}

static int notify(PGconn *c, const struct db_table *t, const char *payload, char *err,
                  size_t errlen)
{
  const char *params[] = { t->qualified, payload };
  PGresult *r = db_exec(c, "SELECT pg_notify(" CHANNEL_OF_1 ", $2)", 2, params, err, errlen);
  if (!r)
    return -1;
  PQclear(r);
  return 0;
}

int queue_notify(PGconn *c, const struct db_table *t, char *err, size_t errlen)
{
  return notify(c, t, "", err, errlen);
}

int queue_notify_canary(PGconn *c, const struct db_table *t, char *err, size_t errlen)
{
  return notify(c, t, "canary", err, errlen);
}

/* "SELECT ... FROM <table>_<fn>(args)": sql_tail follows the function's name. */
static PGresult *call_fn(PGconn *c, const struct db_table *t, const char *fn,
                         const char *head, const char *tail, int n, const char *const *params,
                         char *err, size_t errlen)
{
  char *name = db_table_object(t, c, fn, 1);
  size_t len = name ? strlen(head) + strlen(name) + strlen(tail) + 1 : 0;
  char *sql = name ? malloc(len) : NULL;
  if (!sql) {
    free(name);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  snprintf(sql, len, "%s%s%s", head, name, tail);
  PGresult *r = db_exec(c, sql, n, params, err, errlen);
  free(sql);
  free(name);
  return r;
}

int queue_announce(struct queue *q, PGconn *c, const struct db_table *t, char *err,
                   size_t errlen)
{
  const char *params[] = { q->owner };
  PGresult *r = call_fn(c, t, "worker_here", "SELECT ", "($1)", 1, params, err, errlen);
  if (!r)
    return -1;
  PQclear(r);
  return 0;
}

int queue_cancel(PGconn *c, const struct db_table *t, const char *ids, const char *batch,
                 const char *tenant, long long *pending, long long *leased, char *err,
                 size_t errlen)
{
  const char *params[] = { ids, batch, tenant };
  PGresult *r = call_fn(c, t, "cancel", "SELECT pending, leased FROM ",
                        "($1::bigint[], $2, $3)", 3, params, err, errlen);
  if (!r)
    return -1;
  *pending = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
  *leased = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
  PQclear(r);
  return 0;
}

int queue_release_worker(PGconn *c, const struct db_table *t, const char *worker, int force,
                         char *pids, size_t pidslen, long long *released, char *err,
                         size_t errlen)
{
  const char *params[] = { worker };
  *released = 0;
  PGresult *r = call_fn(c, t, "worker_sessions",
                        "SELECT coalesce(string_agg(s::text, ', '), '') FROM ", "($1) s",
                        1, params, err, errlen);
  if (!r)
    return -1;
  snprintf(pids, pidslen, "%s", PQgetvalue(r, 0, 0));
  PQclear(r);
  if (*pids && !force)
    return 0;
  /* The function checks again, under the lock a reconnecting worker would wait for: a session
     that appeared since is refused too (55P03). */
  const char *args[] = { worker, force ? "true" : "false" };
  r = call_fn(c, t, "release_worker", "SELECT count(*) FROM ", "($1, $2::boolean)", 2, args,
              err, errlen);
  if (!r && strcmp(db_last_sqlstate(), "55P03") == 0) {
    snprintf(pids, pidslen, "?");
    return 0;
  }
  if (!r)
    return -1;
  *released = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
  PQclear(r);
  return 0;
}

/* queue_insert_sql with one more column, col, taken from the source's column of that name
   (a child's parent_id: sql/019_waits.sql). */
static char *insert_sql(const char *table, const char *source, const char *col)
{
  /* The defaults of a task, applied to what the source leaves NULL: lifecycle.h's (the
     table's column defaults say the same for inserts that bypass leash). */
  static const char fmt[] =
    "INSERT INTO %s (id, tenant_id, shard_key, payload, run_after, max_attempts, batch, "
    "                max_crashes, priority, budget, backoff_base, backoff_cap, max_snoozes%s%s) "
    "SELECT s.id, coalesce(s.tenant_id, '" LIFECYCLE_DEFAULT_TENANT "'), "
    "       coalesce(s.shard_key, 'task:' || s.id), s.payload, coalesce(s.run_after, now()), "
    "       coalesce(s.max_attempts, %d), s.batch, coalesce(s.max_crashes, %d), "
    "       coalesce(s.priority, 0), s.budget, s.backoff_base, s.backoff_cap, "
    "       coalesce(s.max_snoozes, %d)%s%s "
    "  FROM (%s) s "
    "RETURNING id";
  const char *sep = col ? ", " : "", *scol = col ? col : "";
  size_t n = sizeof fmt + strlen(table) + strlen(source) + 2 * strlen(scol) + 64;
  char *sql = malloc(n);
  if (sql)
    snprintf(sql, n, fmt, table, sep, scol, LIFECYCLE_DEFAULT_MAX_ATTEMPTS,
             LIFECYCLE_DEFAULT_MAX_CRASHES, LIFECYCLE_DEFAULT_MAX_SNOOZES, col ? ", s." : "",
             scol, source);
  return sql;
}

char *queue_insert_sql(const char *table, const char *source)
{
  return insert_sql(table, source, NULL);
}

char *queue_dedup_lock_sql(const char *lockfn, const char *keys)
{
  static const char fmt[] =
    "SELECT %s(k.tenant_id, k.dedup_key) FROM ("
    "  SELECT DISTINCT coalesce(s.tenant_id, '" LIFECYCLE_DEFAULT_TENANT "') AS tenant_id, "
    "         s.dedup_key FROM (%s) s WHERE s.dedup_key IS NOT NULL "
    "   ORDER BY 1, 2 OFFSET 0) k";
  size_t n = sizeof fmt + strlen(lockfn) + strlen(keys);
  char *sql = malloc(n);
  if (sql)
    snprintf(sql, n, fmt, lockfn, keys);
  return sql;
}

char *queue_insert_dedup_sql(const char *table, const char *source)
{
  /* The same defaults as queue_insert_sql; rows kept in id order (the ids follow the
     input's order). The look is valid only after the keys' locks (queue_dedup_lock_sql). */
  static const char fmt[] =
    "INSERT INTO %s (id, tenant_id, shard_key, payload, run_after, max_attempts, batch, "
    "                max_crashes, priority, dedup_key, budget, backoff_base, backoff_cap, "
    "                max_snoozes) "
    "SELECT s.id, s.tenant, coalesce(s.shard_key, 'task:' || s.id), s.payload, "
    "       coalesce(s.run_after, now()), coalesce(s.max_attempts, %d), s.batch, "
    "       coalesce(s.max_crashes, %d), coalesce(s.priority, 0), s.dedup_key, s.budget, "
    "       s.backoff_base, s.backoff_cap, coalesce(s.max_snoozes, %d) "
    "  FROM (SELECT w.*, coalesce(w.tenant_id, '" LIFECYCLE_DEFAULT_TENANT "') AS tenant, "
    "               row_number() OVER (PARTITION BY coalesce(w.tenant_id, '"
    LIFECYCLE_DEFAULT_TENANT "'), w.dedup_key ORDER BY w.id) AS dedup_n "
    "          FROM (%s) w) s "
    " WHERE s.dedup_key IS NULL "
    "    OR (s.dedup_n = 1 "
    "        AND NOT EXISTS (SELECT 1 FROM %s o WHERE o.tenant_id = s.tenant "
    "                           AND o.dedup_key = s.dedup_key "
    "                           AND o.status IN (" SQL_PENDING ", " SQL_LEASED "))) "
    " ORDER BY s.id "
    "RETURNING id";
  size_t n = sizeof fmt + 2 * strlen(table) + strlen(source) + 48;
  char *sql = malloc(n);
  if (sql)
    snprintf(sql, n, fmt, table, LIFECYCLE_DEFAULT_MAX_ATTEMPTS, LIFECYCLE_DEFAULT_MAX_CRASHES,
             LIFECYCLE_DEFAULT_MAX_SNOOZES, source, table);
  return sql;
}

char *queue_dedup_find_sql(const char *table)
{
  return format_sql("SELECT id FROM %s WHERE tenant_id = coalesce($1, '"
                    LIFECYCLE_DEFAULT_TENANT "') AND dedup_key = $2 "
                    "  AND status IN (" SQL_PENDING ", " SQL_LEASED ")", table);
}

/* What a requeued row becomes: a fresh start for its attempts, its crashes and its snoozes
   (a quarantined task runs again, with max_crashes more crashes allowed). */
#define REQUEUE_SET \
  "SET status = " SQL_PENDING ", attempts = 0, crashes = 0, snoozes = 0, snoozed_s = 0, " \
  "    last_cause = NULL, " \
  "    run_after = now(), locked_until = NULL, updated_at = now() "

int queue_requeue_dead(PGconn *c, const struct db_table *t, const char *tenant,
                       const char *batch, int chunk, long long *count, char *err,
                       size_t errlen)
{
  /* One chunk: $1 the last id done, $2 tenant, $3 batch, $4 the chunk size. Walking ids
     upwards ends the loop even when requeued tasks die again at once. */
  static const char fmt[] =
    "WITH c AS ("
    "  SELECT id FROM %s"
    "   WHERE id > $1::bigint AND status = " SQL_DEAD
    "     AND ($2::text IS NULL OR tenant_id = $2::text)"
    "     AND ($3::text IS NULL OR batch = $3::text)"
    "   ORDER BY id LIMIT $4::int FOR UPDATE SKIP LOCKED"
    "), u AS ("
    "  UPDATE %s q " REQUEUE_SET " FROM c WHERE q.id = c.id AND q.status = " SQL_DEAD
    "  RETURNING q.id"
    ") SELECT (SELECT count(*) FROM u), (SELECT max(id) FROM c)";
  char *sql = format_sql2(fmt, t->qualified), last[24] = "0", size[16];
  if (!sql) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  snprintf(size, sizeof size, "%d", chunk);
  int rc = -1;
  for (;;) {
    const char *params[] = { last, tenant, batch, size };
    PGresult *r = db_exec(c, sql, 4, params, err, errlen);
    if (!r)
      break;
    *count += strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    int more = !PQgetisnull(r, 0, 1);
    if (more)
      snprintf(last, sizeof last, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    if (!more) {
      rc = 0;
      break;
    }
  }
  free(sql);
  return rc;
}

PGresult *queue_requeue_ids(PGconn *c, const struct db_table *t, const char *ids,
                            const char *tenant, const char *batch, char *err, size_t errlen)
{
  static const char fmt[] =
    "WITH u AS ("
    "  UPDATE %s q " REQUEUE_SET
    "   WHERE q.id = ANY ($1::bigint[]) AND q.status = " SQL_DEAD
    "     AND ($2::text IS NULL OR q.tenant_id = $2::text)"
    "     AND ($3::text IS NULL OR q.batch = $3::text)"
    "  RETURNING q.id"
    ") SELECT g.id,"
    "         CASE WHEN u.id IS NOT NULL THEN NULL"
    "              WHEN q.id IS NULL THEN 'no such task'"
    "              WHEN q.status <> " SQL_DEAD " THEN q.status"
    "              ELSE 'outside --tenant/--batch' END"
    "    FROM (SELECT DISTINCT unnest($1::bigint[]) AS id) g"
    "    LEFT JOIN u ON u.id = g.id"
    "    LEFT JOIN %s q ON q.id = g.id"
    "   ORDER BY g.id";
  char *sql = format_sql2(fmt, t->qualified);
  if (!sql) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  const char *params[] = { ids, tenant, batch };
  PGresult *r = db_exec(c, sql, 3, params, err, errlen);
  free(sql);
  return r;
}

int queue_script_sql_init(struct queue_script_sql *s, PGconn *c, const struct db_table *t)
{
  memset(s, 0, sizeof *s);
  char *steps = db_table_object(t, c, "steps", 1);
  if (!steps)
    return -1;
  s->step_get = format_sql("SELECT result::text FROM %s WHERE task_id = $1 AND name = $2", steps);
  /* Fenced: only the holder of this lease (its token) can store a step. The row is locked (FOR
     SHARE) so the check cannot be read from a snapshot older than a takeover in flight: the
     write waits for that commit, then sees the new owner. A lease past its end (not yet
     reaped) stores nothing either. The same holds for enqueue below. */
  size_t n = strlen(steps) + strlen(t->qualified) + 512;
  s->step_put = malloc(n);
  if (s->step_put)
    snprintf(s->step_put, n,
             "INSERT INTO %s (task_id, name, result, attempt) "
             "SELECT $1, $2, $3::jsonb, q.attempts FROM %s q "
             " WHERE q.id = $1 AND q.lease_token = $4::bigint AND q.lease_owner = $5 "
             "   AND q.status = " SQL_LEASED " AND q.locked_until > now() "
             "   FOR SHARE OF q "
             "ON CONFLICT (task_id, name) DO NOTHING RETURNING 1", steps, t->qualified);
  /* A child task: the parent's tenant and batch unless given; a shard of its own unless
     given. Written only while the parent's lease holds ($9 id, $10 owner, $11 token). */
  static const char child_fmt[] =
    "SELECT nextval(pg_get_serial_sequence($8, 'id')) AS id, "
    "       coalesce($1, p.tenant_id) AS tenant_id, $2::text AS shard_key, "
    "       $3::jsonb AS payload, now() + make_interval(secs => $4::float8) AS run_after, "
    "       $5::int AS max_attempts, CASE WHEN $6::boolean THEN $7 ELSE p.batch END AS batch, "
    "       NULL::int AS max_crashes, NULL::int AS priority, NULL::text AS budget, "
    "       NULL::float8 AS backoff_base, NULL::float8 AS backoff_cap, NULL::int AS max_snoozes, "
    "       p.id AS parent_id "
    "  FROM %s p "
    " WHERE p.id = $9 AND p.lease_owner = $10 AND p.lease_token = $11::bigint "
    "   AND p.status = " SQL_LEASED " AND p.locked_until > now() "
    "   FOR SHARE OF p";
  char *child = format_sql(child_fmt, t->qualified);
  s->enqueue = child ? insert_sql(t->qualified, child, "parent_id") : NULL;
  free(child);
  free(steps);
  /* The tasks a wait named with their outcome so far (a cancelled or pruned one: absent),
     and the latest signal of the event it waited for. */
  char *signals = db_table_object(t, c, "signals", 1);
  static const char wait_fmt[] =
    "SELECT json_build_object('reason', q.wait_reason, "
    "         'expired', coalesce(q.last_cause = 'wait_deadline', false), "
    "         'tasks', coalesce((SELECT json_agg(json_build_object('id', c.id, "
    "                              'status', c.status, 'result', c.result) ORDER BY c.id) "
    "                             FROM %s c WHERE c.id = ANY (q.wait_ids)), '[]'::json), "
    "         'event', (SELECT json_build_object('name', g.name, 'payload', g.payload) "
    "                     FROM %s g WHERE g.name = q.wait_event "
    "                      AND g.scope IN ('', q.tenant_id) "
    "                    ORDER BY g.signalled_at DESC LIMIT 1))::text "
    "  FROM %s q WHERE q.id = $1 AND q.wait_reason IS NOT NULL";
  if (signals) {
    size_t wn = sizeof wait_fmt + 2 * strlen(t->qualified) + strlen(signals);
    if ((s->wait_get = malloc(wn)))
      snprintf(s->wait_get, wn, wait_fmt, t->qualified, signals, t->qualified);
  }
  free(signals);
  char *grant = db_table_object(t, c, "budget_grant", 1);
  char *settle = db_table_object(t, c, "budget_settle", 1);
  if (grant)
    s->budget_grant = format_sql("SELECT granted, call_id, wait_s, why "
                                 "FROM %s($1, $2::bigint, $3::float8, $4::bigint, $5::bigint)",
                                 grant);
  if (settle)
    s->budget_settle = format_sql("SELECT %s($1, $2::bigint, $3::bigint, $4::float8, $5, $6, "
                                  "$7::bigint, $8::bigint)", settle);
  free(grant);
  free(settle);
  char *item = db_table_object(t, c, "llm_item", 1);
  if (item)
    s->llm_item = format_sql("SELECT item_id, state, answer, error, tries FROM %s($1::bigint, "
                             "$2::bigint, $3, $4, $5, $6::jsonb, $7::boolean, $8::int)", item);
  free(item);
  if (!s->llm_item || !s->step_get || !s->step_put || !s->enqueue || !s->wait_get || !s->budget_grant ||
      !s->budget_settle) {
    queue_script_sql_free(s);
    return -1;
  }
  return 0;
}

void queue_script_sql_free(struct queue_script_sql *s)
{
  free(s->step_get);
  free(s->wait_get);
  free(s->step_put);
  free(s->enqueue);
  free(s->budget_grant);
  free(s->budget_settle);
  free(s->llm_item);
  memset(s, 0, sizeof *s);
}

/* Claimed rows, columns from `first`: id, attempts, max_attempts, tenant_id, shard_key,
   batch, payload (the token is read by the caller). */
static struct task *task_from_columns(PGresult *r, int i, int first, double now,
                                      double visibility)
{
  struct task *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  t->id = strtoll(PQgetvalue(r, i, first), NULL, 10);
  t->attempt = atoi(PQgetvalue(r, i, first + 1));
  t->max_attempts = atoi(PQgetvalue(r, i, first + 2));
  t->tenant_id = strdup(PQgetvalue(r, i, first + 3));
  t->shard_key = strdup(PQgetvalue(r, i, first + 4));
  t->batch = PQgetisnull(r, i, first + 5) ? NULL : strdup(PQgetvalue(r, i, first + 5));
  t->payload = strdup(PQgetvalue(r, i, first + 6));
  t->claimed_at = now;
  atomic_init(&t->lease_deadline, now + visibility);
  t->out.delay = -1;
  atomic_init(&t->lost, 0);
  if (!t->tenant_id || !t->shard_key || !t->payload || (!PQgetisnull(r, i, first + 5) && !t->batch)) {
    task_free(t);
    return NULL;
  }
  return t;
}

static struct task *task_from_cycle_row(PGresult *r, int i, double now, double visibility)
{
  struct task *t = task_from_columns(r, i, 1, now, visibility);
  if (t) {
    t->waited = atof(PQgetvalue(r, i, 8));
    t->token = strtoll(PQgetvalue(r, i, 11), NULL, 10);
  }
  return t;
}

/* fmt with the same string in both of its two %s. */
static char *format_sql2(const char *fmt, const char *a)
{
  size_t n = strlen(fmt) + 2 * strlen(a) + 1;
  char *s = malloc(n);
  if (s)
    snprintf(s, n, fmt, a, a);
  return s;
}

/* fmt with two different %s, a then b. */
static char *format_sql_ab(const char *fmt, const char *a, const char *b)
{
  size_t n = strlen(fmt) + strlen(a) + strlen(b) + 1;
  char *s = malloc(n);
  if (s)
    snprintf(s, n, fmt, a, b);
  return s;
}

static char *format_sql(const char *fmt, const char *a)
{
  size_t n = strlen(fmt) + strlen(a) + 1;
  char *s = malloc(n);
  if (s)
    snprintf(s, n, fmt, a);
  return s;
}

/* {id,...} (tokens = 0) or {token,...} (1) of keys, as an array literal. */
static char *key_array(const struct lease_key *keys, int n, int tokens)
{
  struct buf b = { 0 };
  buf_add(&b, "{", 1);
  for (int i = 0; i < n; i++)
    buf_printf(&b, "%s%lld", i ? "," : "",
               tokens ? (long long)keys[i].token : (long long)keys[i].id);
  buf_add(&b, "}", 1);
  return buf_take(&b);
}
