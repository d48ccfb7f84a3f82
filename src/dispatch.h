/*
 * dispatch: the dispatcher (the thread that called host_run). It owns the claim connection
 * and the slots: each turn of its loop settles the outcomes the slots handed back and claims
 * rows for the idle slots plus a small ready buffer, in one round trip (queue_cycle), or,
 * while claims find work without what the settle hands over, the settle on the settle
 * connection (settler.h) at the same time as the claim; it
 * drains on request (claimed-but-not-started tasks go back at once, running ones at the
 * drain deadline) and, when the watchdog finds a slot wedged, gives every lease back and
 * exits. host.c sets it up and tears it down.
 */
#ifndef LEASH_DISPATCH_H
#define LEASH_DISPATCH_H

#include "db.h"
#include "task.h"

#include <stddef.h>

struct host;
struct dispatcher;

/* NULL when out of memory. h must be initialised (its locks, counters, registry, watches and
   script source) and outlive the dispatcher. */
struct dispatcher *dispatcher_new(struct host *h);
/* The claim connection and the table check, waiting for a database that is still coming
   up. 0, or -1 with err. */
int dispatcher_connect(struct dispatcher *d, char *err, size_t errlen);
PGconn *dispatcher_conn(struct dispatcher *d);
/* Starts every slot; -1 (logged) when one cannot start (those started are stopped by
   dispatcher_stop_slots). */
int dispatcher_start_slots(struct dispatcher *d);
/* The loop: until drained, or the scope settled with --until-empty. Returns the exit code
   (or does not return: a wedge _exits with HOST_EXIT_WEDGED). */
int dispatcher_run(struct dispatcher *d);
/* Stops and joins the slots started (they finish the task they run first). */
void dispatcher_stop_slots(struct dispatcher *d);
void dispatcher_free(struct dispatcher *d);

/* Marks t's lease lost (once), logs why, and wakes sleeping scripts. Takes only the wake
   lock: callable under the host's lock or the lease registry's (the lease thread's
   on_lost). */
void dispatch_lose_lease(struct host *h, struct task *t, const char *why);

#endif
