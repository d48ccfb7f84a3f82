/* host: the dispatcher and the slots (the signal thread is signals.c). See host.h. */
#include "host.h"

#include "dbpool.h"
#include "host_internal.h"
#include "lifecycle.h"
#include "lease.h"
#include "log.h"
#include "migrate.h"
#include "reload.h"
#include "report.h"
#include "script.h"
#include "signals.h"
#include "watchdog.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLAIM_TIMEOUT_MS 5000
#define RECONNECT_MAX_S 5.0
#define START_WAIT_S 60.0
#define EMPTY_RECHECK_MIN_S 0.01
#define SLOT_STACK (512 * 1024)
#define PROGRESS_EVERY_S 10.0
#define IDLE_POLL_MAX_S 5.0

struct slot {
  struct host *h;
  struct dispatcher *d;
  int index;
  pthread_t thread;
  pthread_cond_t cv;            /* a task was handed over, or quit */
  struct task *task;            /* guarded by h->mu */
  struct script *script;        /* owned by the slot's thread */
  unsigned generation;          /* script generation loaded */
};

/* Dispatcher-side state (the calling thread), plus what slots hand back under h->mu. */
struct dispatcher {
  struct host *h;
  struct slot *slots;
  struct slot **idle;
  int nidle;
  struct task *done, **done_tail;   /* finished, waiting to be settled */
  struct task *ready, **ready_tail; /* claimed, not started: slots take them directly */
  int nready;
  int quit;                         /* slots exit */
  PGconn *conn;
  struct queue *q;
  double backoff;
  double drain_deadline;            /* monotonic; 0 until draining */
  double avg_rtt, avg_duration;     /* moving averages (s): cycle round trip, task run time */
  double next_due;                  /* from the last short claim: s until a row is due, or -1 */
};

static void *slot_main(void *arg);
static void slot_close_script(struct slot *s, struct script *script);
static int dispatch(struct dispatcher *d);
static int connect_at_start(struct dispatcher *d, char *err, size_t errlen);
static int ensure_connection(struct dispatcher *d);
static double next_backoff(struct dispatcher *d);
static void connection_failed(struct dispatcher *d, const char *what, const char *err);
static int cycle(struct dispatcher *d, struct task *list, int want);
static int ready_target(const struct dispatcher *d);
static int held_now(struct host *h);
static long long log_progress(struct dispatcher *d, long long before);
static void distribute(struct dispatcher *d, struct task *list);
static void release_ready(struct dispatcher *d);
static int must_give_up(struct dispatcher *d);
static void settle_one_by_one(struct dispatcher *d, struct task *list);
static int settle_alone(struct dispatcher *d, struct task *t, char *applied, char *err,
                        size_t errlen);
static void finish_task(struct dispatcher *d, struct task *t, int applied);
static void held_add(struct host *h, struct task *t);
static void held_remove(struct host *h, struct task *t);
static void release_running(struct dispatcher *d);
static void wedge_exit(struct dispatcher *d) __attribute__((noreturn));
static double jitter_poll(const struct host_config *cfg);
static double next_idle_poll(const struct host_config *cfg, double current, int empty);
static void log_task(enum log_level lvl, const struct host *h, const struct task *t,
                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));

