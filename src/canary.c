/* canary: follows the table's canary in each `leash run`. See canary.h. */
#include "canary.h"

#include "log.h"
#include "task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POLL_TIMEOUT_MS 10000

struct canary {
  struct canary_config cfg;
  pthread_t thread;
  pthread_mutex_t mu;            /* guards quit */
  pthread_cond_t cv;             /* CLOCK_MONOTONIC */
  int quit;
  PGconn *conn;
  char *poll_sql;
  long long active;              /* the canary the slots run, 0: none */
  int running;                   /* the last poll saw a running canary: poll often */
  int poked;                     /* under mu: poll now (canary_poke) */
  long long refused;             /* a canary whose text did not load here */
  int first;                     /* no poll answered yet */
  int down;                      /* the last poll failed (logged once) */
};

static void *canary_main(void *arg);
static void poll_once(struct canary *c);
static void adopt(struct canary *c, PGresult *r);
static void apply_decision(struct canary *c, PGresult *r);

int canary_picks(int64_t id, long long canary_id, int share)
{
  /* splitmix64's finaliser: ids are sequential, the choice must not be. */
  uint64_t x = (uint64_t)id ^ ((uint64_t)canary_id * 0x9e3779b97f4a7c15ULL);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return (int)(x % 100) < share;
}

struct canary *canary_start(const struct canary_config *cfg)
{
  struct canary *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->cfg = *cfg;
  c->first = 1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&c->thread, NULL, canary_main, c) != 0) {
    log_error("canary: cannot start the poll thread");
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    return NULL;
  }
  return c;
}

void canary_stop(struct canary *c)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->mu);
  c->quit = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thread, NULL);
  if (c->conn)
    PQfinish(c->conn);
  free(c->poll_sql);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

