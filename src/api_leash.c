/*
 * api_leash: the `leash` module. Which calls raise and which return nil, msg:
 * misuse (bad arguments) raises; calls with side effects (db.query) raise once the lease
 * is lost, so a task that lost its lease cannot go on writing; db errors raise with the
 * server's message (a task's error becomes a retry with that message).
 */
#include "api.h"

#include "dbpool.h"
#include "json_lua.h"
#include "lifecycle.h"
#include "log.h"
#include "luatext.h"
#include "pgvalue.h"
#include "queue.h"
#include "record.h"
#include "replay.h"
#include "task_context.h"

#include <lauxlib.h>
#include <libpq-fe.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DB_MAX_PARAMS 100

static int l_ok(lua_State *L);
static int l_retry(lua_State *L);
static int l_fatal(lua_State *L);
static int l_snooze(lua_State *L);
static int l_wait(lua_State *L);
static int l_waited(lua_State *L);
static int l_now(lua_State *L);
static int l_sleep(lua_State *L);
static int l_db_query(lua_State *L);
static int l_log_debug(lua_State *L);
static int l_log_info(lua_State *L);
static int l_log_warn(lua_State *L);
static int l_log_error(lua_State *L);
static int l_step(lua_State *L);
static int l_enqueue(lua_State *L);
static int result_gc(lua_State *L);
static void result_free(lua_State *L, int idx);
static PGresult *pool_exec(lua_State *L, const char *what, const char *sql, int nparams,
                           const char *const *params);
static void task_fence(const struct task *t, char id[24], char token[24]);
static void push_outcome(lua_State *L, const char *kind);

static const char outcome_key = 'O';
#define RESULT_MT "leash.PGresult"

int api_leash_open(lua_State *L)
{
  static const luaL_Reg funcs[] = {
    { "ok", l_ok }, { "retry", l_retry }, { "fatal", l_fatal }, { "snooze", l_snooze },
    { "wait", l_wait },
    { "waited", l_waited },
    { "now", l_now }, { "sleep", l_sleep }, { "step", l_step }, { "enqueue", l_enqueue },
    { "usage", api_usage }, { "env", api_env },
    { NULL, NULL },
  };
  static const luaL_Reg db[] = { { "query", l_db_query }, { NULL, NULL } };
  static const luaL_Reg logf[] = {
    { "debug", l_log_debug }, { "info", l_log_info }, { "warn", l_log_warn },
    { "error", l_log_error }, { NULL, NULL },
  };
  luaL_newlib(L, funcs);
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "null");
  jsonlua_open(L);
  lua_setfield(L, -2, "json");
  api_http_open(L);
  lua_setfield(L, -2, "http");
  api_budget_open(L);
  lua_setfield(L, -2, "budget");
  api_llm_open(L);
  lua_setfield(L, -2, "llm");
  luaL_newlib(L, db);
  lua_setfield(L, -2, "db");
  luaL_newlib(L, logf);
  lua_setfield(L, -2, "log");
  /* The outcome metatable, keyed by address: scripts cannot name or forge it. */
  lua_newtable(L);
  lua_pushliteral(L, "leash.outcome");
  lua_setfield(L, -2, "__name");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &outcome_key);
  if (luaL_newmetatable(L, RESULT_MT)) {
    lua_pushcfunction(L, result_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  return 1;
}

const char *api_outcome_kind(lua_State *L, int idx)
{
  static const char *const kinds[] = { "ok", "retry", "fatal", "snooze", "wait" };
  if (!lua_istable(L, idx) || !lua_getmetatable(L, idx))
    return NULL;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &outcome_key);
  int is = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  if (!is)
    return NULL;
  lua_getfield(L, idx, "kind");
  const char *k = lua_tostring(L, -1);
  const char *found = NULL;
  for (int i = 0; i < (int)(sizeof kinds / sizeof *kinds) && k; i++)
    if (strcmp(k, kinds[i]) == 0)
      found = kinds[i];
  lua_pop(L, 1);
  return found;
}

/* [-0, +1, m] { kind = kind } with the outcome metatable. */
static void push_outcome(lua_State *L, const char *kind)
{
  lua_createtable(L, 0, 3);
  lua_pushstring(L, kind);
  lua_setfield(L, -2, "kind");
  lua_rawgetp(L, LUA_REGISTRYINDEX, &outcome_key);
  lua_setmetatable(L, -2);
}

