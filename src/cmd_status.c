/* leash status: counts per status, runnable backlog and its age, leases per worker,
   throughput and ETA; --watch for a batch's progress. */
#include "canary.h"
#include "commands.h"
#include "deadline.h"
#include "lifecycle.h"
#include "migrate.h"
#include "report.h"

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
  "usage: leash status [--tenant T] [--batch B] [--json]\n"
  "       leash status --watch [--interval S] [--until-empty] [--tenant T] [--batch B] [--json]\n\n"
  "Counts tasks per status (pending split into runnable now and scheduled later), the age\n"
  "of the oldest runnable task, the leases each worker holds, the rate and the ETA.\n\n"
  "Rate and ETA, the same in status, --json and every --watch row, per scope (status: the\n"
  "--tenant/--batch filter; --watch: each batch): rate = tasks finished (done or dead) in\n"
  "the last minute / that minute, or / the time since the scope's first claim when shorter\n"
  "(at least 1 s); ETA = (pending + leased) / rate, '-' when nothing finished.\n\n"
  "--watch shows each active batch's progress every interval: on a terminal a bar per batch,\n"
  "redrawn in place; otherwise (a file, a pipe) one plain line per batch per interval; with\n"
  "--json one JSON object per interval. Active: tasks pending or leased, or finished in the\n"
  "last 5 minutes (--batch B: that batch, always). The bar: '#' done, 'x' dead, '.' open;\n"
  "on a narrow terminal the stats wrap under the bar, then the bar goes: no count is cut.\n"
  "A batch whose total grew since the last frame says so (children, new tasks).\n"
  "Ctrl-C (or SIGTERM) stops it with exit 0.\n\n"
  "options:\n"
  "  --tenant T            only this tenant\n"
  "  --batch B             only this batch\n"
  "  --json                JSON (fields documented in README.md)\n"
  "  --watch               keep watching, as above\n"
  "  --interval S          seconds between updates (default 2; 500ms, 0.2 ...)\n"
  "  --until-empty         with --watch: stop once nothing in scope is pending or leased\n\n";

enum {
  OPT_TENANT = OPT_COMMAND_BASE, OPT_BATCH, OPT_JSON, OPT_WATCH, OPT_INTERVAL, OPT_UNTIL_EMPTY,
};

/* The one rate and ETA definition, for `status`, `status --json` and every --watch row: over
   a scope (status: the --tenant/--batch filter; --watch: one batch), the rate is the tasks
   finished (done or dead) in the last minute, divided by that minute, or by the time since
   the scope's earliest claim still recorded (started_at) when that is shorter, at least 1 s;
   the ETA is (pending + leased) / rate. A batch that started 10 s ago shows its real rate at
   once, and `status --batch B` says what B's watch row says. */
#define SQL_RATE_FINISHED \
  "count(*) FILTER (WHERE status IN (" SQL_DONE ", " SQL_DEAD ") " \
  "                   AND finished_at > now() - interval '1 minute')"
#define SQL_RATE_WINDOW \
  "least(60, greatest(1, coalesce(extract(epoch FROM now() - min(started_at)), 60)))::float8"

static const char counts_fmt[] =
  "SELECT count(*) FILTER (WHERE status = " SQL_PENDING "), "
  "       count(*) FILTER (WHERE status = " SQL_PENDING " AND run_after <= now()), "
  "       count(*) FILTER (WHERE status = " SQL_LEASED "), "
  "       count(*) FILTER (WHERE status = " SQL_DONE "), "
  "       count(*) FILTER (WHERE status = " SQL_DEAD "), "
  "       extract(epoch FROM now() - min(run_after) "
  "               FILTER (WHERE status = " SQL_PENDING " AND run_after <= now()))::float8, "
  "       " SQL_RATE_FINISHED ", " SQL_RATE_WINDOW " "
  "  FROM %s WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR batch = $2)";

static const char workers_fmt[] =
  "SELECT lease_owner, count(*) FROM %s "
  " WHERE status = " SQL_LEASED " AND ($1::text IS NULL OR tenant_id = $1) "
  "   AND ($2::text IS NULL OR batch = $2) GROUP BY 1 ORDER BY 1";

/* --watch: one row per active batch (see usage), its rate as SQL_RATE_* say. open_total and
   shown_total are over every active batch, before the LIMIT. */
