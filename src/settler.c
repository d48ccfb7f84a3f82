/* settler: the settle connection and its helper thread. See settler.h. */
#include "settler.h"

#include "log.h"
#include "signals.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SETTLE_STATEMENT_TIMEOUT_MS 5000
#define RECONNECT_MIN_S 0.1
#define RECONNECT_MAX_S 5.0

struct settler {
  char *conninfo;
  struct queue *q;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* CLOCK_MONOTONIC */
  /* Under mu. */
  int up;                     /* the connection is usable: settler_begin takes work */
  int quit;
  int busy;                   /* a job is set (until settler_end takes its answer) */
  int finished;               /* the job's answer is in */
  struct task *list;
  int n;
  char *applied;
  const struct queue_scope *scope;
  int chain;
  struct task *leased;        /* what the job's settle leased (queue_cycle's out) */
  int rc;
  char err[DB_ERR_MAX];
  /* Helper thread only. */
  PGconn *conn;
  double backoff;
};

static void *settler_main(void *arg);
static void run_job(struct settler *s);
static void reconnect(struct settler *s);
static void wait_until(struct settler *s, double seconds);

struct settler *settler_start(const char *conninfo, struct queue *q)
{
  struct settler *s = calloc(1, sizeof *s);
  if (!s || !(s->conninfo = strdup(conninfo))) {
    free(s);
    queue_free(q);
    return NULL;
  }
  s->q = q;
  s->backoff = RECONNECT_MIN_S;
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (signals_thread_create(&s->thread, settler_main, s) != 0) {
    log_warn("settle connection: cannot start its thread; outcomes go on the claim connection");
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->conninfo);
    queue_free(q);
    free(s);
    return NULL;
  }
  return s;
}

int settler_begin(struct settler *s, struct task *list, int n, char *applied,
                  const struct queue_scope *scope, int chain)
{
  pthread_mutex_lock(&s->mu);
  int ok = s->up && !s->busy && !s->quit;
  if (ok) {
    s->busy = 1;
    s->finished = 0;
    s->list = list;
    s->n = n;
    s->applied = applied;
    s->scope = scope;
    s->chain = chain;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return ok ? 0 : -1;
}

int settler_end(struct settler *s, struct task **leased, char *err, size_t errlen)
{
  pthread_mutex_lock(&s->mu);
  while (!s->finished)
    pthread_cond_wait(&s->cv, &s->mu);
  int rc = s->rc;
  *leased = s->leased;
  s->leased = NULL;
  if (rc < 0)
    snprintf(err, errlen, "%s", s->err);
  s->busy = 0;
  s->finished = 0;
  s->list = NULL;
  s->applied = NULL;
  pthread_mutex_unlock(&s->mu);
  return rc < 0 ? -1 : 0;
}

void settler_stop(struct settler *s)
{
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  s->quit = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  PQfinish(s->conn);
  queue_free(s->q);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->conninfo);
  free(s);
}

/* Waits for a job (or quit); keeps the connection up between jobs. A job set while the
   connection is up always runs here, even when quit comes meanwhile: settler_end waits for
   its answer. */
static void *settler_main(void *arg)
{
  struct settler *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (s->busy && !s->finished) {
      pthread_mutex_unlock(&s->mu);
      run_job(s);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    if (s->quit)
      break;
    if (!s->up) {
      pthread_mutex_unlock(&s->mu);
      reconnect(s);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    pthread_cond_wait(&s->cv, &s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* The settle of the job's outcomes, claiming nothing. */
static void run_job(struct settler *s)
{
  struct task *leased = NULL;
  double due;
  char err[DB_ERR_MAX] = "";
  int rc = queue_cycle(s->q, s->conn, s->list, s->n, s->applied, s->scope, 0, s->chain,
                       &leased, &due, err, sizeof err);
  int up = PQstatus(s->conn) == CONNECTION_OK;
  pthread_mutex_lock(&s->mu);
  s->rc = rc;
  s->leased = leased;
  if (rc < 0)
    snprintf(s->err, sizeof s->err, "%s", err);
  s->up = up;
  s->finished = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* One attempt, then a wait of capped, doubling backoff before the next (quit ends it). */
static void reconnect(struct settler *s)
{
  PQfinish(s->conn);
  char err[DB_ERR_MAX];
  s->conn = db_connect(s->conninfo, "settle", SETTLE_STATEMENT_TIMEOUT_MS, err, sizeof err);
  if (s->conn) {
    s->backoff = RECONNECT_MIN_S;
    pthread_mutex_lock(&s->mu);
    s->up = 1;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  log_warn("settle connection: %s; outcomes go on the claim connection meanwhile", err);
  double wait = s->backoff;
  s->backoff = s->backoff * 2 > RECONNECT_MAX_S ? RECONNECT_MAX_S : s->backoff * 2;
  wait_until(s, wait);
}

/* Sleeps up to seconds, or until quit. */
static void wait_until(struct settler *s, double seconds)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long long ns = (long long)ts.tv_nsec + (long long)(seconds * 1e9);
  ts.tv_sec += (time_t)(ns / 1000000000LL);
  ts.tv_nsec = (long)(ns % 1000000000LL);
  pthread_mutex_lock(&s->mu);
  if (!s->quit)
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  pthread_mutex_unlock(&s->mu);
}
