/* replay: a recording served back to a script, and the comparison. See replay.h. */
#include "replay.h"

#include "json_lua.h"
#include "lifecycle.h"
#include "record.h"
#include "script.h"
#include "secrets.h"
#include "task.h"
#include "task_context.h"

#include <jansson.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPLAY_DETAIL_MAX 300

struct replay_src {
  json_t *events;      /* the recording's events (a reference held) */
  char *used;          /* one flag per event */
  size_t nevents;
  int truncated;       /* the recording was cut at --record-max */
  char divergence[REPLAY_DETAIL_MAX];   /* the first request not in the recording; "" none */
};

struct replay_src *replay_src_new(void)
{
  return calloc(1, sizeof(struct replay_src));
}

static void src_clear(struct replay_src *s)
{
  json_decref(s->events);
  free(s->used);
  s->events = NULL;
  s->used = NULL;
  s->nevents = 0;
  s->truncated = 0;
  s->divergence[0] = '\0';
}

void replay_src_free(struct replay_src *s)
{
  if (!s)
    return;
  src_clear(s);
  free(s);
}

/* Ends the run: the request is named in the source and the run stopped as the host stops
   a task (a pcall in the script cannot go on past it). */
static void diverge(lua_State *L, struct replay_src *s, const char *fmt, ...)
  __attribute__((format(printf, 3, 4), noreturn));
static void diverge(lua_State *L, struct replay_src *s, const char *fmt, ...)
{
  if (!s->divergence[0]) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->divergence, sizeof s->divergence, fmt, ap);
    va_end(ap);
    if (s->truncated)
      snprintf(s->divergence + strlen(s->divergence),
               sizeof s->divergence - strlen(s->divergence),
               " (the recording was cut at --record-max)");
  }
  taskctx_yield(L, CAUSE_ERROR, -1, "replay divergence: %s", s->divergence);
}

/* A malloc'd copy of url as the recording keeps it: redacted, user:password@ replaced. */
static char *url_as_recorded(const char *url)
{
  char *red = record_redact(url, strlen(url));
  if (!red)
    return NULL;
  char *scheme = strstr(red, "://");
  char *host = scheme ? scheme + 3 : NULL;
  char *end = host ? host + strcspn(host, "/?#") : NULL;
  char *at = NULL;
  for (char *p = host; p && p < end; p++)
    if (*p == '@')
      at = p;
  if (!at)
    return red;
  size_t head = (size_t)(host - red), rest = strlen(at);
  char *out = malloc(head + sizeof SECRETS_MARK + rest);
  if (out) {
    memcpy(out, red, head);
    memcpy(out + head, SECRETS_MARK, sizeof SECRETS_MARK - 1);
    memcpy(out + head + sizeof SECRETS_MARK - 1, at, rest + 1);
  }
  free(red);
  return out;
}

static const char *field(const json_t *ev, const char *key)
{
  return json_string_value(json_object_get(ev, key));
}

/* The first unused event of type whose key equals want (any value when want is NULL). */
static json_t *take(struct replay_src *s, const char *type, const char *key, const char *want)
{
  for (size_t i = 0; i < s->nevents; i++) {
    json_t *ev = json_array_get(s->events, i);
    if (s->used[i] || strcmp(field(ev, "type") ? field(ev, "type") : "", type) != 0)
      continue;
    const char *v = key ? field(ev, key) : NULL;
    if (key && (!v || strcmp(v, want) != 0))
      continue;
    s->used[i] = 1;
    return ev;
  }
  return NULL;
}

/* Raises the recorded error of ev, if it has one, with the place the script called from. */
static void raise_recorded(lua_State *L, const json_t *ev, const char *prefix)
{
  const char *e = field(ev, "error");
  if (!e)
    return;
  luaL_where(L, 1);
  lua_pushfstring(L, "%s%s", prefix, e);
  lua_concat(L, 2);
  lua_error(L);
}

