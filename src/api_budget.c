/*
 * api_budget: provider budgets as scripts see them. The accounting is the database's
 * (sql/014_budgets.sql: a sliding minute of calls per budget, shared by the fleet); this
 * file asks it for grants and tells it what calls used.
 *
 *   leash.http.request{..., budget = NAME, tokens = ESTIMATE}   one call, granted first
 *   leash.budget.hold(NAME, {tokens = N}, fn, ...)              fn's calls under one grant
 *   leash.budget.pause(NAME, seconds [, reason])                no grants for the fleet
 *   leash.usage{tokens = N} (or input_tokens, output_tokens)    inside a hold: what it used
 *
 * Waiting for a grant holds no database connection (one statement per look, the wait in
 * between on the host's wake condvar) and ends early when the lease is lost, the worker
 * stops or the task's time runs out. A wait longer than --budget-wait, or than the task has
 * left, is not waited in the slot: the task yields (taskctx_yield, cause "budget") and runs
 * again after the wait, so a provider's ten-minute outage parks tasks, not slots.
 */
#include "api.h"

#include "dbpool.h"
#include "log.h"
#include "metrics.h"
#include "provider.h"
#include "queue.h"
#include "task_context.h"

#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUDGET_NAME_MAX 200
#define BUDGET_HOLD_MAX_S 3600.0

/* An open leash.budget.hold block: its grant and what its calls reported. */
struct budget_hold {
  char name[BUDGET_NAME_MAX + 1];
  long long call_id;
  struct provider_usage used;     /* reported by leash.usage or the answers; total -1: none */
  struct budget_hold *outer;
};

static int l_hold(lua_State *L);
static int l_pause(lua_State *L);
static const char *check_name(lua_State *L, int idx, const char *what);
static int exec(lua_State *L, const char *sql, int n, const char *const *params,
                PGresult **out, char *err, size_t errlen);
static double jitter(double wait);
static struct budget_counters *counters(lua_State *L, const char *name);

int api_budget_open(lua_State *L)
{
  static const luaL_Reg funcs[] = { { "hold", l_hold }, { "pause", l_pause }, { NULL, NULL } };
  luaL_newlib(L, funcs);
  return 1;
}

void api_budget_begin(lua_State *L, const char *what, const char *name, long long tokens,
                      double hold_s, struct budget_call *bc)
{
  struct task_ctx *ctx = taskctx_of(L);
  memset(bc, 0, sizeof *bc);
  bc->name = name;
  bc->id = -1;
  if (ctx->host->replay)   /* leash replay (replay.h): no grant is asked, none is needed */
    return;
  for (struct budget_hold *h = ctx->holds; h; h = h->outer)
    if (strcmp(h->name, name) == 0) {
      bc->hold = h;               /* the block's grant covers the call */
      return;
    }
  char toks[24], hold[32], id[24], token[24], err[512];
  snprintf(toks, sizeof toks, "%lld", tokens);
  snprintf(hold, sizeof hold, "%.3f", hold_s);
  const struct task *t = ctx->task;
  snprintf(id, sizeof id, "%lld", t ? (long long)t->id : 0LL);
  snprintf(token, sizeof token, "%lld", t ? (long long)t->token : 0LL);
  const char *params[] = { name, toks, hold, t ? id : NULL, t ? token : NULL };
  for (;;) {
    taskctx_check_live(L, what);
    PGresult *r;
    if (exec(L, ctx->host->sql->budget_grant, 5, params, &r, err, sizeof err) != 0)
      luaL_error(L, "%s: budget '%s': %s", what, name, err);
    int granted = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    long long call = granted ? strtoll(PQgetvalue(r, 0, 1), NULL, 10) : -1;
    double wait = PQntuples(r) == 1 ? strtod(PQgetvalue(r, 0, 2), NULL) : 1;
    char why[128];
    snprintf(why, sizeof why, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 3) : "");
    PQclear(r);
    struct budget_counters *bk = counters(L, name);
    if (granted) {
      bc->id = call;
      if (bk)
        atomic_fetch_add(&bk->grants, 1);
      else if (ctx->host->stats)
        atomic_fetch_add(&ctx->host->stats->budgets_untracked, 1);
      return;
    }
    double left = taskctx_time_left(ctx);
    if ((wait > ctx->host->budget_wait_s || wait >= left) && bk)
      atomic_fetch_add(&bk->yields, 1);
    if (wait > ctx->host->budget_wait_s || wait >= left)
      taskctx_yield(L, CAUSE_BUDGET, wait + jitter(wait),
                    "budget '%s' (%s): the next grant is %.1f s away, longer than %s; the "
                    "task gave its slot back and runs again then", name, why, wait,
                    wait >= left ? "the task's time left" : "--budget-wait");
    double slept = task_now();
    int over = taskctx_sleep(ctx, wait);
    if (bk)
      atomic_fetch_add(&bk->wait_us, (long long)((task_now() - slept) * 1e6));
    if (over)
      luaL_error(L, "task timed out (--task-timeout)");
  }
}

