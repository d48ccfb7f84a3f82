/*
 * buf: the one growable byte buffer, and the text[] literal builder on top of it. A buffer
 * remembers that an append ran out of memory (oom) and ignores later appends, so a builder
 * appends freely and checks once at the end. The text is always NUL-terminated (s is NULL
 * until the first append).
 */
#ifndef LEASH_BUF_H
#define LEASH_BUF_H

#include <stddef.h>

struct buf {
  char *s;
  size_t len, cap;
  int oom;
};

/* Appends n bytes of s. 0, or -1 (and oom set) when out of memory. */
int buf_add(struct buf *b, const char *s, size_t n);
int buf_puts(struct buf *b, const char *s);
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One element of an array literal: double-quoted, with " and \ escaped (any text). */
int buf_add_array_elem(struct buf *b, const char *s);

/* The text (the caller frees it), or NULL (and the buffer freed) when an append failed.
   An empty buffer gives "". The buffer is reset. */
char *buf_take(struct buf *b);
void buf_free(struct buf *b);

/* A text[] literal ({"a","b"}) of n strings, escaped; malloc'd, NULL when out of memory. */
char *text_array_literal(const char *const *values, size_t n);

#endif
