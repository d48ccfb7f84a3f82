/* enqueue: line validation and COPY rows. See enqueue.h. */
#include "enqueue.h"

#include "lifecycle.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int check_string(json_t *v, const char *key, int nullable, char *err, size_t errlen);
static void add_escaped(struct buf *b, const char *s, size_t n);

static const char *const known_keys[] = {
  "payload", "tenant_id", "shard_key", "batch", "run_after", "delay", "max_attempts",
  "max_crashes", "priority", "dedup_key", "budget", "max_snoozes", "backoff_base",
  "backoff_cap", NULL,
};

enum enqueue_verdict enqueue_check_line(const char *line, size_t len, char **run_after,
                                        char *err, size_t errlen)
{
  *run_after = NULL;
  size_t i = 0;
  while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n'))
    i++;
  if (i == len)
    return ENQUEUE_LINE_BLANK;
  /* jansson (2.14) skips a NUL byte that follows a number or a literal, so "1\0," parses;
     the row is the line's own text, and PostgreSQL refuses NUL in text: refuse it here. */
  const char *nul = memchr(line, '\0', len);
  if (nul) {
    snprintf(err, errlen, "NUL byte at column %zu", (size_t)(nul - line) + 1);
    return ENQUEUE_LINE_BAD;
  }

  json_error_t je;
  /* Integers beyond 64 bits are valid JSON (and jsonb keeps them exactly: the row is built
     from the line's own text, not from this parse), so they must not fail the check. */
  json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
  if (!o) {
    snprintf(err, errlen, "invalid JSON at column %d: %s", je.column, je.text);
    return ENQUEUE_LINE_BAD;
  }
  enum enqueue_verdict verdict = ENQUEUE_LINE_BAD;
  if (!json_is_object(o)) {
    snprintf(err, errlen, "expected a JSON object with a \"payload\" field");
    goto out;
  }
  const char *key;
  json_t *v;
  json_object_foreach(o, key, v) {
    int known = 0;
    for (const char *const *k = known_keys; *k; k++)
      known |= strcmp(*k, key) == 0;
    if (!known) {
      snprintf(err, errlen, "unknown field \"%s\" (expected payload, tenant_id, shard_key, "
               "batch, run_after, delay, max_attempts, max_crashes, priority, dedup_key, budget, "
               "max_snoozes, backoff_base, backoff_cap)", key);
      goto out;
    }
  }
  v = json_object_get(o, "payload");
  if (!v) {
    snprintf(err, errlen, "missing \"payload\"");
    goto out;
  }
  if (json_is_null(v)) {
    snprintf(err, errlen, "\"payload\" is null");
    goto out;
  }
  if (check_string(json_object_get(o, "tenant_id"), "tenant_id", 0, err, errlen) ||
      check_string(json_object_get(o, "shard_key"), "shard_key", 0, err, errlen) ||
      check_string(json_object_get(o, "batch"), "batch", 1, err, errlen) ||
      check_string(json_object_get(o, "run_after"), "run_after", 0, err, errlen) ||
      check_string(json_object_get(o, "dedup_key"), "dedup_key", 0, err, errlen) ||
      check_string(json_object_get(o, "budget"), "budget", 1, err, errlen))
    goto out;
  static const char *const keys[] = { "tenant_id", "shard_key", "batch", "dedup_key", "budget" };
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    json_t *s = json_object_get(o, keys[k]);
    if (json_is_string(s) &&
        enqueue_check_key(keys[k], json_string_value(s), json_string_length(s), err, errlen))
      goto out;
  }
  if (json_object_get(o, "run_after") &&
      enqueue_check_run_after("\"run_after\"", json_string_value(json_object_get(o, "run_after")),
                              err, errlen))
    goto out;
  json_t *delay = json_object_get(o, "delay");
  if (delay) {
    if (!json_is_number(delay) || json_number_value(delay) < 0 ||
        !isfinite(json_number_value(delay)) || json_number_value(delay) > 3153600000.0) {
      snprintf(err, errlen, "\"delay\" must be a number of seconds >= 0");
      goto out;
    }
    if (json_object_get(o, "run_after")) {
      snprintf(err, errlen, "give either \"delay\" or \"run_after\", not both");
      goto out;
    }
  }
  json_t *ma = json_object_get(o, "max_attempts");
  if (ma) {
    /* With INT_AS_REAL every number is a real: accept whole values only. */
    double d = json_number_value(ma);
    if (!json_is_number(ma) || d < 1 || d > LIFECYCLE_MAX_MAX_ATTEMPTS || d != floor(d)) {
      snprintf(err, errlen, "\"max_attempts\" must be an integer from 1 to %d",
               LIFECYCLE_MAX_MAX_ATTEMPTS);
      goto out;
    }
  }
  json_t *mc = json_object_get(o, "max_crashes");
  if (mc) {
    double d = json_number_value(mc);
    if (!json_is_number(mc) || d < 1 || d > LIFECYCLE_MAX_MAX_CRASHES || d != floor(d)) {
      snprintf(err, errlen, "\"max_crashes\" must be an integer from 1 to %d",
               LIFECYCLE_MAX_MAX_CRASHES);
      goto out;
    }
  }
  json_t *pr = json_object_get(o, "priority");
  if (pr) {
    double d = json_number_value(pr);
    if (!json_is_number(pr) || d < ENQUEUE_PRIORITY_MIN || d > ENQUEUE_PRIORITY_MAX ||
        d != floor(d)) {
      snprintf(err, errlen, "\"priority\" must be an integer from %d to %d",
               ENQUEUE_PRIORITY_MIN, ENQUEUE_PRIORITY_MAX);
      goto out;
    }
  }
  json_t *ms = json_object_get(o, "max_snoozes");
  if (ms) {
    double d = json_number_value(ms);
    if (!json_is_number(ms) || d < 0 || d > LIFECYCLE_MAX_MAX_SNOOZES || d != floor(d)) {
      snprintf(err, errlen, "\"max_snoozes\" must be an integer from 0 to %d",
               LIFECYCLE_MAX_MAX_SNOOZES);
      goto out;
    }
  }
  /* jansson has no NaN or inf to give (JSON has none), so a number's bounds are the check. */
  json_t *bb = json_object_get(o, "backoff_base");
  if (bb && (!json_is_number(bb) || !(json_number_value(bb) >= LIFECYCLE_MIN_BACKOFF_BASE) ||
             !(json_number_value(bb) <= LIFECYCLE_MAX_BACKOFF_BASE))) {
    snprintf(err, errlen, "\"backoff_base\" must be a number from %g to %g",
             LIFECYCLE_MIN_BACKOFF_BASE, LIFECYCLE_MAX_BACKOFF_BASE);
    goto out;
  }
  json_t *bc = json_object_get(o, "backoff_cap");
  if (bc && (!json_is_number(bc) || !(json_number_value(bc) >= 0) ||
             !(json_number_value(bc) <= LIFECYCLE_MAX_BACKOFF_CAP_S))) {
    snprintf(err, errlen, "\"backoff_cap\" must be a number of seconds from 0 to %g",
             LIFECYCLE_MAX_BACKOFF_CAP_S);
    goto out;
  }
  json_t *ra = json_object_get(o, "run_after");
  if (ra) {
    *run_after = strdup(json_string_value(ra));
    if (!*run_after) {
      snprintf(err, errlen, "out of memory");
      goto out;
    }
  }
  verdict = ENQUEUE_LINE_OK;
