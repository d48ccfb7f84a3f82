/*
 * test_migrate: placeholder expansion (migrate.c), the second wall behind --table's check.
 * No server: PQescapeIdentifier needs a PGconn object only for its encoding, and one that
 * never connected does (the unix socket path below does not exist).
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "db.h"
#include "migrate.h"

static PGconn *offline_conn(void)
{
  return PQconnectStart("host=/nonexistent/leash-test dbname=x connect_timeout=1");
}

/* A table object as db_table_init would build it, without the name check (to reach the
   expansion with a name the check refuses). */
static void fake_table(struct db_table *t, PGconn *c, const char *name)
{
  char *q = PQescapeIdentifier(c, name, strlen(name));
  char *lit = PQescapeLiteral(c, q, strlen(q));
  t->qualified = strdup(q);
  t->schema_q = strdup("");
  t->name = strdup(name);
  t->literal = strdup(lit);
  PQfreemem(q);
  PQfreemem(lit);
}

/* Placeholders in "--" and block comments are copied as written: a name with a newline
   pasted into "-- {{table}}" ended the comment and ran the rest of the name as SQL. */
static void placeholders_in_comments_are_not_expanded(void)
{
  PGconn *c = offline_conn();
  struct db_table t;
  char err[256] = "";
  CHECK(db_table_init(&t, c, "q", err, sizeof err) == 0);
  char *out = migrate_expand(c, &t,
                             "-- {{table}} here\nCREATE TABLE {{table}} (x int); /* {{obj:a}} "
                             "/* nested {{table}} */ {{table}} */ SELECT {{table_literal}};", err,
                             sizeof err);
  CHECK(out != NULL);
  CHECK_STR_EQ(out, "-- {{table}} here\nCREATE TABLE \"q\" (x int); /* {{obj:a}} "
                    "/* nested {{table}} */ {{table}} */ SELECT '\"q\"';");
  free(out);
  db_table_free(&t);
  PQfinish(c);
}

/* A value that could end a line, a block comment or a dollar-quoted body is refused at
   expansion even when it got past the option check. */
static void values_that_could_leave_their_token_are_refused(void)
{
  static const char *const names[] = { "x\nDROP TABLE victim;--", "x\rDROP", "x$$y", "x$b$y",
                                       "x*/y", "x/*y", "x\x01y", "x\x7fy", NULL };
  PGconn *c = offline_conn();
  for (const char *const *n = names; *n; n++) {
    struct db_table t;
    char err[256] = "";
    fake_table(&t, c, *n);
    char *out = migrate_expand(c, &t, "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ "
                                      "SELECT count(*) FROM {{table}} $$;", err, sizeof err);
    CHECK(out == NULL);
    CHECK(strstr(err, "cannot be used in SQL safely") != NULL);
    /* ... and refused by the option check with one line naming the byte. */
    CHECK_INT_EQ(db_table_check_name(*n, err, sizeof err), -1);
    CHECK(strchr(err, '\n') == NULL && strchr(err, '\r') == NULL);
    db_table_free(&t);
  }
  /* Quoted safely and allowed: a double quote, a quote, a semicolon, "--". */
  static const char *const fine[] = { "x\"; DROP TABLE t; --", "t' ; DROP", "s.t", NULL };
  for (const char *const *n = fine; *n; n++) {
    char err[256] = "";
    CHECK_INT_EQ(db_table_check_name(*n, err, sizeof err), 0);
  }
  PQfinish(c);
}

static const struct check_case cases[] = {
  { "placeholders_in_comments_are_not_expanded", placeholders_in_comments_are_not_expanded },
  { "values_that_could_leave_their_token_are_refused",
    values_that_could_leave_their_token_are_refused },
  { NULL, NULL }
};

int main(int argc, char **argv)
{
  return check_main(cases, argc, argv);
}
