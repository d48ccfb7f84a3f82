/*
 * test_json_lua: the JSON <-> Lua bridge (json_lua.c) and PostgreSQL text values
 * (pgvalue.c). Each case builds its own lua_State with the json module as global `json`,
 * and checks from C and from small Lua chunks.
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "json_lua.h"
#include "pgvalue.h"

static lua_State *new_state(void);
static void close_state(lua_State *L);
static void run(lua_State *L, const char *chunk);
static char *encode_chunk(lua_State *L, const char *expr, char *err, size_t errlen);
static void check_encodes_to(lua_State *L, const char *expr, const char *want);
static void check_refused(lua_State *L, const char *expr, const char *want_in_err);
static void check_contains(const char *haystack, const char *needle);
static void check_round_trip(lua_State *L, const char *text);
static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize);

/* A Lua allocator with a ceiling, to make memory run out on purpose. */
struct cap {
  size_t used;
  size_t limit;
};

static lua_State *new_state(void)
{
  lua_State *L = luaL_newstate();
  CHECK(L != NULL);
  luaL_openlibs(L);
  luaL_requiref(L, "json", jsonlua_open, 1);
  lua_pop(L, 1);
  return L;
}

static void close_state(lua_State *L)
{
  CHECK_INT_EQ(lua_gettop(L), 0);   /* every helper left the stack as it found it */
  lua_close(L);
}

/* Runs a chunk; its assert()s report through the abort below. */
static void run(lua_State *L, const char *chunk)
{
  if (luaL_dostring(L, chunk) != LUA_OK) {
    fprintf(stderr, "lua chunk failed: %s\n--- chunk:\n%s\n", lua_tostring(L, -1), chunk);
    abort();
  }
  lua_settop(L, 0);
}

/* Evaluates expr in Lua and encodes the result with jsonlua_encode. */
static char *encode_chunk(lua_State *L, const char *expr, char *err, size_t errlen)
{
  char code[1024];
  char *text;
  snprintf(code, sizeof code, "return %s", expr);
  if (luaL_dostring(L, code) != LUA_OK) {
    fprintf(stderr, "expression failed: %s\n", lua_tostring(L, -1));
    abort();
  }
  CHECK_INT_EQ(lua_gettop(L), 1);
  text = jsonlua_encode(L, -1, err, errlen);
  CHECK_INT_EQ(lua_gettop(L), 1);
  lua_settop(L, 0);
  return text;
}

static void check_encodes_to(lua_State *L, const char *expr, const char *want)
{
  char err[256] = "";
  char *text = encode_chunk(L, expr, err, sizeof err);
  if (text == NULL)
    fprintf(stderr, "encoding %s failed: %s\n", expr, err);
  CHECK_STR_EQ(text, want);
  free(text);
}

static void check_refused(lua_State *L, const char *expr, const char *want_in_err)
{
  char err[256] = "";
  char *text = encode_chunk(L, expr, err, sizeof err);
  if (text != NULL)
    fprintf(stderr, "encoding %s gave %s\n", expr, text);
  CHECK(text == NULL);
  check_contains(err, want_in_err);
}

static void check_contains(const char *haystack, const char *needle)
{
  if (strstr(haystack, needle) == NULL) {
    fprintf(stderr, "\"%s\" does not contain \"%s\"\n", haystack, needle);
    abort();
  }
}

/* Decoding and re-encoding text written in the encoder's own form gives it back. */
static void check_round_trip(lua_State *L, const char *text)
{
  char err[256] = "";
  char *again;
  if (jsonlua_decode(L, text, strlen(text), err, sizeof err) != 0) {
    fprintf(stderr, "decoding %s failed: %s\n", text, err);
    abort();
  }
  again = jsonlua_encode(L, -1, err, sizeof err);
  lua_pop(L, 1);
  CHECK_STR_EQ(again, text);
  free(again);
}

