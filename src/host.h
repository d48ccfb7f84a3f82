/*
 * host: `leash run`. Threads and who owns what:
 *   - the dispatcher (the calling thread) owns the claim connection: it settles finished
 *     tasks in batches and claims as many rows as there are idle slots, in short
 *     transactions, before any Lua runs;
 *   - the lease thread (lease.c) owns its own connection, so a busy claim path cannot starve
 *     heartbeats: it renews every held lease in one statement per interval, reaps expired
 *     leases, and LISTENs for new work;
 *   - N slot threads each own one Lua state and run one task at a time;
 *   - a signal thread turns SIGTERM/SIGINT into a drain and SIGHUP into a hot swap.
 * Scripts' leash.db.query calls share a small pool (dbpool.c): connections stay few
 * whatever the number of slots.
 */
#ifndef LEASH_HOST_H
#define LEASH_HOST_H

#include "db.h"
#include "queue.h"

#include <stddef.h>

struct host_config {
  const char *script_path;
  const char *conninfo;         /* NULL: libpq defaults */
  const char *table;            /* as given by --table */
  const char *worker_id;
  int concurrency;
  double visibility;            /* lease length, seconds */
  double heartbeat;             /* renewal interval, seconds */
  double task_timeout;          /* 0 = none */
  double drain_timeout;
  int poll_min_ms, poll_max_ms;
  int until_empty;
  int claim_batch;              /* most rows one claim asks for */
  int db_pool;                  /* connections for leash.db.query */
  size_t lua_memory;            /* bytes per slot, 0 = none */
  size_t max_result_bytes;      /* --max-result-bytes: most bytes of JSON one encoding makes */
  struct queue_scope scope;
  const char *metrics_addr;     /* --metrics HOST:PORT, or NULL */
  const char *const *tenants;   /* the --tenant values (scope.tenants is their literal) */
  int ntenants;
  const char *const *lua_path;  /* extra folders for require, searched after the script's */
  int nlua_path;
};

/* Runs until drained (signal) or, with until_empty, until the scope has settled.
   Returns the process exit code. */
int host_run(const struct host_config *cfg);

#endif
