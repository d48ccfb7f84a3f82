/*
 * api_http: leash.http.request on libcurl. Blocking, bounded by its own timeout and the
 * task's deadline; aborted mid-transfer when the lease is lost or the worker stops (the
 * progress callback reads the flags). Transport failures raise; any HTTP status is an
 * answer, not an error (a 429 or 500 is the script's to judge), except on a call that names
 * a budget (api_budget.c): it is granted first, its answer's usage is recorded, and a 429 or
 * 503 pauses the budget for the fleet for as long as the provider asked; the call is sent
 * again after the pause when that is within --budget-wait (at most BUDGET_RESENDS times),
 * else the task yields until then. TLS verification is on.
 * Requests and their headers are never logged (they carry API keys).
 */
#include "api.h"

#include "metrics.h"
#include "task_context.h"
#include "buf.h"
#include "provider.h"
#include "record.h"
#include "replay.h"

#include <curl/curl.h>
#include <lauxlib.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HTTP_CALL_MT "leash.HttpCall"
#define HTTP_DEFAULT_TIMEOUT 30.0
#define HTTP_MAX_BODY (64u * 1024 * 1024)
#define BUDGET_RESENDS 3
#define BUDGET_DEFAULT_PAUSE_S 5.0   /* a refusal that says nothing of when to come back */

/* Everything a request owns, in a userdata, so the GC frees it on every path. */
struct http_call {
  CURL *curl;
  struct curl_slist *headers;
  struct buf body, head;
  struct task *task;
  atomic_int *stopping;
  const char *aborted;          /* why the progress callback stopped the transfer */
  int too_big;
};

static int l_request(lua_State *L);
static int call_gc(lua_State *L);
static void call_free(struct http_call *call);
static size_t on_body(char *data, size_t size, size_t n, void *ud);
static size_t on_header(char *data, size_t size, size_t n, void *ud);
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow);
static void push_headers(lua_State *L, const struct buf *head);
static void describe_url(const char *url, char *out, size_t n);
static const char *control_in(const char *s, size_t n, int allow_tab, size_t *at);
static int is_token(const char *s, size_t n);