void canary_poke(struct canary *c)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->mu);
  c->poked = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static void *canary_main(void *arg)
{
  struct canary *c = arg;
  pthread_mutex_lock(&c->mu);
  while (!c->quit) {
    pthread_mutex_unlock(&c->mu);
    poll_once(c);
    pthread_mutex_lock(&c->mu);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double wait = c->running ? CANARY_POLL_S : CANARY_IDLE_POLL_S;
    long long ns = (long long)ts.tv_nsec + (long long)(wait * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    if (!c->quit && !c->poked)
      pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    c->poked = 0;
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* Columns of the poll's row, in this order. */
enum { C_ID, C_STATE, C_VERSION, C_SHARE, C_SCRIPT, C_REASON, C_BY, C_DECISION, C_NAME };

static void poll_once(struct canary *c)
{
  const struct canary_config *cfg = &c->cfg;
  char err[DB_ERR_MAX];
  if (!c->conn) {
    c->conn = db_connect(cfg->conninfo, "canary", POLL_TIMEOUT_MS, err, sizeof err);
    if (!c->conn) {
      if (!c->down)
        log_warn("canary: cannot poll the canary table (tries again): %s", err);
      c->down = 1;
      return;
    }
  }
  if (!c->poll_sql) {
    char *fn = db_table_object(cfg->table, c->conn, "canary_poll", 1);
    size_t n = fn ? strlen(fn) + 256 : 0;
    c->poll_sql = fn ? malloc(n) : NULL;
    if (c->poll_sql)
      snprintf(c->poll_sql, n,
               "SELECT id, state, version, share, script, decision->>'reason', decided_by, "
               "       decision::text, script_name FROM %s(true)", fn);
    free(fn);
    if (!c->poll_sql)
      return;
  }
  PGresult *r = db_exec(c->conn, c->poll_sql, 0, NULL, err, sizeof err);
  if (!r) {
    if (!c->down)
      log_warn("canary: poll failed (tries again): %s", err);
    c->down = 1;
    if (PQstatus(c->conn) != CONNECTION_OK) {
      PQfinish(c->conn);
      c->conn = NULL;
    }
    return;
  }
  c->down = 0;
  c->running = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, C_STATE), "running") == 0;
  if (PQntuples(r) == 1) {
    long long id = atoll(PQgetvalue(r, 0, C_ID));
    const char *state = PQgetvalue(r, 0, C_STATE);
    if (strcmp(state, "running") == 0 && id != c->active && id != c->refused)
      adopt(c, r);
    else if (strcmp(state, "running") != 0 && id == c->active)
      apply_decision(c, r);
    else if (strcmp(state, "running") != 0 && id == c->refused) {
      log_warn("canary %lld %s by %s (this process had refused it and keeps its version)", id,
               state, PQgetvalue(r, 0, C_BY));
      c->refused = 0;
    }
    else if (c->first && strcmp(state, "promoted") == 0) {
      /* A process started after a promotion runs its file: say so when they differ. */
      pthread_mutex_lock(cfg->mu);
      int same = strcmp(cfg->src->version, PQgetvalue(r, 0, C_VERSION)) == 0;
      pthread_mutex_unlock(cfg->mu);
      if (!same)
        log_warn("canary %lld promoted version %s (%s), but this process runs %s from its "
                 "file: deploy the promoted script", id, PQgetvalue(r, 0, C_VERSION),
                 PQgetvalue(r, 0, C_NAME), cfg->script_path);
    }
  }
  c->first = 0;
  PQclear(r);
}

/* A new running canary: probe, check the version, publish. */
static void adopt(struct canary *c, PGresult *r)
{
  const struct canary_config *cfg = &c->cfg;
  long long id = atoll(PQgetvalue(r, 0, C_ID));
  const char *want = PQgetvalue(r, 0, C_VERSION);
  int share = atoi(PQgetvalue(r, 0, C_SHARE));
  size_t len = (size_t)PQgetlength(r, 0, C_SCRIPT);
  char err[DB_ERR_MAX], current[SCRIPT_VERSION_LEN + 1];
  pthread_mutex_lock(cfg->mu);
  snprintf(current, sizeof current, "%s", cfg->src->version);
  pthread_mutex_unlock(cfg->mu);
  struct script *probe = reload_load_bounded(cfg->script_path, PQgetvalue(r, 0, C_SCRIPT), len,
                                             cfg->sh, cfg->load_limit, err, sizeof err);
  if (probe && strcmp(script_version(probe), want) != 0)
    snprintf(err, sizeof err, "it loads here as version %s (its modules differ from those "
             "beside %s): put the candidate beside the running script", script_version(probe),
             cfg->script_path);
  if (!probe || strcmp(script_version(probe), want) != 0) {
    log_error("canary %lld refused, slots keep version %s only: %s", id, current, err);
    script_free(probe);
    c->refused = id;
    return;
  }
  script_free(probe);
  char *text = malloc(len ? len : 1);
  if (!text)
    return;
  memcpy(text, PQgetvalue(r, 0, C_SCRIPT), len);
  pthread_mutex_lock(cfg->mu);
  free(cfg->src->canary_text);
  cfg->src->canary_text = text;
  cfg->src->canary_len = len;
  snprintf(cfg->src->canary_version, sizeof cfg->src->canary_version, "%s", want);
  cfg->src->canary_share = share;
  cfg->src->canary_id = id;
  cfg->src->canary_generation++;
  pthread_mutex_unlock(cfg->mu);
  atomic_store(&cfg->counters->canary_share, share);
  c->active = id;
  log_info("canary %lld: %d%% of tasks run version %s (%s) beside version %s", id, share, want,
           PQgetvalue(r, 0, C_NAME), current);
}

/* The canary this process runs was decided: one log line, then promote or drop. */
static void apply_decision(struct canary *c, PGresult *r)
{
  const struct canary_config *cfg = &c->cfg;
  long long id = atoll(PQgetvalue(r, 0, C_ID));
  const char *state = PQgetvalue(r, 0, C_STATE);
  int promoted = strcmp(state, "promoted") == 0;
  log_info("canary %lld %s by %s: %s; numbers %s", id, state, PQgetvalue(r, 0, C_BY),
           PQgetisnull(r, 0, C_REASON) ? "no verdict" : PQgetvalue(r, 0, C_REASON),
           PQgetisnull(r, 0, C_DECISION) ? "{}" : PQgetvalue(r, 0, C_DECISION));
  pthread_mutex_lock(cfg->mu);
  struct script_source *src = cfg->src;
  if (promoted) {
    /* The candidate becomes the current script, as a hot swap would publish it. */
    free(src->text);
    src->text = src->canary_text;
    src->len = src->canary_len;
    snprintf(src->version, sizeof src->version, "%s", src->canary_version);
    src->generation++;
  } else {
    free(src->canary_text);
  }
  src->canary_text = NULL;
  src->canary_len = 0;
  src->canary_share = 0;
  src->canary_id = 0;
  src->canary_version[0] = '\0';
  src->canary_generation++;
  pthread_mutex_unlock(cfg->mu);
  atomic_store(&cfg->counters->canary_share, 0);
  if (promoted)
    atomic_fetch_add(&cfg->counters->canary_promotions, 1);
  else if (strcmp(state, "rolled_back") == 0)
    atomic_fetch_add(&cfg->counters->canary_rollbacks, 1);
  c->active = 0;
}

char *canary_status_json(PGconn *c, const struct db_table *t, char *err, size_t errlen)
{
  char *tbl = db_table_object(t, c, "canaries", 1);
  char *fn = db_table_object(t, c, "canary_numbers", 1);
  char *sql = tbl && fn ? malloc(strlen(tbl) + strlen(fn) + 1024) : NULL;
  if (!sql) {
    snprintf(err, errlen, "out of memory");
    free(tbl);
    free(fn);
    return NULL;
  }
  sprintf(sql,
          "SELECT coalesce((SELECT jsonb_build_object('id', id, 'state', state, "
          "  'version', version, 'label', label, 'script_name', script_name, 'share', share, "
          "  'min_tasks', min_tasks, 'max_fatal_rate_delta', max_fail_delta, "
          "  'max_retry_rate_delta', max_retry_delta, 'auto_promote', auto_promote, "
          "  'started_at', started_at, 'started_by', started_by, 'decided_at', decided_at, "
          "  'decided_by', decided_by, 'given_back', given_back, "
          "  'numbers', CASE WHEN state = 'running' THEN %s(id) ELSE decision END) "
          "  FROM %s ORDER BY (state = 'running') DESC, id DESC LIMIT 1), 'null')::text",
          fn, tbl);
  free(tbl);
  free(fn);
  PGresult *r = db_exec(c, sql, 0, NULL, err, errlen);
  free(sql);
  char *out = r ? strdup(PQgetvalue(r, 0, 0)) : NULL;
  if (r && !out)
    snprintf(err, errlen, "out of memory");
  PQclear(r);
  return out;
}
