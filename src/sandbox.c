/* sandbox: the environment scripts see and the state they may keep. See sandbox.h.

   The design, in one place (docs/SECURITY.md says the same for users):

   - Globals. Loading (the chunk, the modules it requires, setup) writes into the load-time
     table G0. sandbox_freeze moves G0's contents into a private template S and leaves G0
     an empty read-only proxy of S, so a `local G = _G` kept by the script still reads but
     cannot write. Each task gets a fresh table T, a shallow copy of S (with `_G` = T and
     G0's load-time metatable, if the script set one), installed as the _ENV upvalue of
     every chunk loaded at load time; functions defined there share that upvalue cell, so
     they all see T. A global a task sets lives in T and is gone for the next task. Copying
     costs one table of ~40 entries per task and no lookup gets slower; an __index chain
     to S would cost a hop on every global access instead (and break rawget/pairs on _G).
   - What does persist is what the script itself keeps: chunk-level locals (upvalues) and
     the tables they or load-time globals point to. That is the documented way to keep
     something across tasks on purpose (a cache, a client), as module-level state is in
     OpenResty.
   - Libraries (string, table, math, utf8, coroutine, the reduced os) and the leash module
     (with its sub-tables) are empty proxies with a protected metatable: reads go through
     __index to a table scripts cannot reach, writes raise, pairs works through __pairs
     (whose iterator does not hand out the hidden table). rawset is not offered, and no C
     function the sandbox offers writes raw into a table argument, so nothing bypasses
     the proxy. The shared string metatable is locked (getmetatable("") is "string").
   - Metatables. setmetatable refuses a metatable with a __gc field (Lua runs finalizers
     with hooks off, so one can loop forever out of the deadline's reach; Lua marks an
     object for finalization only when its metatable has __gc at setmetatable time, so
     adding __gc later never takes effect). getmetatable returns a metatable only when the
     script set it; a host metatable (JSON arrays, query results) reads as "host", so a
     task cannot rewire values the next task gets.
   - Modules. require'd files found at load time run once and are kept; a plain module
     table is returned as a proxy, writable while loading (setup may configure it),
     read-only from the first task on. A module first required while a task runs
     lives only for that task (the next task loads it again), so it cannot carry state.
   - Bounded C loops: see the section "Bounded library functions" below. */
#include "sandbox.h"

#include "api.h"
#include "log.h"
#include "task_context.h"
#include "textfile.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_MASK 4095   /* library loops check the deadline every 4,096 elements */
#define SORT_MAX ((lua_Integer)1 << 20)
#define DATE_FORMAT_MAX 65536

/* Registry keys by address. */
static const char g0_key = 'G';        /* load-time globals (a proxy of S after freeze) */
static const char tmpl_key = 'S';      /* template of each task's globals */
static const char g0mt_key = 'T';      /* G0's load-time metatable, given to each task's T */
static const char chunks_key = 'C';    /* main chunks whose _ENV each task replaces */
static const char cur_key = 'E';       /* the globals code runs against right now */
static const char modules_key = 'M';   /* modules loaded at load time */
static const char task_modules_key = 'm';  /* modules first loaded by the current task */
static const char made_mt_key = 'W';   /* metatables the script set (weak keys) */
static const char size_key = 'N';      /* number of entries in S: each T's size */

static int l_entry(lua_State *L);
static void task_env(lua_State *L);
static void push_readonly(lua_State *L, int idx, const char *name, int deep);
static void push_module_proxy(lua_State *L, int idx, const char *name);
static int frozen(lua_State *L);
static int l_module_newindex(lua_State *L);
static int l_ro_newindex(lua_State *L);
static int l_ro_pairs(lua_State *L);
static int l_ro_next(lua_State *L);
static int l_setmetatable(lua_State *L);
static int l_getmetatable(lua_State *L);
static int l_require(lua_State *L);
static int l_print(lua_State *L);
static int has_metatable(lua_State *L, int idx);
static void tick(lua_State *L, lua_Integer *n);
static void check_tab(lua_State *L, int arg, int need);
static int l_tmove(lua_State *L);
static int l_tinsert(lua_State *L);
static int l_tremove(lua_State *L);
static int l_tconcat(lua_State *L);
static int l_srep(lua_State *L);
static int l_tsort(lua_State *L);
static int l_osdate(lua_State *L);
int sandbox_pattern_open(lua_State *L);   /* sandbox_pattern.c */

