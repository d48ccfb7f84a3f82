/*
 * luatext: malloc'd C text handed to Lua. A push can raise (memory), and a raise unwinds
 * past the free() after it, so `lua_pushstring(L, s); free(s);` leaks on the error path;
 * this pushes under protection and frees on every path. Relies on the Lua C API only.
 */
#ifndef LEASH_LUATEXT_H
#define LEASH_LUATEXT_H

#include <lua.h>

/* [-0, +1, m] Pushes the malloc'd C string text and frees it, also when the push raises. */
void luatext_pushfree(lua_State *L, char *text);

#endif
