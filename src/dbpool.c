/* dbpool: a small shared set of connections. See dbpool.h. */
#include "dbpool.h"

#include "db.h"
#include "signals.h"
#include "stmtcache.h"
#include "task.h"

#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dbpool {
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* a connection came back */
  char *conninfo;
  int max, open, timeout_ms;
  PGconn **idle;
  struct owner *idle_owner;   /* who last used idle[i] ({-1, -1}: reset since) */
  char *idle_state;           /* IDLE_* */
  int nidle;
  struct busy *busy;          /* connections given out, with who has them */
  struct cached *cached;      /* the statements each open connection has prepared */
  /* The janitor: resets the connections of executions that ended, so that the next
     execution's first statement does not wait for a reset (the pickup path). */
  pthread_t janitor;
  pthread_cond_t janitor_cv;
  int janitor_up, quit;
};

/* What an idle connection needs before its next user (who is not its last one). */
enum {
  IDLE_USED,       /* reset before use: its last execution may still be running */
  IDLE_ENDED,      /* its last execution ended: the janitor resets it */
  IDLE_FRESH,      /* reset, statement_timeout = timeout_ms: usable as it is */
};

/* One execution of a task: its id and the attempt it runs as (a retry is another). */
struct owner {
  int64_t id;
  int attempt;
};

struct busy {
  PGconn *c;
  struct owner o;
};

struct cached {
  PGconn *c;                  /* NULL: a free place */
  struct stmtcache *sc;
  int plain;                  /* its session has a temp schema: no cache, the whole reset */
};

static int reset_session(struct dbpool *p, PGconn *c, int timeout_ms, char *err, size_t errlen);
static void mark_busy(struct dbpool *p, PGconn *c, struct owner o);
static int set_timeout(PGconn *c, int ms, char *err, size_t errlen);
static int silent_since_reset(PGconn *c);
static PGconn *take_idle(struct dbpool *p, int i, struct owner *last, int *state);
static void *janitor_main(void *arg);
static void close_conn(struct dbpool *p, PGconn *c);
static void forget_cache(struct dbpool *p, PGconn *c);
static int is_plain(const struct dbpool *p, const PGconn *c);
static void make_plain(struct dbpool *p, PGconn *c);

struct dbpool *dbpool_new(const char *conninfo, int max, int statement_timeout_ms)
{
  struct dbpool *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->idle = calloc((size_t)max, sizeof *p->idle);
  p->idle_owner = calloc((size_t)max, sizeof *p->idle_owner);
  p->idle_state = calloc((size_t)max, sizeof *p->idle_state);
  p->busy = calloc((size_t)max, sizeof *p->busy);
  p->cached = calloc((size_t)max, sizeof *p->cached);
  p->conninfo = conninfo ? strdup(conninfo) : NULL;
  if (!p->idle || !p->idle_owner || !p->idle_state || !p->busy || !p->cached ||
      (conninfo && !p->conninfo)) {
    free(p->idle);
    free(p->idle_owner);
    free(p->idle_state);
    free(p->busy);
    free(p->cached);
    free(p->conninfo);
    free(p);
    return NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  pthread_cond_init(&p->janitor_cv, NULL);
  p->max = max;
  p->timeout_ms = statement_timeout_ms;
  /* Without the janitor (no thread), connections are reset when next taken, as before. */
  if (max > 0)
    p->janitor_up = signals_thread_create(&p->janitor, janitor_main, p) == 0;
  return p;
}

void dbpool_free(struct dbpool *p)
{
  if (!p)
    return;
  if (p->janitor_up) {
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->janitor_cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->janitor, NULL);
  }
  for (int i = 0; i < p->nidle; i++)
    PQfinish(p->idle[i]);
  for (int i = 0; i < p->max; i++)
    stmtcache_free(p->cached[i].sc);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  pthread_cond_destroy(&p->janitor_cv);
  free(p->idle);
  free(p->idle_owner);
  free(p->idle_state);
  free(p->busy);
  free(p->cached);
  free(p->conninfo);
  free(p);
}

PGconn *dbpool_get(struct dbpool *p, char *err, size_t errlen)
{
  return dbpool_get_for(p, NULL, 1e9, err, errlen);
}

