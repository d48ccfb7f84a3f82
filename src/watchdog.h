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
 * cause once and hands over to the dispatcher (host.c, wedge_exit), which on its own
 * connection settles the wedged task as a retry with cause "wedged" (unless its lease was
 * already lost or released), gives every other lease back without charging the attempt, and
 * _exits with HOST_EXIT_WEDGED (3) so the supervisor restarts the process: the wedged thread
 * is never joined. If the dispatcher cannot do that within a few seconds (the database away),
 * the watchdog _exits by itself and the leases expire as after a crash.
 *
 * It takes only h->mu, which no slot holds while Lua runs, and never calls into Lua.
 */
#ifndef LEASH_WATCHDOG_H
#define LEASH_WATCHDOG_H

struct host;
struct watchdog;

/* How long after the drain's stop a slot may take to come back: SIGTERM ends the process
   within --drain-timeout plus this (and one round trip). */
#define WATCHDOG_STOP_GRACE_MAX_S 2.0
/* How long the dispatcher gets to settle and release before the watchdog exits by itself. */
#define WATCHDOG_BACKSTOP_S 5.0

/* Starts the thread (NULL, logged, when it cannot). h->watch must be set up. */
struct watchdog *watchdog_start(struct host *h);
void watchdog_stop(struct watchdog *w);

#endif
