/* leash tenant: fair-share weights, stored in <table>_tenants so every process shares them. */
#include "commands.h"
#include "lifecycle.h"
#include "migrate.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WEIGHT_MIN 1      /* the column's CHECK (sql/011_scheduler.sql) */
#define WEIGHT_MAX 1000

static const char usage[] =
  "usage: leash tenant set T --weight W\n"
  "       leash tenant list [--json]\n"
  "       leash tenant reset T\n\n"
  "Claims divide between tenants that have runnable work by weight: a tenant of weight 3 gets\n"
  "three claims for every one of a tenant of weight 1 while both have work waiting. A tenant\n"
  "without a weight has weight 1, so by default shares are equal. Weights live in the\n"
  "database (<table>_tenants): every worker sees a change at its next claims, no restart.\n\n"
  "  set T --weight W      give tenant T the weight W (an integer from "
  LIFECYCLE_STR(WEIGHT_MIN) " to " LIFECYCLE_STR(WEIGHT_MAX) ")\n"
  "  list                  every tenant with a weight, and every tenant with pending or\n"
  "                        leased tasks: tenant, weight, pending, leased\n"
  "  reset T               remove T's weight: back to 1, the default\n\n"
  "T is a tenant_id, at most " LIFECYCLE_STR(LIFECYCLE_MAX_TENANT_BYTES) " bytes; put -- before "
  "one that starts with '-'. In list's\ntext form control characters show as \\xNN; --json "
  "has the names exactly.\n\n"
  "options:\n"
  "  --weight W            the weight, for set\n"
  "  --json                list as one JSON object (fields documented in README.md)\n\n";

enum { OPT_WEIGHT = OPT_COMMAND_BASE, OPT_JSON };

/* The weight before and after, from one statement. %s: the tenants table, twice. */
static const char set_fmt[] =
  "WITH old AS (SELECT weight FROM %s WHERE tenant_id = $1), "
  "     up AS (INSERT INTO %s AS w (tenant_id, weight, updated_at) "
  "            VALUES ($1, $2::int, now()) "
  "            ON CONFLICT (tenant_id) DO UPDATE SET weight = EXCLUDED.weight, "
  "                                                  updated_at = now() "
  "            RETURNING w.weight) "
  "SELECT (SELECT weight FROM up), (SELECT weight FROM old)";

/* %s: the tenants table. */
static const char reset_fmt[] = "DELETE FROM %s WHERE tenant_id = $1 RETURNING weight";

/* Tenants with a weight row, and tenants with open work and none (weight 1, weight_set
   false), as JSON built by PostgreSQL (names exact, one snapshot). Ordered bytewise so the
   order does not depend on the database's collation. %s: the tenants table, then the queue;
   $1 the queue's quoted name. */
static const char list_fmt[] =
  "SELECT json_build_object('table', $1::regclass::text, 'tenants', "
  "         coalesce(json_agg(json_build_object("
  "           'tenant_id', x.tenant_id, 'weight', x.weight, 'weight_set', x.weight_set,"
  "           'pending', x.pending, 'leased', x.leased,"
  "           'updated_at', to_char(x.updated_at AT TIME ZONE 'UTC',"
  "                                 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))"
  "           ORDER BY x.tenant_id COLLATE \"C\"), '[]'))::text "
  "  FROM (SELECT tenant_id, coalesce(w.weight, 1) AS weight,"
  "               w.weight IS NOT NULL AS weight_set, coalesce(q.pending, 0) AS pending,"
  "               coalesce(q.leased, 0) AS leased, w.updated_at"
  "          FROM %s w"
  "          FULL JOIN (SELECT tenant_id,"
  "                            count(*) FILTER (WHERE status = " SQL_PENDING ") AS pending,"
  "                            count(*) FILTER (WHERE status = " SQL_LEASED ") AS leased"
  "                       FROM %s WHERE status IN (" SQL_PENDING ", " SQL_LEASED ")"
  "                      GROUP BY tenant_id) q USING (tenant_id)) x";

static int check_tenant(struct cli *g, const char *tenant);
static int tenant_set(struct cli *g, PGconn *c, const char *tenants_t, const char *tenant,
                      const char *weight);
