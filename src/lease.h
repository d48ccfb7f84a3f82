/*
 * lease: the lease registry and the lease thread.
 *
 * The registry is the set of every lease this process holds (running, buffered or
 * settling). The dispatcher adds a task when it claims it and removes it when the task is
 * settled or given back; the slot marks it finished when its script returns. The registry
 * has its own lock, taken last: callers may hold their own locks around these calls, and the
 * registry calls out (on_lost) only to code that takes no lock but a leaf one.
 *
 * The lease thread, on its own connection, renews every lease in the registry with one
 * statement per heartbeat interval, marks a task's lease lost when the renewal misses its
 * row (or when no renewal succeeded before the lease ran out: a process frozen past its
 * lease must assume the worst), reaps expired leases of any worker, and LISTENs for inserts.
 * It tells its owner through two callbacks: on_lost (a held task's lease is gone) and
 * on_work (rows may be runnable: a NOTIFY, a reap, a reconnect). It knows nothing else of
 * the host.
 */
#ifndef LEASH_LEASE_H
#define LEASH_LEASE_H

#include "db.h"
#include "metrics.h"
#include "queue.h"
#include "task.h"

/* Marks t's lease lost (the callee makes that happen once, with atomic_exchange on t->lost)
   and logs why. Called with the registry's lock held: take no lock but a leaf one. */
typedef void lease_lost_fn(void *arg, struct task *t, const char *why);
/* Rows may be runnable now. Called with no lease lock held. */
typedef void lease_work_fn(void *arg);

struct lease_registry;

struct lease_registry *lease_registry_new(void);
void lease_registry_free(struct lease_registry *r);
/* A lease this process now holds; aborts when it cannot be tracked (better to die and let the
   lease expire than to hold one nobody renews). */
void lease_registry_add(struct lease_registry *r, struct task *t);
void lease_registry_remove(struct lease_registry *r, struct task *t);
/* The script of t returned: its outcome awaits the settle (t->finished = 1, under the lock,
   which is what the heartbeat reads it under). */
void lease_registry_finished(struct lease_registry *r, struct task *t);
int lease_registry_count(struct lease_registry *r);
/* Marks every held lease lost (no log line: the caller says what it does with them), except
   `keep` and those lost already, and returns their keys (malloc'd; *n of them; NULL with
   *n = 0 when none or no memory). For giving leases back at the drain deadline or a wedge. */
struct lease_key *lease_registry_give_up(struct lease_registry *r, const struct task *keep,
                                         int *n);

struct lease_config {
  const char *conninfo;          /* NULL: libpq defaults */
  const struct db_table *table;
  const char *worker_id;
  double visibility, heartbeat;  /* seconds */
  int sample_depth;              /* sample queue depth into counters (metrics are served) */
  struct lease_registry *registry;
  struct metrics_counters *counters;   /* db_up, queue depth, reaped deaths */
  lease_lost_fn *on_lost;
  lease_work_fn *on_work;
  lease_work_fn *on_canary;      /* a NOTIFY with the payload "canary" (leash canary); or NULL */
  void *arg;                     /* for the callbacks */
};

struct lease;

/* Starts the thread; NULL (with the reason logged) when it cannot. cfg is copied; what it
   points to must outlive lease_stop. */
struct lease *lease_start(const struct lease_config *cfg);
/* Stops and joins the thread, closes its connection. */
void lease_stop(struct lease *l);

#endif
