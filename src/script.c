/* script: state, sandbox, loading and running handle(task). See script.h. */
#include "script.h"

#include "api.h"
#include "json_lua.h"
#include "lifecycle.h"
#include "log.h"
#include "record.h"
#include "sandbox.h"
#include "textfile.h"

#include <lauxlib.h>
#include <openssl/evp.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOAD_TIMEOUT_S 5.0

struct script {
  lua_State *L;
  const struct script_host *host;
  /* What the host API and the sandbox see (task_context.h): the task, its deadline, why
     the hook stopped it. Attached to the state's extra space. */
  struct task_ctx ctx;
  int handle_ref;
  size_t mem_used, mem_limit;
  int refused;                 /* the cap refused an allocation during the current task */
  int broken;
  char dir[1024];              /* the script's folder, for require of siblings */
  char version[SCRIPT_VERSION_LEN + 1];
  char label[TASK_LABEL_MAX + 1];
  EVP_MD_CTX *hash;            /* while loading: the script's text and each module's */
};

static void *limited_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
static int panic_handler(lua_State *L);
static int msg_handler(lua_State *L);
static int tostring_protected(lua_State *L);
static int ref_protected(lua_State *L);
static int load_protected(lua_State *L);
static int read_label(lua_State *L, int mod, const char *path);
static int l_task_lease_lost(lua_State *L);
static void hash_part(struct script *s, const char *name, const char *text, size_t len);
static void module_read(struct task_ctx *c, const char *name, const char *text, size_t len);
struct run_ctx;
static void push_task(lua_State *L, struct run_ctx *c);
static void read_outcome(lua_State *L, struct outcome *o, int v, int nret);
static int run_protected(lua_State *L);
static size_t payload_lua_bytes(const char *text, size_t len);

struct script *script_load(const char *path, const struct script_host *host, char *err,
                           size_t errlen)
{
  size_t len = 0;
  char *text = textfile_read(path, &len, err, errlen);
  if (!text)
    return NULL;
  struct script *s = script_load_text(path, text, len, host, err, errlen);
  free(text);
  return s;
}

char *script_read_file(const char *path, size_t *len, char *err, size_t errlen)
{
  return textfile_read(path, len, err, errlen);
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
  s->ctx = (struct task_ctx){ .host = host, .dir = s->dir, .module_read = module_read };
  s->handle_ref = LUA_NOREF;
  s->mem_limit = host->memory_limit;
  /* The version: SHA-256 over the script's text and every module loaded with it, so two
     pods that differ in one module file never share a version id. */
  s->hash = EVP_MD_CTX_new();
  if (!s->hash || !EVP_DigestInit_ex(s->hash, EVP_sha256(), NULL)) {
    snprintf(err, errlen, "cannot hash the script (out of memory)");
    goto fail;
  }
  hash_part(s, "", text, len);   /* the main chunk: its text, not where it lies */
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
  taskctx_attach(s->L, &s->ctx);

  /* Everything from here runs protected, so a memory error is a message, not a panic. */
  taskctx_begin(s->L, NULL, LOAD_TIMEOUT_S);
  lua_pushcfunction(s->L, msg_handler);
  lua_pushcfunction(s->L, load_protected);
  lua_pushlightuserdata(s->L, (void *)text);
  lua_pushinteger(s->L, (lua_Integer)len);
  lua_pushstring(s->L, path);
  int rc = lua_pcall(s->L, 3, 1, 1);
  taskctx_end(s->L);
  if (rc != LUA_OK) {
    const char *msg = lua_type(s->L, -1) == LUA_TSTRING ? lua_tostring(s->L, -1) : NULL;
    snprintf(err, errlen, "%s", s->ctx.stop_reason ? "script took too long to load"
                                : msg ? msg : "error loading script");
    /* One line for a load error: file:line: message. The traceback adds nothing here. */
    char *tb = strstr(err, "\nstack traceback:");
    if (tb)
      *tb = '\0';
    goto fail;
  }
  /* The reference may grow the registry: protected too, as a setup may have left the state
     at its cap. */
  lua_pushcfunction(s->L, ref_protected);
  lua_insert(s->L, -2);
  if (lua_pcall(s->L, 1, 1, 0) != LUA_OK) {
    snprintf(err, errlen, "out of memory after setup (the slot's limit is %zu MB)",
             s->mem_limit / (1024 * 1024));
    goto fail;
  }
  s->handle_ref = (int)lua_tointeger(s->L, -1);
  lua_settop(s->L, 0);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned mdlen = 0;
  if (!EVP_DigestFinal_ex(s->hash, md, &mdlen) || mdlen * 2 != SCRIPT_VERSION_LEN) {
    snprintf(err, errlen, "cannot hash the script");
    goto fail;
  }
  for (unsigned i = 0; i < mdlen; i++)
    snprintf(s->version + 2 * i, 3, "%02x", md[i]);
  EVP_MD_CTX_free(s->hash);
  s->hash = NULL;
  return s;
fail:
  script_free(s);
  return NULL;
}

