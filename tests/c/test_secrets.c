/* secrets: the allow list behind leash.env and the redaction of its values from log lines
   and task errors (secrets.h): whole values only, longest first, their JSON form too, and
   never a piece left behind where a long text is cut. */
#include "check.h"

#include "log.h"
#include "outcome.h"
#include "secrets.h"

#include <unistd.h>

#define KEY "sk-test-0123456789abcdef"

static void allow(const char *list)
{
  char err[256];
  CHECK_INT_EQ(secrets_allow(list, err, sizeof err), 0);
}

static void only_allowed_names_are_answered_and_unset_ones_are_nil(void)
{
  setenv("T_KEY", KEY, 1);
  setenv("T_OTHER", "not-allowed-value-123", 1);
  unsetenv("T_UNSET");
  allow("T_KEY,T_UNSET");
  const char *v = "x";
  CHECK_INT_EQ(secrets_lookup("T_KEY", &v), 1);
  CHECK_STR_EQ(v, KEY);
  CHECK_INT_EQ(secrets_lookup("T_UNSET", &v), 1);
  CHECK(v == NULL);
  CHECK_INT_EQ(secrets_lookup("T_OTHER", &v), 0);
  CHECK_INT_EQ(secrets_lookup("t_key", &v), 0);        /* names are exact */
  CHECK_INT_EQ(secrets_lookup("", &v), 0);
  /* The value is the one read when the list was given. */
  setenv("T_KEY", "changed-afterwards-123", 1);
  CHECK_INT_EQ(secrets_lookup("T_KEY", &v), 1);
  CHECK_STR_EQ(v, KEY);
  char names[64];
  CHECK_INT_EQ(secrets_list(SECRETS_UNSET, names, sizeof names), 1);
  CHECK_STR_EQ(names, "T_UNSET");
  secrets_reset();
  CHECK_INT_EQ(secrets_lookup("T_KEY", &v), 0);
}

static void bad_names_are_refused_with_the_name(void)
{
  static const char *const bad[] = { "", ",", "A,", "9LIVES", "A-B", "A B", "A=B", "É", "A,,B" };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char err[256] = "";
    CHECK_INT_EQ(secrets_allow(bad[i], err, sizeof err), -1);
    CHECK(strstr(err, "--env-allow") != NULL);
    CHECK(strstr(err, "not a variable name") != NULL);
    secrets_reset();
  }
  char many[SECRETS_MAX * 8], err[256];
  size_t n = 0;
  for (int i = 0; i <= SECRETS_MAX; i++)
    n += (size_t)snprintf(many + n, sizeof many - n, "%sV%d", i ? "," : "", i);
  CHECK_INT_EQ(secrets_allow(many, err, sizeof err), -1);
  CHECK(strstr(err, "at most") != NULL);
  secrets_reset();
}

static void values_are_redacted_whole_longest_first_and_in_json_form(void)
{
  setenv("T_KEY", KEY, 1);
  setenv("T_LONGER", KEY "-and-more", 1);       /* holds T_KEY's value */
  setenv("T_QUOTED", "pass\"word\\with\nstuff", 1);
  setenv("T_SHORT", "eu-1", 1);                  /* too short to redact */
  allow("T_KEY,T_LONGER");
  allow("T_QUOTED,T_SHORT");
  char *r = secrets_redact("a " KEY " b " KEY "-and-more c " KEY KEY " d");
  CHECK_STR_EQ(r, "a [redacted] b [redacted] c [redacted][redacted] d");
  free(r);
  r = secrets_redact("json: {\"k\":\"pass\\\"word\\\\with\\nstuff\"} raw: pass\"word\\with\nstuff");
  CHECK_STR_EQ(r, "json: {\"k\":\"[redacted]\"} raw: [redacted]");
  free(r);
  r = secrets_redact("region eu-1 stays; a near miss sk-test-0123456789abcdeX stays");
  CHECK_STR_EQ(r, "region eu-1 stays; a near miss sk-test-0123456789abcdeX stays");
  free(r);
  CHECK_INT_EQ(secrets_found("eu-1", 4), 0);
  CHECK_INT_EQ(secrets_found("x" KEY, strlen(KEY) + 1), 1);
  char names[64];
  CHECK_INT_EQ(secrets_list(SECRETS_SHORT, names, sizeof names), 1);
  CHECK_STR_EQ(names, "T_SHORT");
  secrets_reset();
}

static void a_text_cut_inside_a_value_loses_the_piece(void)
{
  setenv("T_KEY", KEY, 1);
  allow("T_KEY");
  char *r = secrets_redact("cut by its maker: sk-test-0123");
  CHECK_STR_EQ(r, "cut by its maker: [redacted]");
  free(r);
  r = secrets_redact("three bytes say nothing: sk-");
  CHECK_STR_EQ(r, "three bytes say nothing: sk-");
  free(r);
  r = secrets_redact("only at the end: sk-test-0123 and on");
  CHECK_STR_EQ(r, "only at the end: sk-test-0123 and on");
  free(r);
  CHECK_INT_EQ(secrets_found("x sk-t", 6), 1);
  secrets_reset();
}

