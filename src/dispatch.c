/* dispatch: the dispatcher's loop, its claim/settle cycle, drain and the wedge exit. See
   dispatch.h. */
#include "dispatch.h"

#include "host_internal.h"
#include "lifecycle.h"
#include "log.h"
#include "migrate.h"
#include "record.h"
#include "report.h"
#include "settler.h"
#include "slot.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CLAIM_TIMEOUT_MS 5000
#define RECONNECT_MAX_S 5.0
#define START_WAIT_S 60.0
#define EMPTY_RECHECK_MIN_S 0.01
#define PROGRESS_EVERY_S 10.0
#define IDLE_POLL_MAX_S 5.0
/* An outcome whose shard head a producer holds locked is written again this much later:
   producers commit within milliseconds, and a settle never waits for one (sql/011). */
#define SETTLE_AGAIN_S 0.02
/* The ready buffer's bound, in tasks per slot (see ready_target). */
#define READY_PER_SLOT 8
/* How many recent run times size the ready buffer. */
#define RECENT_RUNS 32

/* The loop's clocks, from one turn to the next. */
struct pacing {
  double next_poll;             /* the fallback poll (see next_idle_poll) */
  double idle_poll;             /* grows while claims come back empty */
  int more;                     /* the last claim was full: more work is likely waiting */
  /* Settle on the settle connection while claiming (settler.h): from a full claim on, for
     as long as the claims made beside a settle still find work. */
  int overlap;
  int overlapped;               /* this turn's settle ran beside its claim */
  double next_progress;         /* the next progress line */
  long long progress_settled;   /* settled count at the last progress line */
  /* --until-empty, while the scope is open only through other workers' leases: look again
     soon (they are likely about to settle) and less often the longer it lasts, up to the
     normal poll. Without it, the last workers of a drain idled up to --poll-ms each. */
  double next_empty_check, empty_wait;
  int released;                 /* the drain deadline gave the running tasks' leases back */
};

/* What one turn of the loop saw (under mu) and decided. */
struct turn {
  struct task *finished;        /* handed back by the slots since the last turn: to settle */
  int idle, nready, woken, draining, nheld;
  double now;
  int want;                     /* rows to claim: idle slots plus the ready buffer's shortfall */
};

enum step { STEP_WAIT, STEP_AGAIN, STEP_EXIT };

/* Dispatcher-side state (the calling thread), plus what slots hand back under h->mu. */
struct dispatcher {
  struct host *h;
  struct slot_env env;
  struct slot *slots;
  int started;                      /* slots started */
  struct slot **idle;               /* under h->mu, as the lists below */
  int nidle;
  struct task *done, **done_tail;   /* finished, waiting to be settled */
  struct task *ready, **ready_tail; /* claimed, not started: slots take them directly */
  int nready;
  PGconn *conn;
  struct queue *q;
  struct settler *settler;          /* the settle connection (settler.h), or NULL */
  double backoff;
  double drain_deadline;            /* monotonic; 0 until draining */
  double avg_rtt;                   /* moving average (s) of the cycle's round trip */
  /* Moving average of the share of settled tasks whose settle leased their shard's next row
     to this worker (sql/029): how much of a turn's want its settle is expected to cover. */
  double chain_share;
  /* The run times of the last RECENT_RUNS tasks (a ring) and the longest of them, the
     ready buffer's measure of a task: a mix of 2 ms and 150 ms tasks is sized by the 150 ms
     ones (an upper quartile was not enough: a quarter of long ones left windows of short
     ones, and the buffer grew to 8 per slot), so it does not claim ahead for the short ones
     while long ones hold the slots; only runs of uniformly short tasks are buffered. */
  double recent[RECENT_RUNS];
  int nrecent, recent_next;
  double typical_duration;          /* 0 until a task has run */
  double next_due;                  /* from the last short claim: s until a row is due, or -1 */
  /* Outcomes the database asked to write again (SETTLED_AGAIN: their shard's head row was
     locked by a producer's open transaction), from again_at on. Dispatcher thread only. */
  struct task *again, **again_tail;
  double again_at;
  struct pacing pace;
};

static void take_turn(struct dispatcher *d, struct turn *t);
static enum step work_step(struct dispatcher *d, struct turn *t);
static enum step drain_step(struct dispatcher *d, struct turn *t);
static void pace_after_claim(struct dispatcher *d, const struct turn *t, int got);
static int until_empty_settled(struct dispatcher *d, const struct turn *t);
static void wait_for_news(struct dispatcher *d, const struct turn *t);
static struct task *hand_back(void *arg, struct slot *s, struct task *t);
static int ensure_connection(struct dispatcher *d);
static void start_settler(struct dispatcher *d);
static double next_backoff(struct dispatcher *d);
static void connection_failed(struct dispatcher *d, const char *what, const char *err);
static int cycle(struct dispatcher *d, struct task *list, int want);
static int claim_and_settle(struct dispatcher *d, struct task *keep, int n, int want,
                            int chain);
