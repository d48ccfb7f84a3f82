/*
 * db: connecting to PostgreSQL and running one statement, with errors turned into one
 * line of text. The conninfo comes from --db, else $DATABASE_URL, else libpq's own PG*
 * defaults; it is never logged or printed (it may hold a password): messages name the
 * database by PQdb/PQhost/PQport only. Also owns the queue table's name: the only part of
 * any SQL that is not a parameter, quoted with PQescapeIdentifier once at start-up.
 */
#ifndef LEASH_DB_H
#define LEASH_DB_H

#include <libpq-fe.h>
#include <stddef.h>

#define DB_ERR_MAX 512

/* The conninfo to use: explicit, else $DATABASE_URL, else NULL (libpq defaults). */
const char *db_conninfo(const char *explicit_conninfo);

/* Connect; role names the connection in pg_stat_activity (application_name "leash <role>").
   statement_timeout_ms > 0 sets the session's statement_timeout. NULL + err on failure. */
PGconn *db_connect(const char *conninfo, const char *role, int statement_timeout_ms,
                   char *err, size_t errlen);

/* Runs sql with text parameters (NULL = SQL NULL). Returns the result when its status is
   PGRES_TUPLES_OK or PGRES_COMMAND_OK, else clears it, writes one line to err, returns NULL.
   Caller PQclear()s the result. */
PGresult *db_exec(PGconn *c, const char *sql, int nparams, const char *const *params,
                  char *err, size_t errlen);

/* As db_exec, for a statement run often: prepared as `name` on c the first time it is used
   there (the server plans it once per connection, not on every call). name must be a string
   constant: the thread's record of what it prepared keeps the pointer. */
PGresult *db_exec_prepared(PGconn *c, const char *name, const char *sql, int nparams,
                           const char *const *params, char *err, size_t errlen);

/* Same, for a statement without parameters or results; returns 0 or -1. */
int db_command(PGconn *c, const char *sql, char *err, size_t errlen);

/* Runs a script of several statements (simple query protocol, no parameters): migrations
   only. Returns 0 or -1 with err. */
int db_script(PGconn *c, const char *sql, char *err, size_t errlen);

/* The SQLSTATE of the last failure kept by db_exec (thread-local), "" when none. */
const char *db_last_sqlstate(void);

/* 1 when the last failure of db_connect or db_exec (thread-local) was the database being
   away or restarting, so the same call may succeed later; 0 when retrying cannot help. */
int db_last_error_transient(void);

/* Copies libpq's (multi-line) message into out as one line. */
void db_one_line(const char *msg, char *out, size_t outlen);

/* The queue table's name, resolved once: NAME or SCHEMA.NAME (split at the first dot). */
struct db_table {
  char *qualified;   /* quoted, ready to paste: "s"."t" or "t" */
  char *schema_q;    /* quoted schema with its dot ("s".), or "" */
  char *name;        /* the table's own name, unquoted */
  char *literal;     /* qualified as an SQL string literal, for ::regclass */
};

#define DB_TABLE_NAME_MAX 40
#define DB_SCHEMA_NAME_MAX 63   /* PostgreSQL's NAMEDATALEN - 1: a longer name would be cut */

/* Checks a --table value before anything uses it: NAME or SCHEMA.NAME, each part non-empty
   and short enough not to be truncated, and no byte that could end a comment, a string or a
   dollar-quoted body in the migrations' SQL: control characters (< 0x20, 0x7f), '$', "/ *"
   and "* /". Such names are legal quoted identifiers in PostgreSQL, but leash refuses them
   rather than trust every place a name is pasted. '"', '\'', ';' and "--" are allowed: the
   name is always pasted quoted (PQescapeIdentifier/Literal) and never inside a comment. The message never echoes the
   raw name (a newline in it would forge a line). 0, or -1 with err. */
int db_table_check_name(const char *spec, char *err, size_t errlen);

/* Returns 0, or -1 with err (a name db_table_check_name refuses, or out of memory). */
int db_table_init(struct db_table *t, PGconn *c, const char *spec, char *err, size_t errlen);
void db_table_free(struct db_table *t);

/* A name for an object that belongs to the table: "<table>_<suffix>", quoted, in the
   table's schema when qualified != 0. malloc'd; NULL on failure. */
char *db_table_object(const struct db_table *t, PGconn *c, const char *suffix, int qualified);

#endif
