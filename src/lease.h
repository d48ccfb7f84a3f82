/*
 * lease: the lease thread. On its own connection it renews every lease the process holds
 * with one statement per heartbeat interval, marks a task's lease lost when the renewal
 * misses its row (or when no renewal succeeded before the lease ran out: a process frozen
 * past its lease must assume the worst), reaps expired leases of any worker, and LISTENs
 * for inserts to wake the dispatcher at once.
 */
#ifndef LEASH_LEASE_H
#define LEASH_LEASE_H

struct host;
struct lease;

/* Starts the thread; NULL (with the reason logged) when it cannot. */
struct lease *lease_start(struct host *h);
/* Stops and joins the thread, closes its connection. */
void lease_stop(struct lease *l);

#endif
