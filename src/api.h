/*
 * api: the `leash` module scripts get from require "leash": ok/retry/fatal/null, json,
 * db.query, step, enqueue, http.request, log, sleep, now, env. Outcome values carry a private
 * metatable the host reads back. The running task comes from task_context.h.
 */
#ifndef LEASH_API_H
#define LEASH_API_H

#include <lua.h>

/* lua_CFunction: pushes the http table ({ request = f }); api_http.c. */
int api_http_open(lua_State *L);

/* Budgets (api_budget.c; sql/014_budgets.sql). */
struct budget_hold;
struct budget_call {
  const char *name;
  long long id;                 /* the grant's call id; -1: none (covered by a hold, or over) */
  struct budget_hold *hold;     /* the open leash.budget.hold that covers the call, or NULL */
};

/* lua_CFunction: pushes the budget table ({ hold = f, pause = f }). */
int api_budget_open(lua_State *L);

/* lua_CFunction: leash.usage{...}. */
int api_usage(lua_State *L);

/* [-0, +0, v] The budget name at idx, checked (1..200 bytes, no controls), or raises. */
const char *api_budget_name(lua_State *L, int idx, const char *what);

/* [-0, +0, v] Waits for a grant of one call of budget name (tokens: the estimate, 0 when
   unknown; held in flight for at most hold_s seconds), or finds the open hold that covers
   it. Raises on a database error, a lost lease, a stop; yields the task (taskctx_yield)
   when the grant is further away than --budget-wait or the task's time left. name must
   outlive bc. */
void api_budget_begin(lua_State *L, const char *what, const char *name, long long tokens,
                      double hold_s, struct budget_call *bc);

/* [-0, +0, -] The call is over: used is what it used (NULL or used->total < 0: unknown, the
   estimate stands; with input, output and a priced model it is also spend, sql/014);
   pause_s >= 0 pauses the budget for the fleet that long with reason (a refusal). Never
   raises: a failure is logged (the call's hold runs out by itself). 0 or -1. */
struct provider_usage;
int api_budget_end(lua_State *L, struct budget_call *bc, const struct provider_usage *used,
                   double pause_s, const char *reason);

/* [-0, +0, v] The provider refused the call (429/503) and asked for wait_s: pauses the budget
   for the fleet and yields the task until then (spending no slot meanwhile). from names the
   provider (scheme://host[:port]). Does not return. */
void api_budget_refused(lua_State *L, struct budget_call *bc, double wait_s, const char *from)
  __attribute__((noreturn));
/* lua_CFunction: leash.env(name); api_env.c. */
int api_env(lua_State *L);

/* lua_CFunction: pushes the llm table ({ batch = f }); api_llm.c (sql/022_llm_batch.sql). */
int api_llm_open(lua_State *L);

/* [-0, +1, v] Runs sql on a pooled connection for the running task (the lease checked after
   the wait for a connection); pushes the result's box (freed by the collector if a later
   call raises) and returns the result, or raises "what: ...". */
struct pg_result;
struct pg_result *api_pool_exec(lua_State *L, const char *what, const char *sql, int nparams,
                                const char *const *params);
/* [-0, +0, -] Frees the result in the box at idx now. */
void api_result_free(lua_State *L, int idx);

/* [-0, +0, -] The name of the innermost leash.step the caller runs inside, or NULL; *seq
   that run's number (a new one for every run of a step's function in the state; 0: none). */
const char *api_step_name(lua_State *L, long long *seq);

/* lua_CFunction: pushes the module table. */
int api_leash_open(lua_State *L);

/* [-0, +0, -] If the value at idx is an outcome made by leash.ok/retry/fatal, returns its
   kind ("ok", "retry", "fatal", "snooze") and leaves nothing on the stack; else NULL. */
const char *api_outcome_kind(lua_State *L, int idx);

#endif