static int tenant_reset(struct cli *g, PGconn *c, const char *tenants_t, const char *tenant);
static int tenant_list(struct cli *g, PGconn *c, const struct db_table *t,
                       const char *tenants_t, int as_json);
static int db_error(struct cli *g, const char *err);
static void print_name(const char *s, int width);
static int display_width(const char *s);

int cmd_tenant(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "weight", required_argument, NULL, OPT_WEIGHT },
    { "json", no_argument, NULL, OPT_JSON },
    { NULL, 0, NULL, 0 },
  };
  const char *weight = NULL;
  int as_json = 0, opt, rc;
  long n;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_WEIGHT:
      if (cli_parse_int(optarg, WEIGHT_MIN, WEIGHT_MAX, &n) != 0)
        return cli_usage_error(g, "--weight must be an integer from %d to %d, not '%s'",
                               WEIGHT_MIN, WEIGHT_MAX, optarg);
      weight = optarg;
      break;
    case OPT_JSON: as_json = 1; break;
    }
  }
  if (optind >= argc)
    return cli_usage_error(g, "missing what to do: set, list or reset");
  const char *sub = argv[optind++];
  int args = argc - optind;
  const char *tenant = args > 0 ? argv[optind] : NULL;
  int is_set = strcmp(sub, "set") == 0, is_list = strcmp(sub, "list") == 0,
      is_reset = strcmp(sub, "reset") == 0;
  if (!is_set && !is_list && !is_reset)
    return cli_usage_error(g, "unknown action '%s' (set, list or reset)", sub);
  if (is_list && args > 0)
    return cli_usage_error(g, "list takes no tenant (unexpected '%s')", argv[optind]);
  if (!is_list && args != 1)
    return cli_usage_error(g, args ? "%s takes one tenant (quote a name with spaces)"
                                   : "%s: missing the tenant T", sub);
  if (weight && !is_set)
    return cli_usage_error(g, "--weight goes with set");
  if (is_set && !weight)
    return cli_usage_error(g, "set: missing --weight W");
  if (as_json && !is_list)
    return cli_usage_error(g, "--json goes with list");
  if (tenant && (rc = check_tenant(g, tenant)) != EXIT_OK)
    return rc;

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "tenant", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX];
  char *tenants_t = NULL;
  if (migrate_check(c, &t, err, sizeof err) != 0)
    rc = cli_runtime_error(g, "%s", err);
  else if (!(tenants_t = db_table_object(&t, c, "tenants", 1)))
    rc = cli_runtime_error(g, "out of memory");
  else if (is_set)
    rc = tenant_set(g, c, tenants_t, tenant, weight);
  else if (is_reset)
    rc = tenant_reset(g, c, tenants_t, tenant);
  else
    rc = tenant_list(g, c, &t, tenants_t, as_json);
  free(tenants_t);
  cli_close(c, &t);
  return rc;
}

/* The bounds of tenant_id everywhere else (enqueue, the column's CHECK). */
static int check_tenant(struct cli *g, const char *tenant)
{
  size_t len = strlen(tenant);
  if (len == 0)
    return cli_usage_error(g, "the tenant T must not be empty");
  if (len > LIFECYCLE_MAX_TENANT_BYTES)
    return cli_usage_error(g, "the tenant T is %zu bytes; at most %d", len,
                           LIFECYCLE_MAX_TENANT_BYTES);
  return EXIT_OK;
}

