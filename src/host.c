/* host: `leash run`'s set-up and tear-down, and the callbacks through which the other
   threads reach the host's state. The dispatcher is dispatch.c, a slot slot.c, the lease
   thread lease.c, the signal thread signals.c, the watchdog watchdog.c, hot swap reload.c,
   the HTTP endpoint metrics.c. See host.h and docs/ARCHITECTURE.md ("The host"). */
#include "host.h"

#include "dbpool.h"
#include "dispatch.h"
#include "host_internal.h"
#include "canary.h"
#include "log.h"
#include "signals.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(HOST_EXIT_WEDGED == WATCHDOG_EXIT_WEDGED, "one exit code for a wedge");

/* The threads besides the dispatcher and the slots; NULL when not started. */
struct threads {
  struct signals *signals;
  struct lease *lease;
  struct watchdog *watchdog;
  struct metrics *metrics;
  struct canary *canary;
  struct llm_batch *llm_batch;
};

static void host_init(struct host *h, const struct host_config *cfg);
static void host_destroy(struct host *h);
static int load_probe(struct host *h);
static int connect_scripts_db(struct host *h, struct dispatcher *d,
                              struct queue_script_sql *sql);
static int start_threads(struct host *h, struct threads *th);
static void log_summary(const struct host *h);
static void on_lost(void *arg, struct task *t, const char *why);
static void on_work(void *arg);
static void on_canary(void *arg);
static void on_drain(void *arg);
static void on_reload(void *arg);
static void on_wedged(void *arg, struct task *t, int settle, const char *why);
static void on_gauges(void *arg, struct metrics_gauges *g);

int host_run(const struct host_config *cfg)
{
  /* Static, as the statements below: a refused version's setup stuck in C keeps pointers to
     h.sh after this returns (reload.h), and what is left for it must stay reachable. */
  static struct host h;
  static struct queue_script_sql script_sql;
  struct threads th = { 0 };
  struct dispatcher *d = NULL;
  int rc = 1;

  host_init(&h, cfg);
  script_sql = (struct queue_script_sql){ 0 };
  /* Fail fast: a script that does not load, or a table not migrated, stops us at start. */
  if (!h.leases || !h.watch || load_probe(&h) != 0)
    goto out;
  d = dispatcher_new(&h);
  if (!d) {
    log_error("out of memory starting the host");
    goto out;
  }
  if (connect_scripts_db(&h, d, &script_sql) != 0)
    goto out;
  /* Signals go to one thread that only sets flags; every other thread blocks them. */
  th.signals = signals_start(&(struct signal_handlers){ on_drain, on_reload, &h });
  if (!th.signals) {
    log_error("cannot start the signal thread");
    goto out;
  }

  if (dispatcher_start_slots(d) == 0 && start_threads(&h, &th) == 0) {
    atomic_store(&h.stats.ready, 1);
    log_info("worker %s running %d slot%s on %s", cfg->worker_id, cfg->concurrency,
             cfg->concurrency == 1 ? "" : "s", cfg->table);
    rc = dispatcher_run(d);
  }
  /* Shut down: slots first (they may still be finishing aborted tasks), then the rest. */
  dispatcher_stop_slots(d);
  pthread_mutex_lock(&h.mu);
  h.canary = NULL;
  pthread_mutex_unlock(&h.mu);
  canary_stop(th.canary);
  llm_batch_stop(th.llm_batch);
  watchdog_stop(th.watchdog);
  lease_stop(th.lease);
  metrics_stop(th.metrics);
  log_summary(&h);
out:
  signals_stop(th.signals);
  reload_stop(h.reload);
  /* A refused version's setup still stuck in C may yet reach the pool and the statements
     if it ever returns: the process is about to exit, so leave them (see reload.h). */
  if (reload_loaders_stuck() == 0) {
    queue_script_sql_free(&script_sql);
    dbpool_free(h.sh.pool);
  }
  dispatcher_free(d);
  host_destroy(&h);
  return rc;
}