#define WATCH_MAX_BATCHES 20
/* Scopes claims skip now (sql/013_holds.sql): kind, scope, seconds left (NULL: until
   resumed), reason. %s: the holds table. */
static const char holds_fmt[] =
  "SELECT kind, scope, round(extract(epoch FROM until - now())::numeric, 1)::text, reason, "
  "       source "
  "  FROM %s WHERE until IS NULL OR until > now() "
  " ORDER BY kind, scope COLLATE \"C\", source LIMIT 100";

/* Budgets (sql/014): name, rpm, calls in the window, tpm, tokens in the window, in flight,
   seconds paused (NULL: not), window seconds. %s: budgets, budget calls. */
static const char budgets_fmt[] =
  "SELECT b.name, b.rpm, coalesce(w.n, 0), b.tpm, coalesce(w.tokens, 0), coalesce(w.active, 0), "
  "       CASE WHEN b.paused_until > now() "
  "            THEN round(extract(epoch FROM b.paused_until - now())::numeric, 1)::text END, "
  "       b.window_s "
  "  FROM %s b LEFT JOIN LATERAL ("
  "    SELECT count(*) FILTER (WHERE c.at >= now() - make_interval(secs => b.window_s)) AS n,"
  "           sum(c.tokens) FILTER (WHERE c.at >= now() - make_interval(secs => b.window_s))"
  "             AS tokens,"
  "           count(*) FILTER (WHERE NOT c.released AND c.hold_until > now()) AS active"
  "      FROM %s c WHERE c.budget = b.name) w ON true "
  " ORDER BY b.name COLLATE \"C\" LIMIT 100";

static const char watch_fmt[] =
  "SELECT batch, "
  "       count(*) FILTER (WHERE status = " SQL_PENDING "), "
  "       count(*) FILTER (WHERE status = " SQL_LEASED "), "
  "       count(*) FILTER (WHERE status = " SQL_DONE "), "
  "       count(*) FILTER (WHERE status = " SQL_DEAD "), "
  "       " SQL_RATE_FINISHED ", " SQL_RATE_WINDOW ", "
  "       sum(count(*) FILTER (WHERE status IN (" SQL_PENDING ", " SQL_LEASED "))) OVER (), "
  "       count(*) OVER () "
  "  FROM %s WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR batch = $2) "
  " GROUP BY batch "
  "HAVING $2::text IS NOT NULL "
  "    OR count(*) FILTER (WHERE status IN (" SQL_PENDING ", " SQL_LEASED ")) > 0 "
  "    OR max(finished_at) > now() - interval '5 minutes' "
  " ORDER BY batch NULLS FIRST LIMIT %d";

enum watch_mode { WATCH_TTY, WATCH_LINES, WATCH_JSON };

/* The batches of the last frame and their totals, so a frame can say that a total grew
   (children enqueued, or more tasks added to the batch, while it runs). */
struct watch_seen {
  int n;
  struct { char *name; int is_null; long long total, first_total; } b[WATCH_MAX_BATCHES];
};

static volatile sig_atomic_t watch_stop;

static int status_once(struct cli *g, PGconn *c, const struct db_table *t, const char *tenant,
                       const char *batch, int as_json);
static int status_watch(struct cli *g, PGconn *c, const struct db_table *t, const char *tenant,
                        const char *batch, enum watch_mode mode, double interval,
                        int until_empty);
static void seen_free(struct watch_seen *s);
static void watch_frame(FILE *f, PGresult *r, const char *table, const char *batch,
                        enum watch_mode mode, double interval, int cols,
                        struct watch_seen *seen);
static void watch_on_signal(int sig);
static int watch_sleep(double secs);
static int terminal_columns(void);
static double eta_of(long long open, double rate);
static double rate_of(PGresult *r, int row, int col);
static void print_json(const char *table, const char *tenant, const char *batch,
                       PGresult *counts, PGresult *workers, PGresult *holds, PGresult *budgets,
                       const char *canary);
static void print_text(const char *table, PGresult *counts, PGresult *workers, PGresult *holds,
                       PGresult *budgets, const char *canary);
static long long ll_at(PGresult *r, int row, int col);

