/*
 * provider: see provider.h. Every parser takes (pointer, length) and never reads past it:
 * header values are not NUL-terminated inside libcurl's block.
 */
#define _GNU_SOURCE   /* timegm */
#include "provider.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <strings.h>

/* One header's value, trimmed, inside the block; NULL when absent (the last occurrence). */
static const char *header(const char *head, size_t len, const char *name, size_t *vlen);
static double number(const char *s, size_t n);
static double checked(double v);

double provider_wait_s(const char *head, size_t len, time_t now)
{
  if (!head)
    return -1;
  /* Only the last response's headers (a new status line starts a block). */
  for (size_t i = len; i-- > 0;)
    if ((i == 0 || head[i - 1] == '\n') && len - i >= 5 && memcmp(head + i, "HTTP/", 5) == 0) {
      head += i;
      len -= i;
      break;
    }
  size_t n;
  const char *v;
  double w;
  if ((v = header(head, len, "retry-after-ms", &n)) && (w = checked(number(v, n) / 1000)) >= 0)
    return w;
  if ((v = header(head, len, "retry-after", &n))) {
    if ((w = checked(number(v, n))) >= 0)
      return w;
    char date[64];
    if (n < sizeof date) {
      memcpy(date, v, n);
      date[n] = '\0';
      time_t at = curl_getdate(date, NULL);
      if (at != (time_t)-1 && (w = checked(at > now ? (double)(at - now) : 0)) >= 0)
        return w;
    }
  }
  /* Rate-limit resets: the dimension that ran out is the one to wait for. */
  static const struct { const char *reset, *remaining; int rfc3339; } resets[] = {
    { "x-ratelimit-reset-requests", "x-ratelimit-remaining-requests", 0 },
    { "x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens", 0 },
    { "anthropic-ratelimit-requests-reset", "anthropic-ratelimit-requests-remaining", 1 },
    { "anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-tokens-remaining", 1 },
    { "anthropic-ratelimit-input-tokens-reset", "anthropic-ratelimit-input-tokens-remaining", 1 },
    { "anthropic-ratelimit-output-tokens-reset", "anthropic-ratelimit-output-tokens-remaining", 1 },
  };
  double out_all = -1, out_empty = -1;
  for (size_t i = 0; i < sizeof resets / sizeof resets[0]; i++) {
    if (!(v = header(head, len, resets[i].reset, &n)))
      continue;
    if (resets[i].rfc3339) {
      double at = provider_rfc3339(v, n);
      w = at < 0 ? -1 : checked(at > (double)now ? at - (double)now : 0);
    } else {
      w = checked(provider_go_duration(v, n));
    }
    if (w < 0)
      continue;
    if (w > out_all)
      out_all = w;
    size_t rn;
    const char *r = header(head, len, resets[i].remaining, &rn);
    if (r && number(r, rn) == 0 && w > out_empty)
      out_empty = w;
  }
  return out_empty >= 0 ? out_empty : out_all;
}

double provider_go_duration(const char *s, size_t n)
{
  static const struct { const char *unit; double secs; } units[] = {
    { "ns", 1e-9 }, { "us", 1e-6 }, { "\xc2\xb5s", 1e-6 }, { "ms", 1e-3 },
    { "s", 1 }, { "m", 60 }, { "h", 3600 },
  };
  double total = 0;
  size_t i = 0;
  if (n == 0)
    return -1;
  if (n == 1 && s[0] == '0')
    return 0;
  while (i < n) {
    size_t start = i;
    double v = 0, scale = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9' && i - start < 20)
      v = v * 10 + (s[i++] - '0');
    if (i < n && s[i] == '.') {
      i++;
      scale = 0.1;
      while (i < n && s[i] >= '0' && s[i] <= '9' && scale > 1e-12) {
        v += (s[i++] - '0') * scale;
        scale /= 10;
      }
    }
    if (i == start || (i < n && s[i] >= '0' && s[i] <= '9'))
      return -1;   /* no digits, or too many */
    size_t best = 0;
    double unit = 0;
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
      size_t ul = strlen(units[u].unit);
      if (ul > best && ul <= n - i && memcmp(s + i, units[u].unit, ul) == 0) {
        best = ul;
        unit = units[u].secs;
      }
    }
    if (!best)
      return -1;
    i += best;
    total += v * unit;
  }
  return isfinite(total) ? total : -1;
}

