/*
 * sandbox: what a script can see and what it can keep (docs/SECURITY.md, "What scripts can
 * see and keep"). Builds the global table from an allow-list (never by deleting from the
 * full one), serves standard libraries and the leash module through read-only proxies,
 * replaces the library functions that could run unbounded inside one C call with versions
 * that check the task's deadline or refuse oversized work, and gives every task a fresh
 * copy of the globals as loading left them. Reads the running task, its deadline and the
 * script's folder (require) from the state's context (task_context.h), set by script.c.
 *
 * Phases of one state: sandbox_open (load starts) -> chunks bound with sandbox_bind_chunk
 * run against the load-time globals -> sandbox_freeze (load done) -> each task enters
 * through the function sandbox_wrap_handle made, which installs that task's globals.
 */
#ifndef LEASH_SANDBOX_H
#define LEASH_SANDBOX_H

#include <lua.h>

/* Largest string one library call may build (string.rep, table.concat, string.gsub);
   the slot's memory cap refuses earlier when it is smaller. */
#define SANDBOX_MAX_STRING ((size_t)64 * 1024 * 1024)

/* [-0, +0, m] Opens the allowed libraries and builds the load-time globals. Once per
   state, inside a protected call, before any chunk is loaded. */
void sandbox_open(lua_State *L);

/* [-0, +0, m] The main chunk at idx (just loaded) runs in the current globals; a chunk
   bound before sandbox_freeze also gets each task's globals from then on. */
void sandbox_bind_chunk(lua_State *L, int idx);

/* [-0, +0, m] Loading is over: the load-time globals become the read-only template each
   task's globals are copied from. */
void sandbox_freeze(lua_State *L);

/* [-1, +1, m] Replaces the handle function on top with the entry the host calls for each
   task: it installs a fresh copy of the globals, then calls handle with its arguments. */
void sandbox_wrap_handle(lua_State *L);

#endif
