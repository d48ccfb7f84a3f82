/* leash cancel and leash release: the two lifecycle changes an operator makes by hand. The
   statements are sql/015_sql_api.sql's functions, called through queue.h. */
#include "commands.h"
#include "buf.h"
#include "lifecycle.h"
#include "migrate.h"
#include "queue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char cancel_usage[] =
  "usage: leash cancel --id N [--id N]... [--json]\n"
  "       leash cancel --batch B [--json]\n"
  "       leash cancel --tenant T [--json]\n\n"
  "Ends the scope's pending and running tasks dead, with cause 'cancelled' (done and dead\n"
  "ones are left alone). A running task's lease ends at once: its worker finds the lease lost\n"
  "at its next heartbeat, the script's later steps, child enqueues and database calls raise,\n"
  "and its outcome is discarded. A cancelled task's shard hands over to its next row.\n"
  "Prints the counts: pending cancelled, running cancelled. `leash requeue --id N` brings a\n"
  "cancelled task back.\n\n"
  "options:\n"
  "  --id N                this task (repeatable)\n"
  "  --batch B             every pending or running task of batch B\n"
  "  --tenant T            every pending or running task of tenant T\n"
  "  --json                print {\"pending\":N,\"running\":M}\n\n";

static const char release_usage[] =
  "usage: leash release --worker W [--force]\n\n"
  "Gives back the leases held by worker W (its --worker-id) after it is gone, instead of\n"
  "waiting for them to expire: the tasks are pending again at once, the attempt not spent.\n"
  "Refused (exit 1) while W still has a live session with the database (every `leash run`\n"
  "holds one on its lease connection), unless --force. Prints the number released.\n\n"
  "options:\n"
  "  --worker W            the worker id (as in the rows' lease_owner)\n"
  "  --force               release even though W has a live session (its running tasks\n"
  "                        then lose their leases at their next heartbeat)\n\n";

enum { OPT_ID = OPT_COMMAND_BASE, OPT_BATCH, OPT_TENANT, OPT_JSON, OPT_WORKER, OPT_FORCE };

int cmd_cancel(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "id", required_argument, NULL, OPT_ID },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "json", no_argument, NULL, OPT_JSON },
    { NULL, 0, NULL, 0 },
  };
  const char *batch = NULL, *tenant = NULL;
  int json = 0, opt, rc;
  long id;
  /* The ids as a bigint[] literal: digits and commas only, built from parsed numbers. */
  struct buf idb = { 0 };
  char *ids = NULL;
  g->usage = cancel_usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      goto out;
    switch (opt) {
    case OPT_ID:
      if (cli_parse_int(optarg, 1, 9223372036854775807L, &id) != 0) {
        rc = cli_usage_error(g, "--id must be a task id (an integer >= 1), not '%s'", optarg);
        goto out;
      }
      buf_printf(&idb, "%s%ld", idb.len ? "," : "{", id);
      break;
    case OPT_BATCH:
    case OPT_TENANT:
      if (*optarg == '\0') {
        rc = cli_usage_error(g, "--%s must not be empty", opt == OPT_BATCH ? "batch" : "tenant");
        goto out;
      }
      *(opt == OPT_BATCH ? &batch : &tenant) = optarg;
      break;
    case OPT_JSON:
      json = 1;
      break;
    }
  }
  if (optind < argc) {
    rc = cli_usage_error(g, "unexpected argument '%s' (ids go with --id N)", argv[optind]);
    goto out;
  }
  if (idb.len && buf_puts(&idb, "}") == 0)
    ids = idb.s;
  if (idb.oom) {
    rc = cli_runtime_error(g, "out of memory");
    goto out;
  }
  int scopes = !!ids + !!batch + !!tenant;
  if (scopes != 1) {
    rc = cli_usage_error(g, scopes ? "give one scope: --id, --batch or --tenant, not several"
                                   : "say which tasks: --id N (repeatable), --batch B or "
                                     "--tenant T");
    goto out;
  }

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "cancel", &c, &t)) != EXIT_OK)
    goto out;
  char err[DB_ERR_MAX];
  long long pending = 0, leased = 0;
  if (migrate_check(c, &t, err, sizeof err) != 0 ||
      queue_cancel(c, &t, ids, batch, tenant, &pending, &leased, err, sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
  } else {
    if (json)
      printf("{\"pending\":%lld,\"running\":%lld}\n", pending, leased);
    else
      printf("cancelled: %lld pending, %lld running\n", pending, leased);
    rc = EXIT_OK;
  }
  cli_close(c, &t);
out:
  buf_free(&idb);
  return rc;
}

int cmd_release(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "worker", required_argument, NULL, OPT_WORKER },
    { "force", no_argument, NULL, OPT_FORCE },
    { NULL, 0, NULL, 0 },
  };
  const char *worker = NULL;
  int force = 0, opt, rc;
  g->usage = release_usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_WORKER:
      if (*optarg == '\0')
        return cli_usage_error(g, "--worker must not be empty");
      worker = optarg;
      break;
    case OPT_FORCE:
      force = 1;
      break;
    }
  }
  if (optind < argc)
    return cli_usage_error(g, "unexpected argument '%s'", argv[optind]);
  if (!worker)
    return cli_usage_error(g, "say whose leases: --worker W");

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "release", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX], pids[256];
  long long released = 0;
  if (migrate_check(c, &t, err, sizeof err) != 0 ||
      queue_release_worker(c, &t, worker, force, pids, sizeof pids, &released, err,
                           sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
  } else if (*pids && !force) {
    /* The worker id is the user's own argument; it is not echoed (it may be long). */
    rc = cli_runtime_error(g, "that worker is alive (database session pid %s); nothing "
                              "released (--force releases anyway)", pids);
  } else {
    if (*pids)
      fprintf(stderr, "leash release: warning: the worker is alive (session pid %s); its "
                      "running tasks lose their leases\n", pids);
    printf("%lld\n", released);
    rc = EXIT_OK;
  }
  cli_close(c, &t);
  return rc;
}