/* ======================================================================= environment */

void sandbox_open(lua_State *L)
{
  static const char *const base_names[] = {
    "assert", "error", "ipairs", "next", "pairs", "pcall", "rawequal", "rawget", "rawlen",
    "select", "tonumber", "tostring", "type", "xpcall", "_VERSION", NULL,
  };
  static const struct { const char *name; lua_CFunction open; } libs[] = {
    { LUA_STRLIBNAME, luaopen_string }, { LUA_TABLIBNAME, luaopen_table },
    { LUA_MATHLIBNAME, luaopen_math }, { LUA_UTF8LIBNAME, luaopen_utf8 },
    { LUA_COLIBNAME, luaopen_coroutine }, { NULL, NULL },
  };
  static const char *const os_names[] = { "time", "clock", "date", "difftime", NULL };
  int top = lua_gettop(L);

  luaL_requiref(L, LUA_GNAME, luaopen_base, 0);    /* the host's own globals, never shown */
  int real = lua_gettop(L);
  lua_newtable(L);                                 /* G0 */
  int env = lua_gettop(L);
  for (const char *const *n = base_names; *n; n++) {
    lua_getfield(L, real, *n);
    lua_setfield(L, env, *n);
  }
  lua_pushcfunction(L, l_setmetatable);
  lua_setfield(L, env, "setmetatable");
  lua_pushcfunction(L, l_getmetatable);
  lua_setfield(L, env, "getmetatable");
  lua_pushcfunction(L, l_print);
  lua_setfield(L, env, "print");
  lua_pushcfunction(L, l_require);
  lua_setfield(L, env, "require");
  lua_pushvalue(L, env);
  lua_setfield(L, env, "_G");

  for (int i = 0; libs[i].name; i++) {
    luaL_requiref(L, libs[i].name, libs[i].open, 0);
    int lib = lua_gettop(L);
    if (strcmp(libs[i].name, LUA_STRLIBNAME) == 0) {
      /* The real string table: the shared string metatable's __index, so ("x"):rep()
         must reach the bounded versions too. dump makes bytecode: no use in a task. */
      lua_pushnil(L);
      lua_setfield(L, lib, "dump");
      lua_getfield(L, lib, "rep");
      lua_pushcclosure(L, l_srep, 1);
      lua_setfield(L, lib, "rep");
      lua_pushcfunction(L, sandbox_pattern_open);
      lua_pushvalue(L, lib);
      lua_call(L, 1, 0);
    } else if (strcmp(libs[i].name, LUA_TABLIBNAME) == 0) {
      static const luaL_Reg t[] = {
        { "move", l_tmove }, { "insert", l_tinsert }, { "remove", l_tremove },
        { "concat", l_tconcat }, { NULL, NULL },
      };
      luaL_setfuncs(L, t, 0);
      lua_getfield(L, lib, "sort");
      lua_pushcclosure(L, l_tsort, 1);
      lua_setfield(L, lib, "sort");
    } else if (strcmp(libs[i].name, LUA_MATHLIBNAME) == 0) {
      /* The generator's state is the slot's: a task seeding it would choose the numbers
         the next tasks get. math.random stays, seeded by Lua at start. */
      lua_pushnil(L);
      lua_setfield(L, lib, "randomseed");
    }
    push_readonly(L, lib, libs[i].name, 0);
    lua_setfield(L, env, libs[i].name);
    lua_settop(L, env);
  }
  luaL_requiref(L, LUA_OSLIBNAME, luaopen_os, 0);
  lua_createtable(L, 0, 4);
  for (const char *const *n = os_names; *n; n++) {
    lua_getfield(L, -2, *n);
    if (strcmp(*n, "date") == 0)
      lua_pushcclosure(L, l_osdate, 1);
    lua_setfield(L, -2, *n);
  }
  push_readonly(L, lua_gettop(L), "os", 0);
  lua_setfield(L, env, "os");
  lua_settop(L, env);

  /* All strings share one metatable whose __index is the real string table; lock it. */
  lua_pushliteral(L, "");
  if (lua_getmetatable(L, -1)) {
    lua_pushliteral(L, "string");
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
  }
  lua_pop(L, 1);

  lua_pushvalue(L, env);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &cur_key);
  lua_newtable(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &chunks_key);
  lua_newtable(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &modules_key);
  lua_newtable(L);                                 /* weak-keyed set of script metatables */
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &made_mt_key);
  lua_pushvalue(L, env);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &g0_key);
  lua_settop(L, top);
}

