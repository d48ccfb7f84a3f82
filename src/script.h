/*
 * script: one slot's Lua state. Loads the task script in the sandbox (sandbox.h: what is
 * allowed, fresh globals per task, bounded library loops), with a
 * memory cap through the allocator, then calls handle(task) under a count hook that stops
 * a task past its --task-timeout or once its lease is lost, and turns what handle gave back
 * into the task's outcome (SPEC.md, "The Lua contract"). One thread uses a state; nothing
 * Lua-side is shared between slots.
 */
#ifndef LEASH_SCRIPT_H
#define LEASH_SCRIPT_H

#include "task.h"

#include <lua.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

struct dbpool;
struct queue_script_sql;

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
};

struct script;

/* Loads path into a new state and checks the contract (returns handle, or a table with a
   handle function and optional setup, which runs once). NULL with the Lua error in err. */
struct script *script_load(const char *path, const struct script_host *host, char *err,
                           size_t errlen);
/* The same from text already read (path names the chunk and the folder for require). */
struct script *script_load_text(const char *path, const char *text, size_t len,
                                const struct script_host *host, char *err, size_t errlen);
/* Reads a whole file; malloc'd, NULL with err. */
char *script_read_file(const char *path, size_t *len, char *err, size_t errlen);
void script_free(struct script *s);

/* Runs handle(task) and fills t->kind, error, delay, result, duration. */
void script_run(struct script *s, struct task *t);

/* The version id: SHA-256 (64 hex digits) over the script's text and every module loaded
   with it (at load time, setup included), for logs, hot swap and the attempt history. */
#define SCRIPT_VERSION_LEN 64
const char *script_version(const struct script *s);
/* Adds a module required while loading to the version (no-op once loading is over: a
   module first required by a task is that task's own). */
void script_hash_module(struct script *s, const char *name, const char *text, size_t len);

/* 1 after an out-of-memory error left the state unfit: the caller loads a fresh one. */
int script_broken(const struct script *s);

/* For the host API (api_leash.c) ------------------------------------------------------ */

/* The script owning L, from the state's extra space. */
struct script *script_of(lua_State *L);
const struct script_host *script_host_of(const struct script *s);
/* The task being run, or NULL between tasks. */
struct task *script_task(const struct script *s);
/* Raises a Lua error when no task runs or its lease is gone ("lease lost: ..."): calls
   with side effects check this first. */
void script_check_live(lua_State *L, const char *what);
/* The folder of the script's file (require looks there first). */
const char *script_dir(const struct script *s);
/* Raises the task's stop (timeout, lease lost, worker stopping) when it is due, as the
   count hook does; for C loops the hook cannot reach. */
void script_check_deadline(lua_State *L);
/* Seconds left before the task's deadline (a large number when there is none). */
double script_time_left(const struct script *s);

#endif
