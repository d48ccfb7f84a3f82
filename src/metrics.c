/* metrics: counters, histograms and the HTTP endpoint. See metrics.h. */
#include "metrics.h"

#include "lifecycle.h"

#include <dirent.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const double bucket_bounds[METRICS_BUCKETS] = {
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600,
};

/* A request, from its first byte (or the end of the last one on a kept-alive connection),
   must be answered within this; the idle timeout alone is reset by every byte, so 40
   clients trickling a header each held every connection and /healthz failed. */
#define METRICS_REQUEST_DEADLINE_S 5.0
#define METRICS_IDLE_TIMEOUT_S 5u
/* Many more connections than a prober and a scraper need, within the process's fd limit. */
#define METRICS_CONNECTIONS_MAX 1024u

/* One open connection, known to the deadline thread. */
struct conn_entry {
  int fd;
  double start;             /* monotonic seconds: connection start or last request's end */
  int cut;                  /* shut down by the deadline thread */
  struct conn_entry *prev, *next;
};

struct metrics {
  struct MHD_Daemon *daemon;
  struct metrics_counters *c;
  metrics_gauges_fn *gauges;
  void *arg;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct conn_entry *conns;
  int stopping;
  pthread_t deadline_thread;
  int thread_started;
};

struct text {
  char *s;
  size_t len, cap;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **state);
static void render(struct metrics *m, struct text *out);
static void put_budgets(struct text *b, struct metrics_counters *c);
static void put_http(struct text *b, struct metrics_counters *c);
static void put_process(struct text *b);
static void put_label(char *label, size_t size, const char *name);
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code);
static void on_completed(void *cls, struct MHD_Connection *conn, void **state,
                         enum MHD_RequestTerminationCode code);
static void *deadline_main(void *arg);
static double mono_now(void);
static unsigned connection_limit(void);
static void put(struct text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_histogram(struct text *b, const char *name, const char *help,
                          struct histogram *h);

void metrics_counters_init(struct metrics_counters *c)
{
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->budgets_mu, NULL);
  atomic_store(&c->queue_runnable, -1);
  atomic_store(&c->queue_scheduled, -1);
  atomic_store(&c->queue_leased, -1);
  atomic_store(&c->queue_oldest_ms, -1);
}

static const char *const http_class_names[HTTP_CLASSES] = {
  [HTTP_2XX] = "2xx", [HTTP_3XX] = "3xx", [HTTP_4XX] = "4xx", [HTTP_429] = "429",
  [HTTP_5XX] = "5xx", [HTTP_ERROR] = "error",
};

void metrics_http_response(struct metrics_counters *c, const char *budget, long status)
{
  enum http_class k = status == 429 ? HTTP_429
                    : status >= 200 && status < 300 ? HTTP_2XX
                    : status >= 300 && status < 400 ? HTTP_3XX
                    : status >= 400 && status < 500 ? HTTP_4XX
                    : status >= 500 && status < 600 ? HTTP_5XX : HTTP_ERROR;
  if (!budget) {
    atomic_fetch_add(&c->http_unbudgeted[k], 1);
    return;
  }
  struct budget_counters *b = metrics_budget(c, budget);
  atomic_fetch_add(b ? &b->http[k] : &c->http_untracked[k], 1);
}

struct budget_counters *metrics_budget(struct metrics_counters *c, const char *name)
{
  int i;
  for (i = 0; i < METRICS_BUDGETS && atomic_load(&c->budgets[i].ready); i++)
    if (strcmp(c->budgets[i].name, name) == 0)
      return &c->budgets[i];
  /* Not there: add it under the lock (another slot may be adding the same name). */
  struct budget_counters *found = NULL;
  pthread_mutex_lock(&c->budgets_mu);
  for (i = 0; i < METRICS_BUDGETS && atomic_load(&c->budgets[i].ready); i++)
    if (strcmp(c->budgets[i].name, name) == 0)
      break;
  if (i < METRICS_BUDGETS) {
    found = &c->budgets[i];
    if (!atomic_load(&found->ready)) {
      snprintf(found->name, sizeof found->name, "%s", name);
      atomic_store(&found->ready, 1);   /* seq_cst: the name is written before it is read */
    }
  }
  pthread_mutex_unlock(&c->budgets_mu);
  return found;
}