int cmd_status(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "json", no_argument, NULL, OPT_JSON },
    { "watch", no_argument, NULL, OPT_WATCH },
    { "interval", required_argument, NULL, OPT_INTERVAL },
    { "until-empty", no_argument, NULL, OPT_UNTIL_EMPTY },
    { NULL, 0, NULL, 0 },
  };
  const char *tenant = NULL, *batch = NULL, *interval_arg = NULL;
  int as_json = 0, watch = 0, until_empty = 0, opt, rc;
  double interval = 2;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_TENANT: tenant = optarg; break;
    case OPT_BATCH: batch = optarg; break;
    case OPT_JSON: as_json = 1; break;
    case OPT_WATCH: watch = 1; break;
    case OPT_INTERVAL:
      if (cli_parse_duration(optarg, &interval) != 0 || interval < 0.05 || interval > 86400)
        return cli_usage_error(g, "--interval: '%s' is not a duration from 50ms to 1d", optarg);
      interval_arg = optarg;
      break;
    case OPT_UNTIL_EMPTY: until_empty = 1; break;
    }
  }
  if (optind < argc)
    return cli_usage_error(g, "unexpected argument '%s'", argv[optind]);
  if (!watch && (interval_arg || until_empty))
    return cli_usage_error(g, "--%s goes with --watch", interval_arg ? "interval" : "until-empty");

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "status", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX];
  if (migrate_check(c, &t, err, sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
  } else if (watch) {
    const char *term = getenv("TERM");
    enum watch_mode mode = as_json ? WATCH_JSON
                         : isatty(STDOUT_FILENO) && !(term && strcmp(term, "dumb") == 0)
                           ? WATCH_TTY : WATCH_LINES;
    rc = status_watch(g, c, &t, tenant, batch, mode, interval, until_empty);
  } else {
    rc = status_once(g, c, &t, tenant, batch, as_json);
  }
  cli_close(c, &t);
  return rc;
}