static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
  struct cap *c = ud;
  size_t old = ptr != NULL ? osize : 0;   /* with ptr NULL, osize is a type tag */
  void *p;
  if (nsize == 0) {
    free(ptr);
    c->used -= old;
    return NULL;
  }
  if (nsize > old && c->used + (nsize - old) > c->limit)
    return NULL;
  p = realloc(ptr, nsize);
  if (p != NULL)
    c->used = c->used - old + nsize;
  return p;
}

static void integers_stay_integers(void)
{
  lua_State *L = new_state();
  run(L,
      "local v = json.decode('1')\n"
      "assert(math.type(v) == 'integer' and v == 1)\n"
      "local t = json.decode('{\"n\": -5, \"big\": 9007199254740993, "
      "\"max\": 9223372036854775807, \"min\": -9223372036854775808}')\n"
      "assert(math.type(t.n) == 'integer' and t.n == -5)\n"
      "assert(math.type(t.big) == 'integer' and t.big == 9007199254740993)\n"
      "assert(t.max == math.maxinteger and t.min == math.mininteger)\n"
      "assert(json.encode(3) == '3')\n"
      "assert(json.encode(math.maxinteger) == '9223372036854775807')\n"
      "assert(json.encode(math.mininteger) == '-9223372036854775808')\n");
  check_round_trip(L, "[0,-1,9007199254740993,9223372036854775807]");
  close_state(L);
}

static void floats_stay_floats(void)
{
  lua_State *L = new_state();
  run(L,
      "local v = json.decode('1.0')\n"
      "assert(math.type(v) == 'float' and v == 1.0)\n"
      "assert(math.type(json.decode('2e3')) == 'float')\n"
      "assert(json.encode(1.0) == '1.0')\n"
      "assert(json.encode(-0.25) == '-0.25')\n"
      "assert(json.decode(json.encode(0.1)) == 0.1)\n"
      "assert(json.decode(json.encode(1/3)) == 1/3)\n"
      "assert(math.type(json.decode(json.encode(2^53))) == 'float')\n");
  check_encodes_to(L, "{ x = 2.5, y = 1e300 }", "{\"x\":2.5,\"y\":1.0000000000000001e300}");
  close_state(L);
}

static void null_round_trips_as_sentinel(void)
{
  lua_State *L = new_state();
  char err[256];

  CHECK_INT_EQ(jsonlua_decode(L, "null", 4, err, sizeof err), 0);
  CHECK(lua_islightuserdata(L, -1) && lua_touserdata(L, -1) == NULL);
  lua_pop(L, 1);
  run(L,
      "assert(json.decode('null') == json.null)\n"
      "local t = json.decode('{\"a\": null, \"b\": [null, 1]}')\n"
      "assert(t.a == json.null and t.a ~= nil)\n"
      "assert(#t.b == 2 and t.b[1] == json.null and t.b[2] == 1)\n"
      "assert(json.encode(json.null) == 'null')\n"
      "assert(json.encode(nil) == 'null')\n");
  check_round_trip(L, "{\"a\":null,\"b\":[null,1]}");
  close_state(L);
}

static void empty_array_and_empty_object_round_trip(void)
{
  lua_State *L = new_state();
  check_round_trip(L, "[]");
  check_round_trip(L, "{}");
  check_round_trip(L, "{\"a\":[],\"b\":{},\"c\":[[],{}]}");
  check_encodes_to(L, "{}", "{}");
  check_encodes_to(L, "json.array()", "[]");
  check_encodes_to(L, "json.array({})", "[]");
  check_encodes_to(L, "json.array({ 'x', 'y' })", "[\"x\",\"y\"]");
  run(L,
      "local a = json.decode('[]')\n"
      "assert(next(a) == nil and getmetatable(a) == 'leash.array')\n"
      "assert(getmetatable(json.decode('{}')) == nil)\n"
      "-- a decoded array stays an array after being emptied and refilled\n"
      "local b = json.decode('[1]'); b[1] = nil\n"
      "assert(json.encode(b) == '[]')\n"
      "b[1] = 'z'; assert(json.encode(b) == '[\"z\"]')\n"
      "assert(not pcall(setmetatable, a, {}))\n");
  close_state(L);
}