/* Adds b to a (a count of -1 is "not said"). */
static void usage_add(struct provider_usage *a, const struct provider_usage *b)
{
  if (b->input >= 0)
    a->input = (a->input < 0 ? 0 : a->input) + b->input;
  if (b->output >= 0)
    a->output = (a->output < 0 ? 0 : a->output) + b->output;
  if (b->total >= 0)
    a->total = (a->total < 0 ? 0 : a->total) + b->total;
  if (b->model[0])
    snprintf(a->model, sizeof a->model, "%s", b->model);
}

int api_budget_end(lua_State *L, struct budget_call *bc, const struct provider_usage *used,
                   double pause_s, const char *reason)
{
  if (taskctx_of(L)->host->replay)   /* leash replay: nothing is granted, used or paused */
    return 0;
  if (used && used->total < 0)
    used = NULL;
  struct budget_counters *bk = counters(L, bc->name);
  if (bk && used)
    atomic_fetch_add(&bk->tokens, used->total);
  if (bk && pause_s >= 0 && bc->id >= 0)
    atomic_fetch_add(&bk->refused, 1);
  if (bc->hold) {
    if (used)
      usage_add(&bc->hold->used, used);
    if (pause_s < 0)
      return 0;
    used = NULL;   /* the block's own grant settles its usage when the block ends */
  }
  if (bc->id < 0 && pause_s < 0)
    return 0;
  char id[24], toks[24], in[24], out[24], pause[32], err[512];
  snprintf(id, sizeof id, "%lld", bc->id);
  snprintf(pause, sizeof pause, "%.3f", pause_s);
  if (used) {
    snprintf(toks, sizeof toks, "%lld", used->total);
    snprintf(in, sizeof in, "%lld", used->input);
    snprintf(out, sizeof out, "%lld", used->output);
  }
  const char *params[] = { bc->name, bc->id >= 0 ? id : NULL, used ? toks : NULL,
                           pause_s >= 0 ? pause : NULL, reason,
                           used && used->model[0] ? used->model : NULL,
                           used && used->input >= 0 ? in : NULL,
                           used && used->output >= 0 ? out : NULL };
  PGresult *r = NULL;
  int rc = exec(L, taskctx_of(L)->host->sql->budget_settle, 8, params, &r, err, sizeof err);
  PQclear(r);
  bc->id = -1;
  if (rc != 0)   /* the call's hold runs out by itself: the grant is not lost for good */
    log_warn("budget '%s': the call's usage was not recorded: %s", bc->name, err);
  return rc;
}

void api_budget_refused(lua_State *L, struct budget_call *bc, double wait_s, const char *from)
{
  char reason[300];
  snprintf(reason, sizeof reason, "refused by %s", from);
  api_budget_end(L, bc, NULL, wait_s, reason);
  taskctx_yield(L, CAUSE_BUDGET, wait_s + jitter(wait_s),
                "budget '%s' paused for %.1f s: %s; the task gave its slot back and runs "
                "again then", bc->name, wait_s, reason);
}

/* leash.budget.hold(name, {tokens = n}, fn, ...) → fn's results. One grant for the block;
   leash.http.request calls inside it that name the same budget are covered by it and add
   the usage their answers report; leash.usage reports more. Whatever fn raises passes on,
   after the grant is settled. */
static int l_hold(lua_State *L)
{
  const char *name = check_name(L, 1, "leash.budget.hold");
  long long tokens = 0;
  if (!lua_isnil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "tokens");
    if (!lua_isnil(L, -1)) {
      int ok;
      lua_Integer n = lua_tointegerx(L, -1, &ok);
      luaL_argcheck(L, ok && n >= 0, 2, "tokens must be an integer >= 0");
      tokens = (long long)n;
    }
    lua_pop(L, 1);
  }
  luaL_checktype(L, 3, LUA_TFUNCTION);
  struct task_ctx *ctx = taskctx_of(L);
  struct budget_hold *hold = lua_newuserdatauv(L, sizeof *hold, 0);
  memset(hold, 0, sizeof *hold);
  snprintf(hold->name, sizeof hold->name, "%s", name);
  hold->used = (struct provider_usage){ .input = -1, .output = -1, .total = -1 };
  lua_replace(L, 1);             /* keeps the block alive; name now lives in hold */
  lua_remove(L, 2);              /* fn and its arguments from 2 */
  double left = taskctx_time_left(ctx);
  struct budget_call bc;
  api_budget_begin(L, "leash.budget.hold", hold->name, tokens,
                   (left < BUDGET_HOLD_MAX_S ? left : BUDGET_HOLD_MAX_S) + 30, &bc);
  hold->call_id = bc.id;
  hold->outer = ctx->holds;
  ctx->holds = hold;
  int rc = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
  ctx->holds = hold->outer;
  api_budget_end(L, &bc, &hold->used, -1, NULL);
  if (rc != LUA_OK)
    return lua_error(L);
  return lua_gettop(L) - 1;
}

/* leash.budget.pause(name, seconds [, reason]): no grants of the budget for the fleet until
   then (a pause in progress is extended, never shortened). */
