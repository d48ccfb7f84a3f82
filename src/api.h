/*
 * api: the `leash` module scripts get from require "leash": ok/retry/fatal/null, json,
 * db.query, step, enqueue, http.request, log, sleep, now. Outcome values carry a private
 * metatable the host reads back. The running task comes from task_context.h.
 */
#ifndef LEASH_API_H
#define LEASH_API_H

#include <lua.h>

/* lua_CFunction: pushes the http table ({ request = f }); api_http.c. */
int api_http_open(lua_State *L);

/* lua_CFunction: pushes the module table. */
int api_leash_open(lua_State *L);

/* [-0, +0, -] If the value at idx is an outcome made by leash.ok/retry/fatal, returns its
   kind ("ok", "retry", "fatal", "snooze") and leaves nothing on the stack; else NULL. */
const char *api_outcome_kind(lua_State *L, int idx);

#endif