void sandbox_bind_chunk(lua_State *L, int idx)
{
  idx = lua_absindex(L, idx);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &cur_key);
  if (!lua_setupvalue(L, idx, 1))                  /* a main chunk's only upvalue: _ENV */
    lua_pop(L, 1);
  if (frozen(L))
    return;                                        /* a task's module: lives for the task */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &chunks_key);
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
  lua_pop(L, 1);
}

void sandbox_freeze(lua_State *L)
{
  int top = lua_gettop(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &g0_key);
  int g0 = lua_gettop(L);
  lua_newtable(L);                                 /* S */
  int tmpl = lua_gettop(L);
  lua_Integer n = 0;
  lua_pushnil(L);
  while (lua_next(L, g0)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, tmpl);
    n++;
  }
  lua_pushinteger(L, n);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &size_key);
  /* Empty G0 (collect the keys first: clearing while traversing is allowed, but this reads
     plainly), keep the script's metatable for the tasks, make G0 a proxy of S. */
  if (lua_getmetatable(L, g0))
    lua_rawsetp(L, LUA_REGISTRYINDEX, &g0mt_key);
  lua_pushnil(L);
  while (lua_next(L, tmpl)) {
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_pushnil(L);
    lua_rawset(L, g0);
  }
  push_readonly(L, tmpl, "the load-time global table", 0);
  lua_getmetatable(L, -1);
  lua_setmetatable(L, g0);                         /* G0 now reads S and refuses writes */
  lua_pop(L, 1);
  lua_pushvalue(L, tmpl);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &tmpl_key);
  lua_settop(L, top);
}

void sandbox_wrap_handle(lua_State *L)
{
  lua_pushcclosure(L, l_entry, 1);
}

/* The per-task entry: fresh globals, then handle(...) with whatever it returns. */
static int l_entry(lua_State *L)
{
  task_env(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* [-0, +0, m] T = copy of S; every load-time chunk's _ENV = T; no task modules yet. */
static void task_env(lua_State *L)
{
  int top = lua_gettop(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &tmpl_key);
  int tmpl = lua_gettop(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &g0_key);
  int g0 = lua_gettop(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &size_key);
  int size = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  lua_createtable(L, 0, size);                     /* sized once: no rehash while copying */
  int t = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, tmpl)) {
    lua_pushvalue(L, -2);
    if (lua_rawequal(L, -2, g0))                   /* _G and its aliases name T */
      lua_pushvalue(L, t);
    else
      lua_pushvalue(L, -2);
    lua_rawset(L, t);
    lua_pop(L, 1);
  }
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &g0mt_key) == LUA_TTABLE)
    lua_setmetatable(L, t);
  else
    lua_pop(L, 1);
  lua_pushvalue(L, t);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &cur_key);
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &task_modules_key);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &chunks_key);
  lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    lua_pushvalue(L, t);
    if (!lua_setupvalue(L, -2, 1))
      lua_pop(L, 1);
    lua_pop(L, 1);
  }
  lua_settop(L, top);
}

/* [-0, +1, m] An empty table reading the table at idx and refusing writes. With deep,
   table fields of the target are replaced (in the target, which nothing else reaches) by
   their own proxies, so leash.json is as read-only as leash. */
static void push_readonly(lua_State *L, int idx, const char *name, int deep)
{
  idx = lua_absindex(L, idx);
  if (deep) {
    lua_pushnil(L);
    while (lua_next(L, idx)) {
      int plain = lua_type(L, -1) == LUA_TTABLE && lua_type(L, -2) == LUA_TSTRING;
      if (plain && lua_getmetatable(L, -1)) {
        lua_pop(L, 1);
        plain = 0;                                 /* an object with methods: left alone */
      }
      if (plain) {
        const char *sub = lua_pushfstring(L, "%s.%s", name, lua_tostring(L, -2));
        push_readonly(L, -2, sub, 1);
        lua_pushvalue(L, -4);
        lua_insert(L, -2);
        lua_rawset(L, idx);                        /* changing an existing field's value */
        lua_pop(L, 1);                             /* the name */
      }
      lua_pop(L, 1);
    }
  }
  lua_newtable(L);                                 /* the proxy */
  lua_createtable(L, 0, 4);
  lua_pushvalue(L, idx);
  lua_setfield(L, -2, "__index");
  lua_pushstring(L, name);
  lua_pushcclosure(L, l_ro_newindex, 1);
  lua_setfield(L, -2, "__newindex");
  lua_pushvalue(L, idx);
  lua_pushcclosure(L, l_ro_pairs, 1);
  lua_setfield(L, -2, "__pairs");
  lua_pushliteral(L, "read-only");
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
}