static void host_init(struct host *h, const struct host_config *cfg)
{
  *h = (struct host){ .cfg = cfg };
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  pthread_mutex_init(&h->wake_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->wake_cv, &ca);   /* leash.sleep waits on the monotonic clock */
  pthread_condattr_destroy(&ca);
  atomic_init(&h->stopping, 0);
  metrics_counters_init(&h->stats);
  h->sh = (struct script_host){
    .worker_id = cfg->worker_id, .stopping = &h->stopping, .wake_mu = &h->wake_mu,
    .wake_cv = &h->wake_cv, .task_timeout = cfg->task_timeout, .memory_limit = cfg->lua_memory,
    .lua_path = cfg->lua_path, .nlua_path = cfg->nlua_path, .tenants = cfg->tenants,
    .ntenants = cfg->ntenants, .max_result_bytes = cfg->max_result_bytes,
    .budget_wait_s = cfg->budget_wait, .stats = &h->stats,
  };
  h->leases = lease_registry_new();
  h->watch = calloc((size_t)cfg->concurrency, sizeof *h->watch);
  h->nwatch = cfg->concurrency;
  if (!h->leases || !h->watch)
    log_error("out of memory starting the host");
}

static void host_destroy(struct host *h)
{
  lease_registry_free(h->leases);
  free(h->src.text);
  free(h->src.canary_text);
  free(h->watch);
  db_table_free(&h->table);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  pthread_mutex_destroy(&h->wake_mu);
  pthread_cond_destroy(&h->wake_cv);
}

/* Reads the script and loads it once. On a thread of its own with a deadline: a setup
   wedged in one C call must not hang the start (the hook in script.c cannot stop it). */
static int load_probe(struct host *h)
{
  const struct host_config *cfg = h->cfg;
  char err[DB_ERR_MAX];
  struct script *probe = NULL;
  h->src.text = script_read_file(cfg->script_path, &h->src.len, err, sizeof err);
  if (h->src.text)
    probe = reload_load_bounded(cfg->script_path, h->src.text, h->src.len, &h->sh,
                                host_load_limit(h), err, sizeof err);
  if (!probe) {
    log_error("cannot load %s: %s", cfg->script_path, err);
    return -1;
  }
  log_info("loaded %s version %s", cfg->script_path, script_version(probe));
  snprintf(h->src.version, sizeof h->src.version, "%s", script_version(probe));
  script_free(probe);
  return 0;
}

/* The claim connection (the table checked), and what scripts' leash.* calls use: the
   prepared statements and the query pool. 0, or -1 (logged). */
static int connect_scripts_db(struct host *h, struct dispatcher *d,
                              struct queue_script_sql *sql)
{
  const struct host_config *cfg = h->cfg;
  char err[DB_ERR_MAX];
  if (dispatcher_connect(d, err, sizeof err) != 0) {
    log_error("%s", err);
    return -1;
  }
  if (queue_script_sql_init(sql, dispatcher_conn(d), &h->table) != 0) {
    log_error("out of memory starting the host");
    return -1;
  }
  h->sh.sql = sql;
  h->sh.table = h->table.qualified;
  /* A script's query cannot outlive --task-timeout (the count hook cannot stop C code). */
  h->sh.pool = dbpool_new(cfg->conninfo, cfg->db_pool,
                          cfg->task_timeout > 0 ? (int)ceil(cfg->task_timeout * 1000) : 0);
  if (!h->sh.pool) {
    log_error("out of memory starting the host");
    return -1;
  }
  return 0;
}

/* The lease thread, the watchdog, hot swap and (with --metrics) the endpoint, once the slots
   run. 0, or -1 (logged) when one cannot start; those started are stopped by the caller. */