PGconn *dbpool_get_for(struct dbpool *p, const struct task *t, double time_left_s, char *err,
                       size_t errlen)
{
  struct owner me = { t ? t->id : -1, t ? t->attempt : -1 };
  int ms = p->timeout_ms;
  if (isfinite(time_left_s) && time_left_s < 1e6) {
    double left_ms = ceil(time_left_s * 1000);
    if (left_ms < 1)
      left_ms = 1;
    if (ms <= 0 || left_ms < ms)
      ms = (int)left_ms;
  }
  PGconn *c = NULL;
  pthread_mutex_lock(&p->mu);
  while (p->nidle == 0 && p->open >= p->max)
    pthread_cond_wait(&p->cv, &p->mu);
  if (p->nidle > 0) {
    /* This execution's own connection first, then one the janitor reset, then any. */
    int pick = p->nidle - 1;
    for (int i = 0; i < p->nidle; i++) {
      const struct owner *o = &p->idle_owner[i];
      if (t && o->id == me.id && o->attempt == me.attempt) {
        pick = i;
        break;
      }
      if (p->idle_state[i] == IDLE_FRESH)
        pick = i;
    }
    struct owner last;
    int state;
    c = take_idle(p, pick, &last, &state);
    pthread_mutex_unlock(&p->mu);
    /* Another execution's session may carry a role, settings, temp tables, prepared
       statements, LISTENs or advisory locks: none of it may reach this one. One the
       janitor reset, and from which the server has said nothing since, needs only its
       statement_timeout, when it is to differ. */
    int reused = t && last.id == me.id && last.attempt == me.attempt;
    int ok;
    if (reused)
      ok = set_timeout(c, ms, err, errlen) == 0;
    else if (state == IDLE_FRESH && silent_since_reset(c))
      ok = ms == p->timeout_ms || set_timeout(c, ms, err, errlen) == 0;
    else
      ok = reset_session(p, c, ms, err, errlen) == 0;
    if (!ok) {
      /* A session that cannot be reset is not given out: a fresh one replaces it. */
      close_conn(p, c);
      c = NULL;
    }
    if (c) {
      mark_busy(p, c, me);
      return c;
    }
    pthread_mutex_lock(&p->mu);   /* the place stays reserved (open counts it) */
  } else {
    p->open++;   /* reserve the place, connect outside the lock */
  }
  pthread_mutex_unlock(&p->mu);
  c = db_connect(p->conninfo, "script", 0, err, errlen);
  if (c && set_timeout(c, ms, err, errlen) != 0) {
    PQfinish(c);
    c = NULL;
  }
  if (!c) {
    pthread_mutex_lock(&p->mu);
    p->open--;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
  }
  mark_busy(p, c, me);
  return c;
}

/* Takes idle[i] out of the idle set (under mu), with who last used it and its state. */
static PGconn *take_idle(struct dbpool *p, int i, struct owner *last, int *state)
{
  PGconn *c = p->idle[i];
  *last = p->idle_owner[i];
  *state = p->idle_state[i];
  p->nidle--;
  p->idle[i] = p->idle[p->nidle];
  p->idle_owner[i] = p->idle_owner[p->nidle];
  p->idle_state[i] = p->idle_state[p->nidle];
  return c;
}

/* Whether a reset connection can be used as it is: the server has sent nothing since the
   reset. A backend terminated meanwhile (a restart, pg_terminate_backend) has sent its error
   and closed the socket, so the socket is readable; so it is after anything else the server
   says unasked (a notice, a parameter's new value). Then the caller resets it, a round trip
   that fails, and a new connection is opened, for a dead one. No round trip otherwise. */
static int silent_since_reset(PGconn *c)
{
  if (PQstatus(c) != CONNECTION_OK || PQtransactionStatus(c) != PQTRANS_IDLE)
    return 0;
  struct pollfd fd = { .fd = PQsocket(c), .events = POLLIN };
  return fd.fd >= 0 && poll(&fd, 1, 0) == 0;
}

