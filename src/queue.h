/*
 * queue: every SQL statement that creates a task or changes its status or lease, on a
 * connection the caller owns: the insert (enqueue and leash.enqueue), the cycle (settle,
 * batched and fenced, plus claim), heartbeat (one statement for all leases), reap, release
 * on drain, requeue, the wake-up channel, and the scope check of --until-empty. The cycle,
 * reap and release live in sql/ (created by migrate); this unit holds their quoted names and
 * binds parameters. docs/ARCHITECTURE.md draws where a task goes.
 * A failure returns -1 with a one-line message; the caller decides on reconnecting.
 */
#ifndef LEASH_QUEUE_H
#define LEASH_QUEUE_H

#include "db.h"
#include "task.h"

#include <stdint.h>

struct queue_scope {
  const char *tenants;   /* text[] literal of --tenant values, or NULL for all */
  const char *batch;     /* --batch, or NULL */
};

struct queue;

/* Builds the statements for table t (names quoted with c). NULL when out of memory. */
struct queue *queue_new(PGconn *c, const struct db_table *t, const char *owner,
                        double visibility_s);
void queue_free(struct queue *q);

/* The run's backoff for retries without a delay (lifecycle.h's by default): base, cap (s)
   and jitter, passed to every cycle; bounds are the caller's (cmd_run.c). */
void queue_set_backoff(struct queue *q, double base, double cap, double jitter);

/* What the fenced write of one outcome did. SETTLED_LATE: it matched nothing (the lease was
   no longer ours); else the status the row got (a retry with no attempt left is dead). */
enum {
  SETTLED_LATE = 0, SETTLED_DONE, SETTLED_PENDING,
  SETTLED_DEAD,          /* fatal, or a retry with no attempt left */
  SETTLED_QUARANTINED,   /* a crash cause reached max_crashes */
  SETTLED_BAD_ROW,       /* the row could not be settled and was set aside (010's fallback) */
  SETTLED_AGAIN,         /* not written: its shard's head row was locked (a producer's open
                            transaction); the lease holds, write it again shortly (011) */
};

/* One round trip: writes the outcomes of the first n tasks of list (applied[i], in list
   order, one of SETTLED_*) and leases up to `want` rows of the scope (new tasks in *out;
   want may be 0), in one transaction. The settle may lease up to `chain` of its shards' next
   rows to this worker (sql/029: rows a claim of this worker would take first); they come
   back in *out with the claimed ones and count against want. Claims divide between tenants
   by weight: q keeps this process's place in the tenants' ring from one claim to the next
   (sql/011). Returns the number leased (claimed or chained), or -1 (nothing was written or
   claimed). When the claim came back short, *next_due is the number of seconds until the
   next pending row of the scope becomes runnable (-1: none, or the claim was full). */
int queue_cycle(struct queue *q, PGconn *c, struct task *list, int n, char *applied,
                const struct queue_scope *s, int want, int chain, struct task **out,
                double *next_due, char *err, size_t errlen);

/* How many of the last queue_cycle's leases its settle made (the rest were claimed). */
int queue_chained(const struct queue *q);

/* A lease by its fence: the task's id and the claim's token. `pos` is free for the caller
   (an index into its own arrays). */
struct lease_key {
  int64_t id;
  int64_t token;
  int pos;
};

/* Sorts keys by (id, token), so that lookups cost log n (a process may hold thousands). */
void queue_keys_sort(struct lease_key *keys, int n);

/* The index in sorted keys of (id, token), or of the first key with that id when token is
   negative; -1 when absent. */
int queue_keys_find(const struct lease_key *keys, int n, int64_t id, int64_t token);

enum { HEARTBEAT_LOST = 0, HEARTBEAT_RENEWED = 1, HEARTBEAT_UNKNOWN = 2 };

/* Renews the leases of keys (n of them, sorted here in place). renewed[i], for keys[i]:
   HEARTBEAT_RENEWED; _LOST when the row is no longer ours; _UNKNOWN when it was locked (being
   settled) or is gone, which the next beat or the local deadline decides. */
int queue_heartbeat(struct queue *q, PGconn *c, struct lease_key *keys, int n, char *renewed,
                    char *err, size_t errlen);