static void nested_round_trip_is_identical(void)
{
  lua_State *L = new_state();
  check_round_trip(L,
                   "{\"a\":[1,2.5,\"x\\u0000y\",true,false,null,{\"b\":[]}],"
                   "\"c\":{\"d\":-3,\"e\":\"\xc3\xa9\\\"\\\\\\n\",\"f\":{\"g\":{\"h\":[[[1]]]}}},"
                   "\"z\":\"\xf0\x9f\x98\x80\"}");
  /* keys in any order come back sorted, whitespace goes */
  run(L,
      "local s = json.encode(json.decode(' { \"b\" : 1 , \"a\" : [ 2 , 3 ] } '))\n"
      "assert(s == '{\"a\":[2,3],\"b\":1}', s)\n");
  /* top-level scalars are values too */
  check_round_trip(L, "\"just a string\"");
  check_round_trip(L, "true");
  check_round_trip(L, "-12");
  close_state(L);
}

static void strings_may_hold_nul(void)
{
  lua_State *L = new_state();
  run(L,
      "local s = json.decode('\"a\\\\u0000b\"')\n"
      "assert(s == 'a\\0b' and #s == 3)\n"
      "assert(json.encode('a\\0b') == '\"a\\\\u0000b\"')\n");
  close_state(L);
}

/* Keys may not: "\u0000" in a key is refused by jansson and by jsonb, so the encoder
   would write text that nothing reads back (found by fuzz_json_encode). */
static void keys_may_not_hold_nul(void)
{
  lua_State *L = new_state();
  char err[256];

  check_refused(L, "{ ['a\\0b'] = true }", "NUL in table key (byte 2) at $[\"a?b\"]");
  check_refused(L, "{ x = { ['\\0'] = 1 } }", "NUL in table key (byte 1) at $.x[\"?\"]");
  CHECK_INT_EQ(jsonlua_decode(L, "{\"a\\u0000b\":true}", 17, err, sizeof err), -1);
  CHECK_INT_EQ(lua_gettop(L), 0);
  close_state(L);
}

static void duplicate_keys_keep_the_last_value(void)
{
  lua_State *L = new_state();
  run(L,
      "local t = json.decode('{\"a\": 1, \"a\": 2}')\n"
      "assert(t.a == 2)\n");
  close_state(L);
}

static void deep_nesting_is_refused_not_crashed(void)
{
  lua_State *L = new_state();
  char err[256];
  size_t n = 100000;
  char *deep = malloc(2 * n);
  CHECK(deep != NULL);

  memset(deep, '[', n);
  CHECK_INT_EQ(jsonlua_decode(L, deep, n, err, sizeof err), -1);
  CHECK_INT_EQ(lua_gettop(L), 0);
  check_contains(err, "deeper than 128");

  /* exactly at the limit passes; one more level does not, in both directions */
  memset(deep, '[', 128);
  memset(deep + 128, ']', 128);
  CHECK_INT_EQ(jsonlua_decode(L, deep, 256, err, sizeof err), 0);
  lua_pop(L, 1);
  memset(deep, '[', 129);
  memset(deep + 129, ']', 129);
  CHECK_INT_EQ(jsonlua_decode(L, deep, 258, err, sizeof err), -1);
  CHECK_INT_EQ(lua_gettop(L), 0);
  check_contains(err, "deeper than 128");
  free(deep);

  run(L,
      "function nest(n) local t = {} for _ = 2, n do t = { t } end return t end\n"
      "assert(json.encode(nest(128)))\n"
      "local ok, msg = pcall(json.encode, nest(129))\n"
      "assert(not ok and msg:find('deeper than 128', 1, true), msg)\n"
      "local ok2, msg2 = pcall(json.encode, nest(100000))\n"
      "assert(not ok2 and msg2:find('deeper than 128', 1, true), msg2)\n");
  close_state(L);
}

