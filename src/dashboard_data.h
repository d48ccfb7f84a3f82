/*
 * dashboard_data: the dashboard's reads and actions, each one JSON text built by SQL.
 * Reads stay cheap on a table of millions of rows (sql/021; figures in README "Dashboard",
 * bench/dashboard.sh): the batch list skip-scans batch_open_idx (one probe per open batch)
 * and reads the batch totals the INSERT and DELETE triggers keep; a finished batch's
 * numbers are its kept report (computed once, checked against the attempts since the last
 * look); a running batch's are counted exactly from the totals and the open, leased and
 * dead rows' indexes (sql/024), its durations, chart and dead reasons read from bounded
 * parts of the attempt history and its dead rows (live_fmt: a look reads about 16,000 rows
 * by key at most, whatever the batch's size); workers read leased rows only
 * (one_lease_per_shard); holds, budgets and canaries are small tables; a task's attempts
 * are read by its key. Every list has a LIMIT.
 * Actions call what the CLI commands call (queue.c for requeue and cancel, <table>_hold /
 * _unhold as leash pause).
 */
#ifndef LEASH_DASHBOARD_DATA_H
#define LEASH_DASHBOARD_DATA_H

#include "db.h"

#include <stddef.h>

/* How many batches the overview lists; how many tasks per worker it names. */
#define DASH_MAX_BATCHES 10
#define DASH_WORKER_IDS 10

/* {"selected": B or null, "batches": [{batch,total,open,pending,leased,done,dead,kept}],
   "report": report.c's JSON for B (plus "kept": it was the kept one; while B runs, the
   live report instead: the same counts, total, settled, duration_s, dead_reasons,
   dead_reasons_total, first_claim_at, last_finish_at, wall_s, with retries, retried_tasks
   and usage null, and "live": {attempts_read, attempts_limit, scan_limit, dead_read, dead_limit}: how
   much of its attempts and dead rows was read) or null, "minutes" (while B runs: from the
   attempt history, with "from_attempts": true and "truncated"):
   {"now": epoch of this minute, "rows": [{t, done, dead, retried}]} (B's outcomes per
   minute, last hour, by finished_at; no rows when B finished over an hour ago), "previous":
   {batch, how ("name" or "previous"), total, counts, wall_s, duration_s, first_claim_at,
   last_finish_at, settled} or null, "workers": [{worker, tasks, ids}], "holds": [...],
   "budgets": [...], "canaries": [{id, state, version, label, script_name, share, ...,
   numbers}]}. batch: the batch to show, or NULL for the first open one (else the newest).
   malloc'd; NULL with err. */
char *dash_overview_json(PGconn *c, const struct db_table *t, const char *batch, char *err,
                         size_t errlen);

/* {"task": the row, "steps": [...], "attempts": [{attempt, lease_token, worker, version,
   label, kind, cause, status, error, crashed, queue_wait_s, claimed_at, finished_at,
   run_s}] (the newest 200, oldest first), "attempts_total": n}. NULL with err ("no such
   task" when id has no row: *missing set). */
char *dash_task_json(PGconn *c, const struct db_table *t, long long id, int *missing,
                     char *err, size_t errlen);

/* One action's fields (NULL when absent). */
struct dash_action {
  const char *id, *batch, *tenant, *budget, *for_s;
  const char *kind, *scope;   /* pause/resume: "tenant", "batch" or "budget" and its name,
                                 as a form with a choice of kind sends it */
};

/* Runs action ("requeue", "cancel", "pause", "resume"): an HTTP status (200; 400 with the
   reason in msg for bad fields; 404 unknown action; 500 a database failure) and a JSON
   object in *json (malloc'd) saying what was done: {"ok": true, "message": "..."}. */
int dash_action_run(PGconn *c, const struct db_table *t, const char *action,
                    const struct dash_action *a, char **json);

#endif