void script_free(struct script *s)
{
  if (!s)
    return;
  EVP_MD_CTX_free(s->hash);
  if (s->L)
    lua_close(s->L);
  free(s);
}

/* One part of the version: its name, length and text, so no two sets of parts hash alike. */
static void hash_part(struct script *s, const char *name, const char *text, size_t len)
{
  char head[32];
  int n = snprintf(head, sizeof head, "%zu:", len);
  EVP_DigestUpdate(s->hash, name, strlen(name) + 1);
  EVP_DigestUpdate(s->hash, head, (size_t)n);
  EVP_DigestUpdate(s->hash, text, len);
}

/* A module require read adds to the version while loading; one first required by a task
   is that task's own (s->hash is gone by then). */
static void module_read(struct task_ctx *c, const char *name, const char *text, size_t len)
{
  struct script *s = (struct script *)((char *)c - offsetof(struct script, ctx));
  if (s->hash)
    hash_part(s, name, text, len);
}

const char *script_version(const struct script *s)
{
  return s->version;
}

const char *script_label(const struct script *s)
{
  return s->label;
}

int script_broken(const struct script *s)
{
  return s->broken;
}

/* What one run gathers inside the protected call (run_protected). Outside it, script_run
   reads only these plain C fields: nothing of the state's values. */
struct run_ctx {
  struct script *s;
  struct task *t;
  struct outcome out;          /* read from handle's answer; moved to t->out */
  enum { STAGE_TASK, STAGE_HANDLE, STAGE_OUTCOME } stage;
  int handle_rc;               /* handle's lua_pcall status */
  int payload_refused;         /* the payload cannot fit the cap: refused before decoding */
  char *handle_err;            /* its error value as text (malloc'd), or NULL */
};