static void huge_integer_becomes_float(void)
{
  lua_State *L = new_state();
  run(L,
      "local v = json.decode('18446744073709551616')\n"
      "assert(math.type(v) == 'float' and v == 2^64)\n"
      "local w = json.decode('-99999999999999999999')\n"
      "assert(math.type(w) == 'float' and w == -1e20)\n"
      "-- jansson decides per document: the small integer beside it is a float too\n"
      "local t = json.decode('[1, 99999999999999999999]')\n"
      "assert(t[1] == 1 and math.type(t[1]) == 'float' and t[2] == 1e20)\n"
      "-- a real out of double range stays an error\n"
      "local x, msg = json.decode('1e400')\n"
      "assert(x == nil and msg:find('json.decode: invalid JSON', 1, true), msg)\n");
  close_state(L);
}

static void invalid_utf8_is_refused(void)
{
  lua_State *L = new_state();
  char err[256];

  check_refused(L, "'\\xff'", "invalid UTF-8 in string (byte 1) at $");
  check_refused(L, "{ a = { 'ok', 'ab\\xc3' } }", "invalid UTF-8 in string (byte 3) at $.a[2]");
  check_refused(L, "'\\xc0\\x80'", "invalid UTF-8");         /* overlong NUL */
  check_refused(L, "'\\xed\\xa0\\x80'", "invalid UTF-8");     /* a lone surrogate */
  check_refused(L, "'\\xf4\\x90\\x80\\x80'", "invalid UTF-8"); /* above U+10FFFF */
  check_refused(L, "{ ['k\\xff'] = 1 }", "invalid UTF-8 in table key (byte 2) at $[\"k?\"]");
  check_encodes_to(L, "'\\u{e9}\\u{10FFFF}'", "\"\xc3\xa9\xf4\x8f\xbf\xbf\"");

  CHECK_INT_EQ(jsonlua_decode(L, "\"\xff\"", 3, err, sizeof err), -1);
  check_contains(err, "invalid JSON at line 1");
  CHECK_INT_EQ(lua_gettop(L), 0);
  close_state(L);
}

static void functions_are_refused_with_path(void)
{
  lua_State *L = new_state();
  char err[256];
  json_t *j;

  check_refused(L, "{ a = { b = { 1, 2, print } } }", "cannot encode a function at $.a.b[3]");
  check_refused(L, "coroutine.create(print)", "cannot encode a thread at $");
  check_refused(L, "{ f = io.stdout }", "cannot encode a userdata at $.f");
  check_refused(L, "{ ['two words'] = { print } }",
                "cannot encode a function at $[\"two words\"][1]");

  /* the C entry point says the same and leaves the stack alone */
  lua_pushlightuserdata(L, &j);
  j = jsonlua_to_json(L, -1, err, sizeof err);
  CHECK(j == NULL);
  CHECK_STR_EQ(err, "cannot encode a userdata at $");
  CHECK_INT_EQ(lua_gettop(L), 1);
  lua_pop(L, 1);
  close_state(L);
}

static void mixed_keys_are_refused(void)
{
  lua_State *L = new_state();
  check_refused(L, "{ 1, 2, x = 3 }",
                "cannot encode table key \"x\" at $: the table mixes integer and string keys");
  check_refused(L, "{ list = { a = 1, b = 2, [1] = 3 } }",
                "cannot encode table key 1 at $.list: the table mixes integer and string keys");
  check_refused(L, "{ [1] = 'a', [3] = 'c' }", "cannot encode table key 3 at $: keys must be exactly 1..n, but only 2 of 1..3");
  check_refused(L, "{ [1.5] = 'x' }", "cannot encode table key 1.5 at $: keys must be all strings or exactly 1..n");
  check_refused(L, "{ [0] = 'x' }", "cannot encode table key 0");
  check_refused(L, "{ [true] = 'x' }", "cannot encode table key true");
  check_refused(L, "{ [{}] = 'x' }", "cannot encode table key (a table)");
  check_refused(L, "json.array({ x = 1 })",
                "cannot encode table key \"x\" at $: a json.array table holds only keys 1..n");
  /* float keys with integer values are integers to Lua, so they still make an array */
  check_encodes_to(L, "{ [1.0] = 'a', [2] = 'b' }", "[\"a\",\"b\"]");
  check_encodes_to(L, "{ b = 1, a = 2 }", "{\"a\":2,\"b\":1}");
  close_state(L);
}

