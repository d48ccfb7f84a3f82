/*
 * json_lua: the JSON <-> Lua bridge, on jansson. Task payloads, step results and the
 * script's json.encode/decode all cross here, so the mapping is fixed in one place:
 * JSON null is a sentinel (the light userdata NULL, exposed as json.null / leash.null),
 * never nil; integers stay Lua integers; arrays carry the "leash.array" metatable so an
 * empty array re-encodes as [] rather than {}. Nesting is capped at JSONLUA_MAX_DEPTH in
 * both directions, which also turns a cyclic table into an error instead of a crash.
 * Relies on jansson, the Lua 5.4 C API, luatext.h and buf.h only; no libpq, no host state.
 */
#ifndef LEASH_JSON_LUA_H
#define LEASH_JSON_LUA_H

#include <stddef.h>

#include <jansson.h>
#include <lua.h>

#define JSONLUA_MAX_DEPTH 128

/* Registry name of the metatable that marks a table as a JSON array. */
#define JSONLUA_ARRAY_MT "leash.array"

/* [-0, +1, m] Push the Lua value of j (borrowed; not kept). Objects become tables, arrays
   sequence tables with the leash.array metatable, strings Lua strings (NUL allowed),
   integers Lua integers, reals floats, null the null sentinel. No depth limit of its own:
   trees from jsonlua_decode are already bounded. */
void jsonlua_push(lua_State *L, const json_t *j);

/* [-0, +1|0, m] Decode len bytes of text and push the value; returns 0. On bad input
   returns -1 with a message in err and pushes nothing. Any JSON value may stand at top
   level, strings may hold \u0000, a duplicate key keeps its last value. An integer too
   big for int64 makes the whole document decode with its integers as floats (jansson
   has no per-number choice). Deeper than JSONLUA_MAX_DEPTH is an error. Raises only on
   memory exhaustion, after freeing what it allocated. */
int jsonlua_decode(lua_State *L, const char *text, size_t len, char *err, size_t errlen)
  __attribute__((warn_unused_result));

/* [-0, +0, m] Convert the Lua value at idx to a new json_t (caller json_decref's it), or
   return NULL with a message naming the offending place ("$.a.b[3]") in err. The rules
   are documented at the conversion in json_lua.c. Raises only on memory exhaustion or a
   full Lua stack, and only before it allocates anything. */
json_t *jsonlua_to_json(lua_State *L, int idx, char *err, size_t errlen)
  __attribute__((warn_unused_result));

/* [-0, +0, m] Encode the value at idx as compact JSON text with sorted object keys and
   17-digit reals, so equal values give equal text. Returns a malloc'd string (caller
   frees with free()), or NULL with a message in err. Bounded by the state's limit
   (jsonlua_set_max_bytes), which every encoding in the state obeys (json.encode, results,
   step results, query parameters, child payloads). */
char *jsonlua_encode(lua_State *L, int idx, char *err, size_t errlen)
  __attribute__((warn_unused_result));

/* [-0, +0, m] The same with an explicit limit: max bytes of text (0 = none). The
   conversion stops as soon as the text is known to pass max, so neither the jansson tree
   nor the text grows much beyond it; then NULL, with *too_big (when given) set to 1. */
char *jsonlua_encode_max(lua_State *L, int idx, size_t max, int *too_big, char *err,
                         size_t errlen) __attribute__((warn_unused_result));

/* [-0, +0, m] The limit jsonlua_encode obeys in this state (0, the default: none). The
   host sets it to --max-result-bytes: a script could otherwise build text far larger than
   its memory cap outside the Lua heap. */
void jsonlua_set_max_bytes(lua_State *L, size_t max);
/* [-0, +0, -] */
size_t jsonlua_max_bytes(lua_State *L);

/* [-0, +1, m] lua_CFunction: push the module table
   { encode = f, decode = f, null = sentinel, array = f }.
   encode(v) raises "json.encode: <msg>" on a value JSON cannot hold (a programming error);
   decode(s) returns the value, or nil, "json.decode: <msg>" on bad text (an operational
   failure, e.g. an LLM's malformed answer); a non-string argument raises.
   array([t]) gives t (or a new table) the leash.array metatable and returns it. */
int jsonlua_open(lua_State *L);

#endif