static int status_once(struct cli *g, PGconn *c, const struct db_table *t, const char *tenant,
                       const char *batch, int as_json)
{
  char err[DB_ERR_MAX], sql[1024];
  PGresult *counts = NULL, *workers = NULL, *holds = NULL, *budgets = NULL;
  char *canary = NULL;
  const char *params[] = { tenant, batch };
  char *holds_t = db_table_object(t, c, "holds", 1);
  char *budgets_t = db_table_object(t, c, "budgets", 1);
  char *calls_t = db_table_object(t, c, "budget_calls", 1);
  char big[sizeof budgets_fmt + 2 * 512];   /* two quoted, schema-qualified names */
  if (!holds_t || !budgets_t || !calls_t) {
    free(holds_t);
    free(budgets_t);
    free(calls_t);
    return cli_runtime_error(g, "out of memory");
  }
  int rc = EXIT_RUNTIME;
  /* One snapshot for both reads, so the numbers add up. */
  if (db_command(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", err, sizeof err) != 0)
    goto fail;
  snprintf(sql, sizeof sql, counts_fmt, t->qualified);
  if (!(counts = db_exec(c, sql, 2, params, err, sizeof err)))
    goto fail;
  snprintf(sql, sizeof sql, workers_fmt, t->qualified);
  if (!(workers = db_exec(c, sql, 2, params, err, sizeof err)))
    goto fail;
  snprintf(sql, sizeof sql, holds_fmt, holds_t);
  if (!(holds = db_exec(c, sql, 0, NULL, err, sizeof err)))
    goto fail;
  snprintf(big, sizeof big, budgets_fmt, budgets_t, calls_t);
  if (!(budgets = db_exec(c, big, 0, NULL, err, sizeof err)))
    goto fail;
  if (!(canary = canary_status_json(c, t, err, sizeof err)))   /* the table's, not --batch's */
    goto fail;
  db_command(c, "COMMIT", err, sizeof err);
  if (as_json)
    print_json(g->table, tenant, batch, counts, workers, holds, budgets, canary);
  else
    print_text(g->table, counts, workers, holds, budgets, canary);
  rc = EXIT_OK;
  goto out;
fail:
  rc = cli_runtime_error(g, "%s", err);
out:
  PQclear(counts);
  PQclear(workers);
  PQclear(holds);
  PQclear(budgets);
  free(canary);
  free(holds_t);
  free(budgets_t);
  free(calls_t);
  return rc;
}

/* {====== --watch */

static int status_watch(struct cli *g, PGconn *c, const struct db_table *t, const char *tenant,
                        const char *batch, enum watch_mode mode, double interval,
                        int until_empty)
{
  char err[DB_ERR_MAX], sql[sizeof watch_fmt + 256];
  snprintf(sql, sizeof sql, watch_fmt, t->qualified, WATCH_MAX_BATCHES);
  const char *params[] = { tenant, batch };
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = watch_on_signal;   /* no SA_RESTART: the sleep ends at once */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  int drawn = 0;   /* lines of the last frame on the terminal, to redraw over */
  struct watch_seen seen = { 0 };
  int rc = EXIT_OK;
  while (!watch_stop) {
    PGresult *r = db_exec(c, sql, 2, params, err, sizeof err);
    if (!r) {
      if (mode == WATCH_TTY && drawn)
        fputc('\n', stdout);
      rc = cli_runtime_error(g, "%s", err);
      break;
    }
    long long open = PQntuples(r) ? ll_at(r, 0, 7) : 0;
    /* The frame is built whole, then written with one call: no flicker, no torn lines. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
      PQclear(r);
      rc = cli_runtime_error(g, "out of memory");
      break;
    }
    watch_frame(f, r, g->table, batch, mode, interval, mode == WATCH_TTY ? terminal_columns() : 0,
                &seen);
    PQclear(r);
    fclose(f);
    if (mode == WATCH_TTY && drawn)
      printf("\033[%dF\033[J", drawn);   /* to the first line of the last frame, clear below */
    fwrite(buf, 1, len, stdout);
    fflush(stdout);
    drawn = 0;
    for (size_t i = 0; i < len; i++)
      drawn += buf[i] == '\n';
    free(buf);
    if (until_empty && open == 0)
      break;
    if (watch_sleep(interval) != 0)
      break;
  }
  seen_free(&seen);
  return rc;
}

static void seen_free(struct watch_seen *s)
{
  for (int i = 0; i < s->n; i++)
    free(s->b[i].name);
  s->n = 0;
}

/* The entry of batch name in the last frame, or NULL. */
static const void *seen_find(const struct watch_seen *s, const char *name, long long *total,
                             long long *first_total)
{
  for (int i = 0; i < s->n; i++)
    if (name ? !s->b[i].is_null && strcmp(s->b[i].name, name) == 0 : s->b[i].is_null) {
      *total = s->b[i].total;
      *first_total = s->b[i].first_total;
      return &s->b[i];
    }
  return NULL;
}

/* Appends item to out (joined by sep); items are a bar row's parts: percent, eta, rate and
   the four counts. */
static void join_items(char *out, size_t outlen, const char *const *items, int n,
                       const char *sep)
{
  size_t len = 0;
  out[0] = '\0';
  for (int i = 0; i < n && len < outlen; i++)
    len += (size_t)snprintf(out + len, outlen - len, "%s%s", i ? sep : "", items[i]);
}

/* One batch on a terminal, in cols - 1 columns, every count kept: the first that fits of
   (1) label, bar of 10..50 and the aligned stats on one line; (2) the same with compact
   stats; (3) label and bar (10..50) on one line, the stats wrapped under it; (4) the label
   alone, the stats wrapped under it. The bar: '#' done, 'x' dead (at least one when any
   is), '.' pending or leased. */
static void tty_row(FILE *f, const char *label, int label_w, int cols, double progress,
                    const char *eta_s, double rate, long long done, long long dead,
                    long long pending, long long leased)
{
  char it[7][48], aligned[256], compact[258], bar[56];   /* compact: " " + tail */
  snprintf(it[0], sizeof it[0], "%.1f%%", progress * 100);
  snprintf(it[1], sizeof it[1], "eta %s", eta_s);
  snprintf(it[2], sizeof it[2], "%.1f/s", rate);
  snprintf(it[3], sizeof it[3], "done %lld", done);
  snprintf(it[4], sizeof it[4], "dead %lld", dead);
  snprintf(it[5], sizeof it[5], "pending %lld", pending);
  snprintf(it[6], sizeof it[6], "leased %lld", leased);
  const char *items[7] = { it[0], it[1], it[2], it[3], it[4], it[5], it[6] };
  snprintf(aligned, sizeof aligned, " %5.1f%%  eta %-6s %6.1f/s  done %lld  dead %lld"
           "  pending %lld  leased %lld", progress * 100, eta_s, rate, done, dead, pending,
           leased);
  char tail[256];
  join_items(tail, sizeof tail, items, 7, " ");
  snprintf(compact, sizeof compact, " %s", tail);
  int width = cols - 1, fixed = label_w + 3;   /* "label [" + "]" */
  const char *stats = NULL;
  int bar_w = width - fixed;
  if (width - fixed - (int)strlen(aligned) >= 10) {
    stats = aligned;
    bar_w = width - fixed - (int)strlen(aligned);
  } else if (width - fixed - (int)strlen(compact) >= 10) {
    stats = compact;
    bar_w = width - fixed - (int)strlen(compact);
  }
  if (bar_w >= 10) {
    long long total = done + dead + pending + leased;
    bar_w = bar_w > 50 ? 50 : bar_w;
    int d = total ? (int)((double)done * bar_w / (double)total) : 0;
    int x = total ? (int)((double)(done + dead) * bar_w / (double)total) - d : 0;
    if (dead > 0 && x == 0) {
      x = 1;
      if (d + x > bar_w)
        d--;
    }
    for (int k = 0; k < bar_w; k++)
      bar[k] = k < d ? '#' : k < d + x ? 'x' : '.';
    bar[bar_w] = '\0';
    fprintf(f, "%-*.*s [%s]%s\n", label_w, label_w, label, bar, stats ? stats : "");
    if (stats)
      return;
  } else {
    fprintf(f, "%.*s\n", width, label);
  }
  /* Wrapped: greedy, two columns of indent; an item never splits. */
  int used = 0;
  for (int i = 0; i < 7; i++) {
    int w = (int)strlen(items[i]);
    if (used && used + 1 + w > width) {
      fputc('\n', f);
      used = 0;
    }
    used += fprintf(f, "%s%s", used ? " " : "  ", items[i]);
  }
  fputc('\n', f);
}

static void watch_frame(FILE *f, PGresult *r, const char *table, const char *batch,
                        enum watch_mode mode, double interval, int cols,
                        struct watch_seen *seen)
{
  char now[32], eta_s[32], line[1024];
  time_t tt = time(NULL);
  struct tm tm;
  gmtime_r(&tt, &tm);
  strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm);
  int n = PQntuples(r);
  long long shown_total = n ? ll_at(r, 0, 8) : 0, open_total = n ? ll_at(r, 0, 7) : 0;
  struct watch_seen next = { 0 };
  json_t *frame = NULL, *arr = NULL;
  if (mode == WATCH_JSON) {
    frame = json_object();
    arr = json_array();
    json_object_set_new(frame, "time", json_string(now));
    json_object_set_new(frame, "table", json_string(table));
    json_object_set_new(frame, "open", json_integer(open_total));
    json_object_set_new(frame, "more_batches",
                        json_integer(shown_total > n ? shown_total - n : 0));
  }
  int label_w = 1;
  for (int i = 0; i < n; i++) {
    int w = PQgetisnull(r, i, 0) ? 10 : (int)strlen(PQgetvalue(r, i, 0));
    if (w > label_w)
      label_w = w > 30 ? 30 : w;
  }
  if (mode == WATCH_TTY) {
    snprintf(line, sizeof line, "%s  %s  every %gs  (# done, x dead; Ctrl-C stops)", table, now,
             interval);
    fprintf(f, "%.*s\n", cols > 1 ? cols - 1 : (int)sizeof line, line);
  }
  for (int i = 0; i < n; i++) {
    const char *name = PQgetisnull(r, i, 0) ? NULL : PQgetvalue(r, i, 0);
    long long pending = ll_at(r, i, 1), leased = ll_at(r, i, 2), done = ll_at(r, i, 3),
              dead = ll_at(r, i, 4);
    long long total = pending + leased + done + dead, open = pending + leased;
    double rate = rate_of(r, i, 5);
    double eta = eta_of(open, rate);
    double progress = total ? (double)(done + dead) / (double)total : 0;
    long long last_total = total, first_total = total;
    seen_find(seen, name, &last_total, &first_total);
    long long grew = total > last_total ? total - last_total : 0;
    if (next.n < WATCH_MAX_BATCHES) {
      next.b[next.n].name = name ? strdup(name) : NULL;
      next.b[next.n].is_null = name == NULL;
      next.b[next.n].total = total;
      next.b[next.n].first_total = first_total;
      next.n += !name || next.b[next.n].name;
    }
    if (open == 0)
      snprintf(eta_s, sizeof eta_s, "0s");
    else if (eta >= 0)
      report_format_duration(eta, eta_s, sizeof eta_s);
    else
      snprintf(eta_s, sizeof eta_s, "-");
    if (mode == WATCH_JSON) {
      json_t *b = json_object(), *cnt = json_object();
      json_object_set_new(b, "batch", name ? json_string(name) : json_null());
      json_object_set_new(cnt, STATUS_PENDING, json_integer(pending));
      json_object_set_new(cnt, STATUS_LEASED, json_integer(leased));
      json_object_set_new(cnt, STATUS_DONE, json_integer(done));
      json_object_set_new(cnt, STATUS_DEAD, json_integer(dead));
      json_object_set_new(b, "counts", cnt);
      json_object_set_new(b, "total", json_integer(total));
      json_object_set_new(b, "progress", json_real(round(progress * 10000) / 10000));
      json_object_set_new(b, "rate_per_s", json_real(round(rate * 100) / 100));
      json_object_set_new(b, "eta_s", eta >= 0 ? json_real(round(eta * 10) / 10) : json_null());
      json_object_set_new(b, "total_grew_by", json_integer(grew));
      json_array_append_new(arr, b);
    } else if (mode == WATCH_LINES) {
      fprintf(f, "%s batch=%s done=%lld dead=%lld pending=%lld leased=%lld total=%lld "
              "progress=%.1f%% rate=%.2f/s eta=%s", now, name ? name : "-", done, dead,
              pending, leased, total, progress * 100, rate, eta_s);
      if (grew)
        fprintf(f, " total_grew_by=%lld", grew);
      fputc('\n', f);
    } else {
      tty_row(f, name ? name : "(no batch)", label_w, cols, progress, eta_s, rate, done, dead,
              pending, leased);
      if (total > first_total) {
        snprintf(line, sizeof line, "  ^ total grew: +%lld since the last frame, +%lld since "
                 "the watch began", grew, total - first_total);
        fprintf(f, "%.*s\n", cols > 1 ? cols - 1 : (int)sizeof line, line);
      }
    }
  }
  seen_free(seen);
  *seen = next;
  if (mode == WATCH_JSON) {
    json_object_set_new(frame, "batches", arr);
    char *s = json_dumps(frame, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s)
      fprintf(f, "%s\n", s);
    free(s);
    json_decref(frame);
    return;
  }
  if (shown_total > n)
    fprintf(f, "%s(and %lld more active batches)\n", mode == WATCH_LINES ? now : "",
            shown_total - n);
  if (n == 0) {
    if (batch)
      fprintf(f, "%s%sbatch %s has no tasks\n", mode == WATCH_LINES ? now : "",
              mode == WATCH_LINES ? " " : "", batch);
    else
      fprintf(f, "%s%snothing pending or leased, nothing finished in the last 5 minutes\n",
              mode == WATCH_LINES ? now : "", mode == WATCH_LINES ? " " : "");
  }
}

static void watch_on_signal(int sig)
{
  (void)sig;
  watch_stop = 1;
}

/* Sleeps secs in short steps; -1 once a stop signal arrived. */
static int watch_sleep(double secs)
{
  struct timespec end = deadline_after(CLOCK_MONOTONIC, secs);
  while (!watch_stop) {
    if (deadline_passed(CLOCK_MONOTONIC, &end))
      return 0;
    struct timespec step = { 0, 50 * 1000000L };
    nanosleep(&step, NULL);
  }
  return -1;
}

static int terminal_columns(void)
{
  struct winsize ws;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20)
    return ws.ws_col;
  return 80;
}

