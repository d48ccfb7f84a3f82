/*
 * textbuf: a growable run of bytes, kept NUL-terminated, for text built piece by piece in
 * C callbacks (an HTTP response, a JSON dump) where nothing may raise into Lua. Where a
 * FILE * fits, open_memstream is the other choice (textfile.c uses it).
 */
#ifndef LEASH_TEXTBUF_H
#define LEASH_TEXTBUF_H

#include <stddef.h>

struct textbuf {
  char *s;          /* NULL until the first byte; then malloc'd, s[len] == '\0' */
  size_t len, cap;
};

/* Appends n bytes; 0, or -1 when out of memory (the buffer is unchanged then). */
int textbuf_add(struct textbuf *b, const void *data, size_t n);

/* Frees the bytes; b is empty again. */
void textbuf_free(struct textbuf *b);

#endif