int api_http_open(lua_State *L)
{
  static const luaL_Reg funcs[] = { { "request", l_request }, { NULL, NULL } };
  if (luaL_newmetatable(L, HTTP_CALL_MT)) {
    lua_pushcfunction(L, call_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  luaL_newlib(L, funcs);
  return 1;
}

/* leash_http_responses_total (metrics.h): one per send; status 0 when no answer came. */
static void count_response(lua_State *L, const char *budget, long status)
{
  struct metrics_counters *m = taskctx_of(L)->host->stats;
  if (m)
    metrics_http_response(m, budget, status);
}

/* leash.http.request{method, url, headers, body, timeout, budget, tokens} →
   {status, headers, body}. */
static int l_request(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_getfield(L, 1, "url");                      /* 2 */
  size_t url_len = 0, method_len = 0, at;
  const char *url = luaL_optlstring(L, 2, NULL, &url_len);
  if (!url)
    return luaL_argerror(L, 1, "url is required");
  /* CR, LF or NUL in any part of the request line or a header would end it early and let
     the rest be read as another header or a whole second request (smuggling); a NUL would
     silently cut the C string libcurl sees. The messages never quote the values: a URL or a
     header may hold a credential. */
  const char *bad = control_in(url, url_len, 0, &at);
  if (bad)
    return luaL_error(L, "leash.http.request: url has %s at byte %d; refused", bad, (int)at);
  lua_getfield(L, 1, "method");                   /* 3 */
  lua_getfield(L, 1, "body");                     /* 4 */
  size_t body_len = 0;
  const char *body = luaL_optlstring(L, 4, NULL, &body_len);
  const char *method = luaL_optlstring(L, 3, body ? "POST" : "GET", &method_len);
  if (!is_token(method, method_len) || method_len > 32) {
    bad = control_in(method, method_len, 0, &at);
    if (bad)
      return luaL_error(L, "leash.http.request: method has %s at byte %d; refused", bad, (int)at);
    return luaL_error(L, "leash.http.request: method must be an HTTP token (letters, digits, "
                      "!#$%%&'*+-.^_`|~; at most 32 bytes), e.g. GET or POST");
  }
  lua_getfield(L, 1, "timeout");                  /* 5 */
  lua_Number timeout = luaL_optnumber(L, 5, HTTP_DEFAULT_TIMEOUT);
  if (!(timeout > 0) || !isfinite(timeout))
    return luaL_argerror(L, 1, "timeout must be a number of seconds > 0");
  lua_getfield(L, 1, "headers");                  /* 6 */
  if (!lua_isnil(L, 6))
    luaL_checktype(L, 6, LUA_TTABLE);
  lua_getfield(L, 1, "budget");                   /* 7 */
  const char *budget = lua_isnil(L, 7) ? NULL : api_budget_name(L, 7, "leash.http.request");
  lua_getfield(L, 1, "tokens");                   /* 8 */
  long long tokens = 0;
  if (!lua_isnil(L, 8)) {
    int ok;
    lua_Integer n = lua_tointegerx(L, 8, &ok);
    if (!ok || n < 0)
      return luaL_argerror(L, 1, "tokens must be an integer >= 0 (the call's estimate)");
    tokens = (long long)n;
  }
  taskctx_check_live(L, "leash.http.request");

  const struct task_ctx *ctx = taskctx_of(L);
  if (ctx->host->replay)   /* leash replay: the recorded answer, no socket (replay.h) */
    return replay_http(L, ctx->host->replay, method, url);
  struct http_call *call = lua_newuserdatauv(L, sizeof *call, 0);   /* 9 */
  memset(call, 0, sizeof *call);
  luaL_setmetatable(L, HTTP_CALL_MT);
  call->task = ctx->task;
  call->stopping = ctx->host->stopping;
  double left = taskctx_time_left(ctx);
  if (left < timeout)
    timeout = left > 0.001 ? left : 0.001;
  call->curl = curl_easy_init();
  if (!call->curl)
    return luaL_error(L, "leash.http.request: cannot start a request (out of memory)");

  if (!lua_isnil(L, 6)) {
    lua_pushnil(L);
    while (lua_next(L, 6)) {
      if (lua_type(L, -2) != LUA_TSTRING || !lua_isstring(L, -1))
        return luaL_argerror(L, 1, "headers must map names to strings");
      size_t name_len, value_len;
      const char *name = lua_tolstring(L, -2, &name_len);
      const char *value = lua_tolstring(L, -1, &value_len);
      if (!is_token(name, name_len)) {
        bad = control_in(name, name_len, 0, &at);
        if (bad)
          return luaL_error(L, "leash.http.request: a header name has %s at byte %d; refused",
                            bad, (int)at);
        return luaL_error(L, "leash.http.request: a header name must be an HTTP token (no "
                          "':', spaces or controls; at most 256 bytes)");
      }
      /* A tab is allowed inside a value (obs-fold aside, HTTP permits it); nothing below. */
      bad = control_in(value, value_len, 1, &at);
      if (bad)
        return luaL_error(L, "leash.http.request: header '%s' value has %s at byte %d; refused",
                          name, bad, (int)at);
      lua_pushfstring(L, "%s: %s", name, value);
      struct curl_slist *next = curl_slist_append(call->headers, lua_tostring(L, -1));
      if (!next)
        return luaL_error(L, "leash.http.request: out of memory");
      call->headers = next;
      lua_pop(L, 2);
    }
  }

  CURL *c = call->curl;
  char errbuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  if (strcmp(method, "HEAD") == 0)
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  if (body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, call->headers);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout * 1000));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout < 10 ? timeout * 1000 : 10000));
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, call);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, call);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, call);
  curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");

  char where[256];
  describe_url(url, where, sizeof where);
  struct budget_call bc = { .id = -1 };
  long status = 0;
  for (int resends = 0;; resends++) {
    if (budget)
      api_budget_begin(L, "leash.http.request", budget, tokens, timeout + 30, &bc);
    call->body.len = call->head.len = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK)
      count_response(L, budget, 0);
    if (rc != CURLE_OK) {
      if (budget)
        api_budget_end(L, &bc, NULL, -1, NULL);
      if (call->aborted)
        lua_pushfstring(L, "leash.http.request: %s (%s %s)", call->aborted, method, where);
      else if (call->too_big)
        lua_pushfstring(L, "leash.http.request: response body over %d MB (%s %s)",
                        (int)(HTTP_MAX_BODY >> 20), method, where);
      else
        lua_pushfstring(L, "leash.http.request: %s%s%s (%s %s)", curl_easy_strerror(rc),
                        errbuf[0] ? ": " : "", errbuf, method, where);
      record_http(call->task, L, method, url, lua_isnil(L, 6) ? 0 : 6, body, body_len, 0,
                  lua_tostring(L, -1));
      luaL_where(L, 1);
      lua_insert(L, -2);
      lua_concat(L, 2);
      return lua_error(L);
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    count_response(L, budget, status);
    if (!budget)
      break;
    if (status != 429 && status != 503) {
      struct provider_usage used;
      provider_usage(call->body.s, call->body.len, &used);
      api_budget_end(L, &bc, &used, -1, NULL);
      break;
    }
    double wait = provider_wait_s(call->head.s, call->head.len, time(NULL));
    if (wait < 0)
      wait = BUDGET_DEFAULT_PAUSE_S;
    if (wait < 0.1)
      wait = 0.1;
    const struct task_ctx *now = taskctx_of(L);
    if (bc.hold || resends >= BUDGET_RESENDS || wait > now->host->budget_wait_s ||
        wait >= taskctx_time_left(now))
      api_budget_refused(L, &bc, wait, where);
    /* Paused for the fleet; the next grant waits the pause out, then the call goes again. */
    char reason[300];
    snprintf(reason, sizeof reason, "refused by %s", where);
    api_budget_end(L, &bc, NULL, wait, reason);
  }
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, status);
  lua_setfield(L, -2, "status");
  push_headers(L, &call->head);
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, call->body.s ? call->body.s : "", call->body.len);
  lua_setfield(L, -2, "body");
  record_http(call->task, L, method, url, lua_isnil(L, 6) ? 0 : 6, body, body_len, -1, NULL);
  /* Now, not at the next collection: the collector cannot see the handle's or the body's
     size, and an agent's task may make many calls before one comes. */
  call_free(call);
  return 1;
}