/* [-0, +1, m] push_readonly's proxy, but writable (into the module) until sandbox_freeze. */
static void push_module_proxy(lua_State *L, int idx, const char *name)
{
  idx = lua_absindex(L, idx);
  push_readonly(L, idx, name, 0);
  lua_getmetatable(L, -1);
  lua_pushstring(L, name);
  lua_pushvalue(L, idx);
  lua_pushcclosure(L, l_module_newindex, 2);
  lua_setfield(L, -2, "__newindex");
  lua_pop(L, 1);
}

static int frozen(lua_State *L)
{
  int f = lua_rawgetp(L, LUA_REGISTRYINDEX, &tmpl_key) != LUA_TNIL;
  lua_pop(L, 1);
  return f;
}

static int l_module_newindex(lua_State *L)
{
  if (frozen(L))
    return l_ro_newindex(L);
  lua_settop(L, 3);
  lua_rawset(L, lua_upvalueindex(2));
  return 0;
}

static int l_ro_newindex(lua_State *L)
{
  const char *name = lua_tostring(L, lua_upvalueindex(1));
  if (lua_type(L, 2) == LUA_TSTRING)
    return luaL_error(L, "cannot set %s.%s: %s is read-only in the sandbox", name,
                      lua_tostring(L, 2), name);
  return luaL_error(L, "cannot set a field of %s: it is read-only in the sandbox", name);
}

/* pairs(proxy): an iterator over the hidden table that never returns the table itself. */
static int l_ro_pairs(lua_State *L)
{
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_pushcclosure(L, l_ro_next, 1);
  lua_pushvalue(L, 1);
  lua_pushnil(L);
  return 3;
}

static int l_ro_next(lua_State *L)
{
  lua_settop(L, 2);
  if (lua_next(L, lua_upvalueindex(1)))
    return 2;
  lua_pushnil(L);
  return 1;
}

/* setmetatable(t, mt) as Lua's, but refusing __gc (see the top of the file) and noting
   mt as the script's own, which getmetatable may then return. */
static int l_setmetatable(lua_State *L)
{
  int t = lua_type(L, 2);
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_argexpected(L, t == LUA_TNIL || t == LUA_TTABLE, 2, "nil or table");
  if (t == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, 2) != LUA_TNIL)
      return luaL_error(L, "setmetatable: __gc is not allowed in the sandbox (a finalizer "
                        "would run outside the task's time limit)");
    lua_pop(L, 1);
  }
  if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
    return luaL_error(L, "cannot change a protected metatable");
  lua_settop(L, 2);
  if (t == LUA_TTABLE) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &made_mt_key);
    lua_pushvalue(L, 2);
    lua_pushboolean(L, 1);
    lua_rawset(L, -3);
    lua_pop(L, 1);
  }
  lua_setmetatable(L, 1);
  return 1;
}

/* getmetatable(v): __metatable when set, the metatable when the script set it, else the
   string "host" (shared host metatables stay out of reach). */
static int l_getmetatable(lua_State *L)
{
  luaL_checkany(L, 1);
  if (!lua_getmetatable(L, 1)) {
    lua_pushnil(L);
    return 1;
  }
  if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
    return 1;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &made_mt_key);
  lua_pushvalue(L, -2);
  if (lua_rawget(L, -2) == LUA_TBOOLEAN) {
    lua_pop(L, 2);
    return 1;
  }
  lua_pushliteral(L, "host");
  return 1;
}

/* require "leash" gives the host API; require "x.y" loads x/y.lua from the script's folder
   or a --lua-path folder as text, in the sandbox. Kept for the state when loaded at load
   time, for the task when first loaded by a task. */
