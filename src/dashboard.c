/* dashboard: the HTTP side (routes, the token, headers). The pages are dashboard_html.c,
   the statements dashboard_data.c. */
#include "dashboard.h"
#include "cli.h"
#include "dashboard_data.h"
#include "dashboard_html.h"
#include "log.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define BODY_MAX 16384           /* a form's body; more is refused (413) */
#define IDLE_TIMEOUT_S 30
#define CONNECTIONS_MAX 64
#define FIELDS_MAX 16

extern const char dashboard_css[];   /* web/dashboard.css, embedded by CMake */

struct dashboard {
  struct MHD_Daemon *daemon;
  char *token;
  PGconn *c;
  const struct db_table *t;
  int loopback;        /* listening on loopback only: the Host header is checked */
  char host[256];      /* the --listen host (brackets off) */
};

/* The connection, reopened when it broke (the database restarted), with the session's
   statement_timeout set again. 0, or -1 when it is still down. */
static int ensure_conn(struct dashboard *d)
{
  if (PQstatus(d->c) == CONNECTION_OK)
    return 0;
  PQreset(d->c);
  char err[DB_ERR_MAX];
  if (PQstatus(d->c) != CONNECTION_OK ||
      db_command(d->c, "SET statement_timeout = '" DASHBOARD_STATEMENT_TIMEOUT "'", err,
                 sizeof err) != 0) {
    log_error("dashboard: the database is unreachable");
    return -1;
  }
  return 0;
}

/* One request's state: the body read so far. */
struct request {
  struct buf body;
  int too_big;
};

/* Splits host and port of "HOST:PORT" / "[V6]:PORT" / ":PORT" into host (brackets off). */
static int split_addr(const char *addr, char *host, size_t hostlen, const char **port)
{
  const char *colon = strrchr(addr, ':');
  if (!colon || colon[1] == '\0')
    return -1;
  size_t hl = (size_t)(colon - addr);
  if (hl >= hostlen)
    return -1;
  memcpy(host, addr, hl);
  host[hl] = '\0';
  if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') {
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = '\0';
  }
  *port = colon + 1;
  return 0;
}

int dashboard_addr_is_loopback(const char *addr, char *err, size_t errlen)
{
  char host[256];
  const char *port;
  if (split_addr(addr, host, sizeof host, &port) != 0) {
    snprintf(err, errlen, "--listen: expected HOST:PORT");
    return -1;
  }
  if (!host[0])
    return 0;
  struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
  struct addrinfo *ai = NULL, *p;
  int rc = getaddrinfo(host, port, &hints, &ai);
  if (rc != 0) {
    snprintf(err, errlen, "--listen: %s", gai_strerror(rc));
    return -1;
  }
  int loop = 1;
  for (p = ai; p; p = p->ai_next) {
    if (p->ai_family == AF_INET) {
      const struct sockaddr_in *s = (const struct sockaddr_in *)(const void *)p->ai_addr;
      loop &= (ntohl(s->sin_addr.s_addr) >> 24) == 127;
    } else if (p->ai_family == AF_INET6) {
      const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)(const void *)p->ai_addr;
      loop &= IN6_IS_ADDR_LOOPBACK(&s->sin6_addr);
    } else {
      loop = 0;
    }
  }
  freeaddrinfo(ai);
  return loop;
}

int dashboard_token_ok(const char *token, const char *given, size_t given_len)
{
  if (!token || !given)
    return 0;
  /* Digests of both, compared in constant time: neither the length nor a common prefix of
     the token shows in the time an answer takes. */
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256((const unsigned char *)token, strlen(token), a);
  SHA256((const unsigned char *)given, given_len, b);
  return CRYPTO_memcmp(a, b, sizeof a) == 0;
}

/* A urlencoded body's fields, decoded in place: names and values point into body. */
struct fields {
  int n;
  const char *name[FIELDS_MAX], *value[FIELDS_MAX];
};

static void parse_form(char *body, struct fields *f)
{
  f->n = 0;
  for (char *p = body; p && *p && f->n < FIELDS_MAX;) {
    char *amp = strchr(p, '&');
    if (amp)
      *amp = '\0';
    char *eq = strchr(p, '=');
    if (eq) {
      *eq = '\0';
      for (char *q = eq + 1; *q; q++)
        if (*q == '+')
          *q = ' ';
      MHD_http_unescape(p);
      MHD_http_unescape(eq + 1);
      f->name[f->n] = p;
      f->value[f->n++] = eq + 1;
    }
    p = amp ? amp + 1 : NULL;
  }
}

