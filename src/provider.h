/*
 * provider: what a provider's answer says to a budget: how long it asks us to wait (the
 * headers of its 429 or 503) and how many tokens the call used (the body).
 * Pure functions over what libcurl hands over (the raw header block, "Name: value\r\n"
 * lines, and the body), so they are fuzzed and unit-tested without a server.
 *
 * What is read, first match wins:
 *   1. retry-after-ms (OpenAI): milliseconds;
 *   2. retry-after: delta-seconds (a decimal is accepted) or an HTTP-date (RFC 9110;
 *      curl_getdate parses it), relative to now;
 *   3. the rate-limit resets, as the longest among those whose "remaining" is 0 (all of
 *      them when none says): OpenAI's x-ratelimit-reset-{requests,tokens} (Go durations:
 *      "1s", "6m0s", "120ms", "1h2m3.5s") and Anthropic's
 *      anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset (RFC 3339).
 * A value that does not parse, is negative or not finite is ignored (the next rule is
 * tried); one above PROVIDER_MAX_WAIT_S is cut to it, so a hostile or broken upstream
 * cannot park a budget for days.
 */
#ifndef LEASH_PROVIDER_H
#define LEASH_PROVIDER_H

#include <stddef.h>
#include <time.h>

#define PROVIDER_MAX_WAIT_S 3600.0

/* Seconds to wait from now (>= 0, <= PROVIDER_MAX_WAIT_S), or -1 when the headers say
   nothing usable. head may hold several responses' headers (after "100 Continue"): only
   the last block counts. */
double provider_wait_s(const char *head, size_t len, time_t now);

/* A Go duration ("1h2m3.5s", "120ms", "0s") in seconds, or -1. Exposed for tests. */
double provider_go_duration(const char *s, size_t n);

/* An RFC 3339 timestamp ("2026-12-01T10:00:05Z", fractions and offsets allowed) as seconds
   since the epoch, or -1. Exposed for tests. */
double provider_rfc3339(const char *s, size_t n);

/* What an OpenAI- or Anthropic-shaped JSON answer says the call used. */
struct provider_usage {
  long long input;     /* prompt_tokens / input_tokens (+ Anthropic's cache counts); -1: not said */
  long long output;    /* completion_tokens / output_tokens; -1: not said */
  long long total;     /* total_tokens, else input + output; -1: no usage at all */
  char model[128];     /* the answer's "model", cut to fit; "" when absent */
};

/* Fills u from body: OpenAI chat and responses (usage.prompt_tokens, completion_tokens,
   total_tokens; input_tokens, output_tokens) and Anthropic (usage.input_tokens,
   output_tokens, cache_creation_input_tokens, cache_read_input_tokens). Returns 0, or -1
   (u->total -1) when the body is not a JSON object, reports no usage, or is larger than
   PROVIDER_MAX_USAGE_BODY. Counts that are not integers in [0, 1e12] are not read. */
#define PROVIDER_MAX_USAGE_BODY (8u * 1024 * 1024)
int provider_usage(const char *body, size_t len, struct provider_usage *u);

#endif
