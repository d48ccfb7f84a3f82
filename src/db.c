/* db: connections, single statements, the quoted table name. See db.h. */
#include "db.h"

#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void notice_to_log(void *arg, const char *message);
static PGresult *exec_result(PGconn *c, PGresult *r, char *err, size_t errlen);
static char *escape_ident(PGconn *c, const char *s, size_t len);
static void redact_passwords(const char *conninfo, char *msg, size_t msglen);

static _Thread_local char last_sqlstate[6];
static _Thread_local int last_transient;

const char *db_conninfo(const char *explicit_conninfo)
{
  if (explicit_conninfo && *explicit_conninfo)
    return explicit_conninfo;
  const char *env = getenv("DATABASE_URL");
  if (env && *env)
    return env;
  return NULL;
}

PGconn *db_connect(const char *conninfo, const char *role, int statement_timeout_ms,
                   char *err, size_t errlen)
{
  char app[64];
  snprintf(app, sizeof app, "leash %s", role);
  /* expand_dbname lets conninfo be a URI or key=value string. It comes last, so what the
     user wrote (connect_timeout, application_name) wins over our defaults. */
  /* Keepalives and tcp_user_timeout: a silent network partition must not hang a worker for
     the kernel's TCP timeout (a quarter of an hour). Unix sockets ignore them. */
  const char *keys[] = { "fallback_application_name", "connect_timeout", "keepalives",
                         "keepalives_idle", "keepalives_interval", "keepalives_count",
                         "tcp_user_timeout", "dbname", NULL };
  const char *vals[] = { app, "10", "1", "30", "10", "3", "60000", conninfo, NULL };
  if (!conninfo)
    keys[7] = NULL;
  last_transient = 0;
  PGconn *c = PQconnectdbParams(keys, vals, 1);
  if (!c) {
    snprintf(err, errlen, "out of memory connecting to PostgreSQL");
    return NULL;
  }
  if (PQstatus(c) != CONNECTION_OK) {
    /* libpq gives no SQLSTATE for a failed connection; a ping tells, without parsing a
       translated message, whether the server is away or refusing for now (starting up,
       shutting down) — worth waiting for — or answering (bad password, no such
       database) — not. */
    PGPing ping = PQpingParams(keys, vals, 1);
    last_transient = ping == PQPING_NO_RESPONSE || ping == PQPING_REJECT;
    char one[DB_ERR_MAX];
    db_one_line(PQerrorMessage(c), one, sizeof one);
    /* libpq quotes a malformed URI whole, or the token it could not decode, in its
       message: that text may be the password. */
    redact_passwords(conninfo, one, sizeof one);
    snprintf(err, errlen, "cannot connect to PostgreSQL: %s", one);
    PQfinish(c);
    return NULL;
  }
  PQsetNoticeProcessor(c, notice_to_log, NULL);
  if (statement_timeout_ms > 0) {
    char sql[96];
    snprintf(sql, sizeof sql, "SET statement_timeout = %d", statement_timeout_ms);
    if (db_command(c, sql, err, errlen) != 0) {
      PQfinish(c);
      return NULL;
    }
  }
  return c;
}

PGresult *db_exec(PGconn *c, const char *sql, int nparams, const char *const *params,
                  char *err, size_t errlen)
{
  return exec_result(c, PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0), err,
                     errlen);
}

/* The statements this thread prepared, by connection: a name not here is prepared before
   its first use, so a new connection costs no failed EXECUTE (the server logs each one as an
   ERROR, and a fleet of workers restarting filled its log with them). A connection freed and
   another allocated at its address can look prepared: its first EXECUTE then fails with
   26000 and the statement is prepared there and then, as without this cache. */
#define PREPARED_CACHE 8
static _Thread_local struct {
  const PGconn *c;
  const char *name;   /* callers pass string constants */
} prepared[PREPARED_CACHE];
static _Thread_local unsigned prepared_next;

static int is_prepared(const PGconn *c, const char *name)
{
  for (int i = 0; i < PREPARED_CACHE; i++)
    if (prepared[i].c == c && prepared[i].name && strcmp(prepared[i].name, name) == 0)
      return 1;
  return 0;
}

