/*
 * fuzz_provider: a provider's answer through src/provider.c, the parsers that read what an
 * upstream (possibly hostile) sends: the header block of a 429 (provider_wait_s, and the Go
 * duration and RFC 3339 readers on the same bytes) and a body (provider_usage). The input is
 * used both ways, with no NUL added: the parsers take (pointer, length) and must never read
 * past it (ASan checks). Every answer must be within what provider.h promises: a wait is -1
 * or in [0, PROVIDER_MAX_WAIT_S]; a duration or a time is -1 or finite and >= 0; usage is -1
 * or >= 0, and its model name NUL-terminated within its buffer.
 */
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "provider.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  /* A copy of exactly size bytes, so a read one past the end is caught. */
  char *s = malloc(size ? size : 1);
  FUZZ_CHECK(s != NULL);
  memcpy(s, data, size);
  time_t now = 1796126400 + (time_t)(fuzz_hash(data, size) % 100000);

  double w = provider_wait_s(s, size, now);
  FUZZ_CHECK(w == -1 || (w >= 0 && w <= PROVIDER_MAX_WAIT_S));
  double d = provider_go_duration(s, size);
  FUZZ_CHECK(d == -1 || (isfinite(d) && d >= 0));
  double t = provider_rfc3339(s, size);
  FUZZ_CHECK(t == -1 || isfinite(t));
  struct provider_usage u;
  memset(&u, 'x', sizeof u);
  int got = provider_usage(s, size, &u);
  FUZZ_CHECK(got == 0 ? u.total >= 0 : u.total == -1);
  FUZZ_CHECK(u.input >= -1 && u.output >= -1);
  FUZZ_CHECK(memchr(u.model, '\0', sizeof u.model) != NULL);
  free(s);
  return 0;
}
