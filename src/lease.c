/* lease: the lease registry, and heartbeat, reaper and LISTEN on one connection. See
   lease.h. */
#include "lease.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEARTBEAT_TIMEOUT_MS 3000
#define REAP_MIN_S 1.0
#define REAP_MAX_S 15.0
/* The heads' repair (a scan of the pending rows, sql/011) runs with the first reap and then
   this often. */
#define REPAIR_HEADS_EVERY_S 300.0
#define DEPTH_EVERY_S 10.0
#define RECONNECT_MIN_S 0.1
#define RECONNECT_MAX_S 5.0

struct lease_registry {
  pthread_mutex_t mu;
  struct task **held;
  int n, cap;
};

struct lease {
  struct lease_config cfg;
  pthread_t thread;
  int pipe_fd[2];               /* written by lease_stop to interrupt poll() */
  PGconn *conn;
  struct queue *q;
  double next_connect, backoff;
  double next_full_repair;      /* monotonic: the next heads repair; 0: with the next reap */
  int leader;                   /* this connection holds the metrics leader's lock */
};

static void *lease_main(void *arg);
static int ensure_connection(struct lease *l);
static void drop_connection(struct lease *l, const char *why);
static void heartbeat(struct lease *l);
static void expire_locally(struct lease *l);
static void reap(struct lease *l);
static void read_notifications(struct lease *l);
static void sample_depth(struct lease *l);

/* ---- the registry ---- */

struct lease_registry *lease_registry_new(void)
{
  struct lease_registry *r = calloc(1, sizeof *r);
  if (r)
    pthread_mutex_init(&r->mu, NULL);
  return r;
}

void lease_registry_free(struct lease_registry *r)
{
  if (!r)
    return;
  pthread_mutex_destroy(&r->mu);
  free(r->held);
  free(r);
}

void lease_registry_add(struct lease_registry *r, struct task *t)
{
  pthread_mutex_lock(&r->mu);
  if (r->n == r->cap) {
    int cap = r->cap ? r->cap * 2 : 64;
    struct task **nh = realloc(r->held, (size_t)cap * sizeof *nh);
    if (!nh)
      abort();   /* cannot track a lease we hold: better to die and let it expire */
    r->held = nh;
    r->cap = cap;
  }
  r->held[r->n++] = t;
  pthread_mutex_unlock(&r->mu);
}

void lease_registry_remove(struct lease_registry *r, struct task *t)
{
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n; i++)
    if (r->held[i] == t) {
      r->held[i] = r->held[--r->n];
      break;
    }
  pthread_mutex_unlock(&r->mu);
}

void lease_registry_finished(struct lease_registry *r, struct task *t)
{
  pthread_mutex_lock(&r->mu);
  t->finished = 1;
  pthread_mutex_unlock(&r->mu);
}

int lease_registry_count(struct lease_registry *r)
{
  pthread_mutex_lock(&r->mu);
  int n = r->n;
  pthread_mutex_unlock(&r->mu);
  return n;
}

struct lease_key *lease_registry_give_up(struct lease_registry *r, const struct task *keep,
                                         int *n)
{
  struct lease_key *keys = NULL;
  *n = 0;
  pthread_mutex_lock(&r->mu);
  if (r->n > 0)
    keys = malloc((size_t)r->n * sizeof *keys);
  for (int i = 0; i < r->n; i++) {
    struct task *t = r->held[i];
    if (t == keep || atomic_exchange(&t->lost, 1))
      continue;   /* a lost one is not ours to give back */
    if (keys)
      keys[(*n)++] = (struct lease_key){ .id = t->id, .token = t->token };
  }
  pthread_mutex_unlock(&r->mu);
  if (*n == 0) {
    free(keys);
    keys = NULL;
  }
  return keys;
}

/* ---- the thread ---- */

