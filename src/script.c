/* script: state, sandbox, loading and running handle(task). See script.h. */
#include "script.h"

#include "api.h"
#include "json_lua.h"
#include "log.h"
#include "sandbox.h"

#include <lauxlib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOAD_TIMEOUT_S 5.0
#define HOOK_EVERY 1000          /* instructions between clock checks */

struct script {
  lua_State *L;
  const struct script_host *host;
  int handle_ref;
  size_t mem_used, mem_limit;
  int refused;                 /* the cap refused an allocation during the current task */
  struct task *current;
  double deadline;             /* monotonic; 0 = none */
  const char *abort_reason;    /* set by the hook when it stops a task */
  enum outcome_cause abort_cause;
  int broken;
  char dir[1024];              /* the script's folder, for require of siblings */
  char version[17];
};

static void *limited_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
static int panic_handler(lua_State *L);
static int msg_handler(lua_State *L);
static void deadline_hook(lua_State *L, lua_Debug *ar);
static int load_protected(lua_State *L);
static int l_task_lease_lost(lua_State *L);
static char *read_file(const char *path, size_t *len, char *err, size_t errlen);
static void push_task(lua_State *L, struct script *s, struct task *t);
static void read_outcome(struct script *s, struct task *t, int base, int nret);

struct script *script_load(const char *path, const struct script_host *host, char *err,
                           size_t errlen)
{
  size_t len = 0;
  char *text = read_file(path, &len, err, errlen);
  if (!text)
    return NULL;
  struct script *s = script_load_text(path, text, len, host, err, errlen);
  free(text);
  return s;
}

char *script_read_file(const char *path, size_t *len, char *err, size_t errlen)
{
  return read_file(path, len, err, errlen);
}

struct script *script_load_text(const char *path, const char *text, size_t len,
                                const struct script_host *host, char *err, size_t errlen)
{
  struct script *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  s->host = host;
  s->handle_ref = LUA_NOREF;
  s->mem_limit = host->memory_limit;
  uint64_t h = 1469598103934665603ULL;   /* FNV-1a: a version name, not a security hash */
  for (size_t i = 0; i < len; i++)
    h = (h ^ (unsigned char)text[i]) * 1099511628211ULL;
  snprintf(s->version, sizeof s->version, "%016llx", (unsigned long long)h);
  const char *slash = strrchr(path, '/');
  if (slash)
    snprintf(s->dir, sizeof s->dir, "%.*s", (int)(slash - path), path);
  else
    snprintf(s->dir, sizeof s->dir, ".");

  s->L = lua_newstate(limited_alloc, s);
  if (!s->L) {
    snprintf(err, errlen, "cannot create a Lua state (out of memory)");
    goto fail;
  }
  lua_atpanic(s->L, panic_handler);
  *(struct script **)lua_getextraspace(s->L) = s;

  /* Everything from here runs protected, so a memory error is a message, not a panic. */
  s->deadline = task_now() + LOAD_TIMEOUT_S;
  lua_sethook(s->L, deadline_hook, LUA_MASKCOUNT, HOOK_EVERY);
  lua_pushcfunction(s->L, msg_handler);
  lua_pushcfunction(s->L, load_protected);
  lua_pushlightuserdata(s->L, (void *)text);
  lua_pushinteger(s->L, (lua_Integer)len);
  lua_pushstring(s->L, path);
  int rc = lua_pcall(s->L, 3, 1, 1);
  lua_sethook(s->L, NULL, 0, 0);
  s->deadline = 0;
  if (rc != LUA_OK) {
    const char *msg = lua_tostring(s->L, -1);
    snprintf(err, errlen, "%s", s->abort_reason ? "script took too long to load"
                                : msg ? msg : "error loading script");
    /* One line for a load error: file:line: message. The traceback adds nothing here. */
    char *tb = strstr(err, "\nstack traceback:");
    if (tb)
      *tb = '\0';
    goto fail;
  }
  s->handle_ref = luaL_ref(s->L, LUA_REGISTRYINDEX);
  lua_settop(s->L, 0);
  return s;
fail:
  script_free(s);
  return NULL;
}

