/*
 * slot: one thread, one Lua state, one task at a time. Its whole life is
 *     wait for a task (slot_give) -> load a new script version if one was published (or the
 *     state broke) -> run the task (script_run) -> hand it back (env.hand_back, which may
 *     give the next task at once) -> wait ...
 * until slot_quit. What it needs of its owner is in struct slot_env; it knows nothing else.
 * The watchdog (watchdog.h) sees the slot through its struct slot_watch.
 */
#ifndef LEASH_SLOT_H
#define LEASH_SLOT_H

#include "lease.h"
#include "metrics.h"
#include "reload.h"
#include "script.h"
#include "task.h"
#include "watchdog.h"

#include <pthread.h>

struct slot;

/* The same for every slot of a run; must outlive them. */
struct slot_env {
  pthread_mutex_t *mu;               /* guards each slot's task and quit, *src and the watches */
  const struct script_source *src;   /* the version to load (reload.c publishes new ones) */
  const char *script_path;
  const struct script_host *sh;
  double load_limit;                 /* reload_load_bounded's limit */
  struct metrics_counters *stats;    /* busy_slots, task_seconds */
  struct lease_registry *registry;   /* told when a task's script returned */
  /* Under mu: takes a finished task back; returns the slot's next task, or NULL (the slot
     then waits for slot_give). */
  struct task *(*hand_back)(void *arg, struct slot *s, struct task *done);
  void *arg;
};

/* The fields are slot.c's; the struct is here so that an owner can keep an array of them. */
struct slot {
  const struct slot_env *env;
  int index;
  struct slot_watch *watch;
  pthread_t thread;
  pthread_cond_t cv;            /* a task was handed over, or quit */
  struct task *task;            /* under env->mu */
  int quit;                     /* under env->mu */
  struct script *script;        /* owned by the slot's thread */
  unsigned generation;          /* src generation loaded */
  struct script *canary;        /* the canary's candidate (canary.h), or NULL */
  unsigned canary_generation;   /* src canary_generation loaded */
  int canary_share;             /* of the loaded candidate */
  long long canary_id;
};

/* Loads env->src's text (no reload may run yet) and starts the thread. 0, or -1 with err
   (nothing left to undo). */
int slot_start(struct slot *s, const struct slot_env *env, int index, struct slot_watch *watch,
               char *err, size_t errlen);
/* Under env->mu, to an idle slot (one whose hand_back returned NULL, or a new one). */
void slot_give(struct slot *s, struct task *t);
/* Under env->mu: the slot exits once its current task (if any) is handed back. */
void slot_quit(struct slot *s);
/* After slot_quit, without mu: joins the thread and closes its state. */
void slot_join(struct slot *s);

#endif
