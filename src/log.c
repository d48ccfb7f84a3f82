/* log: formatting and writing of log lines. See log.h. */
#include "log.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void format_time(char *buf, size_t n);
static void write_line(const char *line, size_t len);
static void set_string(json_t *o, const char *key, const char *value);

static const char *const level_names[] = { "debug", "info", "warn", "error" };

/* Set once before threads start, read-only afterwards. */
static enum log_format log_fmt = LOG_TEXT;
static enum log_level log_min = LOG_INFO;

int log_parse_level(const char *s, enum log_level *out)
{
  for (int i = LOG_DEBUG; i <= LOG_ERROR; i++)
    if (strcmp(s, level_names[i]) == 0) {
      *out = (enum log_level)i;
      return 0;
    }
  if (strcmp(s, "warning") == 0) {
    *out = LOG_WARN;
    return 0;
  }
  return -1;
}

int log_parse_format(const char *s, enum log_format *out)
{
  if (strcmp(s, "text") == 0)
    *out = LOG_TEXT;
  else if (strcmp(s, "json") == 0)
    *out = LOG_JSON;
  else
    return -1;
  return 0;
}

void log_set_format(enum log_format fmt)
{
  log_fmt = fmt;
}

void log_set_level(enum log_level min)
{
  log_min = min;
}

int log_enabled(enum log_level lvl)
{
  return lvl >= log_min;
}

void log_fields(enum log_level lvl, const struct log_field *fields, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  log_vfields(lvl, fields, fmt, ap);
  va_end(ap);
}

void log_vfields(enum log_level lvl, const struct log_field *fields, const char *fmt,
                 va_list ap)
{
  if (!log_enabled(lvl))
    return;
  char msg[4096], ts[40];
  vsnprintf(msg, sizeof msg, fmt, ap);
  format_time(ts, sizeof ts);

  if (log_fmt == LOG_JSON) {
    /* Stable field names: ts, level, msg, then the caller's fields. */
    json_t *o = json_object();
    json_object_set_new(o, "ts", json_string(ts));
    json_object_set_new(o, "level", json_string(level_names[lvl]));
    set_string(o, "msg", msg);
    for (const struct log_field *f = fields; f && f->key; f++)
      if (f->value)
        set_string(o, f->key, f->value);
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (line) {
      size_t len = strlen(line);
      char *withnl = realloc(line, len + 2);
      if (withnl) {
        withnl[len] = '\n';
        write_line(withnl, len + 1);
        line = withnl;
      }
      free(line);
    }
    return;
  }

  /* One event, one line: a traceback's newlines are written as \n. */
  char flat[sizeof msg * 2];
  size_t k = 0;
  for (const char *p = msg; *p && k + 2 < sizeof flat; p++) {
    if (*p == '\n') {
      flat[k++] = '\\';
      flat[k++] = 'n';
    } else if (*p != '\r') {
      flat[k++] = *p == '\t' ? ' ' : *p;
    }
  }
  flat[k] = '\0';
  char line[12288];
  int n = snprintf(line, sizeof line, "%s %-5s %s", ts, level_names[lvl], flat);
  for (const struct log_field *f = fields; f && f->key && n < (int)sizeof line; f++)
    if (f->value)
      n += snprintf(line + n, sizeof line - (size_t)n, " %s=%s", f->key, f->value);
  if (n >= (int)sizeof line - 1)
    n = (int)sizeof line - 2;
  line[n++] = '\n';
  write_line(line, (size_t)n);
}

static void format_time(char *buf, size_t n)
{
  struct timespec now;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &now);
  gmtime_r(&now.tv_sec, &tm);
  size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + k, n - k, ".%03ldZ", now.tv_nsec / 1000000);
}

/* One write(2) per line, so lines from several threads never interleave. */
static void write_line(const char *line, size_t len)
{
  while (len > 0) {
    ssize_t w = write(STDERR_FILENO, line, len);
    if (w <= 0)
      return;
    line += w;
    len -= (size_t)w;
  }
}

/* Text that is not UTF-8 (a script's message, say) is logged lossily rather than dropped. */
static void set_string(json_t *o, const char *key, const char *value)
{
  json_t *v = json_string(value);
  json_object_set_new(o, key, v ? v : json_string("(not valid UTF-8)"));
}
