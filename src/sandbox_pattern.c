/* sandbox_pattern: string.find, match, gmatch and gsub for the sandbox (part of the sandbox
   unit, sandbox.h). Lua's own matcher backtracks inside one C call, where the count hook
   never fires: string.find(("a"):rep(40), ("a*"):rep(40) .. "b") runs for ages and holds
   the slot past its deadline. This is the same matching algorithm and the same results
   as Lua 5.4's (its manual, section 6.4.1, is the specification; lstrlib.c the model),
   with one addition: the matcher counts its work (each step of a match, each character an
   expansion or a balance scans, each byte compared by a back-reference or a plain find)
   and checks the task's deadline every CHECK_EVERY units, raising the task's timeout like
   the hook does. gsub also refuses a result over SANDBOX_MAX_STRING.

   Refusing "dangerous" patterns statically was the other option; it would refuse common
   patterns ("%s*x" is quadratic on a long run of spaces, ordinary on text), or let through
   ones whose cost depends on the subject. Counting is exact and costs one decrement per
   step. */
#include "sandbox.h"

#include "task_context.h"

#include <ctype.h>
#include <lauxlib.h>
#include <stddef.h>
#include <string.h>

#define CHECK_EVERY 16384
#define MAXCAPTURES 32
#define MAXMATCHDEPTH 200
#define CAP_UNFINISHED (-1)
#define CAP_POSITION (-2)
#define L_ESC '%'
#define SPECIALS "^$*+?.([%-"
#define uchar(c) ((unsigned char)(c))

struct mstate {
  const char *src_init, *src_end, *p_end;
  lua_State *L;
  int matchdepth;
  int level;
  size_t left;               /* work units before the next deadline check */
  struct {
    const char *init;
    ptrdiff_t len;
  } capture[MAXCAPTURES];
};

struct gmatch_state {
  const char *src, *p, *lastmatch;
  struct mstate ms;
};

int sandbox_pattern_open(lua_State *L);
static void work(struct mstate *ms, size_t n);
static const char *match(struct mstate *ms, const char *s, const char *p);
static int l_find(lua_State *L);
static int l_match(lua_State *L);
static int l_gmatch(lua_State *L);
static int l_gsub(lua_State *L);

/* lua_CFunction: installs the four functions into the string table at 1. */
int sandbox_pattern_open(lua_State *L)
{
  static const luaL_Reg f[] = {
    { "find", l_find }, { "match", l_match }, { "gmatch", l_gmatch }, { "gsub", l_gsub },
    { NULL, NULL },
  };
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  luaL_setfuncs(L, f, 0);
  return 0;
}

static void work(struct mstate *ms, size_t n)
{
  if (ms->left > n) {
    ms->left -= n;
    return;
  }
  ms->left = CHECK_EVERY;
  taskctx_check_stop(ms->L);
}

/* ======================================================================== the matcher */

static int check_capture(struct mstate *ms, int l)
{
  l -= '1';
  if (l < 0 || l >= ms->level || ms->capture[l].len == CAP_UNFINISHED)
    return luaL_error(ms->L, "invalid capture index %%%d", l + 1);
  return l;
}

static int capture_to_close(struct mstate *ms)
{
  for (int level = ms->level - 1; level >= 0; level--)
    if (ms->capture[level].len == CAP_UNFINISHED)
      return level;
  return luaL_error(ms->L, "invalid pattern capture");
}

/* The end of the single-character class starting at p. */
static const char *class_end(struct mstate *ms, const char *p)
{
  switch (*p++) {
  case L_ESC:
    if (p == ms->p_end)
      luaL_error(ms->L, "malformed pattern (ends with '%%')");
    return p + 1;
  case '[':
    if (*p == '^')
      p++;
    do {                                          /* look for the closing ']' */
      if (p == ms->p_end)
        luaL_error(ms->L, "malformed pattern (missing ']')");
      if (*(p++) == L_ESC && p < ms->p_end)
        p++;                                      /* an escape such as '%]' */
    } while (*p != ']');
    return p + 1;
  default:
    return p;
  }
}

