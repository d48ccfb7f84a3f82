/* json_lua: JSON <-> Lua conversion on jansson. See json_lua.h. */
#include "json_lua.h"

#include "luatext.h"
#include "buf.h"

#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One step of the path to the value being encoded: a string key or a Lua index. */
struct path_seg {
  const char *key;         /* borrowed from the key on the Lua stack; NULL: use index */
  size_t keylen;
  lua_Integer index;
};

struct encoder {
  lua_State *L;
  int array_mt;            /* stack index of the leash.array metatable (nil if none yet) */
  char *err;
  size_t errlen;
  size_t max;              /* most bytes the text may take; 0 = no limit */
  size_t used;             /* a lower bound of the text's size so far */
  int too_big;
  struct path_seg path[JSONLUA_MAX_DEPTH];
};

static void push_array_mt(lua_State *L);
static void push_value(lua_State *L, const json_t *j, int mt);
static int push_json_protected(lua_State *L);
static json_t *to_json(lua_State *L, int idx, size_t max, int *too_big, char *err,
                       size_t errlen);
static int count_bytes(struct encoder *e, int depth, size_t n);
static int dump_bounded(const char *buf, size_t size, void *data);
static int json_too_deep(const json_t *j, int level);
static json_t *convert(struct encoder *e, int idx, int depth);
static json_t *convert_table(struct encoder *e, int idx, int depth);
static json_t *convert_array(struct encoder *e, int idx, int depth, lua_Integer n);
static json_t *convert_object(struct encoder *e, int idx, int depth);
static int utf8_valid(const char *s, size_t len, size_t *bad);
static void describe_key(lua_State *L, int idx, char *buf, size_t size);
static void describe_first_key(lua_State *L, int t, int want_string, char *buf, size_t size);
static void append(char *buf, size_t size, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
static void append_quoted(char *buf, size_t size, const char *s, size_t len);
static int is_identifier(const char *s, size_t len);
static void set_error(struct encoder *e, int depth, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
static void set_key_error(struct encoder *e, int depth, const char *key, const char *why);
static int l_json_encode(lua_State *L);
static int l_json_decode(lua_State *L);
static int l_json_array(lua_State *L);

/* Object keys longer than this are cut in error messages. */
#define KEY_SHOWN_MAX 48

/* Registry key (by address) of the state's encoding limit, an integer. */
static const char max_bytes_key = 'X';

static const luaL_Reg json_funcs[] = {
  { "encode", l_json_encode },
  { "decode", l_json_decode },
  { "array", l_json_array },
  { "null", NULL },
  { NULL, NULL }
};

/* {====================================================================
   JSON -> Lua
   ===================================================================== */

void jsonlua_push(lua_State *L, const json_t *j)
{
  int mt;
  luaL_checkstack(L, 2, "JSON value");
  push_array_mt(L);
  mt = lua_gettop(L);
  push_value(L, j, mt);
  lua_remove(L, mt);
}

int jsonlua_decode(lua_State *L, const char *text, size_t len, char *err, size_t errlen)
{
  const size_t flags = JSON_DECODE_ANY | JSON_ALLOW_NUL;
  json_error_t jerr;
  json_t *root;
  int status;

  /* Room for the protected call below, claimed before jansson allocates anything. */
  luaL_checkstack(L, 2, "JSON value");
  root = json_loadb(text, len, flags, &jerr);
  /* Only integer overflow is worth a second parse: a real that overflows fails again. */
  if (root == NULL && json_error_code(&jerr) == json_error_numeric_overflow)
    root = json_loadb(text, len, flags | JSON_DECODE_INT_AS_REAL, &jerr);
  if (root == NULL) {
    switch (json_error_code(&jerr)) {
    case json_error_stack_overflow:
      /* jansson's own cap (2048) is above ours; report the limit callers can rely on */
      snprintf(err, errlen, "JSON nested deeper than %d levels", JSONLUA_MAX_DEPTH);
      break;
    case json_error_out_of_memory:
      snprintf(err, errlen, "out of memory decoding JSON");
      break;
    default:
      snprintf(err, errlen, "invalid JSON at line %d, column %d: %s", jerr.line, jerr.column,
               jerr.text);
      break;
    }
    return -1;
  }
  if (json_too_deep(root, 0)) {
    json_decref(root);
    snprintf(err, errlen, "JSON nested deeper than %d levels", JSONLUA_MAX_DEPTH);
    return -1;
  }
  /* Pushing may raise a memory error; catch it so the tree is freed, then re-raise. */
  lua_pushcfunction(L, push_json_protected);
  lua_pushlightuserdata(L, root);
  status = lua_pcall(L, 1, 1, 0);
  json_decref(root);
  if (status != LUA_OK)
    lua_error(L);
  return 0;
}

/* [-0, +1, m] The array metatable, created on first use. __metatable hides it from
   getmetatable/setmetatable: it is shared by every array in the state, so a script that
   could change it would change how the next task's arrays behave. */
static void push_array_mt(lua_State *L)
{
  if (luaL_newmetatable(L, JSONLUA_ARRAY_MT)) {
    lua_pushliteral(L, JSONLUA_ARRAY_MT);
    lua_setfield(L, -2, "__metatable");
  }
}

/* [-0, +1, m] mt: stack index of the array metatable. */
static void push_value(lua_State *L, const json_t *j, int mt)
{
  switch (json_typeof(j)) {
  case JSON_OBJECT: {
    const char *key;
    size_t keylen;
    json_t *v;
    size_t n = json_object_size(j);
    if (!lua_checkstack(L, 3))   /* depth is capped far below the stack's limit: memory */
      luaL_error(L, "not enough memory for JSON");
    lua_createtable(L, 0, n > INT_MAX ? INT_MAX : (int)n);
    /* the foreach macro wants a non-const object; it only reads it */
    json_object_keylen_foreach((json_t *)j, key, keylen, v) {
      lua_pushlstring(L, key, keylen);
      push_value(L, v, mt);
      lua_rawset(L, -3);
    }
    break;
  }
  case JSON_ARRAY: {
    size_t n = json_array_size(j);
    if (!lua_checkstack(L, 2))   /* depth is capped far below the stack's limit: memory */
      luaL_error(L, "not enough memory for JSON");
    lua_createtable(L, n > INT_MAX ? INT_MAX : (int)n, 0);
    for (size_t i = 0; i < n; i++) {
      push_value(L, json_array_get(j, i), mt);
      lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    lua_pushvalue(L, mt);
    lua_setmetatable(L, -2);
    break;
  }
  case JSON_STRING:
    lua_pushlstring(L, json_string_value(j), json_string_length(j));
    break;
  case JSON_INTEGER:
    lua_pushinteger(L, (lua_Integer)json_integer_value(j));
    break;
  case JSON_REAL:
    lua_pushnumber(L, (lua_Number)json_real_value(j));
    break;
  case JSON_TRUE:
    lua_pushboolean(L, 1);
    break;
  case JSON_FALSE:
    lua_pushboolean(L, 0);
    break;
  case JSON_NULL:
    lua_pushlightuserdata(L, NULL);
    break;
  }
}

/* Protected body of jsonlua_decode's push: arg 1 is the borrowed json_t. */
static int push_json_protected(lua_State *L)
{
  const json_t *j = lua_touserdata(L, 1);
  jsonlua_push(L, j);
  return 1;
}

/* level: containers around j. Recurses at most JSONLUA_MAX_DEPTH deep, so a tree at
   jansson's own limit cannot exhaust the C stack. */
static int json_too_deep(const json_t *j, int level)
{
  if (json_is_array(j)) {
    if (level >= JSONLUA_MAX_DEPTH)
      return 1;
    for (size_t i = 0; i < json_array_size(j); i++)
      if (json_too_deep(json_array_get(j, i), level + 1))
        return 1;
  } else if (json_is_object(j)) {
    const char *key;
    json_t *v;
    if (level >= JSONLUA_MAX_DEPTH)
      return 1;
    json_object_foreach((json_t *)j, key, v) {
      if (json_too_deep(v, level + 1))
        return 1;
    }
  }
  return 0;
}

/* }==================================================================== */

/* {====================================================================
   Lua -> JSON
   ===================================================================== */

/*
 * The rules, in order:
 *   nil and the null sentinel -> null; booleans -> true/false;
 *   integers -> JSON integers; floats -> JSON reals (NaN and infinities are refused:
 *   JSON has no spelling for them);
 *   strings -> strings, which must be valid UTF-8 (they may hold NUL, object keys not:
 *   jansson refuses "\u0000" in a key, so the text could not be decoded again);
 *   a table with the leash.array metatable -> array; its keys must be exactly 1..n;
 *   a table whose keys are exactly 1..n (n > 0) -> array;
 *   a table whose keys are all strings -> object;
 *   an empty table without the array metatable -> {}: Lua cannot tell an empty list from
 *   an empty map, and an object is the safer guess for payloads; json.array{} gives [];
 *   any other key mix (holes, 0 or negative, float, boolean keys, strings beside 1..n)
 *   -> error naming the key;
 *   functions, userdata other than the sentinel, threads -> error naming the path.
 * Other metatables are ignored: tables are read raw, without __index or __pairs.
 * Paths read "$.a.b[3]": [3] is the Lua index (1-based), as the script author sees it.
 * Nesting beyond JSONLUA_MAX_DEPTH is refused, which is also how a cycle ends.
 */
json_t *jsonlua_to_json(lua_State *L, int idx, char *err, size_t errlen)
{
  return to_json(L, idx, 0, NULL, err, errlen);
}

void jsonlua_set_max_bytes(lua_State *L, size_t max)
{
  lua_pushinteger(L, (lua_Integer)max);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &max_bytes_key);
}

size_t jsonlua_max_bytes(lua_State *L)
{
  size_t max;
  /* no allocation: a registry field and an integer */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &max_bytes_key);
  max = lua_isinteger(L, -1) ? (size_t)lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  return max;
}

/* max: 0 or the most bytes the text may take; *too_big (when given) says the limit was the
   reason for a NULL. */
static json_t *to_json(lua_State *L, int idx, size_t max, int *too_big, char *err,
                       size_t errlen)
{
  struct encoder e;
  int top;
  json_t *j;

  idx = lua_absindex(L, idx);
  top = lua_gettop(L);
  /* The only calls that can raise come here, before anything is allocated. */
  luaL_checkstack(L, 1, "JSON encoding");
  luaL_getmetatable(L, JSONLUA_ARRAY_MT);
  e.L = L;
  e.array_mt = lua_gettop(L);
  e.err = err;
  e.errlen = errlen;
  e.max = max;
  e.used = 0;
  e.too_big = 0;
  if (err != NULL && errlen > 0)
    err[0] = '\0';
  j = convert(&e, idx, 0);
  lua_settop(L, top);
  if (too_big)
    *too_big = e.too_big;
  return j;
}

/* The text being dumped; the dump fails once it would pass max. */
struct bounded_buf {
  struct buf t;
  size_t max;
  int too_big;
};

static int dump_bounded(const char *buf, size_t size, void *data)
{
  struct bounded_buf *b = data;
  if (b->max && b->t.len + size > b->max) {
    b->too_big = 1;
    return -1;
  }
  return buf_add(&b->t, buf, size);
}

char *jsonlua_encode_max(lua_State *L, int idx, size_t max, int *too_big, char *err,
                         size_t errlen)
{
  int big = 0;
  json_t *j = to_json(L, idx, max, &big, err, errlen);
  struct bounded_buf b = { .max = max };
  if (too_big)
    *too_big = big;
  if (j == NULL)
    return NULL;
  /* jansson's allocator is malloc unless someone calls json_set_alloc_funcs; nothing in
     leash does. The callback stops the dump as soon as the text would pass max, so a value
     that grows when escaped cannot get past it either. */
  if (json_dump_callback(j, dump_bounded, &b, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY |
                         JSON_REAL_PRECISION(17)) != 0 || b.t.s == NULL) {
    buf_free(&b.t);
    if (b.too_big) {
      snprintf(err, errlen, "the JSON text is larger than the limit of %zu bytes", max);
      if (too_big)
        *too_big = 1;
    } else {
      snprintf(err, errlen, "out of memory encoding JSON");
    }
  }
  json_decref(j);
  return b.t.s;
}

char *jsonlua_encode(lua_State *L, int idx, char *err, size_t errlen)
{
  return jsonlua_encode_max(L, idx, jsonlua_max_bytes(L), NULL, err, errlen);
}

/* [-0, +0, -] Counts n more bytes of text; 0 once past the limit, with the error set. The
   count is a lower bound of the text (strings unescaped, one byte per scalar or
   separator), so the tree jansson builds stays within about the limit as well. */
static int count_bytes(struct encoder *e, int depth, size_t n)
{
  e->used += n;
  if (e->max == 0 || e->used <= e->max)
    return 1;
  e->too_big = 1;
  set_error(e, depth, "the JSON text is larger than the limit of %zu bytes", e->max);
  return 0;
}

/* [-0, +0, -] depth: path segments in use (containers around the value at idx). */
static json_t *convert(struct encoder *e, int idx, int depth)
{
  lua_State *L = e->L;
  json_t *j = NULL;

  if (!count_bytes(e, depth, 1))
    return NULL;
  switch (lua_type(L, idx)) {
  case LUA_TNIL:
    return json_null();
  case LUA_TBOOLEAN:
    return json_boolean(lua_toboolean(L, idx));
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) {
      j = json_integer((json_int_t)lua_tointeger(L, idx));
    } else {
      lua_Number d = lua_tonumber(L, idx);
      if (isnan(d) || isinf(d)) {
        set_error(e, depth, "cannot encode %s", isnan(d) ? "NaN" : d > 0 ? "inf" : "-inf");
        return NULL;
      }
      j = json_real((double)d);
    }
    break;
  case LUA_TSTRING: {
    size_t len, bad;
    const char *s = lua_tolstring(L, idx, &len);
    if (!utf8_valid(s, len, &bad)) {
      set_error(e, depth, "invalid UTF-8 in string (byte %zu)", bad + 1);
      return NULL;
    }
    if (!count_bytes(e, depth, len + 1))
      return NULL;
    j = json_stringn_nocheck(s, len);
    break;
  }
  case LUA_TTABLE:
    return convert_table(e, idx, depth);
  case LUA_TLIGHTUSERDATA:
    /* any light userdata but the sentinel is a host pointer, not data */
    if (lua_touserdata(L, idx) == NULL)
      return json_null();
    /* fall through */
  default:
    set_error(e, depth, "cannot encode a %s", luaL_typename(L, idx));
    return NULL;
  }
  if (j == NULL)
    set_error(e, depth, "out of memory encoding JSON");
  return j;
}

