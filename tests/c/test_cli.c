/*
 * test_cli: the option-value parsers of cli.c (cli_parse_duration, cli_parse_int), which
 * tests/fuzz/fuzz_duration also fuzzes; inputs it found are in tests/fuzz/regressions/duration/;
 * and the deadline arithmetic `status --watch` sleeps with (deadline.h).
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "check.h"
#include "cli.h"
#include "deadline.h"

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

static const struct check_case cases[] = {
  { "durations_take_the_documented_units", durations_take_the_documented_units },
  { "durations_too_large_for_a_double_are_refused",
    durations_too_large_for_a_double_are_refused },
  { "ints_are_whole_and_in_range", ints_are_whole_and_in_range },
  { "deadlines_carry_fractions_into_seconds", deadlines_carry_fractions_into_seconds },
  { NULL, NULL }
};

int main(int argc, char **argv)
{
  return check_main(cases, argc, argv);
}
