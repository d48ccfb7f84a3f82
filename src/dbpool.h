/*
 * dbpool: the few connections that scripts' leash.db.query calls share. Connections open
 * lazily, up to a fixed maximum (a process never holds one per slot); a caller waits for a
 * free one. A connection comes back idle: an open transaction is rolled back, a broken one
 * is closed and reopened on next use. No session state crosses executions: a connection last
 * used by another execution (task id and attempt) is reset with the statements DISCARD ALL
 * stands for (dropping temp tables, the statements scripts PREPAREd, cursors, LISTENs and
 * session advisory locks, undoing SET ROLE, SET SESSION AUTHORIZATION and every SET) and
 * RESET ROLE, in one round trip; a reset that fails closes it and a fresh one is opened.
 * What stays is the pool's own statement cache (stmtcache.h): scripts' SQL texts the
 * connection has prepared, which any execution running the same text may use. The reset is
 * done off the pickup path where it can be: when an execution ends (dbpool_done), a helper
 * thread, the janitor, resets its idle connections, and the next execution takes one as it
 * is. Before every other statement statement_timeout is set again from the caller's time
 * left, so neither a script's own SET nor pg_sleep outlives its task. Thread-safe.
 */
#ifndef LEASH_DBPOOL_H
#define LEASH_DBPOOL_H

#include <libpq-fe.h>
#include <stddef.h>

struct dbpool;

/* conninfo is copied. statement_timeout_ms 0 = none. NULL when out of memory. */
struct dbpool *dbpool_new(const char *conninfo, int max, int statement_timeout_ms);
void dbpool_free(struct dbpool *p);

struct task;

/* A connection for one statement, or NULL with err when none can be opened. */
PGconn *dbpool_get(struct dbpool *p, char *err, size_t errlen);

/* The same, for one statement of task t (NULL: no task, always reset) with time_left_s
   seconds left before its deadline: statement_timeout is the smaller of that and the pool's
   (at least 1 ms, so a task past its deadline gets a statement cancelled at once). */
PGconn *dbpool_get_for(struct dbpool *p, const struct task *t, double time_left_s, char *err,
                       size_t errlen);
void dbpool_put(struct dbpool *p, PGconn *c);

/* Runs one statement on c, taken from p and not yet put back, as PQexecParams does, through
   c's statement cache (stmtcache.h). */
PGresult *dbpool_exec(struct dbpool *p, PGconn *c, const char *sql, int nparams,
                      const char *const *params);

/* t's execution has ended (its script returned): its idle connections are reset in the
   background. NULL p or t: nothing. */
void dbpool_done(struct dbpool *p, const struct task *t);

#endif
