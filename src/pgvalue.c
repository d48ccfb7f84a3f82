/* pgvalue: PostgreSQL text-format values as Lua values. See pgvalue.h. */
#include "pgvalue.h"

#include <lauxlib.h>
#include <math.h>
#include <string.h>

#include "json_lua.h"

/* The OIDs we map (pg_type.dat); everything else is text. */
enum {
  OID_BOOL = 16,
  OID_INT8 = 20,
  OID_INT2 = 21,
  OID_INT4 = 23,
  OID_OID = 26,
  OID_JSON = 114,
  OID_FLOAT4 = 700,
  OID_FLOAT8 = 701,
  OID_NUMERIC = 1700,
  OID_JSONB = 3802
};

static int push_special_float(lua_State *L, const char *text, size_t len);
static void push_number(lua_State *L, const char *text, size_t len, int want_float);
static int text_is(const char *text, size_t len, const char *word);

void pgvalue_push(lua_State *L, unsigned int type_oid, const char *text, int len, int isnull)
{
  size_t n = len > 0 ? (size_t)len : 0;

  luaL_checkstack(L, 2, "column value");
  if (isnull) {
    lua_pushlightuserdata(L, NULL);
    return;
  }
  switch (type_oid) {
  case OID_BOOL:
    if (text_is(text, n, "t"))
      lua_pushboolean(L, 1);
    else if (text_is(text, n, "f"))
      lua_pushboolean(L, 0);
    else
      lua_pushlstring(L, text, n);
    break;
  case OID_INT2:
  case OID_INT4:
  case OID_INT8:
  case OID_OID:
    push_number(L, text, n, 0);
    break;
  case OID_FLOAT4:
  case OID_FLOAT8:
    if (!push_special_float(L, text, n))
      push_number(L, text, n, 1);
    break;
  case OID_NUMERIC:
    if (!push_special_float(L, text, n))
      push_number(L, text, n, 0);
    break;
  case OID_JSON:
  case OID_JSONB: {
    char err[128];
    if (jsonlua_decode(L, text, n, err, sizeof err) != 0)
      lua_pushlstring(L, text, n);
    break;
  }
  default:
    lua_pushlstring(L, text, n);
    break;
  }
}

/* [-0, +1|0, m] The spellings PostgreSQL uses for the floats that have no digits. */
static int push_special_float(lua_State *L, const char *text, size_t len)
{
  if (text_is(text, len, "NaN"))
    lua_pushnumber(L, (lua_Number)NAN);
  else if (text_is(text, len, "Infinity"))
    lua_pushnumber(L, (lua_Number)HUGE_VAL);
  else if (text_is(text, len, "-Infinity"))
    lua_pushnumber(L, -(lua_Number)HUGE_VAL);
  else
    return 0;
  return 1;
}

/* [-0, +1, m] Lua's own reader does the work: it is locale-proof (strtod alone would read
   "1.5" as 1 under a decimal-comma locale), gives an integer when the digits fit int64
   and a float when they do not. The Lua string copy supplies the terminating NUL that
   the reader needs. Unreadable text stays a string. */
static void push_number(lua_State *L, const char *text, size_t len, int want_float)
{
  size_t read;
  lua_pushlstring(L, text, len);
  read = lua_stringtonumber(L, lua_tostring(L, -1));
  if (read == 0)
    return;                          /* not a number: leave the string */
  if (read != len + 1) {
    lua_pop(L, 1);                   /* stopped at an embedded NUL: not a number either */
    return;
  }
  if (want_float && lua_isinteger(L, -1)) {
    /* float8 prints 3.0 as "3"; it is still a float */
    lua_Number d = (lua_Number)lua_tointeger(L, -1);
    lua_pop(L, 1);
    lua_pushnumber(L, d);
  }
  lua_remove(L, -2);
}

static int text_is(const char *text, size_t len, const char *word)
{
  return len == strlen(word) && memcmp(text, word, len) == 0;
}