/* Every path that raises leaves the call to the collector. */
static int call_gc(lua_State *L)
{
  call_free(luaL_checkudata(L, 1, HTTP_CALL_MT));
  return 0;
}

static void call_free(struct http_call *call)
{
  if (call->curl)
    curl_easy_cleanup(call->curl);
  curl_slist_free_all(call->headers);
  buf_free(&call->body);
  buf_free(&call->head);
  memset(call, 0, sizeof *call);
}

static size_t on_body(char *data, size_t size, size_t n, void *ud)
{
  struct http_call *call = ud;
  if (call->body.len + size * n > HTTP_MAX_BODY) {
    call->too_big = 1;
    return 0;
  }
  return buf_add(&call->body, data, size * n) == 0 ? size * n : 0;
}

static size_t on_header(char *data, size_t size, size_t n, void *ud)
{
  struct http_call *call = ud;
  /* A new status line (after "100 Continue") starts the headers afresh. */
  if (size * n >= 5 && memcmp(data, "HTTP/", 5) == 0)
    call->head.len = 0;
  return buf_add(&call->head, data, size * n) == 0 ? size * n : 0;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  struct http_call *call = ud;
  if (call->task && !task_lease_alive(call->task))
    call->aborted = "lease lost: request aborted";
  else if (atomic_load(call->stopping))
    call->aborted = "worker stopping: request aborted";
  return call->aborted != NULL;
}

/* [-0, +1, m] Response headers as { lower-case name = value }; repeats joined by ", ". */
static void push_headers(lua_State *L, const struct buf *head)
{
  lua_newtable(L);
  const char *p = head->s, *end = head->s ? head->s + head->len : NULL;
  while (p && p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *line_end = eol ? eol : end;
    const char *colon = memchr(p, ':', (size_t)(line_end - p));
    if (colon && memcmp(p, "HTTP/", 5) != 0) {
      luaL_Buffer name;
      luaL_buffinit(L, &name);
      for (const char *k = p; k < colon; k++)
        luaL_addchar(&name, (char)((*k >= 'A' && *k <= 'Z') ? *k + 32 : *k));
      luaL_pushresult(&name);
      const char *v = colon + 1, *ve = line_end;
      while (v < ve && (*v == ' ' || *v == '\t'))
        v++;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '))
        ve--;
      lua_pushvalue(L, -1);
      if (lua_gettable(L, -3) == LUA_TSTRING) {
        lua_pushliteral(L, ", ");
        lua_pushlstring(L, v, (size_t)(ve - v));
        lua_concat(L, 3);
      } else {
        lua_pop(L, 1);
        lua_pushlstring(L, v, (size_t)(ve - v));
      }
      lua_settable(L, -3);
    }
    p = eol ? eol + 1 : end;
  }
}

/* The first byte of s that may not appear in a request line or header (NUL, CR, LF, any
   other control but, when allowed, a tab), named for a message with its 1-based offset in
   *at; NULL when there is none. */
static const char *control_in(const char *s, size_t n, int allow_tab, size_t *at)
{
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)s[i];
    const char *what = b == '\0' ? "a NUL byte" : b == '\r' ? "a carriage return (CR)"
                     : b == '\n' ? "a line feed (LF)"
                     : (b < 0x20 && !(allow_tab && b == '\t')) || b == 0x7f ? "a control character"
                     : NULL;
    if (what) {
      *at = i + 1;
      return what;
    }
  }
  return NULL;
}

/* RFC 9110 token: what a method or a header name may be. */
static int is_token(const char *s, size_t n)
{
  if (n == 0 || n > 256)
    return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)s[i];
    if (!((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') ||
          strchr("!#$%&'*+-.^_`|~", b) != NULL) || b == '\0')
      return 0;
  }
  return 1;
}

/* scheme://host[:port] of url, for error messages: never the path, query or credentials. */
static void describe_url(const char *url, char *out, size_t n)
{
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL, *port = NULL;
  snprintf(out, n, "(unparsable URL)");
  if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK) {
    curl_url_get(u, CURLUPART_PORT, &port, 0);
    snprintf(out, n, "%s://%s%s%s", scheme, host, port ? ":" : "", port ? port : "");
  }
  curl_free(scheme);
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
}
