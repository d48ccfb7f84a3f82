/* signals: SIGTERM/SIGINT drain, SIGHUP hot swap, on a thread of their own. See signals.h. */
#include "signals.h"

#include "log.h"
#include "task.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

int signals_thread_create(pthread_t *thread, void *(*main)(void *), void *arg)
{
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int rc = pthread_create(thread, NULL, main, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

struct signals {
  struct signal_handlers on;
  pthread_t thread;
  int count;                    /* SIGTERM/SIGINT seen */
  double first;                 /* monotonic, the first of them */
};

static void *signals_main(void *arg);

static void signal_set(sigset_t *set)
{
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGHUP);
  sigaddset(set, SIGUSR1);   /* signals_stop */
}

struct signals *signals_start(const struct signal_handlers *handlers)
{
  sigset_t set;
  signal_set(&set);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  struct signals *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->on = *handlers;
  if (pthread_create(&s->thread, NULL, signals_main, s) != 0) {
    free(s);
    return NULL;
  }
  return s;
}

void signals_stop(struct signals *s)
{
  if (!s)
    return;
  pthread_kill(s->thread, SIGUSR1);
  pthread_join(s->thread, NULL);
  free(s);
}

static void *signals_main(void *arg)
{
  struct signals *s = arg;
  sigset_t set;
  signal_set(&set);
  for (;;) {
    int sig;
    if (sigwait(&set, &sig) != 0 || sig == SIGUSR1)
      return NULL;
    const char *name = sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM";
    if (sig == SIGHUP) {
      s->on.reload(s->on.arg);
    } else if (s->count++ == 0) {
      s->first = task_now();
      s->on.drain(s->on.arg);
      log_info("%s: draining (a second signal stops at once)", name);
    } else if (task_now() - s->first < SIGNALS_COALESCE_S) {
      /* One request delivered twice (to the process and to its group), not an impatient
         operator: the drain goes on. */
      log_info("%s %.1f s after the first: the same request, still draining", name,
               task_now() - s->first);
    } else {
      log_warn("second signal: stopping at once; held leases will expire");
      _exit(1);
    }
  }
}
