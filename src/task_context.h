/*
 * task_context: what the host API (api_leash.c, api_http.c) and the sandbox (sandbox.c,
 * sandbox_pattern.c) need from the slot that runs a state, and nothing else: the things the
 * host lends every state, the task being run (or none), its deadline, and the checks that
 * stop code once the task's time is up, its lease is gone or the worker is stopping.
 * script.c owns one context per state and attaches it to the state's extra space; the
 * units above read it through this header only, so none of them includes script.h and no
 * call goes back up into script.c (docs/ARCHITECTURE.md, "The script side").
 */
#ifndef LEASH_TASK_CONTEXT_H
#define LEASH_TASK_CONTEXT_H

#include "outcome.h"
#include "task.h"

#include <lua.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

struct dbpool;
struct metrics_counters;
struct log_field;
struct queue_script_sql;
struct replay_src;

/* What the host lends every state; shared, read-only but for the flags and the condvar. */
struct script_host {
  const char *worker_id;
  struct dbpool *pool;          /* leash.db.query; NULL in `leash check` (calls raise) */
  const struct queue_script_sql *sql;  /* step and enqueue statements (with pool) */
  const char *table;            /* the queue table, quoted (for enqueue's sequence) */
  atomic_int *stopping;         /* drain deadline passed / second signal: stop tasks now */
  pthread_mutex_t *wake_mu;     /* leash.sleep waits here; broadcast on lease loss/stop */
  pthread_cond_t *wake_cv;      /* (initialised with CLOCK_MONOTONIC) */
  double task_timeout;          /* seconds; 0 = none */
  size_t memory_limit;          /* bytes per state; 0 = none */
  size_t max_result_bytes;      /* most bytes of JSON text one encoding may make; 0 = none */
  const char *const *tenants;   /* --tenant scope (leash.enqueue stays inside it), or none */
  int ntenants;
  const char *const *lua_path;  /* folders require searches after the script's own */
  int nlua_path;
  double budget_wait_s;         /* the longest a slot waits for a budget before it gives the
                                   slot back (--budget-wait); 0 = never waits */
  struct metrics_counters *stats;   /* the budgets' counters; NULL: none (leash check) */
  /* `leash replay` only (replay.h): leash.http.request, leash.db.query, leash.step,
     leash.enqueue and leash.sleep answer from this recording after their own argument
     checks, and do no I/O. NULL everywhere else. */
  struct replay_src *replay;
};

struct budget_hold;

/* One state's context. The slot's thread alone reads and writes it. */
struct task_ctx {
  const struct script_host *host;
  struct task *task;            /* the task being run; NULL while loading and between tasks */
  double deadline;              /* monotonic seconds; 0 = none */
  const char *dir;              /* the script's folder (require looks there first) */
  const char *stop_reason;      /* why taskctx_check_stop stopped the code, or NULL */
  enum outcome_cause stop_cause;
  double stop_delay;            /* a yield's delay before the task runs again; < 0: none */
  char yield_msg[256];          /* a yield's reason (stop_reason points here) */
  char wait_spec[320];          /* a yield into a wait (taskctx_yield_wait): its spec; "" none */
  long long step_seq;           /* runs of a leash.step function in this state, so far */
  long long llm_step_seq;       /* the step run that called leash.llm.batch last (one each) */
  struct budget_hold *holds;    /* leash.budget.hold blocks open (api_budget.c); NULL: none */
  /* Told of each module require reads from a file (the version hashes the modules loaded
     with the script); NULL for none. */
  void (*module_read)(struct task_ctx *c, const char *name, const char *text, size_t len);
};

/* Instructions between two runs of the count hook's check. */
#define TASKCTX_HOOK_EVERY 1000

/* [-0, +0, -] Stores c in L's extra space (once, when the state is made). */
void taskctx_attach(lua_State *L, struct task_ctx *c);
/* [-0, +0, -] The context attached to L. */
struct task_ctx *taskctx_of(lua_State *L);

/* [-0, +0, -] A run starts: t (NULL while loading) runs for at most timeout_s seconds
   (0 = no limit) under the count hook that calls taskctx_check_stop. */
void taskctx_begin(lua_State *L, struct task *t, double timeout_s);
/* [-0, +0, -] The run is over: no hook, no task, no deadline (stop_reason stays to be read). */
void taskctx_end(lua_State *L);

/* Seconds left before the deadline (a large number when there is none). */
double taskctx_time_left(const struct task_ctx *c);

/* [-0, +0, v] Raises "what: ..." when no task runs, its lease is gone or the worker is
   stopping: calls with side effects check this first. */
void taskctx_check_live(lua_State *L, const char *what);

/* [-0, +0, v] Raises the run's stop (timeout, lease lost, worker stopping) when it is due,
   records why in stop_reason/stop_cause and makes the hook fire on every instruction, so a
   script's own pcall cannot swallow the stop. The count hook runs it; C loops the hook
   cannot reach (the sandbox's library functions) call it themselves. */
void taskctx_check_stop(lua_State *L);

/* [-0, +0, v] Ends the run now, by the host's choice rather than the script's: raises like a
   stop (the hook re-raises on every instruction, so a pcall cannot keep the code running)
   and makes the outcome a snooze (CAUSE_BUDGET; any other cause: a retry) of that cause after
   delay_s seconds. For waits that should not hold a slot (a budget paused for minutes). fmt
   is the outcome's message. */
void taskctx_yield(lua_State *L, enum outcome_cause cause, double delay_s, const char *fmt, ...)
  __attribute__((format(printf, 4, 5), noreturn));

/* [-0, +0, v] As taskctx_yield, but the outcome is a durable wait (sql/019) with spec (the
   JSON leash.wait would make, < 320 bytes): for a call that ends the execution until
   something outside it is done (leash.llm.batch). */
void taskctx_yield_wait(lua_State *L, const char *spec, const char *fmt, ...)
  __attribute__((format(printf, 3, 4), noreturn));

/* Waits secs seconds, or less when the run's deadline passes (returns 1), its lease is lost
   or the worker stops (returns 0: the caller checks). Holds no lock a slot or the database
   needs; woken early by the host's wake condvar. */
int taskctx_sleep(const struct task_ctx *c, double secs);

/* Fills f with the task's log fields (task_id, tenant, attempt when a task runs; worker
   always) and returns how many (at most TASKCTX_LOG_FIELDS). id and attempt hold the text
   the fields point to: they must outlive f. */
#define TASKCTX_LOG_FIELDS 4
int taskctx_log_fields(const struct task_ctx *c, struct log_field *f, char id[32],
                       char attempt[16]);

#endif
