/*
 * report: the summary of a batch (or any tenant/batch scope) that `leash report` prints and
 * `leash run --until-empty` prints when it exits: totals by status, the distribution of
 * attempts, retries, durations of done tasks (p50/p95/max of finished_at - run_started_at,
 * i.e. of each task's last attempt from when handle started; started_at, the claim, for rows
 * settled before sql/011), the waits before a run (pickup: runnable to claimed; claim to
 * start), the most frequent dead reasons with example ids, and the wall time from the
 * earliest recorded claim to the last finish. One SQL statement, so every number comes from
 * one snapshot; it needs the columns of sql/011_scheduler.sql.
 */
#ifndef LEASH_REPORT_H
#define LEASH_REPORT_H

#include "db.h"

#include <stdio.h>

/* How many dead reasons the report lists, and example ids per reason. */
#define REPORT_TOP_REASONS 5
#define REPORT_EXAMPLE_IDS 3

/* Prints the report for the scope to out, as text or as one line of JSON (as_json != 0).
   tenants: a text[] literal ("{a,b}") or NULL for every tenant; batch: NULL for every batch.
   c must not be inside a failed transaction. Returns 0, or -1 with one line in err (nothing
   is printed then). The JSON fields are documented in README.md ("report"). */
int report_print(PGconn *c, const struct db_table *t, const char *tenants, const char *batch,
                 int as_json, FILE *out, char *err, size_t errlen)
  __attribute__((warn_unused_result));

/* The same scope summarised per script version from the attempt history (sql/016): per
   version (and its label), tasks and attempts, the attempts by outcome (done, retry, fatal,
   snooze, crash, lost) with their share of the version's attempts, the tasks its attempts
   left dead with their share of its tasks, run-time p50/p95 of its attempts, and the tokens
   and cost of their budgeted calls. Fields in README.md ("Attempt history"). */
int report_print_by_version(PGconn *c, const struct db_table *t, const char *tenants,
                            const char *batch, int as_json, FILE *out, char *err,
                            size_t errlen) __attribute__((warn_unused_result));

/* Formats seconds for people: "850ms", "42.0s", "12m 3s", "5h 2m", "3d 4h". */
void report_format_duration(double secs, char *buf, size_t buflen);

#endif