static int take_leased(struct dispatcher *d, struct task *list);
static struct task *split_list(struct task *list, int k);
static void join_list(struct task *list, struct task *rest);
static int chain_expected(const struct dispatcher *d, int n, int want);
static void note_chained(struct dispatcher *d, int chained, int n, int chain);
static void settled(struct dispatcher *d, struct task *keep, const char *applied);
static struct task *drop_lost(struct dispatcher *d, struct task *list, int *n);
static int ready_target(const struct dispatcher *d);
static void note_duration(struct dispatcher *d, double seconds);
static long long log_progress(struct dispatcher *d, long long before);
static void distribute(struct dispatcher *d, struct task *list);
static void release_ready(struct dispatcher *d);
static int must_give_up(struct dispatcher *d);
static void settle_one_by_one(struct dispatcher *d, struct task *list);
static int settle_alone(struct dispatcher *d, struct task *t, char *applied, char *err,
                        size_t errlen);
static void finish_task(struct dispatcher *d, struct task *t, int applied);
static void settle_later(struct dispatcher *d, struct task *t);
static void release_running(struct dispatcher *d);
static void stop_tasks(struct host *h);
/* What the wedge exit writes and gives back (see wedge_exit). */
struct wedge_plan {
  char why[256];
  struct task *w;                   /* the wedged slot's task, or NULL */
  struct task *copy;                /* its settle (CAUSE_WEDGED), or NULL */
  struct task *settle, **tail;      /* copies to settle: finished outcomes, then `copy` */
  int nsettle;
  struct lease_key *keys;           /* every other lease, to give back */
  int nkeys;
};

