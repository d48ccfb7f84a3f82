/*
 * host_internal: the state the dispatcher (host.c) shares with the lease thread (lease.c).
 * Everything below `mu` is guarded by it.
 */
#ifndef LEASH_HOST_INTERNAL_H
#define LEASH_HOST_INTERNAL_H

#include "host.h"
#include "metrics.h"
#include "script.h"
#include "task.h"

#include <pthread.h>
#include <stdatomic.h>

struct host {
  const struct host_config *cfg;
  struct db_table table;
  struct script_host sh;
  atomic_int stopping;          /* tasks must stop now (drain deadline, second signal) */
  pthread_mutex_t wake_mu;      /* leash.sleep waits on wake_cv */
  pthread_cond_t wake_cv;

  pthread_mutex_t mu;
  pthread_cond_t cv;            /* the dispatcher waits here */
  struct task **held;           /* every lease this process holds, running or unsettled */
  int nheld, capheld;
  int wake;                     /* a NOTIFY or reap made work runnable */
  int draining;                 /* no more claims */
  struct metrics_counters stats;   /* lock-free; read by metrics.c and the exit summary */
  unsigned generation;          /* bumped with each new script text (reload.c) */
  char *script_text;            /* the script's text of that generation: slots load this, */
  size_t script_len;            /* not the file, which may have changed since the probe */
  char version[SCRIPT_VERSION_LEN + 1];  /* the version the slots load (reload.c updates it) */
  struct reload *reload;        /* hot swap; the signal thread reads it (SIGHUP) under mu */

  /* The watchdog (watchdog.c) reads these; see struct slot_watch. */
  struct slot_watch *watch;     /* one per slot, allocated before the slots start */
  int nwatch;
  /* Set once by the watchdog: a slot is wedged. The dispatcher settles, gives back the other
     leases and exits (host.c, wedge_exit); the watchdog's backstop exits if it cannot. */
  int wedged;
  struct task *wedged_task;     /* the wedged slot's task (still owned by that slot), or NULL
                                   when it was wedged closing a Lua state */
  int wedged_settle;            /* 1: settle it as CAUSE_WEDGED; 0: its lease was already lost */
  char wedged_why[256];
};

/* What the watchdog sees of one slot. task and started are written by the slot under mu
   (the slot never holds mu while Lua runs, so the watchdog can always take it); the rest is
   the watchdog's own. */
struct slot_watch {
  struct task *task;            /* in handle() now, or NULL */
  double started;               /* monotonic, when handle() was called */
  double lost_seen;             /* when the watchdog first saw that task's lease lost, or 0 */
  double stop_seen;             /* when it first saw the stop (drain deadline), or 0 */
  double closing;               /* since when the slot closes a Lua state (its finalizers
                                   run, in C), or 0; under mu */
};

/* Loading a version (setup included) may take this long plus --watchdog-grace before it
   counts as wedged: script.c stops a setup that loops in Lua after 5 s; the grace is for one
   that is stuck inside a C call, which that hook cannot stop. */
#define HOST_LOAD_BASE_S 5.0
static inline double host_load_limit(const struct host *h)
{
  return HOST_LOAD_BASE_S + h->cfg->watchdog_grace;
}

/* Marks t's lease lost (once), logs why, and wakes sleeping scripts. Call with mu held. */
void host_lose_lease(struct host *h, struct task *t, const char *why);

/* Wakes the dispatcher (a notification arrived). */
void host_wake(struct host *h);

#endif
