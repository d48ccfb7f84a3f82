/*
 * fuzz_enqueue_line: one JSONL line through enqueue_check_line, then enqueue_copy_row
 * (src/enqueue.c). Invariants: BLANK exactly for whitespace-only lines; BAD always says
 * why and hands back no run_after; a line judged OK is what enqueue.h promises (a JSON
 * object, no duplicate or unknown keys, a non-null payload, fields of the documented types
 * and ranges, no NUL byte, so PostgreSQL's jsonb can take the text as it is) and its
 * run_after is the field's string; a COPY row (built for every input, twice into one
 * buffer) is line number, doc and run_after separated by exactly two raw tabs and ended by
 * the only raw newline, with no raw carriage return, and unescapes to the bytes it was
 * given.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "buf.h"
#include "enqueue.h"
#include "fuzz.h"

static int is_blank(const char *s, size_t len);
static void check_ok_line(const char *line, size_t len, const char *run_after);
static void check_string_field(json_t *o, const char *key, int nullable);
static size_t check_row(const char *row, size_t len, long line_no, const char *doc,
                        size_t doclen, const char *run_after);
static size_t unescape(const char *s, size_t len, char *out);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  const char *line = (const char *)data;
  char err[256];
  char *run_after = (char *)&err;   /* must be overwritten in every case */
  struct buf b = { 0 };
  size_t first;
  long line_no = (long)size - 2;   /* negative, zero and positive numbers all occur */
  enum enqueue_verdict v;

  err[0] = '\0';
  v = enqueue_check_line(line, size, &run_after, err, sizeof err);
  switch (v) {
  case ENQUEUE_LINE_BLANK:
    FUZZ_CHECK(is_blank(line, size));
    FUZZ_CHECK(run_after == NULL);
    break;
  case ENQUEUE_LINE_BAD:
    FUZZ_CHECK(!is_blank(line, size));
    FUZZ_CHECK(run_after == NULL);
    FUZZ_CHECK(err[0] != '\0' && memchr(err, '\0', sizeof err) != NULL);
    break;
  case ENQUEUE_LINE_OK:
    FUZZ_CHECK(!is_blank(line, size));
    check_ok_line(line, size, run_after);
    break;
  default:
    FUZZ_CHECK(!"unknown verdict");
  }

  /* COPY rows are built only for OK lines, but must be right for any bytes */
  FUZZ_CHECK(enqueue_copy_row(&b, line_no, line, size, run_after) == 0);
  FUZZ_CHECK(b.len < b.cap && b.s[b.len] == '\0');
  first = check_row(b.s, b.len, line_no, line, size, run_after);
  FUZZ_CHECK(first == b.len);
  FUZZ_CHECK(enqueue_copy_row(&b, line_no + 1, line, size, NULL) == 0);
  FUZZ_CHECK(check_row(b.s, first, line_no, line, size, run_after) == first);
  FUZZ_CHECK(check_row(b.s + first, b.len - first, line_no + 1, line, size, NULL) == b.len - first);
  buf_free(&b);
  free(run_after);
  return 0;
}

