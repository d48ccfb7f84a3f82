/*
 * secrets: the environment variables the operator lets scripts read (`--env-allow`), and the
 * redaction of their values from what the host writes of its own accord: log lines and a
 * task's error (the row's last_error). Values are read from the environment once, when the
 * list is given, before any thread starts; afterwards everything here is read-only, so any
 * thread may call the lookups without a lock. The sandbox still has no os.getenv: leash.env
 * (api_env.c) is the only door, and it opens only onto this list. Nothing here logs (log.c
 * calls this unit).
 */
#ifndef LEASH_SECRETS_H
#define LEASH_SECRETS_H

#include <stddef.h>

/* Most names one process may allow. */
#define SECRETS_MAX 64
/* Values shorter than this are returned but not redacted: a short value ("1", "eu", "on")
   turns up in unrelated text everywhere, and marking each place would garble every line and
   point at the value. Real keys and tokens are 20 bytes and more. */
#define SECRETS_MIN_REDACT 8
/* A text that ends in the first bytes of a value, this many or more, is taken to have been
   cut inside it, and those bytes are redacted too (a few bytes, like "sk-", say nothing). */
#define SECRETS_MIN_PARTIAL 4
/* What a redacted value is replaced with (the same mark as leash.log's redacted fields). */
#define SECRETS_MARK "[redacted]"

/* Allows the comma-separated names in list (repeatable: lists add up) and reads their
   values now. A name is [A-Za-z_][A-Za-z0-9_]*. Returns 0, or -1 with a message in err. Call
   before any thread starts. */
int secrets_allow(const char *list, char *err, size_t errlen);

/* Forgets every name (tests; before threads start or after they end). */
void secrets_reset(void);

/* 1 if name is allowed, *value then its value or NULL when it was unset; 0 if not allowed. */
int secrets_lookup(const char *name, const char **value);

/* Allowed names that deserve a word at start: unset ones (leash.env returns nil), or set
   ones whose values are too short to be redacted. */
enum secrets_which { SECRETS_UNSET, SECRETS_SHORT };

/* Those names, comma-separated, in buf (cut to n); returns how many. */
int secrets_list(enum secrets_which which, char *buf, size_t n);

/* The length of the longest text that may be replaced (0: none). A caller that cuts a text
   at N bytes redacts its first N + secrets_longest() bytes, so no value straddling the cut
   leaves its start behind. */
size_t secrets_longest(void);

/* 1 if s (len bytes) holds a value to redact. Cheap when nothing is allowed. */
int secrets_found(const char *s, size_t len);

/* A malloc'd copy of s with every value to redact (and its JSON-escaped form) replaced by
   SECRETS_MARK, longest value first, and the start of one at the very end too
   (SECRETS_MIN_PARTIAL); NULL on no memory. */
char *secrets_redact(const char *s);

#endif
