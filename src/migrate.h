/*
 * migrate: brings a queue table's schema up to date from the embedded sql/ files. All
 * pending migrations run in one transaction under a global advisory lock, so concurrent
 * runs (every pod's init step) are safe and the second finds nothing to do. The versions
 * applied are recorded in "<table>_migrations" beside the queue table.
 */
#ifndef LEASH_MIGRATE_H
#define LEASH_MIGRATE_H

#include "db.h"

/* Returns the number of migrations applied (0 when up to date), or -1 with err. */
int migrate_run(PGconn *c, const struct db_table *t, char *err, size_t errlen);

/* Fills {{table}}, {{table_literal}}, {{obj:X}}, {{name:X}} and {{objlit:X}} (<table>_X as a
   string literal) in sql, outside comments
   (placeholders in "--" and block comments are left as written). malloc'd result, NULL with
   err on an unknown placeholder, a value that could leave its token, or out of memory. */
char *migrate_expand(PGconn *c, const struct db_table *t, const char *sql, char *err,
                     size_t errlen);

/* 0 when the table's schema is at the newest version, -1 with err (naming the fix) when
   it is missing or older: commands other than migrate refuse to run on it. */
int migrate_check(PGconn *c, const struct db_table *t, char *err, size_t errlen);

#endif