static int start_threads(struct host *h, struct threads *th)
{
  const struct host_config *cfg = h->cfg;
  th->lease = lease_start(&(struct lease_config){
    .conninfo = cfg->conninfo, .table = &h->table, .worker_id = cfg->worker_id,
    .visibility = cfg->visibility, .heartbeat = cfg->heartbeat,
    .sample_depth = cfg->metrics_addr != NULL, .registry = h->leases, .counters = &h->stats,
    .on_lost = on_lost, .on_work = on_work, .on_canary = on_canary, .arg = h,
  });
  th->watchdog = watchdog_start(&(struct watchdog_config){
    .mu = &h->mu, .watch = h->watch, .nwatch = h->nwatch, .draining = &h->draining,
    .stopping = &h->stopping, .registry = h->leases, .task_timeout = cfg->task_timeout,
    .grace = cfg->watchdog_grace, .worker_id = cfg->worker_id, .on_wedged = on_wedged,
    .arg = h,
  });
  struct reload *r = reload_start(&(struct reload_config){
    .script_path = cfg->script_path, .lua_path = cfg->lua_path, .nlua_path = cfg->nlua_path,
    .sh = &h->sh, .load_limit = host_load_limit(h), .mu = &h->mu, .src = &h->src,
    .counters = &h->stats,
  });
  th->canary = canary_start(&(struct canary_config){
    .conninfo = cfg->conninfo, .table = &h->table, .script_path = cfg->script_path,
    .sh = &h->sh, .load_limit = host_load_limit(h), .mu = &h->mu, .src = &h->src,
    .counters = &h->stats,
  });
  th->llm_batch = llm_batch_start(&(struct llm_batch_config){
    .conninfo = cfg->conninfo, .table = &h->table, .worker_id = cfg->worker_id,
    .opt = cfg->llm_batch,
  });
  pthread_mutex_lock(&h->mu);   /* the signal thread reads h->reload under mu */
  h->reload = r;
  h->canary = th->canary;
  pthread_mutex_unlock(&h->mu);
  if (cfg->metrics_addr && th->lease && r) {
    char err[DB_ERR_MAX];
    th->metrics = metrics_start(cfg->metrics_addr, &h->stats, on_gauges, h, err, sizeof err);
    if (!th->metrics)
      log_error("%s", err);
  }
  return th->lease && th->watchdog && r && th->canary && (th->metrics || !cfg->metrics_addr)
             ? 0 : -1;
}

static void log_summary(const struct host *h)
{
  struct metrics_counters *c = (struct metrics_counters *)&h->stats;
  log_info("worker %s stopped: %lld claimed, %lld done, %lld retried, %lld dead, %lld lost, "
           "%lld late outcomes rejected", h->cfg->worker_id, atomic_load(&c->claimed),
           atomic_load(&c->done), atomic_load(&c->retried), metrics_dead_total(c),
           atomic_load(&c->lost), atomic_load(&c->late));
}

/* ---- what the other threads call (each names the thread it runs on) ---- */

/* Lease thread, under the registry's lock. */
static void on_lost(void *arg, struct task *t, const char *why)
{
  dispatch_lose_lease(arg, t, why);
}

/* Lease thread: a NOTIFY, a reap or a reconnect; the dispatcher looks for work. */
static void on_work(void *arg)
{
  struct host *h = arg;
  pthread_mutex_lock(&h->mu);
  h->wake = 1;
  pthread_cond_signal(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

/* Lease thread: `leash canary` changed the canary; its thread polls now (lock order: mu,
   then the canary's own). */
static void on_canary(void *arg)
{
  struct host *h = arg;
  pthread_mutex_lock(&h->mu);
  canary_poke(h->canary);
  pthread_mutex_unlock(&h->mu);
}

/* Signal thread: the first SIGTERM/SIGINT. */
static void on_drain(void *arg)
{
  struct host *h = arg;
  pthread_mutex_lock(&h->mu);
  h->draining = 1;
  atomic_store(&h->stats.ready, 0);
  pthread_cond_signal(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

/* Signal thread: SIGHUP. */
static void on_reload(void *arg)
{
  struct host *h = arg;
  pthread_mutex_lock(&h->mu);
  if (h->reload)
    reload_request(h->reload);
  pthread_mutex_unlock(&h->mu);
}

/* Watchdog thread, under h->mu: the dispatcher's next turn settles and exits. */
static void on_wedged(void *arg, struct task *t, int settle, const char *why)
{
  struct host *h = arg;
  h->wedged = 1;
  h->wedged_task = t;
  h->wedged_settle = settle;
  snprintf(h->wedged_why, sizeof h->wedged_why, "%s", why);
  pthread_cond_signal(&h->cv);
}

/* The metrics HTTP thread, at each scrape. */
static void on_gauges(void *arg, struct metrics_gauges *g)
{
  struct host *h = arg;
  g->slots = h->cfg->concurrency;
  g->leases_held = lease_registry_count(h->leases);
  pthread_mutex_lock(&h->mu);
  memcpy(g->script_version, h->src.version, sizeof g->script_version);
  g->wedged = h->wedged;
  pthread_mutex_unlock(&h->mu);
}
