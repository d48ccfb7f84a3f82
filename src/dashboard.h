/*
 * dashboard: what `leash dashboard` serves (libmicrohttpd, one internal thread, so the one
 * database connection is never shared): an HTML page per view and the same data as JSON
 * under /api/. Every view is read from the database on request, with statements bounded by
 * statement_timeout and by the indexes that exist (see dashboard_data.c); the one thing
 * kept is a finished batch's report (sql/021's <table>_batch_reports, the dashboard's only
 * write), used while it still holds. Actions (requeue, cancel, pause, resume) are POSTs
 * that need the token: the page is for looking, a button does nothing without it.
 *
 * Routes: GET / (?batch=B), GET /task?id=N, GET /dashboard.css, GET /api/overview
 * (?batch=B), GET /api/task?id=N, POST /api/requeue|cancel|pause|resume (form fields or
 * query: id, batch, tenant, budget, for; token in "Authorization: Bearer" or field token).
 */
#ifndef LEASH_DASHBOARD_H
#define LEASH_DASHBOARD_H

#include "db.h"

#include <stddef.h>

struct dashboard;

/* Every statement of the dashboard's session (set again after a reconnect). */
#define DASHBOARD_STATEMENT_TIMEOUT "5s"

/* Serves on addr (checked by cli_check_listen_addr). token: the action token, or NULL (then
   every action answers 403). c and t stay owned by the caller and must outlive
   dashboard_stop; only the server's thread uses them while it runs. NULL with err. */
struct dashboard *dashboard_start(const char *addr, const char *token, PGconn *c,
                                  const struct db_table *t, char *err, size_t errlen);
void dashboard_stop(struct dashboard *d);

/* `leash run --dashboard ADDR`: the same pages served by the worker process, read-only (no
   token, so every action answers 403), on a loopback address only (kubectl port-forward
   reaches a pod's loopback), with its own database connection (conninfo, table: the run's)
   and its own thread, which takes no signal (the worker's signal thread does). NULL with err
   (one line, "--dashboard: ..."). */
struct dashboard_side;
struct dashboard_side *dashboard_side_start(const char *addr, const char *conninfo,
                                            const char *table, char *err, size_t errlen);
void dashboard_side_stop(struct dashboard_side *s);

/* 1 when every address host resolves to is a loopback one (127.0.0.0/8, ::1), 0 when any is
   not or host is empty (every interface), -1 with err when it does not resolve. */
int dashboard_addr_is_loopback(const char *addr, char *err, size_t errlen);

/* 1 when given equals token (constant time over their SHA-256 digests), else 0. */
int dashboard_token_ok(const char *token, const char *given, size_t given_len);

#endif
