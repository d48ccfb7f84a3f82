/* leash spend: prices per model, spend caps per tenant or batch, and what was spent
   (sql/014_budgets.sql: <table>_prices, _spend, _usage). */
#include "commands.h"
#include "lifecycle.h"
#include "migrate.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
  "usage: leash spend show [--json]\n"
  "       leash spend cap (--tenant T | --batch B) AMOUNT|none\n"
  "       leash spend price MODEL --input PRICE --output PRICE\n"
  "       leash spend price MODEL --delete\n\n"
  "Calls made with a budget record their usage; with a price for the answer's model it is\n"
  "spend, summed per tenant and per batch. A scope whose spend reaches its cap is paused\n"
  "(claims skip it; running tasks finish): `leash pause --list` and `leash status` say\n"
  "\"by spend\". Raising the cap, or none, lifts that pause at once.\n\n"
  "  show                  spend and caps per scope; tokens and cost per budget and model\n"
  "  cap AMOUNT            the cap of a tenant's or a batch's spend (a number >= 0, in the\n"
  "                        prices' currency), or none\n"
  "  price MODEL           prices per million input and output tokens (numbers >= 0); the\n"
  "                        model as the provider's answers name it (\"model\")\n\n"
  "options:\n"
  "  --tenant T            a tenant's cap\n"
  "  --batch B             a batch's cap\n"
  "  --input P             the price per million input tokens, for price\n"
  "  --output P            the price per million output tokens, for price\n"
  "  --delete              forget a model's price\n"
  "  --json                show as one JSON object\n\n";

enum { OPT_TENANT = OPT_COMMAND_BASE, OPT_BATCH, OPT_INPUT, OPT_OUTPUT, OPT_DELETE, OPT_JSON };

/* %s: <table>_spend_cap. */
static const char cap_fmt[] = "SELECT round(%s($1, $2, $3::numeric), 4)::text";

/* %s: the prices table (twice for delete is not needed). */
static const char price_fmt[] =
  "INSERT INTO %s AS p (model, input_per_mtok, output_per_mtok) "
  "VALUES ($1, $2::numeric, $3::numeric) "
  "ON CONFLICT (model) DO UPDATE SET input_per_mtok = EXCLUDED.input_per_mtok, "
  "  output_per_mtok = EXCLUDED.output_per_mtok, updated_at = now() RETURNING 1";
static const char unprice_fmt[] = "DELETE FROM %s WHERE model = $1 RETURNING 1";

/* %s: spend, usage, prices. Scopes by kind and name; usage by budget and model. */
static const char show_fmt[] =
  "SELECT json_build_object("
  "  'scopes', (SELECT coalesce(json_agg(json_build_object('kind', s.kind, 'scope', s.scope,"
  "               'spent', round(s.spent, 6), 'cap', s.cap,"
  "               'capped', s.cap IS NOT NULL AND s.spent >= s.cap)"
  "             ORDER BY s.kind, s.scope COLLATE \"C\"), '[]') FROM %s s),"
  "  'usage', (SELECT coalesce(json_agg(json_build_object('budget', u.budget, 'model', u.model,"
  "               'calls', u.calls, 'input_tokens', u.i, 'output_tokens', u.o,"
  "               'tokens', u.t, 'cost', round(u.c, 6))"
  "             ORDER BY u.budget COLLATE \"C\", u.model COLLATE \"C\"), '[]')"
  "             FROM (SELECT budget, model, count(*) AS calls, sum(input_tokens) AS i,"
  "                          sum(output_tokens) AS o, sum(tokens) AS t, sum(cost) AS c"
  "                     FROM %s GROUP BY budget, model) u),"
  "  'prices', (SELECT coalesce(json_agg(json_build_object('model', p.model,"
  "               'input_per_mtok', p.input_per_mtok, 'output_per_mtok', p.output_per_mtok)"
  "             ORDER BY p.model COLLATE \"C\"), '[]') FROM %s p))::text";

static int number_arg(struct cli *g, const char *what, const char *s);
static int show(struct cli *g, PGconn *c, const struct db_table *t, int as_json);
static int exec1(struct cli *g, PGconn *c, const struct db_table *t, const char *fmt,
                 const char *object, int n, const char *const *params, PGresult **out);