/* }====== */

/* Tasks per second from a row's SQL_RATE_FINISHED (col) and SQL_RATE_WINDOW (col + 1). */
static double rate_of(PGresult *r, int row, int col)
{
  double window = PQgetisnull(r, row, col + 1) ? 60 : atof(PQgetvalue(r, row, col + 1));
  return window > 0 ? (double)ll_at(r, row, col) / window : 0;
}

/* Seconds until open tasks are done at rate, or -1 when unknown (nothing finishing). */
static double eta_of(long long open, double rate)
{
  return rate > 0 ? (double)open / rate : -1;
}

static long long ll_at(PGresult *r, int row, int col)
{
  return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static json_t *count_value(PGresult *r, int col)
{
  return json_integer(strtoll(PQgetvalue(r, 0, col), NULL, 10));
}

static void print_json(const char *table, const char *tenant, const char *batch,
                       PGresult *counts, PGresult *workers, PGresult *holds, PGresult *budgets,
                       const char *canary)
{
  json_t *o = json_object(), *cnt = json_object(), *w = json_object();
  json_object_set_new(o, "table", json_string(table));
  json_object_set_new(o, "tenant", tenant ? json_string(tenant) : json_null());
  json_object_set_new(o, "batch", batch ? json_string(batch) : json_null());
  json_object_set_new(cnt, STATUS_PENDING, count_value(counts, 0));
  json_object_set_new(cnt, STATUS_LEASED, count_value(counts, 2));
  json_object_set_new(cnt, STATUS_DONE, count_value(counts, 3));
  json_object_set_new(cnt, STATUS_DEAD, count_value(counts, 4));
  json_object_set_new(o, "counts", cnt);
  long long pending = strtoll(PQgetvalue(counts, 0, 0), NULL, 10);
  long long runnable = strtoll(PQgetvalue(counts, 0, 1), NULL, 10);
  json_object_set_new(o, "runnable", json_integer(runnable));
  json_object_set_new(o, "scheduled", json_integer(pending - runnable));
  json_object_set_new(o, "oldest_runnable_age_s",
                      PQgetisnull(counts, 0, 5) ? json_null()
                                                : json_real(atof(PQgetvalue(counts, 0, 5))));
  for (int i = 0; i < PQntuples(workers); i++)
    json_object_set_new(w, PQgetvalue(workers, i, 0),
                        json_integer(strtoll(PQgetvalue(workers, i, 1), NULL, 10)));
  json_object_set_new(o, "leases_by_worker", w);
  /* Added after the fields above, which stay as they were. */
  long long open = pending + strtoll(PQgetvalue(counts, 0, 2), NULL, 10);
  double rate = rate_of(counts, 0, 6);
  double eta = eta_of(open, rate);
  json_object_set_new(o, "throughput_per_s_1m", json_real(round(rate * 1000) / 1000));
  json_object_set_new(o, "eta_s", eta >= 0 ? json_real(round(eta * 10) / 10) : json_null());
  json_t *paused = json_array();
  for (int i = 0; i < PQntuples(holds); i++) {
    json_t *h = json_object();
    json_object_set_new(h, "kind", json_string(PQgetvalue(holds, i, 0)));
    json_object_set_new(h, "scope", json_string(PQgetvalue(holds, i, 1)));
    json_object_set_new(h, "by", json_string(PQgetvalue(holds, i, 4)));
    json_object_set_new(h, "for_s", PQgetisnull(holds, i, 2) ? json_null()
                                                             : json_real(atof(PQgetvalue(holds, i, 2))));
    json_object_set_new(h, "reason", PQgetisnull(holds, i, 3) ? json_null()
                                                              : json_string(PQgetvalue(holds, i, 3)));
    json_array_append_new(paused, h);
  }
  json_object_set_new(o, "paused", paused);
  json_t *bl = json_array();
  for (int i = 0; i < PQntuples(budgets); i++) {
    json_t *e = json_object();
    json_object_set_new(e, "name", json_string(PQgetvalue(budgets, i, 0)));
    static const struct { const char *key; int col; } ints[] = {
      { "rpm", 1 }, { "requests_in_window", 2 }, { "tpm", 3 }, { "tokens_in_window", 4 },
      { "in_flight", 5 },
    };
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
      json_object_set_new(e, ints[k].key,
                          PQgetisnull(budgets, i, ints[k].col)
                            ? json_null()
                            : json_integer(strtoll(PQgetvalue(budgets, i, ints[k].col), NULL, 10)));
    json_object_set_new(e, "window_s", json_real(atof(PQgetvalue(budgets, i, 7))));
    json_object_set_new(e, "paused_for_s", PQgetisnull(budgets, i, 6)
                                             ? json_null()
                                             : json_real(atof(PQgetvalue(budgets, i, 6))));
    json_array_append_new(bl, e);
  }
  json_object_set_new(o, "budgets", bl);
  json_t *cn = json_loads(canary, JSON_DECODE_ANY, NULL);
  json_object_set_new(o, "canary", cn ? cn : json_null());
  char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(9));
  if (s)
    printf("%s\n", s);
  free(s);
  json_decref(o);
}

