/* record: the redaction a recording applies to every text before it is kept (record.h):
   --env-allow values and --record-redact patterns, every match and only the matches; the
   policy words; bad patterns refused without being echoed. The hooks and the stored row are
   tested end to end by tests/integration/record.sh. */
#include "check.h"

#include "record.h"
#include "secrets.h"

#include <stdlib.h>
#include <string.h>

#define KEY "sk-test-0123456789abcdef"

static void add(const char *re)
{
  char err[300];
  CHECK_INT_EQ(record_add_pattern(re, err, sizeof err), 0);
}

static void redacted_is(const char *in, const char *want)
{
  char *got = record_redact(in, strlen(in));
  CHECK(got != NULL);
  CHECK_STR_EQ(got, want);
  free(got);
}

static void patterns_replace_every_match_and_nothing_else(void)
{
  record_reset();
  add("acct-[0-9]+");
  redacted_is("a acct-1 b acct-22 c", "a [redacted] b [redacted] c");
  redacted_is("acct-", "acct-");                       /* no digits: no match */
  redacted_is("acct-9acct-8", "[redacted][redacted]");  /* adjacent matches */
  redacted_is("", "");
  /* An anchor holds at the start of the text only, not after each match. */
  record_reset();
  add("^tok");
  redacted_is("toktok tok", "[redacted]tok tok");
  /* Patterns apply in the order given, each to what the one before left. */
  record_reset();
  add("secret-[a-z]+");
  add("\\[redacted\\]-x");
  redacted_is("secret-abc-x", "[redacted]");
  record_reset();
}

static void env_values_and_patterns_are_both_redacted(void)
{
  record_reset();
  secrets_reset();
  setenv("LEASH_TEST_RECORD_KEY", KEY, 1);
  char err[256];
  CHECK_INT_EQ(secrets_allow("LEASH_TEST_RECORD_KEY", err, sizeof err), 0);
  add("user-[0-9]{4}");
  redacted_is("key=" KEY "&u=user-1234", "key=[redacted]&u=[redacted]");
  redacted_is("{\"k\":\"" KEY "\"}", "{\"k\":\"[redacted]\"}");
  /* A text that ends inside the value (a cut body) loses the piece, as log lines do. */
  redacted_is("tail sk-test-0123", "tail [redacted]");
  secrets_reset();
  record_reset();
}

static void bad_patterns_are_refused_without_echoing_them(void)
{
  record_reset();
  char err[300];
  const char *bad[] = { "(sk-live-abc", "[sk-live-abc", "sk-live-abc{2,1}", "a|", "x*", "()" };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    err[0] = '\0';
    CHECK_INT_EQ(record_add_pattern(bad[i], err, sizeof err), -1);
    CHECK(strncmp(err, "--record-redact: ", 17) == 0);
    CHECK(strstr(err, "sk-live") == NULL);
  }
  for (int i = 0; i < RECORD_MAX_PATTERNS; i++)
    add("p[0-9]");
  CHECK_INT_EQ(record_add_pattern("q[0-9]", err, sizeof err), -1);
  CHECK(strstr(err, "at most") != NULL);
  record_reset();
  redacted_is("p1", "p1");   /* reset forgets them */
}

static void policy_words_are_none_dead_and_all(void)
{
  enum record_policy p = RECORD_ALL;
  CHECK_INT_EQ(record_parse_policy("none", &p), 0);
  CHECK_INT_EQ(p, RECORD_NONE);
  CHECK_INT_EQ(record_parse_policy("dead", &p), 0);
  CHECK_INT_EQ(p, RECORD_DEAD);
  CHECK_INT_EQ(record_parse_policy("all", &p), 0);
  CHECK_INT_EQ(p, RECORD_ALL);
  const char *bad[] = { "", "DEAD", "dead ", "al", "every", "0" };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    CHECK_INT_EQ(record_parse_policy(bad[i], &p), -1);
  record_reset();
  CHECK_INT_EQ(record_policy(), RECORD_DEAD);   /* the default */
}

int main(int argc, char **argv)
{
  static const struct check_case cases[] = {
    { "patterns_replace_every_match_and_nothing_else", patterns_replace_every_match_and_nothing_else },
    { "env_values_and_patterns_are_both_redacted", env_values_and_patterns_are_both_redacted },
    { "bad_patterns_are_refused_without_echoing_them", bad_patterns_are_refused_without_echoing_them },
    { "policy_words_are_none_dead_and_all", policy_words_are_none_dead_and_all },
    { NULL, NULL },
  };
  return check_main(cases, argc, argv);
}