struct lease *lease_start(const struct lease_config *cfg)
{
  struct lease *l = calloc(1, sizeof *l);
  if (!l)
    return NULL;
  l->cfg = *cfg;
  l->backoff = RECONNECT_MIN_S;
  if (pipe(l->pipe_fd) != 0) {
    log_error("lease thread: pipe: %m");
    free(l);
    return NULL;
  }
  fcntl(l->pipe_fd[0], F_SETFL, O_NONBLOCK);
  if (pthread_create(&l->thread, NULL, lease_main, l) != 0) {
    log_error("cannot start the lease thread");
    close(l->pipe_fd[0]);
    close(l->pipe_fd[1]);
    free(l);
    return NULL;
  }
  return l;
}

void lease_stop(struct lease *l)
{
  if (!l)
    return;
  ssize_t w = write(l->pipe_fd[1], "x", 1);
  (void)w;
  pthread_join(l->thread, NULL);
  close(l->pipe_fd[0]);
  close(l->pipe_fd[1]);
  queue_free(l->q);
  PQfinish(l->conn);
  free(l);
}

static void *lease_main(void *arg)
{
  struct lease *l = arg;
  const struct lease_config *cfg = &l->cfg;
  double now = task_now();
  double next_beat = now + cfg->heartbeat, next_reap = now, next_depth = now;
  /* Expired leases matter after a visibility has passed: a quarter of it, 1-15 s, keeps a
     crashed peer's tasks waiting at most 1.25 visibilities and an idle fleet quiet. */
  double reap_every = cfg->visibility / 4;
  reap_every = reap_every < REAP_MIN_S ? REAP_MIN_S : reap_every > REAP_MAX_S ? REAP_MAX_S : reap_every;
  for (;;) {
    now = task_now();
    int connected = ensure_connection(l);
    double until = next_beat < next_reap ? next_beat : next_reap;
    if (!connected && l->next_connect < until)
      until = l->next_connect;
    int wait_ms = until > now ? (int)((until - now) * 1000) + 1 : 0;
    struct pollfd fds[2] = { { l->pipe_fd[0], POLLIN, 0 }, { -1, POLLIN, 0 } };
    if (connected)
      fds[1].fd = PQsocket(l->conn);
    int rc = poll(fds, 2, wait_ms);
    if (rc < 0 && errno != EINTR)
      log_warn("lease thread: poll: %m");
    if (fds[0].revents & POLLIN)
      break;
    if (connected && (fds[1].revents & (POLLIN | POLLERR | POLLHUP)))
      read_notifications(l);
    now = task_now();
    if (now >= next_beat) {
      next_beat = now + cfg->heartbeat;
      heartbeat(l);
    }
    if (now >= next_reap) {
      next_reap = now + reap_every;
      reap(l);
    }
    if (cfg->sample_depth && now >= next_depth && l->conn) {
      next_depth = now + DEPTH_EVERY_S;
      sample_depth(l);
    }
  }
  return NULL;
}

/* 1 when connected (LISTENing), 0 while waiting to retry with capped backoff. */
static int ensure_connection(struct lease *l)
{
  if (l->conn)
    return 1;
  double now = task_now();
  if (now < l->next_connect)
    return 0;
  char err[DB_ERR_MAX];
  char *listen = NULL;
  const struct lease_config *cfg = &l->cfg;
  l->conn = db_connect(cfg->conninfo, "lease", HEARTBEAT_TIMEOUT_MS, err, sizeof err);
  if (l->conn && !l->q)
    l->q = queue_new(l->conn, cfg->table, cfg->worker_id, cfg->visibility);
  /* The worker-presence lock goes with the session: `leash release` refuses while held. */
  if (l->conn && l->q && (listen = queue_listen_sql(l->conn, cfg->table, err, sizeof err)) &&
      db_command(l->conn, listen, err, sizeof err) == 0 &&
      queue_announce(l->q, l->conn, cfg->table, err, sizeof err) == 0) {
    free(listen);
    l->backoff = RECONNECT_MIN_S;
    atomic_store(&cfg->counters->db_up, 1);
    /* Rows may have arrived while we were away: let the dispatcher look. */
    cfg->on_work(cfg->arg);
    return 1;
  }
  free(listen);
  if (l->conn)
    PQfinish(l->conn);
  l->conn = NULL;
  log_warn("lease thread: %s; retrying in %.1f s", err, l->backoff);
  /* Jitter keeps a fleet that lost its database from reconnecting in lockstep. */
  l->next_connect = now + l->backoff * (0.5 + (double)(rand() % 1000) / 1000.0);
  l->backoff = l->backoff * 2 > RECONNECT_MAX_S ? RECONNECT_MAX_S : l->backoff * 2;
  return 0;
}