static int match_class(int c, int cl)
{
  int res;
  switch (tolower(cl)) {
  case 'a': res = isalpha(c); break;
  case 'c': res = iscntrl(c); break;
  case 'd': res = isdigit(c); break;
  case 'g': res = isgraph(c); break;
  case 'l': res = islower(c); break;
  case 'p': res = ispunct(c); break;
  case 's': res = isspace(c); break;
  case 'u': res = isupper(c); break;
  case 'w': res = isalnum(c); break;
  case 'x': res = isxdigit(c); break;
  default: return cl == c;
  }
  if (isupper(cl))
    res = !res;
  return res;
}

/* p is the '[' of a set, ec its ']'. */
static int match_bracket_class(int c, const char *p, const char *ec)
{
  int sig = 1;
  if (*(p + 1) == '^') {
    sig = 0;
    p++;
  }
  while (++p < ec) {
    if (*p == L_ESC) {
      p++;
      if (match_class(c, uchar(*p)))
        return sig;
    } else if (*(p + 1) == '-' && p + 2 < ec) {
      p += 2;
      if (uchar(*(p - 2)) <= c && c <= uchar(*p))
        return sig;
    } else if (uchar(*p) == c) {
      return sig;
    }
  }
  return !sig;
}

static int single_match(struct mstate *ms, const char *s, const char *p, const char *ep)
{
  if (s >= ms->src_end)
    return 0;
  int c = uchar(*s);
  switch (*p) {
  case '.': return 1;
  case L_ESC: return match_class(c, uchar(*(p + 1)));
  case '[': return match_bracket_class(c, p, ep - 1);
  default: return uchar(*p) == c;
  }
}

static const char *match_balance(struct mstate *ms, const char *s, const char *p)
{
  if (p >= ms->p_end - 1)
    luaL_error(ms->L, "malformed pattern (missing arguments to '%%b')");
  if (*s != *p)                                   /* strings end in '\0': *src_end reads */
    return NULL;
  int b = *p, e = *(p + 1), cont = 1;
  while (++s < ms->src_end) {
    work(ms, 1);
    if (*s == e) {
      if (--cont == 0)
        return s + 1;
    } else if (*s == b) {
      cont++;
    }
  }
  return NULL;
}

static const char *max_expand(struct mstate *ms, const char *s, const char *p, const char *ep)
{
  ptrdiff_t i = 0;
  while (single_match(ms, s + i, p, ep)) {
    i++;
    work(ms, 1);
  }
  for (; i >= 0; i--) {                           /* try the longest first */
    const char *res = match(ms, s + i, ep + 1);
    if (res)
      return res;
  }
  return NULL;
}

static const char *min_expand(struct mstate *ms, const char *s, const char *p, const char *ep)
{
  for (;;) {
    const char *res = match(ms, s, ep + 1);
    if (res)
      return res;
    if (!single_match(ms, s, p, ep))
      return NULL;
    s++;
  }
}

static const char *start_capture(struct mstate *ms, const char *s, const char *p, int what)
{
  if (ms->level >= MAXCAPTURES)
    luaL_error(ms->L, "too many captures");
  ms->capture[ms->level].init = s;
  ms->capture[ms->level].len = what;
  ms->level++;
  const char *res = match(ms, s, p);
  if (!res)
    ms->level--;                                  /* undo the capture */
  return res;
}

static const char *end_capture(struct mstate *ms, const char *s, const char *p)
{
  int l = capture_to_close(ms);
  ms->capture[l].len = s - ms->capture[l].init;
  const char *res = match(ms, s, p);
  if (!res)
    ms->capture[l].len = CAP_UNFINISHED;
  return res;
}

static const char *match_capture(struct mstate *ms, const char *s, int l)
{
  l = check_capture(ms, l);
  size_t len = (size_t)ms->capture[l].len;
  work(ms, len / 16 + 1);
  if ((size_t)(ms->src_end - s) >= len && memcmp(ms->capture[l].init, s, len) == 0)
    return s + len;
  return NULL;
}

