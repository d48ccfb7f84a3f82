/*
 * test_cli: the option-value parsers of cli.c (cli_parse_duration, cli_parse_int), which
 * tests/fuzz/fuzz_duration also fuzzes; inputs it found are in tests/fuzz/regressions/duration/;
 * sizes, poll ranges, listen addresses and switches; the LEASH_<NAME> pass of
 * cli_next_option on a table of its own; and the deadline arithmetic `status --watch`
 * sleeps with (deadline.h).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cli.h"
#include "deadline.h"
#include "log.h"

static void durations_take_the_documented_units(void)
{
  static const struct { const char *text; double seconds; } ok[] = {
    { "30", 30 }, { "1.5", 1.5 }, { "500ms", 0.5 }, { "30s", 30 }, { "5m", 300 },
    { "2h", 7200 }, { "7d", 604800 }, { "0", 0 }, { ".5", 0.5 }, { "5.", 5 },
  };
  static const char *const bad[] = {
    "", "s", ".", "-1", "+1", " 1", "1 ", "1e3", "0x10", "inf", "nan", "1.2.3", "5S", "5mm",
  };
  double d;
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    d = -1;
    CHECK_INT_EQ(cli_parse_duration(ok[i].text, &d), 0);
    CHECK(d == ok[i].seconds);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    d = -1;
    CHECK_INT_EQ(cli_parse_duration(bad[i], &d), -1);
    CHECK(d == -1);
  }
}

/* Digits only, so strtod gives a finite number, but times 86400 it is not: the result
   was +inf (found by fuzz_duration). Text beyond a double's range is refused as well. */
static void durations_too_large_for_a_double_are_refused(void)
{
  char text[400];
  double d = -1;

  memset(text, '9', 308);
  strcpy(text + 308, "d");
  CHECK_INT_EQ(cli_parse_duration(text, &d), -1);
  CHECK(d == -1);
  text[308] = '\0';                      /* the same digits as seconds: over the cap */
  CHECK_INT_EQ(cli_parse_duration(text, &d), -1);
  CHECK(d == -1);
  CHECK_INT_EQ(cli_parse_duration("3153600000", &d), 0);   /* 100 years exactly */
  CHECK(d == CLI_DURATION_MAX);
  d = -1;
  CHECK_INT_EQ(cli_parse_duration("36501d", &d), -1);
  memset(text, '9', 399);
  text[399] = '\0';                      /* beyond DBL_MAX: strtod's ERANGE */
  d = -1;
  CHECK_INT_EQ(cli_parse_duration(text, &d), -1);
  CHECK(d == -1);
}

static void ints_are_whole_and_in_range(void)
{
  long v = 42;
  CHECK_INT_EQ(cli_parse_int("7", 1, 10, &v), 0);
  CHECK_INT_EQ(v, 7);
  CHECK_INT_EQ(cli_parse_int("-9223372036854775808", LONG_MIN, LONG_MAX, &v), 0);
  CHECK(v == LONG_MIN);
  v = 42;
  CHECK_INT_EQ(cli_parse_int("9223372036854775808", LONG_MIN, LONG_MAX, &v), -1);
  CHECK_INT_EQ(cli_parse_int("0", 1, 10, &v), -1);
  CHECK_INT_EQ(cli_parse_int("11", 1, 10, &v), -1);
  CHECK_INT_EQ(cli_parse_int("1.5", 1, 10, &v), -1);
  CHECK_INT_EQ(cli_parse_int("", 1, 10, &v), -1);
  CHECK_INT_EQ(cli_parse_int("5x", 1, 10, &v), -1);
  CHECK_INT_EQ(cli_parse_int(" 5", 1, 10, &v), -1);
  CHECK_INT_EQ(cli_parse_int("+5", 1, 10, &v), -1);
  CHECK_INT_EQ(cli_parse_int("-", -10, 10, &v), -1);
  CHECK_INT_EQ(cli_parse_int("\t5", 1, 10, &v), -1);
  CHECK_INT_EQ(v, 42);
}

/* Fractions carry into the seconds (tv_nsec stays below 1e9 whatever the clock's own
   fraction), a deadline of now has passed, one a minute away has not and has about 60 s
   left. */
