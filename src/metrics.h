/*
 * metrics: what `leash run --metrics HOST:PORT` serves (Prometheus text format, on
 * libmicrohttpd's own thread): counters and histograms the host updates lock-free, gauges
 * read when scraped, queue-wide gauges sampled by the lease thread of the fleet's metrics
 * leader. /livez answers 200 while the process is alive and no slot is wedged (no database
 * needed: the liveness probe); /healthz and /readyz need the database (its lease connection
 * up), /readyz also slots started and not draining.
 */
#ifndef LEASH_METRICS_H
#define LEASH_METRICS_H

#include "outcome.h"
#include "script.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#define METRICS_BUCKETS 17

struct histogram {
  atomic_llong buckets[METRICS_BUCKETS + 1];   /* cumulative at render time; last is +Inf */
  atomic_llong sum_us;
  atomic_llong count;
};

/* Why a task went dead (the reason label of leash_tasks_dead_total; the cause label is the
   last execution's cause, lifecycle.h). */
enum dead_reason {
  DEAD_FATAL,          /* leash.fatal, or the host's own fatal outcome */
  DEAD_EXHAUSTED,      /* a retry, or a crash, with no attempt left */
  DEAD_QUARANTINED,    /* crashed max_crashes times */
  DEAD_BAD_ROW,        /* the row could not be settled and was set aside */
  DEAD_REASONS
};

/* One budget's counters in this process (api_budget.c counts them; labelled by name). */
#define METRICS_BUDGETS 32
#define METRICS_BUDGET_NAME_MAX 200
struct budget_counters {
  atomic_int ready;             /* 1 once name is written: the entry is in use */
  char name[METRICS_BUDGET_NAME_MAX + 1];
  atomic_llong grants;          /* calls (or blocks) granted */
  atomic_llong refused;         /* answers 429 or 503 */
  atomic_llong yields;          /* tasks that gave their slot back waiting for it */
  atomic_llong wait_us;         /* time slots waited for a grant */
  atomic_llong tokens;          /* tokens the answers (or leash.usage) reported */
  atomic_llong http[6];         /* leash.http.request responses by class (enum http_class) */
};

/* The class label of leash_http_responses_total. */
enum http_class { HTTP_2XX, HTTP_3XX, HTTP_4XX, HTTP_429, HTTP_5XX, HTTP_ERROR, HTTP_CLASSES };

/* Counters, explained where they are counted (host.c, lease.c for reaps): each task settles
   exactly once as done, retried (pending again) or dead, or is counted lost (outcome
   discarded) or late (fence rejected). */
struct metrics_counters {
  atomic_llong claimed, done, retried, lost, late;
  atomic_llong dead[DEAD_REASONS][CAUSE_COUNT];
  atomic_llong reloads_loaded, reloads_refused;
  atomic_llong canary_rollbacks, canary_promotions;   /* decisions this process applied */
  atomic_int canary_share;      /* the running canary's share here, 0: none */
  atomic_int busy_slots;
  struct histogram task_seconds, cycle_seconds, pickup_seconds;
  /* Queue-wide, sampled by the lease thread while this process is the metrics leader (one
     per table, chosen through the database: lease.c); queue_runnable -1 = not exported. */
  atomic_llong queue_runnable, queue_scheduled, queue_leased;
  atomic_llong queue_oldest_ms;     /* oldest runnable task's wait; -1: none runnable */
  atomic_llong budgets_paused;      /* budgets whose paused_until is ahead */
  atomic_int metrics_leader;
  atomic_llong http_unbudgeted[HTTP_CLASSES];   /* responses of calls with no budget */
  atomic_llong http_untracked[HTTP_CLASSES];    /* of budgets past the first METRICS_BUDGETS */
  atomic_int db_up;        /* the lease connection is up */
  atomic_int ready;        /* slots started and not draining */
  struct budget_counters budgets[METRICS_BUDGETS];
  atomic_llong budgets_untracked;   /* grants of budgets past the first METRICS_BUDGETS */
  pthread_mutex_t budgets_mu;       /* taken only to add an entry */
};

void metrics_counters_init(struct metrics_counters *c);

/* The counters of budget name in this process, added on first use; NULL once METRICS_BUDGETS
   names are in use (the grant is then counted in budgets_untracked). Thread-safe; finding an
   entry takes no lock. */
struct budget_counters *metrics_budget(struct metrics_counters *c, const char *name);
/* Every task this process saw go dead, whatever the reason. */
long long metrics_dead_total(struct metrics_counters *c);
void histogram_observe(struct histogram *h, double seconds);
/* One leash.http.request response (status: the HTTP status, or 0 when no answer came) of a
   call under budget (NULL: none). */
void metrics_http_response(struct metrics_counters *c, const char *budget, long status);

/* What a scrape reads from the owner besides the counters: filled by metrics_gauges_fn on
   the HTTP thread (take the owner's locks there, briefly). */
struct metrics_gauges {
  int slots;                    /* threads in this process */
  int leases_held;              /* running, buffered or settling */
  char script_version[SCRIPT_VERSION_LEN + 1];
  int wedged;                   /* the watchdog found a slot wedged (the process is ending) */
};
typedef void metrics_gauges_fn(void *arg, struct metrics_gauges *g);

struct metrics;

/* Serves on addr ("HOST:PORT", "[::1]:PORT" or ":PORT"); NULL with err when it cannot.
   counters must outlive metrics_stop. */
struct metrics *metrics_start(const char *addr, struct metrics_counters *counters,
                              metrics_gauges_fn *gauges, void *arg, char *err, size_t errlen);
void metrics_stop(struct metrics *m);

#endif