static void print_text(const char *table, PGresult *counts, PGresult *workers, PGresult *holds,
                       PGresult *budgets, const char *canary)
{
  long long pending = strtoll(PQgetvalue(counts, 0, 0), NULL, 10);
  long long runnable = strtoll(PQgetvalue(counts, 0, 1), NULL, 10);
  printf("table    %s\n", table);
  printf("pending  %lld (runnable %lld, scheduled %lld)\n", pending, runnable, pending - runnable);
  printf("leased   %s\n", PQgetvalue(counts, 0, 2));
  printf("done     %s\n", PQgetvalue(counts, 0, 3));
  printf("dead     %s\n", PQgetvalue(counts, 0, 4));
  if (!PQgetisnull(counts, 0, 5))
    printf("oldest runnable task waits %.1f s\n", atof(PQgetvalue(counts, 0, 5)));
  long long open = pending + strtoll(PQgetvalue(counts, 0, 2), NULL, 10);
  double rate = rate_of(counts, 0, 6);
  double eta = eta_of(open, rate);
  char eta_s[32];
  printf("rate     %.2f/s (done and dead in the last minute, or since the first claim)\n", rate);
  if (open > 0 && eta >= 0) {
    report_format_duration(eta, eta_s, sizeof eta_s);
    printf("eta      %s (pending and leased at that rate)\n", eta_s);
  } else if (open > 0) {
    printf("eta      - (nothing finished in the last minute)\n");
  }
  for (int i = 0; i < PQntuples(workers); i++)
    printf("worker   %s holds %s lease%s\n", PQgetvalue(workers, i, 0), PQgetvalue(workers, i, 1),
           strcmp(PQgetvalue(workers, i, 1), "1") == 0 ? "" : "s");
  for (int i = 0; i < PQntuples(holds); i++) {
    char line[1400], when[64];
    if (PQgetisnull(holds, i, 2))
      snprintf(when, sizeof when, "until resumed");
    else
      snprintf(when, sizeof when, "for %s s", PQgetvalue(holds, i, 2));
    snprintf(line, sizeof line, "paused   %s %s by %s (%s%s%s)", PQgetvalue(holds, i, 0),
             PQgetvalue(holds, i, 1), PQgetvalue(holds, i, 4), when,
             PQgetisnull(holds, i, 3) ? "" : ": ", PQgetvalue(holds, i, 3));
    for (char *p = line; *p; p++)   /* names and reasons cannot forge a line */
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        *p = '?';
    printf("%s\n", line);
  }
  for (int i = 0; i < PQntuples(budgets); i++) {
    char rpm[64], tpm[64], paused[64] = "";
    if (PQgetisnull(budgets, i, 1))
      snprintf(rpm, sizeof rpm, "%s calls", PQgetvalue(budgets, i, 2));
    else
      snprintf(rpm, sizeof rpm, "%s of %s calls", PQgetvalue(budgets, i, 2), PQgetvalue(budgets, i, 1));
    if (PQgetisnull(budgets, i, 3))
      snprintf(tpm, sizeof tpm, "%s tokens", PQgetvalue(budgets, i, 4));
    else
      snprintf(tpm, sizeof tpm, "%s of %s tokens", PQgetvalue(budgets, i, 4), PQgetvalue(budgets, i, 3));
    if (!PQgetisnull(budgets, i, 6))
      snprintf(paused, sizeof paused, ", paused %s s", PQgetvalue(budgets, i, 6));
    printf("budget   %s: %s, %s in the last %g s, %s in flight%s\n", PQgetvalue(budgets, i, 0),
           rpm, tpm, atof(PQgetvalue(budgets, i, 7)), PQgetvalue(budgets, i, 5), paused);
  }
  /* The latest canary, one line (leash canary status has the rest). */
  json_t *cn = json_loads(canary, 0, NULL);
  if (json_is_object(cn)) {
    json_t *n = json_object_get(cn, "numbers");
    const char *reason = json_string_value(json_object_get(n, "reason"));
    printf("canary   %lld %s: %lld%% of tasks on %.12s, %s\n",
           (long long)json_integer_value(json_object_get(cn, "id")),
           json_string_value(json_object_get(cn, "state")),
           (long long)json_integer_value(json_object_get(cn, "share")),
           json_string_value(json_object_get(cn, "version")), reason ? reason : "no numbers");
  }
  json_decref(cn);
}
