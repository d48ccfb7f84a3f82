/* record: an execution's recording, redacted as it is made. See record.h. */
#include "record.h"

#include "db.h"
#include "json_lua.h"
#include "lifecycle.h"
#include "log.h"
#include "queue.h"
#include "secrets.h"
#include "task.h"

#include <jansson.h>
#include <lauxlib.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define RECORD_MAX_SEEN 32

struct record {
  json_t *events;     /* in the order they happened; each has "type" */
  char *version;
  size_t bytes;       /* the payload's text and the compact JSON of the events so far */
  int truncated;
  /* Values of credential headers seen so far: secrets for the rest of the recording too (a
     server that echoes the request would otherwise hand them back in its body). */
  char *seen[RECORD_MAX_SEEN];
  int nseen;
};

/* Set before threads start, read-only afterwards (record.h). */
static struct {
  enum record_policy policy;
  size_t max;
  const char *script;
  regex_t re[RECORD_MAX_PATTERNS];
  int nre;
  char env[2048];     /* --env-allow names, comma-separated */
} cfg = { .policy = RECORD_DEAD, .max = RECORD_DEFAULT_MAX };

/* Request and response headers whose values are credentials, whatever the script sends. */
static const char *const secret_headers[] = {
  "authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie",
};

static json_t *jstr(struct record *r, const char *s, size_t len);
static char *redact_r(struct record *r, const char *s, size_t len);
static json_t *redact_tree(struct record *r, json_t *v);
static json_t *lua_json(struct record *r, lua_State *L, int idx);
static json_t *headers_of(struct record *r, lua_State *L, int idx);
static void note_secret(struct record *r, const char *v, size_t n);
static json_t *url_json(struct record *r, const char *url);
static void add_event(struct record *r, json_t *ev);
static char *replace_matches(char *s, const regex_t *re);

int record_parse_policy(const char *s, enum record_policy *p)
{
  if (strcmp(s, "none") == 0)
    *p = RECORD_NONE;
  else if (strcmp(s, "dead") == 0)
    *p = RECORD_DEAD;
  else if (strcmp(s, "all") == 0)
    *p = RECORD_ALL;
  else
    return -1;
  return 0;
}

int record_add_pattern(const char *regex, char *err, size_t errlen)
{
  if (cfg.nre == RECORD_MAX_PATTERNS) {
    snprintf(err, errlen, "at most %d --record-redact patterns", RECORD_MAX_PATTERNS);
    return -1;
  }
  int rc = regcomp(&cfg.re[cfg.nre], regex, REG_EXTENDED);
  if (rc != 0) {
    char why[200];
    regerror(rc, &cfg.re[cfg.nre], why, sizeof why);
    /* The pattern is not echoed: it may itself spell the secret it is meant to hide. */
    snprintf(err, errlen, "--record-redact: not a POSIX extended regular expression: %s", why);
    return -1;
  }
  /* A pattern that matches the empty string would mark every gap of every text. */
  regmatch_t m;
  if (regexec(&cfg.re[cfg.nre], "", 1, &m, 0) == 0) {
    regfree(&cfg.re[cfg.nre]);
    snprintf(err, errlen, "--record-redact: the pattern matches an empty text; give one that "
             "matches at least a character");
    return -1;
  }
  cfg.nre++;
  return 0;
}

void record_note_env(const char *list)
{
  size_t n = strlen(cfg.env);
  snprintf(cfg.env + n, sizeof cfg.env - n, "%s%s", n ? "," : "", list);
}

void record_configure(enum record_policy p, size_t max_bytes, const char *script_path)
{
  cfg.policy = p;
  cfg.max = max_bytes;
  /* Absolute: the fixture's spec loads the script from wherever it is run. */
  static char abs[4096];
  cfg.script = script_path && realpath(script_path, abs) ? abs : script_path;
}

void record_reset(void)
{
  for (int i = 0; i < cfg.nre; i++)
    regfree(&cfg.re[i]);
  cfg.nre = 0;
  cfg.env[0] = '\0';
  cfg.policy = RECORD_DEAD;
  cfg.max = RECORD_DEFAULT_MAX;
  cfg.script = NULL;
}

enum record_policy record_policy(void)
{
  return cfg.policy;
}

