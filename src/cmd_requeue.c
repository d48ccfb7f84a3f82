/* leash requeue: dead tasks back to pending, attempts reset, runnable now. */
#include "commands.h"
#include "buf.h"
#include "migrate.h"
#include "queue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
  "usage: leash requeue --dead [--tenant T] [--batch B]\n"
  "       leash requeue --id N [--id N]... [--tenant T] [--batch B]\n\n"
  "Puts dead tasks back to pending: attempts, crashes and snoozes 0, last_cause cleared,\n"
  "runnable now, lease cleared (a quarantined task runs again). last_error, result and\n"
  "stored steps are kept, so a requeued task resumes after the steps it already\n"
  "paid for. Only dead tasks are touched: an --id that is pending, leased, done, missing or\n"
  "outside --tenant/--batch is left as it is and named on stderr. Prints the count.\n"
  "--dead works in chunks of 5,000 rows, each its own transaction.\n\n"
  "options:\n"
  "  --dead                every dead task in scope\n"
  "  --id N                this task (repeatable)\n"
  "  --tenant T            only this tenant\n"
  "  --batch B             only this batch\n\n";

enum { OPT_DEAD = OPT_COMMAND_BASE, OPT_ID, OPT_TENANT, OPT_BATCH };

/* --dead's transaction size: short enough that a big requeue does not hold many locks. */
#define REQUEUE_CHUNK 5000

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
  struct buf idb = { 0 };
  char *ids = NULL;
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
      buf_printf(&idb, "%s%ld", idb.len ? "," : "{", id);
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
  if (idb.len && buf_puts(&idb, "}") == 0)
    ids = idb.s;
  if (idb.oom) {
    rc = cli_runtime_error(g, "out of memory");
    goto out_args;
  }
  if (dead == !!ids) {
    rc = cli_usage_error(g, dead ? "give either --dead or --id, not both"
                                 : "say which tasks: --dead, or --id N (repeatable)");
    goto out_args;
  }

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "requeue", &c, &t)) != EXIT_OK)
    goto out_args;
  char err[DB_ERR_MAX];
  long long count = 0;
  /* Idle workers wake for rows that became runnable. */
  if (migrate_check(c, &t, err, sizeof err) != 0 ||
      (ids ? requeue_ids(g, c, &t, ids, tenant, batch, &count, err, sizeof err)
           : queue_requeue_dead(c, &t, tenant, batch, REQUEUE_CHUNK, &count, err,
                                sizeof err)) != 0 ||
      (count > 0 && queue_notify(c, &t, err, sizeof err) != 0)) {
    /* Chunks already committed stay requeued: the one error line says how many. */
    if (count > 0)
      rc = cli_runtime_error(g, "%s (%lld task%s had been requeued before the error)", err,
                             count, count == 1 ? "" : "s");
    else
      rc = cli_runtime_error(g, "%s", err);
  } else {
    printf("%lld\n", count);
    rc = EXIT_OK;
  }
  cli_close(c, &t);
out_args:
  buf_free(&idb);
  return rc;
}

static int requeue_ids(const struct cli *g, PGconn *c, const struct db_table *t,
                       const char *ids, const char *tenant, const char *batch,
                       long long *count, char *err, size_t errlen)
{
  PGresult *r = queue_requeue_ids(c, t, ids, tenant, batch, err, errlen);
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
