/*
 * fuzz_pgvalue: one text-format cell through pgvalue_push (src/pgvalue.c).
 * Input: byte 0 picks the type OID, byte 1 the flags (bit 0: NULL cell; bit 1: cut the
 * text at its first NUL, as text from libpq is for every type but bytea), the rest is the
 * cell's text, handed over in a buffer of exactly its length (no terminating NUL, so ASan
 * sees any read past it). Invariants: exactly one value is pushed; NULL is the sentinel;
 * whenever a string comes back it is the text, byte for byte; bool is a boolean exactly
 * for "t" and "f"; float4/float8 never give an integer; int and numeric text that is a
 * plain int64 gives that integer; json/jsonb gives what jsonlua_decode gives, or the text.
 * Under the capped allocator (one input in four) a memory error may end the run
 * (fuzz_memory_error), without a leak.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "json_lua.h"
#include "pgvalue.h"

static const unsigned int oids[] = {
  16, 20, 21, 23, 26, 114, 700, 701, 1700, 3802,   /* the mapped types */
  25, 1043, 17, 0, 4294967295u,                    /* text, varchar, bytea, odd values */
};

struct cell {
  unsigned int oid;
  const char *text;
  int len;
  int isnull;
  int capped;
};

static int push_and_check(lua_State *L);
static int is_plain_int64(const char *s, size_t len, long long *out);
static void check_same_json(lua_State *L, int a, int b);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct fuzz_cap cap;
  struct cell c;
  char *text;
  size_t n;
  lua_State *L;
  int status;

  if (size < 2 || size - 2 > 1 << 20)
    return 0;
  c.oid = oids[data[0] % (sizeof oids / sizeof oids[0])];
  c.isnull = data[1] & 1;
  n = size - 2;
  if (data[1] & 2) {
    const void *nul = memchr(data + 2, '\0', n);
    if (nul != NULL)
      n = (size_t)((const uint8_t *)nul - (data + 2));
  }
  text = malloc(n > 0 ? n : 1);
  FUZZ_CHECK(text != NULL);
  memcpy(text, data + 2, n);
  c.text = text;
  c.len = (int)n;

  L = fuzz_lua_state(&cap, fuzz_hash(data, size), size, &c.capped);
  lua_pushcfunction(L, push_and_check);
  lua_pushlightuserdata(L, &c);
  status = lua_pcall(L, 1, 0, 0);
  if (status != LUA_OK && !(c.capped && fuzz_memory_error(L, status))) {
    fprintf(stderr, "pgvalue_push raised (status %d, capped %d): %s\n", status, c.capped,
            lua_tostring(L, -1));
    abort();
  }
  lua_close(L);
  free(text);
  return 0;
}

/* [-1, +0, m] Protected body: arg 1 is the struct cell. */
static int push_and_check(lua_State *L)
{
  const struct cell *c = lua_touserdata(L, 1);
  size_t n = (size_t)c->len, slen;
  int top = lua_gettop(L);
  long long want;

  pgvalue_push(L, c->oid, c->text, c->len, c->isnull);
  FUZZ_CHECK(lua_gettop(L) == top + 1);
  if (c->isnull) {
    FUZZ_CHECK(lua_type(L, -1) == LUA_TLIGHTUSERDATA && lua_touserdata(L, -1) == NULL);
    return 0;
  }
  if (lua_type(L, -1) == LUA_TSTRING && c->oid != 114 && c->oid != 3802) {
    const char *s = lua_tolstring(L, -1, &slen);
    FUZZ_CHECK(slen == n && memcmp(s, c->text, n) == 0);
  }

  switch (c->oid) {
  case 16:
    if (n == 1 && (c->text[0] == 't' || c->text[0] == 'f')) {
      FUZZ_CHECK(lua_type(L, -1) == LUA_TBOOLEAN);
      FUZZ_CHECK(lua_toboolean(L, -1) == (c->text[0] == 't'));
    } else {
      FUZZ_CHECK(lua_type(L, -1) == LUA_TSTRING);
    }
    break;
  case 20: case 21: case 23: case 26: case 1700:
    FUZZ_CHECK(lua_type(L, -1) == LUA_TNUMBER || lua_type(L, -1) == LUA_TSTRING);
    if (lua_type(L, -1) == LUA_TNUMBER)
      FUZZ_CHECK(memchr(c->text, '\0', n) == NULL);
    if (is_plain_int64(c->text, n, &want)) {
      FUZZ_CHECK(lua_isinteger(L, -1));
      FUZZ_CHECK(lua_tointeger(L, -1) == want);
    }
    if (c->oid == 1700 && n == 3 && memcmp(c->text, "NaN", 3) == 0)
      FUZZ_CHECK(lua_type(L, -1) == LUA_TNUMBER && isnan(lua_tonumber(L, -1)));
    break;
  case 700: case 701:
    FUZZ_CHECK(lua_type(L, -1) == LUA_TNUMBER || lua_type(L, -1) == LUA_TSTRING);
    if (lua_type(L, -1) == LUA_TNUMBER) {
      FUZZ_CHECK(!lua_isinteger(L, -1));
      FUZZ_CHECK(memchr(c->text, '\0', n) == NULL);
    }
    break;
  case 114: case 3802: {
    char err[128];
    FUZZ_CHECK(!lua_isnil(L, -1));
    if (c->capped)
      break;   /* the comparison holds malloc'd text across calls that may raise */
    if (jsonlua_decode(L, c->text, n, err, sizeof err) == 0) {
      check_same_json(L, -2, -1);
    } else {
      const char *s = lua_tolstring(L, -1, &slen);
      FUZZ_CHECK(lua_type(L, -1) == LUA_TSTRING);
      FUZZ_CHECK(slen == n && memcmp(s, c->text, n) == 0);
    }
    break;
  }
  default:
    FUZZ_CHECK(lua_type(L, -1) == LUA_TSTRING);
    break;
  }
  return 0;
}

/* An integer as PostgreSQL prints int8: optional '-', digits, no leading zeros, in range. */
static int is_plain_int64(const char *s, size_t len, long long *out)
{
  char buf[32];
  char *end;
  size_t i = len > 0 && s[0] == '-' ? 1 : 0;
  if (len == i || len >= sizeof buf)
    return 0;
  if (s[i] == '0' && len > i + 1)
    return 0;
  for (size_t k = i; k < len; k++)
    if (s[k] < '0' || s[k] > '9')
      return 0;
  memcpy(buf, s, len);
  buf[len] = '\0';
  errno = 0;
  *out = strtoll(buf, &end, 10);
  return errno == 0 && *end == '\0';
}

/* The two values (json_lua's decode of the same text) encode to the same JSON text. */
static void check_same_json(lua_State *L, int a, int b)
{
  char err[256];
  char *ta, *tb;
  a = lua_absindex(L, a);
  b = lua_absindex(L, b);
  ta = jsonlua_encode(L, a, err, sizeof err);
  if (ta == NULL) {
    FUZZ_CHECK(strstr(err, "out of") != NULL);   /* short of memory: nothing to compare */
    return;
  }
  tb = jsonlua_encode(L, b, err, sizeof err);
  if (tb == NULL) {
    free(ta);
    FUZZ_CHECK(strstr(err, "out of") != NULL);
    return;
  }
  if (strcmp(ta, tb) != 0) {
    fprintf(stderr, "pgvalue json differs from jsonlua_decode:\n%s\n%s\n", ta, tb);
    abort();
  }
  free(ta);
  free(tb);
}