char *record_redact(const char *s, size_t len)
{
  char *copy = malloc(len + 1);
  if (!copy)
    return NULL;
  memcpy(copy, s, len);
  copy[len] = '\0';
  char *out = secrets_redact(copy);
  free(copy);
  for (int i = 0; out && i < cfg.nre; i++)
    out = replace_matches(out, &cfg.re[i]);
  return out;
}

/* Frees s; returns it with every match of re replaced by the mark (NULL on no memory). */
static char *replace_matches(char *s, const regex_t *re)
{
  size_t cap = strlen(s) + 64, len = 0;
  char *out = malloc(cap);
  const char *p = s;
  regmatch_t m;
  int flags = 0;
  while (out && *p && regexec(re, p, 1, &m, flags) == 0) {
    size_t so = (size_t)m.rm_so, eo = (size_t)m.rm_eo;
    if (eo == so)
      eo = so + 1;   /* an empty match (a|) moves on by one byte, keeping it */
    size_t need = len + so + sizeof SECRETS_MARK + 1;
    if (need > cap) {
      char *grown = realloc(out, cap = need * 2);
      if (!grown) {
        free(out);
        out = NULL;
        break;
      }
      out = grown;
    }
    memcpy(out + len, p, so);
    len += so;
    if (m.rm_eo == m.rm_so) {
      out[len++] = p[so];
    } else {
      memcpy(out + len, SECRETS_MARK, sizeof SECRETS_MARK - 1);
      len += sizeof SECRETS_MARK - 1;
    }
    p += eo;
    flags = REG_NOTBOL;
  }
  if (out) {
    size_t rest = strlen(p);
    if (len + rest + 1 > cap) {
      char *grown = realloc(out, len + rest + 1);
      if (!grown)
        free(out);
      out = grown;
    }
    if (out) {
      memcpy(out + len, p, rest + 1);
    }
  }
  free(s);
  return out;
}

void record_begin(struct task *t, const char *version)
{
  record_free(t->rec);
  t->rec = NULL;
  if (cfg.policy == RECORD_NONE)
    return;
  struct record *r = calloc(1, sizeof *r);
  if (!r)
    return;
  r->version = strdup(version ? version : "");
  r->events = json_array();
  if (!r->version || !r->events) {
    record_free(r);
    return;
  }
  /* The payload is parsed and redacted only when the recording is stored (most are not);
     its text's size counts against the cap from the start. */
  r->bytes = t->payload ? strlen(t->payload) : 0;
  if (r->bytes > cfg.max)
    r->truncated = 1;
  t->rec = r;
}

/* The task's part of a stored recording; the payload replaced by a note when it alone
   filled the cap. */
static json_t *task_json(struct record *r, const struct task *t)
{
  json_t *payload = NULL;
  if (t->payload && strlen(t->payload) > cfg.max) {
    payload = json_string("[over --record-max]");
  } else if (t->payload) {
    json_t *raw = json_loads(t->payload, JSON_DECODE_ANY, NULL);
    payload = raw ? redact_tree(r, raw) : jstr(r, t->payload, strlen(t->payload));
    json_decref(raw);
  }
  return json_pack("{sI si si so so so? so}", "id", (json_int_t)t->id, "attempt", t->attempt,
                   "max_attempts", t->max_attempts,
                   "tenant_id", jstr(r, t->tenant_id ? t->tenant_id : "",
                                     t->tenant_id ? strlen(t->tenant_id) : 0),
                   "shard_key", jstr(r, t->shard_key ? t->shard_key : "",
                                     t->shard_key ? strlen(t->shard_key) : 0),
                   "batch", t->batch ? jstr(r, t->batch, strlen(t->batch)) : NULL,
                   "payload", payload ? payload : json_null());
}

void record_free(struct record *r)
{
  if (!r)
    return;
  json_decref(r->events);
  free(r->version);
  for (int i = 0; i < r->nseen; i++)
    free(r->seen[i]);
  free(r);
}