/* leash.ok([result]): success; result (a JSON-able value) is stored in the row. */
static int l_ok(lua_State *L)
{
  lua_settop(L, 1);
  push_outcome(L, "ok");
  lua_pushvalue(L, 1);
  lua_setfield(L, -2, "result");
  return 1;
}

/* [-0, +0, v] The delay at idx as seconds: a finite number >= 0 (a string too is refused:
   an upstream's Retry-After header must be converted on purpose), else raises at the
   script's line naming argument `arg` (or the field `field` of a table). One above
   LIFECYCLE_MAX_DELAY_S is cut when the outcome is read (script.c), like one set by hand. */
static lua_Number check_delay(lua_State *L, int idx, int arg, const char *field)
{
  if (lua_type(L, idx) != LUA_TNUMBER) {
    if (field)
      return luaL_error(L, "%s must be a number of seconds, not a %s", field,
                        luaL_typename(L, idx));
    return luaL_typeerror(L, arg, "number of seconds");
  }
  lua_Number d = lua_tonumber(L, idx);
  if (!(d >= 0) || !isfinite(d)) {
    if (field)
      return luaL_error(L, "%s must be a finite number of seconds >= 0", field);
    return luaL_argerror(L, arg, "delay must be a finite number of seconds >= 0");
  }
  return d;
}

/* [-0, +1, m] The outcome of a retry or a snooze: kind, message, and delay when >= 0. */
static int push_delayed(lua_State *L, const char *kind, const char *msg, lua_Number delay)
{
  push_outcome(L, kind);
  lua_pushstring(L, msg);
  lua_setfield(L, -2, "message");
  if (delay >= 0) {
    lua_pushnumber(L, delay);
    lua_setfield(L, -2, "delay");
  }
  return 1;
}

/* leash.retry{message = m, after = s, spend = false}: the table form. after is the delay
   (else the backoff); spend = false makes it a snooze (leash.snooze(after, message)), which
   needs after. Unknown fields raise: a typo must not turn a snooze into a spent attempt. */
static int retry_table(lua_State *L)
{
  lua_Number delay = -1;
  int spend = 1;
  const char *msg = "retry requested";
  lua_pushnil(L);
  while (lua_next(L, 1) != 0) {
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    if (!k || (strcmp(k, "message") != 0 && strcmp(k, "after") != 0 && strcmp(k, "spend") != 0))
      return luaL_error(L, "leash.retry{...}: unknown field %s (expected message, after, spend)",
                        k ? k : luaL_typename(L, -2));
    lua_pop(L, 1);
  }
  if (lua_getfield(L, 1, "message") != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER)
      return luaL_error(L, "leash.retry{...}: message must be a string, not a %s",
                        luaL_typename(L, -1));
    msg = lua_tostring(L, -1);
  }
  if (lua_getfield(L, 1, "after") != LUA_TNIL)
    delay = check_delay(L, -1, 0, "leash.retry{...}: after");
  if (lua_getfield(L, 1, "spend") != LUA_TNIL) {
    if (!lua_isboolean(L, -1))
      return luaL_error(L, "leash.retry{...}: spend must be a boolean, not a %s",
                        luaL_typename(L, -1));
    spend = lua_toboolean(L, -1);
  }
  if (!spend && delay < 0)
    return luaL_error(L, "leash.retry{...}: spend = false (a snooze) needs after = seconds");
  return push_delayed(L, spend ? "retry" : "snooze", msg, delay);
}

/* leash.retry(msg [, delay_seconds]) or leash.retry{...}: a retryable error; the delay
   replaces the backoff. A bad delay raises here, at the script's line (check_delay). */
static int l_retry(lua_State *L)
{
  if (lua_type(L, 1) == LUA_TTABLE && lua_gettop(L) == 1)
    return retry_table(L);
  const char *msg = luaL_optstring(L, 1, "retry requested");
  lua_Number delay = -1;
  if (!lua_isnoneornil(L, 2))
    delay = check_delay(L, 2, 2, NULL);
  return push_delayed(L, "retry", msg, delay);
}

/* leash.snooze(delay_seconds [, reason]): pending again after the delay without spending
   an attempt (bounded by the row's max_snoozes; past it, a retry: sql/012). The delay is
   required and checked like a retry's. */
static int l_snooze(lua_State *L)
{
  lua_Number delay = check_delay(L, 1, 1, NULL);
  const char *msg = luaL_optstring(L, 2, "snoozed");
  return push_delayed(L, "snooze", msg, delay);
}

/* [-0, +0, e] t[key] as a finite number of seconds: >= 0 (> 0 when positive), cut to hi;
   else raises naming the field. */