int cmd_spend(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "input", required_argument, NULL, OPT_INPUT },
    { "output", required_argument, NULL, OPT_OUTPUT },
    { "delete", no_argument, NULL, OPT_DELETE },
    { "json", no_argument, NULL, OPT_JSON },
    { NULL, 0, NULL, 0 },
  };
  const char *kind = NULL, *scope = NULL, *in = NULL, *out = NULL;
  int del = 0, as_json = 0, opt, rc, scopes = 0;
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_TENANT:
    case OPT_BATCH: {
      size_t len = strlen(optarg);
      size_t max = opt == OPT_TENANT ? LIFECYCLE_MAX_TENANT_BYTES : LIFECYCLE_MAX_BATCH_BYTES;
      kind = opt == OPT_TENANT ? "tenant" : "batch";
      if (len == 0 || len > max)
        return cli_usage_error(g, "--%s must be 1 to %zu bytes", kind, max);
      scope = optarg;
      scopes++;
      break;
    }
    case OPT_INPUT:
    case OPT_OUTPUT:
      if ((rc = number_arg(g, opt == OPT_INPUT ? "--input" : "--output", optarg)) != EXIT_OK)
        return rc;
      *(opt == OPT_INPUT ? &in : &out) = optarg;
      break;
    case OPT_DELETE: del = 1; break;
    case OPT_JSON: as_json = 1; break;
    }
  }
  if (optind >= argc)
    return cli_usage_error(g, "missing what to do: show, cap or price");
  const char *sub = argv[optind++];
  int args = argc - optind;
  int is_show = !strcmp(sub, "show"), is_cap = !strcmp(sub, "cap"), is_price = !strcmp(sub, "price");
  if (!is_show && !is_cap && !is_price)
    return cli_usage_error(g, "unknown action '%s' (show, cap or price)", sub);
  if ((is_show && args) || (!is_show && args != 1))
    return cli_usage_error(g, is_show ? "show takes no argument"
                                      : is_cap ? "cap takes one AMOUNT (or none)"
                                               : "price takes one MODEL");
  if (scopes && !is_cap)
    return cli_usage_error(g, "--tenant and --batch go with cap");
  if (is_cap && scopes != 1)
    return cli_usage_error(g, "cap: give one scope, --tenant T or --batch B");
  if ((in || out || del) && !is_price)
    return cli_usage_error(g, "--input, --output and --delete go with price");
  if (is_price && !del && (!in || !out))
    return cli_usage_error(g, "price: give both --input and --output (per million tokens)");
  if (is_price && del && (in || out))
    return cli_usage_error(g, "price --delete takes no prices");
  if (as_json && !is_show)
    return cli_usage_error(g, "--json goes with show");
  const char *arg = args ? argv[optind] : NULL;
  if (is_cap && strcmp(arg, "none") != 0 && (rc = number_arg(g, "the cap", arg)) != EXIT_OK)
    return rc;
  if (is_price && (strlen(arg) == 0 || strlen(arg) > 127))
    return cli_usage_error(g, "a MODEL is 1 to 127 bytes");

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "spend", &c, &t)) != EXIT_OK)
    return rc;
  char err[DB_ERR_MAX];
  PGresult *r = NULL;
  if (migrate_check(c, &t, err, sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
  } else if (is_show) {
    rc = show(g, c, &t, as_json);
  } else if (is_cap) {
    const char *params[] = { kind, scope, strcmp(arg, "none") ? arg : NULL };
    if ((rc = exec1(g, c, &t, cap_fmt, "spend_cap", 3, params, &r)) == EXIT_OK)
      printf("%s %s: cap %s, spent %s\n", kind, scope, params[2] ? params[2] : "none",
             PQgetvalue(r, 0, 0));
  } else {
    const char *params[] = { arg, in, out };
    if ((rc = exec1(g, c, &t, del ? unprice_fmt : price_fmt, "prices", del ? 1 : 3, params,
                    &r)) == EXIT_OK) {
      if (del && PQntuples(r) == 0)
        rc = cli_data_error(g, "no price for model '%s'", arg);
      else if (del)
        printf("model %s: price deleted\n", arg);
      else
        printf("model %s: %s input, %s output per million tokens\n", arg, in, out);
    }
  }
  PQclear(r);
  cli_close(c, &t);
  return rc;
}

