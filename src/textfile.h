/*
 * textfile: a whole file read into memory (the script and the modules require loads).
 */
#ifndef LEASH_TEXTFILE_H
#define LEASH_TEXTFILE_H

#include <stddef.h>

/* Reads path whole: malloc'd and NUL-terminated (len excludes the NUL; the text may hold
   NULs of its own), or NULL with "cannot open <path>: <why>" / "cannot read <path>" in err. */
char *textfile_read(const char *path, size_t *len, char *err, size_t errlen);

#endif