static double wait_number(lua_State *L, const char *key, int positive, double hi)
{
  lua_getfield(L, 1, key);
  int isnum = lua_type(L, -1) == LUA_TNUMBER;
  double d = isnum ? lua_tonumber(L, -1) : 0;
  if (!isnum || !isfinite(d) || d < 0 || (positive && d <= 0)) {
    char got[64];
    if (isnum)
      snprintf(got, sizeof got, "%g", d);
    else
      snprintf(got, sizeof got, "%s", luaL_typename(L, -1));
    return luaL_error(L, "leash.wait{...}: %s must be a finite number of seconds %s 0, not %s",
                      key, positive ? ">" : ">=", got);
  }
  lua_pop(L, 1);
  return d > hi ? hi : d;
}

/* leash.wait{children = true | ids = {...} | until = epoch_s | after = s | event = name,
   deadline = s,
   on_deadline = "retry"|"dead", message = m}: ends the execution waiting, the attempt given
   back (sql/019_waits.sql). Exactly one condition; unknown fields and wrong types raise here,
   at the script's line: a typo must not wait for a day. The spec goes to the settle as JSON
   in the outcome's field spec. */
#define WAIT_EVENT_MAX 200   /* sql/019_waits.sql's signals.name */

static int l_wait(lua_State *L)
{
  static const char *const keys[] = { "children", "ids", "until", "after", "event",
                                      "deadline", "on_deadline", "message", NULL };
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_pushnil(L);
  while (lua_next(L, 1) != 0) {
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    int known = 0;
    for (int i = 0; k && keys[i]; i++)
      known |= strcmp(k, keys[i]) == 0;
    if (!known)
      return luaL_error(L, "leash.wait{...}: unknown field %s (expected children, ids, until, "
                        "after, event, deadline, on_deadline, message)",
                        k ? k : luaL_typename(L, -2));
    lua_pop(L, 1);
  }
  int n = 0;
  for (int i = 0; i < 5; i++)
    n += lua_getfield(L, 1, keys[i]) != LUA_TNIL;
  lua_settop(L, 1);
  if (n != 1)
    return luaL_error(L, "leash.wait{...}: give exactly one of children = true, ids = {...}, "
                      "until = epoch seconds, after = seconds, event = name");
  /* Everything checked first; the spec is written after, with nothing left to raise. */
  char head[320];
  lua_Integer len = 0;
  lua_getfield(L, 1, "ids");                               /* 2: the list, or nil */
  if (lua_getfield(L, 1, "children") != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TBOOLEAN || !lua_toboolean(L, -1))
      return luaL_error(L, "leash.wait{...}: children must be true, not %s",
                        lua_type(L, -1) == LUA_TBOOLEAN ? "false" : luaL_typename(L, -1));
    snprintf(head, sizeof head, "{\"reason\":\"children\"");
  } else if (!lua_isnil(L, 2)) {
    if (lua_type(L, 2) != LUA_TTABLE)
      return luaL_error(L, "leash.wait{...}: ids must be a list of task ids, not a %s",
                        luaL_typename(L, 2));
    len = luaL_len(L, 2);
    if (len < 1 || len > LIFECYCLE_WAIT_MAX_IDS)
      return luaL_error(L, "leash.wait{...}: ids must list 1 to %d task ids",
                        LIFECYCLE_WAIT_MAX_IDS);
    for (lua_Integer i = 1; i <= len; i++) {
      lua_geti(L, 2, i);
      int isint = 0;
      lua_Integer id = lua_tointegerx(L, -1, &isint);
      if (lua_type(L, -1) != LUA_TNUMBER || !isint || id < 1)
        return luaL_error(L, "leash.wait{...}: ids[%d] must be a task id (an integer >= 1)",
                          (int)i);
      lua_pop(L, 1);
    }
    snprintf(head, sizeof head, "{\"reason\":\"ids\",\"ids\":[");
  } else if (lua_pop(L, 1), lua_getfield(L, 1, "event") != LUA_TNIL) {
    /* A name the spec's JSON holds unquoted-safe: no escaping to get wrong. */
    size_t nl = 0;
    const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &nl) : NULL;
    int ok = name && nl >= 1 && nl <= WAIT_EVENT_MAX;
    for (size_t i = 0; ok && i < nl; i++)
      ok = isalnum((unsigned char)name[i]) || strchr("_.:/-", name[i]) != NULL;
    if (!ok)
      return luaL_error(L, "leash.wait{...}: event must be a name of 1 to %d letters, digits "
                        "and _ . : / -", WAIT_EVENT_MAX);
    snprintf(head, sizeof head, "{\"reason\":\"event\",\"event\":\"%s\"", name);
  } else if (lua_pop(L, 1), lua_getfield(L, 1, "until") != LUA_TNIL) {
    lua_pop(L, 1);
    snprintf(head, sizeof head, "{\"reason\":\"until\",\"until\":%.3f",
             wait_number(L, "until", 0, 1e12));
  } else {
    lua_pop(L, 1);
    snprintf(head, sizeof head, "{\"reason\":\"until\",\"after\":%.3f",
             wait_number(L, "after", 0, LIFECYCLE_MAX_WAIT_S));
  }
  lua_settop(L, 2);
  double deadline = LIFECYCLE_WAIT_DEADLINE_S;
  if (lua_getfield(L, 1, "deadline") != LUA_TNIL) {
    lua_pop(L, 1);
    deadline = wait_number(L, "deadline", 1, LIFECYCLE_MAX_WAIT_S);
  } else {
    lua_pop(L, 1);
  }
  const char *on = "retry";
  if (lua_getfield(L, 1, "on_deadline") != LUA_TNIL) {
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (!v || (strcmp(v, "retry") != 0 && strcmp(v, "dead") != 0))
      return luaL_error(L, "leash.wait{...}: on_deadline must be \"retry\" or \"dead\"");
    on = strcmp(v, "dead") == 0 ? "dead" : "retry";
  }
  lua_pop(L, 1);
  const char *msg = "waiting";
  if (lua_getfield(L, 1, "message") != LUA_TNIL) {         /* 3 */
    if (lua_type(L, -1) != LUA_TSTRING)
      return luaL_error(L, "leash.wait{...}: message must be a string, not a %s",
                        luaL_typename(L, -1));
    msg = lua_tostring(L, -1);
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, head);
  for (lua_Integer i = 1; i <= len; i++) {
    char num[32];
    lua_geti(L, 2, i);
    snprintf(num, sizeof num, "%s%lld", i > 1 ? "," : "", (long long)lua_tointeger(L, -1));
    lua_pop(L, 1);
    luaL_addstring(&b, num);
  }
  char tail[128];
  snprintf(tail, sizeof tail, "%s,\"deadline\":%.3f,\"on_deadline\":\"%s\"}", len ? "]" : "",
           deadline, on);
  luaL_addstring(&b, tail);
  luaL_pushresult(&b);
  int spec = lua_gettop(L);
  push_outcome(L, "wait");
  lua_pushstring(L, msg);
  lua_setfield(L, -2, "message");
  lua_pushvalue(L, spec);
  lua_setfield(L, -2, "spec");
  return 1;
}