long long metrics_dead_total(struct metrics_counters *c)
{
  long long n = 0;
  for (int r = 0; r < DEAD_REASONS; r++)
    for (int k = 0; k < CAUSE_COUNT; k++)
      n += atomic_load(&c->dead[r][k]);
  return n;
}

void histogram_observe(struct histogram *h, double seconds)
{
  int i = 0;
  while (i < METRICS_BUCKETS && seconds > bucket_bounds[i])
    i++;
  atomic_fetch_add(&h->buckets[i], 1);
  atomic_fetch_add(&h->sum_us, (long long)(seconds * 1e6));
  atomic_fetch_add(&h->count, 1);
}

struct metrics *metrics_start(const char *addr, struct metrics_counters *counters,
                              metrics_gauges_fn *gauges, void *arg, char *err, size_t errlen)
{
  char host[256];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon[1] == '\0') {
    snprintf(err, errlen, "--metrics: expected HOST:PORT, got '%s'", addr);
    return NULL;
  }
  size_t hl = (size_t)(colon - addr);
  if (hl >= sizeof host)
    hl = sizeof host - 1;
  memcpy(host, addr, hl);
  host[hl] = '\0';
  if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') {   /* [::1] */
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = '\0';
  }
  struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_PASSIVE };
  struct addrinfo *ai = NULL;
  int rc = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &ai);
  if (rc != 0) {
    snprintf(err, errlen, "--metrics %s: %s", addr, gai_strerror(rc));
    return NULL;
  }
  struct metrics *m = calloc(1, sizeof *m);
  if (!m) {
    freeaddrinfo(ai);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  m->c = counters;
  m->gauges = gauges;
  m->arg = arg;
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv, NULL);
  /* epoll (MHD_USE_AUTO): hundreds of sockets, and fds above FD_SETSIZE, are fine. */
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  if (ai->ai_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  m->daemon = MHD_start_daemon(flags, 0, NULL, NULL, answer, m, MHD_OPTION_SOCK_ADDR,
                               ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT,
                               METRICS_IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT,
                               connection_limit(), MHD_OPTION_NOTIFY_CONNECTION, on_connection,
                               m, MHD_OPTION_NOTIFY_COMPLETED, on_completed, m, MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!m->daemon) {
    snprintf(err, errlen, "--metrics: cannot listen on %s (in use, or not a local address?)",
             addr);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
    return NULL;
  }
  if (pthread_create(&m->deadline_thread, NULL, deadline_main, m) != 0) {
    snprintf(err, errlen, "--metrics: cannot start a thread");
    metrics_stop(m);
    return NULL;
  }
  m->thread_started = 1;
  return m;
}

/* The fd limit shared with the database connections and the scripts: a quarter of it. */
static unsigned connection_limit(void)
{
  struct rlimit rl;
  unsigned n = METRICS_CONNECTIONS_MAX;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur / 4 < n)
    n = rl.rlim_cur / 4 > 16 ? (unsigned)(rl.rlim_cur / 4) : 16;
  return n;
}

static double mono_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Called on MHD's thread when a connection opens and closes (before its socket is closed,
   so the deadline thread never shuts down an fd that was reused). */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
  struct metrics *m = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct conn_entry *e = info ? calloc(1, sizeof *e) : NULL;
    *socket_context = e;
    if (!e)
      return;   /* without memory it is bounded by the idle timeout only */
    e->fd = info->connect_fd;
    e->start = mono_now();
    pthread_mutex_lock(&m->mu);
    e->next = m->conns;
    if (m->conns)
      m->conns->prev = e;
    m->conns = e;
    pthread_mutex_unlock(&m->mu);
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    struct conn_entry *e = *socket_context;
    if (!e)
      return;
    pthread_mutex_lock(&m->mu);
    if (e->prev)
      e->prev->next = e->next;
    else
      m->conns = e->next;
    if (e->next)
      e->next->prev = e->prev;
    pthread_mutex_unlock(&m->mu);
    free(e);
    *socket_context = NULL;
  }
}

/* A request answered: the next one on the same connection gets its own deadline. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **state,
                         enum MHD_RequestTerminationCode code)
{
  (void)state, (void)code;
  struct metrics *m = cls;
  const union MHD_ConnectionInfo *info =
    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  struct conn_entry *e = info ? info->socket_context : NULL;
  if (!e)
    return;
  pthread_mutex_lock(&m->mu);
  e->start = mono_now();
  pthread_mutex_unlock(&m->mu);
}

/* Every 200 ms: a connection past its deadline is shut down (not closed: MHD owns the fd
   and closes it when it sees the end of the stream), which frees its place. */