void script_free(struct script *s)
{
  if (!s)
    return;
  if (s->L)
    lua_close(s->L);
  free(s);
}

const char *script_version(const struct script *s)
{
  return s->version;
}

int script_broken(const struct script *s)
{
  return s->broken;
}

struct script *script_of(lua_State *L)
{
  return *(struct script **)lua_getextraspace(L);
}

const char *script_dir(const struct script *s)
{
  return s->dir;
}

const struct script_host *script_host_of(const struct script *s)
{
  return s->host;
}

struct task *script_task(const struct script *s)
{
  return s->current;
}

double script_time_left(const struct script *s)
{
  return s->deadline > 0 ? s->deadline - task_now() : 1e9;
}

void script_check_live(lua_State *L, const char *what)
{
  struct script *s = script_of(L);
  if (!s->current)
    luaL_error(L, "%s: only available while a task runs", what);
  if (!task_lease_alive(s->current))
    luaL_error(L, "%s: lease lost: the task's side effects are stopped", what);
  if (atomic_load(s->host->stopping))
    luaL_error(L, "%s: the worker is stopping", what);
}

void script_run(struct script *s, struct task *t)
{
  lua_State *L = s->L;
  double start = task_now();
  s->current = t;
  s->abort_reason = NULL;
  s->deadline = s->host->task_timeout > 0 ? start + s->host->task_timeout : 0;
  lua_settop(L, 0);
  lua_pushcfunction(L, msg_handler);
  int base = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->handle_ref);
  push_task(L, s, t);
  lua_sethook(L, deadline_hook, LUA_MASKCOUNT, HOOK_EVERY);
  s->refused = 0;
  int rc = lua_pcall(L, 1, LUA_MULTRET, base);
  lua_sethook(L, NULL, 0, 0);
  t->duration = task_now() - start;
  /* Judged by the allocator, not by the error's status: C code (leash.json, a pcall that
     re-raises) may pass a memory error on as an ordinary one, and a script may catch it. */
  if (rc == LUA_OK) {
    read_outcome(s, t, base, lua_gettop(L) - base);
    if (s->refused)
      s->broken = 1;   /* the script caught it: its outcome stands, the state is rebuilt */
  } else if (rc == LUA_ERRMEM || s->refused) {
    s->broken = 1;
    char msg[96];
    snprintf(msg, sizeof msg, "out of memory (the slot's limit is %zu MB)",
             s->mem_limit / (1024 * 1024));
    outcome_set(&t->out, OUTCOME_RETRY, CAUSE_MEMORY, NULL, msg);
  } else if (s->abort_reason) {
    outcome_set(&t->out, OUTCOME_RETRY, s->abort_cause, NULL, s->abort_reason);
  } else {
    const char *msg = lua_tostring(L, -1);
    outcome_set(&t->out, OUTCOME_RETRY, CAUSE_ERROR, NULL, msg ? msg : "error without a message");
  }
  lua_settop(L, 0);
  s->current = NULL;
  s->deadline = 0;
  /* A task's garbage should not count against the next task's memory: past a quarter of
     the cap, collect it all now. Below that the incremental collector keeps up; a task that
     reaches the cap with garbage left makes Lua collect in full and try again (the state is
     then rebuilt after the task, as after any refusal). A full collection after every task
     cost 9 % of a one-row worker's CPU (perf), most of it walking the libraries. C resources
     (query results, HTTP handles) are freed where they are used, not by the collector. */
  if (s->mem_limit && s->mem_used > s->mem_limit / 4)
    lua_gc(L, LUA_GCCOLLECT);
}