static void drop_connection(struct lease *l, const char *why)
{
  log_warn("lease thread: %s", why);
  if (PQstatus(l->conn) == CONNECTION_BAD) {
    atomic_store(&l->cfg.counters->db_up, 0);
    /* The leader's lock went with the session: stop exporting until it is won again. */
    l->leader = 0;
    atomic_store(&l->cfg.counters->metrics_leader, 0);
    atomic_store(&l->cfg.counters->queue_runnable, -1);
    PQfinish(l->conn);
    l->conn = NULL;
    l->next_connect = task_now();
  }
}

/* One statement for every lease held. A row missing from the answer was taken from us
   (expired and reaped, or requeued by hand): that task's lease is lost. */
static void heartbeat(struct lease *l)
{
  struct lease_registry *r = l->cfg.registry;
  struct lease_key *keys = NULL;
  char *renewed = NULL;
  int n;

  /* A lease marked lost is not renewed: its outcome is discarded anyway, and a slot wedged
     in C (watchdog.c), or one that ignores the loss, must not keep the row from the reaper. */
  pthread_mutex_lock(&r->mu);
  n = 0;
  if (r->n > 0) {
    keys = malloc((size_t)r->n * sizeof *keys);
    renewed = malloc((size_t)r->n);
    if (keys && renewed)
      for (int i = 0; i < r->n; i++)
        if (!atomic_load(&r->held[i]->lost))
          keys[n++] = (struct lease_key){ .id = r->held[i]->id, .token = r->held[i]->token };
  }
  pthread_mutex_unlock(&r->mu);

  if (n > 0 && keys && renewed && l->conn) {
    char err[DB_ERR_MAX];
    double sent = task_now();
    if (queue_heartbeat(l->q, l->conn, keys, n, renewed, err, sizeof err) == 0) {
      /* Tasks came and went while the beat was out: match by (id, token). */
      pthread_mutex_lock(&r->mu);
      for (int i = 0; i < r->n; i++) {
        struct task *t = r->held[i];
        int j = queue_keys_find(keys, n, t->id, t->token);
        if (j < 0)
          continue;
        if (renewed[j] == HEARTBEAT_RENEWED)
          atomic_store(&t->lease_deadline, sent + l->cfg.visibility);
        else if (renewed[j] == HEARTBEAT_LOST && !t->finished)
          l->cfg.on_lost(l->cfg.arg, t, "heartbeat found the row no longer leased to this worker");
        /* A finished task's row may just have been settled by the dispatcher; if the lease
           was really taken, the fenced settle rejects the outcome and says so. */
      }
      pthread_mutex_unlock(&r->mu);
    } else {
      drop_connection(l, err);
    }
  }
  free(keys);
  free(renewed);
  expire_locally(l);
}

/* Without a renewal in time (database unreachable, or this process was frozen), another
   worker may already hold the task: stop its side effects before that can matter. */
static void expire_locally(struct lease *l)
{
  struct lease_registry *r = l->cfg.registry;
  double now = task_now();
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n; i++)
    if (now >= atomic_load(&r->held[i]->lease_deadline))
      l->cfg.on_lost(l->cfg.arg, r->held[i], "lease ran out before a renewal succeeded");
  pthread_mutex_unlock(&r->mu);
}