int host_run(const struct host_config *cfg)
{
  /* Static, as the statements below: a refused version's setup stuck in C keeps pointers to
     h.sh after this returns (reload.h), and what is left for it must stay reachable. */
  static struct host h;
  static struct queue_script_sql script_sql;
  h = (struct host){ .cfg = cfg };
  script_sql = (struct queue_script_sql){ 0 };
  struct dispatcher d = { .h = &h, .backoff = 0.1 };
  struct lease *lease = NULL;
  struct metrics *metrics = NULL;
  struct watchdog *watchdog = NULL;
  struct signals *signals = NULL;
  int rc = 1, started = 0;
  char err[DB_ERR_MAX];
  pthread_condattr_t ca;

  pthread_mutex_init(&h.mu, NULL);
  pthread_cond_init(&h.cv, NULL);
  pthread_mutex_init(&h.wake_mu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h.wake_cv, &ca);
  atomic_init(&h.stopping, 0);
  metrics_counters_init(&h.stats);
  d.done_tail = &d.done;
  d.ready_tail = &d.ready;
  d.next_due = -1;
  h.sh = (struct script_host){
    .worker_id = cfg->worker_id, .stopping = &h.stopping, .wake_mu = &h.wake_mu,
    .wake_cv = &h.wake_cv, .task_timeout = cfg->task_timeout, .memory_limit = cfg->lua_memory,
    .lua_path = cfg->lua_path, .nlua_path = cfg->nlua_path, .tenants = cfg->tenants,
    .ntenants = cfg->ntenants, .max_result_bytes = cfg->max_result_bytes,
  };

  /* Fail fast: a script that does not load, or a table not migrated, stops us at start. */
  struct script *probe = NULL;
  h.script_text = script_read_file(cfg->script_path, &h.script_len, err, sizeof err);
  /* On a thread of its own with a deadline: a setup wedged in one C call must not hang the
     start (the hook in script.c cannot stop it). */
  if (h.script_text)
    probe = reload_load_bounded(cfg->script_path, h.script_text, h.script_len, &h.sh,
                                host_load_limit(&h), err, sizeof err);
  if (!probe) {
    log_error("cannot load %s: %s", cfg->script_path, err);
    goto out;
  }
  log_info("loaded %s version %s", cfg->script_path, script_version(probe));
  snprintf(h.version, sizeof h.version, "%s", script_version(probe));
  script_free(probe);
  if (connect_at_start(&d, err, sizeof err) != 0) {
    log_error("%s", err);
    goto out;
  }
  d.q = queue_new(d.conn, &h.table, cfg->worker_id, cfg->visibility);
  if (queue_script_sql_init(&script_sql, d.conn, &h.table) != 0) {
    log_error("out of memory starting the host");
    goto out;
  }
  h.sh.sql = &script_sql;
  h.sh.table = h.table.qualified;
  /* A script's query cannot outlive --task-timeout (the count hook cannot stop C code). */
  h.sh.pool = dbpool_new(cfg->conninfo, cfg->db_pool,
                         cfg->task_timeout > 0 ? (int)ceil(cfg->task_timeout * 1000) : 0);
  d.slots = calloc((size_t)cfg->concurrency, sizeof *d.slots);
  d.idle = calloc((size_t)cfg->concurrency, sizeof *d.idle);
  h.watch = calloc((size_t)cfg->concurrency, sizeof *h.watch);
  h.nwatch = cfg->concurrency;
  if (!d.q || !h.sh.pool || !d.slots || !d.idle || !h.watch) {
    log_error("out of memory starting the host");
    goto out;
  }

  /* Signals go to one thread that only sets flags; every other thread blocks them. */
  signals = signals_start(&h);
  if (!signals) {
    log_error("cannot start the signal thread");
    goto out;
  }

  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, SLOT_STACK);
  for (; started < cfg->concurrency; started++) {
    struct slot *s = &d.slots[started];
    s->h = &h;
    s->d = &d;
    s->index = started;
    pthread_cond_init(&s->cv, NULL);
    s->script = reload_load_bounded(cfg->script_path, h.script_text, h.script_len, &h.sh,
                                    host_load_limit(&h), err, sizeof err);
    if (!s->script || pthread_create(&s->thread, &attr, slot_main, s) != 0) {
      log_error("cannot start slot %d: %s", started, s->script ? "thread" : err);
      script_free(s->script);
      pthread_cond_destroy(&s->cv);
      break;
    }
    d.idle[d.nidle++] = s;
  }
  pthread_attr_destroy(&attr);
  if (started == cfg->concurrency) {
    lease = lease_start(&h);
    watchdog = watchdog_start(&h);
    struct reload *r = reload_start(&h);
    pthread_mutex_lock(&h.mu);   /* the signal thread reads h.reload under mu */
    h.reload = r;
    pthread_mutex_unlock(&h.mu);
    if (cfg->metrics_addr && lease && h.reload) {
      metrics = metrics_start(cfg->metrics_addr, &h, err, sizeof err);
      if (!metrics)
        log_error("%s", err);
    }
    if (lease && watchdog && h.reload && (metrics || !cfg->metrics_addr)) {
      atomic_store(&h.stats.ready, 1);
      log_info("worker %s running %d slot%s on %s", cfg->worker_id, cfg->concurrency,
               cfg->concurrency == 1 ? "" : "s", cfg->table);
      rc = dispatch(&d);
    }
  }

  /* Shut down: slots first (they may still be finishing aborted tasks), then the rest. */
  pthread_mutex_lock(&h.mu);
  d.quit = 1;
  for (int i = 0; i < started; i++)
    pthread_cond_signal(&d.slots[i].cv);
  pthread_mutex_unlock(&h.mu);
  for (int i = 0; i < started; i++) {
    pthread_join(d.slots[i].thread, NULL);
    script_free(d.slots[i].script);
    pthread_cond_destroy(&d.slots[i].cv);
  }
  watchdog_stop(watchdog);
  lease_stop(lease);
  metrics_stop(metrics);
  log_info("worker %s stopped: %lld claimed, %lld done, %lld retried, %lld dead, %lld lost, "
           "%lld late outcomes rejected", cfg->worker_id, atomic_load(&h.stats.claimed),
           atomic_load(&h.stats.done), atomic_load(&h.stats.retried),
           metrics_dead_total(&h.stats), atomic_load(&h.stats.lost), atomic_load(&h.stats.late));
out:
  signals_stop(signals);
  reload_stop(h.reload);
  while (d.done) {
    struct task *t = d.done;
    d.done = t->next;
    task_free(t);
  }
  free(h.held);
  free(h.script_text);
  free(h.watch);
  free(d.slots);
  free(d.idle);
  queue_free(d.q);
  /* A refused version's setup still stuck in C may yet reach the pool and the statements
     if it ever returns: the process is about to exit, so leave them (see reload.h). */
  if (reload_loaders_stuck() == 0) {
    queue_script_sql_free(&script_sql);
    dbpool_free(h.sh.pool);
  }
  PQfinish(d.conn);
  db_table_free(&h.table);
  pthread_mutex_destroy(&h.mu);
  pthread_cond_destroy(&h.cv);
  pthread_mutex_destroy(&h.wake_mu);
  pthread_cond_destroy(&h.wake_cv);
  pthread_condattr_destroy(&ca);
  return rc;
}