/* leash.waited(): nil unless this task's last execution ended in leash.wait; then
   {reason = "children"|"ids"|"until"|"event", expired = bool (its deadline passed: a
   retry), tasks = {{id, status, result}, ...} (the tasks it waited for, by id; empty for
   the clock or an event), event = {name, payload} (the event's latest signal, or nil)}. One query; the wait's record stays until this execution settles. */
static int l_waited(lua_State *L)
{
  taskctx_check_live(L, "leash.waited");
  const struct script_host *h = taskctx_of(L)->host;
  struct task *t = taskctx_of(L)->task;
  char id[24], token[24], err[512];
  if (!h->sql)
    return luaL_error(L, "leash.waited: no database in this context");
  task_fence(t, id, token);
  const char *get[] = { id };
  PGresult *r = pool_exec(L, "leash.waited", h->sql->wait_get, 1, get);   /* stack: +box */
  if (PQntuples(r) != 1 || PQgetisnull(r, 0, 0)) {
    result_free(L, -1);
    lua_pushnil(L);
    return 1;
  }
  if (jsonlua_decode(L, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0), err, sizeof err) != 0)
    return luaL_error(L, "leash.waited: unreadable: %s", err);
  result_free(L, -2);
  return 1;
}

/* leash.fatal(msg): the task goes dead at once. */
static int l_fatal(lua_State *L)
{
  const char *msg = luaL_optstring(L, 1, "fatal");
  push_outcome(L, "fatal");
  lua_pushstring(L, msg);
  lua_setfield(L, -2, "message");
  return 1;
}

/* leash.now(): wall-clock seconds since the epoch, sub-second. */
static int l_now(lua_State *L)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
  return 1;
}