/* [-(nret), +0, m] What handle returned, as SPEC.md's table maps it. */
static void read_outcome(struct script *s, struct task *t, int base, int nret)
{
  lua_State *L = s->L;
  int v = base + 1;
  const char *kind;
  char err[512];
  if (nret == 0 || lua_isnil(L, v) || (lua_isboolean(L, v) && lua_toboolean(L, v))) {
    t->out.kind = OUTCOME_SUCCESS;
    return;
  }
  if (lua_isboolean(L, v)) {   /* false, msg */
    outcome_set(&t->out, OUTCOME_RETRY, CAUSE_RETURNED, NULL,
                nret >= 2 && lua_type(L, v + 1) != LUA_TNIL ? luaL_tolstring(L, v + 1, NULL)
                                                            : "handle returned false");
    return;
  }
  if ((kind = api_outcome_kind(L, v)) != NULL) {
    if (strcmp(kind, "ok") == 0) {
      t->out.kind = OUTCOME_SUCCESS;
      lua_getfield(L, v, "result");
      if (!lua_isnil(L, -1)) {
        t->out.result = jsonlua_encode(L, -1, err, sizeof err);
        if (!t->out.result)
          outcome_set(&t->out, OUTCOME_RETRY, CAUSE_CONTRACT,
                      "leash.ok: result cannot be stored as JSON: ", err);
      }
      return;
    }
    lua_getfield(L, v, "message");
    outcome_set(&t->out, strcmp(kind, "retry") == 0 ? OUTCOME_RETRY : OUTCOME_FATAL,
                CAUSE_RETURNED, NULL, lua_tostring(L, -1) ? lua_tostring(L, -1) : kind);
    lua_getfield(L, v, "delay");
    if (lua_isnumber(L, -1))
      t->out.delay = lua_tonumber(L, -1);
    return;
  }
  snprintf(err, sizeof err, "handle returned a %s; return nothing, true, leash.ok(result), "
           "false, msg, leash.retry(msg) or leash.fatal(msg)", luaL_typename(L, v));
  outcome_set(&t->out, OUTCOME_RETRY, CAUSE_CONTRACT, NULL, err);
}

/* [-0, +1, m] The task table handed to handle. */
static void push_task(lua_State *L, struct script *s, struct task *t)
{
  char err[256];
  lua_createtable(L, 0, 10);
  lua_pushinteger(L, t->id);
  lua_setfield(L, -2, "id");
  lua_pushstring(L, t->tenant_id);
  lua_setfield(L, -2, "tenant_id");
  lua_pushstring(L, t->shard_key);
  lua_setfield(L, -2, "shard_key");
  lua_pushinteger(L, t->attempt);
  lua_setfield(L, -2, "attempt");
  lua_pushinteger(L, t->max_attempts);
  lua_setfield(L, -2, "max_attempts");
  lua_pushstring(L, s->host->worker_id);
  lua_setfield(L, -2, "worker_id");
  if (t->batch) {
    lua_pushstring(L, t->batch);
    lua_setfield(L, -2, "batch");
  }
  if (jsonlua_decode(L, t->payload, strlen(t->payload), err, sizeof err) != 0)
    lua_pushstring(L, t->payload);   /* jsonb text always decodes; keep the text otherwise */
  lua_setfield(L, -2, "payload");
  /* lease_lost reads the task by id, so a task table kept past its run answers true
     instead of reading freed memory. */
  lua_pushinteger(L, t->id);
  lua_pushcclosure(L, l_task_lease_lost, 1);
  lua_setfield(L, -2, "lease_lost");
}

static int l_task_lease_lost(lua_State *L)
{
  struct script *s = script_of(L);
  lua_Integer id = lua_tointeger(L, lua_upvalueindex(1));
  int lost = !s->current || s->current->id != id || !task_lease_alive(s->current);
  lua_pushboolean(L, lost);
  return 1;
}

/* Runs inside lua_pcall: builds the environment, loads and runs the chunk, checks the
   contract, runs setup, freezes the load-time globals. Arguments: text (light userdata),
   length, path. Returns the per-task entry around handle (sandbox.h). */