double provider_rfc3339(const char *s, size_t n)
{
  /* YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM) */
  int f[6];
  static const size_t at[6] = { 0, 5, 8, 11, 14, 17 }, w[6] = { 4, 2, 2, 2, 2, 2 };
  if (n < 20 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
      s[13] != ':' || s[16] != ':')
    return -1;
  for (int k = 0; k < 6; k++) {
    f[k] = 0;
    for (size_t j = 0; j < w[k]; j++) {
      char c = s[at[k] + j];
      if (c < '0' || c > '9')
        return -1;
      f[k] = f[k] * 10 + (c - '0');
    }
  }
  if (f[1] < 1 || f[1] > 12 || f[2] < 1 || f[2] > 31 || f[3] > 23 || f[4] > 59 || f[5] > 60)
    return -1;
  size_t i = 19;
  double frac = 0, scale = 0.1;
  if (i < n && s[i] == '.') {
    i++;
    size_t d = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') {
      frac += (s[i++] - '0') * scale;
      scale /= 10;
    }
    if (i == d)
      return -1;
  }
  long offset = 0;
  if (i < n && (s[i] == 'Z' || s[i] == 'z')) {
    i++;
  } else if (i + 6 == n && (s[i] == '+' || s[i] == '-') && s[i + 3] == ':') {
    int oh = 0, om = 0;
    for (int j = 1; j <= 5; j++) {
      if (j == 3)
        continue;
      char c = s[i + j];
      if (c < '0' || c > '9')
        return -1;
      if (j < 3)
        oh = oh * 10 + (c - '0');
      else
        om = om * 10 + (c - '0');
    }
    if (oh > 23 || om > 59)
      return -1;
    offset = (oh * 3600L + om * 60L) * (s[i] == '+' ? 1 : -1);
    i += 6;
  } else {
    return -1;
  }
  if (i != n)
    return -1;
  struct tm tm = { .tm_year = f[0] - 1900, .tm_mon = f[1] - 1, .tm_mday = f[2],
                   .tm_hour = f[3], .tm_min = f[4], .tm_sec = f[5] };
  time_t t = timegm(&tm);
  if (t == (time_t)-1)
    return -1;
  return (double)t - (double)offset + frac;
}

static const char *header(const char *head, size_t len, const char *name, size_t *vlen)
{
  size_t nl = strlen(name);
  const char *found = NULL;
  const char *p = head, *end = head + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *le = eol ? eol : end;
    if ((size_t)(le - p) > nl && p[nl] == ':' && strncasecmp(p, name, nl) == 0) {
      const char *v = p + nl + 1, *ve = le;
      while (v < ve && (*v == ' ' || *v == '\t'))
        v++;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
      found = v;
      *vlen = (size_t)(ve - v);
    }
    p = eol ? eol + 1 : end;
  }
  return found;
}

/* A plain non-negative decimal ("12", "1.5"), or -1. */
static double number(const char *s, size_t n)
{
  char tmp[32];
  if (n == 0 || n >= sizeof tmp)
    return -1;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || s[i] == '.'))
      return -1;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *e;
  double v = strtod(tmp, &e);
  return *e == '\0' && isfinite(v) ? v : -1;
}

static double checked(double v)
{
  if (!(v >= 0) || !isfinite(v))
    return -1;
  return v > PROVIDER_MAX_WAIT_S ? PROVIDER_MAX_WAIT_S : v;
}

/* A usage count: a non-negative integer no larger than a call could plausibly use. */
static long long count_of(json_t *o, const char *key)
{
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v))
    return -1;
  json_int_t n = json_integer_value(v);
  return n >= 0 && n <= 1000000000000LL ? (long long)n : -1;
}

int provider_usage(const char *body, size_t len, struct provider_usage *u)
{
  u->input = u->output = u->total = -1;
  u->model[0] = '\0';
  if (!body || len == 0 || len > PROVIDER_MAX_USAGE_BODY)
    return -1;
  size_t i = 0;
  while (i < len && (body[i] == ' ' || body[i] == '\n' || body[i] == '\r' || body[i] == '\t'))
    i++;
  if (i == len || body[i] != '{')
    return -1;
  json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
  if (!doc)
    return -1;
  json_t *usage = json_object_get(doc, "usage");
  if (json_is_object(usage)) {
    static const char *const inputs[] = { "prompt_tokens", "input_tokens",
                                          "cache_creation_input_tokens",
                                          "cache_read_input_tokens" };
    static const char *const outputs[] = { "completion_tokens", "output_tokens" };
    for (size_t k = 0; k < sizeof inputs / sizeof inputs[0]; k++) {
      long long p = count_of(usage, inputs[k]);
      if (p >= 0)
        u->input = (u->input < 0 ? 0 : u->input) + p;
    }
    for (size_t k = 0; k < sizeof outputs / sizeof outputs[0]; k++) {
      long long p = count_of(usage, outputs[k]);
      if (p >= 0)
        u->output = (u->output < 0 ? 0 : u->output) + p;
    }
    long long t = count_of(usage, "total_tokens");
    if (t >= 0)
      u->total = t;
    else if (u->input >= 0 || u->output >= 0)
      u->total = (u->input < 0 ? 0 : u->input) + (u->output < 0 ? 0 : u->output);
  }
  const char *m = json_string_value(json_object_get(doc, "model"));
  if (m)
    snprintf(u->model, sizeof u->model, "%s", m);
  json_decref(doc);
  return u->total >= 0 ? 0 : -1;
}
