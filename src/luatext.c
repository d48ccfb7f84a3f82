/* luatext: a protected push of malloc'd text. See luatext.h. */
#include "luatext.h"

#include <lauxlib.h>
#include <stdlib.h>

/* Protected body of luatext_pushfree: arg 1 is a borrowed C string. */
static int push_protected(lua_State *L)
{
  lua_pushstring(L, lua_touserdata(L, 1));
  return 1;
}

void luatext_pushfree(lua_State *L, char *text)
{
  if (!lua_checkstack(L, 2)) {
    free(text);
    luaL_error(L, "not enough memory");
  }
  /* A light C function and a light userdata take no memory: only the call can raise. */
  lua_pushcfunction(L, push_protected);
  lua_pushlightuserdata(L, text);
  int status = lua_pcall(L, 1, 1, 0);
  free(text);
  if (status != LUA_OK)
    lua_error(L);
}