/* 1 when sqlstate is a row's fault (its data, a constraint, an index entry it cannot make, a
   trigger's RAISE: classes 22, 23, 54, P0), which the row-by-row fallbacks of the cycle and
   the reaper (sql/010) survive by setting that row aside; 0 for everything else (connection,
   cancel, serialization, resources, permissions), which must propagate. */
int queue_row_error(const char *sqlstate);

/* Gives a head to shards that have pending rows but neither a head nor a lease (sql/011
   <table>_repair_heads: a restore with triggers off, a hand-made change racing a producer).
   A scan of the pending rows. Returns the shards repaired, or -1. */
int queue_repair_heads(struct queue *q, PGconn *c, char *err, size_t errlen);

/* Expired leases back to pending (or dead): each counts as a crash of the task, and the crash
   that reaches its max_crashes quarantines it (dead). Returns how many, or -1; dead[0] is how
   many of them were quarantined, dead[1] how many went dead with their attempts exhausted. */
int queue_reap(struct queue *q, PGconn *c, long long dead[2], char *err, size_t errlen);

/* Gives leases back to pending without charging the attempt; returns how many, or -1. */
int queue_release(struct queue *q, PGconn *c, const struct lease_key *keys, int n, char *err,
                  size_t errlen);

/* 1 when the scope still has pending or leased tasks (future ones included), 0 when it has
   settled, -1 on error. */
int queue_scope_open(struct queue *q, PGconn *c, const struct queue_scope *s, char *err,
                     size_t errlen);

/* Statements the scripts' host API runs on pooled connections, fenced by the task's
   (id, owner, token). Built once per process; read-only afterwards. */
struct queue_script_sql {
  char *step_get;    /* $1 task id, $2 name → result::text (one row when stored) */
  char *step_put;    /* $1 id, $2 name, $3 result, $4 token, $5 owner → a row if written */
  char *enqueue;     /* a child task: $1 tenant, $2 shard, $3 payload, $4 delay (s), $5 max
                        attempts, $6 batch given, $7 batch, $8 the table; the parent's
                        lease: $9 id, $10 owner, $11 token → its id if written */
  char *wait_get;    /* $1 task id → what its last wait waited for, JSON text (one row when
                        its last execution ended in leash.wait: sql/019_waits.sql) */
  char *budget_grant;  /* $1 budget, $2 tokens, $3 hold (s), $4 task id, $5 its token →
                          granted, call_id, wait_s, why (sql/014_budgets.sql) */
  char *budget_settle; /* $1 budget, $2 call id, $3 tokens used, $4 pause (s), $5 reason,
                          $6 model, $7 input tokens, $8 output tokens */
  char *llm_item;      /* $1 id, $2 token, $3 owner, $4 step, $5 provider, $6 request, $7
                          fallback, $8 tries → item_id, state, answer, error, tries (one row
                          while the lease holds; sql/022_llm_batch.sql) */
};

/* Fills s for table t; 0, or -1 when out of memory (s is then freed). */
int queue_script_sql_init(struct queue_script_sql *s, PGconn *c, const struct db_table *t);
void queue_script_sql_free(struct queue_script_sql *s);

/* The queue-wide numbers metrics export: tasks runnable, scheduled (pending later) and
   leased, the oldest runnable task's wait in seconds (-1: none runnable), budgets paused. */
struct queue_depth {
  long long runnable, scheduled, leased, budgets_paused;
  double oldest_runnable_s;
};
int queue_depth(struct queue *q, PGconn *c, struct queue_depth *out, char *err, size_t errlen);
/* Tries to become (or stay) the table's metrics leader on connection c (a session advisory
   lock on a key of the table's own): 1 leader, 0 another session is, -1 with err. Call it
   once per session until it answers 1: each success stacks one more hold of the lock. */
int queue_metrics_leader(struct queue *q, PGconn *c, char *err, size_t errlen);

/* LISTEN on the table's wake-up channel ("leash_<table oid>", the trigger's name for it),
   as a statement. malloc'd, or NULL with err. */
char *queue_listen_sql(PGconn *c, const struct db_table *t, char *err, size_t errlen);