/* [-0, +0, -] Classify the keys, then build an array or an object. */
static json_t *convert_table(struct encoder *e, int idx, int depth)
{
  lua_State *L = e->L;
  lua_Integer nint = 0, maxkey = 0, nstr = 0;
  int marked = 0;
  char key[KEY_SHOWN_MAX + 16];

  if (depth >= JSONLUA_MAX_DEPTH) {
    set_error(e, depth, "cannot encode tables nested deeper than %d levels (a cycle?)",
              JSONLUA_MAX_DEPTH);
    return NULL;
  }
  /* key + value during iteration, or the metatable; lua_checkstack reports instead of
     raising, which keeps the no-raise promise */
  if (!lua_checkstack(L, 3)) {
    set_error(e, depth, "out of Lua stack encoding JSON");
    return NULL;
  }
  if (lua_getmetatable(L, idx)) {
    marked = lua_rawequal(L, -1, e->array_mt);
    lua_pop(L, 1);
  }

  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    /* stack: key, value (top); the key is only inspected, never converted in place,
       so lua_next can continue from it */
    if (lua_type(L, -2) == LUA_TSTRING) {
      nstr++;
    } else if (lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1) {
      lua_Integer k = lua_tointeger(L, -2);
      nint++;
      if (k > maxkey)
        maxkey = k;
    } else {
      /* described while on the stack; the message is written after the pop */
      describe_key(L, -2, key, sizeof key);
      lua_pop(L, 2);
      set_key_error(e, depth, key, "keys must be all strings or exactly 1..n");
      return NULL;
    }
    lua_pop(L, 1);
  }

  if (marked && nstr > 0) {
    describe_first_key(L, idx, 1, key, sizeof key);
    set_key_error(e, depth, key, "a json.array table holds only keys 1..n");
    return NULL;
  }
  if (nint > 0 && nstr > 0) {
    /* the rarer kind is the likelier mistake: {1, 2, 3, x = 1} names "x" */
    int want_string = nstr <= nint;
    describe_first_key(L, idx, want_string, key, sizeof key);
    set_key_error(e, depth, key, "the table mixes integer and string keys");
    return NULL;
  }
  if (nint > 0 && maxkey != nint) {
    char why[96];
    snprintf(key, sizeof key, "%lld", (long long)maxkey);
    snprintf(why, sizeof why, "keys must be exactly 1..n, but only %lld of 1..%lld are present",
             (long long)nint, (long long)maxkey);
    set_key_error(e, depth, key, why);
    return NULL;
  }
  if (marked || nint > 0)
    return convert_array(e, idx, depth, nint);
  return convert_object(e, idx, depth);
}

