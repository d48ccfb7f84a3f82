/* secrets: the allow list of leash.env and the redaction of its values. See secrets.h. */
#include "secrets.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct secret {
  char *name;
  char *value;        /* NULL: unset */
};

/* A text to replace: a value, or its JSON form when that differs (a value with a quote,
   a backslash or a control byte reaches an error through leash.json.encode that way). */
struct needle {
  const char *text;
  size_t len;
  char *owned;        /* the JSON form's storage, or NULL */
};

static int valid_name(const char *s, size_t n);
static int add_name(const char *name, size_t n, char *err, size_t errlen);
static void add_needle(const char *text, char *owned);
static int by_length_desc(const void *a, const void *b);
static size_t match_at(const char *s, size_t left);

/* Written only by secrets_allow/secrets_reset, before threads start. */
static struct secret allowed[SECRETS_MAX];
static int nallowed;
static struct needle needles[2 * SECRETS_MAX];
static int nneedles;

int secrets_allow(const char *list, char *err, size_t errlen)
{
  const char *p = list;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    if (add_name(p, n, err, errlen) != 0)
      return -1;
    if (!comma)
      break;
    p = comma + 1;
  }
  qsort(needles, (size_t)nneedles, sizeof needles[0], by_length_desc);
  return 0;
}

void secrets_reset(void)
{
  for (int i = 0; i < nallowed; i++) {
    free(allowed[i].name);
    free(allowed[i].value);
  }
  for (int i = 0; i < nneedles; i++)
    free(needles[i].owned);
  nallowed = nneedles = 0;
}

int secrets_lookup(const char *name, const char **value)
{
  for (int i = 0; i < nallowed; i++)
    if (strcmp(allowed[i].name, name) == 0) {
      *value = allowed[i].value;
      return 1;
    }
  *value = NULL;
  return 0;
}

int secrets_list(enum secrets_which which, char *buf, size_t n)
{
  int count = 0;
  size_t used = 0;
  if (n)
    buf[0] = '\0';
  for (int i = 0; i < nallowed; i++) {
    const char *v = allowed[i].value;
    int is = which == SECRETS_UNSET ? v == NULL : v && *v && strlen(v) < SECRETS_MIN_REDACT;
    if (!is)
      continue;
    if (used < n)
      used += (size_t)snprintf(buf + used, n - used, "%s%s", count ? ", " : "", allowed[i].name);
    count++;
  }
  return count;
}

size_t secrets_longest(void)
{
  return nneedles ? needles[0].len : 0;   /* sorted longest first */
}

int secrets_found(const char *s, size_t len)
{
  if (nneedles == 0)
    return 0;
  for (size_t i = 0; i < len; i++)
    if (match_at(s + i, len - i))
      return 1;
  return 0;
}

char *secrets_redact(const char *s)
{
  size_t len = strlen(s), mark = strlen(SECRETS_MARK);
  /* Each match of at least SECRETS_MIN_REDACT bytes becomes the mark: the text grows at
     most by this factor. */
  size_t cap = len + len / SECRETS_MIN_REDACT * (mark > SECRETS_MIN_REDACT ? mark - SECRETS_MIN_REDACT : 0) + 1;
  char *out = malloc(cap);
  if (!out)
    return NULL;
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    size_t m = match_at(s + i, len - i);
    if (m) {
      memcpy(out + o, SECRETS_MARK, mark);
      o += mark;
      i += m;
    } else {
      out[o++] = s[i++];
    }
  }
  out[o] = '\0';
  return out;
}

/* The length of the longest text to replace that starts s (left bytes), or 0. The last
   bytes of s count when they are the start of a value (SECRETS_MIN_PARTIAL of them or more):
   a text its maker cut inside a value (script.c keeps the first 8 KB of an error) would
   otherwise keep that piece. */
static size_t match_at(const char *s, size_t left)
{
  for (int k = 0; k < nneedles; k++) {
    const struct needle *nd = &needles[k];
    if (s[0] != nd->text[0])
      continue;
    if (nd->len <= left && memcmp(s, nd->text, nd->len) == 0)
      return nd->len;
    if (nd->len > left && left >= SECRETS_MIN_PARTIAL && memcmp(s, nd->text, left) == 0)
      return left;
  }
  return 0;
}

static int add_name(const char *name, size_t n, char *err, size_t errlen)
{
  if (!valid_name(name, n)) {
    /* Shown on one line: control bytes (and anything not ASCII) as '?', at most 64 bytes. */
    char shown[65];
    size_t k = n > 64 ? 64 : n;
    for (size_t i = 0; i < k; i++)
      shown[i] = name[i] >= 0x20 && name[i] < 0x7f ? name[i] : '?';
    shown[k] = '\0';
    snprintf(err, errlen, "--env-allow: '%s%s' is not a variable name (letters, digits and _, "
             "not starting with a digit; names separated by commas)", shown, n > 64 ? "..." : "");
    return -1;
  }
  for (int i = 0; i < nallowed; i++)
    if (strlen(allowed[i].name) == n && memcmp(allowed[i].name, name, n) == 0)
      return 0;
  if (nallowed == SECRETS_MAX) {
    snprintf(err, errlen, "--env-allow: at most %d names", SECRETS_MAX);
    return -1;
  }
  struct secret *s = &allowed[nallowed];
  s->name = strndup(name, n);
  if (!s->name) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  const char *v = getenv(s->name);
  s->value = v ? strdup(v) : NULL;
  if (v && !s->value) {
    free(s->name);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  nallowed++;
  if (s->value && strlen(s->value) >= SECRETS_MIN_REDACT) {
    add_needle(s->value, NULL);
    /* The value as jansson writes it inside a JSON string, when that differs. */
    json_t *j = json_string(s->value);
    char *text = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(j);
    size_t tl = text ? strlen(text) : 0;
    if (text && tl >= 2 && (tl - 2 != strlen(s->value) || memcmp(text + 1, s->value, tl - 2) != 0)) {
      memmove(text, text + 1, tl - 2);
      text[tl - 2] = '\0';
      add_needle(text, text);
    } else {
      free(text);
    }
  }
  return 0;
}

static void add_needle(const char *text, char *owned)
{
  needles[nneedles++] = (struct needle){ text, strlen(text), owned };
}

static int valid_name(const char *s, size_t n)
{
  if (n == 0 || n > 256 || (s[0] >= '0' && s[0] <= '9'))
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return 0;
  }
  return 1;
}

static int by_length_desc(const void *a, const void *b)
{
  size_t x = ((const struct needle *)a)->len, y = ((const struct needle *)b)->len;
  return x < y ? 1 : x > y ? -1 : 0;
}
