/* leash status: counts per status, runnable backlog and its age, leases per worker. */
#include "commands.h"
#include "migrate.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
  "usage: leash status [--tenant T] [--batch B] [--json]\n\n"
  "Counts tasks per status (pending split into runnable now and scheduled later), the age\n"
  "of the oldest runnable task, and the leases each worker holds.\n\n"
  "options:\n"
  "  --tenant T            only this tenant\n"
  "  --batch B             only this batch\n"
  "  --json                one JSON object (fields documented in README.md)\n\n";

enum { OPT_TENANT = OPT_COMMAND_BASE, OPT_BATCH, OPT_JSON };

static const char counts_fmt[] =
  "SELECT count(*) FILTER (WHERE status = 'pending'), "
  "       count(*) FILTER (WHERE status = 'pending' AND run_after <= now()), "
  "       count(*) FILTER (WHERE status = 'leased'), "
  "       count(*) FILTER (WHERE status = 'done'), "
  "       count(*) FILTER (WHERE status = 'dead'), "
  "       extract(epoch FROM now() - min(run_after) "
  "               FILTER (WHERE status = 'pending' AND run_after <= now()))::float8 "
  "  FROM %s WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR batch = $2)";

static const char workers_fmt[] =
  "SELECT lease_owner, count(*) FROM %s "
  " WHERE status = 'leased' AND ($1::text IS NULL OR tenant_id = $1) "
  "   AND ($2::text IS NULL OR batch = $2) GROUP BY 1 ORDER BY 1";

static void print_json(const char *table, const char *tenant, const char *batch,
                       PGresult *counts, PGresult *workers);
static void print_text(const char *table, PGresult *counts, PGresult *workers);

int cmd_status(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "json", no_argument, NULL, OPT_JSON },
    { NULL, 0, NULL, 0 },
  };
  const char *tenant = NULL, *batch = NULL;
  int as_json = 0, opt, done, rc;
  g->usage = usage;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    rc = cli_global_option(g, opt, optarg, &done);
    if (done)
      return rc;
    if (rc == 1)
      continue;
    switch (opt) {
    case OPT_TENANT: tenant = optarg; break;
    case OPT_BATCH: batch = optarg; break;
    case OPT_JSON: as_json = 1; break;
    default:
      return cli_usage_error(g, "unknown or incomplete option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return cli_usage_error(g, "unexpected argument '%s'", argv[optind]);

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "status", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX], sql[1024];
  PGresult *counts = NULL, *workers = NULL;
  const char *params[] = { tenant, batch };
  rc = EXIT_RUNTIME;
  if (migrate_check(c, &t, err, sizeof err) != 0)
    goto fail;
  /* One snapshot for both reads, so the numbers add up. */
  if (db_command(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", err, sizeof err) != 0)
    goto fail;
  snprintf(sql, sizeof sql, counts_fmt, t.qualified);
  if (!(counts = db_exec(c, sql, 2, params, err, sizeof err)))
    goto fail;
  snprintf(sql, sizeof sql, workers_fmt, t.qualified);
  if (!(workers = db_exec(c, sql, 2, params, err, sizeof err)))
    goto fail;
  db_command(c, "COMMIT", err, sizeof err);
  if (as_json)
    print_json(g->table, tenant, batch, counts, workers);
  else
    print_text(g->table, counts, workers);
  rc = EXIT_OK;
  goto out;
fail:
  rc = cli_runtime_error(g, "%s", err);
out:
  PQclear(counts);
  PQclear(workers);
  cli_close(c, &t);
  return rc;
}

static json_t *count_value(PGresult *r, int col)
{
  return json_integer(strtoll(PQgetvalue(r, 0, col), NULL, 10));
}

static void print_json(const char *table, const char *tenant, const char *batch,
                       PGresult *counts, PGresult *workers)
{
  json_t *o = json_object(), *cnt = json_object(), *w = json_object();
  json_object_set_new(o, "table", json_string(table));
  json_object_set_new(o, "tenant", tenant ? json_string(tenant) : json_null());
  json_object_set_new(o, "batch", batch ? json_string(batch) : json_null());
  json_object_set_new(cnt, "pending", count_value(counts, 0));
  json_object_set_new(cnt, "leased", count_value(counts, 2));
  json_object_set_new(cnt, "done", count_value(counts, 3));
  json_object_set_new(cnt, "dead", count_value(counts, 4));
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
  char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(9));
  if (s)
    printf("%s\n", s);
  free(s);
  json_decref(o);
}

static void print_text(const char *table, PGresult *counts, PGresult *workers)
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
  for (int i = 0; i < PQntuples(workers); i++)
    printf("worker   %s holds %s lease%s\n", PQgetvalue(workers, i, 0), PQgetvalue(workers, i, 1),
           strcmp(PQgetvalue(workers, i, 1), "1") == 0 ? "" : "s");
}