void record_http(struct task *t, lua_State *L, const char *method, const char *url, int hidx,
                 const char *body, size_t body_len, int ridx, const char *error)
{
  struct record *r = t ? t->rec : NULL;
  if (!r || r->truncated)
    return;
  /* The headers first: their credentials are then redacted from the URL and body too. */
  json_t *headers = hidx ? headers_of(r, L, hidx) : json_object();
  json_t *ev = json_pack("{ss ss so so so}", "type", "http", "method", method,
                         "url", url_json(r, url), "headers", headers,
                         "body", body ? jstr(r, body, body_len) : json_null());
  if (!ev)
    return;
  if (ridx) {
    ridx = lua_absindex(L, ridx);
    lua_getfield(L, ridx, "status");
    json_int_t status = (json_int_t)lua_tointeger(L, -1);
    lua_getfield(L, ridx, "body");
    size_t n = 0;
    const char *b = lua_tolstring(L, -1, &n);
    lua_getfield(L, ridx, "headers");
    json_t *rh = headers_of(r, L, -1);   /* a Set-Cookie is then redacted from the body */
    json_object_set_new(ev, "response", json_pack("{sI so so}", "status", status, "headers", rh,
                                                  "body", jstr(r, b ? b : "", n)));
    lua_pop(L, 3);
  } else {
    json_object_set_new(ev, "error", jstr(r, error, strlen(error)));
  }
  add_event(r, ev);
}

void record_db(struct task *t, lua_State *L, const char *sql, int nparams,
               const char *const *params, int ridx, long long affected, const char *error)
{
  struct record *r = t ? t->rec : NULL;
  if (!r || r->truncated)
    return;
  json_t *ps = json_array();
  for (int i = 0; i < nparams; i++)
    json_array_append_new(ps, params[i] ? jstr(r, params[i], strlen(params[i])) : json_null());
  json_t *ev = json_pack("{ss so so}", "type", "db", "sql", jstr(r, sql, strlen(sql)), "params", ps);
  if (!ev)
    return;
  if (ridx) {
    json_object_set_new(ev, "rows", lua_json(r, L, ridx));
    json_object_set_new(ev, "affected", json_integer((json_int_t)affected));
  } else {
    json_object_set_new(ev, "error", jstr(r, error, strlen(error)));
  }
  add_event(r, ev);
}

void record_step(struct task *t, lua_State *L, const char *name, int cached, int vidx)
{
  struct record *r = t ? t->rec : NULL;
  if (!r || r->truncated)
    return;
  add_event(r, json_pack("{ss so sb so}", "type", "step", "name", jstr(r, name, strlen(name)),
                         "cached", cached, "result", lua_json(r, L, vidx)));
}

void record_enqueue(struct task *t, long long id, const char *payload_json)
{
  struct record *r = t ? t->rec : NULL;
  if (!r || r->truncated)
    return;
  json_t *raw = json_loads(payload_json, JSON_DECODE_ANY, NULL);
  json_t *payload = raw ? redact_tree(r, raw) : jstr(r, payload_json, strlen(payload_json));
  json_decref(raw);
  add_event(r, json_pack("{ss sI so}", "type", "enqueue", "id", (json_int_t)id,
                         "payload", payload));
}