/* [-0, +0, -] Keys are known to be exactly 1..n. */
static json_t *convert_array(struct encoder *e, int idx, int depth, lua_Integer n)
{
  lua_State *L = e->L;
  json_t *arr = json_array();
  if (arr == NULL) {
    set_error(e, depth, "out of memory encoding JSON");
    return NULL;
  }
  for (lua_Integer i = 1; i <= n; i++) {
    json_t *child;
    lua_rawgeti(L, idx, i);
    e->path[depth].key = NULL;
    e->path[depth].index = i;
    child = convert(e, lua_gettop(L), depth + 1);
    lua_pop(L, 1);
    if (child == NULL) {
      json_decref(arr);
      return NULL;
    }
    /* _new takes the child even when it fails */
    if (json_array_append_new(arr, child) != 0) {
      json_decref(arr);
      set_error(e, depth, "out of memory encoding JSON");
      return NULL;
    }
  }
  return arr;
}

/* [-0, +0, -] Keys are known to be strings. */
static json_t *convert_object(struct encoder *e, int idx, int depth)
{
  lua_State *L = e->L;
  json_t *obj = json_object();
  if (obj == NULL) {
    set_error(e, depth, "out of memory encoding JSON");
    return NULL;
  }
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    size_t keylen, bad;
    const char *key = lua_tolstring(L, -2, &keylen);  /* a string already: no conversion */
    const char *nul;
    json_t *child;
    e->path[depth].key = key;
    e->path[depth].keylen = keylen;
    if (!count_bytes(e, depth + 1, keylen + 3)) {
      lua_pop(L, 2);
      json_decref(obj);
      return NULL;
    }
    if (!utf8_valid(key, keylen, &bad)) {
      /* while the key is still on the stack: the path borrows it */
      set_error(e, depth + 1, "invalid UTF-8 in table key (byte %zu)", bad + 1);
      lua_pop(L, 2);
      json_decref(obj);
      return NULL;
    }
    /* "\u0000" in a key would be written, but jansson (so jsonlua_decode) and jsonb
       refuse it: the text could not be read back */
    nul = memchr(key, '\0', keylen);
    if (nul != NULL) {
      set_error(e, depth + 1, "NUL in table key (byte %zu)", (size_t)(nul - key) + 1);
      lua_pop(L, 2);
      json_decref(obj);
      return NULL;
    }
    child = convert(e, lua_gettop(L), depth + 1);
    if (child == NULL) {
      lua_pop(L, 2);
      json_decref(obj);
      return NULL;
    }
    if (json_object_setn_new_nocheck(obj, key, keylen, child) != 0) {
      lua_pop(L, 2);
      json_decref(obj);
      set_error(e, depth, "out of memory encoding JSON");
      return NULL;
    }
    lua_pop(L, 1);
  }
  return obj;
}

