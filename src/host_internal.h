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
  char version[17];             /* the version loaded at start */
};

/* Marks t's lease lost (once), logs why, and wakes sleeping scripts. Call with mu held. */
void host_lose_lease(struct host *h, struct task *t, const char *why);

/* Wakes the dispatcher (a notification arrived). */
void host_wake(struct host *h);

#endif
