/* buf: growable text and array literals. See buf.h. */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int buf_add(struct buf *b, const char *s, size_t n)
{
  if (b->oom)
    return -1;
  if (n > SIZE_MAX / 2 - b->len - 1) {   /* no size could hold it: never wrap around */
    b->oom = 1;
    return -1;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) {
      b->oom = 1;
      return -1;
    }
    b->s = ns;
    b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
  return 0;
}

int buf_puts(struct buf *b, const char *s)
{
  return buf_add(b, s, strlen(s));
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
  char small[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->oom = 1;
    return -1;
  }
  if ((size_t)n < sizeof small)
    return buf_add(b, small, (size_t)n);
  char *big = malloc((size_t)n + 1);
  if (!big) {
    b->oom = 1;
    return -1;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  int rc = buf_add(b, big, (size_t)n);
  free(big);
  return rc;
}

int buf_add_array_elem(struct buf *b, const char *s)
{
  buf_add(b, "\"", 1);
  const char *start = s;
  for (const char *p = s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      buf_add(b, start, (size_t)(p - start));
      buf_add(b, "\\", 1);
      start = p;
    }
  }
  buf_add(b, start, strlen(start));
  return buf_add(b, "\"", 1);
}

char *buf_take(struct buf *b)
{
  char *s = b->s;
  if (b->oom) {
    free(s);
    s = NULL;
  } else if (!s) {
    s = strdup("");
  }
  *b = (struct buf){ 0 };
  return s;
}

void buf_free(struct buf *b)
{
  free(b->s);
  *b = (struct buf){ 0 };
}

char *text_array_literal(const char *const *values, size_t n)
{
  struct buf b = { 0 };
  buf_add(&b, "{", 1);
  for (size_t i = 0; i < n; i++) {
    if (i)
      buf_add(&b, ",", 1);
    buf_add_array_elem(&b, values[i]);
  }
  buf_add(&b, "}", 1);
  return buf_take(&b);
}
