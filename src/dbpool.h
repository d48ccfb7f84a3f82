/*
 * dbpool: the few connections that scripts' leash.db.query calls share. Connections open
 * lazily, up to a fixed maximum (a process never holds one per slot); a caller waits for a
 * free one. A connection comes back idle: an open transaction is rolled back, a broken one
 * is closed and reopened on next use. Thread-safe.
 */
#ifndef LEASH_DBPOOL_H
#define LEASH_DBPOOL_H

#include <libpq-fe.h>
#include <stddef.h>

struct dbpool;

/* conninfo is copied. statement_timeout_ms 0 = none. NULL when out of memory. */
struct dbpool *dbpool_new(const char *conninfo, int max, int statement_timeout_ms);
void dbpool_free(struct dbpool *p);

/* A connection for one statement, or NULL with err when none can be opened. */
PGconn *dbpool_get(struct dbpool *p, char *err, size_t errlen);
void dbpool_put(struct dbpool *p, PGconn *c);

#endif
