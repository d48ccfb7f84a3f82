/* leash: argv, the command table, exit codes. Everything else lives in leash_core. */
#include "cli.h"
#include "commands.h"

#include <curl/curl.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct command {
  const char *name;
  int (*run)(struct cli *g, int argc, char **argv);
  const char *summary;
};

/* Only commands that exist are listed; --help prints this table. */
static const struct command commands[] = {
  { "migrate", cmd_migrate, "create or upgrade the queue table's schema" },
  { "enqueue", cmd_enqueue, "add one task, or many from a JSONL file" },
  { "status", cmd_status, "counts per status, throughput, ETA; --watch for live progress" },
  { "report", cmd_report, "a batch's summary: totals, attempts, durations, dead reasons" },
  { "requeue", cmd_requeue, "put dead tasks back to pending (--dead, or --id N)" },
  { "inspect", cmd_inspect, "one task's row, its stored steps and last error" },
  { "tenant", cmd_tenant, "fair shares: set, list or reset a tenant's weight" },
  { "budget", cmd_budget, "provider budgets: set, show, pause, resume or delete one" },
  { "spend", cmd_spend, "prices per model, spend caps per tenant or batch, what was spent" },
  { "pause", cmd_pause, "claims skip a tenant, a batch or a budget's tasks until resumed" },
  { "resume", cmd_resume, "lift a pause" },
  { "cancel", cmd_cancel, "end pending and running tasks dead (--id N, --batch B, --tenant T)" },
  { "signal", cmd_signal, "wake the tasks waiting for an event (leash.wait{event = NAME})" },
  { "release", cmd_release, "give back the leases of a worker that is gone (--worker W)" },
  { "dashboard", cmd_dashboard, "a web dashboard of the queue: batches, charts, workers, actions" },
  { "canary", cmd_canary, "run a candidate script for a share of tasks; promote or roll back" },
  { "fixture", cmd_fixture, "a dead task's recording as a busted spec and its fixture" },
  { "replay", cmd_replay, "a batch's recordings run through a new script offline: what changes" },
  { "prune", cmd_prune, "delete old done/dead tasks in small chunks" },
  { "run", cmd_run, "run the worker host with a Lua script" },
  { "check", cmd_check, "load a Lua script as run would and report errors" },
  { NULL, NULL, NULL },
};

static void print_help(const struct option *opts);

int main(int argc, char **argv)
{
  struct cli g = { .table = CLI_DEFAULT_TABLE };
  static const struct option opts[] = { CLI_GLOBAL_OPTIONS, { NULL, 0, NULL, 0 } };
  int opt, done;

  /* No libcrypto clean-up at exit: a loader thread stuck in a wedged setup may still be
     hashing when the process exits, and its cleanup would free what that thread uses. First,
     before libcurl initialises libcrypto: only the first initialisation decides. */
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
  /* Before any thread: libcurl's global state is not thread-safe to set up. */
  curl_global_init(CURL_GLOBAL_DEFAULT);
  atexit(curl_global_cleanup);

  /* '+': stop at the command; its own options (and globals after it) are its business. */
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
    if (opt == 'h') {
      print_help(opts);
      return EXIT_OK;
    }
    if (opt == '?' || opt == ':')
      return cli_usage_error(&g, "unknown or incomplete option '%s'", argv[optind - 1]);
    int rc = cli_global_option(&g, opt, optarg, &done);
    if (done)
      return rc;
  }
  if (optind >= argc) {
    print_help(opts);
    return EXIT_USAGE;
  }
  int at = optind;
  const char *name = argv[at];
  for (const struct command *c = commands; c->name; c++)
    if (strcmp(c->name, name) == 0) {
      g.command = c->name;
      optind = 0;   /* glibc: full re-initialisation for the command's own parse */
      return c->run(&g, argc - at, argv + at);
    }
  return cli_usage_error(&g, "unknown command '%s'", name);
}

static void print_help(const struct option *opts)
{
  printf("usage: leash [GLOBAL OPTIONS] COMMAND [OPTIONS]\n\ncommands:\n");
  for (const struct command *c = commands; c->name; c++)
    printf("  %-11s %s\n", c->name, c->summary);
  printf("\n%s\n", cli_global_help);
  cli_print_env_help(stdout, opts);
  printf("\nRun 'leash COMMAND --help' for a command's options and their variables.\n");
}
