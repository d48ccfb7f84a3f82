/* migrate: placeholder expansion and the apply loop. See migrate.h. */
#include "migrate.h"

#include "buf.h"
#include "log.h"
#include "migrations.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int applied_versions(PGconn *c, const char *history, int *max_version, char *err,
                            size_t errlen);
static const char *comment_end(const char *p);
static int value_is_inert(const char *v);
static char *object_literal(const struct db_table *t, PGconn *c, const char *suffix);

/* One lock for all of leash's migrations, whatever the table: DDL is rare and short. */
static const char lock_sql[] = "SELECT pg_advisory_xact_lock(hashtextextended('leash.migrate', 0))";

/* The end of the SQL comment that starts at p ("--" to the end of the line, or a block
   comment, nested as PostgreSQL nests them), or NULL when no comment starts at p. */
static const char *comment_end(const char *p)
{
  if (p[0] == '-' && p[1] == '-') {
    const char *nl = strchr(p, '\n');
    return nl ? nl : p + strlen(p);
  }
  if (p[0] == '/' && p[1] == '*') {
    int depth = 0;
    for (const char *q = p; *q; q++) {
      if (q[0] == '/' && q[1] == '*') {
        depth++;
        q++;
      } else if (q[0] == '*' && q[1] == '/') {
        q++;
        if (--depth == 0)
          return q + 1;
      }
    }
    return p + strlen(p);
  }
  return NULL;
}

/* A value pasted into SQL must stay one token: no byte that ends a line (and so a "--"
   comment), a block comment or a dollar-quoted body. db_table_check_name refuses such names
   already; this is the second wall, for values built from them. */
static int value_is_inert(const char *v)
{
  for (const char *p = v; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '$' || (p[0] == '*' && p[1] == '/') ||
        (p[0] == '/' && p[1] == '*'))
      return 0;
  return 1;
}

char *migrate_expand(PGconn *c, const struct db_table *t, const char *sql, char *err,
                     size_t errlen)
{
  struct buf b = { 0 };
  const char *p = sql;
  while (*p) {
    /* Comments are copied as they are, placeholders and all: a name expanded inside one
       could end it (a newline after "--" did, and ran the rest of the name as SQL). */
    const char *cend = comment_end(p);
    if (cend) {
      if (buf_add(&b, p, (size_t)(cend - p)) != 0)
        goto oom;
      p = cend;
      continue;
    }
    if (!(p[0] == '{' && p[1] == '{')) {
      if (buf_add(&b, p, 1) != 0)
        goto oom;
      p++;
      continue;
    }
    const char *open = p;
    const char *close = strstr(open, "}}");
    if (!close) {
      snprintf(err, errlen, "migration text has an unclosed '{{'");
      goto fail;
    }
    char key[128];
    size_t klen = (size_t)(close - open - 2);
    if (klen >= sizeof key) {
      snprintf(err, errlen, "migration placeholder too long");
      goto fail;
    }
    memcpy(key, open + 2, klen);
    key[klen] = '\0';
    char *owned = NULL;
    const char *val = NULL;
    if (strcmp(key, "table") == 0)
      val = t->qualified;
    else if (strcmp(key, "table_literal") == 0)
      val = t->literal;
    else if (strncmp(key, "obj:", 4) == 0)
      val = owned = db_table_object(t, c, key + 4, 1);
    else if (strncmp(key, "name:", 5) == 0)
      val = owned = db_table_object(t, c, key + 5, 0);
    else if (strncmp(key, "objlit:", 7) == 0)
      val = owned = object_literal(t, c, key + 7);
    else {
      snprintf(err, errlen, "migration text has an unknown placeholder {{%s}}", key);
      goto fail;
    }
    if (val && !value_is_inert(val)) {
      free(owned);
      snprintf(err, errlen, "the table name cannot be used in SQL safely ({{%s}})", key);
      goto fail;
    }
    int rc = val ? buf_add(&b, val, strlen(val)) : -1;
    free(owned);
    if (rc != 0)
      goto oom;
    p = close + 2;
  }
  char *out = buf_take(&b);   /* "" for an empty text */
  if (!out)
    goto oom;
  return out;
oom:
  snprintf(err, errlen, "out of memory expanding a migration");
fail:
  free(b.s);
  return NULL;
}

/* {{objlit:X}}: the qualified name of <table>_X as a string literal (for ::regclass, e.g.
   nextval's argument). malloc'd, NULL when out of memory. */
static char *object_literal(const struct db_table *t, PGconn *c, const char *suffix)
{
  char *name = db_table_object(t, c, suffix, 1);
  if (!name)
    return NULL;
  char *lit = PQescapeLiteral(c, name, strlen(name));
  free(name);
  char *out = lit ? strdup(lit) : NULL;
  PQfreemem(lit);
  return out;
}

