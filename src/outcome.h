/*
 * outcome: what one execution of a task came to, as a typed record. The script side
 * (script.c, the watchdog) produces it, the host only carries it, the queue unit (queue.c and
 * sql/) settles it. What each kind and cause does to a row is the lifecycle table
 * (lifecycle.c); nothing else names kinds or causes as text.
 */
#ifndef LEASH_OUTCOME_H
#define LEASH_OUTCOME_H

/* What the execution asks of the row. */
enum outcome_kind {
  OUTCOME_SUCCESS,   /* done, with an optional result */
  OUTCOME_RETRY,     /* pending again after a delay, or dead when attempts are exhausted */
  OUTCOME_FATAL,     /* dead now */
  OUTCOME_SNOOZE,    /* pending again after delay, the attempt given back; a retry once the
                        row's snoozes reach max_snoozes (leash.snooze) */
  OUTCOME_WAIT,      /* pending again, the attempt given back, not claimable until what it
                        waits for holds (leash.wait; sql/019_waits.sql); result holds the
                        wait's spec as JSON */
  OUTCOME_KINDS
};

/* Why. Kept on the row (last_cause) and counted by metrics, so an alert can tell a script's
   own error from a worker that died under it. */
enum outcome_cause {
  CAUSE_NONE,          /* success */
  CAUSE_RETURNED,      /* handle returned a retry or fatal answer (leash.retry, nil/false, msg) */
  CAUSE_ERROR,         /* handle raised an error */
  CAUSE_CONTRACT,      /* handle's answer broke the contract: wrong type, bad delay, unstorable result */
  CAUSE_TIMEOUT,       /* --task-timeout */
  CAUSE_MEMORY,        /* the slot's memory cap (--lua-memory, --max-result-bytes) */
  CAUSE_LEASE_LOST,    /* the lease was lost while it ran; the outcome is late by construction */
  CAUSE_STOPPING,      /* the worker stopped it (drain deadline) */
  CAUSE_WEDGED,        /* one C call ran past the deadline and grace: the watchdog restarted the process */
  CAUSE_CRASH,         /* the worker died or froze under it: the reaper found the lease expired */
  CAUSE_QUARANTINED,   /* crashed max_crashes times: dead, never claimed again unless requeued */
  CAUSE_BAD_ROW,       /* the row could not be claimed or settled: the database's error */
  CAUSE_BUDGET,        /* it waited for a budget (paused by a provider, or empty) longer than
                          --budget-wait and gave its slot back: a snooze until the wait ends */
  CAUSE_CANCELLED,     /* `leash cancel` (<table>_cancel, sql/015) ended it: never an outcome of a run */
  CAUSE_SNOOZED,       /* handle returned leash.snooze (or leash.retry{spend = false}) */
  CAUSE_SNOOZE_LIMIT,  /* a snooze found max_snoozes reached: a retry (written by the settle) */
  CAUSE_WAITING,       /* handle returned leash.wait: pending, not claimable until woken */
  CAUSE_WAIT_DEADLINE, /* a wait passed its deadline: a retry or dead (written by the reaper) */
  CAUSE_COUNT
};

struct outcome {
  enum outcome_kind kind;
  enum outcome_cause cause;
  char *error;         /* message for retry/fatal; malloc'd, owned */
  double delay;        /* retry or snooze delay in seconds; retry: < 0 for the backoff policy */
  char *result;        /* success: JSON text or NULL; malloc'd, owned */
};

/* Frees error and result and resets the record to a success with no result. */
void outcome_clear(struct outcome *o);

/* Sets kind, cause and a copy of prefix + msg as the error (cut at OUTCOME_ERROR_MAX
   bytes), with the values leash.env hands out redacted (secrets.h); on no memory the error
   stays NULL, the kind and cause still hold. */
void outcome_set(struct outcome *o, enum outcome_kind kind, enum outcome_cause cause,
                 const char *prefix, const char *msg);

#define OUTCOME_ERROR_MAX 8192

#endif
