/*
 * watchdog: the backstop for a slot that does not come back. The count hook (script.c) stops
 * Lua code at --task-timeout, on a lost lease and at the drain deadline, but not code inside
 * one C call (a sort of huge strings, a backtracking find, a finalizer loop): there the hook
 * never fires. A thread of its own looks at every slot a few times a second; a slot still in
 * handle() past
 *   - its start + --task-timeout + --watchdog-grace (only with a task timeout: without one a
 *     long task is legitimate and keeps its lease), or
 *   - the moment its lease was lost + --watchdog-grace, or
 *   - the drain's stop + min(--watchdog-grace, 2 s)
 * is wedged. The watchdog marks that task lost (the lease thread stops renewing it), logs the
 * cause once and hands over to its owner (on_wedged: the dispatcher's wedge_exit), which on its own
 * connection settles the wedged task as a retry with cause "wedged" (unless its lease was
 * already lost or released), gives every other lease back without charging the attempt, and
 * _exits with WATCHDOG_EXIT_WEDGED (3) so the supervisor restarts the process: the wedged thread
 * is never joined. If the dispatcher cannot do that within a few seconds (the database away),
 * the watchdog _exits by itself and the leases expire as after a crash.
 *
 * It takes only cfg.mu, which no slot holds while Lua runs, and never calls into Lua.
 */
#ifndef LEASH_WATCHDOG_H
#define LEASH_WATCHDOG_H

#include "lease.h"
#include "task.h"

#include <pthread.h>
#include <stdatomic.h>

struct watchdog;

/* Exit code of a process the watchdog ended (host.h calls it HOST_EXIT_WEDGED): a slot stayed
   wedged past its deadline plus --watchdog-grace (task timeout, lost lease, or the stop
   after the drain deadline). */
#define WATCHDOG_EXIT_WEDGED 3

/* What the watchdog sees of one slot. task, started and closing are written by the slot
   under cfg.mu (the slot never holds it while Lua runs, so the watchdog can always take it);
   the rest is the watchdog's own. */
struct slot_watch {
  struct task *task;            /* in handle() now, or NULL */
  double started;               /* monotonic, when handle() was called */
  double lost_seen;             /* when the watchdog first saw that task's lease lost, or 0 */
  double stop_seen;             /* when it first saw the stop (drain deadline), or 0 */
  double closing;               /* since when the slot closes a Lua state (its finalizers
                                   run, in C), or 0 */
};

/* A slot is wedged: called once, with cfg.mu held, after the cause was logged. t is the
   wedged slot's task (still owned by that slot), or NULL when it was wedged closing a Lua
   state; settle is 1 when it is to be settled as CAUSE_WEDGED, 0 when its lease was already
   lost. The owner must end the process (watchdog_stop is not called after this). */
typedef void watchdog_wedged_fn(void *arg, struct task *t, int settle, const char *why);

struct watchdog_config {
  pthread_mutex_t *mu;          /* guards watch[] and *draining */
  struct slot_watch *watch;     /* one per slot, set up before the slots start */
  int nwatch;
  const int *draining;          /* nonzero once draining (read under mu) */
  atomic_int *stopping;         /* tasks must stop now (drain deadline) */
  struct lease_registry *registry;   /* nothing held: no need to wait for the owner */
  double task_timeout, grace;   /* --task-timeout (0 = none), --watchdog-grace */
  const char *worker_id;
  watchdog_wedged_fn *on_wedged;
  void *arg;
};

/* How long after the drain's stop a slot may take to come back: SIGTERM ends the process
   within --drain-timeout plus this (and one round trip). */
#define WATCHDOG_STOP_GRACE_MAX_S 2.0
/* How long the dispatcher gets to settle and release before the watchdog exits by itself. */
#define WATCHDOG_BACKSTOP_S 5.0

/* Starts the thread (NULL, logged, when it cannot). cfg is copied. */
struct watchdog *watchdog_start(const struct watchdog_config *cfg);
void watchdog_stop(struct watchdog *w);

#endif