static void *deadline_main(void *arg)
{
  struct metrics *m = arg;
  pthread_mutex_lock(&m->mu);
  while (!m->stopping) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 200 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&m->cv, &m->mu, &until);
    double now = mono_now();
    for (struct conn_entry *e = m->conns; e; e = e->next)
      if (!e->cut && now - e->start > METRICS_REQUEST_DEADLINE_S) {
        shutdown(e->fd, SHUT_RDWR);
        e->cut = 1;
      }
  }
  pthread_mutex_unlock(&m->mu);
  return NULL;
}

void metrics_stop(struct metrics *m)
{
  if (!m)
    return;
  if (m->thread_started) {
    pthread_mutex_lock(&m->mu);
    m->stopping = 1;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->deadline_thread, NULL);
  }
  MHD_stop_daemon(m->daemon);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m);
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, char *body,
                             size_t len, const char *type)
{
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  enum MHD_Result ret = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **state)
{
  (void)version, (void)upload, (void)upload_len, (void)state;
  struct metrics *m = cls;
  struct metrics_counters *c = m->c;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return reply(conn, 405, strdup("method not allowed\n"), 19, "text/plain");
  if (strcmp(url, "/metrics") == 0) {
    struct text b = { 0 };
    render(m, &b);
    if (!b.s)
      return MHD_NO;
    return reply(conn, 200, b.s, b.len, "text/plain; version=0.0.4");
  }
  if (strcmp(url, "/livez") == 0) {
    /* Alive and not wedged; the database is not asked (a restart would not bring it back). */
    struct metrics_gauges g = { 0 };
    m->gauges(m->arg, &g);
    return reply(conn, g.wedged ? 503 : 200, strdup(g.wedged ? "wedged\n" : "alive\n"),
                 g.wedged ? 7 : 6, "text/plain");
  }
  if (strcmp(url, "/healthz") == 0) {
    int up = atomic_load(&c->db_up);
    return reply(conn, up ? 200 : 503, strdup(up ? "ok\n" : "database unreachable\n"),
                 up ? 3 : 21, "text/plain");
  }
  if (strcmp(url, "/readyz") == 0) {
    int ready = atomic_load(&c->ready) && atomic_load(&c->db_up);
    return reply(conn, ready ? 200 : 503, strdup(ready ? "ready\n" : "not ready\n"),
                 ready ? 6 : 10, "text/plain");
  }
  return reply(conn, 404, strdup("not found\n"), 10, "text/plain");
}