/* Strict UTF-8, as jansson checks it: no overlong forms, no surrogates, nothing above
   U+10FFFF. On failure *bad is the offset of the first byte of the broken sequence. */
static int utf8_valid(const char *str, size_t len, size_t *bad)
{
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < len) {
    unsigned int c = s[i];
    size_t n;
    uint32_t cp, min;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      goto invalid;
    }
    if (len - i - 1 < n)
      goto invalid;
    for (size_t k = 1; k <= n; k++) {
      if ((s[i + k] & 0xC0) != 0x80)
        goto invalid;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      goto invalid;
    i += n + 1;
  }
  return 1;
invalid:
  *bad = i;
  return 0;
}

/* [-0, +0, -] A key as a reader would write it: "name", 3, 1.5, true, (a table). */
static void describe_key(lua_State *L, int idx, char *buf, size_t size)
{
  buf[0] = '\0';
  switch (lua_type(L, idx)) {
  case LUA_TSTRING: {
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    append_quoted(buf, size, s, len);
    break;
  }
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx))
      append(buf, size, "%lld", (long long)lua_tointeger(L, idx));
    else
      append(buf, size, "%.14g", (double)lua_tonumber(L, idx));
    break;
  case LUA_TBOOLEAN:
    append(buf, size, "%s", lua_toboolean(L, idx) ? "true" : "false");
    break;
  default:
    append(buf, size, "(a %s)", luaL_typename(L, idx));
    break;
  }
}