void dbpool_done(struct dbpool *p, const struct task *t)
{
  if (!p || !p->janitor_up || !t)
    return;
  int any = 0;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->nidle; i++)
    if (p->idle_state[i] == IDLE_USED && p->idle_owner[i].id == t->id &&
        p->idle_owner[i].attempt == t->attempt) {
      p->idle_state[i] = IDLE_ENDED;
      any = 1;
    }
  if (any)
    pthread_cond_signal(&p->janitor_cv);
  pthread_mutex_unlock(&p->mu);
}

/* Resets connections whose execution ended, one at a time, while they sit idle; a caller
   that needs one meanwhile takes another, or waits for this one as for any in use. */
static void *janitor_main(void *arg)
{
  struct dbpool *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!p->quit) {
    int i = 0;
    while (i < p->nidle && p->idle_state[i] != IDLE_ENDED)
      i++;
    if (i == p->nidle) {
      pthread_cond_wait(&p->janitor_cv, &p->mu);
      continue;
    }
    struct owner last;
    int state;
    PGconn *c = take_idle(p, i, &last, &state);
    pthread_mutex_unlock(&p->mu);
    char err[DB_ERR_MAX];
    int ok = reset_session(p, c, p->timeout_ms, err, sizeof err) == 0;
    if (!ok)
      close_conn(p, c);
    pthread_mutex_lock(&p->mu);
    if (ok) {
      p->idle_owner[p->nidle] = (struct owner){ -1, -1 };
      p->idle_state[p->nidle] = IDLE_FRESH;
      p->idle[p->nidle++] = c;
    } else {
      p->open--;
    }
    pthread_cond_signal(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void mark_busy(struct dbpool *p, PGconn *c, struct owner o)
{
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->max; i++)
    if (!p->busy[i].c) {
      p->busy[i].c = c;
      p->busy[i].o = o;
      break;
    }
  pthread_mutex_unlock(&p->mu);
}

/* Back to the state of a new connection (see dbpool.h), in one round trip. The session is
   idle here: put rolled back whatever the script left open. DISCARD ALL itself cannot run in
   the implicit transaction of a multi-statement query, so this is what the PostgreSQL manual
   says it is equivalent to, statement by statement; RESET ROLE after RESET ALL is for a role
   default set with ALTER ROLE ... SET role.

   Two of those statements would undo the statement cache (stmtcache.h) and are sent only
   when needed, told by the reset's last statement. DEALLOCATE ALL: when a script made a
   statement of its own with SQL's PREPARE (from_sql). DISCARD PLANS: when the session has a
   temp schema. A plan holds its tables by OID, and the server plans again after DDL, a
   search_path or role change, and a session's first temp table (its temp schema joins the
   search_path); but a later temp table in a session that has one invalidates nothing, so
   a kept plan would go on reading or writing the permanent table it shadows. Such a session
   (every temp table leaves its schema behind) gives up its cache for good: its statements
   run unnamed and it gets the whole reset, as every session did before the cache. */
static int reset_session(struct dbpool *p, PGconn *c, int timeout_ms, char *err, size_t errlen)
{
  if (PQstatus(c) != CONNECTION_OK || PQtransactionStatus(c) != PQTRANS_IDLE) {
    snprintf(err, errlen, "pooled connection not idle");
    return -1;
  }
  pthread_mutex_lock(&p->mu);
  int plain = is_plain(p, c);
  pthread_mutex_unlock(&p->mu);
  char sql[560];
  snprintf(sql, sizeof sql,
           "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; "
           "SELECT pg_catalog.pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES; "
           "RESET ROLE; SET statement_timeout = %d; %s",
           timeout_ms > 0 ? timeout_ms : 0,
           /* Qualified whole: an operator of the user's own (oid <> int, say) must not
              answer for the built-in one. */
           plain ? "DEALLOCATE ALL; DISCARD PLANS"
                 : "SELECT pg_catalog.bool_or(from_sql) IS TRUE, pg_catalog.pg_my_temp_schema() "
                   "OPERATOR(pg_catalog.<>) 0::pg_catalog.oid "
                   "FROM pg_catalog.pg_prepared_statements");
  PGresult *r = PQexec(c, sql);   /* the last statement's result */
  int ok = r && (plain ? PQresultStatus(r) == PGRES_COMMAND_OK
                       : PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1);
  int scripts_own = ok && !plain && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  int temp = ok && !plain && strcmp(PQgetvalue(r, 0, 1), "t") == 0;
  if (!ok)
    db_one_line(r ? PQresultErrorMessage(r) : PQerrorMessage(c), err, errlen);
  PQclear(r);
  if (!ok)
    return -1;
  if (scripts_own || temp) {
    if (db_script(c, temp ? "DEALLOCATE ALL; DISCARD PLANS" : "DEALLOCATE ALL", err, errlen) != 0)
      return -1;
    pthread_mutex_lock(&p->mu);
    if (temp)
      make_plain(p, c);
    else
      forget_cache(p, c);
    pthread_mutex_unlock(&p->mu);
  }
  /* Notifications received before the reset are the last user's. */
  PGnotify *n;
  PQconsumeInput(c);
  while ((n = PQnotifies(c)) != NULL)
    PQfreemem(n);
  return 0;
}

/* Every statement: the script's own SET statement_timeout = 0 must not outlive it. */
static int set_timeout(PGconn *c, int ms, char *err, size_t errlen)
{
  char sql[64];
  snprintf(sql, sizeof sql, "SET statement_timeout = %d", ms > 0 ? ms : 0);
  return db_command(c, sql, err, errlen);
}

void dbpool_put(struct dbpool *p, PGconn *c)
{
  /* A script may have sent BEGIN; the next user must not inherit its transaction. */
  if (c && PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) != PQTRANS_IDLE) {
    char err[DB_ERR_MAX];
    db_command(c, "ROLLBACK", err, sizeof err);
  }
  pthread_mutex_lock(&p->mu);
  struct owner o = { -1, -1 };   /* unknown: reset before the next use */
  for (int i = 0; c && i < p->max; i++)
    if (p->busy[i].c == c) {
      o = p->busy[i].o;
      p->busy[i].c = NULL;
      break;
    }
  if (c && PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) == PQTRANS_IDLE) {
    p->idle_owner[p->nidle] = o;
    p->idle_state[p->nidle] = IDLE_USED;
    p->idle[p->nidle++] = c;
  } else {
    forget_cache(p, c);
    PQfinish(c);
    p->open--;
  }
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

