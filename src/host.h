/*
 * host: `leash run`. Threads and who owns what (docs/ARCHITECTURE.md, "The host"):
 *   - the dispatcher (the calling thread, dispatch.c) owns the claim connection: it settles
 *     finished tasks in batches and claims as many rows as there are idle slots, in short
 *     transactions, before any Lua runs;
 *   - the lease thread (lease.c) owns its own connection, so a busy claim path cannot starve
 *     heartbeats: it renews every lease in the lease registry with one statement per
 *     interval, reaps expired leases, and LISTENs for new work;
 *   - N slot threads (slot.c) each own one Lua state and run one task at a time;
 *   - a signal thread (signals.c) turns SIGTERM/SIGINT into a drain and SIGHUP into a hot swap;
 *   - a watchdog thread (watchdog.c) ends the process when a slot is wedged inside a C call.
 * Scripts' leash.db.query calls share a small pool (dbpool.c): connections stay few
 * whatever the number of slots. host.c only sets these up, tears them down and hands each
 * the callbacks through which it reaches the host's state.
 */
#ifndef LEASH_HOST_H
#define LEASH_HOST_H

#include "db.h"
#include "llm_batch.h"
#include "queue.h"

#include <stddef.h>

struct host_config {
  const char *script_path;
  const char *conninfo;         /* NULL: libpq defaults */
  const char *table;            /* as given by --table */
  const char *worker_id;
  int concurrency;
  double visibility;            /* lease length, seconds */
  double backoff_base, backoff_cap, backoff_jitter;   /* a retry's backoff (lifecycle.h) */
  double heartbeat;             /* renewal interval, seconds */
  double task_timeout;          /* 0 = none */
  double drain_timeout;
  double watchdog_grace;        /* how long past a deadline a slot may take to come back */
  double budget_wait;           /* --budget-wait: longest in-slot wait for a budget grant */
  int poll_min_ms, poll_max_ms;
  int until_empty;
  int claim_batch;              /* most rows one claim asks for */
  int db_pool;                  /* connections for leash.db.query */
  int settle_connection;        /* outcomes on a second connection (off: --no-settle-connection) */
  size_t lua_memory;            /* bytes per slot, 0 = none */
  size_t max_result_bytes;      /* --max-result-bytes: most bytes of JSON one encoding makes */
  struct queue_scope scope;
  const char *metrics_addr;     /* --metrics HOST:PORT, or NULL */
  const char *const *tenants;   /* the --tenant values (scope.tenants is their literal) */
  int ntenants;
  const char *const *lua_path;  /* extra folders for require, searched after the script's */
  int nlua_path;
  struct llm_batch_options llm_batch;   /* --llm-batch-*: the provider batcher (llm_batch.h) */
};

/* Exit code of a process the watchdog ended: a slot stayed wedged past its deadline plus
   --watchdog-grace (task timeout, lost lease, or the stop after the drain deadline). */
#define HOST_EXIT_WEDGED 3   /* = WATCHDOG_EXIT_WEDGED (watchdog.h); host.c asserts it */

/* Runs until drained (signal) or, with until_empty, until the scope has settled.
   Returns the process exit code: 0, 1 (start failure), or HOST_EXIT_WEDGED, with which the
   process ends by _exit without returning. */
int host_run(const struct host_config *cfg);

#endif