static int tenant_set(struct cli *g, PGconn *c, const char *tenants_t, const char *tenant,
                      const char *weight)
{
  size_t n = sizeof set_fmt + 2 * strlen(tenants_t);
  char *sql = malloc(n), err[DB_ERR_MAX];
  if (!sql)
    return cli_runtime_error(g, "out of memory");
  snprintf(sql, n, set_fmt, tenants_t, tenants_t);
  const char *params[] = { tenant, weight };
  PGresult *r = db_exec(c, sql, 2, params, err, sizeof err);
  free(sql);
  if (!r)
    return db_error(g, err);
  if (PQgetisnull(r, 0, 1))
    printf("weight %s (was 1, the default)\n", PQgetvalue(r, 0, 0));
  else
    printf("weight %s (was %s)\n", PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
  PQclear(r);
  return EXIT_OK;
}

static int tenant_reset(struct cli *g, PGconn *c, const char *tenants_t, const char *tenant)
{
  size_t n = sizeof reset_fmt + strlen(tenants_t);
  char *sql = malloc(n), err[DB_ERR_MAX];
  if (!sql)
    return cli_runtime_error(g, "out of memory");
  snprintf(sql, n, reset_fmt, tenants_t);
  const char *params[] = { tenant };
  PGresult *r = db_exec(c, sql, 1, params, err, sizeof err);
  free(sql);
  if (!r)
    return db_error(g, err);
  if (PQntuples(r) == 0)
    printf("weight 1, the default (no weight was set)\n");
  else
    printf("weight 1, the default (was %s)\n", PQgetvalue(r, 0, 0));
  PQclear(r);
  return EXIT_OK;
}

static int tenant_list(struct cli *g, PGconn *c, const struct db_table *t,
                       const char *tenants_t, int as_json)
{
  size_t n = sizeof list_fmt + strlen(tenants_t) + strlen(t->qualified);
  char *sql = malloc(n), err[DB_ERR_MAX];
  if (!sql)
    return cli_runtime_error(g, "out of memory");
  snprintf(sql, n, list_fmt, tenants_t, t->qualified);
  const char *params[] = { t->qualified };
  PGresult *r = db_exec(c, sql, 1, params, err, sizeof err);
  free(sql);
  if (!r)
    return db_error(g, err);
  json_error_t je;
  json_t *o = json_loads(PQgetvalue(r, 0, 0), 0, &je);
  PQclear(r);
  if (!o)
    return cli_runtime_error(g, "unreadable JSON from the server: %s", je.text);
  if (as_json) {
    return cli_print_json(g, o);   /* compact, one line, as status and report print theirs */
  }
  json_t *list = json_object_get(o, "tenants"), *e;
  size_t i;
  int width = 6;   /* "tenant" */
  json_array_foreach(list, i, e) {
    int w = display_width(json_string_value(json_object_get(e, "tenant_id")));
    if (w > width)
      width = w;
  }
  print_name("tenant", width);
  printf("  %-11s  %9s  %9s\n", "weight", "pending", "leased");
  json_array_foreach(list, i, e) {
    char wbuf[32];
    snprintf(wbuf, sizeof wbuf, "%lld%s",
             (long long)json_integer_value(json_object_get(e, "weight")),
             json_is_true(json_object_get(e, "weight_set")) ? "" : " (default)");
    print_name(json_string_value(json_object_get(e, "tenant_id")), width);
    printf("  %-11s  %9lld  %9lld\n", wbuf,
           (long long)json_integer_value(json_object_get(e, "pending")),
           (long long)json_integer_value(json_object_get(e, "leased")));
  }
  json_decref(o);
  return EXIT_OK;
}

/* A value the server refused (class 22: bytes that are not valid in the database's
   encoding, say) is the user's input; anything else is a runtime failure. */
static int db_error(struct cli *g, const char *err)
{
  if (strncmp(db_last_sqlstate(), "22", 2) == 0) {
    /* The primary message only: the CONTEXT part names this file's "$1", not the user's T. */
    const char *m = strncmp(err, "ERROR:  ", 8) == 0 ? err + 8 : err;
    const char *ctx = strstr(m, " CONTEXT:");
    int n = ctx ? (int)(ctx - m) : (int)strlen(m);
    return cli_data_error(g, "%.*s; nothing was written", n, m);
  }
  return cli_runtime_error(g, "%s", err);
}

/* A tenant's name padded to width columns; control characters as \xNN, so a name cannot
   forge a line or move the cursor. */
static void print_name(const char *s, int width)
{
  if (!s)
    s = "";
  int w = display_width(s);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7f)
      printf("\\x%02x", *p);
    else
      putchar(*p);
  }
  printf("%*s", width > w ? width - w : 0, "");
}

/* Columns print_name uses: UTF-8 continuation bytes take none, an escaped byte four. */
static int display_width(const char *s)
{
  int w = 0;
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++)
    w += (*p & 0xc0) == 0x80 ? 0 : (*p < 0x20 || *p == 0x7f) ? 4 : 1;
  return w;
}
