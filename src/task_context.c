/* task_context: the running task as the host API and the sandbox see it. See task_context.h. */
#include "task_context.h"

#include "log.h"

#include <lauxlib.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <time.h>

static void count_hook(lua_State *L, lua_Debug *ar);

void taskctx_attach(lua_State *L, struct task_ctx *c)
{
  *(struct task_ctx **)lua_getextraspace(L) = c;
}

struct task_ctx *taskctx_of(lua_State *L)
{
  return *(struct task_ctx **)lua_getextraspace(L);
}

void taskctx_begin(lua_State *L, struct task *t, double timeout_s)
{
  struct task_ctx *c = taskctx_of(L);
  c->task = t;
  c->deadline = timeout_s > 0 ? task_now() + timeout_s : 0;
  c->stop_reason = NULL;
  c->stop_delay = -1;
  c->wait_spec[0] = '\0';
  c->holds = NULL;
  lua_sethook(L, count_hook, LUA_MASKCOUNT, TASKCTX_HOOK_EVERY);
}

void taskctx_end(lua_State *L)
{
  struct task_ctx *c = taskctx_of(L);
  lua_sethook(L, NULL, 0, 0);
  c->task = NULL;
  c->deadline = 0;
}

double taskctx_time_left(const struct task_ctx *c)
{
  return c->deadline > 0 ? c->deadline - task_now() : 1e9;
}

void taskctx_check_live(lua_State *L, const char *what)
{
  struct task_ctx *c = taskctx_of(L);
  if (!c->task)
    luaL_error(L, "%s: only available while a task runs", what);
  if (!task_lease_alive(c->task))
    luaL_error(L, "%s: lease lost: the task's side effects are stopped", what);
  if (atomic_load(c->host->stopping))
    luaL_error(L, "%s: the worker is stopping", what);
}

void taskctx_check_stop(lua_State *L)
{
  struct task_ctx *c = taskctx_of(L);
  if (c->stop_reason)
    luaL_error(L, "%s", c->stop_reason);   /* once stopped, stopped: a pcall cannot resume */
  const char *why = NULL;
  enum outcome_cause cause = CAUSE_TIMEOUT;
  if (c->deadline > 0 && task_now() > c->deadline) {
    why = c->task ? "task timed out (--task-timeout)" : "script took too long to load";
  } else if (c->task && !task_lease_alive(c->task)) {
    why = "lease lost";
    cause = CAUSE_LEASE_LOST;
  } else if (atomic_load(c->host->stopping)) {
    why = "worker stopping";
    cause = CAUSE_STOPPING;
  }
  if (!why)
    return;
  c->stop_reason = why;
  c->stop_cause = cause;
  lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
  luaL_error(L, "%s", why);
}

void taskctx_yield(lua_State *L, enum outcome_cause cause, double delay_s, const char *fmt, ...)
{
  struct task_ctx *c = taskctx_of(L);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->yield_msg, sizeof c->yield_msg, fmt, ap);
  va_end(ap);
  c->stop_reason = c->yield_msg;
  c->stop_cause = cause;
  c->stop_delay = delay_s;
  lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
  luaL_error(L, "%s", c->yield_msg);
  abort();   /* not reached: luaL_error does not return */
}

void taskctx_yield_wait(lua_State *L, const char *spec, const char *fmt, ...)
{
  struct task_ctx *c = taskctx_of(L);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->yield_msg, sizeof c->yield_msg, fmt, ap);
  va_end(ap);
  snprintf(c->wait_spec, sizeof c->wait_spec, "%s", spec);
  c->stop_reason = c->yield_msg;
  c->stop_cause = CAUSE_WAITING;
  c->stop_delay = -1;
  lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
  luaL_error(L, "%s", c->yield_msg);
  abort();   /* not reached: luaL_error does not return */
}

int taskctx_sleep(const struct task_ctx *c, double secs)
{
  const struct script_host *h = c->host;
  struct task *t = c->task;
  double end = task_now() + secs;
  int over = 0;
  pthread_mutex_lock(h->wake_mu);
  for (;;) {
    if ((t && !task_lease_alive(t)) || atomic_load(h->stopping))
      break;
    double now = task_now();
    if (taskctx_time_left(c) <= 0) {
      over = 1;
      break;
    }
    if (now >= end)
      break;
    double until = end;
    if (c->deadline > 0 && c->deadline < until)
      until = c->deadline;
    if (t && atomic_load(&t->lease_deadline) < until)
      until = atomic_load(&t->lease_deadline);   /* wake to notice a lease running out */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double wait = until - now;
    ts.tv_sec += (time_t)wait;
    ts.tv_nsec += (long)((wait - floor(wait)) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(h->wake_cv, h->wake_mu, &ts);
  }
  pthread_mutex_unlock(h->wake_mu);
  return over;
}

/* Another thread never touches the state: it only sets the flags read here. */
static void count_hook(lua_State *L, lua_Debug *ar)
{
  (void)ar;
  taskctx_check_stop(L);
}

int taskctx_log_fields(const struct task_ctx *c, struct log_field *f, char id[32],
                       char attempt[16])
{
  int n = 0;
  const struct task *t = c->task;
  if (t) {
    snprintf(id, 32, "%lld", (long long)t->id);
    snprintf(attempt, 16, "%d", t->attempt);
    f[n++] = (struct log_field){ "task_id", id };
    f[n++] = (struct log_field){ "tenant", t->tenant_id };
    f[n++] = (struct log_field){ "attempt", attempt };
  }
  f[n++] = (struct log_field){ "worker", c->host->worker_id };
  return n;
}