static void cycles_are_refused(void)
{
  lua_State *L = new_state();
  char err[256];
  check_refused(L, "(function() local t = {} t.self = t return t end)()",
                "deeper than 128 levels (a cycle?) at $.self.self.self");
  check_refused(L, "(function() local a = json.array() a[1] = { a } return a end)()",
                "deeper than 128");
  run(L,
      "local t = {}; t[1] = t\n"
      "local ok, msg = pcall(json.encode, t)\n"
      "assert(not ok and msg:find('a cycle', 1, true), msg)\n");
  /* a long path still fits the caller's buffer, cut cleanly */
  CHECK_INT_EQ(luaL_dostring(L, "local t = {} t.self = t return t"), LUA_OK);
  CHECK(jsonlua_to_json(L, -1, err, 40) == NULL);
  CHECK_INT_EQ(strlen(err), 39);
  lua_pop(L, 1);
  close_state(L);
}

static void nan_is_refused(void)
{
  lua_State *L = new_state();
  check_refused(L, "{ x = 0/0 }", "cannot encode NaN at $.x");
  check_refused(L, "{ x = { math.huge } }", "cannot encode inf at $.x[1]");
  check_refused(L, "-math.huge", "cannot encode -inf at $");
  close_state(L);
}

static void decode_errors_name_line_and_column(void)
{
  lua_State *L = new_state();
  char err[256];
  const char *bad = "{\n  \"a\": 1,\n  \"b\": tru\n}";
  CHECK_INT_EQ(jsonlua_decode(L, bad, strlen(bad), err, sizeof err), -1);
  check_contains(err, "invalid JSON at line 3, column ");
  CHECK_INT_EQ(jsonlua_decode(L, "", 0, err, sizeof err), -1);
  check_contains(err, "invalid JSON at line 1");
  CHECK_INT_EQ(jsonlua_decode(L, "[1] x", 5, err, sizeof err), -1);
  check_contains(err, "invalid JSON");
  /* the length is honoured: bytes past it are not read */
  CHECK_INT_EQ(jsonlua_decode(L, "[1]garbage", 3, err, sizeof err), 0);
  lua_pop(L, 1);
  close_state(L);
}

/* [-0, +1, m] One cell given as a C string. */
#define PG(oid, text, isnull) \
  pgvalue_push(L, (oid), (text), (int)strlen(text), (isnull))

