/* metrics: counters, histograms and the HTTP endpoint. See metrics.h. */
#include "metrics.h"

#include "host_internal.h"

#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static const double bucket_bounds[METRICS_BUCKETS] = {
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600,
};

struct metrics {
  struct MHD_Daemon *daemon;
  struct host *h;
};

struct text {
  char *s;
  size_t len, cap;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **state);
static void render(struct host *h, struct text *out);
static void put(struct text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_histogram(struct text *b, const char *name, const char *help,
                          struct histogram *h);

void metrics_counters_init(struct metrics_counters *c)
{
  memset(c, 0, sizeof *c);
  atomic_store(&c->queue_runnable, -1);
  atomic_store(&c->queue_scheduled, -1);
  atomic_store(&c->queue_leased, -1);
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

struct metrics *metrics_start(const char *addr, struct host *h, char *err, size_t errlen)
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
  m->h = h;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (ai->ai_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  m->daemon = MHD_start_daemon(flags, 0, NULL, NULL, answer, m, MHD_OPTION_SOCK_ADDR,
                               ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                               MHD_OPTION_CONNECTION_LIMIT, 32u, MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!m->daemon) {
    snprintf(err, errlen, "--metrics: cannot listen on %s (in use, or not a local address?)",
             addr);
    free(m);
    return NULL;
  }
  return m;
}

void metrics_stop(struct metrics *m)
{
  if (!m)
    return;
  MHD_stop_daemon(m->daemon);
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
  struct metrics_counters *c = &m->h->stats;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return reply(conn, 405, strdup("method not allowed\n"), 19, "text/plain");
  if (strcmp(url, "/metrics") == 0) {
    struct text b = { 0 };
    render(m->h, &b);
    if (!b.s)
      return MHD_NO;
    return reply(conn, 200, b.s, b.len, "text/plain; version=0.0.4");
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

static void render(struct host *h, struct text *b)
{
  struct metrics_counters *c = &h->stats;
  pthread_mutex_lock(&h->mu);
  int held = h->nheld;
  pthread_mutex_unlock(&h->mu);
  static const struct {
    const char *name, *help;
    size_t offset;
  } counters[] = {
    { "leash_tasks_claimed_total", "Tasks leased by this process.",
      offsetof(struct metrics_counters, claimed) },
    { "leash_tasks_done_total", "Tasks settled done.", offsetof(struct metrics_counters, done) },
    { "leash_tasks_retried_total", "Tasks settled as a retry (pending again, or dead when exhausted).",
      offsetof(struct metrics_counters, retried) },
    { "leash_tasks_dead_total", "Tasks settled dead by leash.fatal.",
      offsetof(struct metrics_counters, dead) },
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
  put(b, "# HELP leash_slots Slots (threads) in this process.\n# TYPE leash_slots gauge\n"
         "leash_slots %d\n", h->cfg->concurrency);
  put(b, "# HELP leash_slots_busy Slots running a task.\n# TYPE leash_slots_busy gauge\n"
         "leash_slots_busy %d\n", atomic_load(&c->busy_slots));
  put(b, "# HELP leash_leases_held Leases this process holds (running, buffered or settling).\n"
         "# TYPE leash_leases_held gauge\nleash_leases_held %d\n", held);
  long long runnable = atomic_load(&c->queue_runnable);
  if (runnable >= 0) {
    put(b, "# HELP leash_queue_depth Tasks in the queue table by state (sampled every few "
           "seconds, whole table).\n# TYPE leash_queue_depth gauge\n");
    put(b, "leash_queue_depth{state=\"runnable\"} %lld\n", runnable);
    put(b, "leash_queue_depth{state=\"scheduled\"} %lld\n", (long long)atomic_load(&c->queue_scheduled));
    put(b, "leash_queue_depth{state=\"leased\"} %lld\n", (long long)atomic_load(&c->queue_leased));
  }
  put(b, "# HELP leash_database_up 1 while the lease connection is up.\n"
         "# TYPE leash_database_up gauge\nleash_database_up %d\n", atomic_load(&c->db_up));
  put_histogram(b, "leash_task_duration_seconds", "Time handle(task) ran.", &c->task_seconds);
  put_histogram(b, "leash_claim_duration_seconds",
                "Round trip of one settle-and-claim cycle.", &c->cycle_seconds);
  put_histogram(b, "leash_pickup_latency_seconds",
                "From a task becoming runnable (created or run_after) to its claim.",
                &c->pickup_seconds);
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