void script_run(struct script *s, struct task *t)
{
  lua_State *L = s->L;
  double start = task_now();
  t->run_start = start;   /* the run's start, written at settle: queue wait vs run time */
  struct run_ctx c = { .s = s, .t = t, .stage = STAGE_TASK, .handle_rc = LUA_OK };
  c.out.delay = -1;
  s->refused = 0;
  /* Nothing between here and the end of lua_pcall can raise outside it: a light C function
     and a light userdata take no memory, and the stack has LUA_MINSTACK free slots. */
  lua_settop(L, 0);
  record_begin(t, s->version);   /* record.h: nothing when --record none */
  taskctx_begin(L, t, s->host->task_timeout);
  lua_pushcfunction(L, run_protected);
  lua_pushlightuserdata(L, &c);
  int rc = lua_pcall(L, 1, 0, 0);
  taskctx_end(L);
  t->duration = task_now() - start;
  /* A failure outside handle's own call (building the task, reading its answer) left its
     error value on the stack; only a string is read (lua_tostring converts nothing then). */
  const char *outer = rc != LUA_OK && lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
  char msg[600];
  outcome_clear(&t->out);
  if (rc == LUA_OK && c.handle_rc == LUA_OK) {
    t->out = c.out;            /* moved: c.out is not freed below */
    c.out = (struct outcome){ .delay = -1 };
    /* Judged by the allocator, not by the error's status: C code (leash.json, a pcall that
       re-raises) may pass a memory error on as an ordinary one, and a script may catch it.
       Caught, the outcome stands, but the state is rebuilt. */
    if (s->refused)
      s->broken = 1;
  } else if (rc == LUA_ERRMEM || c.handle_rc == LUA_ERRMEM || s->refused || c.payload_refused) {
    if (!c.payload_refused || s->refused)
      s->broken = 1;   /* the state met its cap; one refused before decoding did not */
    snprintf(msg, sizeof msg, "out of memory (the slot's limit is %zu MB)%s%s%s",
             s->mem_limit / (1024 * 1024),
             c.stage == STAGE_TASK ? " building the task table (is the payload too big?)"
             : c.stage == STAGE_OUTCOME ? " reading handle's answer" : "",
             c.payload_refused && outer ? ": " : "", c.payload_refused && outer ? outer : "");
    outcome_set(&t->out, OUTCOME_RETRY, CAUSE_MEMORY, NULL, msg);
  } else if (s->ctx.stop_reason && s->ctx.stop_cause == CAUSE_WAITING && s->ctx.wait_spec[0]) {
    /* A yield into a wait (taskctx_yield_wait: leash.llm.batch) is leash.wait's outcome. */
    outcome_set(&t->out, OUTCOME_WAIT, CAUSE_WAITING, NULL, s->ctx.stop_reason);
    if (!(t->out.result = strdup(s->ctx.wait_spec)))
      outcome_set(&t->out, OUTCOME_RETRY, CAUSE_MEMORY, NULL, "out of memory keeping a wait");
  } else if (s->ctx.stop_reason) {
    /* A yield (taskctx_yield: a budget's wait) is a snooze, the attempt given back. */
    outcome_set(&t->out, s->ctx.stop_cause == CAUSE_BUDGET ? OUTCOME_SNOOZE : OUTCOME_RETRY,
                s->ctx.stop_cause, NULL, s->ctx.stop_reason);
    if (s->ctx.stop_delay >= 0)   /* the yield says when to run again (capped like a delay) */
      t->out.delay = s->ctx.stop_delay > LIFECYCLE_BACKOFF_CAP_S ? LIFECYCLE_BACKOFF_CAP_S
                                                                 : s->ctx.stop_delay;
  } else if (c.handle_rc != LUA_OK) {
    outcome_set(&t->out, OUTCOME_RETRY, CAUSE_ERROR,
                c.handle_rc == LUA_ERRERR ? "error while handling an error: " : NULL,
                c.handle_err ? c.handle_err : "error without a message");
  } else if (c.stage == STAGE_OUTCOME) {
    /* handle returned, but reading its answer raised: a __tostring that raised or did not
       give a string, say. The script's fault, not the worker's. */
    outcome_set(&t->out, OUTCOME_RETRY, CAUSE_CONTRACT, "handle's answer could not be read: ",
                outer ? outer : "(error object is not a string)");
  } else {
    outcome_set(&t->out, OUTCOME_RETRY, CAUSE_ERROR, "the task table could not be built: ",
                outer ? outer : "(error object is not a string)");
  }
  outcome_clear(&c.out);
  free(c.handle_err);
  lua_settop(L, 0);
  /* A task's garbage should not count against the next task's memory: past a quarter of
     the cap, collect it all now. Below that the incremental collector keeps up; a task that
     reaches the cap with garbage left makes Lua collect in full and try again (the state is
     then rebuilt after the task, as after any refusal). A full collection after every task
     cost 9 % of a one-row worker's CPU (perf), most of it walking the libraries. C resources
     (query results, HTTP handles) are freed where they are used, not by the collector. */
  if (s->mem_limit && s->mem_used > s->mem_limit / 4)
    lua_gc(L, LUA_GCCOLLECT);
}

/* The whole run in one protected call: the task table (the payload's decoding may run out
   of memory), handle under its message handler, and the reading of its answer (which may
   call __tostring and allocate). Whatever raises here ends up in script_run's lua_pcall,
   never in the panic handler. Arg 1: the run_ctx. */