/* The end of the match of p at s, or NULL. */
static const char *match(struct mstate *ms, const char *s, const char *p)
{
  if (ms->matchdepth-- == 0)
    luaL_error(ms->L, "pattern too complex");
  work(ms, 1);
init:                                             /* tail calls become jumps here */
  if (p != ms->p_end) {
    switch (*p) {
    case '(':
      if (*(p + 1) == ')')
        s = start_capture(ms, s, p + 2, CAP_POSITION);
      else
        s = start_capture(ms, s, p + 1, CAP_UNFINISHED);
      break;
    case ')':
      s = end_capture(ms, s, p + 1);
      break;
    case '$':
      if (p + 1 != ms->p_end)
        goto dflt;                                /* a '$' inside the pattern is a char */
      s = (s == ms->src_end) ? s : NULL;
      break;
    case L_ESC:
      switch (*(p + 1)) {
      case 'b':
        s = match_balance(ms, s, p + 2);
        if (s) {
          p += 4;
          goto init;
        }
        break;
      case 'f': {
        p += 2;
        if (*p != '[')
          luaL_error(ms->L, "missing '[' after '%%f' in pattern");
        const char *ep = class_end(ms, p);
        char previous = (s == ms->src_init) ? '\0' : *(s - 1);
        if (!match_bracket_class(uchar(previous), p, ep - 1)
            && match_bracket_class(uchar(*s), p, ep - 1)) {
          p = ep;
          goto init;
        }
        s = NULL;
        break;
      }
      case '0': case '1': case '2': case '3': case '4':
      case '5': case '6': case '7': case '8': case '9':
        s = match_capture(ms, s, uchar(*(p + 1)));
        if (s) {
          p += 2;
          goto init;
        }
        break;
      default:
        goto dflt;
      }
      break;
    default:
    dflt: {
      const char *ep = class_end(ms, p);
      if (!single_match(ms, s, p, ep)) {
        if (*ep == '*' || *ep == '?' || *ep == '-') {   /* may match zero times */
          p = ep + 1;
          goto init;
        }
        s = NULL;
      } else {
        switch (*ep) {
        case '?': {
          const char *res = match(ms, s + 1, ep + 1);
          if (res) {
            s = res;
          } else {
            p = ep + 1;
            goto init;
          }
          break;
        }
        case '+':
          s = max_expand(ms, s + 1, p, ep);       /* one match already done */
          break;
        case '*':
          s = max_expand(ms, s, p, ep);
          break;
        case '-':
          s = min_expand(ms, s, p, ep);
          break;
        default:
          s++;
          p = ep;
          goto init;
        }
      }
      break;
    }
    }
  }
  ms->matchdepth++;
  return s;
}

/* ========================================================================== captures */

/* The i-th capture (the whole match when there are none): its length and start, or
   CAP_POSITION with the position pushed. */
static ptrdiff_t get_onecapture(struct mstate *ms, int i, const char *s, const char *e,
                                const char **cap)
{
  if (i >= ms->level) {
    if (i != 0)
      luaL_error(ms->L, "invalid capture index %%%d", i + 1);
    *cap = s;
    return e - s;
  }
  ptrdiff_t capl = ms->capture[i].len;
  *cap = ms->capture[i].init;
  if (capl == CAP_UNFINISHED)
    luaL_error(ms->L, "unfinished capture");
  else if (capl == CAP_POSITION)
    lua_pushinteger(ms->L, (ms->capture[i].init - ms->src_init) + 1);
  return capl;
}

static void push_onecapture(struct mstate *ms, int i, const char *s, const char *e)
{
  const char *cap;
  ptrdiff_t l = get_onecapture(ms, i, s, e, &cap);
  if (l != CAP_POSITION)
    lua_pushlstring(ms->L, cap, (size_t)l);
}

static int push_captures(struct mstate *ms, const char *s, const char *e)
{
  int n = (ms->level == 0 && s) ? 1 : ms->level;
  luaL_checkstack(ms->L, n, "too many captures");
  for (int i = 0; i < n; i++)
    push_onecapture(ms, i, s, e);
  return n;
}