static void render(struct metrics *m, struct text *b)
{
  struct metrics_counters *c = m->c;
  struct metrics_gauges g = { 0 };
  m->gauges(m->arg, &g);
  static const struct {
    const char *name, *help;
    size_t offset;
  } counters[] = {
    { "leash_tasks_claimed_total", "Tasks leased by this process.",
      offsetof(struct metrics_counters, claimed) },
    { "leash_tasks_done_total", "Tasks settled done.", offsetof(struct metrics_counters, done) },
    { "leash_tasks_retried_total", "Tasks settled as a retry and pending again (a retry with "
      "no attempt left is in leash_tasks_dead_total, reason exhausted).",
      offsetof(struct metrics_counters, retried) },
    { "leash_leases_lost_total", "Tasks whose lease was lost; their outcome was discarded.",
      offsetof(struct metrics_counters, lost) },
    { "leash_late_outcomes_rejected_total", "Outcomes the fence rejected (the lease had moved on).",
      offsetof(struct metrics_counters, late) },
  };
  for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
    atomic_llong *v = (atomic_llong *)((char *)c + counters[i].offset);
    put(b, "# HELP %s %s\n# TYPE %s counter\n%s %lld\n", counters[i].name, counters[i].help,
        counters[i].name, counters[i].name, (long long)atomic_load(v));
  }
  /* Every task that went dead, whichever way: only the series seen so far, and fatal/exhausted
     at 0 from the start, so an alert's rate() has a series before the first death. */
  static const char *const reasons[DEAD_REASONS] = {
    [DEAD_FATAL] = "fatal", [DEAD_EXHAUSTED] = "exhausted", [DEAD_QUARANTINED] = "quarantined",
    [DEAD_BAD_ROW] = "bad_row",
  };
  put(b, "# HELP leash_tasks_dead_total Tasks that went dead, by reason (fatal, exhausted, "
         "quarantined, bad_row) and the last execution's cause; reaped ones by the process "
         "that reaped them.\n# TYPE leash_tasks_dead_total counter\n");
  for (int r = 0; r < DEAD_REASONS; r++)
    for (int k = 0; k < CAUSE_COUNT; k++) {
      long long v = atomic_load(&c->dead[r][k]);
      int always = (r == DEAD_FATAL && k == CAUSE_RETURNED) || (r == DEAD_EXHAUSTED && k == CAUSE_ERROR);
      if (v || always)
        put(b, "leash_tasks_dead_total{reason=\"%s\",cause=\"%s\"} %lld\n", reasons[r],
            lifecycle_cause_name((enum outcome_cause)k), v);
    }
  put(b, "# HELP leash_script_reloads_total Hot swaps tried, by result.\n"
         "# TYPE leash_script_reloads_total counter\n"
         "leash_script_reloads_total{result=\"loaded\"} %lld\n"
         "leash_script_reloads_total{result=\"refused\"} %lld\n",
      (long long)atomic_load(&c->reloads_loaded), (long long)atomic_load(&c->reloads_refused));
  put(b, "# HELP leash_canary_rollbacks_total Canary rollbacks this process applied.\n"
         "# TYPE leash_canary_rollbacks_total counter\nleash_canary_rollbacks_total %lld\n"
         "# HELP leash_canary_promotions_total Canary promotions this process applied.\n"
         "# TYPE leash_canary_promotions_total counter\nleash_canary_promotions_total %lld\n"
         "# HELP leash_canary_share Percent of tasks the running canary takes (0: none).\n"
         "# TYPE leash_canary_share gauge\nleash_canary_share %d\n",
      (long long)atomic_load(&c->canary_rollbacks),
      (long long)atomic_load(&c->canary_promotions), atomic_load(&c->canary_share));
  put(b, "# HELP leash_build_info The leash binary.\n# TYPE leash_build_info gauge\n"
         "leash_build_info{version=\"%s\"} 1\n", LEASH_VERSION);
  put(b, "# HELP leash_script_info The script version the slots load (SHA-256 over the script "
         "and its modules).\n# TYPE leash_script_info gauge\n"
         "leash_script_info{version=\"%s\"} 1\n", g.script_version);
  put(b, "# HELP leash_slots Slots (threads) in this process.\n# TYPE leash_slots gauge\n"
         "leash_slots %d\n", g.slots);
  put(b, "# HELP leash_slots_busy Slots running a task.\n# TYPE leash_slots_busy gauge\n"
         "leash_slots_busy %d\n", atomic_load(&c->busy_slots));
  put(b, "# HELP leash_leases_held Leases this process holds (running, buffered or settling).\n"
         "# TYPE leash_leases_held gauge\nleash_leases_held %d\n", g.leases_held);
  /* Queue-wide gauges: only the fleet's metrics leader exports them, so sum() and max() over
     pods are both the table's numbers (lease.c, README "Metrics"). */
  int leader = atomic_load(&c->metrics_leader);
  long long runnable = atomic_load(&c->queue_runnable);
  put(b, "# HELP leash_metrics_leader 1 in the one process that exports the queue-wide gauges "
         "(leash_queue_*, leash_budgets_paused) for its table.\n"
         "# TYPE leash_metrics_leader gauge\nleash_metrics_leader %d\n", leader && runnable >= 0);
  if (leader && runnable >= 0) {
    put(b, "# HELP leash_queue_depth Tasks in the queue table by state (whole table, sampled "
           "every 10 s by the metrics leader only).\n# TYPE leash_queue_depth gauge\n");
    put(b, "leash_queue_depth{state=\"runnable\"} %lld\n", runnable);
    put(b, "leash_queue_depth{state=\"scheduled\"} %lld\n", (long long)atomic_load(&c->queue_scheduled));
    put(b, "leash_queue_depth{state=\"leased\"} %lld\n", (long long)atomic_load(&c->queue_leased));
    long long oldest = atomic_load(&c->queue_oldest_ms);
    put(b, "# HELP leash_queue_oldest_runnable_age_seconds How long the oldest runnable task "
           "has waited (0 when none is runnable; metrics leader only).\n"
           "# TYPE leash_queue_oldest_runnable_age_seconds gauge\n"
           "leash_queue_oldest_runnable_age_seconds %.3f\n", oldest < 0 ? 0.0 : (double)oldest / 1000);
    put(b, "# HELP leash_budgets_paused Budgets paused now, for the fleet (metrics leader "
           "only).\n# TYPE leash_budgets_paused gauge\nleash_budgets_paused %lld\n",
        (long long)atomic_load(&c->budgets_paused));
  }
  put(b, "# HELP leash_database_up 1 while the lease connection is up.\n"
         "# TYPE leash_database_up gauge\nleash_database_up %d\n", atomic_load(&c->db_up));
  put_budgets(b, c);
  put_histogram(b, "leash_task_duration_seconds", "Time handle(task) ran.", &c->task_seconds);
  put_histogram(b, "leash_cycle_duration_seconds",
                "Round trip of one settle-and-claim cycle (settles the finished tasks and claims "
                "new ones in one statement).", &c->cycle_seconds);
  put_histogram(b, "leash_claim_duration_seconds",
                "DEPRECATED, removed in the next release: the same as "
                "leash_cycle_duration_seconds (it never timed a claim alone).", &c->cycle_seconds);
  put_histogram(b, "leash_pickup_latency_seconds",
                "From a task becoming runnable (created or run_after) to its claim.",
                &c->pickup_seconds);
  put_http(b, c);
  put_process(b);
}