static void note_prepared(const PGconn *c, const char *name)
{
  prepared[prepared_next % PREPARED_CACHE].c = c;
  prepared[prepared_next % PREPARED_CACHE].name = name;
  prepared_next++;
}

static PGresult *prepare(PGconn *c, const char *name, const char *sql, int nparams)
{
  PGresult *r = PQprepare(c, name, sql, nparams, NULL);
  if (r && PQresultStatus(r) == PGRES_COMMAND_OK)
    note_prepared(c, name);
  return r;
}

PGresult *db_exec_prepared(PGconn *c, const char *name, const char *sql, int nparams,
                           const char *const *params, char *err, size_t errlen)
{
  PGresult *r;
  if (!is_prepared(c, name)) {
    r = prepare(c, name, sql, nparams);
    if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) {
      const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
      if (!state || strcmp(state, "42P05") != 0)   /* 42P05: prepared already */
        return exec_result(c, r, err, errlen);
      note_prepared(c, name);
    }
    PQclear(r);
  }
  r = PQexecPrepared(c, name, nparams, params, NULL, NULL, 0);
  const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
  if (state && strcmp(state, "26000") == 0) {
    /* Not prepared on this connection after all (one that was reset, or a new one at a
       freed one's address). */
    PQclear(r);
    r = prepare(c, name, sql, nparams);
    if (!r || PQresultStatus(r) != PGRES_COMMAND_OK)
      return exec_result(c, r, err, errlen);
    PQclear(r);
    r = PQexecPrepared(c, name, nparams, params, NULL, NULL, 0);
  }
  return exec_result(c, r, err, errlen);
}

/* db_exec's answer from libpq's: r when it holds rows or a command's success, else NULL with
   err, and the failure kept for db_last_sqlstate and db_last_error_transient. */
static PGresult *exec_result(PGconn *c, PGresult *r, char *err, size_t errlen)
{
  ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
    last_sqlstate[0] = '\0';
    last_transient = 0;
    return r;
  }
  /* A NULL SQLSTATE means the client itself saw the failure (lost connection, memory). */
  const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
  snprintf(last_sqlstate, sizeof last_sqlstate, "%s", state ? state : "");
  /* Class 08 (connection exception), 57P01-57P03 (admin shutdown, crash shutdown, cannot
     connect now), or a connection the client saw drop. */
  last_transient = PQstatus(c) == CONNECTION_BAD || strncmp(last_sqlstate, "08", 2) == 0 ||
                   strncmp(last_sqlstate, "57P0", 4) == 0;
  db_one_line(r ? PQresultErrorMessage(r) : PQerrorMessage(c), err, errlen);
  if (err[0] == '\0')
    snprintf(err, errlen, "unexpected result %s", PQresStatus(st));
  PQclear(r);
  return NULL;
}

int db_command(PGconn *c, const char *sql, char *err, size_t errlen)
{
  PGresult *r = db_exec(c, sql, 0, NULL, err, errlen);
  if (!r)
    return -1;
  PQclear(r);
  return 0;
}

int db_script(PGconn *c, const char *sql, char *err, size_t errlen)
{
  PGresult *r = PQexec(c, sql);
  ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
    PQclear(r);
    return 0;
  }
  db_one_line(r ? PQresultErrorMessage(r) : PQerrorMessage(c), err, errlen);
  PQclear(r);
  return -1;
}

const char *db_last_sqlstate(void)
{
  return last_sqlstate;
}

int db_last_error_transient(void)
{
  return last_transient;
}

void db_one_line(const char *msg, char *out, size_t outlen)
{
  size_t j = 0;
  int space = 0;
  if (outlen == 0)
    return;
  for (const char *p = msg ? msg : ""; *p && j + 1 < outlen; p++) {
    if (*p == '\n' || *p == '\r' || *p == '\t') {
      space = 1;
      continue;
    }
    if (space && j > 0 && j + 2 < outlen) {
      out[j++] = ' ';
    }
    space = 0;
    out[j++] = *p;
  }
  out[j] = '\0';
  /* libpq ends most messages with a newline; trailing spaces add nothing. */
  while (j > 0 && out[j - 1] == ' ')
    out[--j] = '\0';
}