/* [-0, +0, -] Describe the first key of table t that is a string (want_string) or a
   number; a second walk, so the key is on the stack while it is read. */
static void describe_first_key(lua_State *L, int t, int want_string, char *buf, size_t size)
{
  buf[0] = '\0';
  lua_pushnil(L);
  while (lua_next(L, t) != 0) {
    int is_string = lua_type(L, -2) == LUA_TSTRING;
    if (is_string == want_string) {
      describe_key(L, -2, buf, size);
      lua_pop(L, 2);
      return;
    }
    lua_pop(L, 1);
  }
}

/* snprintf onto the end of what buf already holds; silently truncates. */
static void append(char *buf, size_t size, const char *fmt, ...)
{
  size_t used;
  va_list ap;
  if (buf == NULL || size == 0)
    return;
  used = strlen(buf);
  if (used + 1 >= size)
    return;
  va_start(ap, fmt);
  vsnprintf(buf + used, size - used, fmt, ap);
  va_end(ap);
}

/* "key" with quotes and backslashes escaped, control bytes as ?, long keys cut at a
   character boundary. The message must stay valid UTF-8 (it may end up in a JSON log
   line), so a key that is not gets its high bytes shown as ? too. */
static void append_quoted(char *buf, size_t size, const char *s, size_t len)
{
  size_t shown = len, bad;
  int ascii_only;
  if (shown > KEY_SHOWN_MAX) {
    shown = KEY_SHOWN_MAX;
    while (shown > 0 && ((unsigned char)s[shown] & 0xC0) == 0x80)
      shown--;
  }
  ascii_only = !utf8_valid(s, shown, &bad);
  append(buf, size, "\"");
  for (size_t i = 0; i < shown; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      append(buf, size, "\\%c", c);
    else if (c < 0x20 || c == 0x7F || (ascii_only && c >= 0x80))
      append(buf, size, "?");
    else
      append(buf, size, "%c", c);
  }
  append(buf, size, "%s\"", shown < len ? "..." : "");
}