/* leash.sleep(seconds): waits, waking early when the lease is lost or the worker stops
   (then raises, since the task cannot go on). Bounded by the task's deadline. */
static int l_sleep(lua_State *L)
{
  lua_Number secs = luaL_checknumber(L, 1);
  luaL_argcheck(L, secs >= 0 && isfinite(secs), 1, "seconds must be >= 0");
  const struct task_ctx *ctx = taskctx_of(L);
  struct task *t = ctx->task;
  if (ctx->host->replay)   /* leash replay is CPU-bound: a recorded wait is not waited */
    return 0;
  int over = taskctx_sleep(ctx, secs);
  if (over)
    return luaL_error(L, "task timed out (--task-timeout)");
  if (t)
    taskctx_check_live(L, "leash.sleep");
  return 0;
}

static int result_gc(lua_State *L)
{
  result_free(L, 1);
  return 0;
}

/* A result is freed as soon as it has been read, not at the next collection: the collector
   cannot see its size, and a task may run many statements before one comes. */
static void result_free(lua_State *L, int idx)
{
  PGresult **box = luaL_checkudata(L, idx, RESULT_MT);
  PQclear(*box);
  *box = NULL;
}

/* leash.db.query(sql, ...): one parameterised statement ($1, $2 …) on a pooled connection
   (never the claim or heartbeat one), in autocommit. Returns rows (an array of tables keyed
   by column name, types mapped as pgvalue.h says) and the number of rows affected.
   Parameters: nil/leash.null → NULL, booleans, numbers, strings, tables → JSON. */
static int l_db_query(lua_State *L)
{
  const char *sql = luaL_checkstring(L, 1);
  int nparams = lua_gettop(L) - 1;
  luaL_argcheck(L, nparams <= DB_MAX_PARAMS, DB_MAX_PARAMS + 2, "too many parameters");
  taskctx_check_live(L, "leash.db.query");
  /* Text of every parameter first (may raise), kept alive on the stack. */
  const char *params[DB_MAX_PARAMS];
  char err[512];
  for (int i = 0; i < nparams; i++) {
    int idx = i + 2;
    switch (lua_type(L, idx)) {
    case LUA_TNIL:
      params[i] = NULL;
      break;
    case LUA_TLIGHTUSERDATA:
      if (lua_touserdata(L, idx) != NULL)
        return luaL_argerror(L, idx, "cannot send a userdata");
      params[i] = NULL;
      break;
    case LUA_TBOOLEAN:
      params[i] = lua_toboolean(L, idx) ? "true" : "false";
      break;
    case LUA_TNUMBER: {
      /* tostring keeps only 14 digits of a float; PostgreSQL gets all 17. */
      char num[64];
      if (lua_isinteger(L, idx))
        snprintf(num, sizeof num, "%lld", (long long)lua_tointeger(L, idx));
      else
        snprintf(num, sizeof num, "%.17g", (double)lua_tonumber(L, idx));
      lua_pushstring(L, num);
      lua_replace(L, idx);
      params[i] = lua_tostring(L, idx);
      break;
    }
    case LUA_TSTRING:
      params[i] = lua_tostring(L, idx);
      break;
    case LUA_TTABLE: {
      char *j = jsonlua_encode(L, idx, err, sizeof err);
      if (!j)
        return luaL_argerror(L, idx, err);
      luatext_pushfree(L, j);
      lua_replace(L, idx);
      params[i] = lua_tostring(L, idx);
      break;
    }
    default:
      return luaL_argerror(L, idx, "cannot send this type to PostgreSQL");
    }
  }
  if (taskctx_of(L)->host->replay)   /* leash replay: the recorded answer (replay.h) */
    return replay_db(L, taskctx_of(L)->host->replay, sql);
  PGresult *r = pool_exec(L, "leash.db.query", sql, nparams, params);
  int box = lua_gettop(L);
  int rows = PQntuples(r), cols = PQnfields(r);
  lua_createtable(L, rows, 0);
  luaL_setmetatable(L, JSONLUA_ARRAY_MT);
  for (int i = 0; i < rows; i++) {
    lua_createtable(L, 0, cols);
    for (int j = 0; j < cols; j++) {
      pgvalue_push(L, (unsigned)PQftype(r, j), PQgetvalue(r, i, j), PQgetlength(r, i, j),
                   PQgetisnull(r, i, j));
      lua_setfield(L, -2, PQfname(r, j));
    }
    lua_rawseti(L, -2, i + 1);
  }
  const char *affected = PQcmdTuples(r);
  long long naffected = *affected ? strtoll(affected, NULL, 10) : rows;
  record_db(taskctx_of(L)->task, L, sql, nparams, params, -1, naffected, NULL);
  lua_pushinteger(L, naffected);
  result_free(L, box);
  return 2;
}