static int l_require(lua_State *L)
{
  const char *name = luaL_checkstring(L, 1);
  struct task_ctx *ctx = taskctx_of(L);
  const struct script_host *host = ctx->host;
  int in_task = ctx->task != NULL;
  lua_settop(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &modules_key);
  if (lua_getfield(L, 2, name) != LUA_TNIL)
    return 1;
  lua_pop(L, 1);
  if (in_task && strcmp(name, "leash") != 0) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &task_modules_key) != LUA_TTABLE) {
      lua_pop(L, 1);
      lua_newtable(L);
      lua_pushvalue(L, -1);
      lua_rawsetp(L, LUA_REGISTRYINDEX, &task_modules_key);
    }
    if (lua_getfield(L, 3, name) != LUA_TNIL)
      return 1;
    lua_pop(L, 1);
    lua_replace(L, 2);                             /* cache = the task's */
  }
  int cache = 2;
  if (strcmp(name, "leash") == 0) {
    api_leash_open(L);
    push_readonly(L, -1, "leash", 1);
  } else {
    if (strstr(name, "..") || name[0] == '/' || name[0] == '.')
      return luaL_error(L, "require: bad module name '%s'", name);
    char err[512] = "", *text = NULL;
    const char *chunkname = NULL;
    size_t len;
    /* The script's folder first, then each --lua-path folder. The chunk's name ("@" and
       the path) is built before the file is read: between the read and the free below
       nothing may raise, or the text would leak (luaL_loadbufferx returns its errors). */
    for (int i = -1; i < host->nlua_path && !text; i++) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      luaL_addchar(&b, '@');
      luaL_addstring(&b, i < 0 ? ctx->dir : host->lua_path[i]);
      luaL_addchar(&b, '/');
      for (const char *p = name; *p; p++)
        luaL_addchar(&b, *p == '.' ? '/' : *p);
      luaL_addstring(&b, ".lua");
      luaL_pushresult(&b);
      chunkname = lua_tostring(L, -1);
      text = textfile_read(chunkname + 1, &len, err, sizeof err);
      if (!text)
        lua_pop(L, 1);
    }
    if (!text)
      return luaL_error(L, "require: module '%s' not found in the script's folder%s",
                        name, host->nlua_path ? " or --lua-path" : "");
    int rc = luaL_loadbufferx(L, text, len, chunkname, "t");
    if (ctx->module_read)
      ctx->module_read(ctx, name, text, len);
    free(text);
    if (rc != LUA_OK)
      return lua_error(L);
    sandbox_bind_chunk(L, -1);
    lua_pushstring(L, name);
    lua_call(L, 1, 1);
    if (lua_isnil(L, -1)) {
      lua_pop(L, 1);
      lua_pushboolean(L, 1);
    } else if (lua_type(L, -1) == LUA_TTABLE && !has_metatable(L, -1)) {
      /* A plain module table: read-only to its users once loading is over (setup may
         still configure it; the module's own code keeps the real table). One with a
         metatable (a class, a callable module) is returned as it is, so its metamethods
         keep working. */
      push_module_proxy(L, -1, name);
    }
  }
  lua_pushvalue(L, -1);
  lua_setfield(L, cache, name);
  return 1;
}

static int has_metatable(lua_State *L, int idx)
{
  if (!lua_getmetatable(L, idx))
    return 0;
  lua_pop(L, 1);
  return 1;
}

/* print goes to the host's log, tagged like leash.log.info. */
static int l_print(lua_State *L)
{
  int n = lua_gettop(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 1; i <= n; i++) {
    luaL_tolstring(L, i, NULL);
    luaL_addvalue(&b);
    if (i < n)
      luaL_addchar(&b, '\t');
  }
  luaL_pushresult(&b);
  char id[32], attempt[16];
  struct log_field f[TASKCTX_LOG_FIELDS + 1];
  int nf = taskctx_log_fields(taskctx_of(L), f, id, attempt);
  f[nf] = (struct log_field){ NULL, NULL };
  log_fields(LOG_INFO, f, "%s", lua_tostring(L, -1));
  return 0;
}