static void reap(struct lease *l)
{
  if (!l->conn)
    return;
  char err[DB_ERR_MAX];
  long long dead[2] = { 0, 0 };
  int n = queue_reap(l->q, l->conn, dead, err, sizeof err);
  /* A reaped lease is a crash of its execution: dead ones are counted here, by the process
     that reaped them (no other process saw them end). */
  atomic_fetch_add(&l->cfg.counters->dead[DEAD_QUARANTINED][CAUSE_CRASH], dead[0]);
  atomic_fetch_add(&l->cfg.counters->dead[DEAD_EXHAUSTED][CAUSE_CRASH], dead[1]);
  if (n < 0) {
    drop_connection(l, err);
    return;
  }
  if (n > 0) {
    log_info("reaped %d expired lease%s", n, n == 1 ? "" : "s");
    l->cfg.on_work(l->cfg.arg);
  }
  /* Shards a hand-made change left without a head would never be claimed (sql/011). */
  double now = task_now();
  if (now < l->next_full_repair)
    return;
  l->next_full_repair = now + REPAIR_HEADS_EVERY_S;
  int fixed = queue_repair_heads(l->q, l->conn, err, sizeof err);
  if (fixed < 0) {
    if (PQstatus(l->conn) != CONNECTION_OK)
      drop_connection(l, err);
    else
      log_warn("repairing shard heads failed: %s", err);
  } else if (fixed > 0) {
    log_info("gave a head to %d shard%s left without one by changes made outside leash",
             fixed, fixed == 1 ? "" : "s");
    l->cfg.on_work(l->cfg.arg);
  }
}

/* Queue-wide gauges are exported once per fleet: by the process whose lease connection holds
   the table's metrics lock (queue_metrics_leader). The others keep trying, every sample, and
   one takes over within a sample of the leader's connection going. */
static void sample_depth(struct lease *l)
{
  struct queue_depth d;
  char err[DB_ERR_MAX];
  struct metrics_counters *c = l->cfg.counters;
  if (!l->leader) {
    int got = queue_metrics_leader(l->q, l->conn, err, sizeof err);
    if (got < 0) {
      drop_connection(l, err);
      return;
    }
    if (!got) {
      atomic_store(&c->metrics_leader, 0);
      atomic_store(&c->queue_runnable, -1);   /* not exported here */
      return;
    }
    l->leader = 1;
    log_info("metrics: this process exports the queue-wide gauges (leader)");
  }
  if (queue_depth(l->q, l->conn, &d, err, sizeof err) != 0) {
    drop_connection(l, err);
    return;
  }
  atomic_store(&c->queue_scheduled, d.scheduled);
  atomic_store(&c->queue_leased, d.leased);
  atomic_store(&c->queue_oldest_ms, d.oldest_runnable_s < 0 ? -1
                                                            : (long long)(d.oldest_runnable_s * 1000));
  atomic_store(&c->budgets_paused, d.budgets_paused);
  atomic_store(&c->queue_runnable, d.runnable);   /* last: the others are set when it is */
  atomic_store(&c->metrics_leader, 1);
}

static void read_notifications(struct lease *l)
{
  if (!PQconsumeInput(l->conn)) {
    char err[DB_ERR_MAX];
    db_one_line(PQerrorMessage(l->conn), err, sizeof err);
    drop_connection(l, err);
    return;
  }
  PGnotify *n;
  int any = 0, canary = 0;
  while ((n = PQnotifies(l->conn)) != NULL) {
    any = 1;
    canary |= n->extra && strcmp(n->extra, "canary") == 0;
    PQfreemem(n);
  }
  if (canary && l->cfg.on_canary)
    l->cfg.on_canary(l->cfg.arg);
  if (any)
    l->cfg.on_work(l->cfg.arg);
}