/* A key that reads well after a dot: $.name rather than $["two words"]. */
static int is_identifier(const char *s, size_t len)
{
  if (len == 0 || len > KEY_SHOWN_MAX)
    return 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    int alpha = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
      return 0;
  }
  return 1;
}

/* Message, then " at " and the path of the first depth segments. */
static void set_error(struct encoder *e, int depth, const char *fmt, ...)
{
  va_list ap;
  if (e->err == NULL || e->errlen == 0)
    return;
  va_start(ap, fmt);
  vsnprintf(e->err, e->errlen, fmt, ap);
  va_end(ap);
  append(e->err, e->errlen, " at $");
  for (int i = 0; i < depth; i++) {
    const struct path_seg *seg = &e->path[i];
    if (seg->key == NULL) {
      append(e->err, e->errlen, "[%lld]", (long long)seg->index);
      continue;
    }
    if (is_identifier(seg->key, seg->keylen)) {
      append(e->err, e->errlen, ".%.*s", (int)seg->keylen, seg->key);
    } else {
      append(e->err, e->errlen, "[");
      append_quoted(e->err, e->errlen, seg->key, seg->keylen);
      append(e->err, e->errlen, "]");
    }
  }
  /* truncation may have split a character; drop its remains (at most 3 bytes) */
  for (int i = 0; i < 3; i++) {
    size_t len = strlen(e->err), bad;
    if (len == 0 || utf8_valid(e->err, len, &bad))
      break;
    e->err[len - 1] = '\0';
  }
}