/* A plain decimal >= 0 (what numeric takes, no exponent, no sign), below 1e12. */
static int number_arg(struct cli *g, const char *what, const char *s)
{
  size_t n = strspn(s, "0123456789."), dots = 0;
  for (size_t i = 0; i < n; i++)
    dots += s[i] == '.';
  if (n == 0 || s[n] != '\0' || dots > 1 || (n == 1 && dots) || strtod(s, NULL) >= 1e12)
    return cli_usage_error(g, "%s must be a number >= 0 (e.g. 0.15 or 20), not '%s'", what, s);
  return EXIT_OK;
}

static int exec1(struct cli *g, PGconn *c, const struct db_table *t, const char *fmt,
                 const char *object, int n, const char *const *params, PGresult **out)
{
  char err[DB_ERR_MAX];
  char *o = db_table_object(t, c, object, 1);
  size_t len = strlen(fmt) + (o ? strlen(o) : 0) + 1;
  char *sql = o ? malloc(len) : NULL;
  if (!sql) {
    free(o);
    return cli_runtime_error(g, "out of memory");
  }
  snprintf(sql, len, fmt, o);
  free(o);
  *out = db_exec(c, sql, n, params, err, sizeof err);
  free(sql);
  if (*out)
    return EXIT_OK;
  if (strncmp(db_last_sqlstate(), "22", 2) == 0 || strncmp(db_last_sqlstate(), "23", 2) == 0)
    return cli_data_error(g, "%s; nothing was written", err);
  return cli_runtime_error(g, "%s", err);
}

static int show(struct cli *g, PGconn *c, const struct db_table *t, int as_json)
{
  char err[DB_ERR_MAX];
  char *spend = db_table_object(t, c, "spend", 1), *use = db_table_object(t, c, "usage", 1),
       *prices = db_table_object(t, c, "prices", 1);
  size_t len = sizeof show_fmt + (spend ? strlen(spend) : 0) + (use ? strlen(use) : 0) +
               (prices ? strlen(prices) : 0);
  char *sql = spend && use && prices ? malloc(len) : NULL;
  if (sql)
    snprintf(sql, len, show_fmt, spend, use, prices);
  free(spend);
  free(use);
  free(prices);
  if (!sql)
    return cli_runtime_error(g, "out of memory");
  PGresult *r = db_exec(c, sql, 0, NULL, err, sizeof err);
  free(sql);
  if (!r)
    return cli_runtime_error(g, "%s", err);
  json_error_t je;
  json_t *o = json_loads(PQgetvalue(r, 0, 0), JSON_DECODE_INT_AS_REAL, &je);
  PQclear(r);
  if (!o)
    return cli_runtime_error(g, "unreadable JSON from the server: %s", je.text);
  if (as_json) {
    return cli_print_json(g, o);   /* compact, one line, as status and report print theirs */
  }
  json_t *e;
  size_t i;
  printf("%-7s %-30s %14s %14s\n", "scope", "name", "spent", "cap");
  json_array_foreach(json_object_get(o, "scopes"), i, e) {
    char cap[32] = "-";
    json_t *cv = json_object_get(e, "cap");
    if (json_is_number(cv))
      snprintf(cap, sizeof cap, "%.4f", json_number_value(cv));
    char line[700];
    snprintf(line, sizeof line, "%-7s %-30s %14.4f %14s%s",
             json_string_value(json_object_get(e, "kind")),
             json_string_value(json_object_get(e, "scope")),
             json_number_value(json_object_get(e, "spent")), cap,
             json_is_true(json_object_get(e, "capped")) ? "  (capped: paused)" : "");
    for (char *p = line; *p; p++)
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        *p = '?';
    printf("%s\n", line);
  }
  printf("\n%-24s %-24s %9s %14s %14s\n", "budget", "model", "calls", "tokens", "cost");
  json_array_foreach(json_object_get(o, "usage"), i, e) {
    const char *model = json_string_value(json_object_get(e, "model"));
    json_t *cost = json_object_get(e, "cost");
    char costs[32] = "-";
    if (json_is_number(cost))
      snprintf(costs, sizeof costs, "%.4f", json_number_value(cost));
    char line[700];
    snprintf(line, sizeof line, "%-24s %-24s %9.0f %14.0f %14s",
             json_string_value(json_object_get(e, "budget")), model ? model : "-",
             json_number_value(json_object_get(e, "calls")),
             json_number_value(json_object_get(e, "tokens")), costs);
    for (char *p = line; *p; p++)
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        *p = '?';
    printf("%s\n", line);
  }
  json_decref(o);
  return EXIT_OK;
}
