/* leash requeue: dead tasks back to pending, attempts reset, runnable now. */
#include "commands.h"
#include "migrate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
  "usage: leash requeue --dead [--tenant T] [--batch B]\n"
  "       leash requeue --id N [--id N]... [--tenant T] [--batch B]\n\n"
  "Puts dead tasks back to pending: attempts and crashes 0, last_cause cleared, runnable now,\n"
  "lease cleared (a quarantined task runs again). last_error,\n"
  "result and stored steps are kept, so a requeued task resumes after the steps it already\n"
  "paid for. Only dead tasks are touched: an --id that is pending, leased, done, missing or\n"
  "outside --tenant/--batch is left as it is and named on stderr. Prints the count.\n"
  "--dead works in chunks of 5,000 rows, each its own transaction.\n\n"
  "options:\n"
  "  --dead                every dead task in scope\n"
  "  --id N                this task (repeatable)\n"
  "  --tenant T            only this tenant\n"
  "  --batch B             only this batch\n\n";

enum { OPT_DEAD = OPT_COMMAND_BASE, OPT_ID, OPT_TENANT, OPT_BATCH };

#define REQUEUE_CHUNK "5000"

/* What a requeued row becomes: a fresh start for its attempts and its crashes (a quarantined
   task runs again, with max_crashes more crashes allowed). */
#define REQUEUE_SET \
  "SET status = 'pending', attempts = 0, crashes = 0, last_cause = NULL, run_after = now(), " \
  "    locked_until = NULL, updated_at = now() "

/* --dead, one chunk: %s twice (the table). $1 the last id done, $2 tenant, $3 batch, $4 the
   chunk size. Walking ids upwards ends the loop even when requeued tasks die again at once. */
static const char chunk_fmt[] =
  "WITH c AS ("
  "  SELECT id FROM %s"
  "   WHERE id > $1::bigint AND status = 'dead'"
  "     AND ($2::text IS NULL OR tenant_id = $2::text) AND ($3::text IS NULL OR batch = $3::text)"
  "   ORDER BY id LIMIT $4::int FOR UPDATE SKIP LOCKED"
  "), u AS ("
  "  UPDATE %s q " REQUEUE_SET " FROM c WHERE q.id = c.id AND q.status = 'dead'"
  "  RETURNING q.id"
  ") SELECT (SELECT count(*) FROM u), (SELECT max(id) FROM c)";

/* --id: %s twice. $1 the ids (bigint[]), $2 tenant, $3 batch. One row per distinct id with
   why it was not requeued (NULL when it was). */
static const char ids_fmt[] =
  "WITH u AS ("
  "  UPDATE %s q " REQUEUE_SET
  "   WHERE q.id = ANY ($1::bigint[]) AND q.status = 'dead'"
  "     AND ($2::text IS NULL OR q.tenant_id = $2::text) AND ($3::text IS NULL OR q.batch = $3::text)"
  "  RETURNING q.id"
  ") SELECT g.id,"
  "         CASE WHEN u.id IS NOT NULL THEN NULL"
  "              WHEN q.id IS NULL THEN 'no such task'"
  "              WHEN q.status <> 'dead' THEN q.status"
  "              ELSE 'outside --tenant/--batch' END"
  "    FROM (SELECT DISTINCT unnest($1::bigint[]) AS id) g"
  "    LEFT JOIN u ON u.id = g.id"
  "    LEFT JOIN %s q ON q.id = g.id"
  "   ORDER BY g.id";

/* Idle workers wake for rows that became runnable (the insert trigger's channel). */
static const char notify_sql[] =
  "SELECT pg_notify('leash_' || $1::regclass::oid::text, '')";

static int requeue_dead(PGconn *c, const struct db_table *t, const char *tenant,
                        const char *batch, long long *count, char *err, size_t errlen);
static int requeue_ids(const struct cli *g, PGconn *c, const struct db_table *t,
                       const char *ids, const char *tenant, const char *batch,
                       long long *count, char *err, size_t errlen);