static int run_protected(lua_State *L)
{
  struct run_ctx *c = lua_touserdata(L, 1);
  struct script *s = c->s;
  lua_settop(L, 0);
  /* Every encoding in the state (results, json.encode, step results, query parameters)
     stops at the result limit: its text lives outside the Lua heap and the memory cap. */
  jsonlua_set_max_bytes(L, s->host->max_result_bytes);
  lua_pushcfunction(L, msg_handler);                       /* 1 */
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->handle_ref);
  push_task(L, c);
  c->stage = STAGE_HANDLE;
  c->handle_rc = lua_pcall(L, 1, LUA_MULTRET, 1);
  if (c->handle_rc != LUA_OK) {
    /* The message handler made the value a string unless the failure bypassed it (a
       memory error's message is a string too). */
    if (lua_type(L, -1) == LUA_TSTRING)
      c->handle_err = strndup(lua_tostring(L, -1), OUTCOME_ERROR_MAX);
    return 0;
  }
  c->stage = STAGE_OUTCOME;
  read_outcome(L, &c->out, 2, lua_gettop(L) - 1);
  return 0;
}

/* [-0, +0, e] What handle returned (the values from v on, nret of them), as SPEC.md's
   table maps it, into o: everything it keeps is copied to C memory. May raise (a
   __tostring, memory): it runs inside run_protected. */
static void read_outcome(lua_State *L, struct outcome *o, int v, int nret)
{
  const char *kind;
  char err[512];
  int too_big = 0;
  /* nil, msg is a failure with msg (the Lua idiom, as io.open's); false, msg the same */
  int failed = nret >= 1 && (lua_isboolean(L, v) ? !lua_toboolean(L, v)
                             : lua_isnil(L, v) && nret >= 2 && !lua_isnil(L, v + 1));
  if (!failed && (nret == 0 || lua_isnil(L, v) || lua_isboolean(L, v))) {
    o->kind = OUTCOME_SUCCESS;
    return;
  }
  if (failed) {
    if (nret >= 2 && !lua_isnil(L, v + 1)) {
      luaL_tolstring(L, v + 1, NULL);                      /* may raise: protected */
      outcome_set(o, OUTCOME_RETRY, CAUSE_RETURNED, NULL, lua_tostring(L, -1));
      lua_pop(L, 1);
    } else {
      outcome_set(o, OUTCOME_RETRY, CAUSE_RETURNED, NULL, "handle returned false");
    }
    return;
  }
  if ((kind = api_outcome_kind(L, v)) != NULL) {
    if (strcmp(kind, "ok") == 0) {
      o->kind = OUTCOME_SUCCESS;
      lua_getfield(L, v, "result");
      if (!lua_isnil(L, -1)) {
        size_t max = jsonlua_max_bytes(L);
        o->result = jsonlua_encode_max(L, -1, max, &too_big, err, sizeof err);
        if (!o->result && too_big)
          outcome_set(o, OUTCOME_RETRY, CAUSE_MEMORY,
                      "leash.ok: result too large to store (--max-result-bytes): ", err);
        else if (!o->result)
          outcome_set(o, OUTCOME_RETRY, CAUSE_CONTRACT,
                      "leash.ok: result cannot be stored as JSON: ", err);
      }
      lua_pop(L, 1);
      return;
    }
    /* A wait carries its spec (leash.wait wrote it, checked) to the settle as JSON. */
    if (strcmp(kind, "wait") == 0) {
      lua_getfield(L, v, "message");
      outcome_set(o, OUTCOME_WAIT, CAUSE_WAITING, NULL,
                  lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "waiting");
      lua_pop(L, 1);
      if (lua_getfield(L, v, "spec") != LUA_TSTRING || lua_rawlen(L, -1) < 2 ||
          lua_tostring(L, -1)[0] != '{' || !(o->result = strdup(lua_tostring(L, -1))))
        outcome_set(o, OUTCOME_RETRY, CAUSE_CONTRACT, NULL,
                    "leash.wait's answer lost its spec: return leash.wait{...} unchanged");
      lua_pop(L, 1);
      return;
    }
    /* The fields are the script's to change after leash.retry made them: read each with
       its type checked, nothing converted. A snooze is a retry that gives its attempt back
       (the settle decides whether the row has a snooze left, sql/012). */
    enum outcome_kind k = strcmp(kind, "retry") == 0    ? OUTCOME_RETRY
                          : strcmp(kind, "snooze") == 0 ? OUTCOME_SNOOZE
                                                        : OUTCOME_FATAL;
    lua_getfield(L, v, "message");
    outcome_set(o, k, k == OUTCOME_SNOOZE ? CAUSE_SNOOZED : CAUSE_RETURNED, NULL,
                lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : kind);
    lua_pop(L, 1);
    /* A snooze must name its delay; a retry may (else the backoff). */
    if (k != OUTCOME_FATAL &&
        (lua_getfield(L, v, "delay") != LUA_TNIL || k == OUTCOME_SNOOZE)) {
      lua_Number d = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : -1;
      if (lua_type(L, -1) != LUA_TNUMBER || !(d >= 0) || !isfinite(d)) {
        if (lua_type(L, -1) != LUA_TNUMBER)
          snprintf(err, sizeof err, "a %s", luaL_typename(L, -1));
        else if (isnan(d) || isinf(d))
          snprintf(err, sizeof err, "%s", isnan(d) ? "NaN" : d > 0 ? "inf" : "-inf");
        else
          snprintf(err, sizeof err, "%g", (double)d);
        char why[640];
        snprintf(why, sizeof why, "%s delay must be a finite number of seconds >= 0, "
                 "not %s (message: %s)", kind, err, o->error ? o->error : "");
        outcome_set(o, OUTCOME_RETRY, CAUSE_CONTRACT, NULL, why);
      } else {
        /* A delay past LIFECYCLE_MAX_DELAY_S is cut to it: no row waits longer on a
           script's word, whatever an upstream's Retry-After said. */
        o->delay = d > LIFECYCLE_MAX_DELAY_S ? LIFECYCLE_MAX_DELAY_S : d;
      }
      lua_pop(L, 1);
    }
    return;
  }
  snprintf(err, sizeof err, "handle returned a %s; return nothing, true, leash.ok(result), "
           "nil or false with a message, leash.retry(msg), leash.snooze(s) or leash.fatal(msg)",
           luaL_typename(L, v));
  outcome_set(o, OUTCOME_RETRY, CAUSE_CONTRACT, NULL, err);
}

