/* outcome: the record's two helpers. See outcome.h. */
#include "outcome.h"

#include "secrets.h"

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
  free(o->error);
  o->error = NULL;
  /* The text is cut at OUTCOME_ERROR_MAX; a value leash.env handed out is redacted first, in
     a window that reaches past the cut by the longest value, so the cut cannot leave the
     start of one behind (secrets.h). */
  size_t pl = prefix ? strlen(prefix) : 0;
  size_t ml = strnlen(msg, OUTCOME_ERROR_MAX + secrets_longest());
  char *text = malloc(pl + ml + 1);
  if (!text)
    return;
  memcpy(text, prefix ? prefix : "", pl);
  memcpy(text + pl, msg, ml);
  text[pl + ml] = '\0';
  if (secrets_found(text, pl + ml)) {
    char *clean = secrets_redact(text);
    free(text);
    if (!(text = clean))
      return;
  }
  if (strlen(text) >= OUTCOME_ERROR_MAX)
    text[OUTCOME_ERROR_MAX - 1] = '\0';
  o->error = text;
}