void record_store(PGconn *c, const struct db_table *tbl, struct task *t, int applied)
{
  struct record *r = t->rec;
  if (!r)
    return;
  int dead = applied == SETTLED_DEAD || applied == SETTLED_QUARANTINED ||
             applied == SETTLED_BAD_ROW;
  int settled = dead || applied == SETTLED_DONE || applied == SETTLED_PENDING;
  if (!(cfg.policy == RECORD_ALL ? settled : cfg.policy == RECORD_DEAD && dead))
    return;
  const struct outcome *o = &t->out;
  /* As finish_task counts it: a snooze that died was one past max_snoozes. */
  enum outcome_cause cause = dead && o->kind == OUTCOME_SNOOZE ? CAUSE_SNOOZE_LIMIT : o->cause;
  json_t *result = NULL;
  if (o->result) {
    json_t *raw = json_loads(o->result, JSON_DECODE_ANY, NULL);
    result = raw ? redact_tree(r, raw) : jstr(r, o->result, strlen(o->result));
    json_decref(raw);
  }
  json_t *outcome = json_pack(
    "{ss ss ss so so sb}", "status", dead ? "dead" : applied == SETTLED_DONE ? "done" : "retry",
    "kind", lifecycle_kind_sql(o->kind), "cause", lifecycle_cause_name(cause),
    "error", o->error ? jstr(r, o->error, strlen(o->error)) : json_null(),
    "result", result ? result : json_null(), "exhausted", dead && o->kind == OUTCOME_RETRY);
  json_t *env = json_array();
  char names[sizeof cfg.env];
  snprintf(names, sizeof names, "%s", cfg.env);
  for (char *save = NULL, *n = strtok_r(names, ",", &save); n; n = strtok_r(NULL, ",", &save))
    json_array_append_new(env, json_string(n));
  json_t *body = json_pack("{ss ss so so sO so sb}", "script", cfg.script ? cfg.script : "",
                           "version", r->version, "env", env, "task", task_json(r, t),
                           "events", r->events, "outcome", outcome, "truncated", r->truncated);
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  char *table = text ? db_table_object(tbl, c, "recordings", 1) : NULL;
  if (!text || !table) {
    log_warn("task %lld: recording not stored: out of memory", (long long)t->id);
    free(text);
    free(table);
    return;
  }
  char sql[512], id[24], attempt[16], token[24], bytes[24];
  snprintf(sql, sizeof sql,
           "INSERT INTO %s (task_id, attempt, lease_token, version, truncated, bytes, body) "
           "VALUES ($1::bigint, $2::int, $3::bigint, $4, $5::boolean, $6::int, $7::jsonb) "
           "ON CONFLICT (task_id, lease_token) DO NOTHING", table);
  snprintf(id, sizeof id, "%lld", (long long)t->id);
  snprintf(attempt, sizeof attempt, "%d", t->attempt);
  snprintf(token, sizeof token, "%lld", (long long)t->token);
  snprintf(bytes, sizeof bytes, "%zu", strlen(text));
  const char *params[] = { id, attempt, token, r->version, r->truncated ? "true" : "false",
                           bytes, text };
  char err[DB_ERR_MAX];
  PGresult *res = db_exec(c, sql, 7, params, err, sizeof err);
  if (!res)
    log_warn("task %lld: recording not stored: %s", (long long)t->id, err);
  PQclear(res);
  free(table);
  free(text);
}

/* ---- building the events ---- */

/* record_redact, and the credential header values r has seen. */
static char *redact_r(struct record *r, const char *s, size_t len)
{
  char *out = record_redact(s, len);
  for (int i = 0; out && i < r->nseen; i++) {
    const char *v = r->seen[i];
    size_t vn = strlen(v);
    char *hit;
    while ((hit = strstr(out, v)) != NULL) {
      size_t before = (size_t)(hit - out), after = strlen(hit + vn);
      char *next = malloc(before + sizeof SECRETS_MARK + after);
      if (next) {
        memcpy(next, out, before);
        memcpy(next + before, SECRETS_MARK, sizeof SECRETS_MARK - 1);
        memcpy(next + before + sizeof SECRETS_MARK - 1, hit + vn, after + 1);
      }
      free(out);
      out = next;
      if (!out)
        break;
    }
  }
  return out;
}

/* url redacted, with its user:password@ (credentials in the authority) replaced too. */
static json_t *url_json(struct record *r, const char *url)
{
  const char *scheme = strstr(url, "://");
  const char *host = scheme ? scheme + 3 : NULL;
  const char *end = host ? host + strcspn(host, "/?#") : NULL;
  const char *at = NULL;
  for (const char *p = host; p && p < end; p++)
    if (*p == '@')
      at = p;
  if (!at)
    return jstr(r, url, strlen(url));
  size_t head = (size_t)(host - url), n = strlen(url);
  char *copy = malloc(n + sizeof SECRETS_MARK);
  if (!copy)
    return NULL;
  memcpy(copy, url, head);
  memcpy(copy + head, SECRETS_MARK, sizeof SECRETS_MARK - 1);
  memcpy(copy + head + sizeof SECRETS_MARK - 1, at, n - (size_t)(at - url) + 1);
  json_t *v = jstr(r, copy, strlen(copy));
  free(copy);
  return v;
}

/* A credential header's value (n bytes) becomes a secret of the recording: the whole value
   and its last word ("Bearer TOKEN", "sid=TOKEN"), when SECRETS_MIN_REDACT bytes or more. */