int db_table_check_name(const char *spec, char *err, size_t errlen)
{
  const char *dot = strchr(spec, '.');
  const char *name = dot ? dot + 1 : spec;
  /* Bytes first: the other messages quote the name, which is safe only once it is known to
     be printable. */
  for (const char *p = spec; *p; p++) {
    unsigned char b = (unsigned char)*p;
    const char *what = NULL;
    if (b < 0x20 || b == 0x7f)
      what = "a control character";
    else if (b == '$')
      what = "a '$' (it could end a dollar-quoted function body)";
    else if ((p[0] == '/' && p[1] == '*') || (p[0] == '*' && p[1] == '/'))
      what = "'/*' or '*/' (they start or end an SQL comment)";
    if (what) {
      snprintf(err, errlen, "--table: the name has %s at byte %zu; control characters, '$', "
               "'/*' and '*/' are refused", what, (size_t)(p - spec) + 1);
      return -1;
    }
  }
  if (*spec == '\0' || *name == '\0' || (dot && dot == spec)) {
    snprintf(err, errlen, "--table: empty name in '%s' (use NAME or SCHEMA.NAME)", spec);
    return -1;
  }
  if (strchr(name, '.')) {
    snprintf(err, errlen, "--table: '%s' has more than one '.' (use NAME or SCHEMA.NAME)", spec);
    return -1;
  }
  /* Objects named "<table>_<what>" must fit PostgreSQL's 63 bytes, or they would be cut
     and collide ("<table>_one_lease_per_shard" is the longest). */
  if (strlen(name) > DB_TABLE_NAME_MAX) {
    snprintf(err, errlen, "--table: the name '%.*s...' is longer than %d bytes", 20, name,
             DB_TABLE_NAME_MAX);
    return -1;
  }
  /* PostgreSQL would silently cut a longer schema name and use another schema. */
  if (dot && (size_t)(dot - spec) > DB_SCHEMA_NAME_MAX) {
    snprintf(err, errlen, "--table: the schema name '%.*s...' is longer than %d bytes", 20,
             spec, DB_SCHEMA_NAME_MAX);
    return -1;
  }
  return 0;
}

int db_table_init(struct db_table *t, PGconn *c, const char *spec, char *err, size_t errlen)
{
  memset(t, 0, sizeof *t);
  if (db_table_check_name(spec, err, errlen) != 0)
    return -1;
  const char *dot = strchr(spec, '.');
  const char *name = dot ? dot + 1 : spec;
  t->name = strdup(name);
  if (dot) {
    char *s = escape_ident(c, spec, (size_t)(dot - spec));
    if (s) {
      t->schema_q = malloc(strlen(s) + 2);
      if (t->schema_q)
        sprintf(t->schema_q, "%s.", s);
      free(s);
    }
  } else {
    t->schema_q = strdup("");
  }
  char *n = escape_ident(c, name, strlen(name));
  if (n && t->schema_q) {
    t->qualified = malloc(strlen(t->schema_q) + strlen(n) + 1);
    if (t->qualified)
      sprintf(t->qualified, "%s%s", t->schema_q, n);
  }
  free(n);
  if (t->qualified) {
    char *lit = PQescapeLiteral(c, t->qualified, strlen(t->qualified));
    if (lit) {
      t->literal = strdup(lit);
      PQfreemem(lit);
    }
  }
  if (!t->name || !t->schema_q || !t->qualified || !t->literal) {
    char one[DB_ERR_MAX];
    db_one_line(PQerrorMessage(c), one, sizeof one);
    snprintf(err, errlen, "--table: cannot quote '%s': %s", spec, one);
    db_table_free(t);
    return -1;
  }
  return 0;
}

void db_table_free(struct db_table *t)
{
  free(t->qualified);
  free(t->schema_q);
  free(t->name);
  free(t->literal);
  memset(t, 0, sizeof *t);
}