/* Per budget, this process's own counts (sum() over pods is right): only budgets this
   process has used. */
static void put_budgets(struct text *b, struct metrics_counters *c)
{
  static const struct {
    const char *name, *help;
    size_t offset;
    int seconds;
  } series[] = {
    { "leash_budget_grants_total", "Budgeted calls and blocks granted, by budget.",
      offsetof(struct budget_counters, grants), 0 },
    { "leash_budget_refused_total", "Budgeted calls the provider answered 429 or 503 (each "
      "paused the budget for the fleet).", offsetof(struct budget_counters, refused), 0 },
    { "leash_budget_yields_total", "Tasks that gave their slot back waiting for the budget "
      "(longer than --budget-wait).", offsetof(struct budget_counters, yields), 0 },
    { "leash_budget_wait_seconds_total", "Time slots waited for a grant.",
      offsetof(struct budget_counters, wait_us), 1 },
    { "leash_budget_tokens_total", "Tokens the answers (or leash.usage) reported.",
      offsetof(struct budget_counters, tokens), 0 },
  };
  for (size_t k = 0; k < sizeof series / sizeof series[0]; k++) {
    put(b, "# HELP %s %s\n# TYPE %s counter\n", series[k].name, series[k].help, series[k].name);
    for (int i = 0; i < METRICS_BUDGETS && atomic_load(&c->budgets[i].ready); i++) {
      struct budget_counters *e = &c->budgets[i];
      char label[2 * METRICS_BUDGET_NAME_MAX + 1];
      put_label(label, sizeof label, e->name);
      long long v = atomic_load((atomic_llong *)((char *)e + series[k].offset));
      if (series[k].seconds)
        put(b, "%s{budget=\"%s\"} %.6f\n", series[k].name, label, (double)v / 1e6);
      else
        put(b, "%s{budget=\"%s\"} %lld\n", series[k].name, label, v);
    }
  }
  put(b, "# HELP leash_budget_untracked_grants_total Grants of budgets past the first %d names "
         "this process used (not labelled).\n# TYPE leash_budget_untracked_grants_total "
         "counter\nleash_budget_untracked_grants_total %lld\n", METRICS_BUDGETS,
      (long long)atomic_load(&c->budgets_untracked));
}

static void put_label(char *label, size_t size, const char *name)
{
  size_t n = 0;
  for (const char *p = name; *p && n + 2 < size; p++) {
    if (*p == '"' || *p == '\\')
      label[n++] = '\\';
    label[n++] = *p;   /* names hold no control characters (api_budget.c) */
  }
  label[n] = '\0';
}

/* leash.http.request responses by class and budget (budget="": none; "(untracked)": past
   the first METRICS_BUDGETS names). Every class of budget="" from the start. */