static void pgvalue_maps_types(void)
{
  lua_State *L = new_state();

  PG(23, "", 1);
  CHECK(lua_islightuserdata(L, -1) && lua_touserdata(L, -1) == NULL);
  PG(16, "t", 0);
  CHECK(lua_isboolean(L, -1) && lua_toboolean(L, -1));
  PG(16, "f", 0);
  CHECK(lua_isboolean(L, -1) && !lua_toboolean(L, -1));
  lua_settop(L, 0);

  PG(21, "-32768", 0);
  CHECK(lua_isinteger(L, -1) && lua_tointeger(L, -1) == -32768);
  PG(23, "2147483647", 0);
  CHECK(lua_isinteger(L, -1) && lua_tointeger(L, -1) == 2147483647);
  PG(20, "-9223372036854775808", 0);
  CHECK(lua_isinteger(L, -1) && lua_tointeger(L, -1) == LUA_MININTEGER);
  PG(26, "4294967295", 0);
  CHECK(lua_isinteger(L, -1) && lua_tointeger(L, -1) == 4294967295LL);
  lua_settop(L, 0);

  PG(701, "3", 0);   /* float8 prints 3.0 as "3" */
  CHECK(lua_type(L, -1) == LUA_TNUMBER && !lua_isinteger(L, -1) && lua_tonumber(L, -1) == 3.0);
  PG(700, "1.5", 0);
  CHECK(!lua_isinteger(L, -1) && lua_tonumber(L, -1) == 1.5);
  PG(701, "-1.2345678901234567e+300", 0);
  CHECK(!lua_isinteger(L, -1) && lua_tonumber(L, -1) == -1.2345678901234567e+300);
  PG(701, "NaN", 0);
  CHECK(lua_type(L, -1) == LUA_TNUMBER && isnan(lua_tonumber(L, -1)));
  PG(700, "Infinity", 0);
  CHECK(isinf(lua_tonumber(L, -1)) && lua_tonumber(L, -1) > 0);
  PG(701, "-Infinity", 0);
  CHECK(isinf(lua_tonumber(L, -1)) && lua_tonumber(L, -1) < 0);
  lua_settop(L, 0);

  PG(1700, "42", 0);
  CHECK(lua_isinteger(L, -1) && lua_tointeger(L, -1) == 42);
  PG(1700, "-42", 0);
  CHECK(lua_isinteger(L, -1) && lua_tointeger(L, -1) == -42);
  PG(1700, "12.50", 0);
  CHECK(!lua_isinteger(L, -1) && lua_tonumber(L, -1) == 12.5);
  PG(1700, "1.00", 0);
  CHECK(!lua_isinteger(L, -1) && lua_tonumber(L, -1) == 1.0);
  PG(1700, "123456789012345678901234567890", 0);
  CHECK(lua_type(L, -1) == LUA_TNUMBER && !lua_isinteger(L, -1) &&
        lua_tonumber(L, -1) == 123456789012345678901234567890.0);
  PG(1700, "9223372036854775807", 0);
  CHECK(lua_isinteger(L, -1) && lua_tointeger(L, -1) == LUA_MAXINTEGER);
  PG(1700, "0.000000000000000000000000000001", 0);
  CHECK(!lua_isinteger(L, -1) && lua_tonumber(L, -1) == 1e-30);
  PG(1700, "NaN", 0);
  CHECK(lua_type(L, -1) == LUA_TNUMBER && isnan(lua_tonumber(L, -1)));
  PG(1700, "-Infinity", 0);
  CHECK(isinf(lua_tonumber(L, -1)) && lua_tonumber(L, -1) < 0);
  lua_settop(L, 0);

  PG(3802, "{\"a\": [1, null], \"b\": {\"c\": 2.5}}", 0);
  PG(114, "[]", 0);
  PG(3802, "{not json", 0);
  PG(25, "plain text", 0);
  PG(1184, "2024-01-02 03:04:05+00", 0);
  pgvalue_push(L, 17, "a\0b", 3, 0);   /* bytea (hex text in practice), any bytes kept */
  PG(23, "12abc", 0);                  /* not what the type promises: kept as text */
  lua_setglobal(L, "bad_int");
  lua_setglobal(L, "bytes");
  lua_setglobal(L, "ts");
  lua_setglobal(L, "text");
  lua_setglobal(L, "broken");
  lua_setglobal(L, "arr");
  lua_setglobal(L, "doc");
  run(L,
      "assert(math.type(doc.a[1]) == 'integer' and doc.a[2] == json.null)\n"
      "assert(doc.b.c == 2.5)\n"
      "assert(next(arr) == nil and json.encode(arr) == '[]')\n"
      "assert(broken == '{not json')\n"
      "assert(text == 'plain text' and ts == '2024-01-02 03:04:05+00')\n"
      "assert(bytes == 'a\\0b')\n"
      "assert(bad_int == '12abc')\n");
  close_state(L);
}