void host_lose_lease(struct host *h, struct task *t, const char *why)
{
  if (atomic_exchange(&t->lost, 1))
    return;
  log_task(LOG_WARN, h, t, "lease lost: %s; the outcome will be discarded", why);
  pthread_mutex_lock(&h->wake_mu);
  pthread_cond_broadcast(&h->wake_cv);
  pthread_mutex_unlock(&h->wake_mu);
}

void host_wake(struct host *h)
{
  pthread_mutex_lock(&h->mu);
  h->wake = 1;
  pthread_cond_signal(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

/* The dispatcher loop. Each cycle is one round trip: the outcomes that finished since the
   last one, and a claim for the idle slots plus a small local buffer, in one transaction.
   Otherwise it waits for a slot to finish, a notification or the next poll. Returns the
   exit code. */
static int dispatch(struct dispatcher *d)
{
  struct host *h = d->h;
  const struct host_config *cfg = h->cfg;
  double next_poll = 0, next_empty_check = 0, next_progress = task_now() + PROGRESS_EVERY_S;
  long long progress_settled = 0;
  int more = 1;   /* the last claim was full: more work is likely waiting */
  double idle_poll = 0;   /* grows while claims come back empty; see next_idle_poll */
  /* --until-empty, while the scope is open only through other workers' leases: look again
     soon (they are likely about to settle) and less often the longer it lasts, up to the
     normal poll. Without it, the last workers of a drain idled up to --poll-ms each. */
  double empty_wait = EMPTY_RECHECK_MIN_S;
  int released = 0;

  for (;;) {
    pthread_mutex_lock(&h->mu);
    if (h->wedged) {
      pthread_mutex_unlock(&h->mu);
      wedge_exit(d);
    }
    struct task *finished = d->done;
    d->done = NULL;
    d->done_tail = &d->done;
    int idle = d->nidle, nready = d->nready, woken = h->wake, draining = h->draining;
    int nheld = h->nheld;
    h->wake = 0;
    pthread_mutex_unlock(&h->mu);
    double now = task_now();
    int want = 0;   /* tasks to claim: idle slots plus the ready buffer's shortfall */
    if (now >= next_progress) {
      next_progress = now + PROGRESS_EVERY_S;
      progress_settled = log_progress(d, progress_settled);
    }

    if (draining) {
      if (d->drain_deadline == 0) {
        d->drain_deadline = now + cfg->drain_timeout;
        log_info("draining: %d task%s running, up to %.0f s", nheld - nready,
                 nheld - nready == 1 ? "" : "s", cfg->drain_timeout);
      }
      if (nready > 0) {
        release_ready(d);
        continue;
      }
      if (finished) {
        cycle(d, finished, 0);
        continue;
      }
      if (nheld == 0)
        return 0;
      if (now >= d->drain_deadline && !released) {
        release_running(d);
        released = 1;
        continue;
      }
    } else {
      want = idle + ready_target(d) - nready;
      if (want > cfg->claim_batch)
        want = cfg->claim_batch;
      int claim_now = want > 0 && (more || woken || finished || now >= next_poll);
      if (finished || claim_now) {
        int got = cycle(d, finished, claim_now ? want : 0);
        if (claim_now && got >= 0) {
          more = got == want;
          if (got > 0 || woken)
            idle_poll = 0;
          if (!more) {
            /* Only a poll nothing triggered backs off: an empty claim made because a slot
               finished says nothing about how idle the queue is. */
            idle_poll = next_idle_poll(cfg, idle_poll, got == 0 && !finished);
            next_poll = now + idle_poll;
            /* A row due sooner (a retry's backoff, a --delay) is claimed when it is due. */
            if (d->next_due >= 0 && now + d->next_due + 0.002 < next_poll)
              next_poll = now + d->next_due + 0.002;
          }
        }
        if (claim_now && got == 0 && cfg->until_empty && now >= next_empty_check &&
            held_now(h) == 0) {
          char err[DB_ERR_MAX];
          int open = queue_scope_open(d->q, d->conn, &cfg->scope, err, sizeof err);
          if (open == 0) {
            log_info("queue empty for this scope: exiting (--until-empty)");
            /* The scope has settled: its report goes to stdout (logs are on stderr). */
            if (report_print(d->conn, &h->table, cfg->scope.tenants, cfg->scope.batch, 0,
                             stdout, err, sizeof err) != 0)
              log_warn("report: %s", err);
            fflush(stdout);
            return 0;
          }
          if (open < 0)
            connection_failed(d, "until-empty check", err);
          next_empty_check = now + empty_wait;
          if (next_empty_check < next_poll)
            next_poll = next_empty_check;
          empty_wait *= 2;
          if (empty_wait > (double)cfg->poll_min_ms / 1000.0)
            empty_wait = (double)cfg->poll_min_ms / 1000.0;
        }
        if (got > 0)
          empty_wait = EMPTY_RECHECK_MIN_S;
        if (got > 0 || finished)
          continue;
      }
    }

    /* Nothing to do right now: wait for a slot to finish, a wake-up or the next deadline.
       The poll is a deadline only while there is room to claim into: with every slot busy
       and the buffer full, a poll time already past would make this loop spin until a slot
       finished (it did: a third of a one-row worker's CPU went to clock_gettime). */
    double until = want > 0 && next_poll < next_progress ? next_poll : next_progress;
    if (draining)
      until = released ? now + 0.1 : d->drain_deadline;
    pthread_mutex_lock(&h->mu);
    if (!d->done && !h->wake && !h->wedged && h->draining == draining && d->nidle == idle) {
      struct timespec ts;
      double wait = until - task_now();
      if (wait > 0) {
        clock_gettime(CLOCK_REALTIME, &ts);
        double whole = floor(wait);
        ts.tv_sec += (time_t)whole;
        ts.tv_nsec += (long)((wait - whole) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
          ts.tv_sec++;
          ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
      }
    }
    pthread_mutex_unlock(&h->mu);
  }
}

/* One compact line every PROGRESS_EVERY_S while tasks settle; returns the settled count. */
static long long log_progress(struct dispatcher *d, long long before)
{
  struct metrics_counters *c = &d->h->stats;
  long long done = atomic_load(&c->done), retried = atomic_load(&c->retried);
  long long dead = metrics_dead_total(c), settled = done + retried + dead;
  if (settled == before)
    return settled;
  pthread_mutex_lock(&d->h->mu);
  int held = d->h->nheld;
  pthread_mutex_unlock(&d->h->mu);
  log_info("progress: %lld done, %lld retried, %lld dead, %lld lost; %.1f tasks/s; "
           "%d/%d slots busy, %d leases held", done, retried, dead,
           (long long)atomic_load(&c->lost), (double)(settled - before) / PROGRESS_EVERY_S,
           atomic_load(&c->busy_slots), d->h->cfg->concurrency, held);
  return settled;
}

/* How many claimed-but-not-started tasks to keep so slots never wait for a round trip:
   enough for what the slots finish during two round trips, from the measured task duration
   and round-trip time (0 for long tasks, where a buffered task would only wait). */
static int ready_target(const struct dispatcher *d)
{
  if (d->avg_duration <= 0 || d->avg_rtt <= 0)
    return 0;
  double x = 2.0 * d->h->cfg->concurrency * d->avg_rtt / d->avg_duration;
  if (x < 1)
    return 0;
  return x > d->h->cfg->claim_batch ? d->h->cfg->claim_batch : (int)ceil(x);
}

/* The claim connection and the table check at start. A database that is away or restarting
   (a failover, a pod scheduled before its database) is waited for, up to START_WAIT_S, as
   after start; a wrong password, a missing database or an unmigrated table fail at once. */
static int connect_at_start(struct dispatcher *d, char *err, size_t errlen)
{
  struct host *h = d->h;
  double give_up = task_now() + START_WAIT_S;
  for (;;) {
    d->conn = db_connect(h->cfg->conninfo, "claim", CLAIM_TIMEOUT_MS, err, errlen);
    if (d->conn) {
      if (!h->table.qualified &&
          db_table_init(&h->table, d->conn, h->cfg->table, err, errlen) != 0)
        return -1;   /* a bad name or no memory: no database error, nothing to wait for */
      if (migrate_check(d->conn, &h->table, err, errlen) == 0)
        return 0;
    }
    if (!db_last_error_transient() || task_now() >= give_up)
      return -1;
    PQfinish(d->conn);
    d->conn = NULL;
    double wait = next_backoff(d);
    log_warn("%s; retrying in %.1f s", err, wait);
    usleep((useconds_t)(wait * 1e6));
  }
}

/* 1 when the claim connection is usable; else reconnects, waiting with capped backoff. */
static int ensure_connection(struct dispatcher *d)
{
  if (d->conn && PQstatus(d->conn) == CONNECTION_OK)
    return 1;
  PQfinish(d->conn);
  char err[DB_ERR_MAX];
  d->conn = db_connect(d->h->cfg->conninfo, "claim", CLAIM_TIMEOUT_MS, err, sizeof err);
  if (d->conn) {
    log_info("claim connection re-established");
    d->backoff = 0.1;
    return 1;
  }
  double wait = next_backoff(d);
  log_warn("claim connection: %s; retrying in %.1f s", err, wait);
  usleep((useconds_t)(wait * 1e6));
  return 0;
}

/* The next wait before reconnecting: jittered, doubling up to RECONNECT_MAX_S. */
static double next_backoff(struct dispatcher *d)
{
  double wait = d->backoff * (0.5 + (double)(rand() % 1000) / 1000.0);
  d->backoff = d->backoff * 2 > RECONNECT_MAX_S ? RECONNECT_MAX_S : d->backoff * 2;
  return wait;
}

static void connection_failed(struct dispatcher *d, const char *what, const char *err)
{
  log_warn("%s failed: %s", what, err);
  if (PQstatus(d->conn) != CONNECTION_OK)
    ensure_connection(d);
}

/* Hands claimed tasks to idle slots, the rest to the ready buffer. */
static void distribute(struct dispatcher *d, struct task *list)
{
  struct host *h = d->h;
  pthread_mutex_lock(&h->mu);
  while (list) {
    struct task *t = list;
    list = t->next;
    t->next = NULL;
    held_add(h, t);
    if (d->nidle > 0) {
      struct slot *s = d->idle[--d->nidle];
      s->task = t;
      pthread_cond_signal(&s->cv);
    } else {
      *d->ready_tail = t;
      d->ready_tail = &t->next;
      d->nready++;
    }
  }
  pthread_mutex_unlock(&h->mu);
}

/* One round trip: writes the outcomes of finished tasks and claims `want` rows. A task
   whose lease was lost is not written (its outcome is discarded); the fence rejects any
   other late one. Returns the number claimed, or -1. */
static int cycle(struct dispatcher *d, struct task *list, int want)
{
  struct task *keep = NULL, **tail = &keep;
  int n = 0;
  double now = task_now();
  while (list) {
    struct task *t = list;
    list = t->next;
    t->next = NULL;
    if (now >= atomic_load(&t->lease_deadline)) {
      pthread_mutex_lock(&d->h->mu);
      host_lose_lease(d->h, t, "lease ran out before the outcome could be written");
      pthread_mutex_unlock(&d->h->mu);
    }
    if (atomic_load(&t->lost)) {
      atomic_fetch_add(&d->h->stats.lost, 1);
      log_task(LOG_INFO, d->h, t, "outcome discarded: the lease was lost");
      finish_task(d, t, -1);
      continue;
    }
    *tail = t;
    tail = &t->next;
    n++;
  }
  if (n == 0 && want == 0)
    return 0;
  char *applied = malloc((size_t)(n > 0 ? n : 1));
  char err[DB_ERR_MAX];
  /* A database that is away comes back (restart, failover): keep the outcomes and retry
     with backoff, unless the worker must stop. Their leases are still being renewed. */
  for (;;) {
    if (!applied || must_give_up(d))
      break;
    if (!ensure_connection(d))
      continue;
    struct task *claimed = NULL;
    double start = task_now();
    int got = queue_cycle(d->q, d->conn, keep, n, applied, &d->h->cfg->scope, want, &claimed,
                          &d->next_due, err, sizeof err);
    if (got >= 0) {
      double rtt = task_now() - start;
      d->avg_rtt = d->avg_rtt > 0 ? 0.9 * d->avg_rtt + 0.1 * rtt : rtt;
      int i = 0;
      while (keep) {
        struct task *t = keep;
        keep = t->next;
        finish_task(d, t, applied[i++]);
      }
      free(applied);
      atomic_fetch_add(&d->h->stats.claimed, got);
      histogram_observe(&d->h->stats.cycle_seconds, rtt);
      for (struct task *t = claimed; t; t = t->next)
        histogram_observe(&d->h->stats.pickup_seconds, t->waited > 0 ? t->waited : 0);
      distribute(d, claimed);
      return got;
    }
    if (PQstatus(d->conn) == CONNECTION_OK) {
      /* The statement itself failed (a result jsonb refused, say): find the one. */
      log_warn("cycle with %d outcome%s failed: %s; settling one by one", n,
               n == 1 ? "" : "s", err);
      settle_one_by_one(d, keep);
      free(applied);
      return 0;
    }
    connection_failed(d, "claim and settle", err);
  }
  /* Could not write (no memory, or stopping with the database away): leases expire and
     the tasks run again elsewhere. */
  free(applied);
  while (keep) {
    struct task *t = keep;
    keep = t->next;
    log_task(LOG_WARN, d->h, t, "outcome not written; the task will run again after its lease expires");
    finish_task(d, t, -1);
  }
  return -1;
}

/* 1 once waiting for the database is no longer allowed: stopping now, or draining past
   the drain deadline. */
static int must_give_up(struct dispatcher *d)
{
  if (atomic_load(&d->h->stopping))
    return 1;
  pthread_mutex_lock(&d->h->mu);
  int draining = d->h->draining, wedged = d->h->wedged;
  pthread_mutex_unlock(&d->h->mu);
  /* Wedged: the dispatch loop's next turn settles, releases and exits. A cycle already under
     way on a working connection finishes (its outcomes and claims are then settled or given
     back there); one waiting for the database stops waiting. */
  if (wedged)
    return !d->conn || PQstatus(d->conn) != CONNECTION_OK;
  if (draining && d->drain_deadline == 0)
    d->drain_deadline = task_now() + d->h->cfg->drain_timeout;
  return draining && task_now() >= d->drain_deadline;
}

/* After a cycle's statement failed on a connection that is fine (a result jsonb refuses,
   say): each outcome alone, so one bad result cannot keep the others from being written. */
static void settle_one_by_one(struct dispatcher *d, struct task *list)
{
  char err[DB_ERR_MAX];
  while (list) {
    struct task *t = list;
    list = t->next;
    t->next = NULL;
    char applied = SETTLED_LATE;
    if (settle_alone(d, t, &applied, err, sizeof err) != 0 && t->out.result) {
      /* A result PostgreSQL cannot store (jsonb refuses \u0000) fails the attempt. */
      outcome_set(&t->out, OUTCOME_RETRY, CAUSE_CONTRACT, "result cannot be stored: ", err);
      free(t->out.result);
      t->out.result = NULL;
      if (settle_alone(d, t, &applied, err, sizeof err) != 0) {
        log_task(LOG_ERROR, d->h, t, "cannot settle: %s", err);
        finish_task(d, t, -1);
        continue;
      }
    }
    finish_task(d, t, applied);
  }
}

/* One outcome, by a cycle that claims nothing. 0, or -1 with err. */
static int settle_alone(struct dispatcher *d, struct task *t, char *applied, char *err,
                        size_t errlen)
{
  struct task *none = NULL;
  double due;
  return queue_cycle(d->q, d->conn, t, 1, applied, &d->h->cfg->scope, 0, &none, &due, err,
                     errlen) < 0 ? -1 : 0;
}

/* applied: SETTLED_* (what the fenced write did), or -1 when it was not written (the
   database away at the end, no memory): the lease expires and the task runs again. */
static void finish_task(struct dispatcher *d, struct task *t, int applied)
{
  if (t->finished)
    d->avg_duration = d->avg_duration > 0 ? 0.9 * d->avg_duration + 0.1 * t->duration
                                          : t->duration;
  if (applied == SETTLED_DONE) {
    atomic_fetch_add(&d->h->stats.done, 1);
    log_task(LOG_DEBUG, d->h, t, "done in %.3f s", t->duration);
  } else if (applied == SETTLED_PENDING) {
    atomic_fetch_add(&d->h->stats.retried, 1);
    log_task(LOG_INFO, d->h, t, "retry: %s", t->out.error ? t->out.error : "");
  } else if (applied >= SETTLED_DEAD) {
    /* The database decides: a retry with no attempt left was written dead, a crash cause
       that reached max_crashes quarantined, a row it could not write was set aside. */
    enum dead_reason why = applied == SETTLED_QUARANTINED ? DEAD_QUARANTINED
                           : applied == SETTLED_BAD_ROW   ? DEAD_BAD_ROW
                           : t->out.kind == OUTCOME_FATAL ? DEAD_FATAL
                                                          : DEAD_EXHAUSTED;
    unsigned cause = (unsigned)t->out.cause < CAUSE_COUNT ? t->out.cause : CAUSE_NONE;
    atomic_fetch_add(&d->h->stats.dead[why][cause], 1);
    log_task(LOG_INFO, d->h, t, "dead: %s", t->out.error ? t->out.error : "");
  } else if (applied == SETTLED_LATE) {
    atomic_fetch_add(&d->h->stats.late, 1);
    log_task(LOG_WARN, d->h, t, "late outcome rejected (%s): the lease was no longer ours",
             lifecycle_kind_sql(t->out.kind));
  }
  pthread_mutex_lock(&d->h->mu);
  held_remove(d->h, t);
  pthread_mutex_unlock(&d->h->mu);
  task_free(t);
}

/* Drain deadline: tasks still running are stopped and their leases go back to pending now,
   not after they expire. Their outcome is discarded when they come back. */
static void release_running(struct dispatcher *d)
{
  struct host *h = d->h;
  struct lease_key *keys = NULL;
  int n = 0;
  pthread_mutex_lock(&h->mu);
  if (h->nheld > 0)
    keys = malloc((size_t)h->nheld * sizeof *keys);
  for (int i = 0; keys && i < h->nheld; i++) {
    struct task *t = h->held[i];
    if (atomic_load(&t->lost))
      continue;
    atomic_store(&t->lost, 1);   /* no log line per task: the release below says it */
    keys[n++] = (struct lease_key){ .id = t->id, .attempt = t->attempt };
  }
  pthread_mutex_unlock(&h->mu);
  atomic_store(&h->stopping, 1);
  pthread_mutex_lock(&h->wake_mu);
  pthread_cond_broadcast(&h->wake_cv);
  pthread_mutex_unlock(&h->wake_mu);
  if (n > 0 && ensure_connection(d)) {
    char err[DB_ERR_MAX];
    int r = queue_release(d->q, d->conn, keys, n, err, sizeof err);
    if (r < 0)
      log_warn("drain: releasing %d lease%s failed (%s); they expire instead", n,
               n == 1 ? "" : "s", err);
    else
      log_info("drain timeout: %d lease%s given back to pending", r, r == 1 ? "" : "s");
  }
  free(keys);
}

/* The watchdog found a slot wedged (watchdog.h). On the claim connection, in this order:
   everything else held is marked lost (their code stops, their outcomes are discarded), the
   wedged task is settled as a retry with cause "wedged" together with the outcomes already
   finished, every other lease goes back to pending without charging the attempt, then the
   process _exits with HOST_EXIT_WEDGED. The wedged slot's thread is not joined: it may never
   return. Its task struct is not written here (the slot may still write t->out if it comes
   back): the settle goes through a copy. */
static void wedge_exit(struct dispatcher *d)
{
  struct host *h = d->h;
  struct lease_key *keys = NULL;
  struct task *settle = NULL, **tail = &settle, *copy = NULL;
  int nkeys = 0, nsettle = 0;
  char why[sizeof h->wedged_why];

  pthread_mutex_lock(&h->mu);
  h->draining = 1;
  atomic_store(&h->stats.ready, 0);
  snprintf(why, sizeof why, "%s", h->wedged_why);
  struct task *w = h->wedged_task;
  if (w && h->wedged_settle) {
    copy = calloc(1, sizeof *copy);
    if (copy) {
      copy->id = w->id;
      copy->attempt = w->attempt;
      copy->max_attempts = w->max_attempts;
      copy->out.delay = -1;
      char msg[sizeof why + 64];
      snprintf(msg, sizeof msg, "%s; the worker restarted", why);
      outcome_set(&copy->out, OUTCOME_RETRY, CAUSE_WEDGED, "wedged: ", msg);
    }
  }
  /* Outcomes that finished before now are written like any others. */
  for (struct task *t = d->done; t; t = t->next)
    if (t != w && !atomic_load(&t->lost)) {
      atomic_store(&t->lost, 1);   /* not released below; the copy in `settle` is written */
      struct task *c = calloc(1, sizeof *c);
      if (!c)
        continue;
      c->id = t->id;
      c->attempt = t->attempt;
      c->max_attempts = t->max_attempts;
      c->out = t->out;   /* borrowed: the task is never freed before _exit */
      *tail = c;
      tail = &c->next;
      nsettle++;
    }
  if (h->nheld > 0)
    keys = malloc((size_t)h->nheld * sizeof *keys);
  for (int i = 0; i < h->nheld; i++) {
    struct task *t = h->held[i];
    if (t == w || atomic_exchange(&t->lost, 1))
      continue;   /* the wedged one is settled; a lost one is not ours to give back */
    if (keys)
      keys[nkeys++] = (struct lease_key){ .id = t->id, .attempt = t->attempt };
  }
  pthread_mutex_unlock(&h->mu);
  atomic_store(&h->stopping, 1);
  pthread_mutex_lock(&h->wake_mu);
  pthread_cond_broadcast(&h->wake_cv);
  pthread_mutex_unlock(&h->wake_mu);

  if (copy) {
    *tail = copy;
    nsettle++;
  }
  char err[DB_ERR_MAX];
  const char *wrote = w ? "not settled (its lease was already lost or given back)"
                        : "none (the slot was closing a Lua state)";
  if (nsettle > 0) {
    char *applied = calloc((size_t)nsettle, 1);
    struct task *none = NULL;
    double due;
    if (applied && ensure_connection(d) &&
        queue_cycle(d->q, d->conn, settle, nsettle, applied, &h->cfg->scope, 0, &none, &due,
                    err, sizeof err) >= 0) {
      if (copy)
        wrote = applied[nsettle - 1] == SETTLED_PENDING ? "settled: retry (cause wedged)"
                : applied[nsettle - 1] == SETTLED_QUARANTINED ? "settled: dead (cause wedged, quarantined)"
                : applied[nsettle - 1] >= SETTLED_DEAD  ? "settled: dead (cause wedged, no attempts left)"
                                                        : "settle rejected: the lease was no longer ours";
    } else {
      wrote = "could not be settled: its lease expires instead";
      log_warn("watchdog: settling %d outcome%s failed: %s", nsettle, nsettle == 1 ? "" : "s",
               applied ? err : "out of memory");
    }
    free(applied);
  }
  int given = 0;
  if (nkeys > 0 && ensure_connection(d)) {
    given = queue_release(d->q, d->conn, keys, nkeys, err, sizeof err);
    if (given < 0)
      log_warn("watchdog: giving back %d lease%s failed (%s); they expire instead", nkeys,
               nkeys == 1 ? "" : "s", err);
  }
  char id[32] = "", attempt[16] = "";
  if (w) {
    snprintf(id, sizeof id, "%lld", (long long)w->id);
    snprintf(attempt, sizeof attempt, "%d", w->attempt);
  }
  struct log_field f[] = {
    { "task_id", w ? id : NULL }, { "attempt", w ? attempt : NULL },
    { "worker", h->cfg->worker_id }, { NULL, NULL },
  };
  log_fields(LOG_ERROR, f, "watchdog: wedged task %s; %d other lease%s given back to pending; "
             "exiting with status %d without waiting for the wedged slot", wrote,
             given > 0 ? given : 0, given == 1 ? "" : "s", HOST_EXIT_WEDGED);
  fflush(stdout);
  _exit(HOST_EXIT_WEDGED);
}

static void *slot_main(void *arg)
{
  struct slot *s = arg;
  struct host *h = s->h;
  struct dispatcher *d = s->d;
  char err[DB_ERR_MAX];
  for (;;) {
    pthread_mutex_lock(&h->mu);
    while (!s->task && !d->quit)
      pthread_cond_wait(&s->cv, &h->mu);
    struct task *t = s->task;
    unsigned generation = h->generation;
    char *text = NULL;
    size_t len = h->script_len;
    /* Between tasks: a hot swap, or a fresh state after an out-of-memory error. */
    if (t && (generation != s->generation || script_broken(s->script))) {
      text = malloc(len);
      if (text)
        memcpy(text, h->script_text, len);
    }
    pthread_mutex_unlock(&h->mu);
    if (!t)
      break;
    if (text) {
      /* Bounded: a setup that wedges here leaves the slot on its old version. */
      struct script *fresh = reload_load_bounded(h->cfg->script_path, text, len, &h->sh,
                                                 host_load_limit(h), err, sizeof err);
      free(text);
      if (fresh) {
        log_debug("slot %d now runs version %s", s->index, script_version(fresh));
        slot_close_script(s, s->script);
        s->script = fresh;
      } else {
        log_warn("slot %d keeps version %s: %s", s->index, script_version(s->script), err);
      }
      s->generation = generation;
    }
    atomic_fetch_add(&h->stats.busy_slots, 1);
    struct slot_watch *sw = &h->watch[s->index];
    pthread_mutex_lock(&h->mu);   /* what the watchdog sees: this task in handle() since now */
    *sw = (struct slot_watch){ .task = t, .started = task_now() };   /* closing is 0 */
    pthread_mutex_unlock(&h->mu);
    script_run(s->script, t);
    atomic_fetch_sub(&h->stats.busy_slots, 1);
    histogram_observe(&h->stats.task_seconds, t->duration);
    pthread_mutex_lock(&h->mu);
    sw->task = NULL;
    t->finished = 1;
    *d->done_tail = t;
    d->done_tail = &t->next;
    /* The next task from the ready buffer, without a trip through the dispatcher. */
    s->task = h->draining ? NULL : d->ready;
    if (s->task) {
      d->ready = s->task->next;
      if (!d->ready)
        d->ready_tail = &d->ready;
      d->nready--;
      s->task->next = NULL;
    } else {
      d->idle[d->nidle++] = s;
    }
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
  }
  slot_close_script(s, s->script);
  s->script = NULL;
  return NULL;
}

/* lua_close runs the state's pending finalizers: C-level code the count hook cannot stop, so
   the watchdog watches it like a task (a state closed at shutdown included). */
static void slot_close_script(struct slot *s, struct script *script)
{
  struct host *h = s->h;
  pthread_mutex_lock(&h->mu);
  h->watch[s->index].closing = task_now();
  pthread_mutex_unlock(&h->mu);
  script_free(script);
  pthread_mutex_lock(&h->mu);
  h->watch[s->index].closing = 0;
  pthread_mutex_unlock(&h->mu);
}

/* Draining: tasks claimed but not started go back to pending at once. */
static void release_ready(struct dispatcher *d)
{
  struct host *h = d->h;
  pthread_mutex_lock(&h->mu);
  struct task *list = d->ready;
  int n = d->nready;
  d->ready = NULL;
  d->ready_tail = &d->ready;
  d->nready = 0;
  for (struct task *t = list; t; t = t->next)
    held_remove(h, t);
  pthread_mutex_unlock(&h->mu);
  struct lease_key *keys = malloc((size_t)(n > 0 ? n : 1) * sizeof *keys);
  int i = 0;
  for (struct task *t = list; keys && t; t = t->next)
    keys[i++] = (struct lease_key){ .id = t->id, .attempt = t->attempt };
  char err[DB_ERR_MAX];
  if (keys && ensure_connection(d) &&
      queue_release(d->q, d->conn, keys, n, err, sizeof err) >= 0)
    log_info("draining: %d claimed task%s not started given back to pending", n,
             n == 1 ? "" : "s");
  else
    log_warn("draining: %d claimed task%s not started could not be given back; their leases "
             "expire instead", n, n == 1 ? "" : "s");
  free(keys);
  while (list) {
    struct task *t = list;
    list = t->next;
    task_free(t);
  }
}

static int held_now(struct host *h)
{
  pthread_mutex_lock(&h->mu);
  int n = h->nheld;
  pthread_mutex_unlock(&h->mu);
  return n;
}

static void held_add(struct host *h, struct task *t)
{
  if (h->nheld == h->capheld) {
    int cap = h->capheld ? h->capheld * 2 : 64;
    struct task **nh = realloc(h->held, (size_t)cap * sizeof *nh);
    if (!nh)
      abort();   /* cannot track a lease we hold: better to die and let it expire */
    h->held = nh;
    h->capheld = cap;
  }
  h->held[h->nheld++] = t;
}

static void held_remove(struct host *h, struct task *t)
{
  for (int i = 0; i < h->nheld; i++)
    if (h->held[i] == t) {
      h->held[i] = h->held[--h->nheld];
      return;
    }
}

/* The fallback poll while idle: --poll-ms (jittered) at first, doubling after each empty
   claim up to IDLE_POLL_MAX_S. NOTIFY (inserts, reaped and released rows) and the due time
   of scheduled rows wake the dispatcher sooner, so an idle process costs well under one
   statement per second and still picks up work at once. */
static double next_idle_poll(const struct host_config *cfg, double current, int empty)
{
  double base = jitter_poll(cfg);
  if (!empty || current <= 0)
    return base;
  double next = current * 2;
  double cap = IDLE_POLL_MAX_S > base ? IDLE_POLL_MAX_S : base;
  return next > cap ? cap : next;
}

static double jitter_poll(const struct host_config *cfg)
{
  int span = cfg->poll_max_ms - cfg->poll_min_ms;
  int ms = cfg->poll_min_ms + (span > 0 ? rand() % (span + 1) : 0);
  return ms / 1000.0;
}

static void log_task(enum log_level lvl, const struct host *h, const struct task *t,
                     const char *fmt, ...)
{
  char id[32], attempt[16];
  snprintf(id, sizeof id, "%lld", (long long)t->id);
  snprintf(attempt, sizeof attempt, "%d", t->attempt);
  struct log_field f[] = {
    { "task_id", id }, { "tenant", t->tenant_id }, { "attempt", attempt },
    { "worker", h->cfg->worker_id }, { NULL, NULL },
  };
  va_list ap;
  va_start(ap, fmt);
  log_vfields(lvl, f, fmt, ap);
  va_end(ap);
}
