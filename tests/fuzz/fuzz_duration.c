/*
 * fuzz_duration: option values through cli_parse_duration and cli_parse_int (src/cli.c).
 * The input, up to its first NUL, is the option text (argv strings hold no NUL); a hash of
 * the input picks the [min, max] given to cli_parse_int. Each parser is checked against an
 * independent reading of what cli.h says it accepts:
 *   duration: decimal digits with at most one '.', then nothing, "s", "ms", "m", "h" or
 *   "d"; the result is that many seconds, finite and >= 0 (text whose value overflows or
 *   underflows a double is refused);
 *   int: decimal digits with an optional leading '-' (no white space, no '+'), the whole
 *   string, within [min, max] and long's range.
 * A refused value leaves *out as it was.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cli.h"
#include "fuzz.h"

static int expect_duration(const char *s, double *want);
static int expect_int(const char *s, long min, long max, long *want);

static const long ranges[][2] = {
  { 0, LONG_MAX }, { 1, LONG_MAX }, { LONG_MIN, LONG_MAX }, { 1, 65535 }, { -5, 5 },
  { 1, INT_MAX }, { 0, 0 },
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char *s = malloc(size + 1);
  const long *r = ranges[fuzz_hash(data, size) % (sizeof ranges / sizeof ranges[0])];
  double d = -1234.5, want_d = 0;
  long l = 4242, want_l = 0;
  int ok, expected;

  FUZZ_CHECK(s != NULL);
  memcpy(s, data, size);
  s[size] = '\0';

  ok = cli_parse_duration(s, &d) == 0;
  expected = expect_duration(s, &want_d);
  if (ok) {
    FUZZ_CHECK(isfinite(d) && d >= 0);
  } else {
    FUZZ_CHECK(d == -1234.5);
  }
  if (ok != expected) {
    fprintf(stderr, "cli_parse_duration(\"%s\") %s, expected %s\n", s,
            ok ? "accepted" : "refused", expected ? "accepted" : "refused");
    abort();
  }
  FUZZ_CHECK(!ok || d == want_d);

  ok = cli_parse_int(s, r[0], r[1], &l) == 0;
  expected = expect_int(s, r[0], r[1], &want_l);
  if (ok) {
    FUZZ_CHECK(l >= r[0] && l <= r[1]);
  } else {
    FUZZ_CHECK(l == 4242);
  }
  if (ok != expected) {
    fprintf(stderr, "cli_parse_int(\"%s\", %ld, %ld) %s, expected %s\n", s, r[0], r[1],
            ok ? "accepted" : "refused", expected ? "accepted" : "refused");
    abort();
  }
  FUZZ_CHECK(!ok || l == want_l);
  free(s);
  return 0;
}

static int expect_duration(const char *s, double *want)
{
  static const struct { const char *suffix; double scale; } units[] = {
    { "", 1 }, { "s", 1 }, { "ms", 0.001 }, { "m", 60 }, { "h", 3600 }, { "d", 86400 },
  };
  size_t n = strspn(s, "0123456789."), digits = 0, dots = 0;
  double scale = -1, v;
  char *num, *end;

  for (size_t i = 0; i < n; i++) {
    if (s[i] == '.')
      dots++;
    else
      digits++;
  }
  if (digits == 0 || dots > 1)
    return 0;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcmp(s + n, units[i].suffix) == 0)
      scale = units[i].scale;
  if (scale < 0)
    return 0;
  num = strndup(s, n);
  FUZZ_CHECK(num != NULL);
  errno = 0;
  v = strtod(num, &end);
  FUZZ_CHECK(end == num + n);   /* the grammar above is a prefix strtod reads whole */
  free(num);
  if (errno != 0)
    return 0;
  *want = v * scale;
  return isfinite(*want) && *want <= CLI_DURATION_MAX;   /* capped at 100 years */
}

static int expect_int(const char *s, long min, long max, long *want)
{
  unsigned long mag = 0, limit;
  int neg = 0, digits = 0;

  if (*s == '-')
    neg = *s++ == '-';
  limit = neg ? (unsigned long)LONG_MAX + 1 : (unsigned long)LONG_MAX;
  for (; *s >= '0' && *s <= '9'; s++, digits++) {
    unsigned long dgt = (unsigned long)(*s - '0');
    if (mag > (limit - dgt) / 10)
      return 0;   /* out of long's range */
    mag = mag * 10 + dgt;
  }
  if (digits == 0 || *s != '\0')
    return 0;
  if (neg)
    *want = mag == (unsigned long)LONG_MAX + 1 ? LONG_MIN : -(long)mag;
  else
    *want = (long)mag;
  return *want >= min && *want <= max;
}
