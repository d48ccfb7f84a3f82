/* textbuf: a growable run of bytes. See textbuf.h. */
#include "textbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int textbuf_add(struct textbuf *b, const void *data, size_t n)
{
  if (n > SIZE_MAX - 1 - b->len)
    return -1;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
      cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
    char *s = realloc(b->s, cap);
    if (!s)
      return -1;
    b->s = s;
    b->cap = cap;
  }
  memcpy(b->s + b->len, data, n);
  b->len += n;
  b->s[b->len] = '\0';
  return 0;
}

void textbuf_free(struct textbuf *b)
{
  free(b->s);
  *b = (struct textbuf){ NULL, 0, 0 };
}
