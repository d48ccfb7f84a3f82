/*
 * settler: a second connection that writes a turn's outcomes while the dispatcher claims on
 * its own, so that the settle and the claim run on two backends at once. A process keeps
 * one backend busy with its cycles (issue #14: 80 % of a drain's wall time is the cycle's
 * statement, and it was one statement on one core); split, a turn costs the longer of the
 * two, not their sum. On by default with two or more slots (`leash run
 * --no-settle-connection` turns it off).
 *
 * One helper thread, one job at a time, owned by the dispatcher thread: settler_begin hands
 * it the outcomes, settler_end waits for what the fenced write did. The helper only runs the
 * statement (queue_cycle with nothing to claim) and fills `applied`; the dispatcher does all
 * the bookkeeping with the answer, as for its own cycles. The helper keeps its connection:
 * while it is down it reconnects in the background with backoff, and settler_begin refuses
 * work (the dispatcher then settles on its own connection, as without a settler). A failed
 * settle is reported, not retried: its outcomes go through the dispatcher's own cycle, whose
 * fence rejects any that the failed attempt did write (a commit whose answer was lost).
 */
#ifndef LEASH_SETTLER_H
#define LEASH_SETTLER_H

#include "db.h"
#include "queue.h"
#include "task.h"

#include <stddef.h>

struct settler;

/* Takes q (its statements, owner and backoff: the dispatcher's, built for the same table)
   and starts the helper thread, which connects with conninfo. NULL (q freed) when it
   cannot start. */
struct settler *settler_start(const char *conninfo, struct queue *q);

/* Starts writing the outcomes of the first n tasks of list into applied[0..n-1] (SETTLED_*)
   on the settle connection, leasing up to `chain` of their shards' next rows to this worker
   (queue_cycle): 0, or -1 when the connection is not up (nothing started). Until
   settler_end, the caller must not touch list's tasks' outcomes or applied. */
int settler_begin(struct settler *s, struct task *list, int n, char *applied,
                  const struct queue_scope *scope, int chain);

/* Waits for the job settler_begin started: 0 when written (applied filled; the rows its
   settle leased in *leased, the caller's now), or -1 with err (nothing known to be written:
   the caller writes them itself). */
int settler_end(struct settler *s, struct task **leased, char *err, size_t errlen);

/* Stops and joins the helper (a job under way finishes first); closes the connection. */
void settler_stop(struct settler *s);

#endif