/* ====================================================================== the functions */

static void prepare(struct mstate *ms, lua_State *L, const char *s, size_t ls, const char *p,
                    size_t lp)
{
  ms->L = L;
  ms->matchdepth = MAXMATCHDEPTH;
  ms->src_init = s;
  ms->src_end = s + ls;
  ms->p_end = p + lp;
  ms->left = CHECK_EVERY;
  ms->level = 0;
}

/* A relative initial position (negative counts from the end) as 1..len+1-ish. */
static size_t posrelat(lua_Integer pos, size_t len)
{
  if (pos > 0)
    return (size_t)pos;
  if (pos == 0 || pos < -(lua_Integer)len)
    return 1;
  return len + (size_t)pos + 1;
}

static int no_specials(const char *p, size_t l)
{
  size_t upto = 0;
  do {                                            /* strpbrk stops at each '\0' */
    if (strpbrk(p + upto, SPECIALS))
      return 0;
    upto += strlen(p + upto) + 1;
  } while (upto <= l);
  return 1;
}

static const char *mem_find(struct mstate *ms, const char *s1, size_t l1, const char *s2,
                            size_t l2)
{
  if (l2 == 0)
    return s1;
  if (l2 > l1)
    return NULL;
  const char *init;
  l2--;                                           /* the first char is found by memchr */
  l1 -= l2;
  while (l1 > 0 && (init = memchr(s1, *s2, l1)) != NULL) {
    init++;
    work(ms, l2 / 16 + 1);
    if (memcmp(init, s2 + 1, l2) == 0)
      return init - 1;
    l1 -= (size_t)(init - s1);
    s1 = init;
  }
  return NULL;
}

static int find_aux(lua_State *L, int find)
{
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  size_t init = posrelat(luaL_optinteger(L, 3, 1), ls) - 1;
  struct mstate ms;
  if (init > ls) {
    luaL_pushfail(L);
    return 1;
  }
  if (find && (lua_toboolean(L, 4) || no_specials(p, lp))) {
    prepare(&ms, L, s, ls, p, lp);
    const char *s2 = mem_find(&ms, s + init, ls - init, p, lp);
    if (s2) {
      lua_pushinteger(L, (s2 - s) + 1);
      lua_pushinteger(L, (lua_Integer)((size_t)(s2 - s) + lp));
      return 2;
    }
  } else {
    const char *s1 = s + init;
    int anchor = (*p == '^');
    if (anchor) {
      p++;
      lp--;
    }
    prepare(&ms, L, s, ls, p, lp);
    do {
      ms.level = 0;
      const char *res = match(&ms, s1, p);
      if (res) {
        if (find) {
          lua_pushinteger(L, (s1 - s) + 1);
          lua_pushinteger(L, res - s);
          return push_captures(&ms, NULL, 0) + 2;
        }
        return push_captures(&ms, s1, res);
      }
    } while (s1++ < ms.src_end && !anchor);
  }
  luaL_pushfail(L);
  return 1;
}

static int l_find(lua_State *L)
{
  return find_aux(L, 1);
}

static int l_match(lua_State *L)
{
  return find_aux(L, 0);
}

/* Upvalues: the subject, the pattern (kept alive) and the iteration state. */
static int gmatch_aux(lua_State *L)
{
  struct gmatch_state *gm = lua_touserdata(L, lua_upvalueindex(3));
  gm->ms.L = L;                                   /* may be called from another coroutine */
  for (const char *src = gm->src; src <= gm->ms.src_end; src++) {
    gm->ms.level = 0;
    const char *e = match(&gm->ms, src, gm->p);
    if (e && e != gm->lastmatch) {
      gm->src = gm->lastmatch = e;
      return push_captures(&gm->ms, src, e);
    }
  }
  return 0;
}

static int l_gmatch(lua_State *L)
{
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  size_t init = posrelat(luaL_optinteger(L, 3, 1), ls) - 1;
  lua_settop(L, 2);
  if (init > ls)
    init = ls + 1;                                /* start past the end: no match */
  struct gmatch_state *gm = lua_newuserdatauv(L, sizeof *gm, 0);
  prepare(&gm->ms, L, s, ls, p, lp);
  gm->src = s + init;
  gm->p = p;
  gm->lastmatch = NULL;
  lua_pushcclosure(L, gmatch_aux, 3);
  return 1;
}

