/*
 * fuzz.h: what the libFuzzer targets in tests/fuzz share. A target is one
 * LLVMFuzzerTestOneInput that calls the pure code under test and checks invariants with
 * FUZZ_CHECK, which aborts: libFuzzer records the input as a crash, exactly as for a
 * sanitizer report. Lua states get a capped allocator (src/script.c's limited_alloc, after
 * lua/lua ltests.c debug_realloc) so memory errors are fuzzed as well; the cap is chosen
 * from a hash of the input, so a crash input replays with the same cap. Each input gets a
 * fresh state, closed after it: runs do not depend on each other.
 */
#ifndef LEASH_FUZZ_H
#define LEASH_FUZZ_H

#include <lauxlib.h>
#include <lua.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* libFuzzer's entry point (declared here for -Wmissing-prototypes). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond) do { \
    if (!(cond)) { \
      fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      abort(); \
    } } while (0)

/* FNV-1a over the input: picks per-input choices without consuming input bytes. */
static inline uint64_t fuzz_hash(const uint8_t *data, size_t size)
{
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < size; i++)
    h = (h ^ data[i]) * 1099511628211ULL;
  return h;
}

struct fuzz_cap {
  size_t used;
  size_t limit;
};

/* lua_Alloc with a cap: only growth is refused, never a free or a shrink. When ptr is
   NULL, osize is a type tag, not a size. */
static inline void *fuzz_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
  struct fuzz_cap *c = ud;
  size_t old = ptr != NULL ? osize : 0;
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

/* An unprotected error is a bug in the code under test: every call runs in lua_pcall. */
static inline int fuzz_panic(lua_State *L)
{
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "Lua panic (unprotected error): %s\n", msg != NULL ? msg : "?");
  abort();
  return 0;
}

/* Whether a failed lua_pcall is what running out of memory looks like: LUA_ERRMEM, or the
   runtime error raised when the stack cannot grow (lua_checkstack reports a failed
   allocation as a plain 0): "not enough memory for JSON" from json_lua.c, or the "stack
   overflow (...)" of luaL_checkstack. */
static inline int fuzz_memory_error(lua_State *L, int status)
{
  const char *msg = lua_tostring(L, -1);
  if (status == LUA_ERRMEM)
    return 1;
  return status == LUA_ERRRUN && msg != NULL &&
         (strncmp(msg, "not enough memory", 17) == 0 ||
          strncmp(msg, "stack overflow (", 16) == 0);
}

/* A bare state (no libraries: the code under test needs none). For one input in four the
   cap is set a little above what the empty state uses, so that some allocation during the
   run fails; otherwise memory is unlimited. Returns whether the cap is on. */
static inline lua_State *fuzz_lua_state(struct fuzz_cap *cap, uint64_t h, size_t size,
                                        int *capped)
{
  lua_State *L;
  cap->used = 0;
  cap->limit = SIZE_MAX;
  L = lua_newstate(fuzz_alloc, cap);
  FUZZ_CHECK(L != NULL);
  lua_atpanic(L, fuzz_panic);
  *capped = h % 4 == 0;
  if (*capped)
    cap->limit = cap->used + (size_t)((h >> 8) % (64 * 1024 + 32 * (uint64_t)size));
  return L;
}

#endif
