/*
 * signals: the signal thread of `leash run`. Every other thread blocks SIGINT, SIGTERM and
 * SIGHUP; this one takes them with sigwait and only calls its owner's handlers (which set
 * flags):
 *   - SIGTERM/SIGINT: drain (handlers.drain; the dispatcher stops claiming). More of
 *     them within SIGNALS_COALESCE_S of the first are the same request (GNU timeout(1), a
 *     shell or a supervisor may signal the process and then its group); one later than that
 *     stops at once: _exit(1), the leases held expire;
 *   - SIGHUP: a hot swap (handlers.reload).
 */
#ifndef LEASH_SIGNALS_H
#define LEASH_SIGNALS_H

#include <pthread.h>

struct signals;

#define SIGNALS_COALESCE_S 1.0

/* Called on the signal thread; each must be quick and must not block for long. */
struct signal_handlers {
  void (*drain)(void *arg);     /* the first SIGTERM/SIGINT */
  void (*reload)(void *arg);    /* SIGHUP */
  void *arg;
};

/* Blocks the signals in the calling thread (so call it before starting other threads, which
   inherit the mask), ignores SIGPIPE and starts the thread; NULL when it cannot start. */
struct signals *signals_start(const struct signal_handlers *handlers);
/* Stops and joins the thread. */
void signals_stop(struct signals *s);

/* pthread_create for a helper thread that takes no signals (the signal thread does), from
   any thread, whatever its mask: every signal is blocked while it starts (it inherits the
   mask), then the caller's mask is as it was. 0, or pthread_create's error. */
int signals_thread_create(pthread_t *thread, void *(*main)(void *), void *arg);

#endif