/* A field of the body, else of the query string (never the token: see field_token). */
static const char *field(struct MHD_Connection *conn, const struct fields *f, const char *name)
{
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->name[i], name) == 0)
      return f->value[i];
  return MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, name);
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, char *body,
                             const char *type)
{
  if (!body)
    return MHD_NO;
  struct MHD_Response *r =
    MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  MHD_add_response_header(r, "Cache-Control", "no-store");
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
  /* Nothing but this server's own stylesheet and forms: no script runs, nothing is fetched
     elsewhere, and no other site may frame the page. */
  MHD_add_response_header(r, "Content-Security-Policy",
                          "default-src 'none'; style-src 'self'; img-src 'self'; "
                          "form-action 'self'; frame-ancestors 'none'; base-uri 'none'");
  if (status == 401)
    MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"leash\"");
  enum MHD_Result ret = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result reply_json_error(struct MHD_Connection *conn, unsigned status,
                                        const char *msg)
{
  json_t *o = json_pack("{s:b,s:s}", "ok", 0, "message", msg);
  char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  return reply(conn, status, s, "application/json");
}

static enum MHD_Result on_action(struct dashboard *d, struct MHD_Connection *conn,
                                 const char *action, struct request *rq)
{
  struct fields f;
  parse_form(rq->body.s, &f);
  const char *html = field(conn, &f, "html"), *back = field(conn, &f, "back");
  int as_html = html && !strcmp(html, "1");
  /* The token: the Authorization header or the body's field, never the query string (a URL
     ends up in histories and proxies' logs). */
  const char *given = NULL;
  const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
  if (auth && strncasecmp(auth, "Bearer ", 7) == 0)
    given = auth + 7;
  for (int i = 0; !given && i < f.n; i++)
    if (strcmp(f.name[i], "token") == 0)
      given = f.value[i];
  unsigned status = 0;
  const char *why = NULL;
  if (rq->too_big)
    status = 413, why = "the request body is too large";
  else if (!d->token)
    status = 403, why = "actions are off: start leash dashboard with --token-file";
  else if (!given || !*given)
    status = 401, why = "this action needs the token (Authorization: Bearer, or the token field)";
  else if (!dashboard_token_ok(d->token, given, strlen(given)))
    status = 403, why = "wrong token";
  char *json = NULL;
  if (!status && ensure_conn(d) != 0)
    status = 503, why = "the database is unreachable; nothing was changed";
  if (!status) {
    struct dash_action a = { field(conn, &f, "id"), field(conn, &f, "batch"),
                             field(conn, &f, "tenant"), field(conn, &f, "budget"),
                             field(conn, &f, "for"), field(conn, &f, "kind"),
                             field(conn, &f, "scope") };
    status = (unsigned)dash_action_run(d->c, d->t, action, &a, &json);
    log_info("dashboard: %s answered %u", action, status);
  } else {
    log_info("dashboard: %s refused (%u)", action, status);
  }
  if (!as_html) {
    if (json)
      return reply(conn, status, json, "application/json");
    return reply_json_error(conn, status, why);
  }
  const char *msg = why;
  json_t *o = json ? json_loads(json, 0, NULL) : NULL;
  if (o)
    msg = json_string_value(json_object_get(o, "message"));
  char *page = dash_message_html((int)status, msg ? msg : "out of memory", back);
  json_decref(o);
  free(json);
  return reply(conn, status, page, "text/html; charset=utf-8");
}

static enum MHD_Result on_get(struct dashboard *d, struct MHD_Connection *conn,
                              const char *url)
{
  char err[DB_ERR_MAX];
  if (strcmp(url, "/dashboard.css") == 0)
    return reply(conn, 200, strdup(dashboard_css), "text/css; charset=utf-8");
  int api = strncmp(url, "/api/", 5) == 0;
  const char *view = api ? url + 4 : url;
  if (strcmp(view, "/") != 0 && strcmp(view, "/overview") != 0 && strcmp(view, "/task") != 0)
    return api ? reply_json_error(conn, 404, "not found")
               : reply(conn, 404, dash_message_html(404, "not found", "/"),
                       "text/html; charset=utf-8");
  if (ensure_conn(d) != 0)
    return api ? reply_json_error(conn, 503, "the database is unreachable")
               : reply(conn, 503, dash_message_html(503, "the database is unreachable", "/"),
                       "text/html; charset=utf-8");
  char *json = NULL;
  int missing = 0;
  long refresh = 0;
  if (strcmp(view, "/task") == 0) {
    const char *ids = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "id");
    long id;
    if (!ids || cli_parse_int(ids, 1, 9223372036854775807L, &id) != 0) {
      const char *m = "id must be a task id (an integer >= 1)";
      return api ? reply_json_error(conn, 400, m)
                 : reply(conn, 400, dash_message_html(400, m, "/"), "text/html; charset=utf-8");
    }
    json = dash_task_json(d->c, d->t, id, &missing, err, sizeof err);
  } else {
    const char *batch = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "batch");
    const char *rs = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "refresh");
    if (rs && (cli_parse_int(rs, 2, 3600, &refresh) != 0)) {
      const char *m = "refresh must be whole seconds from 2 to 3600";
      return api ? reply_json_error(conn, 400, m)
                 : reply(conn, 400, dash_message_html(400, m, "/"), "text/html; charset=utf-8");
    }
    json = dash_overview_json(d->c, d->t, batch && *batch ? batch : NULL, err, sizeof err);
  }
  if (!json) {
    unsigned st = missing ? 404 : 503;
    if (!missing)
      log_error("dashboard: %s: %s", url, err);
    return api ? reply_json_error(conn, st, err)
               : reply(conn, st, dash_message_html((int)st, err, "/"), "text/html; charset=utf-8");
  }
  if (api)
    return reply(conn, 200, json, "application/json");
  char *page = strcmp(view, "/task") == 0 ? dash_task_html(json, d->t->name)
                                          : dash_overview_html(json, d->t->name, (int)refresh);
  free(json);
  return reply(conn, 200, page, "text/html; charset=utf-8");
}

