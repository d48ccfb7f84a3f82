/* leash report: a batch's summary (totals, attempts, durations, dead reasons, wall time). */
#include "buf.h"
#include "commands.h"
#include "migrate.h"
#include "report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
  "usage: leash report [--batch B] [--tenant T]... [--by version] [--json]\n\n"
  "Summarises a batch (or the whole table): tasks per status, how many attempts tasks took,\n"
  "retries, durations of done tasks (p50, p95, max of their last attempt, from when the\n"
  "script's handle started), the waits before it (pickup: runnable to claimed; claim to\n"
  "start), the most frequent dead reasons with example ids, and the wall time from the first\n"
  "claim to the last finish, and the tokens and cost of its budgeted calls by budget and\n"
  "model (leash spend). All numbers come from one snapshot.\n\n"
  "With --by version, the same scope per script version from the attempt history: tasks,\n"
  "attempts, attempts done, retried, fatal, snoozed, crashed and lost with their share of\n"
  "the version's attempts, tasks left dead, run time p50/p95, tokens and cost.\n\n"
  "options:\n"
  "  --batch B             only this batch\n"
  "  --tenant T            only this tenant (repeatable)\n"
  "  --by version          one summary per script version (the attempt history)\n"
  "  --json                one JSON object (fields documented in README.md)\n\n";

enum { OPT_TENANT = OPT_COMMAND_BASE, OPT_BATCH, OPT_JSON, OPT_BY };

#define MAX_TENANTS 64

int cmd_report(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "json", no_argument, NULL, OPT_JSON },
    { "by", required_argument, NULL, OPT_BY },
    { NULL, 0, NULL, 0 },
  };
  const char *tenants[MAX_TENANTS], *batch = NULL;
  size_t ntenants = 0;
  int as_json = 0, by_version = 0, opt, rc;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_TENANT:
      if (ntenants == MAX_TENANTS)
        return cli_usage_error(g, "at most %d --tenant options", MAX_TENANTS);
      tenants[ntenants++] = optarg;
      break;
    case OPT_BATCH: batch = optarg; break;
    case OPT_JSON: as_json = 1; break;
    case OPT_BY:
      if (strcmp(optarg, "version") != 0)
        return cli_usage_error(g, "--by takes 'version', not '%s'", optarg);
      by_version = 1;
      break;
    }
  }
  if (optind < argc)
    return cli_usage_error(g, "unexpected argument '%s'", argv[optind]);

  char *tenant_array = NULL;
  if (ntenants && !(tenant_array = text_array_literal(tenants, (size_t)ntenants)))
    return cli_runtime_error(g, "out of memory");
  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "report", &c, &t)) != EXIT_OK) {
    free(tenant_array);
    return rc;
  }
  char err[DB_ERR_MAX];
  if (migrate_check(c, &t, err, sizeof err) != 0 ||
      (by_version ? report_print_by_version(c, &t, tenant_array, batch, as_json, stdout, err,
                                            sizeof err)
                  : report_print(c, &t, tenant_array, batch, as_json, stdout, err,
                                 sizeof err)) != 0)
    rc = cli_runtime_error(g, "%s", err);
  else
    rc = EXIT_OK;
  free(tenant_array);
  cli_close(c, &t);
  return rc;
}