/* "cannot encode table key K at PATH: why"; the path is the table's. */
static void set_key_error(struct encoder *e, int depth, const char *key, const char *why)
{
  set_error(e, depth, "cannot encode table key %s", key);
  append(e->err, e->errlen, ": %s", why);
}

/* }==================================================================== */

/* {====================================================================
   The json module
   ===================================================================== */

int jsonlua_open(lua_State *L)
{
  luaL_newlib(L, json_funcs);
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "null");
  push_array_mt(L);
  lua_pop(L, 1);
  return 1;
}

/* json.encode(v) -> text. Raises on a value JSON cannot hold: that is a bug in the
   script, not a condition to handle. */
static int l_json_encode(lua_State *L)
{
  char err[256];
  char *text;

  luaL_checkany(L, 1);
  lua_settop(L, 1);
  text = jsonlua_encode(L, 1, err, sizeof err);
  if (text == NULL)
    return luaL_error(L, "json.encode: %s", err);
  luatext_pushfree(L, text);
  return 1;
}

/* json.decode(s) -> value, or nil, msg: text from outside (an LLM, an HTTP body) is
   expected to be wrong sometimes, so bad JSON is an ordinary result. */
static int l_json_decode(lua_State *L)
{
  char err[256];
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  if (jsonlua_decode(L, s, len, err, sizeof err) != 0) {
    luaL_pushfail(L);
    lua_pushfstring(L, "json.decode: %s", err);
    return 2;
  }
  return 1;
}

/* json.array([t]) -> t marked as an array, so it encodes as [] even when empty. */
static int l_json_array(lua_State *L)
{
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_newtable(L);
  } else {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    /* lua_setmetatable ignores __metatable: without this, json.array(string) would turn
       the sandbox's read-only proxy of a library into a plain table (sandbox.c). */
    if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
      return luaL_argerror(L, 1, "a table with a protected metatable");
  }
  push_array_mt(L);
  lua_setmetatable(L, 1);
  return 1;
}

/* }==================================================================== */