/* ============================================================ Bounded library functions

   Lua's count hook fires between VM instructions only, so a library function that loops
   in C is out of the deadline's reach. What is replaced, and the bound:
   - table.move, insert, remove, concat: the same semantics, checking the deadline every
     4,096 elements (insert/remove trust #t, which a __len metamethod can make huge);
     concat also refuses a result over SANDBOX_MAX_STRING.
   - table.sort without a comparator written in Lua: refuses more than SORT_MAX elements
     (Lua's quicksort is C then; 2^20 numbers take ~0.4 s, 2^22 ~1.7 s). With a Lua
     comparator (or Lua __lt metamethods) the hook fires in each comparison: no limit.
   - string.rep: refuses a result over SANDBOX_MAX_STRING before building it.
   - os.date: refuses a format over DATE_FORMAT_MAX bytes (each conversion is a strftime:
     a million "%c" take ~0.2 s and make 24 MB).
   - string.find, match, gmatch, gsub: a matcher that counts its steps and checks the
     deadline (sandbox_pattern.c).
   Left as they are, because their work is bounded by their input or by the stack: utf8.*
   (by the subject string, and utf8.char/codepoint by the number of values, at most the
   stack's limit of 1,000,000), table.unpack (same limit: "too many results"),
   string.format (widths and precisions of at most 2 digits), table.sort (its comparator
   and __lt are Lua code, where the hook fires; its array length is checked by Lua). */

#define TAB_R 1   /* read: __index */
#define TAB_W 2   /* write: __newindex */
#define TAB_L 4   /* length: __len */

/* A table, or a value whose metatable has the metamethods the function needs, as Lua's
   own table functions accept; else "table expected". */