static void deadlines_carry_fractions_into_seconds(void)
{
  for (int i = 0; i < 200; i++) {
    struct timespec d = deadline_after(CLOCK_MONOTONIC, 0.9 + i * 0.0371);
    CHECK(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
  }
  struct timespec now = deadline_after(CLOCK_MONOTONIC, 0);
  CHECK(deadline_passed(CLOCK_MONOTONIC, &now));
  struct timespec later = deadline_after(CLOCK_MONOTONIC, 60.25);
  CHECK(!deadline_passed(CLOCK_MONOTONIC, &later));
  double left = deadline_left(CLOCK_MONOTONIC, &later);
  CHECK(left > 59 && left <= 60.25);
  CHECK(later.tv_sec - now.tv_sec >= 60 && later.tv_sec - now.tv_sec <= 61);
}


static void plain_sizes_keep_their_old_unit_and_units_are_bytes(void)
{
  size_t v = 42;
  const size_t mb = (size_t)1 << 20;
  CHECK_INT_EQ(cli_parse_size_in("256", mb, 0, (size_t)1 << 40, &v), 0);
  CHECK(v == 256 * mb);
  CHECK_INT_EQ(cli_parse_size_in("512MB", mb, 0, (size_t)1 << 40, &v), 0);
  CHECK(v == 512 * mb);
  CHECK_INT_EQ(cli_parse_size_in("1GB", mb, 0, (size_t)1 << 40, &v), 0);
  CHECK(v == 1024 * mb);
  CHECK_INT_EQ(cli_parse_size_in("64KB", 1, 1, (size_t)1 << 40, &v), 0);
  CHECK(v == 65536);
  CHECK_INT_EQ(cli_parse_size_in("0", mb, 0, (size_t)1 << 40, &v), 0);
  CHECK(v == 0);
  v = 42;
  static const char *const bad[] = {
    "", "MB", "-1", "+1", " 1", "1 ", "1.5MB", "1TB", "1mb", "1e3", "0x10", "99999999999999999999",
    "1048577",   /* MB: more than 1024 GB */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK_INT_EQ(cli_parse_size_in(bad[i], mb, 0, (size_t)1 << 40, &v), -1);
  CHECK_INT_EQ(cli_parse_size_in("0", 1, 1, 100, &v), -1);   /* under min, plain */
  CHECK_INT_EQ(cli_parse_size_in("1KB", 1, 1, 100, &v), -1); /* over max, with a unit */
  CHECK(v == 42);
}

static void poll_ranges_take_two_durations_or_one(void)
{
  double lo = -1, hi = -1;
  CHECK_INT_EQ(cli_parse_duration_range("10ms-1s", 0.001, 60, &lo, &hi), 0);
  CHECK(lo == 0.01 && hi == 1);
  CHECK_INT_EQ(cli_parse_duration_range("200ms-500ms", 0.001, 60, &lo, &hi), 0);
  CHECK(lo == 0.2 && hi == 0.5);
  CHECK_INT_EQ(cli_parse_duration_range("1s", 0.001, 60, &lo, &hi), 0);
  CHECK(lo == 1 && hi == 1);
  CHECK_INT_EQ(cli_parse_duration_range("1m-1m", 0.001, 60, &lo, &hi), 0);
  static const char *const bad[] = {
    "", "-", "-1s", "1s-", "1s--2s", "2s-1s", "0-1s", "200-500", "1s-61s", "1h", "inf-1s",
    "1s-nan", "10ms-1s-2s", "1 s-2s", "1s - 2s", "0.0001ms-1s",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    lo = hi = -1;
    if (cli_parse_duration_range(bad[i], 0.001, 60, &lo, &hi) != -1)
      fprintf(stderr, "accepted: '%s'\n", bad[i]);
    CHECK(lo == -1 && hi == -1);
  }
}

static void listen_addresses_need_a_host_and_a_port_from_1_to_65535(void)
{
  static const char *const ok[] = {
    "127.0.0.1:9100", ":9100", "[::1]:9100", "[::]:1", "localhost:65535", "metrics-0.svc:80",
    "0.0.0.0:9100", "[fe80::1]:00080",
  };
  static const char *const bad[] = {
    /* ports */
    "127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:0", "127.0.0.1:", "127.0.0.1:http",
    "127.0.0.1:-1", "127.0.0.1:+80", "127.0.0.1: 80", "127.0.0.1:80 ", "127.0.0.1:0x50",
    "127.0.0.1:1e3", "127.0.0.1:9999999999999999999999",
    /* hosts */
    "127.0.0.1", "", ":", "::1:9100", "[::1:9100", "[zz::1]:9100", "1.2.3.999:80", "127.1:80",
    "host name:80", "host/x:80", "-h:80", ".x:80", "h\n:80", "[]:80", "[127.0.0.1]:80",
  };
  char err[300];
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    if (cli_check_listen_addr(ok[i], err, sizeof err) != 0)
      fprintf(stderr, "refused '%s': %s\n", ok[i], err);
    CHECK_INT_EQ(cli_check_listen_addr(ok[i], err, sizeof err), 0);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = '\0';
    if (cli_check_listen_addr(bad[i], err, sizeof err) != -1)
      fprintf(stderr, "accepted '%s'\n", bad[i]);
    CHECK_INT_EQ(cli_check_listen_addr(bad[i], err, sizeof err), -1);
    CHECK(err[0] != '\0');   /* control characters are escaped where it is printed */
  }
}

static void switches_take_three_words_each_way(void)
{
  static const char *const on[] = { "1", "true", "yes", "TRUE", "Yes" };
  static const char *const off[] = { "0", "false", "no", "FALSE", "No" };
  static const char *const bad[] = { "", "2", "on", "off", "y", "n", " 1", "1 ", "truex", "-1" };
  for (size_t i = 0; i < sizeof on / sizeof on[0]; i++)
    CHECK_INT_EQ(cli_parse_bool(on[i]), 1);
  for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
    CHECK_INT_EQ(cli_parse_bool(off[i]), 0);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK_INT_EQ(cli_parse_bool(bad[i]), -1);
}

static void variable_names_are_leash_and_the_option_in_capitals(void)
{
  char b[80];
  CHECK_STR_EQ(cli_env_name("poll-ms", b, sizeof b), "LEASH_POLL_MS");
  CHECK_STR_EQ(cli_env_name("lua-memory", b, sizeof b), "LEASH_LUA_MEMORY");
  CHECK_STR_EQ(cli_env_name("db", b, sizeof b), "LEASH_DB");
  CHECK_STR_EQ(cli_env_name("max-result-bytes", b, sizeof b), "LEASH_MAX_RESULT_BYTES");
  char small[10];
  CHECK_STR_EQ(cli_env_name("worker-id", small, sizeof small), "LEASH_WOR");   /* cut, ended */
}

/* A writable argument, as argv's are. */
#define ARG(s) ((char[]){ s })

/* A command's loop over a table of its own: what it sees, in order, as "name=value". */
enum { T_COUNT = OPT_COMMAND_BASE, T_NAME, T_FLAG };
static const struct option t_opts[] = {
  CLI_GLOBAL_OPTIONS,
  { "count", required_argument, NULL, T_COUNT },
  { "name", required_argument, NULL, T_NAME },
  { "flag", no_argument, NULL, T_FLAG },
  { NULL, 0, NULL, 0 },
};

static int t_parse(char *seen, size_t len, int argc, char **argv, struct cli *g)
{
  int opt, rc = 0;
  seen[0] = '\0';
  g->command = "t";
  g->usage = "usage: t\n\n";
  optind = 0;
  while ((opt = cli_next_option(g, argc, argv, t_opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    size_t n = strlen(seen);
    snprintf(seen + n, len - n, "%s%s=%s%s", n ? " " : "",
             opt == T_COUNT ? "count" : opt == T_NAME ? "name" : "flag", optarg ? optarg : "",
             g->env_var ? "(env)" : "");
  }
  return 0;
}

static void variables_come_before_argv_and_an_option_in_argv_leaves_its_variable_unread(void)
{
  char seen[256];
  struct cli g = { 0 };
  char *argv1[] = { ARG("t"), ARG("--name"), ARG("cli"), ARG("pos"), NULL };
  setenv("LEASH_COUNT", "7", 1);
  setenv("LEASH_NAME", "from-env", 1);
  setenv("LEASH_FLAG", "yes", 1);
  CHECK_INT_EQ(t_parse(seen, sizeof seen, 4, argv1, &g), 0);
  CHECK_STR_EQ(seen, "count=7(env) flag=(env) name=cli");
  CHECK_STR_EQ(argv1[optind], "pos");
  CHECK(g.env_var == NULL);

  /* An abbreviation counts as the option; a switch's "no" is off. */
  struct cli g2 = { 0 };
  char *argv2[] = { ARG("t"), ARG("--cou=3"), NULL };
  setenv("LEASH_FLAG", "No", 1);
  CHECK_INT_EQ(t_parse(seen, sizeof seen, 2, argv2, &g2), 0);
  CHECK_STR_EQ(seen, "name=from-env(env) count=3");

  /* A global given before the command (main's loop) is not overridden by its variable. */
  struct cli g3 = { 0 };
  char *argv3[] = { ARG("t"), NULL };
  int done;
  setenv("LEASH_TABLE", "env_table", 1);
  CHECK_INT_EQ(cli_global_option(&g3, OPT_TABLE, "main_table", &done), 1);
  CHECK_INT_EQ(t_parse(seen, sizeof seen, 1, argv3, &g3), 0);
  CHECK_STR_EQ(g3.table, "main_table");
  struct cli g4 = { 0 };
  CHECK_INT_EQ(t_parse(seen, sizeof seen, 1, argv3, &g4), 0);
  CHECK_STR_EQ(g4.table, "env_table");
  /* Globals next to each other in the table are all read (one was skipped after another). */
  struct cli g5 = { 0 };
  setenv("LEASH_DB", "dbname=x", 1);
  setenv("LEASH_LOG_LEVEL", "warn", 1);
  CHECK_INT_EQ(t_parse(seen, sizeof seen, 1, argv3, &g5), 0);
  CHECK_STR_EQ(g5.db, "dbname=x");
  CHECK_STR_EQ(g5.table, "env_table");
  CHECK_INT_EQ(log_enabled(LOG_INFO), 0);
  CHECK_STR_EQ(seen, "count=7(env) name=from-env(env)");
  log_set_level(LOG_INFO);
  unsetenv("LEASH_DB");
  unsetenv("LEASH_LOG_LEVEL");
  unsetenv("LEASH_TABLE");
  unsetenv("LEASH_COUNT");
  unsetenv("LEASH_NAME");
  unsetenv("LEASH_FLAG");
}

static void bad_variables_stop_the_parse_unless_argv_asks_for_help(void)
{
  char seen[256];
  static const struct { const char *var, *value; } bad[] = {
    { "LEASH_FLAG", "maybe" }, { "LEASH_FLAG", "" }, { "LEASH_NAME", "" },
    { "LEASH_TABLE", "a$b" }, { "LEASH_LOG_LEVEL", "loud" }, { "LEASH_DB", "" },
  };
  char *argv[] = { ARG("t"), NULL };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    struct cli g = { 0 };
    setenv(bad[i].var, bad[i].value, 1);
    CHECK_INT_EQ(t_parse(seen, sizeof seen, 1, argv, &g), EXIT_USAGE);
    CHECK_STR_EQ(g.env_var, bad[i].var);
    /* --help works whatever the environment holds (its output goes to /dev/null). */
    struct cli h = { 0 };
    char *help[] = { ARG("t"), ARG("--help"), NULL };
    fflush(stdout);
    int saved = dup(1);
    CHECK(freopen("/dev/null", "w", stdout) != NULL);
    int rc = t_parse(seen, sizeof seen, 2, help, &h);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    CHECK_INT_EQ(rc, EXIT_OK);
    unsetenv(bad[i].var);
  }
  /* An empty value in argv is refused too, for every option that takes one. */
  struct cli g = { 0 };
  char *empty[] = { ARG("t"), ARG("--name="), NULL };
  CHECK_INT_EQ(t_parse(seen, sizeof seen, 2, empty, &g), EXIT_USAGE);
  CHECK(g.env_var == NULL);
}

static const struct check_case cases[] = {
  { "durations_take_the_documented_units", durations_take_the_documented_units },
  { "durations_too_large_for_a_double_are_refused",
    durations_too_large_for_a_double_are_refused },
  { "ints_are_whole_and_in_range", ints_are_whole_and_in_range },
  { "deadlines_carry_fractions_into_seconds", deadlines_carry_fractions_into_seconds },
  { "plain_sizes_keep_their_old_unit_and_units_are_bytes",
    plain_sizes_keep_their_old_unit_and_units_are_bytes },
  { "poll_ranges_take_two_durations_or_one", poll_ranges_take_two_durations_or_one },
  { "listen_addresses_need_a_host_and_a_port_from_1_to_65535",
    listen_addresses_need_a_host_and_a_port_from_1_to_65535 },
  { "switches_take_three_words_each_way", switches_take_three_words_each_way },
  { "variable_names_are_leash_and_the_option_in_capitals",
    variable_names_are_leash_and_the_option_in_capitals },
  { "variables_come_before_argv_and_an_option_in_argv_leaves_its_variable_unread",
    variables_come_before_argv_and_an_option_in_argv_leaves_its_variable_unread },
  { "bad_variables_stop_the_parse_unless_argv_asks_for_help",
    bad_variables_stop_the_parse_unless_argv_asks_for_help },
  { NULL, NULL }
};

int main(int argc, char **argv)
{
  return check_main(cases, argc, argv);
}
