/*
 * test_enqueue: checking JSONL task lines and writing COPY rows (enqueue.c), without a
 * database. Cases found by tests/fuzz/fuzz_enqueue_line live here as behaviour; their raw
 * inputs are also in tests/fuzz/regressions/enqueue_line/.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "enqueue.h"

static enum enqueue_verdict check_line(const char *line, size_t len, char *err, size_t errlen);

static enum enqueue_verdict check_line(const char *line, size_t len, char *err, size_t errlen)
{
  char *run_after = NULL;
  enum enqueue_verdict v = enqueue_check_line(line, len, &run_after, err, errlen);
  free(run_after);
  return v;
}

/* jansson 2.14 skips a NUL byte right after a number or a literal, so these parsed; the
   row is the line's own text, which PostgreSQL's COPY refuses, failing the whole batch
   with a server error instead of naming the line (found by fuzz_enqueue_line). */
static void nul_byte_after_a_token_is_refused(void)
{
  static const char after_number[] = "{\"payload\":1\0,\"batch\":null}";
  static const char after_literal[] = "{\"payload\":true\0}";
  static const char in_string[] = "{\"payload\":\"a\0b\"}";
  char err[256] = "";

  CHECK_INT_EQ(check_line(after_number, sizeof after_number - 1, err, sizeof err),
               ENQUEUE_LINE_BAD);
  CHECK_STR_EQ(err, "NUL byte at column 13");
  CHECK_INT_EQ(check_line(after_literal, sizeof after_literal - 1, err, sizeof err),
               ENQUEUE_LINE_BAD);
  CHECK_STR_EQ(err, "NUL byte at column 16");
  CHECK_INT_EQ(check_line(in_string, sizeof in_string - 1, err, sizeof err),
               ENQUEUE_LINE_BAD);
  /* the escaped form is refused by the JSON parser, as PostgreSQL's jsonb refuses it */
  CHECK_INT_EQ(check_line("{\"payload\":\"a\\u0000b\"}", 22, err, sizeof err),
               ENQUEUE_LINE_BAD);
  CHECK_INT_EQ(check_line("{\"payload\":1}", 13, err, sizeof err), ENQUEUE_LINE_OK);
}

/* Backslash, tab, newline and carriage return are what COPY's text format reads
   specially; everything else passes as it is, and a missing run_after is \N. */
static void copy_row_escapes_copy_specials(void)
{
  static const char doc[] = "{\"payload\":\"a\tb\\\\n\"}\r\n";
  struct buf b = { 0 };

  CHECK_INT_EQ(enqueue_copy_row(&b, 7, doc, sizeof doc - 1, NULL), 0);
  CHECK_INT_EQ(enqueue_copy_row(&b, 8, "{}", 2, "x\\N\t"), 0);
  CHECK(b.len < b.cap);
  char *buf = buf_take(&b);
  CHECK_STR_EQ(buf, "7\t{\"payload\":\"a\\tb\\\\\\\\n\"}\\r\\n\t\\N\n"
                    "8\t{}\tx\\\\N\\t\n");
  free(buf);
}

/* The bounds the claim needs (an 8,000-byte shard key overflowed the lease index and stopped
   every cycle): keys at 512 bytes pass, one byte more names the field; max_attempts past
   1000 and run_after at infinity are refused. */
static void keys_and_numbers_out_of_bounds_are_refused(void)
{
  char line[1200], key[600], err[256] = "";
  memset(key, 'k', sizeof key);
  static const char *const fields[] = { "tenant_id", "shard_key", "batch" };
  for (int i = 0; i < 3; i++) {
    int n = snprintf(line, sizeof line, "{\"payload\":1,\"%s\":\"%.*s\"}", fields[i], 512, key);
    CHECK_INT_EQ(check_line(line, (size_t)n, err, sizeof err), ENQUEUE_LINE_OK);
    n = snprintf(line, sizeof line, "{\"payload\":1,\"%s\":\"%.*s\"}", fields[i], 513, key);
    CHECK_INT_EQ(check_line(line, (size_t)n, err, sizeof err), ENQUEUE_LINE_BAD);
    char want[64];
    snprintf(want, sizeof want, "\"%s\" is 513 bytes; at most 512", fields[i]);
    CHECK_STR_EQ(err, want);
  }
  static const char *const bad[] = {
    "{\"payload\":1,\"max_attempts\":1001}", "{\"payload\":1,\"max_attempts\":1e9}",
    "{\"payload\":1,\"run_after\":\"infinity\"}", "{\"payload\":1,\"run_after\":\"-INFINITY\"}",
    "{\"payload\":1,\"run_after\":\" +Infinity\"}", "{\"payload\":1,\"delay\":1e300}",
    "{\"payload\":1,\"tenant_id\":\"\"}", NULL,
  };
  for (const char *const *b = bad; *b; b++)
    CHECK_INT_EQ(check_line(*b, strlen(*b), err, sizeof err), ENQUEUE_LINE_BAD);
  static const char at_cap[] = "{\"payload\":1,\"max_attempts\":1000}";
  CHECK_INT_EQ(check_line(at_cap, sizeof at_cap - 1, err, sizeof err), ENQUEUE_LINE_OK);
  CHECK_INT_EQ(enqueue_check_key("tenant_id", "", 0, err, sizeof err), -1);
  CHECK_INT_EQ(enqueue_check_run_after("--run-after", "2030-01-01", err, sizeof err), 0);
  CHECK_INT_EQ(enqueue_check_run_after("--run-after", "infinityx", err, sizeof err), 0);
}

