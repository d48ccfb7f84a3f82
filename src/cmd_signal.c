/* leash signal: an event for the tasks waiting in leash.wait{event = NAME}
   (sql/019_waits.sql's <table>_signal: stored for --ttl, so a wait that starts later sees it). */
#include "commands.h"
#include "migrate.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIGNAL_MAX_TTL_S 604800.0   /* 019: 0 to a week */

static const char usage[] =
  "usage: leash signal NAME [--payload JSON] [--tenant T] [--ttl DURATION]\n\n"
  "Signals the event NAME: every task waiting in leash.wait{event = NAME} becomes runnable,\n"
  "and its next execution reads the payload (leash.waited().event). The signal is kept for\n"
  "--ttl, so a task that starts waiting for NAME within that time is woken at once; a later\n"
  "signal of NAME replaces it. Prints how many waiting tasks woke.\n\n"
  "options:\n"
  "  --payload JSON        any JSON value handed to the woken tasks (default: null)\n"
  "  --tenant T            only this tenant's waiters (default: every tenant's)\n"
  "  --ttl DURATION        how long the signal is kept for later waits (30s, 10m, 2h; 0:\n"
  "                        wake the current waiters only; default 24h, at most 7 days)\n\n";

enum { OPT_PAYLOAD = OPT_COMMAND_BASE, OPT_TENANT, OPT_TTL };

int cmd_signal(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "payload", required_argument, NULL, OPT_PAYLOAD },
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "ttl", required_argument, NULL, OPT_TTL },
    { NULL, 0, NULL, 0 },
  };
  const char *payload = NULL, *tenant = NULL;
  double ttl = 86400;
  int opt, rc;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_PAYLOAD: payload = optarg; break;
    case OPT_TENANT: tenant = optarg; break;
    case OPT_TTL:
      if ((strcmp(optarg, "0") != 0 && cli_parse_duration(optarg, &ttl) != 0) ||
          ttl > SIGNAL_MAX_TTL_S)
        return cli_usage_error(g, "--ttl must be a duration of at most 7 days (30s, 10m, 2h) "
                               "or 0, not '%s'", optarg);
      if (strcmp(optarg, "0") == 0)
        ttl = 0;
      break;
    }
  }
  if (optind != argc - 1)
    return cli_usage_error(g, optind >= argc ? "say which event: leash signal NAME"
                                             : "one event NAME only (unexpected '%s')",
                           optind < argc ? argv[optind + 1] : "");
  const char *name = argv[optind];
  size_t nl = strlen(name);
  if (nl < 1 || nl > 200)
    return cli_usage_error(g, "the event NAME must be 1 to 200 bytes");
  if (tenant && (!*tenant || strlen(tenant) > 512))
    return cli_usage_error(g, "--tenant must be 1 to 512 bytes");
  if (payload) {
    json_error_t je;
    json_t *j = json_loads(payload, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!j)
      return cli_usage_error(g, "--payload is not JSON: %s (column %d)", je.text, je.column);
    json_decref(j);
  }

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "signal", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX], ttl_s[32];
  snprintf(ttl_s, sizeof ttl_s, "%.3f", ttl);
  char *fn = migrate_check(c, &t, err, sizeof err) == 0 ? db_table_object(&t, c, "signal", 1)
                                                         : NULL;
  PGresult *r = NULL;
  if (fn) {
    size_t n = strlen(fn) + 64;
    char *sql = malloc(n);
    if (sql) {
      snprintf(sql, n, "SELECT %s($1, $2::jsonb, $3, $4::float8)", fn);
      const char *params[] = { name, payload, tenant, ttl_s };
      r = db_exec(c, sql, 4, params, err, sizeof err);
      free(sql);
    } else {
      snprintf(err, sizeof err, "out of memory");
    }
    free(fn);
  }
  if (!r) {
    rc = cli_runtime_error(g, "%s", err);
  } else {
    printf("%s\n", PQgetvalue(r, 0, 0));
    PQclear(r);
    rc = EXIT_OK;
  }
  cli_close(c, &t);
  return rc;
}
