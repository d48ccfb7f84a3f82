/*
 * fuzz_json_lua: JSON text -> Lua -> JSON text -> Lua -> JSON text (src/json_lua.c).
 * Invariants: a failed decode pushes nothing and says why; whatever decodes also encodes
 * (decoded strings are UTF-8, reals finite, depth within the limit); the second encode,
 * done through the json module's own decode/encode, equals the first; and the first encode
 * means what the input meant (jansson compares the two trees). Under the capped allocator
 * (one input in four) a memory error may stop the run anywhere (fuzz_memory_error), with
 * nothing leaked (libFuzzer's leak check sees the jansson trees and encoded texts).
 */
#include <jansson.h>
#include <string.h>

#include "fuzz.h"
#include "json_lua.h"

struct run {
  const char *data;
  size_t size;
  int capped;
  char *text1;          /* jsonlua_encode's result: freed by the caller, even after a raise */
};

static int round_trip(lua_State *L);
static json_t *jansson_load(const char *text, size_t len);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct fuzz_cap cap;
  struct run r = { (const char *)data, size, 0, NULL };
  lua_State *L = fuzz_lua_state(&cap, fuzz_hash(data, size), size, &r.capped);
  int status;

  lua_pushcfunction(L, round_trip);
  lua_pushlightuserdata(L, &r);
  status = lua_pcall(L, 1, 0, 0);
  if (status != LUA_OK && !(r.capped && fuzz_memory_error(L, status))) {
    fprintf(stderr, "round trip raised (status %d, capped %d): %s\n", status, r.capped,
            lua_tostring(L, -1));
    abort();
  }
  lua_close(L);

  if (status == LUA_OK && r.text1 != NULL) {
    /* the text we wrote means what the input meant */
    json_t *in = jansson_load(r.data, r.size);
    json_t *out = jansson_load(r.text1, strlen(r.text1));
    FUZZ_CHECK(in != NULL && out != NULL);
    if (!json_equal(in, out)) {
      fprintf(stderr, "encoded text differs in meaning from the input: %s\n", r.text1);
      abort();
    }
    json_decref(in);
    json_decref(out);
  }
  free(r.text1);
  return 0;
}

/* [-1, +0, m] Protected body: arg 1 is the struct run. */
static int round_trip(lua_State *L)
{
  struct run *r = lua_touserdata(L, 1);
  char err[256] = "";
  int top = lua_gettop(L);
  size_t len2;
  const char *text2;

  if (jsonlua_decode(L, r->data, r->size, err, sizeof err) != 0) {
    FUZZ_CHECK(lua_gettop(L) == top);
    FUZZ_CHECK(err[0] != '\0');
    return 0;
  }
  FUZZ_CHECK(lua_gettop(L) == top + 1);

  r->text1 = jsonlua_encode(L, -1, err, sizeof err);
  FUZZ_CHECK(lua_gettop(L) == top + 1);
  if (r->text1 == NULL) {
    /* short of memory, encoding may report "out of Lua stack" rather than raise */
    if (r->capped && strstr(err, "out of") != NULL)
      return 0;
    fprintf(stderr, "a decoded value does not encode: %s\n", err);
    abort();
  }

  /* again, through the module functions (json.decode returns nil, msg on bad text) */
  lua_pushcfunction(L, jsonlua_open);
  lua_call(L, 0, 1);
  lua_getfield(L, -1, "encode");
  lua_getfield(L, -2, "decode");
  lua_pushstring(L, r->text1);   /* the encoder escapes NUL: no NUL byte in the text */
  lua_call(L, 1, 2);
  if (lua_isnil(L, -2)) {
    fprintf(stderr, "our own output does not decode: %s\n%s\n", lua_tostring(L, -1), r->text1);
    abort();
  }
  lua_pop(L, 1);
  lua_call(L, 1, 1);
  text2 = lua_tolstring(L, -1, &len2);
  FUZZ_CHECK(text2 != NULL);
  if (len2 != strlen(r->text1) || memcmp(text2, r->text1, len2) != 0) {
    fprintf(stderr, "second encode differs:\n%s\n%s\n", r->text1, text2);
    abort();
  }
  return 0;
}

/* The input as jsonlua_decode reads it (huge integers: the whole document as reals). */
static json_t *jansson_load(const char *text, size_t len)
{
  const size_t flags = JSON_DECODE_ANY | JSON_ALLOW_NUL;
  json_error_t jerr;
  json_t *j = json_loadb(text, len, flags, &jerr);
  if (j == NULL && json_error_code(&jerr) == json_error_numeric_overflow)
    j = json_loadb(text, len, flags | JSON_DECODE_INT_AS_REAL, &jerr);
  return j;
}