/* priority has the column's bounds (-1000..1000, sql/011), whole numbers only, in any JSON
   spelling of one; outside them the line is refused with the same wording as max_attempts. */
static void priority_is_a_whole_number_within_the_column_bounds(void)
{
  char err[256] = "";
  static const char *const good[] = {
    "{\"payload\":1,\"priority\":0}", "{\"payload\":1,\"priority\":-1000}",
    "{\"payload\":1,\"priority\":1000}", "{\"payload\":1,\"priority\":1e2}",
    "{\"payload\":1,\"priority\":-0}", "{\"payload\":1,\"priority\":7.0}", NULL,
  };
  for (const char *const *g = good; *g; g++)
    CHECK_INT_EQ(check_line(*g, strlen(*g), err, sizeof err), ENQUEUE_LINE_OK);
  static const char *const bad[] = {
    "{\"payload\":1,\"priority\":1001}", "{\"payload\":1,\"priority\":-1001}",
    "{\"payload\":1,\"priority\":0.5}", "{\"payload\":1,\"priority\":\"5\"}",
    "{\"payload\":1,\"priority\":null}", "{\"payload\":1,\"priority\":true}",
    "{\"payload\":1,\"priority\":1e400}", NULL,
  };
  for (const char *const *b = bad; *b; b++) {
    err[0] = '\0';
    CHECK_INT_EQ(check_line(*b, strlen(*b), err, sizeof err), ENQUEUE_LINE_BAD);
    if (strstr(*b, "1e400") == NULL)   /* jansson refuses that one as a number itself */
      CHECK_STR_EQ(err, "\"priority\" must be an integer from -1000 to 1000");
  }
  static const char typo[] = "{\"payload\":1,\"priorty\":5}";
  CHECK_INT_EQ(check_line(typo, sizeof typo - 1, err, sizeof err), ENQUEUE_LINE_BAD);
  CHECK(strstr(err, "max_crashes, priority, dedup_key, budget, max_snoozes, backoff_base, backoff_cap)") != NULL);
}

/* dedup_key (sql/015): a non-empty string of at most 512 bytes, or absent. */
static void dedup_key_is_a_non_empty_string_within_its_bound(void)
{
  char err[256], line[1200];
  static const char ok[] = "{\"payload\":1,\"dedup_key\":\"ticket-42\"}";
  CHECK_INT_EQ(check_line(ok, sizeof ok - 1, err, sizeof err), ENQUEUE_LINE_OK);
  snprintf(line, sizeof line, "{\"payload\":1,\"dedup_key\":\"%0512d\"}", 0);
  CHECK_INT_EQ(check_line(line, strlen(line), err, sizeof err), ENQUEUE_LINE_OK);
  snprintf(line, sizeof line, "{\"payload\":1,\"dedup_key\":\"%0513d\"}", 0);
  CHECK_INT_EQ(check_line(line, strlen(line), err, sizeof err), ENQUEUE_LINE_BAD);
  CHECK_STR_EQ(err, "\"dedup_key\" is 513 bytes; at most 512");
  static const char *const bad[] = {
    "{\"payload\":1,\"dedup_key\":\"\"}", "{\"payload\":1,\"dedup_key\":5}",
    "{\"payload\":1,\"dedup_key\":null}", "{\"payload\":1,\"dedup_key\":[\"k\"]}", NULL,
  };
  for (const char *const *b = bad; *b; b++) {
    CHECK_INT_EQ(check_line(*b, strlen(*b), err, sizeof err), ENQUEUE_LINE_BAD);
    CHECK_STR_EQ(err, "\"dedup_key\" must be a non-empty string");
  }
}