static void put_http(struct text *b, struct metrics_counters *c)
{
  put(b, "# HELP leash_http_responses_total Responses leash.http.request got, by class (2xx, "
         "3xx, 4xx without 429, 429, 5xx, error: no answer) and budget (\"\": none); each "
         "send counts, resends after a 429 too.\n# TYPE leash_http_responses_total counter\n");
  for (int k = 0; k < HTTP_CLASSES; k++)
    put(b, "leash_http_responses_total{class=\"%s\",budget=\"\"} %lld\n", http_class_names[k],
        (long long)atomic_load(&c->http_unbudgeted[k]));
  for (int i = 0; i < METRICS_BUDGETS && atomic_load(&c->budgets[i].ready); i++) {
    char label[2 * METRICS_BUDGET_NAME_MAX + 1];
    put_label(label, sizeof label, c->budgets[i].name);
    for (int k = 0; k < HTTP_CLASSES; k++) {
      long long v = atomic_load(&c->budgets[i].http[k]);
      if (v)
        put(b, "leash_http_responses_total{class=\"%s\",budget=\"%s\"} %lld\n",
            http_class_names[k], label, v);
    }
  }
  for (int k = 0; k < HTTP_CLASSES; k++) {
    long long v = atomic_load(&c->http_untracked[k]);
    if (v)
      put(b, "leash_http_responses_total{class=\"%s\",budget=\"(untracked)\"} %lld\n",
          http_class_names[k], v);
  }
}

/* The standard process metrics, from /proc (each left out when it cannot be read). */
static void put_process(struct text *b)
{
  long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  char stat[1024];
  FILE *f = fopen("/proc/self/stat", "r");
  size_t n = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
  if (f)
    fclose(f);
  stat[n] = '\0';
  /* Fields after the command (which may hold spaces and parens): state is field 3. */
  char *p = strrchr(stat, ')');
  unsigned long long utime = 0, stime = 0, start = 0;
  long rss = -1;
  int got = p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d "
                                "%*d %*d %*d %*d %llu %*u %ld", &utime, &stime, &start, &rss) == 4;
  if (got && tick > 0) {
    put(b, "# HELP process_cpu_seconds_total Total user and system CPU time spent in "
           "seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total "
           "%.2f\n", (double)(utime + stime) / (double)tick);
    put(b, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
           "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %lld\n",
        (long long)rss * page);
    /* starttime is in ticks since boot; btime (/proc/stat) is the boot in Unix seconds. */
    f = fopen("/proc/stat", "r");
    char line[256];
    long long btime = -1;
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, "btime %lld", &btime) == 1)
        break;
    if (f)
      fclose(f);
    if (btime >= 0)
      put(b, "# HELP process_start_time_seconds Start time of the process since unix epoch in "
             "seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds "
             "%.2f\n", (double)btime + (double)start / (double)tick);
  }
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    long fds = 0;
    while (readdir(d))
      fds++;
    closedir(d);
    fds -= 3;   /* ".", ".." and the directory's own fd */
    put(b, "# HELP process_open_fds Number of open file descriptors.\n"
           "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n", fds < 0 ? 0 : fds);
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    put(b, "# HELP process_max_fds Maximum number of open file descriptors.\n"
           "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
}

static void put_histogram(struct text *b, const char *name, const char *help,
                          struct histogram *h)
{
  put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  long long cum = 0;
  for (int i = 0; i < METRICS_BUCKETS; i++) {
    cum += atomic_load(&h->buckets[i]);
    put(b, "%s_bucket{le=\"%g\"} %lld\n", name, bucket_bounds[i], cum);
  }
  cum += atomic_load(&h->buckets[METRICS_BUCKETS]);
  put(b, "%s_bucket{le=\"+Inf\"} %lld\n", name, cum);
  put(b, "%s_sum %.6f\n%s_count %lld\n", name, (double)atomic_load(&h->sum_us) / 1e6, name,
      (long long)atomic_load(&h->count));
}

static void put(struct text *b, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  char line[1024];
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  if ((size_t)n >= sizeof line)
    n = sizeof line - 1;
  if (b->len + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 8192;
    while (cap < b->len + (size_t)n + 1)
      cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s)
      return;
    b->s = s;
    b->cap = cap;
  }
  memcpy(b->s + b->len, line, (size_t)n);
  b->len += (size_t)n;
  b->s[b->len] = '\0';
}
