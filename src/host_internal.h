/*
 * host_internal: the state host.c (set-up, tear-down, the other threads' callbacks) shares
 * with the dispatcher (dispatch.c). Private to those two files: every other unit gets what it
 * needs through its own narrow config (lease.h, metrics.h, reload.h, signals.h, slot.h,
 * watchdog.h). Everything below `mu` is guarded by it.
 */
#ifndef LEASH_HOST_INTERNAL_H
#define LEASH_HOST_INTERNAL_H

#include "host.h"
#include "lease.h"
#include "metrics.h"
#include "reload.h"
#include "script.h"
#include "watchdog.h"

#include <pthread.h>
#include <stdatomic.h>

struct host {
  const struct host_config *cfg;
  struct db_table table;
  struct script_host sh;
  atomic_int stopping;          /* tasks must stop now (drain deadline, wedge) */
  pthread_mutex_t wake_mu;      /* leash.sleep waits on wake_cv */
  pthread_cond_t wake_cv;
  struct metrics_counters stats;     /* lock-free; read by metrics.c and the exit summary */
  struct lease_registry *leases;     /* every lease this process holds (lease.c) */

  pthread_mutex_t mu;
  pthread_cond_t cv;            /* the dispatcher waits here */
  int wake;                     /* a NOTIFY or reap made work runnable */
  int draining;                 /* no more claims (signals, wedge) */
  struct script_source src;     /* the version the slots load (reload.c replaces it) */
  struct reload *reload;        /* hot swap; the signal thread's SIGHUP asks it under mu */
  struct canary *canary;        /* under mu: the lease thread pokes it (a NOTIFY "canary") */

  struct slot_watch *watch;     /* one per slot (slot.c writes, watchdog.c reads) */
  int nwatch;
  /* Set once by the watchdog: a slot is wedged. The dispatcher settles, gives back the other
     leases and exits (dispatch.c, wedge_exit); the watchdog's backstop exits if it cannot. */
  int wedged;
  struct task *wedged_task;     /* the wedged slot's task (still owned by that slot), or NULL
                                   when it was wedged closing a Lua state */
  int wedged_settle;            /* 1: settle it as CAUSE_WEDGED; 0: its lease was already lost */
  char wedged_why[256];
};

/* Loading a version (setup included) may take this long plus --watchdog-grace before it
   counts as wedged: script.c stops a setup that loops in Lua after 5 s; the grace is for one
   that is stuck inside a C call, which that hook cannot stop. */
#define HOST_LOAD_BASE_S 5.0
static inline double host_load_limit(const struct host *h)
{
  return HOST_LOAD_BASE_S + h->cfg->watchdog_grace;
}

#endif
