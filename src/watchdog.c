/* watchdog: finds wedged slots and has the process give its leases back and exit. See
   watchdog.h. */
#include "watchdog.h"

#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TICK_S 0.1
/* A tick this late means the whole process was frozen (SIGSTOP, a VM pause) or starved: the
   slots' clocks ran on while none of them could move, so each gets a fresh grace. */
#define TICK_LATE_S 1.0

struct watchdog {
  struct watchdog_config cfg;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;            /* CLOCK_MONOTONIC; signalled by watchdog_stop */
  int quit;
};

static void *watchdog_main(void *arg);
static int check_slots(const struct watchdog_config *cfg, double now, double not_before);
static int wait_tick(struct watchdog *w, double seconds);

struct watchdog *watchdog_start(const struct watchdog_config *cfg)
{
  struct watchdog *w = calloc(1, sizeof *w);
  if (!w)
    return NULL;
  w->cfg = *cfg;
  pthread_mutex_init(&w->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&w->thread, NULL, watchdog_main, w) != 0) {
    log_error("cannot start the watchdog thread");
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    return NULL;
  }
  return w;
}

void watchdog_stop(struct watchdog *w)
{
  if (!w)
    return;
  pthread_mutex_lock(&w->mu);
  w->quit = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

static void *watchdog_main(void *arg)
{
  struct watchdog *w = arg;
  const struct watchdog_config *cfg = &w->cfg;
  double last = task_now(), not_before = 0;
  for (;;) {
    if (wait_tick(w, TICK_S))
      return NULL;
    double now = task_now();
    if (now - last > TICK_LATE_S) {
      not_before = now + cfg->grace;
      log_info("watchdog: no tick for %.1f s (process frozen or starved); slots get a fresh "
               "%g s grace", now - last, cfg->grace);
    }
    last = now;
    if (check_slots(cfg, now, not_before))
      break;
  }
  /* The owner (the dispatcher's wedge_exit) exits the process; this is only for when it cannot (it is
     waiting on a database that is away): then the leases expire, as after a crash. */
  if (wait_tick(w, WATCHDOG_BACKSTOP_S))
    return NULL;
  log_error("watchdog: the dispatcher did not give the leases back within %.0f s; exiting "
            "with status %d, held leases will expire", WATCHDOG_BACKSTOP_S, WATCHDOG_EXIT_WEDGED);
  _exit(WATCHDOG_EXIT_WEDGED);
}

/* 1 when told to quit, else 0 after `seconds`. */
static int wait_tick(struct watchdog *w, double seconds)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long long ns = (long long)ts.tv_nsec + (long long)(seconds * 1e9);
  ts.tv_sec += (time_t)(ns / 1000000000LL);
  ts.tv_nsec = (long)(ns % 1000000000LL);
  pthread_mutex_lock(&w->mu);
  while (!w->quit && pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0)
    ;
  int quit = w->quit;
  pthread_mutex_unlock(&w->mu);
  return quit;
}

/* One look at every slot. 1 once a slot was found wedged and handed to the dispatcher.
   Before not_before (after a freeze) nothing is judged, only noted. */
static int check_slots(const struct watchdog_config *cfg, double now, double not_before)
{
  double grace = cfg->grace;
  double stop_grace = grace < WATCHDOG_STOP_GRACE_MAX_S ? grace : WATCHDOG_STOP_GRACE_MAX_S;
  int stopping = atomic_load(cfg->stopping);
  char why[256];
  int slot = -1, settle = 0;
  struct task *wedged = NULL;
  char id[32] = "", attempt[16] = "";

  /* Called until a slot is found wedged, never after (watchdog_main stops looking). */
  pthread_mutex_lock(cfg->mu);
  int closing = 0;
  for (int i = 0; i < cfg->nwatch && !wedged && !closing; i++) {
    struct slot_watch *sw = &cfg->watch[i];
    struct task *t = sw->task;
    if (!t && sw->closing > 0 && now >= not_before) {
      /* Closing a state runs its finalizers: stuck there, the slot never takes a task again,
         and at shutdown the process would wait for it forever. */
      double g = *cfg->draining ? stop_grace : grace;
      if (now - sw->closing < g)
        continue;
      snprintf(why, sizeof why, "closing a Lua state did not finish within %g s (a finalizer "
               "stuck in one C call)", g);
      closing = 1;
      slot = i;
      log_error("watchdog: slot %d is wedged: %s; exiting with status %d", slot, why,
                WATCHDOG_EXIT_WEDGED);
      cfg->on_wedged(cfg->arg, NULL, 0, why);
      break;
    }
    if (!t)
      continue;
    int lost = atomic_load(&t->lost);
    if (lost && sw->lost_seen == 0)
      sw->lost_seen = now;
    if (stopping && sw->stop_seen == 0)
      sw->stop_seen = now;
    double ran = now - sw->started;
    if (now < not_before)
      continue;
    if (cfg->task_timeout > 0 && ran >= cfg->task_timeout + grace)
      snprintf(why, sizeof why, "handle ran %.1f s, stuck in one C call past --task-timeout "
               "(%g s) + --watchdog-grace (%g s)", ran, cfg->task_timeout, grace);
    else if (sw->stop_seen > 0 && now - sw->stop_seen >= stop_grace)
      snprintf(why, sizeof why, "handle did not stop within %g s of the drain deadline's "
               "stop (stuck in one C call)", stop_grace);
    else if (sw->lost_seen > 0 && now - sw->lost_seen >= grace)
      snprintf(why, sizeof why, "handle did not stop within --watchdog-grace (%g s) of "
               "losing its lease (stuck in one C call)", grace);
    else
      continue;
    wedged = t;
    slot = i;
    settle = !lost;
    snprintf(id, sizeof id, "%lld", (long long)t->id);
    snprintf(attempt, sizeof attempt, "%d", t->attempt);
    /* Logged before the owner is told: it may _exit as soon as it sees the wedge, and the
       cause must be in the log first. */
    struct log_field f[] = {
      { "task_id", id }, { "attempt", attempt }, { "worker", cfg->worker_id }, { NULL, NULL },
    };
    log_fields(LOG_ERROR, f, "watchdog: slot %d is wedged: %s; the worker gives its leases "
               "back and exits with status %d", slot, why, WATCHDOG_EXIT_WEDGED);
    /* No renewal from now on (lease.c skips lost tasks): a zombie cannot keep the row. */
    atomic_store(&t->lost, 1);
    cfg->on_wedged(cfg->arg, t, settle, why);
  }
  pthread_mutex_unlock(cfg->mu);
  int nheld = closing ? lease_registry_count(cfg->registry) : 1;
  if (closing) {
    /* Nothing held (the shutdown, where the dispatcher is joining that slot): nothing to
       give back, so no need to wait for the dispatcher. */
    if (nheld == 0)
      _exit(WATCHDOG_EXIT_WEDGED);
    return 1;
  }
  return wedged ? 1 : 0;
}
