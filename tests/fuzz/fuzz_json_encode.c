/*
 * fuzz_json_encode: Lua values a script could build, through jsonlua_encode
 * (src/json_lua.c). fuzz_json_lua only meets values that came from JSON; here the input is
 * a little stack program that builds any mix of what the encoder must sort out: holes,
 * zero/negative/float/boolean keys, string keys beside 1..n, json.array tables, NaN and
 * infinities, strings with NUL and invalid UTF-8 (as values and as keys), functions,
 * userdata, other metatables, shared subtables and cycles.
 * Invariants: the stack is left as it was; an encoded text decodes, and encoding that
 * again gives the same text; a refusal has a message that names the place ("at $...") and
 * is valid UTF-8 (it may end up in a JSON log line). Under the capped allocator (one input
 * in four) memory errors may end the run (fuzz_memory_error), without leaking.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "json_lua.h"

#define MAX_STACK 48

struct program {
  const uint8_t *p, *end;
  int capped;
  char *text;           /* jsonlua_encode's result: freed by the caller, even after a raise */
};

static int build_and_encode(lua_State *L);
static void step(lua_State *L, struct program *pg, int base);
static int next_byte(struct program *pg);
static int no_op(lua_State *L);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct fuzz_cap cap;
  struct program pg = { data, data + size, 0, NULL };
  lua_State *L = fuzz_lua_state(&cap, fuzz_hash(data, size), size, &pg.capped);
  int status;

  lua_pushcfunction(L, build_and_encode);
  lua_pushlightuserdata(L, &pg);
  status = lua_pcall(L, 1, 0, 0);
  if (status != LUA_OK && !(pg.capped && fuzz_memory_error(L, status))) {
    fprintf(stderr, "encoding raised (status %d, capped %d): %s\n", status, pg.capped,
            lua_tostring(L, -1));
    abort();
  }
  lua_close(L);
  free(pg.text);
  return 0;
}

/* [-1, +0, m] Protected body: arg 1 is the struct program. */
static int build_and_encode(lua_State *L)
{
  struct program *pg = lua_touserdata(L, 1);
  char err[256];
  int base, top;
  json_t *check;

  lua_pushcfunction(L, jsonlua_open);   /* the module creates the leash.array metatable */
  lua_call(L, 0, 1);
  base = lua_gettop(L);
  luaL_checkstack(L, MAX_STACK + 8, "fuzz program");
  while (pg->p < pg->end)
    step(L, pg, base);
  if (lua_gettop(L) == base)
    return 0;

  top = lua_gettop(L);
  err[0] = '\0';
  pg->text = jsonlua_encode(L, -1, err, sizeof err);
  FUZZ_CHECK(lua_gettop(L) == top);
  if (pg->text == NULL) {
    if (pg->capped && strstr(err, "out of") != NULL)
      return 0;
    /* a refusal names the place and stays valid UTF-8 (jansson checks it for us) */
    FUZZ_CHECK(strstr(err, " at $") != NULL);
    check = json_string(err);
    if (check == NULL) {
      fprintf(stderr, "error message is not valid UTF-8: %s\n", err);
      abort();
    }
    json_decref(check);
    return 0;
  }

  /* what we wrote decodes, and is a fixed point of decode + encode */
  lua_getfield(L, base, "decode");
  lua_getfield(L, base, "encode");
  lua_pushvalue(L, -2);
  lua_pushstring(L, pg->text);
  lua_call(L, 1, 2);
  if (lua_isnil(L, -2)) {
    fprintf(stderr, "our own output does not decode: %s\n%s\n", lua_tostring(L, -1), pg->text);
    abort();
  }
  lua_pop(L, 1);
  lua_call(L, 1, 1);
  if (strcmp(lua_tostring(L, -1), pg->text) != 0) {
    fprintf(stderr, "decode + encode changed the text:\n%s\n%s\n", pg->text,
            lua_tostring(L, -1));
    abort();
  }
  return 0;
}

/* One instruction. Operands come from the following bytes (0 once the input ends). */
static void step(lua_State *L, struct program *pg, int base)
{
  static const char *const keys[] = {
    "a", "b", "1", "", "two words", "\xff", "a\0b", "\xc3\xa9", "\xed\xa0\x80",
    "0123456789012345678901234567890123456789012345678901234567890123",
  };
  static const size_t keylens[] = { 1, 1, 1, 0, 9, 1, 3, 2, 3, 64 };
  int op = next_byte(pg) % 16, n = lua_gettop(L) - base;

  if (n >= MAX_STACK && op != 12) {
    lua_settop(L, base + n - 1);   /* keep the program bounded */
    return;
  }
  switch (op) {
  case 0: lua_pushnil(L); break;
  case 1: lua_pushlightuserdata(L, NULL); break;                  /* json.null */
  case 2: lua_pushboolean(L, next_byte(pg) & 1); break;
  case 3: {
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
      u = (u << 8) | (uint64_t)next_byte(pg);
    /* small values often, so that keys land in and around 1..n */
    lua_pushinteger(L, (u >> 63) ? (lua_Integer)(int8_t)u : (lua_Integer)u);
    break;
  }
  case 4: {
    uint64_t u = 0;
    double d;
    for (int i = 0; i < 8; i++)
      u = (u << 8) | (uint64_t)next_byte(pg);
    memcpy(&d, &u, sizeof d);      /* any bit pattern: NaN, infinities, -0.0, 2.0 */
    lua_pushnumber(L, (lua_Number)d);
    break;
  }
  case 5: {
    char s[32];
    int len = next_byte(pg) % 32;
    for (int i = 0; i < len; i++)
      s[i] = (char)next_byte(pg);
    lua_pushlstring(L, s, (size_t)len);
    break;
  }
  case 6: lua_newtable(L); break;
  case 7:
    lua_newtable(L);
    luaL_setmetatable(L, JSONLUA_ARRAY_MT);
    break;
  case 8:                                   /* t[k] = v with t, k, v on top */
    if (n >= 3 && lua_istable(L, -3) && !lua_isnil(L, -2) &&
        !(lua_type(L, -2) == LUA_TNUMBER && isnan(lua_tonumber(L, -2))))
      lua_rawset(L, -3);
    break;
  case 9:                                   /* t[#t + 1] = v with t, v on top */
    if (n >= 2 && lua_istable(L, -2))
      lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    break;
  case 10:                                  /* copy a slot: shared tables, cycles */
    if (n > 0)
      lua_pushvalue(L, base + 1 + next_byte(pg) % n);
    break;
  case 11: lua_pushcfunction(L, no_op); break;
  case 12:
    if (n > 0)
      lua_pop(L, 1);
    break;
  case 13: lua_pushlightuserdata(L, pg); break;                   /* a host pointer */
  case 14:                                  /* a metatable the encoder must ignore */
    if (n >= 1 && lua_istable(L, -1)) {
      lua_newtable(L);
      lua_pushvalue(L, -2);
      lua_setfield(L, -2, "__index");
      lua_setmetatable(L, -2);
    }
    break;
  default: {
    int k = next_byte(pg) % (int)(sizeof keys / sizeof keys[0]);
    lua_pushlstring(L, keys[k], keylens[k]);
    break;
  }
  }
}

static int next_byte(struct program *pg)
{
  return pg->p < pg->end ? *pg->p++ : 0;
}

static int no_op(lua_State *L)
{
  (void)L;
  return 0;
}