/* [-0, +1, m] Runs one statement on a pooled connection; the result is boxed in a userdata
   pushed on the stack: the caller frees it with result_free once read, and on a raise the
   collector does. Raises on failure with "what: <server message>". */
static PGresult *pool_exec(lua_State *L, const char *what, const char *sql, int nparams,
                           const char *const *params)
{
  const struct task_ctx *ctx = taskctx_of(L);
  const struct script_host *h = ctx->host;
  struct task *t = ctx->task;
  char err[512];
  if (!h->pool)
    luaL_error(L, "%s: no database in this context", what);
  PGresult **box = lua_newuserdatauv(L, sizeof *box, 0);
  *box = NULL;
  luaL_setmetatable(L, RESULT_MT);
  PGconn *c = dbpool_get_for(h->pool, t, taskctx_time_left(ctx), err, sizeof err);
  if (!c)
    luaL_error(L, "%s: %s", what, err);
  /* The wait for a connection may have outlived the lease. */
  if (t && !task_lease_alive(t)) {
    dbpool_put(h->pool, c);
    luaL_error(L, "%s: lease lost: the task's side effects are stopped", what);
  }
  *box = dbpool_exec(h->pool, c, sql, nparams, params);
  ExecStatusType st = *box ? PQresultStatus(*box) : PGRES_FATAL_ERROR;
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    const char *m = *box ? PQresultErrorField(*box, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    if (!m)
      m = *box ? PQresultErrorMessage(*box) : PQerrorMessage(c);
    snprintf(err, sizeof err, "%s", m && *m ? m : "query failed");
    dbpool_put(h->pool, c);
    size_t n = strlen(err);
    while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == ' '))
      err[--n] = '\0';
    if (strcmp(what, "leash.db.query") == 0)   /* a step's or a child's SQL is the host's */
      record_db(t, L, sql, nparams, params, 0, 0, err);
    luaL_error(L, "%s: %s", what, err);
  }
  dbpool_put(h->pool, c);
  return *box;
}

PGresult *api_pool_exec(lua_State *L, const char *what, const char *sql, int nparams,
                        const char *const *params)
{
  return pool_exec(L, what, sql, nparams, params);
}

void api_result_free(lua_State *L, int idx)
{
  result_free(L, idx);
}

/* The innermost leash.step running below the caller: its frame is l_step's, and its first
   stack slot is the step's name (checked a string by l_step). Walking the stack rather than
   keeping a flag: a script's pcall around a failed step leaves nothing stale behind. */
const char *api_step_name(lua_State *L, long long *seq)
{
  lua_Debug ar;
  *seq = 0;
  for (int level = 0; lua_getstack(L, level, &ar); level++) {
    lua_getinfo(L, "f", &ar);
    int is = lua_tocfunction(L, -1) == l_step;
    lua_pop(L, 1);
    if (is && lua_getlocal(L, &ar, 1)) {
      const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
      lua_pop(L, 1);   /* the string stays alive in l_step's frame */
      if (lua_getlocal(L, &ar, 3)) {
        *seq = lua_isinteger(L, -1) ? (long long)lua_tointeger(L, -1) : 0;
        lua_pop(L, 1);
      }
      return name;
    }
  }
  return NULL;
}

/* The running task's fence as text: id and lease token (owner is the worker id). */
static void task_fence(const struct task *t, char id[24], char token[24])
{
  snprintf(id, 24, "%lld", (long long)t->id);
  snprintf(token, 24, "%lld", (long long)t->token);
}

/* leash.step(name, fn): runs fn once per task across all attempts. A stored result is
   returned without calling fn; else fn() runs and its result (one JSON-able value, or nil)
   is stored fenced before it is returned. Raises when the lease is lost (the result is then
   not stored: the next holder runs the step again). */