static int load_protected(lua_State *L)
{
  const char *text = lua_touserdata(L, 1);
  size_t len = (size_t)lua_tointeger(L, 2);
  const char *path = lua_tostring(L, 3);
  sandbox_open(L);

  lua_pushfstring(L, "@%s", path);
  if (luaL_loadbufferx(L, text, len, lua_tostring(L, -1), "t") != LUA_OK)
    return lua_error(L);
  sandbox_bind_chunk(L, -1);       /* the chunk's _ENV: the load-time globals */
  lua_call(L, 0, 1);
  if (!lua_isfunction(L, -1)) {
    if (!lua_istable(L, -1))
      return luaL_error(L, "%s: the script must return handle(task) or { handle = ..., "
                        "setup = ... }, not a %s", path, luaL_typename(L, -1));
    int mod = lua_gettop(L);
    if (lua_getfield(L, mod, "setup") != LUA_TNIL) {
      if (!lua_isfunction(L, -1))
        return luaL_error(L, "%s: setup must be a function", path);
      lua_call(L, 0, 0);
    } else {
      lua_pop(L, 1);
    }
    if (lua_getfield(L, mod, "handle") != LUA_TFUNCTION)
      return luaL_error(L, "%s: the returned table has no handle function", path);
  }
  sandbox_freeze(L);
  sandbox_wrap_handle(L);
  return 1;
}

/* The message handler: text for any error value, plus a traceback. */
static int msg_handler(lua_State *L)
{
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Stops the running code once the task is over its deadline, its lease is lost or the
   worker must stop now. Another thread never touches the state: it only sets flags read
   here. After tripping, the hook fires on every instruction, so a script's own pcall
   cannot swallow the stop. */
static void deadline_hook(lua_State *L, lua_Debug *ar)
{
  (void)ar;
  script_check_deadline(L);
}

/* The hook's check, also called by the sandbox's library loops (sandbox.c), which run in
   C where the hook never fires. */
void script_check_deadline(lua_State *L)
{
  struct script *s = script_of(L);
  const char *why = NULL;
  enum outcome_cause cause = CAUSE_TIMEOUT;
  if (s->deadline > 0 && task_now() > s->deadline) {
    why = s->current ? "task timed out (--task-timeout)" : "script took too long to load";
  } else if (s->current && !task_lease_alive(s->current)) {
    why = "lease lost";
    cause = CAUSE_LEASE_LOST;
  } else if (atomic_load(s->host->stopping)) {
    why = "worker stopping";
    cause = CAUSE_STOPPING;
  }
  if (!why)
    return;
  s->abort_reason = why;
  s->abort_cause = cause;
  lua_sethook(L, deadline_hook, LUA_MASKCOUNT, 1);
  luaL_error(L, "%s", why);
}

/* lua_Alloc with a cap: only growth is refused, never a free or a shrink (ltests.c's
   debug_realloc is the model). When ptr is NULL, osize is a type tag, not a size. */
static void *limited_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
  struct script *s = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    s->mem_used -= old;
    return NULL;
  }
  if (s->mem_limit && nsize > old && s->mem_used + (nsize - old) > s->mem_limit) {
    s->refused = 1;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (p)
    s->mem_used = s->mem_used - old + nsize;
  return p;
}

static int panic_handler(lua_State *L)
{
  const char *msg = lua_tostring(L, -1);
  log_error("Lua panic (unprotected error): %s", msg ? msg : "?");
  abort();
  return 0;
}

static char *read_file(const char *path, size_t *len, char *err, size_t errlen)
{
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %m", path);
    return NULL;
  }
  char *buf = NULL;
  size_t cap = 0, n = 0, got;
  do {
    if (n + 4096 > cap) {
      cap = cap ? cap * 2 : 8192;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        snprintf(err, errlen, "out of memory reading %s", path);
        return NULL;
      }
      buf = nb;
    }
    got = fread(buf + n, 1, cap - n, f);
    n += got;
  } while (got > 0);
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    snprintf(err, errlen, "cannot read %s", path);
    return NULL;
  }
  *len = n;
  return buf;
}
