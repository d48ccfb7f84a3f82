/* outcome: the record's two helpers. See outcome.h. */
#include "outcome.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void outcome_clear(struct outcome *o)
{
  free(o->error);
  free(o->result);
  memset(o, 0, sizeof *o);
  o->delay = -1;
}

void outcome_set(struct outcome *o, enum outcome_kind kind, enum outcome_cause cause,
                 const char *prefix, const char *msg)
{
  o->kind = kind;
  o->cause = cause;
  size_t n = (prefix ? strlen(prefix) : 0) + strlen(msg) + 1;
  if (n > OUTCOME_ERROR_MAX)
    n = OUTCOME_ERROR_MAX;
  free(o->error);
  o->error = malloc(n);
  if (o->error)
    snprintf(o->error, n, "%s%s", prefix ? prefix : "", msg);
}