static void note_secret(struct record *r, const char *v, size_t n)
{
  if (memchr(v, '\0', n))
    return;
  const char *word = v;
  for (const char *p = v; p < v + n; p++)
    if (*p == ' ' || *p == '=')
      word = p + 1;
  const char *parts[] = { v, word };
  size_t lens[] = { n, n - (size_t)(word - v) };
  for (int i = 0; i < 2 && r->nseen < RECORD_MAX_SEEN; i++) {
    if (lens[i] < SECRETS_MIN_REDACT || (i == 1 && word == v))
      continue;
    char *copy = strndup(parts[i], lens[i]);
    if (copy)
      r->seen[r->nseen++] = copy;
  }
}

/* A JSON string of s, redacted; a text that JSON or jsonb cannot hold (a NUL, bytes that
   are not UTF-8) is replaced by a note of its size. Never NULL but on no memory. */
static json_t *jstr(struct record *r, const char *s, size_t len)
{
  if (memchr(s, '\0', len)) {
    char note[64];
    snprintf(note, sizeof note, "[binary: %zu bytes]", len);
    return json_string(note);
  }
  char *red = redact_r(r, s, len);
  if (!red)
    return NULL;
  json_t *v = json_string(red);
  free(red);
  if (!v) {
    char note[64];
    snprintf(note, sizeof note, "[not UTF-8: %zu bytes]", len);
    v = json_string(note);
  }
  return v;
}

/* A redacted copy of v (keys too); v is not consumed. */
static json_t *redact_tree(struct record *r, json_t *v)
{
  switch (json_typeof(v)) {
  case JSON_STRING:
    return jstr(r, json_string_value(v), json_string_length(v));
  case JSON_ARRAY: {
    json_t *a = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
      json_array_append_new(a, redact_tree(r, e));
    return a;
  }
  case JSON_OBJECT: {
    json_t *o = json_object();
    const char *k;
    json_t *e;
    json_object_foreach(v, k, e) {
      char *rk = redact_r(r, k, strlen(k));
      json_object_set_new(o, rk ? rk : "", redact_tree(r, e));
      free(rk);
    }
    return o;
  }
  default:
    return json_incref(v);
  }
}

/* The Lua value at idx as redacted JSON (the host's encoding; nil is null). */
static json_t *lua_json(struct record *r, lua_State *L, int idx)
{
  idx = lua_absindex(L, idx);
  if (lua_isnoneornil(L, idx))
    return json_null();
  char err[256];
  char *text = jsonlua_encode(L, idx, err, sizeof err);
  if (!text)
    return json_string("[not JSON]");
  json_t *raw = json_loads(text, JSON_DECODE_ANY, NULL);
  json_t *v = raw ? redact_tree(r, raw) : json_string("[not JSON]");
  json_decref(raw);
  free(text);
  return v;
}

/* { name = value } of the table at idx, names as given, credential values replaced. */
static json_t *headers_of(struct record *r, lua_State *L, int idx)
{
  json_t *o = json_object();
  if (!lua_istable(L, idx))
    return o;
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) == LUA_TSTRING && lua_isstring(L, -1)) {
      const char *name = lua_tostring(L, -2);
      int secret = 0;
      for (size_t i = 0; i < sizeof secret_headers / sizeof *secret_headers; i++)
        secret |= strcasecmp(name, secret_headers[i]) == 0;
      lua_pushvalue(L, -1);   /* tolstring converts a number in place: not the key's slot */
      size_t n;
      const char *v = lua_tolstring(L, -1, &n);
      if (secret)
        note_secret(r, v, n);
      char *rk = redact_r(r, name, strlen(name));
      json_object_set_new(o, rk ? rk : "", secret ? json_string(SECRETS_MARK) : jstr(r, v, n));
      free(rk);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  return o;
}

/* Appends ev unless it would take the recording past the cap: then the recording is marked
   truncated and adds nothing more (a replay of a cut recording ends where it was cut). */
static void add_event(struct record *r, json_t *ev)
{
  if (!ev) {
    r->truncated = 1;
    return;
  }
  char *text = json_dumps(ev, JSON_COMPACT);
  size_t n = text ? strlen(text) + 1 : 0;
  free(text);
  if (!text || r->bytes + n > cfg.max) {
    json_decref(ev);
    r->truncated = 1;
    return;
  }
  if (json_array_append_new(r->events, ev) != 0) {   /* consumed even when it fails */
    r->truncated = 1;
    return;
  }
  r->bytes += n;
}