int migrate_run(PGconn *c, const struct db_table *t, char *err, size_t errlen)
{
  int applied = -1, max_version = 0;
  char *history = db_table_object(t, c, "migrations", 1);
  char *create = NULL, *record = NULL;
  if (!history) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  if (db_command(c, "BEGIN", err, errlen) != 0)
    goto out;
  if (db_command(c, lock_sql, err, errlen) != 0)
    goto rollback;
  /* Created under the lock: two first runs cannot race on CREATE TABLE IF NOT EXISTS. */
  size_t n = strlen(history) + 256;
  create = malloc(n);
  record = malloc(n);
  if (!create || !record) {
    snprintf(err, errlen, "out of memory");
    goto rollback;
  }
  snprintf(create, n,
           "CREATE TABLE IF NOT EXISTS %s (version int PRIMARY KEY, name text NOT NULL, "
           "applied_at timestamptz NOT NULL DEFAULT now())", history);
  snprintf(record, n, "INSERT INTO %s (version, name) VALUES ($1::int, $2)", history);
  if (db_command(c, create, err, errlen) != 0)
    goto rollback;
  if (applied_versions(c, history, &max_version, err, errlen) != 0)
    goto rollback;

  int count = 0;
  for (int i = 0; i < migrations_count; i++) {
    const struct migration *m = &migrations[i];
    if (m->version <= max_version)
      continue;
    char *sql = migrate_expand(c, t, m->sql, err, errlen);
    if (!sql)
      goto rollback;
    char msg[DB_ERR_MAX];
    int rc = db_script(c, sql, msg, sizeof msg);
    free(sql);
    if (rc != 0) {
      snprintf(err, errlen, "migration %s failed: %s", m->name, msg);
      goto rollback;
    }
    char version[16];
    snprintf(version, sizeof version, "%d", m->version);
    const char *params[] = { version, m->name };
    PGresult *r = db_exec(c, record, 2, params, err, errlen);
    if (!r)
      goto rollback;
    PQclear(r);
    log_info("applied migration %s", m->name);
    count++;
  }
  if (db_command(c, "COMMIT", err, errlen) != 0)
    goto out;
  applied = count;
  goto out;
rollback: {
    char ignored[DB_ERR_MAX];
    db_command(c, "ROLLBACK", ignored, sizeof ignored);
  }
out:
  free(create);
  free(record);
  free(history);
  return applied;
}

int migrate_check(PGconn *c, const struct db_table *t, char *err, size_t errlen)
{
  char *history = db_table_object(t, c, "migrations", 1);
  if (!history) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int max_version = 0;
  char msg[DB_ERR_MAX];
  int rc = applied_versions(c, history, &max_version, msg, sizeof msg);
  free(history);
  int want = migrations_count > 0 ? migrations[migrations_count - 1].version : 0;
  if (rc != 0 || max_version < want) {
    snprintf(err, errlen, "queue table %s is not migrated (schema version %d, need %d): "
             "run 'leash migrate' first", t->qualified, max_version, want);
    return -1;
  }
  /* The history can say "migrated" of a table someone altered by hand since: name the
     first column leash needs that is missing, rather than fail later in every claim. */
  static const char columns_sql[] =
    "SELECT c FROM unnest('{id,tenant_id,shard_key,payload,status,run_after,locked_until,"
    "lease_owner,attempts,max_attempts,last_error,created_at,updated_at,batch,result,"
    "started_at,finished_at}'::text[]) AS c "
    "WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = to_regclass($1) "
    "AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped) LIMIT 1";
  const char *params[] = { t->qualified };
  PGresult *r = db_exec(c, columns_sql, 1, params, msg, sizeof msg);
  if (!r) {
    snprintf(err, errlen, "cannot read the columns of %s: %s", t->qualified, msg);
    return -1;
  }
  if (PQntuples(r) > 0) {
    snprintf(err, errlen, "queue table %s has no column %s although its schema version is %d:"
             " it was altered by hand; restore the column (see sql/)", t->qualified,
             PQgetvalue(r, 0, 0), max_version);
    PQclear(r);
    return -1;
  }
  PQclear(r);
  return 0;
}

static int applied_versions(PGconn *c, const char *history, int *max_version, char *err,
                            size_t errlen)
{
  char sql[512];
  snprintf(sql, sizeof sql, "SELECT coalesce(max(version), 0) FROM %s", history);
  PGresult *r = db_exec(c, sql, 0, NULL, err, errlen);
  if (!r)
    return -1;
  *max_version = atoi(PQgetvalue(r, 0, 0));
  PQclear(r);
  return 0;
}