static void module_encode_raises_decode_returns_nil(void)
{
  lua_State *L = new_state();
  run(L,
      "local ok, msg = pcall(json.encode, { f = print })\n"
      "assert(not ok and msg == 'json.encode: cannot encode a function at $.f', msg)\n"
      "local v, err = json.decode('{\"a\": ')\n"
      "assert(v == nil and err:find('^json%.decode: invalid JSON at line 1, column %d+: '), err)\n"
      "local v2, err2 = json.decode(string.rep('[', 200) .. string.rep(']', 200))\n"
      "assert(v2 == nil and err2 == 'json.decode: JSON nested deeper than 128 levels', err2)\n"
      "-- misuse raises: these are bugs in the script, not bad data\n"
      "assert(not pcall(json.decode))\n"
      "assert(not pcall(json.decode, {}))\n"
      "assert(not pcall(json.encode))\n"
      "assert(not pcall(json.array, 'x'))\n"
      "local t = {}\n"
      "assert(json.array(t) == t and getmetatable(t) == 'leash.array')\n"
      "assert(json.encode(json.array(nil)) == '[]')\n"
      "assert(json.null ~= nil and type(json.null) == 'userdata')\n");
  close_state(L);
}

/* The jansson tree (decode) and the malloc'd text (encode) are freed even when the Lua
   side runs out of memory halfway; valgrind and LeakSanitizer see the rest. */
static void memory_exhaustion_raises_without_leaking(void)
{
  struct cap cap = { 0, SIZE_MAX };
  lua_State *L = lua_newstate(capped_alloc, &cap);
  luaL_Buffer b;
  CHECK(L != NULL);
  luaL_openlibs(L);
  luaL_requiref(L, "json", jsonlua_open, 1);
  lua_pop(L, 1);

  luaL_buffinit(L, &b);
  luaL_addstring(&b, "[");
  for (int i = 0; i < 20000; i++)
    luaL_addstring(&b, i > 0 ? ",\"some text\"" : "\"some text\"");
  luaL_addstring(&b, "]");
  luaL_pushresult(&b);
  lua_setglobal(L, "text");
  run(L, "big = {} for i = 1, 20000 do big[i] = 'some text' .. i end");

  CHECK_INT_EQ(luaL_dostring(L, "return json.decode, text"), LUA_OK);
  cap.limit = cap.used + 64 * 1024;
  CHECK_INT_EQ(lua_pcall(L, 1, 1, 0), LUA_ERRMEM);
  cap.limit = SIZE_MAX;
  lua_settop(L, 0);

  CHECK_INT_EQ(luaL_dostring(L, "return json.encode, big"), LUA_OK);
  cap.limit = cap.used + 16 * 1024;
  CHECK_INT_EQ(lua_pcall(L, 1, 1, 0), LUA_ERRMEM);
  cap.limit = SIZE_MAX;
  lua_settop(L, 0);

  /* and the state is still usable afterwards */
  run(L, "assert(#json.decode(text) == 20000 and #json.encode(big) > 200000)");
  close_state(L);
}

static const struct check_case cases[] = {
  { "integers_stay_integers", integers_stay_integers },
  { "floats_stay_floats", floats_stay_floats },
  { "null_round_trips_as_sentinel", null_round_trips_as_sentinel },
  { "empty_array_and_empty_object_round_trip", empty_array_and_empty_object_round_trip },
  { "nested_round_trip_is_identical", nested_round_trip_is_identical },
  { "strings_may_hold_nul", strings_may_hold_nul },
  { "keys_may_not_hold_nul", keys_may_not_hold_nul },
  { "duplicate_keys_keep_the_last_value", duplicate_keys_keep_the_last_value },
  { "deep_nesting_is_refused_not_crashed", deep_nesting_is_refused_not_crashed },
  { "huge_integer_becomes_float", huge_integer_becomes_float },
  { "invalid_utf8_is_refused", invalid_utf8_is_refused },
  { "functions_are_refused_with_path", functions_are_refused_with_path },
  { "mixed_keys_are_refused", mixed_keys_are_refused },
  { "cycles_are_refused", cycles_are_refused },
  { "nan_is_refused", nan_is_refused },
  { "decode_errors_name_line_and_column", decode_errors_name_line_and_column },
  { "pgvalue_maps_types", pgvalue_maps_types },
  { "module_encode_raises_decode_returns_nil", module_encode_raises_decode_returns_nil },
  { "memory_exhaustion_raises_without_leaking", memory_exhaustion_raises_without_leaking },
  { NULL, NULL }
};

int main(int argc, char **argv)
{
  return check_main(cases, argc, argv);
}
