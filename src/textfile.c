/* textfile: reading a whole file. See textfile.h. */
#include "textfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *textfile_read(const char *path, size_t *len, char *err, size_t errlen)
{
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  /* open_memstream grows the buffer: no hand-rolled doubling to get wrong. */
  char *buf = NULL, chunk[8192];
  size_t n = 0, got;
  FILE *out = open_memstream(&buf, &n);
  int bad = out == NULL, oom = bad;
  while (!bad && (got = fread(chunk, 1, sizeof chunk, f)) > 0)
    oom = bad = fwrite(chunk, 1, got, out) != got;
  bad |= ferror(f);
  fclose(f);
  if (out && fclose(out) != 0)
    oom = bad = 1;
  if (bad) {
    free(buf);
    snprintf(err, errlen, oom ? "out of memory reading %s" : "cannot read %s", path);
    return NULL;
  }
  *len = n;
  return buf;
}