PGresult *dbpool_exec(struct dbpool *p, PGconn *c, const char *sql, int nparams,
                      const char *const *params)
{
  struct stmtcache *sc = NULL;
  pthread_mutex_lock(&p->mu);
  int free_at = -1;
  int found = 0;
  for (int i = 0; i < p->max && !found; i++) {
    if (p->cached[i].c == c) {
      sc = p->cached[i].sc;
      found = 1;
    } else if (!p->cached[i].c && free_at < 0) {
      free_at = i;
    }
  }
  if (!found && free_at >= 0 && (sc = stmtcache_new()) != NULL)
    p->cached[free_at] = (struct cached){ c, sc, 0 };
  pthread_mutex_unlock(&p->mu);
  /* The connection is the caller's alone, and so is its cache, until dbpool_put. */
  return stmtcache_exec(sc, c, sql, nparams, params);
}

/* Under mu: c is closed, and what it had prepared with it (a new connection may be given
   c's address). */
static void forget_cache(struct dbpool *p, PGconn *c)
{
  for (int i = 0; c && i < p->max; i++)
    if (p->cached[i].c == c) {
      stmtcache_free(p->cached[i].sc);
      p->cached[i] = (struct cached){ NULL, NULL, 0 };
    }
}

/* Under mu: whether c is plain (see struct cached). */
static int is_plain(const struct dbpool *p, const PGconn *c)
{
  for (int i = 0; i < p->max; i++)
    if (p->cached[i].c == c)
      return p->cached[i].plain;
  return 0;
}

/* Under mu: c runs its statements unnamed from now on, and gets the whole reset. */
static void make_plain(struct dbpool *p, PGconn *c)
{
  forget_cache(p, c);
  for (int i = 0; i < p->max; i++)
    if (!p->cached[i].c) {
      p->cached[i] = (struct cached){ c, NULL, 1 };
      return;
    }
}

/* Outside mu: PQfinish with forget_cache. */
static void close_conn(struct dbpool *p, PGconn *c)
{
  pthread_mutex_lock(&p->mu);
  forget_cache(p, c);
  pthread_mutex_unlock(&p->mu);
  PQfinish(c);
}
