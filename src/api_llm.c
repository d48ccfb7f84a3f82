/*
 * api_llm: leash.llm.batch, a completion through a provider's batch interface (issue #19;
 * sql/022_llm_batch.sql, src/llm_batch.c). Only inside a leash.step: the step keeps the
 * answer, so an execution that got it never asks again. The first execution stores the
 * request as an item and ends waiting (sql/019's event wait on "llm:<item id>": no slot, no
 * lease, no attempt spent) until the fleet's batcher has the provider's answer; the next
 * execution re-enters the step and gets it, once (a step that rejects it asks afresh on its
 * next attempt). The request and the answer are the provider's
 * own JSON (the body a synchronous call would send, and the body it would get back).
 */
#include "api.h"

#include "json_lua.h"
#include "lifecycle.h"
#include "luatext.h"
#include "queue.h"
#include "task_context.h"

#include <lauxlib.h>
#include <libpq-fe.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LLM_DEFAULT_TRIES 3
#define LLM_MAX_TRIES 100

static int l_batch(lua_State *L);

int api_llm_open(lua_State *L)
{
  static const luaL_Reg funcs[] = { { "batch", l_batch }, { NULL, NULL } };
  luaL_newlib(L, funcs);
  return 1;
}

/* leash.llm.batch{provider = "openai"|"anthropic", request = {...}, deadline = s,
   tries = n, fallback = function} → the provider's answer (a table). Raises when the
   item failed its last try (a retry: the next attempt asks afresh). */
static int l_batch(lua_State *L)
{
  static const char *const keys[] = { "provider", "request", "deadline", "tries", "fallback",
                                      NULL };
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_pushnil(L);
  while (lua_next(L, 1) != 0) {
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    int known = 0;
    for (int i = 0; k && keys[i]; i++)
      known |= strcmp(k, keys[i]) == 0;
    if (!known)
      return luaL_error(L, "leash.llm.batch{...}: unknown field %s (expected provider, "
                        "request, deadline, tries, fallback)", k ? k : luaL_typename(L, -2));
    lua_pop(L, 1);
  }
  lua_getfield(L, 1, "provider");                          /* 2 */
  const char *provider = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
  if (!provider || (strcmp(provider, "openai") != 0 && strcmp(provider, "anthropic") != 0))
    return luaL_error(L, "leash.llm.batch{...}: provider must be \"openai\" or \"anthropic\"");
  if (lua_getfield(L, 1, "request") != LUA_TTABLE)        /* 3 */
    return luaL_error(L, "leash.llm.batch{...}: request must be a table (the body of the "
                      "synchronous call), not %s", luaL_typename(L, 3));
  double deadline = LIFECYCLE_WAIT_DEADLINE_S;
  if (lua_getfield(L, 1, "deadline") != LUA_TNIL) {        /* 4 */
    double d = lua_type(L, 4) == LUA_TNUMBER ? lua_tonumber(L, 4) : -1;
    if (!(d >= 1 && d <= LIFECYCLE_MAX_WAIT_S))
      return luaL_error(L, "leash.llm.batch{...}: deadline must be a number of seconds from 1 "
                        "to %d", (int)LIFECYCLE_MAX_WAIT_S);
    deadline = d;
  }
  lua_Integer tries = LLM_DEFAULT_TRIES;
  if (lua_getfield(L, 1, "tries") != LUA_TNIL) {           /* 5 */
    int isint = 0;
    tries = lua_tointegerx(L, 5, &isint);
    if (lua_type(L, 5) != LUA_TNUMBER || !isint || tries < 1 || tries > LLM_MAX_TRIES)
      return luaL_error(L, "leash.llm.batch{...}: tries must be an integer from 1 to %d",
                        LLM_MAX_TRIES);
  }
  int fallback = lua_getfield(L, 1, "fallback") != LUA_TNIL;   /* 6 */
  if (fallback && lua_type(L, 6) != LUA_TFUNCTION)
    return luaL_error(L, "leash.llm.batch{...}: fallback must be a function (the "
                      "synchronous call), not %s", luaL_typename(L, 6));
  long long seq;
  const char *step = api_step_name(L, &seq);
  if (!step)
    return luaL_error(L, "leash.llm.batch: only inside leash.step (the step keeps the answer)");
  taskctx_check_live(L, "leash.llm.batch");
  struct task_ctx *ctx = taskctx_of(L);
  /* The item is the step's: a second request in the same step would be answered with the
     first's. */
  if (seq != 0 && seq == ctx->llm_step_seq)
    return luaL_error(L, "leash.llm.batch: one call per leash.step run (give each request a "
                      "step of its own)");
  ctx->llm_step_seq = seq;
  const struct script_host *h = ctx->host;
  if (h->replay)
    return luaL_error(L, "leash.llm.batch: not replayable (a recording holds no batch)");
  if (!h->sql || !h->sql->llm_item)
    return luaL_error(L, "leash.llm.batch: no database in this context");
  char err[512], id[24], token[24], ntries[16];
  char *json = jsonlua_encode(L, 3, err, sizeof err);
  if (!json)
    return luaL_error(L, "leash.llm.batch{...}: request cannot be sent as JSON: %s", err);
  if (json[0] != '{') {
    free(json);
    return luaL_error(L, "leash.llm.batch{...}: request must be a JSON object, not a list");
  }
  luatext_pushfree(L, json);                               /* 7 */
  snprintf(id, sizeof id, "%lld", (long long)ctx->task->id);
  snprintf(token, sizeof token, "%lld", (long long)ctx->task->token);
  snprintf(ntries, sizeof ntries, "%lld", (long long)tries);
  const char *params[] = { id, token, h->worker_id, step, provider, lua_tostring(L, 7),
                           fallback ? "true" : "false", ntries };
  PGresult *r = api_pool_exec(L, "leash.llm.batch", h->sql->llm_item, 8, params);   /* 8 */
  if (PQntuples(r) != 1)
    return luaL_error(L, "leash.llm.batch: lease lost: the request was not stored");
  long long item = atoll(PQgetvalue(r, 0, 0));
  const char *state = PQgetvalue(r, 0, 1);
  if (strcmp(state, "done") == 0) {
    if (jsonlua_decode(L, PQgetvalue(r, 0, 2), (size_t)PQgetlength(r, 0, 2), err,
                       sizeof err) != 0)
      return luaL_error(L, "leash.llm.batch: the answer of item %I is unreadable: %s", (lua_Integer)item,
                        err);
    api_result_free(L, 8);
    return 1;
  }
  if (strcmp(state, "failed") == 0) {
    lua_pushfstring(L, "leash.llm.batch: item %I failed after %s tries: %s", (lua_Integer)item,
                    PQgetvalue(r, 0, 4), PQgetvalue(r, 0, 3));
    api_result_free(L, 8);
    return lua_error(L);
  }
  if (strcmp(state, "fallback") == 0) {
    api_result_free(L, 8);
    if (!fallback)   /* the item was stored with one: a script changed between executions */
      return luaL_error(L, "leash.llm.batch: item %I's batch expired and this call gives no "
                        "fallback", (lua_Integer)item);
    lua_pushvalue(L, 6);
    lua_call(L, 0, 1);
    return 1;
  }
  api_result_free(L, 8);
  /* pending or submitted: the execution ends here, waiting for the batcher's signal. */
  char spec[320];
  snprintf(spec, sizeof spec, "{\"reason\":\"event\",\"event\":\"llm:%lld\",\"deadline\":%.3f,"
           "\"on_deadline\":\"retry\"}", item, deadline);
  taskctx_yield_wait(L, spec, "waiting for %s batch item %lld", provider, item);
}