static int l_pause(lua_State *L)
{
  const char *name = check_name(L, 1, "leash.budget.pause");
  lua_Number secs = luaL_checknumber(L, 2);
  luaL_argcheck(L, secs > 0 && isfinite(secs), 2, "seconds must be a number > 0");
  if (secs > PROVIDER_MAX_WAIT_S)
    secs = PROVIDER_MAX_WAIT_S;
  size_t rn = 0;
  const char *reason = luaL_optlstring(L, 3, "leash.budget.pause", &rn);
  luaL_argcheck(L, rn <= 300, 3, "reason must be at most 300 bytes");
  taskctx_check_live(L, "leash.budget.pause");
  struct budget_call bc = { .name = name, .id = -1 };
  if (api_budget_end(L, &bc, NULL, secs, reason) != 0)
    return luaL_error(L, "leash.budget.pause: budget '%s' could not be paused", name);
  return 0;
}

/* leash.usage{tokens = n} or {input_tokens = a, output_tokens = b} [, model = m]: the
   innermost leash.budget.hold's usage, replacing what its calls' answers reported (input,
   output and a priced model make it spend too). */
int api_usage(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  struct task_ctx *ctx = taskctx_of(L);
  if (!ctx->holds)
    return luaL_error(L, "leash.usage: only inside leash.budget.hold (calls made with "
                      "budget = read their usage from the answer)");
  struct provider_usage u = { .input = -1, .output = -1, .total = -1 };
  static const char *const keys[] = { "tokens", "input_tokens", "output_tokens" };
  long long *slot[] = { &u.total, &u.input, &u.output };
  for (int i = 0; i < 3; i++) {
    lua_getfield(L, 1, keys[i]);
    if (!lua_isnil(L, -1)) {
      int ok;
      lua_Integer n = lua_tointegerx(L, -1, &ok);
      if (!ok || n < 0)
        return luaL_error(L, "leash.usage: %s must be an integer >= 0", keys[i]);
      *slot[i] = (long long)n;
    }
    lua_pop(L, 1);
  }
  if ((u.total >= 0) == (u.input >= 0 || u.output >= 0))
    return luaL_error(L, "leash.usage: give tokens or input_tokens/output_tokens");
  if (u.total < 0)
    u.total = (u.input < 0 ? 0 : u.input) + (u.output < 0 ? 0 : u.output);
  lua_getfield(L, 1, "model");
  if (!lua_isnil(L, -1)) {
    size_t n;
    const char *m = lua_tolstring(L, -1, &n);
    if (lua_type(L, -1) != LUA_TSTRING || n == 0 || n >= sizeof u.model)
      return luaL_error(L, "leash.usage: model must be a string of 1 to %d bytes",
                        (int)sizeof u.model - 1);
    memcpy(u.model, m, n + 1);
  }
  lua_pop(L, 1);
  ctx->holds->used = u;
  return 0;
}

const char *api_budget_name(lua_State *L, int idx, const char *what)
{
  return check_name(L, idx, what);
}

/* A budget name: 1..200 bytes, no control characters (names reach logs and metrics). */
static const char *check_name(lua_State *L, int idx, const char *what)
{
  size_t n;
  const char *s = lua_tolstring(L, idx, &n);
  if (lua_type(L, idx) != LUA_TSTRING || n == 0 || n > BUDGET_NAME_MAX)
    luaL_error(L, "%s: a budget name must be a string of 1 to %d bytes", what, BUDGET_NAME_MAX);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
      luaL_error(L, "%s: a budget name may not hold control characters", what);
  return s;
}

/* One statement on a pooled connection for the running task. The result (on success) is
   the caller's; nothing here raises, so no connection is ever left out of the pool. */
static int exec(lua_State *L, const char *sql, int n, const char *const *params,
                PGresult **out, char *err, size_t errlen)
{
  const struct task_ctx *ctx = taskctx_of(L);
  *out = NULL;
  if (!ctx->host->pool) {
    snprintf(err, errlen, "no database in this context");
    return -1;
  }
  PGconn *c = dbpool_get_for(ctx->host->pool, ctx->task, taskctx_time_left(ctx), err, errlen);
  if (!c)
    return -1;
  PGresult *r = dbpool_exec(ctx->host->pool, c, sql, n, params);
  ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    const char *m = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    snprintf(err, errlen, "%s", m && *m ? m : PQerrorMessage(c));
    size_t k = strlen(err);
    while (k > 0 && (err[k - 1] == '\n' || err[k - 1] == ' '))
      err[--k] = '\0';
    PQclear(r);
    dbpool_put(ctx->host->pool, c);
    return -1;
  }
  dbpool_put(ctx->host->pool, c);
  *out = r;
  return 0;
}

/* This process's counters of budget name (metrics), or NULL (none, or too many names). */
static struct budget_counters *counters(lua_State *L, const char *name)
{
  struct metrics_counters *m = taskctx_of(L)->host->stats;
  if (!m)
    return NULL;
  return metrics_budget(m, name);
}

/* Tasks a pause parked come back spread over a little time after it, not all at its end:
   up to a tenth of the wait plus half a second, at most 10 s. */
static double jitter(double wait)
{
  double span = wait / 10 + 0.5;
  if (span > 10)
    span = 10;
  return span * ((double)arc4random() / 4294967296.0);
}
