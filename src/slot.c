/* slot: the slot thread's state machine. See slot.h. */
#include "slot.h"

#include "canary.h"
#include "dbpool.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOT_STACK (512 * 1024)

static void *slot_main(void *arg);
static struct task *wait_for_task(struct slot *s, char **text, size_t *len, unsigned *gen);
static void load_version(struct slot *s, char *text, size_t len, unsigned generation);
static void follow_canary(struct slot *s);
static void run_task(struct slot *s, struct task *t);
static void close_script(struct slot *s, struct script *script);

int slot_start(struct slot *s, const struct slot_env *env, int index, struct slot_watch *watch,
               char *err, size_t errlen)
{
  *s = (struct slot){ .env = env, .index = index, .watch = watch,
                      .generation = env->src->generation };
  pthread_cond_init(&s->cv, NULL);
  s->script = reload_load_bounded(env->script_path, env->src->text, env->src->len, env->sh,
                                  env->load_limit, err, errlen);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, SLOT_STACK);
  int ok = s->script && pthread_create(&s->thread, &attr, slot_main, s) == 0;
  pthread_attr_destroy(&attr);
  if (ok)
    return 0;
  if (s->script)
    snprintf(err, errlen, "thread");
  script_free(s->script);
  s->script = NULL;
  pthread_cond_destroy(&s->cv);
  return -1;
}

void slot_give(struct slot *s, struct task *t)
{
  s->task = t;
  pthread_cond_signal(&s->cv);
}

void slot_quit(struct slot *s)
{
  s->quit = 1;
  pthread_cond_signal(&s->cv);
}

void slot_join(struct slot *s)
{
  pthread_join(s->thread, NULL);
  script_free(s->script);   /* NULL: the thread closed it */
  script_free(s->canary);
  pthread_cond_destroy(&s->cv);
}

static void *slot_main(void *arg)
{
  struct slot *s = arg;
  for (;;) {
    char *text = NULL;
    size_t len = 0;
    unsigned generation = 0;
    struct task *t = wait_for_task(s, &text, &len, &generation);
    if (!t)
      break;
    if (text)
      load_version(s, text, len, generation);
    follow_canary(s);
    run_task(s, t);
  }
  close_script(s, s->script);
  s->script = NULL;
  close_script(s, s->canary);
  s->canary = NULL;
  return NULL;
}

/* The next task, or NULL on quit. Between tasks a hot swap, or a fresh state after an
   out-of-memory error: then *text is a copy of the version to load (taken under mu, as the
   source may be replaced at any time). */
static struct task *wait_for_task(struct slot *s, char **text, size_t *len, unsigned *gen)
{
  const struct slot_env *env = s->env;
  pthread_mutex_lock(env->mu);
  while (!s->task && !s->quit)
    pthread_cond_wait(&s->cv, env->mu);
  struct task *t = s->task;
  *gen = env->src->generation;
  *len = env->src->len;
  if (t && (*gen != s->generation || script_broken(s->script))) {
    *text = malloc(*len);
    if (*text)
      memcpy(*text, env->src->text, *len);
  }
  pthread_mutex_unlock(env->mu);
  return t;
}

/* Bounded: a setup that wedges here leaves the slot on its old version. Frees text. */
static void load_version(struct slot *s, char *text, size_t len, unsigned generation)
{
  const struct slot_env *env = s->env;
  char err[DB_ERR_MAX];
  struct script *fresh = reload_load_bounded(env->script_path, text, len, env->sh,
                                             env->load_limit, err, sizeof err);
  free(text);
  if (fresh) {
    log_debug("slot %d now runs version %s", s->index, script_version(fresh));
    close_script(s, s->script);
    s->script = fresh;
  } else {
    log_warn("slot %d keeps version %s: %s", s->index, script_version(s->script), err);
  }
  s->generation = generation;
}

/* Between tasks: loads the canary's candidate as a second state when canary.c published a
   new one (or the candidate's state broke), closes it when the canary ended. A candidate
   that fails to load here leaves the slot running every task on the current version. */
static void follow_canary(struct slot *s)
{
  const struct slot_env *env = s->env;
  pthread_mutex_lock(env->mu);
  const struct script_source *src = env->src;
  unsigned gen = src->canary_generation;
  char *text = NULL;
  size_t len = src->canary_len;
  int share = src->canary_share;
  long long id = src->canary_id;
  int load = src->canary_text && (gen != s->canary_generation ||
                                  (s->canary && script_broken(s->canary)));
  int drop = !src->canary_text && s->canary;
  if (load && (text = malloc(len ? len : 1)) != NULL)
    memcpy(text, src->canary_text, len);
  pthread_mutex_unlock(env->mu);
  if (!load && !drop) {
    s->canary_generation = gen;
    return;
  }
  close_script(s, s->canary);
  s->canary = NULL;
  s->canary_share = 0;
  s->canary_generation = gen;
  if (!text)
    return;
  char err[DB_ERR_MAX];
  s->canary = reload_load_bounded(env->script_path, text, len, env->sh, env->load_limit, err,
                                  sizeof err);
  free(text);
  if (!s->canary) {
    log_warn("slot %d runs no canary tasks: %s", s->index, err);
    return;
  }
  s->canary_share = share;
  s->canary_id = id;
}

/* Runs t where the watchdog sees it, then hands it back and takes the next task, if the
   owner has one ready, without a trip through the dispatcher. */
static void run_task(struct slot *s, struct task *t)
{
  const struct slot_env *env = s->env;
  atomic_fetch_add(&env->stats->busy_slots, 1);
  /* What runs it, for the attempt history (sql/016), written before the watchdog can see
     the task (it settles a wedged task's copy from another thread). */
  struct script *run = s->canary && canary_picks(t->id, s->canary_id, s->canary_share)
                         ? s->canary : s->script;
  _Static_assert(sizeof t->version == SCRIPT_VERSION_LEN + 1, "task.h's version size");
  memcpy(t->version, script_version(run), sizeof t->version);
  snprintf(t->label, sizeof t->label, "%s", script_label(run));
  pthread_mutex_lock(env->mu);   /* what the watchdog sees: this task in handle() since now */
  *s->watch = (struct slot_watch){ .task = t, .started = task_now() };   /* closing is 0 */
  pthread_mutex_unlock(env->mu);
  script_run(run, t);
  dbpool_done(env->sh->pool, t);   /* its sessions are reset before the next task needs one */
  atomic_fetch_sub(&env->stats->busy_slots, 1);
  histogram_observe(&env->stats->task_seconds, t->duration);
  pthread_mutex_lock(env->mu);
  s->watch->task = NULL;
  lease_registry_finished(env->registry, t);
  s->task = env->hand_back(env->arg, s, t);
  pthread_mutex_unlock(env->mu);
}

/* lua_close runs the state's pending finalizers: C-level code the count hook cannot stop, so
   the watchdog watches it like a task (a state closed at shutdown included). */
static void close_script(struct slot *s, struct script *script)
{
  pthread_mutex_lock(s->env->mu);
  s->watch->closing = task_now();
  pthread_mutex_unlock(s->env->mu);
  script_free(script);
  pthread_mutex_lock(s->env->mu);
  s->watch->closing = 0;
  pthread_mutex_unlock(s->env->mu);
}