/* On loopback, a request must name this machine in its Host header: a page on another site
   whose name an attacker re-points at 127.0.0.1 (DNS rebinding) would otherwise read the
   dashboard from the user's browser. */
static int host_ok(const struct dashboard *d, struct MHD_Connection *conn)
{
  if (!d->loopback)
    return 1;
  const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Host");
  if (!h)
    return 0;
  char name[256];
  size_t n;
  if (h[0] == '[') {
    const char *end = strchr(h, ']');
    if (!end)
      return 0;
    n = (size_t)(end - h - 1);
    h++;
  } else {
    n = strcspn(h, ":");
  }
  if (n == 0 || n >= sizeof name)
    return 0;
  memcpy(name, h, n);
  name[n] = '\0';
  return strcasecmp(name, "localhost") == 0 || strcmp(name, "127.0.0.1") == 0 ||
         strcmp(name, "::1") == 0 || strcasecmp(name, d->host) == 0;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **state)
{
  (void)version;
  struct dashboard *d = cls;
  struct request *rq = *state;
  if (!rq) {   /* the headers: the body (if any) comes in the next calls */
    if (!(rq = calloc(1, sizeof *rq)))
      return MHD_NO;
    *state = rq;
    return MHD_YES;
  }
  if (*upload_len) {
    if (rq->body.len + *upload_len > BODY_MAX)
      rq->too_big = 1;
    else
      buf_add(&rq->body, upload, *upload_len);
    *upload_len = 0;
    return MHD_YES;
  }
  if (rq->body.oom)
    return MHD_NO;
  if (!host_ok(d, conn))
    return reply_json_error(conn, 403, "the Host header does not name this machine (leash "
                                       "dashboard on loopback answers localhost only)");
  if (strcmp(method, "POST") == 0) {
    if (strncmp(url, "/api/", 5) != 0 || strchr(url + 5, '/'))
      return reply_json_error(conn, 404, "not found");
    return on_action(d, conn, url + 5, rq);
  }
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return reply_json_error(conn, 405, "method not allowed");
  return on_get(d, conn, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **state,
                         enum MHD_RequestTerminationCode code)
{
  (void)cls, (void)conn, (void)code;
  struct request *rq = *state;
  if (rq) {
    buf_free(&rq->body);
    free(rq);
    *state = NULL;
  }
}

struct dashboard *dashboard_start(const char *addr, const char *token, PGconn *c,
                                  const struct db_table *t, char *err, size_t errlen)
{
  char host[256];
  const char *port;
  if (split_addr(addr, host, sizeof host, &port) != 0) {
    snprintf(err, errlen, "--listen: expected HOST:PORT, got '%s'", addr);
    return NULL;
  }
  struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_PASSIVE };
  struct addrinfo *ai = NULL;
  int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
  if (rc != 0) {
    snprintf(err, errlen, "--listen %s: %s", addr, gai_strerror(rc));
    return NULL;
  }
  struct dashboard *d = calloc(1, sizeof *d);
  if (!d || (token && !(d->token = strdup(token)))) {
    free(d);
    freeaddrinfo(ai);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  d->c = c;
  d->t = t;
  if (db_command(c, "SET statement_timeout = '" DASHBOARD_STATEMENT_TIMEOUT "'", err,
                 errlen) != 0) {
    free(d->token);
    free(d);
    freeaddrinfo(ai);
    return NULL;
  }
  d->loopback = dashboard_addr_is_loopback(addr, err, errlen) == 1;
  snprintf(d->host, sizeof d->host, "%s", host);
  /* One internal thread: requests are answered one at a time, so the one connection to the
     database is never shared (each answer is bounded by statement_timeout). */
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (ai->ai_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  d->daemon = MHD_start_daemon(flags, 0, NULL, NULL, answer, d, MHD_OPTION_SOCK_ADDR,
                               ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT,
                               (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT,
                               (unsigned)CONNECTIONS_MAX, MHD_OPTION_NOTIFY_COMPLETED,
                               on_completed, d, MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!d->daemon) {
    snprintf(err, errlen, "--listen: cannot listen on %s (in use, or not a local address?)",
             addr);
    dashboard_stop(d);
    return NULL;
  }
  return d;
}

void dashboard_stop(struct dashboard *d)
{
  if (!d)
    return;
  if (d->daemon)
    MHD_stop_daemon(d->daemon);
  if (d->token) {
    OPENSSL_cleanse(d->token, strlen(d->token));
    free(d->token);
  }
  free(d);
}