static int l_step(lua_State *L)
{
  const char *name = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  taskctx_check_live(L, "leash.step");
  const struct script_host *h = taskctx_of(L)->host;
  struct task *t = taskctx_of(L)->task;
  char id[24], token[24], err[512];
  if (h->replay) {   /* leash replay: a step stored before is given back, else fn runs */
    if (replay_step(L, h->replay, name))
      return 1;
    lua_pushvalue(L, 2);
    lua_call(L, 0, 1);
    char *json = lua_isnil(L, -1) ? NULL : jsonlua_encode(L, -1, err, sizeof err);
    if (!lua_isnil(L, -1) && !json)   /* what the real step would refuse to store */
      return luaL_error(L, "leash.step: result of '%s' cannot be stored as JSON: %s", name, err);
    free(json);
    return 1;
  }
  if (!h->sql)
    return luaL_error(L, "leash.step: no database in this context");
  task_fence(t, id, token);

  const char *get[] = { id, name };
  PGresult *r = pool_exec(L, "leash.step", h->sql->step_get, 2, get);   /* stack: +box */
  if (PQntuples(r) == 1) {
    if (PQgetisnull(r, 0, 0))
      lua_pushnil(L);
    else if (jsonlua_decode(L, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0), err,
                            sizeof err) != 0)
      return luaL_error(L, "leash.step: stored result of '%s' unreadable: %s", name, err);
    record_step(t, L, name, 1, -1);
    result_free(L, -2);
    return 1;
  }
  result_free(L, -1);
  lua_pop(L, 1);

  /* Slot 3: this run of fn's number in the state (api_step_name reads it). */
  lua_pushinteger(L, (lua_Integer)++taskctx_of(L)->step_seq);
  lua_pushvalue(L, 2);
  lua_call(L, 0, 1);                                                    /* stack: result */
  int res = lua_gettop(L);
  char *json = NULL;
  if (!lua_isnil(L, res) && !(json = jsonlua_encode(L, res, err, sizeof err)))
    return luaL_error(L, "leash.step: result of '%s' cannot be stored as JSON: %s", name, err);
  int has = json != NULL;
  if (json)
    luatext_pushfree(L, json);   /* the text lives on the stack; ours is freed */
  else
    lua_pushliteral(L, "");
  taskctx_check_live(L, "leash.step");
  const char *put[] = { id, name, has ? lua_tostring(L, -1) : NULL, token, h->worker_id };
  r = pool_exec(L, "leash.step", h->sql->step_put, 5, put);
  if (PQntuples(r) != 1)
    return luaL_error(L, "leash.step: lease lost: step '%s' not stored", name);
  result_free(L, -1);
  record_step(t, L, name, 0, res);
  lua_pushvalue(L, res);
  return 1;
}

/* leash.enqueue{payload=…, tenant_id=…, shard_key=…, delay=…, batch=…, max_attempts=…}:
   a child task, written only while this task's lease holds (a lost lease cannot spawn).
   Defaults: the parent's tenant and batch, a shard of its own. Returns the new id. */
static int l_enqueue(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  taskctx_check_live(L, "leash.enqueue");
  const struct script_host *h = taskctx_of(L)->host;
  struct task *t = taskctx_of(L)->task;
  char id[24], token[24], err[512], delay[32], max[16];
  if (!h->sql && !h->replay)
    return luaL_error(L, "leash.enqueue: no database in this context");
  task_fence(t, id, token);

  if (lua_getfield(L, 1, "payload") == LUA_TNIL)
    return luaL_argerror(L, 1, "payload is required");
  char *json = jsonlua_encode(L, -1, err, sizeof err);
  if (!json)
    return luaL_argerror(L, 1, err);
  luatext_pushfree(L, json);                               /* 3: payload text */
  const char *tenant = (lua_getfield(L, 1, "tenant_id"), luaL_optstring(L, -1, NULL));   /* 4 */
  /* A worker scoped to some tenants cannot create work for others. */
  if (tenant && h->ntenants > 0) {
    int inside = 0;
    for (int i = 0; i < h->ntenants; i++)
      inside |= strcmp(h->tenants[i], tenant) == 0;
    if (!inside)
      return luaL_error(L, "leash.enqueue: tenant_id '%s' is outside this worker's --tenant scope",
                        tenant);
  }
  const char *shard = (lua_getfield(L, 1, "shard_key"), luaL_optstring(L, -1, NULL));    /* 5 */
  int has_batch = lua_getfield(L, 1, "batch") != LUA_TNIL;                               /* 6 */
  const char *batch = lua_isuserdata(L, -1) ? NULL : luaL_optstring(L, -1, NULL);
  const char *delay_p = NULL, *max_p = NULL;
  if (lua_getfield(L, 1, "delay") != LUA_TNIL) {
    lua_Number d = lua_tonumber(L, -1);
    if (!lua_isnumber(L, -1) || !(d >= 0) || !isfinite(d))
      return luaL_argerror(L, 1, "delay must be a number of seconds >= 0");
    snprintf(delay, sizeof delay, "%.3f", (double)d);
    delay_p = delay;
  }
  if (lua_getfield(L, 1, "max_attempts") != LUA_TNIL) {
    lua_Integer m = lua_tointeger(L, -1);
    if (!lua_isinteger(L, -1) || m < 1 || m > 2147483647)
      return luaL_argerror(L, 1, "max_attempts must be an integer >= 1");
    snprintf(max, sizeof max, "%lld", (long long)m);
    max_p = max;
  }
  const char *params[] = { tenant, shard, lua_tostring(L, 3), delay_p, max_p,
                           has_batch ? "true" : "false", batch, h->table, id, h->worker_id,
                           token };
  if (h->replay)   /* leash replay: the recorded child's id, nothing written (replay.h) */
    return replay_enqueue(L, h->replay);
  PGresult *r = pool_exec(L, "leash.enqueue", h->sql->enqueue, 11, params);
  if (PQntuples(r) != 1)
    return luaL_error(L, "leash.enqueue: lease lost: child task not enqueued");
  lua_pushinteger(L, strtoll(PQgetvalue(r, 0, 0), NULL, 10));
  record_enqueue(t, (long long)lua_tointeger(L, -1), lua_tostring(L, 3));
  result_free(L, -2);
  return 1;
}

