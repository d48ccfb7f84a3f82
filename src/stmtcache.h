/*
 * stmtcache: the statements a pooled connection has prepared for scripts, so that a query
 * run again on that connection (the same SQL text, by any later execution) is neither parsed
 * nor planned again. On this table a script's one-row statement spends more time being
 * parsed and planned (17 indexes, 18 CHECK constraints) than being run.
 *
 * Only plannable statements are kept (the text's first word is SELECT, INSERT, UPDATE,
 * DELETE, WITH, VALUES, TABLE or MERGE): a utility statement such as SET or DEALLOCATE is
 * run unnamed, as before. A statement new to the connection is prepared and run in one round
 * trip (libpq's pipeline mode), so a query run once costs what it did. At most
 * STMTCACHE_MAX statements per connection; the least recently used one is deallocated in the
 * same round trip as the statement that takes its place. A statement is named after its
 * text (a SHA-256), so a name means one text on every connection, a pooler's shared server
 * sessions included.
 *
 * The server may drop what was prepared behind the cache's back (a script's DISCARD ALL or
 * DEALLOCATE), refuse a cached plan whose result columns changed (ALTER TABLE under a
 * SELECT *), or fail to analyse it again with the parameter types inferred when it was
 * prepared (another search_path, a column's type altered): all are told by the error's
 * source, raised at Bind before anything runs, and the statement is prepared again and run
 * once more. Statements run in autocommit (the pool rolls back a transaction left open), so
 * nothing of the failed try remains. Like any prepared statement, a kept one holds its
 * tables by OID: one that a temp table created later in the same session would shadow goes
 * on using the permanent table (PREPARE's manual page). The pool keeps no cache for a
 * session that has a temp schema (dbpool.c); the case left is an execution that creates a
 * second temp table shadowing a text it ran after its first.
 *
 * Not thread-safe: a cache belongs to its connection, which one thread holds at a time.
 */
#ifndef LEASH_STMTCACHE_H
#define LEASH_STMTCACHE_H

#include <libpq-fe.h>

#define STMTCACHE_MAX 64

struct stmtcache;

/* NULL when out of memory (the connection then runs every statement unnamed). */
struct stmtcache *stmtcache_new(void);
void stmtcache_free(struct stmtcache *sc);

/* Runs sql with text parameters on c as PQexecParams does (same result, same errors),
   through a prepared statement when sql is one to keep. sc NULL: PQexecParams itself. */
PGresult *stmtcache_exec(struct stmtcache *sc, PGconn *c, const char *sql, int nparams,
                         const char *const *params);

#endif
