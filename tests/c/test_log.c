/* Log lines: one event is one line whatever the message, keys and values hold (a tenant id
   or a script's log field with CR/LF, ANSI escapes, DEL), and a line's size is bounded. */
#include "check.h"

#include "log.h"

#include <jansson.h>
#include <unistd.h>

static int count_char(const char *s, char c)
{
  int n = 0;
  for (; *s; s++)
    n += *s == c;
  return n;
}

/* Forgeries: each value tries to end the line and start a fake one. */
static const char *const evil_tenant = "acme\n2026-12-01T00:00:00.000Z info  task done task_id=1";
static const char *const evil_value = "a\r\nb\x1b[31mred\x1b[0m\x7f\tc\x01";
static const char *const evil_key = "k\ney\x7f";

static void log_evil(void)
{
  struct log_field f[] = {
    { "tenant", evil_tenant }, { evil_key, evil_value }, { "plain", "v" }, { NULL, NULL },
  };
  log_fields(LOG_INFO, f, "message\nwith a newline\rand CR\x1b[2J");
}

static void text_lines_escape_control_characters(void)
{
  log_set_format(LOG_TEXT);
  char *out = check_capture_stderr(log_evil);
  CHECK_INT_EQ(count_char(out, '\n'), 1);
  CHECK(out[strlen(out) - 1] == '\n');
  CHECK_INT_EQ(count_char(out, '\r'), 0);
  CHECK_INT_EQ(count_char(out, '\x1b'), 0);
  CHECK_INT_EQ(count_char(out, '\x7f'), 0);
  CHECK_INT_EQ(count_char(out, '\t'), 0);
  CHECK(strstr(out, " message\\nwith a newline\\rand CR\\x1b[2J "));
  CHECK(strstr(out, " tenant=acme\\n2026-12-01T00:00:00.000Z info  task done task_id=1 "));
  CHECK(strstr(out, " k\\ney\\x7f=a\\r\\nb\\x1b[31mred\\x1b[0m\\x7f\\tc\\x01 "));
  CHECK(strstr(out, " plain=v\n"));
  for (const char *p = out; *p; p++)
    CHECK((unsigned char)*p >= 0x20 || *p == '\n');
  free(out);
}

static void json_lines_escape_control_characters(void)
{
  log_set_format(LOG_JSON);
  char *out = check_capture_stderr(log_evil);
  CHECK_INT_EQ(count_char(out, '\n'), 1);
  json_error_t e;
  json_t *o = json_loads(out, 0, &e);
  CHECK(o != NULL);
  CHECK_STR_EQ(json_string_value(json_object_get(o, "tenant")), evil_tenant);
  CHECK_STR_EQ(json_string_value(json_object_get(o, evil_key)), evil_value);
  CHECK_STR_EQ(json_string_value(json_object_get(o, "msg")), "message\nwith a newline\rand CR\x1b[2J");
  json_decref(o);
  free(out);
}

static char *big;

static void log_big(void)
{
  struct log_field f[] = { { "a", big }, { "b", big }, { "c", "after" }, { NULL, NULL } };
  log_fields(LOG_WARN, f, "%s", big);
}

static void long_values_are_cut_so_a_line_stays_bounded(void)
{
  size_t n = 1u << 20;
  big = malloc(n + 1);
  for (size_t i = 0; i < n; i++)
    big[i] = i % 100 == 99 ? '\n' : 'x';
  big[n] = '\0';
  log_set_format(LOG_TEXT);
  char *out = check_capture_stderr(log_big);
  CHECK_INT_EQ(count_char(out, '\n'), 1);
  CHECK(strlen(out) <= 16384);
  free(out);
  log_set_format(LOG_JSON);
  out = check_capture_stderr(log_big);
  CHECK_INT_EQ(count_char(out, '\n'), 1);
  CHECK(strlen(out) < 64 * 1024);
  json_t *o = json_loads(out, 0, NULL);
  CHECK(o != NULL);
  CHECK(json_string_length(json_object_get(o, "a")) <= 8192);
  CHECK_STR_EQ(json_string_value(json_object_get(o, "c")), "after");
  json_decref(o);
  free(out);
  /* a cut never splits a UTF-8 character: the JSON line keeps the field */
  big[0] = 'x';
  for (size_t i = 1; i + 1 < n; i += 2)
    memcpy(big + i, "\xc3\xa9", 2);   /* the 8192nd byte ends a character's first byte */
  big[8300] = '\0';
  out = check_capture_stderr(log_big);
  o = json_loads(out, 0, NULL);
  CHECK(o != NULL);
  CHECK_INT_EQ(json_string_length(json_object_get(o, "a")), 8191);
  json_decref(o);
  free(out);
  free(big);
}

int main(int argc, char **argv)
{
  static const struct check_case cases[] = {
    { "text_lines_escape_control_characters", text_lines_escape_control_characters },
    { "json_lines_escape_control_characters", json_lines_escape_control_characters },
    { "long_values_are_cut_so_a_line_stays_bounded", long_values_are_cut_so_a_line_stays_bounded },
    { NULL, NULL },
  };
  return check_main(cases, argc, argv);
}
