/* leash migrate: apply the embedded migrations to the queue table. */
#include "commands.h"
#include "migrate.h"

#include <stdio.h>

static const char usage[] =
  "usage: leash migrate [GLOBAL OPTIONS]\n\n"
  "Creates the queue table, or adopts one made with the seed DDL (rows untouched), and\n"
  "applies every migration not applied yet, in one transaction under an advisory lock:\n"
  "safe to run again and from several processes at once.\n\n";

int cmd_migrate(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = { CLI_GLOBAL_OPTIONS, { NULL, 0, NULL, 0 } };
  int rc;
  g->usage = usage;
  if (cli_next_option(g, argc, argv, opts, &rc) != -1)
    return rc;   /* CLI_STOP: migrate has no options of its own */
  if (optind < argc)
    return cli_usage_error(g, "unexpected argument '%s'", argv[optind]);

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "migrate", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX];
  int applied = migrate_run(c, &t, err, sizeof err);
  if (applied < 0)
    rc = cli_runtime_error(g, "%s", err);
  else
    printf("%s: %d migration%s applied\n", g->table, applied, applied == 1 ? "" : "s");
  cli_close(c, &t);
  return rc;
}
