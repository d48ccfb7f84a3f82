/* leash prune: delete old done/dead tasks in small transactions (retention). */
#include "commands.h"
#include "lifecycle.h"
#include "log.h"
#include "migrate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
  "usage: leash prune --older-than DURATION [--status done,dead] [--batch B] [--tenant T]\n\n"
  "Deletes done and dead tasks that finished more than DURATION ago (finished_at, or\n"
  "updated_at when a row has none), with their stored steps and their attempt history.\n"
  "Works in chunks, each one\n"
  "short transaction that skips rows another session holds locked, so workers and claims\n"
  "never wait on it. Pending and leased tasks are never deleted. Prints the count.\n\n"
  "options:\n"
  "  --older-than D        age to keep (seconds, or 30m, 12h, 7d); 0 deletes every match\n"
  "  --status LIST         done, dead or done,dead (default done,dead)\n"
  "  --batch B             only this batch\n"
  "  --tenant T            only this tenant\n"
  "  --chunk N             rows per transaction (default 5000)\n\n";

enum { OPT_OLDER_THAN = OPT_COMMAND_BASE, OPT_STATUS, OPT_BATCH, OPT_TENANT, OPT_CHUNK };

/* The cutoff, fixed once so every chunk deletes by the same rule. $1 seconds. */
static const char cutoff_sql[] =
  "SELECT now() - make_interval(secs => $1::float8)";

/* One chunk: %s twice (the table). $1 the last id seen, $2 statuses (text[]), $3 cutoff,
   $4 tenant, $5 batch, $6 chunk size. Ids upwards through the primary key, so a chunk starts
   where the last one stopped instead of rescanning the rows it deleted. Steps go with their
   task (ON DELETE CASCADE), and so do its attempts (sql/020's statement trigger), in the same
   chunk. */
static const char chunk_fmt[] =
  "WITH c AS ("
  "  SELECT id FROM %s"
  "   WHERE id > $1::bigint AND status = ANY ($2::text[])"
  "     AND coalesce(finished_at, updated_at) < $3::timestamptz"
  "     AND ($4::text IS NULL OR tenant_id = $4::text) AND ($5::text IS NULL OR batch = $5::text)"
  "   ORDER BY id LIMIT $6::int FOR UPDATE SKIP LOCKED"
  "), d AS ("
  "  DELETE FROM %s q USING c WHERE q.id = c.id RETURNING q.id"
  ") SELECT (SELECT count(*) FROM d), (SELECT max(id) FROM c)";

static int parse_statuses(struct cli *g, const char *list, const char **out);

int cmd_prune(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "older-than", required_argument, NULL, OPT_OLDER_THAN },
    { "status", required_argument, NULL, OPT_STATUS },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "chunk", required_argument, NULL, OPT_CHUNK },
    { NULL, 0, NULL, 0 },
  };
  const char *tenant = NULL, *batch = NULL, *statuses = "{done,dead}", *older = NULL;
  char secs_buf[32], chunk_buf[24] = "5000";
  int opt, rc;
  double secs = 0;
  long n;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_OLDER_THAN:
      if (cli_parse_duration(optarg, &secs) != 0)
        return cli_usage_error(g, "--older-than: '%s' is not a duration (e.g. 3600, 12h, 7d)",
                               optarg);
      older = optarg;
      break;
    case OPT_STATUS:
      if ((rc = parse_statuses(g, optarg, &statuses)) != EXIT_OK)
        return rc;
      break;
    case OPT_BATCH: batch = optarg; break;
    case OPT_TENANT: tenant = optarg; break;
    case OPT_CHUNK:
      if (cli_parse_int(optarg, 1, 100000, &n) != 0)
        return cli_usage_error(g, "--chunk must be an integer from 1 to 100000, not '%s'", optarg);
      snprintf(chunk_buf, sizeof chunk_buf, "%ld", n);
      break;
    }
  }
  if (optind < argc)
    return cli_usage_error(g, "unexpected argument '%s'", argv[optind]);
  if (!older)
    return cli_usage_error(g, "missing --older-than DURATION (e.g. --older-than 7d)");
  snprintf(secs_buf, sizeof secs_buf, "%.3f", secs);

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "prune", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX], cutoff[64], last[24] = "0";
  char *sql = malloc(sizeof chunk_fmt + 2 * strlen(t.qualified));
  long long total = 0, chunks = 0;
  PGresult *r = NULL;
  rc = EXIT_RUNTIME;
  if (!sql) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  sprintf(sql, chunk_fmt, t.qualified, t.qualified);
  if (migrate_check(c, &t, err, sizeof err) != 0)
    goto fail;
  const char *cp[] = { secs_buf };
  if (!(r = db_exec(c, cutoff_sql, 1, cp, err, sizeof err)))
    goto fail;
  snprintf(cutoff, sizeof cutoff, "%s", PQgetvalue(r, 0, 0));
  PQclear(r);
  /* Autocommit: each chunk is its own transaction, its row locks held for one statement. */
  for (;;) {
    const char *params[] = { last, statuses, cutoff, tenant, batch, chunk_buf };
    if (!(r = db_exec(c, sql, 6, params, err, sizeof err)))
      goto fail;
    long long k = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    int more = !PQgetisnull(r, 0, 1);
    if (more)
      snprintf(last, sizeof last, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    r = NULL;
    if (!more)
      break;
    total += k;
    chunks++;
    log_debug("prune: chunk %lld deleted %lld rows (ids up to %s)", chunks, k, last);
  }
  log_debug("prune: %lld rows deleted in %lld chunks (cutoff %s)", total, chunks, cutoff);
  printf("%lld\n", total);
  rc = EXIT_OK;
  goto out;
fail:
  /* Chunks already committed stay deleted: the one error line says how many. */
  if (total > 0)
    rc = cli_runtime_error(g, "%s (%lld task%s had been deleted before the error)", err, total,
                           total == 1 ? "" : "s");
  else
    rc = cli_runtime_error(g, "%s", err);
out:
  free(sql);
  cli_close(c, &t);
  return rc;
}

/* 1 when the len bytes at p are the word w. */
static int word_is(const char *p, size_t len, const char *w)
{
  return strlen(w) == len && strncmp(p, w, len) == 0;
}

/* "done", "dead", "done,dead" (any order, spaces allowed) into a text[] literal. */
static int parse_statuses(struct cli *g, const char *list, const char **out)
{
  int want_done = 0, want_dead = 0;
  const char *p = list;
  for (;;) {
    while (*p == ' ')
      p++;
    size_t len = strcspn(p, ", ");
    const char *end = p + len;
    while (*end == ' ')
      end++;
    if (word_is(p, len, STATUS_DONE))
      want_done = 1;
    else if (word_is(p, len, STATUS_DEAD))
      want_dead = 1;
    else if (word_is(p, len, STATUS_PENDING) || word_is(p, len, STATUS_LEASED))
      return cli_usage_error(g, "--status: prune deletes only done and dead tasks, not %.*s ones",
                             (int)len, p);
    else
      return cli_usage_error(g, "--status: '%.*s' is not a status (done, dead or done,dead)",
                             (int)len, p);
    if (*end == '\0')
      break;
    if (*end != ',')
      return cli_usage_error(g, "--status: expected a comma-separated list, not '%s'", list);
    p = end + 1;
  }
  *out = want_done && want_dead ? "{" STATUS_DONE "," STATUS_DEAD "}"
          : want_done            ? "{" STATUS_DONE "}"
                                 : "{" STATUS_DEAD "}";
  return EXIT_OK;
}