static void wedge_exit(struct dispatcher *d) __attribute__((noreturn));
static void plan_wedge(struct dispatcher *d, struct wedge_plan *p);
static const char *settle_wedge(struct dispatcher *d, const struct wedge_plan *p);
static double jitter_poll(const struct host_config *cfg);
static double next_idle_poll(const struct host_config *cfg, double current, int empty);
#define log_task dispatch_log_task
void dispatch_log_task(enum log_level lvl, const struct host *h, const struct task *t,
                       const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ---- set-up and tear-down (called by host.c) ---- */

struct dispatcher *dispatcher_new(struct host *h)
{
  struct dispatcher *d = calloc(1, sizeof *d);
  if (!d)
    return NULL;
  int n = h->cfg->concurrency;
  d->h = h;
  d->backoff = 0.1;
  d->done_tail = &d->done;
  d->ready_tail = &d->ready;
  d->again_tail = &d->again;
  d->next_due = -1;
  d->slots = calloc((size_t)n, sizeof *d->slots);
  d->idle = calloc((size_t)n, sizeof *d->idle);
  if (!d->slots || !d->idle) {
    dispatcher_free(d);
    return NULL;
  }
  d->env = (struct slot_env){
    .mu = &h->mu, .src = &h->src, .script_path = h->cfg->script_path, .sh = &h->sh,
    .load_limit = host_load_limit(h), .stats = &h->stats, .registry = h->leases,
    .hand_back = hand_back, .arg = d,
  };
  return d;
}

PGconn *dispatcher_conn(struct dispatcher *d)
{
  return d->conn;
}

int dispatcher_start_slots(struct dispatcher *d)
{
  char err[DB_ERR_MAX];
  start_settler(d);   /* here: after the signal thread (host.c), so it blocks signals too */
  for (; d->started < d->h->cfg->concurrency; d->started++) {
    struct slot *s = &d->slots[d->started];
    if (slot_start(s, &d->env, d->started, &d->h->watch[d->started], err, sizeof err) != 0) {
      log_error("cannot start slot %d: %s", d->started, err);
      return -1;
    }
    pthread_mutex_lock(&d->h->mu);
    d->idle[d->nidle++] = s;
    pthread_mutex_unlock(&d->h->mu);
  }
  return 0;
}

void dispatcher_stop_slots(struct dispatcher *d)
{
  if (!d)
    return;
  pthread_mutex_lock(&d->h->mu);
  for (int i = 0; i < d->started; i++)
    slot_quit(&d->slots[i]);
  pthread_mutex_unlock(&d->h->mu);
  for (int i = 0; i < d->started; i++)
    slot_join(&d->slots[i]);
  d->started = 0;
}

void dispatcher_free(struct dispatcher *d)
{
  if (!d)
    return;
  while (d->done) {
    struct task *t = d->done;
    d->done = t->next;
    task_free(t);
  }
  free(d->slots);
  free(d->idle);
  settler_stop(d->settler);
  queue_free(d->q);
  PQfinish(d->conn);
  free(d);
}

void dispatch_lose_lease(struct host *h, struct task *t, const char *why)
{
  if (atomic_exchange(&t->lost, 1))
    return;
  log_task(LOG_WARN, h, t, "lease lost: %s; the outcome will be discarded", why);
  pthread_mutex_lock(&h->wake_mu);
  pthread_cond_broadcast(&h->wake_cv);
  pthread_mutex_unlock(&h->wake_mu);
}

/* ---- the loop ---- */

/* Each turn is one round trip: the outcomes that finished since the last one, and a claim
   for the idle slots plus a small local buffer, in one transaction. Otherwise it waits for a
   slot to finish, a notification or the next poll. */
int dispatcher_run(struct dispatcher *d)
{
  d->pace = (struct pacing){
    .more = 1, .next_progress = task_now() + PROGRESS_EVERY_S,
    .empty_wait = EMPTY_RECHECK_MIN_S,
  };
  for (;;) {
    struct turn t;
    take_turn(d, &t);
    if (t.now >= d->pace.next_progress) {
      d->pace.next_progress = t.now + PROGRESS_EVERY_S;
      d->pace.progress_settled = log_progress(d, d->pace.progress_settled);
    }
    enum step s = t.draining ? drain_step(d, &t) : work_step(d, &t);
    if (s == STEP_EXIT)
      return 0;
    if (s == STEP_WAIT)
      wait_for_news(d, &t);
  }
}

/* Takes what the slots handed back and what the other threads said. Does not return when a
   slot is wedged. */
static void take_turn(struct dispatcher *d, struct turn *t)
{
  struct host *h = d->h;
  pthread_mutex_lock(&h->mu);
  if (h->wedged) {
    pthread_mutex_unlock(&h->mu);
    wedge_exit(d);
  }
  *t = (struct turn){
    .finished = d->done, .idle = d->nidle, .nready = d->nready, .woken = h->wake,
    .draining = h->draining, .nheld = lease_registry_count(h->leases),
  };
  d->done = NULL;
  d->done_tail = &d->done;
  h->wake = 0;
  pthread_mutex_unlock(&h->mu);
  t->now = task_now();
  if (d->again && t->now >= d->again_at) {
    *d->again_tail = t->finished;
    t->finished = d->again;
    d->again = NULL;
    d->again_tail = &d->again;
  }
}

/* An outcome to write again shortly (SETTLED_AGAIN): its lease is still held and renewed.
   Should a drain's deadline come while a producer still holds its shard, the lease is given
   back with the others (release_running) and the task runs again elsewhere: at least once. */
static void settle_later(struct dispatcher *d, struct task *t)
{
  if (!d->again)
    d->again_at = task_now() + SETTLE_AGAIN_S;
  t->next = NULL;
  *d->again_tail = t;
  d->again_tail = &t->next;
}

/* Not draining: settle what finished and claim what the slots can take. */
static enum step work_step(struct dispatcher *d, struct turn *t)
{
  const struct host_config *cfg = d->h->cfg;
  struct pacing *p = &d->pace;
  t->want = t->idle + ready_target(d) - t->nready;
  if (t->want > cfg->claim_batch)
    t->want = cfg->claim_batch;
  int claim_now = t->want > 0 && (p->more || t->woken || t->finished || t->now >= p->next_poll);
  if (!t->finished && !claim_now)
    return STEP_WAIT;
  p->overlapped = 0;
  int got = cycle(d, t->finished, claim_now ? t->want : 0);
  if (claim_now && got >= 0)
    pace_after_claim(d, t, got);
  if (claim_now && got == 0 && cfg->until_empty && t->now >= p->next_empty_check &&
      lease_registry_count(d->h->leases) == 0 && until_empty_settled(d, t))
    return STEP_EXIT;
  if (got > 0)
    p->empty_wait = EMPTY_RECHECK_MIN_S;
  return got > 0 || t->finished ? STEP_AGAIN : STEP_WAIT;
}

/* When to claim next, from what the last claim got. */
static void pace_after_claim(struct dispatcher *d, const struct turn *t, int got)
{
  struct pacing *p = &d->pace;
  p->more = got >= t->want;   /* a settle may lease more than expected (cycle) */
  /* A claim beside a settle cannot take the next rows of the shards that settle hands over.
     When the rest still gave it work (many shards), keep overlapping; when it found nothing
     (one shard's tasks one after another, a drain's end), its work waits on the hand-over:
     back to the one-cycle turn, whose claim takes the handed-over rows at once. */
  p->overlap = p->more || (p->overlapped && got > 0);
  if (got > 0 || t->woken)
    p->idle_poll = 0;
  if (p->more)
    return;
  if (p->overlapped) {
    /* Its settle has committed since: what it handed over is claimable now. */
    p->next_poll = t->now;
    return;
  }
  /* Only a poll nothing triggered backs off: an empty claim made because a slot finished
     says nothing about how idle the queue is. */
  p->idle_poll = next_idle_poll(d->h->cfg, p->idle_poll, got == 0 && !t->finished);
  p->next_poll = t->now + p->idle_poll;
  /* A row due sooner (a retry's backoff, a --delay) is claimed when it is due. */
  if (d->next_due >= 0 && t->now + d->next_due + 0.002 < p->next_poll)
    p->next_poll = t->now + d->next_due + 0.002;
}

/* --until-empty, nothing held and the last claim empty: 1 when the scope has settled (its
   report printed), else 0 with the next look scheduled. */
static int until_empty_settled(struct dispatcher *d, const struct turn *t)
{
  struct host *h = d->h;
  const struct host_config *cfg = h->cfg;
  struct pacing *p = &d->pace;
  char err[DB_ERR_MAX];
  int open = queue_scope_open(d->q, d->conn, &cfg->scope, err, sizeof err);
  if (open == 0) {
    log_info("queue empty for this scope: exiting (--until-empty)");
    /* The scope has settled: its report goes to stdout (logs are on stderr). */
    if (report_print(d->conn, &h->table, cfg->scope.tenants, cfg->scope.batch, 0, stdout, err,
                     sizeof err) != 0)
      log_warn("report: %s", err);
    fflush(stdout);
    return 1;
  }
  if (open < 0)
    connection_failed(d, "until-empty check", err);
  p->next_empty_check = t->now + p->empty_wait;
  if (p->next_empty_check < p->next_poll)
    p->next_poll = p->next_empty_check;
  p->empty_wait *= 2;
  if (p->empty_wait > (double)cfg->poll_min_ms / 1000.0)
    p->empty_wait = (double)cfg->poll_min_ms / 1000.0;
  return 0;
}

/* Draining: no claims. Buffered tasks go back, finished ones are settled, running ones are
   waited for up to the drain deadline and then given back; done when nothing is held. */
static enum step drain_step(struct dispatcher *d, struct turn *t)
{
  if (d->drain_deadline == 0) {
    d->drain_deadline = t->now + d->h->cfg->drain_timeout;
    log_info("draining: %d task%s running, up to %.0f s", t->nheld - t->nready,
             t->nheld - t->nready == 1 ? "" : "s", d->h->cfg->drain_timeout);
  }
  if (t->nready > 0)
    release_ready(d);
  if (t->finished)
    cycle(d, t->finished, 0);
  if (t->nready > 0 || t->finished)
    return STEP_AGAIN;
  if (t->nheld == 0)
    return STEP_EXIT;
  if (t->now >= d->drain_deadline && !d->pace.released) {
    release_running(d);
    d->pace.released = 1;
    return STEP_AGAIN;
  }
  return STEP_WAIT;
}

/* Nothing to do right now: wait for a slot to finish, a wake-up or the next deadline. The
   poll is a deadline only while there is room to claim into: with every slot busy and the
   buffer full, a poll time already past would make this loop spin until a slot finished (it
   did: a third of a one-row worker's CPU went to clock_gettime). */
static void wait_for_news(struct dispatcher *d, const struct turn *t)
{
  struct host *h = d->h;
  const struct pacing *p = &d->pace;
  double until = t->want > 0 && p->next_poll < p->next_progress ? p->next_poll
                                                                 : p->next_progress;
  if (t->draining)
    until = p->released ? t->now + 0.1 : d->drain_deadline;
  if (d->again && d->again_at < until)
    until = d->again_at;
  pthread_mutex_lock(&h->mu);
  if (!d->done && !h->wake && !h->wedged && h->draining == t->draining && d->nidle == t->idle) {
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

/* A slot's script returned (slot.h, under h->mu): its task waits to be settled, and the
   slot takes the next from the ready buffer unless draining. */
static struct task *hand_back(void *arg, struct slot *s, struct task *t)
{
  struct dispatcher *d = arg;
  struct host *h = d->h;
  *d->done_tail = t;
  d->done_tail = &t->next;
  struct task *next = h->draining ? NULL : d->ready;
  if (next) {
    d->ready = next->next;
    if (!d->ready)
      d->ready_tail = &d->ready;
    d->nready--;
    next->next = NULL;
  } else {
    d->idle[d->nidle++] = s;
  }
  pthread_cond_signal(&h->cv);
  return next;
}

/* ---- the claim connection ---- */

/* The claim connection and the table check at start. A database that is away or restarting
   (a failover, a pod scheduled before its database) is waited for, up to START_WAIT_S, as
   after start; a wrong password, a missing database or an unmigrated table fail at once. */
int dispatcher_connect(struct dispatcher *d, char *err, size_t errlen)
{
  struct host *h = d->h;
  double give_up = task_now() + START_WAIT_S;
  for (;;) {
    d->conn = db_connect(h->cfg->conninfo, "claim", CLAIM_TIMEOUT_MS, err, errlen);
    if (d->conn) {
      if (!h->table.qualified &&
          db_table_init(&h->table, d->conn, h->cfg->table, err, errlen) != 0)
        return -1;   /* a bad name or no memory: no database error, nothing to wait for */
      if (migrate_check(d->conn, &h->table, err, errlen) == 0) {
        d->q = queue_new(d->conn, &h->table, h->cfg->worker_id, h->cfg->visibility);
        if (d->q) {
          queue_set_backoff(d->q, h->cfg->backoff_base, h->cfg->backoff_cap,
                            h->cfg->backoff_jitter);
          return 0;
        }
        snprintf(err, errlen, "out of memory starting the host");
        return -1;
      }
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

/* The settle connection, with more than one slot (one slot's turns rarely have both an
   outcome and a claim to make) unless --no-settle-connection. Without it (turned off, no
   memory, no thread), outcomes go on the claim connection. */
static void start_settler(struct dispatcher *d)
{
  const struct host *h = d->h;
  if (h->cfg->concurrency < 2 || !h->cfg->settle_connection || d->settler)
    return;
  struct queue *q = queue_new(d->conn, &h->table, h->cfg->worker_id, h->cfg->visibility);
  if (!q)
    return;
  queue_set_backoff(q, h->cfg->backoff_base, h->cfg->backoff_cap, h->cfg->backoff_jitter);
  d->settler = settler_start(h->cfg->conninfo, q);
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
    lease_registry_add(h->leases, t);
    if (d->nidle > 0) {
      slot_give(d->idle[--d->nidle], t);
    } else {
      *d->ready_tail = t;
      d->ready_tail = &t->next;
      d->nready++;
    }
  }
  pthread_mutex_unlock(&h->mu);
}

/* ---- claim and settle ---- */

/* One round trip: writes the outcomes of finished tasks and claims `want` rows; the settle
   may lease its shards' next rows to this worker (sql/029), which count against want. A task
   whose lease was lost is not written (its outcome is discarded); the fence rejects any
   other late one. Returns the number leased, or -1. */
static int cycle(struct dispatcher *d, struct task *list, int want)
{
  int n = 0;
  struct task *keep = drop_lost(d, list, &n);
  if (n == 0 && want == 0)
    return 0;
  /* A settle may lease the next rows of its tasks' shards to this worker (sql/029), up to the
     `chain` it is given; they count against want. With a settle connection (settler.h) a
     turn's work is shared by two backends:
     - while claims beside a settle find work (pace_after_claim), the outcomes are written
       there, with want as their chain, and this connection claims what that settle is not
       expected to lease (chain_share). Shards settled there and not leased to us are handed
       over in its own transaction, so their next rows are claimable from the next turn on.
       A turn leases at most twice want, when the settle leases more than expected; the next
       turn's want is smaller by as much;
     - when the settle is expected to lease half or more of want (many shards, each running
       its tasks one after another), the settle is most of the turn's work: the outcomes
       are split, the first half settled there and the rest here in one cycle with the
       claim, each half leasing its share of want (so never more than want in all).
     Otherwise one cycle does it all, its claim asking only for what its settle did not
     lease. */
  int expect = chain_expected(d, n, want);
  int there = 0, chain_there = 0;
  if (n > 0 && want > 0 && d->settler) {
    if (2 * expect >= want && n >= 2) {
      there = n / 2;
      chain_there = (int)((long long)want * there / n);
    } else if (expect < want && d->pace.overlap) {
      there = n;
      chain_there = want;
    }
  }
  if (there > 0) {
    struct task *rest = split_list(keep, there);
    char *applied = malloc((size_t)there);
    if (applied && settler_begin(d->settler, keep, there, applied, &d->h->cfg->scope,
                                 chain_there) == 0) {
      int here = want - (rest ? chain_there : expect);
      int got = claim_and_settle(d, rest, n - there, here, rest ? here : 0);
      int chained_here = rest && got >= 0 ? queue_chained(d->q) : 0;
      struct task *leased = NULL;
      char err[DB_ERR_MAX];
      int rc = settler_end(d->settler, &leased, err, sizeof err);
      int chained = take_leased(d, leased);
      got = got < 0 ? chained : got + chained;
      if (rc == 0) {
        d->pace.overlapped = 1;
        settled(d, keep, applied);
        free(applied);
        note_chained(d, chained + chained_here, n, want);
        return got;
      }
      free(applied);
      log_warn("settle connection: %s; writing %d outcome%s on the claim connection", err,
               there, there == 1 ? "" : "s");
      claim_and_settle(d, keep, there, 0, 0);
      return got;
    }
    free(applied);
    join_list(keep, rest);
  }
  int got = claim_and_settle(d, keep, n, want, want);
  if (got >= 0 && n > 0 && want > 0)
    note_chained(d, queue_chained(d->q), n, want);
  return got;
}

/* Cuts list after its first k tasks (k >= 1) and returns the rest. */
static struct task *split_list(struct task *list, int k)
{
  while (--k > 0 && list->next)
    list = list->next;
  struct task *rest = list->next;
  list->next = NULL;
  return rest;
}

static void join_list(struct task *list, struct task *rest)
{
  while (list->next)
    list = list->next;
  list->next = rest;
}

/* Counts and hands out the tasks a cycle leased (claimed, or leased by its settle); returns
   how many. */
static int take_leased(struct dispatcher *d, struct task *list)
{
  int n = 0;
  for (struct task *t = list; t; t = t->next, n++)
    histogram_observe(&d->h->stats.pickup_seconds, t->waited > 0 ? t->waited : 0);
  atomic_fetch_add(&d->h->stats.claimed, n);
  distribute(d, list);
  return n;
}

/* How many of want the settle of n outcomes is expected to lease: the share of recent
   settles' outcomes whose shard's next row they leased. */
static int chain_expected(const struct dispatcher *d, int n, int want)
{
  int most = n < want ? n : want;
  return most > 0 ? (int)(d->chain_share * most + 0.5) : 0;
}

/* A settle of n outcomes given `chain` leased `chained` rows: the share moves halfway there,
   so a change of workload (lanes to own shards and back) is followed within a few turns. */
static void note_chained(struct dispatcher *d, int chained, int n, int chain)
{
  int most = n < chain ? n : chain;
  if (most > 0)
    d->chain_share = 0.5 * d->chain_share + 0.5 * (double)chained / most;
}

/* One round trip on the claim connection, retried while the database is away: writes keep's
   n outcomes (they are finished here), their settle leasing up to `chain` next rows of their
   shards, and claims what is left of `want`. */
static int claim_and_settle(struct dispatcher *d, struct task *keep, int n, int want,
                            int chain)
{
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
    int got = queue_cycle(d->q, d->conn, keep, n, applied, &d->h->cfg->scope, want, chain,
                          &claimed, &d->next_due, err, sizeof err);
    if (got >= 0) {
      double rtt = task_now() - start;
      d->avg_rtt = d->avg_rtt > 0 ? 0.9 * d->avg_rtt + 0.1 * rtt : rtt;
      settled(d, keep, applied);
      free(applied);
      histogram_observe(&d->h->stats.cycle_seconds, rtt);
      take_leased(d, claimed);
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

/* What the fenced writes of keep's outcomes did (applied, in list order): finished, or to be
   written again shortly. */
static void settled(struct dispatcher *d, struct task *keep, const char *applied)
{
  int i = 0;
  while (keep) {
    struct task *t = keep;
    keep = t->next;
    if (applied[i] == SETTLED_AGAIN)
      settle_later(d, t);
    else
      finish_task(d, t, applied[i]);
    i++;
  }
}

/* The outcomes of list that may still be written (*n of them, in order); a task whose lease
   was lost, or ran out before now, is finished here with its outcome discarded. */
static struct task *drop_lost(struct dispatcher *d, struct task *list, int *n)
{
  struct task *keep = NULL, **tail = &keep;
  double now = task_now();
  while (list) {
    struct task *t = list;
    list = t->next;
    t->next = NULL;
    if (now >= atomic_load(&t->lease_deadline))
      dispatch_lose_lease(d->h, t, "lease ran out before the outcome could be written");
    if (atomic_load(&t->lost)) {
      atomic_fetch_add(&d->h->stats.lost, 1);
      log_task(LOG_INFO, d->h, t, "outcome discarded: the lease was lost");
      finish_task(d, t, -1);
      continue;
    }
    *tail = t;
    tail = &t->next;
    (*n)++;
  }
  return keep;
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
    if (applied == SETTLED_AGAIN)
      settle_later(d, t);
    else
      finish_task(d, t, applied);
  }
}

/* One outcome, by a cycle that claims nothing. 0, or -1 with err. */
static int settle_alone(struct dispatcher *d, struct task *t, char *applied, char *err,
                        size_t errlen)
{
  struct task *none = NULL;
  double due;
  return queue_cycle(d->q, d->conn, t, 1, applied, &d->h->cfg->scope, 0, 0, &none, &due, err,
                     errlen) < 0 ? -1 : 0;
}

/* applied: SETTLED_* (what the fenced write did), or -1 when it was not written (the
   database away at the end, no memory): the lease expires and the task runs again. */
static void finish_task(struct dispatcher *d, struct task *t, int applied)
{
  if (t->finished)
    note_duration(d, t->duration);
  if (applied == SETTLED_DONE) {
    atomic_fetch_add(&d->h->stats.done, 1);
    log_task(LOG_DEBUG, d->h, t, "done in %.3f s", t->duration);
  } else if (applied == SETTLED_PENDING) {
    /* A snooze is counted with the retries (pending again); the log line tells them apart
       (one past max_snoozes is a retry the settle wrote: its cause says snooze_limit). */
    atomic_fetch_add(&d->h->stats.retried, 1);
    log_task(LOG_INFO, d->h, t, "%s: %s", t->out.kind == OUTCOME_SNOOZE ? "snooze"
             : t->out.kind == OUTCOME_WAIT ? "wait" : "retry",
             t->out.error ? t->out.error : "");
  } else if (applied >= SETTLED_DEAD) {
    /* The database decides: a retry with no attempt left was written dead, a crash cause
       that reached max_crashes quarantined, a row it could not write was set aside. */
    enum dead_reason why = applied == SETTLED_QUARANTINED ? DEAD_QUARANTINED
                           : applied == SETTLED_BAD_ROW   ? DEAD_BAD_ROW
                           : t->out.kind == OUTCOME_FATAL ? DEAD_FATAL
                                                          : DEAD_EXHAUSTED;
    /* A snooze that died was one past max_snoozes: the settle wrote snooze_limit. */
    unsigned cause = t->out.kind == OUTCOME_SNOOZE              ? CAUSE_SNOOZE_LIMIT
                     : (unsigned)t->out.cause < CAUSE_COUNT ? t->out.cause
                                                              : CAUSE_NONE;
    atomic_fetch_add(&d->h->stats.dead[why][cause], 1);
    log_task(LOG_INFO, d->h, t, "dead: %s", t->out.error ? t->out.error : "");
  } else if (applied == SETTLED_LATE) {
    atomic_fetch_add(&d->h->stats.late, 1);
    log_task(LOG_WARN, d->h, t, "late outcome rejected (%s): the lease was no longer ours",
             lifecycle_kind_sql(t->out.kind));
  }
  /* After the settle, on the claim connection: a recorded execution costs one more
     statement; the settle stays one round trip (record.h). */
  record_store(d->conn, &d->h->table, t, applied);
  lease_registry_remove(d->h->leases, t);
  task_free(t);
}

/* One compact line every PROGRESS_EVERY_S while tasks settle; returns the settled count. */
static long long log_progress(struct dispatcher *d, long long before)
{
  struct metrics_counters *c = &d->h->stats;
  long long done = atomic_load(&c->done), retried = atomic_load(&c->retried);
  long long dead = metrics_dead_total(c), settled = done + retried + dead;
  if (settled == before)
    return settled;
  int held = lease_registry_count(d->h->leases);
  log_info("progress: %lld done, %lld retried, %lld dead, %lld lost; %.1f tasks/s; "
           "%d/%d slots busy, %d leases held", done, retried, dead,
           (long long)atomic_load(&c->lost), (double)(settled - before) / PROGRESS_EVERY_S,
           atomic_load(&c->busy_slots), d->h->cfg->concurrency, held);
  return settled;
}

/* Records a run time and recomputes the longest of the recent ones. */
static void note_duration(struct dispatcher *d, double seconds)
{
  d->recent[d->recent_next] = seconds > 1e-6 ? seconds : 1e-6;
  d->recent_next = (d->recent_next + 1) % RECENT_RUNS;
  if (d->nrecent < RECENT_RUNS)
    d->nrecent++;
  double longest = 0;
  for (int i = 0; i < d->nrecent; i++)
    longest = d->recent[i] > longest ? d->recent[i] : longest;
  d->typical_duration = longest;
}

/* How many claimed-but-not-started tasks to keep so slots never wait for a round trip:
   enough for what the slots finish during two round trips, from the task duration (the
   longest of the recent ones) and round-trip time; 0 for long tasks, where a buffered task would only
   wait. Never more than READY_PER_SLOT per slot, however short the tasks, so that leases
   spread over pods and a pod that dies strands few (issue #14): tasks of a few ms with a
   round trip of 1 ms come to about one per slot, and only tasks far shorter than a round
   trip (no-ops) reach the cap. */
static int ready_target(const struct dispatcher *d)
{
  /* Nothing is buffered before a full window of run times: the first few tasks (and the
     first round trips, slowed by planning) say little about the rest. */
  if (d->nrecent < RECENT_RUNS || d->avg_rtt <= 0)
    return 0;
  double x = 2.0 * d->h->cfg->concurrency * d->avg_rtt / d->typical_duration;
  if (x < 1)
    return 0;
  int per_slot = READY_PER_SLOT * d->h->cfg->concurrency;
  int cap = d->h->cfg->claim_batch < per_slot ? d->h->cfg->claim_batch : per_slot;
  return x > cap ? cap : (int)ceil(x);
}

/* ---- drain and wedge ---- */

/* Drain deadline: tasks still running are stopped and their leases go back to pending now,
   not after they expire. Their outcome is discarded when they come back. */
static void release_running(struct dispatcher *d)
{
  struct host *h = d->h;
  int n = 0;
  /* No log line per task: the release below says it. */
  struct lease_key *keys = lease_registry_give_up(h->leases, NULL, &n);
  stop_tasks(h);
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

/* Every running script must stop now: the count hook sees `stopping`, leash.sleep is woken. */
static void stop_tasks(struct host *h)
{
  atomic_store(&h->stopping, 1);
  pthread_mutex_lock(&h->wake_mu);
  pthread_cond_broadcast(&h->wake_cv);
  pthread_mutex_unlock(&h->wake_mu);
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
  struct wedge_plan p = { .tail = &p.settle };
  plan_wedge(d, &p);
  stop_tasks(h);
  const char *wrote = settle_wedge(d, &p);
  int given = 0;
  if (p.nkeys > 0 && ensure_connection(d)) {
    char err[DB_ERR_MAX];
    given = queue_release(d->q, d->conn, p.keys, p.nkeys, err, sizeof err);
    if (given < 0)
      log_warn("watchdog: giving back %d lease%s failed (%s); they expire instead", p.nkeys,
               p.nkeys == 1 ? "" : "s", err);
  }
  char id[32] = "", attempt[16] = "";
  if (p.w) {
    snprintf(id, sizeof id, "%lld", (long long)p.w->id);
    snprintf(attempt, sizeof attempt, "%d", p.w->attempt);
  }
  struct log_field f[] = {
    { "task_id", p.w ? id : NULL }, { "attempt", p.w ? attempt : NULL },
    { "worker", h->cfg->worker_id }, { NULL, NULL },
  };
  log_fields(LOG_ERROR, f, "watchdog: wedged task %s; %d other lease%s given back to pending; "
             "exiting with status %d without waiting for the wedged slot", wrote,
             given > 0 ? given : 0, given == 1 ? "" : "s", HOST_EXIT_WEDGED);
  fflush(stdout);
  _exit(HOST_EXIT_WEDGED);
}

/* Under mu, at once: no more claims; the wedged task's settle as a copy; copies of the
   outcomes that finished before now (their tasks marked lost so nothing else writes them);
   the keys of every other lease, marked lost. */
static void plan_wedge(struct dispatcher *d, struct wedge_plan *p)
{
  struct host *h = d->h;
  pthread_mutex_lock(&h->mu);
  h->draining = 1;
  atomic_store(&h->stats.ready, 0);
  snprintf(p->why, sizeof p->why, "%s", h->wedged_why);
  p->w = h->wedged_task;
  if (p->w && h->wedged_settle) {
    p->copy = calloc(1, sizeof *p->copy);
    if (p->copy) {
      p->copy->id = p->w->id;
      p->copy->attempt = p->w->attempt;
      p->copy->token = p->w->token;
      p->copy->claimed_at = p->w->claimed_at;
      p->copy->run_start = p->w->run_start;
      p->copy->max_attempts = p->w->max_attempts;
      p->copy->waited = p->w->waited;
      memcpy(p->copy->version, p->w->version, sizeof p->copy->version);
      memcpy(p->copy->label, p->w->label, sizeof p->copy->label);
      p->copy->out.delay = -1;
      char msg[sizeof p->why + 64];
      snprintf(msg, sizeof msg, "%s; the worker restarted", p->why);
      outcome_set(&p->copy->out, OUTCOME_RETRY, CAUSE_WEDGED, "wedged: ", msg);
    }
  }
  /* Outcomes that finished before now are written like any others (those waiting to be
     written again too: the dispatcher thread runs this). */
  if (d->again) {
    *d->again_tail = d->done;
    if (!d->done)
      d->done_tail = d->again_tail;
    d->done = d->again;
    d->again = NULL;
    d->again_tail = &d->again;
  }
  for (struct task *t = d->done; t; t = t->next)
    if (t != p->w && !atomic_load(&t->lost)) {
      atomic_store(&t->lost, 1);   /* not released below; the copy in `settle` is written */
      struct task *c = calloc(1, sizeof *c);
      if (!c)
        continue;
      c->id = t->id;
      c->attempt = t->attempt;
      c->token = t->token;
      c->claimed_at = t->claimed_at;
      c->run_start = t->run_start;
      c->max_attempts = t->max_attempts;
      c->waited = t->waited;
      memcpy(c->version, t->version, sizeof c->version);
      memcpy(c->label, t->label, sizeof c->label);
      c->out = t->out;   /* borrowed: the task is never freed before _exit */
      *p->tail = c;
      p->tail = &c->next;
      p->nsettle++;
    }
  /* The wedged one is settled (through the copy); a lost one is not ours to give back. */
  p->keys = lease_registry_give_up(h->leases, p->w, &p->nkeys);
  pthread_mutex_unlock(&h->mu);
  if (p->copy) {
    *p->tail = p->copy;
    p->nsettle++;
  }
}

/* Writes the plan's outcomes in one cycle that claims nothing; says what became of the
   wedged task, for the last log line. */
static const char *settle_wedge(struct dispatcher *d, const struct wedge_plan *p)
{
  const char *wrote = p->w ? "not settled (its lease was already lost or given back)"
                           : "none (the slot was closing a Lua state)";
  if (p->nsettle == 0)
    return wrote;
  /* Named before the connection is tried: ensure_connection fills no message of its own
     (a log line once showed uninitialised stack here, as "(not valid UTF-8)"). */
  char err[DB_ERR_MAX] = "no connection to the database";
  char *applied = calloc((size_t)p->nsettle, 1);
  struct task *none = NULL;
  double due;
  if (applied && ensure_connection(d) &&
      queue_cycle(d->q, d->conn, p->settle, p->nsettle, applied, &d->h->cfg->scope, 0, 0,
                  &none, &due, err, sizeof err) >= 0) {
    char last = applied[p->nsettle - 1];
    if (p->copy)
      wrote = last == SETTLED_PENDING       ? "settled: retry (cause wedged)"
              : last == SETTLED_QUARANTINED ? "settled: dead (cause wedged, quarantined)"
              : last >= SETTLED_DEAD        ? "settled: dead (cause wedged, no attempts left)"
                                            : "settle rejected: the lease was no longer ours";
  } else {
    wrote = "could not be settled: its lease expires instead";
    log_warn("watchdog: settling %d outcome%s failed: %s", p->nsettle,
             p->nsettle == 1 ? "" : "s", applied ? err : "out of memory");
  }
  free(applied);
  return wrote;
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
    lease_registry_remove(h->leases, t);
  pthread_mutex_unlock(&h->mu);
  struct lease_key *keys = malloc((size_t)(n > 0 ? n : 1) * sizeof *keys);
  int i = 0;
  for (struct task *t = list; keys && t; t = t->next)
    keys[i++] = (struct lease_key){ .id = t->id, .token = t->token };
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

/* ---- pacing and logs ---- */

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

void dispatch_log_task(enum log_level lvl, const struct host *h, const struct task *t,
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
