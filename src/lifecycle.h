/*
 * lifecycle: the one definition of where a task may go. Statuses, outcome kinds and causes
 * by name, what each kind does to a row, the backoff policy and the defaults. sql/ writes the
 * same rules as statements; tests/ check the two and leash.testing against each other.
 */
#ifndef LEASH_LIFECYCLE_H
#define LEASH_LIFECYCLE_H

#include "outcome.h"

/* Row statuses. */
#define STATUS_PENDING "pending"
#define STATUS_LEASED  "leased"
#define STATUS_DONE    "done"
#define STATUS_DEAD    "dead"
/* The same words as SQL literals, for the statements C writes ("status = " SQL_DEAD). */
#define SQL_PENDING "'" STATUS_PENDING "'"
#define SQL_LEASED  "'" STATUS_LEASED "'"
#define SQL_DONE    "'" STATUS_DONE "'"
#define SQL_DEAD    "'" STATUS_DEAD "'"

/* Defaults a row gets when its inserter names none (the table's column defaults say the same). */
#define LIFECYCLE_DEFAULT_MAX_ATTEMPTS 8
#define LIFECYCLE_DEFAULT_MAX_CRASHES  3
#define LIFECYCLE_DEFAULT_TENANT       "default"
/* A number above as text, for help texts: LIFECYCLE_STR(LIFECYCLE_DEFAULT_MAX_ATTEMPTS). */
#define LIFECYCLE_STR(x) LIFECYCLE_STR_(x)
#define LIFECYCLE_STR_(x) #x
/* Bounds of a row, enforced by the table's constraints (sql/010_outcome_causes.sql): what the
   claim can lease (one_lease_per_shard's btree entry holds tenant_id and shard_key) and the
   counters can count. Lengths in bytes (octet_length). */
#define LIFECYCLE_MAX_TENANT_BYTES 512
#define LIFECYCLE_MAX_SHARD_BYTES  512
#define LIFECYCLE_MAX_BATCH_BYTES  512
#define LIFECYCLE_MAX_BUDGET_BYTES 200   /* sql/013_holds.sql, sql/014_budgets.sql */
/* A dedup key (sql/015_sql_api.sql's leash_dedup_key_bytes): 1 to this many bytes. */
#define LIFECYCLE_MAX_DEDUP_KEY_BYTES 512
#define LIFECYCLE_MAX_MAX_ATTEMPTS 1000
#define LIFECYCLE_MAX_MAX_CRASHES  1000
/* Backoff for a retry that names no delay: d = least(CAP, BASE ^ attempts) seconds, then
   jitter: d x (1 - JITTER x u), u uniform in [0, 1). JITTER 0.5 is "equal jitter" (a wait
   in [d/2, d]), 1 "full jitter", 0 none. These are the defaults of `leash run --backoff-base
   --backoff-cap --backoff-jitter` and of the settle's parameters (sql/012_snooze.sql); a row's
   backoff_base and backoff_cap (set at enqueue) beat the run's. */
#define LIFECYCLE_BACKOFF_BASE 2.0
#define LIFECYCLE_BACKOFF_CAP_S 3600.0
#define LIFECYCLE_BACKOFF_JITTER 0.5
/* Bounds of the above (the columns' CHECKs in 012 say the same for base and cap). */
#define LIFECYCLE_MIN_BACKOFF_BASE 1.0
#define LIFECYCLE_MAX_BACKOFF_BASE 1000.0
#define LIFECYCLE_MAX_BACKOFF_CAP_S 86400.0
/* A delay the script names (leash.retry's, leash.snooze's, an upstream's Retry-After) is cut
   to this: no row waits longer on a script's word. Never jittered. */
#define LIFECYCLE_MAX_DELAY_S 3600.0
/* Snoozes a task may take before a snooze spends an attempt (the column max_snoozes's
   default; bounds 0..LIFECYCLE_MAX_MAX_SNOOZES, its CHECK). */
#define LIFECYCLE_DEFAULT_MAX_SNOOZES 100
#define LIFECYCLE_MAX_MAX_SNOOZES 10000
/* leash.wait (sql/019_waits.sql): a wait on tasks ends at its deadline (default, cap); a
   wait on the clock is cut to the cap; ids = {...} names at most WAIT_MAX_IDS tasks. */
#define LIFECYCLE_WAIT_DEADLINE_S 86400.0
#define LIFECYCLE_MAX_WAIT_S 604800.0
#define LIFECYCLE_WAIT_MAX_IDS 10000

/* The kind's word in the settle's kinds[] ("done", "retry", "dead", "snooze", "wait"). */
const char *lifecycle_kind_sql(enum outcome_kind k);

/* The cause's name in last_cause, logs and metric labels ("script_error", "timeout", ...). */
const char *lifecycle_cause_name(enum outcome_cause c);

/* 1 for causes that count as a crash of the execution (the worker, not the script, failed):
   they add to the row's crash count, and max_crashes of them quarantine it. */
int lifecycle_cause_is_crash(enum outcome_cause c);

/* The backoff in seconds after the given number of attempts (a retry without a delay) with
   base, cap and jitter as above and u in [0, 1): the settle's <table>_backoff (012). */
double lifecycle_backoff(double base, double cap, int attempts, double jitter, double u);

#endif