char *db_table_object(const struct db_table *t, PGconn *c, const char *suffix, int qualified)
{
  size_t len = strlen(t->name) + strlen(suffix) + 2;
  char *raw = malloc(len);
  if (!raw)
    return NULL;
  snprintf(raw, len, "%s_%s", t->name, suffix);
  char *q = escape_ident(c, raw, strlen(raw));
  free(raw);
  if (!q || !qualified)
    return q;
  char *out = malloc(strlen(t->schema_q) + strlen(q) + 1);
  if (out)
    sprintf(out, "%s%s", t->schema_q, q);
  free(q);
  return out;
}

/* PQescapeIdentifier's result must go back through PQfreemem; callers get a malloc'd copy
   so one free routine serves every string in this file. */
static char *escape_ident(PGconn *c, const char *s, size_t len)
{
  char *e = PQescapeIdentifier(c, s, len);
  if (!e)
    return NULL;
  char *copy = strdup(e);
  PQfreemem(e);
  return copy;
}

/* Replaces every occurrence of secret (n bytes) in msg with "***". */
static void redact_one(char *msg, size_t msglen, const char *secret, size_t n)
{
  static const char mask[] = "***";
  if (n == 0)
    return;
  char out[DB_ERR_MAX];
  size_t j = 0;
  for (const char *p = msg; *p && j + 1 < sizeof out;) {
    if (strncmp(p, secret, n) == 0) {
      for (const char *m = mask; *m && j + 1 < sizeof out; m++)
        out[j++] = *m;
      p += n;
    } else {
      out[j++] = *p++;
    }
  }
  out[j] = '\0';
  snprintf(msg, msglen, "%s", out);
}

/* Masks in msg whatever in conninfo may be a password: the parsed "password" value, the
   raw text after "password=" (key=value string or URI query), and the raw password of a
   URI's user:password@ part, whether or not the string as a whole parses. */
static void redact_passwords(const char *conninfo, char *msg, size_t msglen)
{
  if (!conninfo)
    return;
  char *perr = NULL;
  PQconninfoOption *opts = PQconninfoParse(conninfo, &perr);
  if (opts) {
    for (PQconninfoOption *o = opts; o->keyword; o++)
      if (strcmp(o->keyword, "password") == 0 && o->val)
        redact_one(msg, msglen, o->val, strlen(o->val));
    PQconninfoFree(opts);
  }
  PQfreemem(perr);
  /* URI: scheme://user:password@host..., '@' found before any '/' (libpq's own rule). */
  const char *scheme = strstr(conninfo, "://");
  if (scheme && (strncmp(conninfo, "postgresql://", 13) == 0 ||
                 strncmp(conninfo, "postgres://", 11) == 0)) {
    const char *user = scheme + 3, *at = user;
    while (*at && *at != '@' && *at != '/')
      at++;
    if (*at == '@') {
      const char *colon = memchr(user, ':', (size_t)(at - user));
      if (colon)
        redact_one(msg, msglen, colon + 1, (size_t)(at - colon - 1));
    }
  }
  /* password=VALUE anywhere: a key=value pair (maybe 'quoted') or a URI query parameter. */
  for (const char *p = strstr(conninfo, "password"); p; p = strstr(p + 1, "password")) {
    const char *v = p + 8;
    while (*v == ' ' || *v == '\t')
      v++;
    if (*v++ != '=')
      continue;
    while (*v == ' ' || *v == '\t')
      v++;
    const char *end = v;
    if (*v == '\'') {
      end = ++v;
      while (*end && *end != '\'')
        end += end[0] == '\\' && end[1] ? 2 : 1;
    } else {
      while (*end && *end != ' ' && *end != '\t' && *end != '&')
        end++;
    }
    redact_one(msg, msglen, v, (size_t)(end - v));
  }
}

static void notice_to_log(void *arg, const char *message)
{
  (void)arg;
  char one[DB_ERR_MAX];
  db_one_line(message, one, sizeof one);
  log_debug("postgres: %s", one);
}