/* Marks this process's worker id as alive on connection c for as long as that session
   lasts (<table>_worker_here, sql/015_sql_api.sql; `leash release` refuses a live worker).
   The lease thread calls it after each connect. 0, or -1 with err. */
int queue_announce(struct queue *q, PGconn *c, const struct db_table *t, char *err,
                   size_t errlen);

/* `leash cancel`: the pending and leased tasks of ids (a bigint[] literal), batch or tenant
   (exactly one non-NULL) end dead, cause cancelled (<table>_cancel). 0 with the counts, or
   -1 with err (then db_last_sqlstate says what failed). */
int queue_cancel(PGconn *c, const struct db_table *t, const char *ids, const char *batch,
                 const char *tenant, long long *pending, long long *leased, char *err,
                 size_t errlen);

/* `leash release`: the live sessions of worker (their backend pids, comma-separated, in
   pids; "" when none), then, when there are none or force is set, its leases given back
   (<table>_release_worker): *released of them. 0, or -1 with err. */
int queue_release_worker(PGconn *c, const struct db_table *t, const char *worker, int force,
                         char *pids, size_t pidslen, long long *released, char *err,
                         size_t errlen);

/* Wakes the table's idle workers (rows became runnable outside a trigger). 0 or -1. */
int queue_notify(PGconn *c, const struct db_table *t, char *err, size_t errlen);
/* Tells the table's workers the canary changed (their lease thread pokes the canary's
   poll: canary.h). 0 or -1. */
int queue_notify_canary(PGconn *c, const struct db_table *t, char *err, size_t errlen);

/* The one task INSERT: rows of `source`, a SELECT with the columns id (drawn from the
   table's sequence, so that a default shard can name it), tenant_id, shard_key, payload
   (jsonb), run_after, max_attempts, batch, max_crashes, priority, budget, backoff_base,
   backoff_cap, max_snoozes; a NULL gets lifecycle.h's default (batch, budget, backoff_base
   and backoff_cap stay NULL: the run's backoff). Returns the ids inserted. malloc'd, NULL
   when out of memory. */
char *queue_insert_sql(const char *table, const char *source);

/* Dedup keys (sql/015_sql_api.sql): enqueuers of one (tenant, key) serialise on
   <table>_dedup_lock, then look, then insert, in one transaction.
   queue_dedup_lock_sql: the locks for the keys of `keys`, a SELECT with columns tenant_id
   (NULL: the default tenant) and dedup_key (NULL rows ignored), taken in key order so two
   enqueuers cannot deadlock; run it as its own statement before the insert (the insert's
   snapshot must be taken after the locks). lockfn: <table>_dedup_lock, qualified.
   queue_insert_dedup_sql: queue_insert_sql's INSERT for a source that also has dedup_key:
   a row whose key a pending or leased task of its tenant holds, or an earlier row of the
   source (by id) has, is skipped. Returns the ids inserted.
   queue_dedup_find_sql: the pending or leased task of ($1 tenant or NULL, $2 key).
   Each malloc'd, NULL when out of memory. */
char *queue_dedup_lock_sql(const char *lockfn, const char *keys);
char *queue_insert_dedup_sql(const char *table, const char *source);
char *queue_dedup_find_sql(const char *table);

/* requeue: dead tasks back to pending, attempts, crashes and snoozes 0, last_cause cleared, runnable
   now, lease cleared; stored steps, last_error and result kept. Only dead rows change. */

/* Every dead task of the scope (tenant, batch: NULL for all), `chunk` rows per transaction;
   *count grows by each committed chunk (so it is right even after an error). 0 or -1. */
int queue_requeue_dead(PGconn *c, const struct db_table *t, const char *tenant,
                       const char *batch, int chunk, long long *count, char *err,
                       size_t errlen);

/* The tasks of ids (a bigint[] literal) that are dead and in scope, in one statement. One
   row per distinct id, in id order: (id, NULL) when requeued, else (id, why not: its status,
   "no such task" or "outside --tenant/--batch"). NULL with err on failure. */
PGresult *queue_requeue_ids(PGconn *c, const struct db_table *t, const char *ids,
                            const char *tenant, const char *batch, char *err, size_t errlen);

#endif