/* [-0, +1, m] The task table handed to handle. */
static void push_task(lua_State *L, struct run_ctx *c)
{
  struct script *s = c->s;
  struct task *t = c->t;
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
  size_t len = strlen(t->payload);
  /* jansson builds the whole tree in host memory before Lua sees it, at about three times
     what the Lua tables will take: a payload whose Lua form cannot fit the cap is refused
     before that tree is built (5,000,000 empty objects are 15 MB of text, 1 GB in jansson). */
  size_t need = s->mem_limit ? payload_lua_bytes(t->payload, len) : 0;
  if (s->mem_limit && need / 4 * 3 > s->mem_limit) {   /* a margin for other builds' sizes */
    c->payload_refused = 1;
    luaL_error(L, "the payload needs at least %d MB as Lua values",
               (int)(need / (1024 * 1024)));
  }
  if (jsonlua_decode(L, t->payload, len, err, sizeof err) != 0)
    lua_pushstring(L, t->payload);   /* jsonb text always decodes; keep the text otherwise */
  lua_setfield(L, -2, "payload");
  /* lease_lost reads the task by id, so a task table kept past its run answers true
     instead of reading freed memory. */
  lua_pushinteger(L, t->id);
  lua_pushcclosure(L, l_task_lease_lost, 1);
  lua_setfield(L, -2, "lease_lost");
}

/* A lower bound of the Lua memory JSON text decodes to: 56 bytes a table (sizeof(Table) on
   64-bit Lua 5.4), 24 an object member (a hash Node), 16 an array element (a TValue); strings
   are not counted (equal short strings are shared). Never above what Lua needs, so a payload
   that fits is never refused. Strings are skipped with their escapes; nesting past the bit
   stack's depth (jansson refuses it anyway) is counted as objects. */