/* An error just long enough that the cut at OUTCOME_ERROR_MAX falls inside the value. */
static void a_value_straddling_the_error_cut_leaves_nothing_behind(void)
{
  setenv("T_KEY", KEY, 1);
  allow("T_KEY");
  for (size_t before = OUTCOME_ERROR_MAX - 30; before < OUTCOME_ERROR_MAX + 2; before += 3) {
    char *msg = malloc(before + sizeof KEY + 10);
    memset(msg, 'x', before);
    strcpy(msg + before, KEY " tail");
    struct outcome o = { 0 };
    outcome_clear(&o);
    outcome_set(&o, OUTCOME_RETRY, CAUSE_ERROR, "p: ", msg);
    CHECK(o.error != NULL);
    CHECK(strlen(o.error) <= OUTCOME_ERROR_MAX - 1);
    CHECK(strstr(o.error, "sk-test") == NULL);
    CHECK(strstr(o.error, "0123") == NULL);
    outcome_clear(&o);
    free(msg);
  }
  /* Cut by its maker first (script.c keeps the first OUTCOME_ERROR_MAX bytes of an error). */
  for (size_t before = OUTCOME_ERROR_MAX - (sizeof KEY - 2); before <= OUTCOME_ERROR_MAX - 4;
       before += 3) {
    char *msg = malloc(OUTCOME_ERROR_MAX + 1);
    memset(msg, 'x', before);
    memcpy(msg + before, KEY, OUTCOME_ERROR_MAX - before);   /* the key, cut */
    msg[OUTCOME_ERROR_MAX] = '\0';
    struct outcome o = { 0 };
    outcome_clear(&o);
    outcome_set(&o, OUTCOME_RETRY, CAUSE_ERROR, NULL, msg);
    CHECK(strstr(o.error, "sk-test") == NULL);
    /* The mark took the piece's place (itself cut at the limit when it falls there). */
    size_t len = strlen(o.error);
    CHECK(len > before);
    CHECK(strncmp(o.error + before, SECRETS_MARK, len - before) == 0);
    outcome_clear(&o);
    free(msg);
  }
  struct outcome o = { 0 };
  outcome_clear(&o);
  outcome_set(&o, OUTCOME_FATAL, CAUSE_RETURNED, NULL, "bad key " KEY);
  CHECK_STR_EQ(o.error, "bad key [redacted]");
  CHECK_INT_EQ(o.kind, OUTCOME_FATAL);
  outcome_clear(&o);
  secrets_reset();
}

static void log_long(void)
{
  /* The message is cut at 4096 bytes and a field at 8192: the value sits on each cut. */
  static char msg[4200], field[8300];
  for (size_t at = 4096 - 20; at < 4096; at += 4) {
    memset(msg, 'm', at);
    strcpy(msg + at, KEY);
    log_fields(LOG_INFO, NULL, "%s", msg);
  }
  for (size_t at = 8192 - 20; at < 8192; at += 4) {
    memset(field, 'f', at);
    strcpy(field + at, KEY);
    struct log_field f[] = { { "k", field }, { "short", "the key is " KEY }, { NULL, NULL } };
    log_fields(LOG_WARN, f, "fields");
  }
  struct log_field f[] = { { "k", KEY }, { "key_" KEY, "v" }, { NULL, NULL } };
  log_fields(LOG_ERROR, f, "plain %s and %s", KEY, "text");
}

static void log_lines_hold_no_value_in_either_format_and_at_any_cut(void)
{
  setenv("T_KEY", KEY, 1);
  allow("T_KEY");
  for (int fmt = LOG_TEXT; fmt <= LOG_JSON; fmt++) {
    log_set_format((enum log_format)fmt);
    char *out = check_capture_stderr(log_long);
    CHECK(strstr(out, "sk-test") == NULL);
    CHECK(strstr(out, "0123456789") == NULL);
    CHECK(strstr(out, "plain [redacted] and text") != NULL);
    CHECK(strstr(out, "the key is [redacted]") != NULL);
    CHECK(strstr(out, "key_[redacted]") != NULL);
    free(out);
  }
  log_set_format(LOG_TEXT);
  secrets_reset();
  /* Nothing allowed: lines are written as they are. */
  char *out = check_capture_stderr(log_long);
  CHECK(strstr(out, "plain " KEY " and text") != NULL);
  free(out);
}

int main(int argc, char **argv)
{
  static const struct check_case cases[] = {
    { "only_allowed_names_are_answered_and_unset_ones_are_nil", only_allowed_names_are_answered_and_unset_ones_are_nil },
    { "bad_names_are_refused_with_the_name", bad_names_are_refused_with_the_name },
    { "values_are_redacted_whole_longest_first_and_in_json_form", values_are_redacted_whole_longest_first_and_in_json_form },
    { "a_text_cut_inside_a_value_loses_the_piece", a_text_cut_inside_a_value_loses_the_piece },
    { "a_value_straddling_the_error_cut_leaves_nothing_behind", a_value_straddling_the_error_cut_leaves_nothing_behind },
    { "log_lines_hold_no_value_in_either_format_and_at_any_cut", log_lines_hold_no_value_in_either_format_and_at_any_cut },
    { NULL, NULL },
  };
  return check_main(cases, argc, argv);
}
