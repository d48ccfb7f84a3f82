/* log: formatting and writing of log lines. See log.h. */
#include "log.h"

#include "secrets.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void format_time(char *buf, size_t n);
static void write_line(const char *line, size_t len);
static void set_string(json_t *o, const char *key, const char *value);
static size_t cut_at(const char *s, size_t max);
static void put_escaped(char *line, size_t cap, size_t *n, const char *s, size_t max);
static void write_event(enum log_level lvl, const struct log_field *fields, const char *msg);
static void write_redacted(enum log_level lvl, const struct log_field *fields, char *msg,
                           size_t cap, int full, const char *fmt, va_list again);
static const char *redacted(const char *s, size_t max, char **owned);

/* Longest message or field value written; longer ones are cut and marked "...". */
#define LOG_VALUE_MAX 8192
#define LOG_MSG_MAX 4096
/* Most fields of one line that are redacted; a line never has nearly as many. */
#define LOG_FIELDS_MAX 64

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
  char msg[LOG_MSG_MAX];
  if (secrets_longest() == 0) {
    vsnprintf(msg, sizeof msg, fmt, ap);
    write_event(lvl, fields, msg);
    return;
  }
  va_list again;
  va_copy(again, ap);
  int full = vsnprintf(msg, sizeof msg, fmt, ap);
  write_redacted(lvl, fields, msg, sizeof msg, full, fmt, again);
  va_end(again);
}

/* Values leash.env hands out never reach a line (secrets.h): the message and each field are
   redacted before they are cut. A message longer than msg is formatted again (again: a copy
   of the arguments), far enough past the cut that no value straddling it escapes. */
static void write_redacted(enum log_level lvl, const struct log_field *fields, char *msg,
                           size_t cap, int full, const char *fmt, va_list again)
{
  char *owned[2 * LOG_FIELDS_MAX + 1] = { NULL };
  struct log_field clean[LOG_FIELDS_MAX + 1];
  char *longer = NULL;
  if (full >= (int)cap) {
    size_t n = cap + secrets_longest();
    if ((longer = malloc(n)))
      vsnprintf(longer, n, fmt, again);
  }
  const char *text = redacted(longer ? longer : msg, cap, &owned[0]);
  if (longer && text == longer)
    text = msg;   /* nothing found: the cut copy will do */
  else if (owned[0] && strlen(owned[0]) >= cap)
    owned[0][cap - 1] = '\0';   /* cut like any message */
  int k = 0;
  for (const struct log_field *f = fields; f && f->key && k < LOG_FIELDS_MAX; f++, k++) {
    /* A script names its fields too: a key is redacted like a value. */
    clean[k].key = redacted(f->key, 256, &owned[2 * k + 1]);
    clean[k].value = f->value ? redacted(f->value, LOG_VALUE_MAX, &owned[2 * k + 2]) : NULL;
  }
  clean[k] = (struct log_field){ NULL, NULL };
  write_event(lvl, clean, text);
  free(longer);
  for (int i = 0; i <= 2 * k; i++)
    free(owned[i]);
}

/* s itself when its first max + secrets_longest() bytes hold no value to redact; else a
   redacted copy of them (*owned, the caller frees it), or a fixed text on no memory. */
static const char *redacted(const char *s, size_t max, char **owned)
{
  size_t len = strnlen(s, max + secrets_longest());
  *owned = NULL;
  if (!secrets_found(s, len))
    return s;
  char *window = strndup(s, len);
  *owned = window ? secrets_redact(window) : NULL;
  free(window);
  return *owned ? *owned : "(withheld: out of memory while redacting)";
}

/* One line for msg and fields, as they are. */
static void write_event(enum log_level lvl, const struct log_field *fields, const char *msg)
{
  char ts[40];
  format_time(ts, sizeof ts);

  if (log_fmt == LOG_JSON) {
    /* Stable field names: ts, level, msg, then the caller's fields. jansson escapes every
       control character, so a line is one line here already. */
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

  /* One event, one line: the message, keys and values with control characters escaped
     (a traceback's newlines read \n). */
  char line[16384];
  size_t n = (size_t)snprintf(line, sizeof line, "%s %-5s ", ts, level_names[lvl]);
  put_escaped(line, sizeof line, &n, msg, LOG_MSG_MAX);
  for (const struct log_field *f = fields; f && f->key && n + 2 < sizeof line - 1; f++) {
    if (!f->value)
      continue;
    line[n++] = ' ';
    put_escaped(line, sizeof line, &n, f->key, 256);
    if (n + 1 >= sizeof line - 1)
      break;
    line[n++] = '=';
    put_escaped(line, sizeof line, &n, f->value, LOG_VALUE_MAX);
  }
  line[n++] = '\n';
  write_line(line, n);
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

/* Text that is not UTF-8 (a script's message, say) is logged lossily rather than dropped.
   A value longer than LOG_VALUE_MAX is cut (at a character boundary), so a line's size in
   memory is bounded whatever a script logs. */
static void set_string(json_t *o, const char *key, const char *value)
{
  size_t len = cut_at(value, LOG_VALUE_MAX);
  json_t *v = json_stringn(value, len);
  json_object_set_new(o, key, v ? v : json_string("(not valid UTF-8)"));
}

/* The length of s, or max when s is longer, moved back to a UTF-8 character boundary. */
static size_t cut_at(const char *s, size_t max)
{
  size_t len = strnlen(s, max + 1);
  if (len <= max)
    return len;
  len = max;
  while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
    len--;
  return len;
}

/* Appends s (at most max bytes of it) to line with every control character escaped: \n,
   \r, \t, and \xHH for the other C0 bytes and DEL. A newline in a tenant id, a log field
   or an error message cannot start a line of its own, nor can an ANSI sequence reach a
   terminal. Stops at the line's end (cap - 1 keeps room for the newline). */
static void put_escaped(char *line, size_t cap, size_t *n, const char *s, size_t max)
{
  static const char hex[] = "0123456789abcdef";
  size_t k = *n, len = cut_at(s, max);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[4];
    size_t e = 0;
    if (c == '\n' || c == '\r' || c == '\t') {
      esc[e++] = '\\';
      esc[e++] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
    } else if (c < 0x20 || c == 0x7F) {
      esc[e++] = '\\';
      esc[e++] = 'x';
      esc[e++] = hex[c >> 4];
      esc[e++] = hex[c & 0xF];
    } else {
      esc[e++] = (char)c;
    }
    if (k + e >= cap - 1)
      break;
    memcpy(line + k, esc, e);
    k += e;
  }
  if (s[len] != '\0' && k + 3 < cap - 1) {   /* cut */
    memcpy(line + k, "...", 3);
    k += 3;
  }
  *n = k;
}