out:
  json_decref(o);
  return verdict;
}

int enqueue_check_key(const char *field, const char *value, size_t len, char *err,
                      size_t errlen)
{
  size_t max = strcmp(field, "tenant_id") == 0   ? LIFECYCLE_MAX_TENANT_BYTES
               : strcmp(field, "shard_key") == 0 ? LIFECYCLE_MAX_SHARD_BYTES
               : strcmp(field, "dedup_key") == 0 ? LIFECYCLE_MAX_DEDUP_KEY_BYTES
               : strcmp(field, "budget") == 0    ? LIFECYCLE_MAX_BUDGET_BYTES
                                                  : LIFECYCLE_MAX_BATCH_BYTES;
  if (len == 0) {
    snprintf(err, errlen, "\"%s\" must not be empty", field);
    return -1;
  }
  if (len > max) {
    snprintf(err, errlen, "\"%s\" is %zu bytes; at most %zu", field, len, max);
    return -1;
  }
  if (memchr(value, '\0', len)) {
    snprintf(err, errlen, "\"%s\" holds a NUL byte", field);
    return -1;
  }
  return 0;
}

int enqueue_check_run_after(const char *field, const char *value, char *err, size_t errlen)
{
  /* PostgreSQL ignores case and surrounding spaces; so must the check. */
  const char *p = value;
  while (isspace((unsigned char)*p))
    p++;
  if (*p == '+' || *p == '-')
    p++;
  size_t n = strlen(p);
  while (n > 0 && isspace((unsigned char)p[n - 1]))
    n--;
  if (n == 8 && strncasecmp(p, "infinity", 8) == 0) {
    snprintf(err, errlen, "%s must be a finite timestamp, not infinity", field);
    return -1;
  }
  return 0;
}

int enqueue_copy_row(struct buf *b, long line_no, const char *doc, size_t doclen,
                     const char *run_after)
{
  buf_printf(b, "%ld\t", line_no);
  add_escaped(b, doc, doclen);
  buf_add(b, "\t", 1);
  if (run_after)
    add_escaped(b, run_after, strlen(run_after));
  else
    buf_add(b, "\\N", 2);
  return buf_add(b, "\n", 1);
}

static int check_string(json_t *v, const char *key, int nullable, char *err, size_t errlen)
{
  if (!v || (nullable && json_is_null(v)))
    return 0;
  if (!json_is_string(v) || json_string_length(v) == 0) {
    snprintf(err, errlen, "\"%s\" must be a non-empty string%s", key, nullable ? " or null" : "");
    return -1;
  }
  return 0;
}

/* COPY text format: backslash, tab, newline and carriage return are escaped. */
static void add_escaped(struct buf *b, const char *s, size_t n)
{
  size_t start = 0;
  for (size_t i = 0; i < n; i++) {
    const char *esc = NULL;
    switch (s[i]) {
    case '\\': esc = "\\\\"; break;
    case '\t': esc = "\\t"; break;
    case '\n': esc = "\\n"; break;
    case '\r': esc = "\\r"; break;
    default: continue;
    }
    buf_add(b, s + start, i - start);
    buf_add(b, esc, 2);
    start = i + 1;
  }
  buf_add(b, s + start, n - start);
}

int enqueue_check_backoff_base(const char *value)
{
  /* Digits, sign, point and exponent only: strtod would also take "nan", "inf" and hex. */
  if (!*value || strspn(value, "0123456789.+-eE") != strlen(value))
    return -1;
  char *end;
  double v = strtod(value, &end);
  return *end == '\0' && isfinite(v) && v >= LIFECYCLE_MIN_BACKOFF_BASE &&
         v <= LIFECYCLE_MAX_BACKOFF_BASE ? 0 : -1;
}