static int is_blank(const char *s, size_t len)
{
  for (size_t i = 0; i < len; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
      return 0;
  return 1;
}

static void check_ok_line(const char *line, size_t len, const char *run_after)
{
  static const char *const known[] = {
    "payload", "tenant_id", "shard_key", "batch", "run_after", "delay", "max_attempts",
    "max_crashes", "priority", "max_snoozes", "backoff_base", "backoff_cap", "dedup_key",
    "budget", NULL,
  };
  json_error_t je;
  json_t *o, *v, *ra, *delay, *ma, *pr, *ms, *bb, *bc;
  const char *key;

  FUZZ_CHECK(memchr(line, '\0', len) == NULL);
  o = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
  FUZZ_CHECK(o != NULL);
  FUZZ_CHECK(json_is_object(o));
  json_object_foreach(o, key, v) {
    int found = 0;
    for (const char *const *k = known; *k != NULL; k++)
      found |= strcmp(*k, key) == 0;
    FUZZ_CHECK(found);
  }
  v = json_object_get(o, "payload");
  FUZZ_CHECK(v != NULL && !json_is_null(v));
  check_string_field(o, "tenant_id", 0);
  check_string_field(o, "shard_key", 0);
  check_string_field(o, "batch", 1);
  check_string_field(o, "run_after", 0);
  check_string_field(o, "dedup_key", 0);   /* sql/015 */
  check_string_field(o, "budget", 1);      /* sql/013 */

  ra = json_object_get(o, "run_after");
  if (ra != NULL) {
    FUZZ_CHECK(run_after != NULL);
    FUZZ_CHECK(strlen(run_after) == json_string_length(ra));
    FUZZ_CHECK(strcmp(run_after, json_string_value(ra)) == 0);
  } else {
    FUZZ_CHECK(run_after == NULL);
  }
  delay = json_object_get(o, "delay");
  if (delay != NULL) {
    double d = json_number_value(delay);
    FUZZ_CHECK(json_is_number(delay) && isfinite(d) && d >= 0 && d <= 3153600000.0);
    FUZZ_CHECK(ra == NULL);
  }
  ma = json_object_get(o, "max_attempts");
  if (ma != NULL) {
    double d = json_number_value(ma);
    FUZZ_CHECK(json_is_number(ma) && d >= 1 && d <= 2147483647.0 && d == floor(d));
  }
  pr = json_object_get(o, "priority");
  if (pr != NULL) {
    double d = json_number_value(pr);
    FUZZ_CHECK(json_is_number(pr) && d >= -1000 && d <= 1000 && d == floor(d));
  }
  /* sql/012's CHECKs */
  ms = json_object_get(o, "max_snoozes");
  if (ms != NULL) {
    double d = json_number_value(ms);
    FUZZ_CHECK(json_is_number(ms) && d >= 0 && d <= 10000 && d == floor(d));
  }
  bb = json_object_get(o, "backoff_base");
  if (bb != NULL)
    FUZZ_CHECK(json_is_number(bb) && json_number_value(bb) >= 1 && json_number_value(bb) <= 1000);
  bc = json_object_get(o, "backoff_cap");
  if (bc != NULL)
    FUZZ_CHECK(json_is_number(bc) && json_number_value(bc) >= 0 && json_number_value(bc) <= 86400);
  json_decref(o);
}

static void check_string_field(json_t *o, const char *key, int nullable)
{
  json_t *v = json_object_get(o, key);
  if (v == NULL || (nullable && json_is_null(v)))
    return;
  FUZZ_CHECK(json_is_string(v) && json_string_length(v) > 0);
}

/* Checks the row at the start of row (len bytes available) and returns its length. */
static size_t check_row(const char *row, size_t len, long line_no, const char *doc,
                        size_t doclen, const char *run_after)
{
  const char *nl = memchr(row, '\n', len);
  const char *tab1, *tab2;
  char num[32];
  char *field;
  size_t n, rowlen;

  FUZZ_CHECK(nl != NULL);
  rowlen = (size_t)(nl - row) + 1;
  FUZZ_CHECK(memchr(row, '\r', rowlen) == NULL);
  tab1 = memchr(row, '\t', rowlen);
  FUZZ_CHECK(tab1 != NULL);
  tab2 = memchr(tab1 + 1, '\t', (size_t)(nl - tab1 - 1));
  FUZZ_CHECK(tab2 != NULL);
  FUZZ_CHECK(memchr(tab2 + 1, '\t', (size_t)(nl - tab2 - 1)) == NULL);

  n = (size_t)snprintf(num, sizeof num, "%ld", line_no);
  FUZZ_CHECK((size_t)(tab1 - row) == n && memcmp(row, num, n) == 0);

  field = malloc((size_t)(tab2 - tab1) + 1);
  FUZZ_CHECK(field != NULL);
  n = unescape(tab1 + 1, (size_t)(tab2 - tab1 - 1), field);
  FUZZ_CHECK(n == doclen && memcmp(field, doc, n) == 0);
  free(field);

  if (run_after == NULL) {
    FUZZ_CHECK(nl - tab2 - 1 == 2 && memcmp(tab2 + 1, "\\N", 2) == 0);
  } else {
    field = malloc((size_t)(nl - tab2) + 1);
    FUZZ_CHECK(field != NULL);
    n = unescape(tab2 + 1, (size_t)(nl - tab2 - 1), field);
    FUZZ_CHECK(n == strlen(run_after) && memcmp(field, run_after, n) == 0);
    free(field);
  }
  return rowlen;
}

/* COPY text format, the four escapes enqueue_copy_row writes; any other backslash
   sequence, or a lone backslash at the end, fails the check. */
static size_t unescape(const char *s, size_t len, char *out)
{
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] != '\\') {
      out[n++] = s[i];
      continue;
    }
    FUZZ_CHECK(i + 1 < len);
    switch (s[++i]) {
    case '\\': out[n++] = '\\'; break;
    case 't': out[n++] = '\t'; break;
    case 'n': out[n++] = '\n'; break;
    case 'r': out[n++] = '\r'; break;
    default: FUZZ_CHECK(!"unexpected escape");
    }
  }
  return n;
}
