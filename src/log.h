/*
 * log: one line per event on stderr, as text or as JSON (--log-format), filtered by level.
 * Thread-safe: each line is formatted in full and written with one call. Fields are
 * key/value strings; a task line carries task_id, tenant, attempt and worker so a reader
 * can follow one task across processes. Nothing here knows about connections: callers never
 * pass a conninfo. The values leash.env hands out are redacted from every message and field
 * before a line is written (secrets.h).
 */
#ifndef LEASH_LOG_H
#define LEASH_LOG_H

#include <stdarg.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };
enum log_format { LOG_TEXT, LOG_JSON };

struct log_field {
  const char *key;
  const char *value;   /* NULL: the field is left out */
};

/* Parsers for the command-line values; return 0, or -1 for an unknown name. */
int log_parse_level(const char *s, enum log_level *out);
int log_parse_format(const char *s, enum log_format *out);

/* Process-wide settings; call before any thread starts. */
void log_set_format(enum log_format fmt);
void log_set_level(enum log_level min);
int log_enabled(enum log_level lvl);

/* fields: an array ended by a {NULL, NULL} entry, or NULL. */
void log_fields(enum log_level lvl, const struct log_field *fields, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
void log_vfields(enum log_level lvl, const struct log_field *fields, const char *fmt,
                 va_list ap);

#define log_debug(...) log_fields(LOG_DEBUG, NULL, __VA_ARGS__)
#define log_info(...) log_fields(LOG_INFO, NULL, __VA_ARGS__)
#define log_warn(...) log_fields(LOG_WARN, NULL, __VA_ARGS__)
#define log_error(...) log_fields(LOG_ERROR, NULL, __VA_ARGS__)

#endif