/* The snooze bound and the per-task backoff (sql/012's CHECKs): in-bounds values pass, the
   classes out of bounds (below, above, a fraction where a whole number is due, the wrong
   type) are refused each with the field's own message; --backoff-base's text check refuses
   what strtod would take but is no plain number. */
static void snooze_and_backoff_fields_are_checked_by_their_bounds(void)
{
  char err[256];
  static const char *const good[] = {
    "{\"payload\":1,\"max_snoozes\":0}", "{\"payload\":1,\"max_snoozes\":10000}",
    "{\"payload\":1,\"max_snoozes\":1e2}", "{\"payload\":1,\"backoff_base\":1}",
    "{\"payload\":1,\"backoff_base\":1.5}", "{\"payload\":1,\"backoff_base\":1000}",
    "{\"payload\":1,\"backoff_cap\":0}", "{\"payload\":1,\"backoff_cap\":86400}",
    "{\"payload\":1,\"backoff_cap\":0.25}", NULL,
  };
  for (const char *const *g = good; *g; g++)
    CHECK_INT_EQ(check_line(*g, strlen(*g), err, sizeof err), ENQUEUE_LINE_OK);
  static const struct { const char *line, *msg; } bad[] = {
    { "{\"payload\":1,\"max_snoozes\":-1}", "\"max_snoozes\" must be an integer from 0 to 10000" },
    { "{\"payload\":1,\"max_snoozes\":10001}", "\"max_snoozes\" must be an integer from 0 to 10000" },
    { "{\"payload\":1,\"max_snoozes\":2.5}", "\"max_snoozes\" must be an integer from 0 to 10000" },
    { "{\"payload\":1,\"max_snoozes\":\"3\"}", "\"max_snoozes\" must be an integer from 0 to 10000" },
    { "{\"payload\":1,\"backoff_base\":0.5}", "\"backoff_base\" must be a number from 1 to 1000" },
    { "{\"payload\":1,\"backoff_base\":1001}", "\"backoff_base\" must be a number from 1 to 1000" },
    { "{\"payload\":1,\"backoff_base\":null}", "\"backoff_base\" must be a number from 1 to 1000" },
    { "{\"payload\":1,\"backoff_base\":\"2\"}", "\"backoff_base\" must be a number from 1 to 1000" },
    { "{\"payload\":1,\"backoff_cap\":-0.001}", "\"backoff_cap\" must be a number of seconds from 0 to 86400" },
    { "{\"payload\":1,\"backoff_cap\":86401}", "\"backoff_cap\" must be a number of seconds from 0 to 86400" },
    { "{\"payload\":1,\"backoff_cap\":true}", "\"backoff_cap\" must be a number of seconds from 0 to 86400" },
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    err[0] = '\0';
    CHECK_INT_EQ(check_line(bad[i].line, strlen(bad[i].line), err, sizeof err), ENQUEUE_LINE_BAD);
    CHECK_STR_EQ(err, bad[i].msg);
  }
  static const char *const base_ok[] = { "1", "2", "1.5", "1e3", "1000", NULL };
  static const char *const base_bad[] = { "", "0.99", "1001", "nan", "inf", "0x10", "2s",
                                          " 2", "-2", NULL };
  for (const char *const *b = base_ok; *b; b++)
    CHECK_INT_EQ(enqueue_check_backoff_base(*b), 0);
  for (const char *const *b = base_bad; *b; b++)
    CHECK_INT_EQ(enqueue_check_backoff_base(*b), -1);
}

static const struct check_case cases[] = {
  { "priority_is_a_whole_number_within_the_column_bounds",
    priority_is_a_whole_number_within_the_column_bounds },
  { "dedup_key_is_a_non_empty_string_within_its_bound",
    dedup_key_is_a_non_empty_string_within_its_bound },
  { "keys_and_numbers_out_of_bounds_are_refused", keys_and_numbers_out_of_bounds_are_refused },
  { "snooze_and_backoff_fields_are_checked_by_their_bounds",
    snooze_and_backoff_fields_are_checked_by_their_bounds },
  { "nul_byte_after_a_token_is_refused", nul_byte_after_a_token_is_refused },
  { "copy_row_escapes_copy_specials", copy_row_escapes_copy_specials },
  { NULL, NULL }
};

int main(int argc, char **argv)
{
  return check_main(cases, argc, argv);
}