int cmd_requeue(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "dead", no_argument, NULL, OPT_DEAD },
    { "id", required_argument, NULL, OPT_ID },
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "batch", required_argument, NULL, OPT_BATCH },
    { NULL, 0, NULL, 0 },
  };
  const char *tenant = NULL, *batch = NULL;
  int dead = 0, opt, rc;
  long id;
  /* The ids as a bigint[] literal: digits and commas only, built from parsed numbers. */
  char *ids = NULL;
  size_t ids_len = 0;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      goto out_args;
    switch (opt) {
    case OPT_DEAD: dead = 1; break;
    case OPT_ID: {
      if (cli_parse_int(optarg, 1, 9223372036854775807L, &id) != 0) {
        rc = cli_usage_error(g, "--id must be a task id (an integer >= 1), not '%s'", optarg);
        goto out_args;
      }
      char *n = realloc(ids, ids_len + 24);
      if (!n) {
        rc = cli_runtime_error(g, "out of memory");
        goto out_args;
      }
      ids = n;
      ids_len += (size_t)sprintf(ids + ids_len, "%s%ld", ids_len ? "," : "{", id);
      break;
    }
    case OPT_TENANT: tenant = optarg; break;
    case OPT_BATCH: batch = optarg; break;
    }
  }
  if (optind < argc) {
    rc = cli_usage_error(g, "unexpected argument '%s' (ids go with --id N)", argv[optind]);
    goto out_args;
  }
  if (dead == !!ids) {
    rc = cli_usage_error(g, dead ? "give either --dead or --id, not both"
                                 : "say which tasks: --dead, or --id N (repeatable)");
    goto out_args;
  }
  if (ids) {
    char *n = realloc(ids, ids_len + 2);
    if (!n) {
      rc = cli_runtime_error(g, "out of memory");
      goto out_args;
    }
    ids = n;
    strcpy(ids + ids_len, "}");
  }

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "requeue", &c, &t)) != EXIT_OK)
    goto out_args;
  char err[DB_ERR_MAX];
  long long count = 0;
  const char *params[] = { t.qualified };
  PGresult *r = NULL;
  if (migrate_check(c, &t, err, sizeof err) != 0 ||
      (ids ? requeue_ids(g, c, &t, ids, tenant, batch, &count, err, sizeof err)
           : requeue_dead(c, &t, tenant, batch, &count, err, sizeof err)) != 0 ||
      (count > 0 && !(r = db_exec(c, notify_sql, 1, params, err, sizeof err)))) {
    rc = cli_runtime_error(g, "%s", err);
    /* Chunks already committed stay requeued: say how many. */
    if (count > 0)
      fprintf(stderr, "leash requeue: %lld task%s had been requeued before the error\n",
              count, count == 1 ? "" : "s");
  } else {
    printf("%lld\n", count);
    rc = EXIT_OK;
  }
  PQclear(r);
  cli_close(c, &t);
out_args:
  free(ids);
  return rc;
}

static int requeue_dead(PGconn *c, const struct db_table *t, const char *tenant,
                        const char *batch, long long *count, char *err, size_t errlen)
{
  char sql[sizeof chunk_fmt + 2 * 256], last[24] = "0";
  snprintf(sql, sizeof sql, chunk_fmt, t->qualified, t->qualified);
  for (;;) {
    const char *params[] = { last, tenant, batch, REQUEUE_CHUNK };
    PGresult *r = db_exec(c, sql, 4, params, err, errlen);
    if (!r)
      return -1;
    long long n = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    if (!PQgetisnull(r, 0, 1))
      snprintf(last, sizeof last, "%s", PQgetvalue(r, 0, 1));
    int more = !PQgetisnull(r, 0, 1);
    PQclear(r);
    *count += n;
    if (!more)
      return 0;
  }
}

static int requeue_ids(const struct cli *g, PGconn *c, const struct db_table *t,
                       const char *ids, const char *tenant, const char *batch,
                       long long *count, char *err, size_t errlen)
{
  char sql[sizeof ids_fmt + 3 * 256];
  snprintf(sql, sizeof sql, ids_fmt, t->qualified, t->qualified);
  const char *params[] = { ids, tenant, batch };
  PGresult *r = db_exec(c, sql, 3, params, err, errlen);
  if (!r)
    return -1;
  /* One line naming every id left alone, e.g. "not requeued: 5 (done), 9 (no such task)". */
  char note[1024] = "";
  size_t used = 0;
  int skipped = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    if (PQgetisnull(r, i, 1)) {
      (*count)++;
      continue;
    }
    if (used < sizeof note - 1) {
      int w = snprintf(note + used, sizeof note - used, "%s%s (%s)", skipped ? ", " : "",
                       PQgetvalue(r, i, 0), PQgetvalue(r, i, 1));
      used = w < 0 ? used : used + (size_t)w;
    }
    skipped++;
  }
  PQclear(r);
  if (skipped)
    fprintf(stderr, "leash %s: %d id%s not requeued (only dead tasks are): %s%s\n", g->command,
            skipped, skipped == 1 ? "" : "s", note, used >= sizeof note - 1 ? " ..." : "");
  return 0;
}