/* leash.log.<level>(msg [, fields]): into the host's log, tagged with the task. Field
   values become text with tostring; a __tostring is the script's code and may do anything
   (raise, loop, change the fields table, let the collector free what was in it), so every
   string the line is made of is first copied into a keeper table this call owns, and C
   takes its pointers only after the last call that can run Lua or allocate. */
#define LOG_USER_FIELDS 19

static int log_at(lua_State *L, enum log_level lvl)
{
  luaL_checkstring(L, 1);
  if (!log_enabled(lvl))
    return 0;
  struct log_field f[LOG_USER_FIELDS + TASKCTX_LOG_FIELDS + 1];
  int n, kept = 0;
  char id[32], attempt[16];
  lua_settop(L, 2);
  lua_createtable(L, 2 * LOG_USER_FIELDS, 0);            /* 3: keeper: key, text, ... */
  if (lua_istable(L, 2)) {
    /* The raw pairs first: nothing here runs Lua, so the walk sees a table at rest. */
    lua_pushnil(L);
    while (kept < 2 * LOG_USER_FIELDS && lua_next(L, 2)) {   /* key -2, value -1 */
      if (lua_type(L, -2) == LUA_TSTRING) {
        lua_pushvalue(L, -2);
        lua_rawseti(L, 3, ++kept);
        lua_rawseti(L, 3, ++kept);                       /* pops the value */
      } else {
        lua_pop(L, 1);
      }
    }
    /* Then each value as text, in place in the keeper. */
    for (int i = 2; i <= kept; i += 2) {
      lua_rawgeti(L, 3, i - 1);
      const char *k = lua_tostring(L, -1);
      /* A secret put in a log field by mistake stays out of the log. */
      if (strcasecmp(k, "authorization") == 0 || strcasecmp(k, "password") == 0) {
        lua_pushliteral(L, "[redacted]");
      } else {
        lua_rawgeti(L, 3, i);
        luaL_tolstring(L, -1, NULL);
        lua_remove(L, -2);
      }
      lua_rawseti(L, 3, i);
      lua_pop(L, 1);                                     /* the key */
    }
  }
  /* From here on nothing runs Lua or allocates in the state: the pointers hold. */
  n = taskctx_log_fields(taskctx_of(L), f, id, attempt);
  for (int i = 1; i < kept; i += 2) {
    lua_rawgeti(L, 3, i);
    f[n].key = lua_tostring(L, -1);       /* a string in the keeper: no conversion */
    lua_rawgeti(L, 3, i + 1);
    f[n].value = lua_tostring(L, -1);
    lua_pop(L, 2);
    n++;
  }
  f[n] = (struct log_field){ NULL, NULL };
  log_fields(lvl, f, "%s", lua_tostring(L, 1));
  return 0;
}

static int l_log_debug(lua_State *L) { return log_at(L, LOG_DEBUG); }
static int l_log_info(lua_State *L) { return log_at(L, LOG_INFO); }
static int l_log_warn(lua_State *L) { return log_at(L, LOG_WARN); }
static int l_log_error(lua_State *L) { return log_at(L, LOG_ERROR); }