int replay_http(lua_State *L, struct replay_src *s, const char *method, const char *url)
{
  char *u = url_as_recorded(url);
  if (!u)
    return luaL_error(L, "leash.http.request: out of memory");
  json_t *ev = NULL;
  for (size_t i = 0; i < s->nevents && !ev; i++) {
    json_t *e = json_array_get(s->events, i);
    if (!s->used[i] && strcmp(field(e, "type") ? field(e, "type") : "", "http") == 0 &&
        field(e, "method") && strcmp(field(e, "method"), method) == 0 && field(e, "url") &&
        strcmp(field(e, "url"), u) == 0) {
      s->used[i] = 1;
      ev = e;
    }
  }
  if (!ev)
    ev = take(s, "http", "method", method);
  if (!ev) {
    char where[200];
    snprintf(where, sizeof where, "%s", u);
    free(u);
    diverge(L, s, "leash.http.request: %s %s is not in the recording", method, where);
  }
  free(u);
  raise_recorded(L, ev, "");   /* a transport error: its message names the call already */
  json_t *resp = json_object_get(ev, "response");
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, (lua_Integer)json_integer_value(json_object_get(resp, "status")));
  lua_setfield(L, -2, "status");
  lua_newtable(L);
  const char *k;
  json_t *v;
  json_object_foreach(json_object_get(resp, "headers"), k, v) {
    if (json_is_string(v)) {
      lua_pushstring(L, json_string_value(v));
      lua_setfield(L, -2, k);
    }
  }
  lua_setfield(L, -2, "headers");
  json_t *body = json_object_get(resp, "body");
  lua_pushlstring(L, json_is_string(body) ? json_string_value(body) : "",
                  json_is_string(body) ? json_string_length(body) : 0);
  lua_setfield(L, -2, "body");
  return 1;
}

int replay_db(lua_State *L, struct replay_src *s, const char *sql)
{
  char *red = record_redact(sql, strlen(sql));
  if (!red)
    return luaL_error(L, "leash.db.query: out of memory");
  json_t *ev = take(s, "db", "sql", red);
  if (!ev) {
    char line[120];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(red, "\n"), red);
    free(red);
    diverge(L, s, "leash.db.query: the statement is not in the recording: %s", line);
  }
  free(red);
  raise_recorded(L, ev, "leash.db.query: ");
  json_t *rows = json_object_get(ev, "rows");
  if (json_is_array(rows)) {
    jsonlua_push(L, rows);
  } else {
    lua_newtable(L);
    luaL_setmetatable(L, JSONLUA_ARRAY_MT);
  }
  lua_pushinteger(L, (lua_Integer)json_integer_value(json_object_get(ev, "affected")));
  return 2;
}

int replay_step(lua_State *L, struct replay_src *s, const char *name)
{
  json_t *ev = take(s, "step", "name", name);
  if (!ev || !json_is_true(json_object_get(ev, "cached")))
    return 0;
  json_t *v = json_object_get(ev, "result");
  if (!v || json_is_null(v))
    lua_pushnil(L);
  else
    jsonlua_push(L, v);
  return 1;
}

int replay_enqueue(lua_State *L, struct replay_src *s)
{
  json_t *ev = take(s, "enqueue", NULL, NULL);
  if (!ev)
    diverge(L, s, "leash.enqueue: a child task the recording does not hold");
  lua_pushinteger(L, (lua_Integer)json_integer_value(json_object_get(ev, "id")));
  return 1;
}

const char *replay_kind_word(const char *kind_sql)
{
  if (!kind_sql)
    return "unknown";
  if (strcmp(kind_sql, "done") == 0)
    return "ok";
  if (strcmp(kind_sql, "dead") == 0)
    return "fatal";
  return kind_sql;
}

/* The status a settle would give outcome o of an execution at attempt of max (lifecycle:
   a retry on the last attempt is dead; a snooze gives the attempt back). */
static const char *status_of(const struct outcome *o, int attempt, int max)
{
  switch (o->kind) {
  case OUTCOME_SUCCESS:
    return "done";
  case OUTCOME_FATAL:
    return "dead";
  case OUTCOME_RETRY:
    return attempt >= max ? "dead" : "retry";
  default:
    return "retry";
  }
}

/* The first line of a redacted error, cut to fit a line of the report. */
static json_t *error_line(const char *e)
{
  if (!e)
    return json_null();
  char *red = record_redact(e, strlen(e));
  if (!red)
    return json_null();
  red[strcspn(red, "\n")] = '\0';
  if (strlen(red) > 200)
    strcpy(red + 197, "...");
  json_t *v = json_string(red);
  free(red);
  return v ? v : json_string("[not UTF-8]");
}

