/* What a provider's answer says to a budget (src/provider.c): how long a 429 or 503 asks us
   to wait, in every form the providers send it, and what a call used. Hostile values (huge,
   negative, not numbers, dates in the past) are checked by class. */
#include "check.h"

#include "provider.h"

#include <math.h>
#include <string.h>

static const time_t NOW = 1796126400;   /* 2026-12-01T12:00:00Z */

static double wait_of(const char *head)
{
  return provider_wait_s(head, strlen(head), NOW);
}

static int near(double a, double b)
{
  return fabs(a - b) < 1e-6;
}

static void retry_after_seconds_ms_and_dates_are_read(void)
{
  CHECK(near(wait_of("HTTP/1.1 429 Too Many Requests\r\nRetry-After: 60\r\n\r\n"), 60));
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nretry-after: 1.5\r\n\r\n"), 1.5));
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nretry-after-ms: 250\r\nretry-after: 9\r\n\r\n"), 0.25));
  CHECK(near(wait_of("HTTP/1.1 503 x\r\nRetry-After: Tue, 01 Dec 2026 12:00:30 GMT\r\n\r\n"), 30));
  /* A date already past: come back at once, not never. */
  CHECK(near(wait_of("HTTP/1.1 503 x\r\nRetry-After: Tue, 01 Dec 2026 11:00:00 GMT\r\n\r\n"), 0));
  /* Only the last response counts (a 100 Continue before it). */
  CHECK(near(wait_of("HTTP/1.1 100 Continue\r\nRetry-After: 99\r\n\r\n"
                     "HTTP/1.1 429 x\r\nRetry-After: 2\r\n\r\n"), 2));
  CHECK(wait_of("HTTP/1.1 429 x\r\ncontent-type: text/plain\r\n\r\n") < 0);
}

static void rate_limit_resets_wait_for_the_dimension_that_ran_out(void)
{
  /* OpenAI: Go durations; the requests ran out, the tokens did not. */
  CHECK(near(wait_of("HTTP/1.1 429 x\r\n"
                     "x-ratelimit-remaining-requests: 0\r\nx-ratelimit-reset-requests: 6m0s\r\n"
                     "x-ratelimit-remaining-tokens: 1500\r\nx-ratelimit-reset-tokens: 20ms\r\n"
                     "\r\n"), 360));
  /* Neither says it ran out: the longest. */
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nx-ratelimit-reset-requests: 1s\r\n"
                     "x-ratelimit-reset-tokens: 1m30.5s\r\n\r\n"), 90.5));
  /* Anthropic: RFC 3339 times. */
  CHECK(near(wait_of("HTTP/1.1 429 x\r\n"
                     "anthropic-ratelimit-tokens-remaining: 0\r\n"
                     "anthropic-ratelimit-tokens-reset: 2026-12-01T12:00:42Z\r\n"
                     "anthropic-ratelimit-requests-remaining: 10\r\n"
                     "anthropic-ratelimit-requests-reset: 2026-12-01T12:05:00Z\r\n\r\n"), 42));
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nanthropic-ratelimit-requests-reset: "
                     "2026-12-01T13:00:10.5+01:00\r\n\r\n"), 10.5));
  /* Retry-After wins over the resets. */
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nx-ratelimit-reset-requests: 5m\r\nretry-after: 7\r\n\r\n"),
             7));
}

