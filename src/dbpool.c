/* dbpool: a small shared set of connections. See dbpool.h. */
#include "dbpool.h"

#include "db.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct dbpool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  char *conninfo;
  int max, open, timeout_ms;
  PGconn **idle;
  int nidle;
};

struct dbpool *dbpool_new(const char *conninfo, int max, int statement_timeout_ms)
{
  struct dbpool *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->idle = calloc((size_t)max, sizeof *p->idle);
  p->conninfo = conninfo ? strdup(conninfo) : NULL;
  if (!p->idle || (conninfo && !p->conninfo)) {
    free(p->idle);
    free(p->conninfo);
    free(p);
    return NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->max = max;
  p->timeout_ms = statement_timeout_ms;
  return p;
}

void dbpool_free(struct dbpool *p)
{
  if (!p)
    return;
  for (int i = 0; i < p->nidle; i++)
    PQfinish(p->idle[i]);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->idle);
  free(p->conninfo);
  free(p);
}

PGconn *dbpool_get(struct dbpool *p, char *err, size_t errlen)
{
  pthread_mutex_lock(&p->mu);
  while (p->nidle == 0 && p->open >= p->max)
    pthread_cond_wait(&p->cv, &p->mu);
  if (p->nidle > 0) {
    PGconn *c = p->idle[--p->nidle];
    pthread_mutex_unlock(&p->mu);
    return c;
  }
  p->open++;   /* reserve the place, connect outside the lock */
  pthread_mutex_unlock(&p->mu);
  PGconn *c = db_connect(p->conninfo, "script", p->timeout_ms, err, errlen);
  if (!c) {
    pthread_mutex_lock(&p->mu);
    p->open--;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  return c;
}

void dbpool_put(struct dbpool *p, PGconn *c)
{
  /* A script may have sent BEGIN; the next user must not inherit its transaction. */
  if (c && PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) != PQTRANS_IDLE) {
    char err[DB_ERR_MAX];
    db_command(c, "ROLLBACK", err, sizeof err);
  }
  pthread_mutex_lock(&p->mu);
  if (c && PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) == PQTRANS_IDLE) {
    p->idle[p->nidle++] = c;
  } else {
    PQfinish(c);
    p->open--;
  }
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}