/* The new result as JSON, redacted as the recorded one was (every --env-allow value). */
static json_t *result_json(const char *text)
{
  if (!text)
    return json_null();
  char *red = record_redact(text, strlen(text));
  json_t *v = red ? json_loads(red, JSON_DECODE_ANY, NULL) : NULL;
  free(red);
  return v ? v : json_string("[not JSON]");
}

static char *dup_field(const json_t *o, const char *key)
{
  const char *v = json_string_value(json_object_get(o, key));
  return strdup(v ? v : "");
}

json_t *replay_one(struct script *s, struct replay_src *src, const char *body, size_t len)
{
  json_t *rec = json_loadb(body, len, 0, NULL);
  json_t *task = json_object_get(rec, "task"), *out = json_object_get(rec, "outcome");
  json_t *events = json_object_get(rec, "events");
  json_t *id = json_object_get(task, "id");
  json_t *row = json_pack("{sI}", "id", (json_int_t)json_integer_value(id));
  if (!row) {
    json_decref(rec);
    return NULL;
  }
  json_t *payload = json_object_get(task, "payload");
  const char *cut = json_string_value(payload);
  if (!json_is_integer(id) || !json_is_object(out) || !json_is_array(events) || !payload ||
      (cut && strcmp(cut, "[over --record-max]") == 0)) {
    json_object_set_new(row, "change", json_string("unreadable"));
    json_decref(rec);
    return row;
  }
  src_clear(src);
  src->events = json_incref(events);
  src->nevents = json_array_size(events);
  src->used = calloc(src->nevents + 1, 1);
  src->truncated = json_is_true(json_object_get(rec, "truncated"));

  struct task t = { 0 };
  t.id = (int64_t)json_integer_value(id);
  t.attempt = (int)json_integer_value(json_object_get(task, "attempt"));
  t.max_attempts = (int)json_integer_value(json_object_get(task, "max_attempts"));
  t.tenant_id = dup_field(task, "tenant_id");
  t.shard_key = dup_field(task, "shard_key");
  t.batch = json_is_string(json_object_get(task, "batch")) ? dup_field(task, "batch") : NULL;
  t.payload = json_dumps(payload, JSON_ENCODE_ANY | JSON_COMPACT);
  /* No lease to lose: the run's own --task-timeout still bounds it. */
  atomic_init(&t.lease_deadline, task_now() + 1e9);
  atomic_init(&t.lost, 0);
  if (src->used && t.tenant_id && t.shard_key && t.payload)
    script_run(s, &t);
  else
    outcome_set(&t.out, OUTCOME_RETRY, CAUSE_MEMORY, NULL, "out of memory");

  const char *rkind = replay_kind_word(field(out, "kind"));
  const char *nkind = replay_kind_word(lifecycle_kind_sql(t.out.kind));
  const char *rstatus = field(out, "status"), *nstatus = status_of(&t.out, t.attempt,
                                                                     t.max_attempts);
  json_t *rresult = json_object_get(out, "result");
  json_t *nresult = result_json(t.out.result);
  const char *change = src->divergence[0] ? "divergence"
                     : strcmp(rkind, nkind) != 0 || !rstatus || strcmp(rstatus, nstatus) != 0
                       ? "outcome"
                     : !json_equal(rresult ? rresult : json_null(), nresult) ? "result"
                     : "same";
  json_object_set_new(row, "change", json_string(change));
  json_object_set_new(row, "from", json_pack("{ss ss sO? sO}", "kind", rkind, "status",
                                             rstatus ? rstatus : "",
                                             "cause", json_object_get(out, "cause"),
                                             "result", rresult ? rresult : json_null()));
  json_object_set_new(row, "to", json_pack("{ss ss ss so so}", "kind", nkind, "status",
                                           nstatus, "cause",
                                           lifecycle_cause_name(t.out.cause), "result", nresult,
                                           "error", error_line(t.out.error)));
  if (src->divergence[0])
    json_object_set_new(row, "divergence", json_string(src->divergence));
  free(t.tenant_id);
  free(t.shard_key);
  free(t.batch);
  free(t.payload);
  outcome_clear(&t.out);
  record_free(t.rec);
  src_clear(src);
  json_decref(rec);
  return row;
}
