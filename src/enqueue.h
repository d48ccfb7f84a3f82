/*
 * enqueue: checking one task description (a JSONL line) before anything is written, and
 * writing lines as rows of COPY's text format. Pure: no database, so it can be fuzzed.
 * A line is a JSON object with "payload" (required, not null) and optional "tenant_id",
 * "shard_key", "batch" (strings; batch may be null), "run_after" (a timestamp string, parsed
 * by PostgreSQL), "delay" (seconds >= 0; not together with run_after), "max_attempts"
 * (integer 1..1000), "max_crashes" (integer 1..1000: crashes before quarantine) and
 * "priority" (integer -1000..1000, higher first within a tenant's share; the column's CHECK),
 * "dedup_key" (a string: while a task of the tenant with this key is pending or leased,
 * the line is skipped; sql/015_sql_api.sql), "budget" (sql/013), "max_snoozes" (integer
 * 0..10000), "backoff_base" (number 1..1000) and "backoff_cap" (seconds 0..86400; both NULL
 * when left out: the worker's --backoff-base/--backoff-cap).
 * tenant_id, shard_key, batch and dedup_key are 1 to 512 bytes each (lifecycle.h); run_after may
 * not be infinite. Unknown fields and duplicate keys are errors: a typo must not silently
 * enqueue a task with defaults.
 */
#ifndef LEASH_ENQUEUE_H
#define LEASH_ENQUEUE_H

#include "buf.h"

#include <stddef.h>

/* The bounds of "priority" and --priority: the column's CHECK (sql/011_scheduler.sql). */
#define ENQUEUE_PRIORITY_MIN (-1000)
#define ENQUEUE_PRIORITY_MAX 1000

enum enqueue_verdict {
  ENQUEUE_LINE_OK,
  ENQUEUE_LINE_BLANK,   /* whitespace only: skipped */
  ENQUEUE_LINE_BAD,     /* err says why */
};

/* Checks one line (not NUL-terminated; len bytes). On OK, *run_after is the line's
   run_after string (malloc'd) or NULL. */
enum enqueue_verdict enqueue_check_line(const char *line, size_t len, char **run_after,
                                        char *err, size_t errlen);

/* The same bounds for a value given another way (a command-line default): tenant_id,
   shard_key, batch or dedup_key (field names the field in err) of len bytes; 0, or -1 with err. */
int enqueue_check_key(const char *field, const char *value, size_t len, char *err,
                      size_t errlen);

/* A run_after text: refuses 'infinity' and '-infinity' (PostgreSQL takes them, and a row
   runnable at infinity is never claimed and never dies); 0, or -1 with err. */
int enqueue_check_run_after(const char *field, const char *value, char *err, size_t errlen);

/* A --backoff-base value: a plain decimal number within lifecycle.h's bounds; 0, or -1. */
int enqueue_check_backoff_base(const char *value);

/* Appends "line_no \t doc \t run_after \n" (COPY text format, \N for NULL) to b;
   returns 0, or -1 when out of memory (then and after, b->oom is set). */
int enqueue_copy_row(struct buf *b, long line_no, const char *doc, size_t doclen,
                     const char *run_after);

#endif