static void check_tab(lua_State *L, int arg, int need)
{
  if (lua_type(L, arg) == LUA_TTABLE)
    return;
  static const char *const fields[] = { "__index", "__newindex", "__len" };
  int ok = lua_getmetatable(L, arg);
  if (ok) {
    for (int i = 0; i < 3 && ok; i++) {
      if (need & (1 << i)) {
        ok = lua_getfield(L, -1, fields[i]) != LUA_TNIL;
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);
  }
  if (!ok)
    luaL_checktype(L, arg, LUA_TTABLE);
}

static void tick(lua_State *L, lua_Integer *n)
{
  if ((++*n & TICK_MASK) == 0)
    taskctx_check_stop(L);
}

/* table.move(a1, f, e, t [, a2]) */
static int l_tmove(lua_State *L)
{
  lua_Integer f = luaL_checkinteger(L, 2);
  lua_Integer e = luaL_checkinteger(L, 3);
  lua_Integer t = luaL_checkinteger(L, 4);
  int tt = !lua_isnoneornil(L, 5) ? 5 : 1;
  lua_Integer steps = 0;
  check_tab(L, 1, TAB_R);
  check_tab(L, tt, TAB_W);
  if (e >= f) {
    luaL_argcheck(L, f > 0 || e < LUA_MAXINTEGER + f, 3, "too many elements to move");
    lua_Integer n = e - f + 1;
    luaL_argcheck(L, t <= LUA_MAXINTEGER - n + 1, 4, "destination wrap around");
    if (t > e || t <= f || (tt != 1 && !lua_compare(L, 1, tt, LUA_OPEQ))) {
      for (lua_Integer i = 0; i < n; i++) {
        lua_geti(L, 1, f + i);
        lua_seti(L, tt, t + i);
        tick(L, &steps);
      }
    } else {
      for (lua_Integer i = n - 1; i >= 0; i--) {
        lua_geti(L, 1, f + i);
        lua_seti(L, tt, t + i);
        tick(L, &steps);
      }
    }
  }
  lua_pushvalue(L, tt);
  return 1;
}

/* table.insert(t, [pos,] v) */
static int l_tinsert(lua_State *L)
{
  lua_Integer steps = 0, pos;
  check_tab(L, 1, TAB_R | TAB_W | TAB_L);
  lua_Integer e = luaL_len(L, 1);
  luaL_argcheck(L, e < LUA_MAXINTEGER, 1, "table too long");
  e++;                                             /* the first empty element */
  switch (lua_gettop(L)) {
  case 2:
    pos = e;
    break;
  case 3:
    pos = luaL_checkinteger(L, 2);
    luaL_argcheck(L, (lua_Unsigned)pos - 1u < (lua_Unsigned)e, 2, "position out of bounds");
    for (lua_Integer i = e; i > pos; i--) {
      lua_geti(L, 1, i - 1);
      lua_seti(L, 1, i);
      tick(L, &steps);
    }
    break;
  default:
    return luaL_error(L, "wrong number of arguments to 'insert'");
  }
  lua_seti(L, 1, pos);
  return 0;
}

/* table.remove(t [, pos]) */
static int l_tremove(lua_State *L)
{
  lua_Integer steps = 0;
  check_tab(L, 1, TAB_R | TAB_W | TAB_L);
  lua_Integer size = luaL_len(L, 1);
  lua_Integer pos = luaL_optinteger(L, 2, size);
  if (pos != size)   /* argument 1 in the message, as Lua 5.4.4 says it */
    luaL_argcheck(L, (lua_Unsigned)pos - 1u <= (lua_Unsigned)size, 1, "position out of bounds");
  lua_geti(L, 1, pos);
  for (; pos < size; pos++) {
    lua_geti(L, 1, pos + 1);
    lua_seti(L, 1, pos);
    tick(L, &steps);
  }
  lua_pushnil(L);
  lua_seti(L, 1, pos);
  return 1;
}

/* table.concat(t [, sep [, i [, j]]]) */
static int l_tconcat(lua_State *L)
{
  size_t lsep, total = 0;
  lua_Integer steps = 0;
  check_tab(L, 1, TAB_R | TAB_L);
  const char *sep = luaL_optlstring(L, 2, "", &lsep);
  lua_Integer i = luaL_optinteger(L, 3, 1);
  lua_Integer last = lua_isnoneornil(L, 4) ? luaL_len(L, 1) : luaL_checkinteger(L, 4);
  lua_settop(L, 4);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (; i <= last; i++) {
    size_t len;
    lua_geti(L, 1, i);
    if (!lua_isstring(L, -1))
      return luaL_error(L, "invalid value (%s) at index %I in table for 'concat'",
                        luaL_typename(L, -1), (LUAI_UACINT)i);
    lua_tolstring(L, -1, &len);
    total += len + (i < last ? lsep : 0);
    if (total > SANDBOX_MAX_STRING)
      return luaL_error(L, "table.concat: result over %d MB", (int)(SANDBOX_MAX_STRING >> 20));
    luaL_addvalue(&b);
    if (i < last)
      luaL_addlstring(&b, sep, lsep);
    tick(L, &steps);
    if (i == LUA_MAXINTEGER)
      break;
  }
  luaL_pushresult(&b);
  return 1;
}

/* string.rep(s, n [, sep]): Lua's, after checking the size of the result. */
static int l_srep(lua_State *L)
{
  size_t l, lsep;
  luaL_checklstring(L, 1, &l);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &lsep);
  if (n > 0 && l + lsep > 0 && (lua_Unsigned)n > SANDBOX_MAX_STRING / (l + lsep) + 1)
    return luaL_error(L, "string.rep: result over %d MB", (int)(SANDBOX_MAX_STRING >> 20));
  if (n > 0 && (lua_Unsigned)n * l + ((lua_Unsigned)n - 1) * lsep > SANDBOX_MAX_STRING)
    return luaL_error(L, "string.rep: result over %d MB", (int)(SANDBOX_MAX_STRING >> 20));
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

/* table.sort(t [, comp]): Lua's, after the size check above. */
static int l_tsort(lua_State *L)
{
  luaL_checkany(L, 1);
  int lua_comp = lua_isfunction(L, 2) && !lua_iscfunction(L, 2);
  if (!lua_comp) {
    lua_Integer n = luaL_len(L, 1);
    if (n > SORT_MAX)
      return luaL_error(L, "table.sort: %I elements without a comparator written in Lua "
                        "(the limit is %I: sort in parts, or pass a comparator)",
                        (LUAI_UACINT)n, (LUAI_UACINT)SORT_MAX);
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 0);
  return 0;
}

/* os.date([format [, time]]): Lua's, after the format's length check above. */
static int l_osdate(lua_State *L)
{
  size_t len = 0;
  if (lua_type(L, 1) == LUA_TSTRING)
    lua_tolstring(L, 1, &len);
  if (len > DATE_FORMAT_MAX)
    return luaL_error(L, "os.date: format of %d bytes (the limit is %d)", (int)len,
                      DATE_FORMAT_MAX);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}