static void add_s(struct mstate *ms, luaL_Buffer *b, const char *s, const char *e)
{
  size_t l;
  lua_State *L = ms->L;
  const char *news = lua_tolstring(L, 3, &l);
  const char *p;
  while ((p = memchr(news, L_ESC, l)) != NULL) {
    luaL_addlstring(b, news, (size_t)(p - news));
    p++;
    if (*p == L_ESC) {
      luaL_addchar(b, *p);
    } else if (*p == '0') {
      luaL_addlstring(b, s, (size_t)(e - s));
    } else if (isdigit(uchar(*p))) {
      const char *cap;
      ptrdiff_t resl = get_onecapture(ms, *p - '1', s, e, &cap);
      if (resl == CAP_POSITION)
        luaL_addvalue(b);                         /* the position get_onecapture pushed */
      else
        luaL_addlstring(b, cap, (size_t)resl);
    } else {
      luaL_error(L, "invalid use of '%c' in replacement string", L_ESC);
    }
    l -= (size_t)(p + 1 - news);
    news = p + 1;
  }
  luaL_addlstring(b, news, l);
}

/* Adds the replacement of the match s..e; 1 when it changed something. */
static int add_value(struct mstate *ms, luaL_Buffer *b, const char *s, const char *e, int tr)
{
  lua_State *L = ms->L;
  switch (tr) {
  case LUA_TFUNCTION: {
    lua_pushvalue(L, 3);
    int n = push_captures(ms, s, e);
    lua_call(L, n, 1);
    break;
  }
  case LUA_TTABLE:
    push_onecapture(ms, 0, s, e);
    lua_gettable(L, 3);
    break;
  default:
    add_s(ms, b, s, e);
    return 1;
  }
  if (!lua_toboolean(L, -1)) {                    /* nil or false: keep the original */
    lua_pop(L, 1);
    luaL_addlstring(b, s, (size_t)(e - s));
    return 0;
  }
  if (!lua_isstring(L, -1))
    return luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  luaL_addvalue(b);
  return 1;
}

static int l_gsub(lua_State *L)
{
  size_t srcl, lp;
  const char *src = luaL_checklstring(L, 1, &srcl);
  const char *p = luaL_checklstring(L, 2, &lp);
  const char *lastmatch = NULL;
  int tr = lua_type(L, 3);
  lua_Integer max_s = luaL_optinteger(L, 4, (lua_Integer)srcl + 1);
  int anchor = (*p == '^');
  lua_Integer n = 0;
  int changed = 0;
  struct mstate ms;
  luaL_Buffer b;
  luaL_argexpected(L, tr == LUA_TNUMBER || tr == LUA_TSTRING || tr == LUA_TFUNCTION
                   || tr == LUA_TTABLE, 3, "string/function/table");
  luaL_buffinit(L, &b);
  if (anchor) {
    p++;
    lp--;
  }
  prepare(&ms, L, src, srcl, p, lp);
  while (n < max_s) {
    ms.level = 0;
    const char *e = match(&ms, src, p);
    if (e && e != lastmatch) {
      n++;
      changed = add_value(&ms, &b, src, e, tr) | changed;
      src = lastmatch = e;
    } else if (src < ms.src_end) {
      luaL_addchar(&b, *src++);
    } else {
      break;
    }
    if (luaL_bufflen(&b) > SANDBOX_MAX_STRING)
      return luaL_error(L, "string.gsub: result over %d MB", (int)(SANDBOX_MAX_STRING >> 20));
    if (anchor)
      break;
  }
  if (!changed) {
    lua_pushvalue(L, 1);
  } else {
    luaL_addlstring(&b, src, (size_t)(ms.src_end - src));
    luaL_pushresult(&b);
  }
  lua_pushinteger(L, n);
  return 2;
}
