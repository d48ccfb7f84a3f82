/*
 * api_env: leash.env(name), the only way a script reads the environment. It answers only
 * for the names the operator allowed (`leash run --env-allow`, secrets.h) and raises for any
 * other, so a script cannot go looking for what the process happens to hold. The values are
 * the ones read at start; the host redacts them from every log line and task error it
 * writes (log.c, outcome.c).
 */
#include "api.h"

#include "secrets.h"

#include <lauxlib.h>

/* leash.env(name): the value of an allowed variable, or nil when it is allowed but unset
   (so a script can say which setting is missing); raises for a name not allowed. */
int api_env(lua_State *L)
{
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  const char *value;
  if (!secrets_lookup(name, &value)) {
    lua_pushlstring(L, name, len > 64 ? 64 : len);   /* a name, not a page of text */
    return luaL_error(L, "leash.env: '%s%s' is not allowed (the worker allows only the names "
                      "given with --env-allow)", lua_tostring(L, -1), len > 64 ? "..." : "");
  }
  if (value)
    lua_pushstring(L, value);
  else
    lua_pushnil(L);
  return 1;
}