static void hostile_waits_are_ignored_or_capped(void)
{
  /* Too large: cut to the cap, in each form. */
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nRetry-After: 99999999999\r\n\r\n"), PROVIDER_MAX_WAIT_S));
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nretry-after-ms: 99999999999999\r\n\r\n"),
             PROVIDER_MAX_WAIT_S));
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nRetry-After: Fri, 01 Jan 2100 00:00:00 GMT\r\n\r\n"),
             PROVIDER_MAX_WAIT_S));
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nx-ratelimit-reset-requests: 99999h\r\n\r\n"),
             PROVIDER_MAX_WAIT_S));
  CHECK(near(wait_of("HTTP/1.1 429 x\r\nanthropic-ratelimit-requests-reset: 2999-01-01T00:00:00Z"
                     "\r\n\r\n"), PROVIDER_MAX_WAIT_S));
  /* Not numbers, negative, not finite: ignored, the next rule is read. */
  static const char *const bad[] = { "-5", "NaN", "inf", "1e9999", "0x10", "10 s", "", "1.2.3",
                                     "soon", "Tue, 99 Foo 2026 99:99:99 GMT" };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char head[200];
    snprintf(head, sizeof head, "HTTP/1.1 429 x\r\nRetry-After: %s\r\n\r\n", bad[i]);
    CHECK(wait_of(head) < 0);
    snprintf(head, sizeof head, "HTTP/1.1 429 x\r\nRetry-After: %s\r\n"
             "x-ratelimit-reset-tokens: 3s\r\n\r\n", bad[i]);
    CHECK(near(wait_of(head), 3));
  }
  static const char *const bad_go[] = { "s", "1", "1x", "-1s", "1.s5", "99999999999999999999999h",
                                        "1s2" };
  for (size_t i = 0; i < sizeof bad_go / sizeof bad_go[0]; i++)
    CHECK(provider_go_duration(bad_go[i], strlen(bad_go[i])) < 0);
  static const char *const bad_time[] = { "2026-13-01T00:00:00Z", "2026-12-01T25:00:00Z",
                                          "2026-12-01T00:00:00", "2026-12-01T00:00:00Zjunk",
                                          "2026-12-01T00:00:00.Z", "2026-12-01T00:00:00+1:00",
                                          "not a time at all, no" };
  for (size_t i = 0; i < sizeof bad_time / sizeof bad_time[0]; i++)
    CHECK(provider_rfc3339(bad_time[i], strlen(bad_time[i])) < 0);
  /* A value is never read past its line or the block's end. */
  CHECK(wait_of("HTTP/1.1 429 x\r\nRetry-After:") < 0);
  CHECK(provider_wait_s(NULL, 0, NOW) < 0);
}

static void usage_is_read_from_openai_and_anthropic_answers(void)
{
  struct provider_usage u;
  const char *openai = "{\"model\":\"gpt-4o-mini\",\"usage\":{\"prompt_tokens\":12,"
                       "\"completion_tokens\":30,\"total_tokens\":42}}";
  CHECK(provider_usage(openai, strlen(openai), &u) == 0);
  CHECK(u.total == 42 && u.input == 12 && u.output == 30);
  CHECK(strcmp(u.model, "gpt-4o-mini") == 0);
  const char *no_total = "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}";
  CHECK(provider_usage(no_total, strlen(no_total), &u) == 0 && u.total == 12);
  CHECK(u.model[0] == '\0');
  const char *anthropic = "{\"model\":\"claude\",\"usage\":{\"input_tokens\":100,"
                          "\"output_tokens\":20,\"cache_read_input_tokens\":3}}";
  CHECK(provider_usage(anthropic, strlen(anthropic), &u) == 0);
  CHECK(u.total == 123 && u.input == 103 && u.output == 20);
  /* A model name longer than the buffer is cut, not overrun. */
  char big[400];
  snprintf(big, sizeof big, "{\"model\":\"%0300d\",\"usage\":{\"total_tokens\":1}}", 0);
  CHECK(provider_usage(big, strlen(big), &u) == 0 && strlen(u.model) == sizeof u.model - 1);
  /* Not JSON, no usage, hostile counts: unknown (-1), never a crash or a negative. */
  static const char *const none[] = { "", "not json", "[1,2]", "{\"usage\":5}", "{}",
                                      "{\"usage\":{\"total_tokens\":-4}}",
                                      "{\"usage\":{\"total_tokens\":1.5}}",
                                      "{\"usage\":{\"total_tokens\":\"12\"}}",
                                      "{\"usage\":{\"total_tokens\":99999999999999999999}}",
                                      "{\"usage\":{\"prompt_tokens\":1}", "   " };
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
    CHECK(provider_usage(none[i], strlen(none[i]), &u) == -1);
    CHECK(u.total == -1);
  }
}

int main(int argc, char **argv)
{
  static const struct check_case cases[] = {
    { "retry_after_seconds_ms_and_dates_are_read", retry_after_seconds_ms_and_dates_are_read },
    { "rate_limit_resets_wait_for_the_dimension_that_ran_out", rate_limit_resets_wait_for_the_dimension_that_ran_out },
    { "hostile_waits_are_ignored_or_capped", hostile_waits_are_ignored_or_capped },
    { "usage_is_read_from_openai_and_anthropic_answers", usage_is_read_from_openai_and_anthropic_answers },
    { NULL, NULL },
  };
  return check_main(cases, argc, argv);
}