static size_t payload_lua_bytes(const char *text, size_t len)
{
  enum { MAX_TRACKED = 4096 };
  unsigned char in_array[MAX_TRACKED / 8] = { 0 };
  size_t depth = 0, bytes = 0;
  int after_open = 0;        /* the last token opened a container */
  for (size_t i = 0; i < len; i++) {
    char c = text[i];
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r')
      continue;
    size_t d = depth - 1;
    int arr = depth > 0 && depth <= MAX_TRACKED && (in_array[d / 8] >> (d % 8) & 1);
    if (after_open && arr && c != ']')
      bytes += 16;           /* an array's first element: no comma before it */
    after_open = 0;
    switch (c) {
    case '"':
      for (i++; i < len && text[i] != '"'; i++)
        if (text[i] == '\\')
          i++;
      break;
    case '{':
    case '[':
      depth++;
      d = depth - 1;
      if (depth <= MAX_TRACKED) {
        if (c == '[')
          in_array[d / 8] |= (unsigned char)(1u << (d % 8));
        else
          in_array[d / 8] &= (unsigned char)~(1u << (d % 8));
      }
      bytes += 56;
      after_open = 1;
      break;
    case '}':
    case ']':
      if (depth > 0)
        depth--;
      break;
    case ':':
      bytes += 24;
      break;
    case ',':
      if (arr)
        bytes += 16;
      break;
    }
  }
  return bytes;
}

static int l_task_lease_lost(lua_State *L)
{
  const struct task *t = taskctx_of(L)->task;
  lua_Integer id = lua_tointeger(L, lua_upvalueindex(1));
  int lost = !t || t->id != id || !task_lease_alive(t);
  lua_pushboolean(L, lost);
  return 1;
}

/* The module's optional `label` (for the attempt history) into the script's label; 0, or
   -1 with the message pushed. A label is for people and report keys: short and one line. */
static int read_label(lua_State *L, int mod, const char *path)
{
  void *ud = NULL;
  lua_getallocf(L, &ud);   /* limited_alloc's: the script */
  struct script *s = ud;
  int type = lua_getfield(L, mod, "label");
  size_t len = 0;
  const char *v = type == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
  int ok = type == LUA_TNIL || (v && len >= 1 && len <= TASK_LABEL_MAX);
  for (size_t i = 0; ok && v && i < len; i++)
    if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f)
      ok = 0;
  if (!ok) {
    lua_pushfstring(L, "%s: label must be a string of 1 to %d bytes without control "
                    "characters", path, TASK_LABEL_MAX);
    return -1;
  }
  if (v)
    memcpy(s->label, v, len + 1);
  lua_pop(L, 1);
  return 0;
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
    if (read_label(L, mod, path) != 0)
      return lua_error(L);
  }
  sandbox_freeze(L);
  sandbox_wrap_handle(L);
  return 1;
}

/* Protected body of the handle's registry reference: arg 1 is handle; returns the ref. */
static int ref_protected(lua_State *L)
{
  lua_pushinteger(L, luaL_ref(L, LUA_REGISTRYINDEX));
  return 1;
}

/* Protected body of msg_handler's __tostring call: arg 1 is the error value. */
static int tostring_protected(lua_State *L)
{
  luaL_tolstring(L, 1, NULL);
  return 1;
}

/* The message handler: text for any error value, plus a traceback for a string. A value's
   __tostring is the script's code: it runs in a protected call of its own, so one that
   raises, returns a non-string or frees things ends here as a message, never as an error in
   the handler (LUA_ERRERR) or a panic; one that loops is stopped by the count hook. */
static int msg_handler(lua_State *L)
{
  const char *msg = NULL;
  int t = lua_type(L, 1);
  if (t == LUA_TSTRING || t == LUA_TNUMBER) {
    msg = lua_tostring(L, 1);
  } else if (luaL_getmetafield(L, 1, "__tostring") != LUA_TNIL) {   /* raw: no metamethod */
    lua_pop(L, 1);
    lua_pushcfunction(L, tostring_protected);
    lua_pushvalue(L, 1);
    if (lua_pcall(L, 1, 1, 0) == LUA_OK)
      return 1;                                    /* the script's own text, as it is */
    msg = lua_pushfstring(L, "(error object is a %s value whose __tostring failed: %s)",
                          luaL_typename(L, 1), lua_type(L, -1) == LUA_TSTRING
                                                   ? lua_tostring(L, -1) : "no message");
  }
  if (msg == NULL)
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
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

/* Last resort: every call into the state that can raise runs under lua_pcall (script_run,
   script_load_text), so reaching this is a bug in leash, not in a script. Lua aborts when
   the handler returns; it is logged first so the bug can be found. */
static int panic_handler(lua_State *L)
{
  const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
  log_error("Lua panic, a bug in leash (an error raised outside any protected call): %s",
            msg ? msg : "(error object is not a string)");
  abort();
  return 0;
}
