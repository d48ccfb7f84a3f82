/* lifecycle: the table of kinds and causes. See lifecycle.h. */
#include "lifecycle.h"

#include <math.h>

static const char *const kind_sql[OUTCOME_KINDS] = {
  [OUTCOME_SUCCESS] = STATUS_DONE,
  [OUTCOME_RETRY] = "retry",
  [OUTCOME_FATAL] = STATUS_DEAD,
  [OUTCOME_SNOOZE] = "snooze",
  [OUTCOME_WAIT] = "wait",
};

static const struct {
  const char *name;
  int crash;
} causes[CAUSE_COUNT] = {
  [CAUSE_NONE] = { "none", 0 },
  [CAUSE_RETURNED] = { "returned", 0 },
  [CAUSE_ERROR] = { "script_error", 0 },
  [CAUSE_CONTRACT] = { "contract", 0 },
  [CAUSE_TIMEOUT] = { "timeout", 0 },
  [CAUSE_MEMORY] = { "memory", 0 },
  [CAUSE_LEASE_LOST] = { "lease_lost", 0 },
  [CAUSE_STOPPING] = { "stopping", 0 },
  [CAUSE_WEDGED] = { "wedged", 1 },
  [CAUSE_CRASH] = { "crash", 1 },
  [CAUSE_QUARANTINED] = { "quarantined", 0 },
  [CAUSE_BAD_ROW] = { "bad_row", 0 },
  [CAUSE_BUDGET] = { "budget", 0 },
  [CAUSE_CANCELLED] = { "cancelled", 0 },
  [CAUSE_SNOOZED] = { "snoozed", 0 },
  [CAUSE_SNOOZE_LIMIT] = { "snooze_limit", 0 },
  [CAUSE_WAITING] = { "waiting", 0 },
  [CAUSE_WAIT_DEADLINE] = { "wait_deadline", 0 },
};

const char *lifecycle_kind_sql(enum outcome_kind k)
{
  return (unsigned)k < OUTCOME_KINDS ? kind_sql[k] : "retry";
}

const char *lifecycle_cause_name(enum outcome_cause c)
{
  return (unsigned)c < CAUSE_COUNT ? causes[c].name : "none";
}

int lifecycle_cause_is_crash(enum outcome_cause c)
{
  return (unsigned)c < CAUSE_COUNT && causes[c].crash;
}

double lifecycle_backoff(double base, double cap, int attempts, double jitter, double u)
{
  /* The SQL compares logarithms (its power() raises on overflow); pow's inf compares the
     same way here. */
  double d = cap <= 0 ? 0 : pow(base, attempts);
  if (d > cap)
    d = cap;
  return d * (1 - jitter * u);
}
