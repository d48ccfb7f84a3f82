/* cli: global options, error lines, opening the database. See cli.h. */
#include "cli.h"

#include "commands.h"
#include "log.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <lua.h>
#include <microhttpd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_error(const struct cli *g, const char *fmt, va_list ap);
static void print_version(void);

int cli_global_option(struct cli *g, int opt, const char *arg, int *done)
{
  *done = 0;
  switch (opt) {
  case OPT_DB:
    g->db = arg;
    return 1;
  case OPT_TABLE: {
    /* Refused here, before any connection: a hostile name must never reach SQL. */
    char err[DB_ERR_MAX];
    if (db_table_check_name(arg, err, sizeof err) != 0) {
      *done = 1;
      return cli_usage_error(g, "%s", err);
    }
    g->table = arg;
    return 1;
  }
  case OPT_LOG_FORMAT: {
    enum log_format f;
    if (log_parse_format(arg, &f) != 0) {
      *done = 1;
      return cli_usage_error(g, "--log-format must be text or json, not '%s'", arg);
    }
    log_set_format(f);
    return 1;
  }
  case OPT_LOG_LEVEL: {
    enum log_level l;
    if (log_parse_level(arg, &l) != 0) {
      *done = 1;
      return cli_usage_error(g, "--log-level must be debug, info, warn or error, not '%s'",
                             arg);
    }
    log_set_level(l);
    return 1;
  }
  case 'h':
    /* A command's usage text ends with a blank line; the global options follow it, since
       they are accepted after the command too. */
    fputs(g->usage, stdout);
    fputs(cli_global_help, stdout);
    *done = 1;
    return EXIT_OK;
  case OPT_VERSION:
    print_version();
    *done = 1;
    return EXIT_OK;
  default:
    return 0;
  }
}

int cli_next_option(struct cli *g, int argc, char **argv, const struct option *opts, int *rc)
{
  int opt, done;
  opterr = 0;   /* our own one-line errors, not getopt's */
  while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    *rc = cli_global_option(g, opt, optarg, &done);
    if (done)
      return CLI_STOP;
    if (*rc == 1)
      continue;
    if (opt == '?' || opt == ':') {
      *rc = cli_usage_error(g, "unknown or incomplete option '%s'", argv[optind - 1]);
      return CLI_STOP;
    }
    return opt;
  }
  return -1;
}

int cli_usage_error(const struct cli *g, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  print_error(g, fmt, ap);
  va_end(ap);
  fprintf(stderr, "Try 'leash %s%s--help'.\n", g->command ? g->command : "", g->command ? " " : "");
  return EXIT_USAGE;
}

int cli_data_error(const struct cli *g, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  print_error(g, fmt, ap);
  va_end(ap);
  return EXIT_USAGE;
}

int cli_runtime_error(const struct cli *g, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  print_error(g, fmt, ap);
  va_end(ap);
  return EXIT_RUNTIME;
}

int cli_open(const struct cli *g, const char *role, PGconn **conn, struct db_table *t)
{
  char err[DB_ERR_MAX];
  *conn = db_connect(db_conninfo(g->db), role, 0, err, sizeof err);
  if (!*conn)
    return cli_runtime_error(g, "%s", err);
  if (db_table_init(t, *conn, g->table ? g->table : CLI_DEFAULT_TABLE, err, sizeof err) != 0) {
    PQfinish(*conn);
    *conn = NULL;
    return cli_usage_error(g, "%s", err);
  }
  return EXIT_OK;
}

void cli_close(PGconn *conn, struct db_table *t)
{
  db_table_free(t);
  PQfinish(conn);
}

int cli_parse_int(const char *s, long min, long max, long *out)
{
  char *end;
  /* Digits with an optional minus, nothing else: strtol would also take " 7" and "+7". */
  if (!(*s >= '0' && *s <= '9') && !(*s == '-' && s[1] >= '0' && s[1] <= '9'))
    return -1;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < min || v > max)
    return -1;
  *out = v;
  return 0;
}

int cli_parse_duration(const char *s, double *out)
{
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !isfinite(v) || v < 0)
    return -1;
  double scale;
  if (*end == '\0' || strcmp(end, "s") == 0)
    scale = 1;
  else if (strcmp(end, "ms") == 0)
    scale = 0.001;
  else if (strcmp(end, "m") == 0)
    scale = 60;
  else if (strcmp(end, "h") == 0)
    scale = 3600;
  else if (strcmp(end, "d") == 0)
    scale = 86400;
  else
    return -1;
  /* strtod accepts "0x1p3" and "inf"; durations are plain decimals. */
  for (const char *p = s; p < end; p++)
    if (!((*p >= '0' && *p <= '9') || *p == '.'))
      return -1;
  /* 309 digits and a "d" are a finite number of days but too many seconds for a double */
  if (!isfinite(v * scale))
    return -1;
  /* Nothing leash waits for is longer than a century; the cap also keeps every duration
     printable in the fixed buffers that carry it to SQL. */
  if (v * scale > CLI_DURATION_MAX)
    return -1;
  *out = v * scale;
  return 0;
}

int cli_parse_size(const char *s, size_t min, size_t max, size_t *out)
{
  if (!(*s >= '0' && *s <= '9'))
    return -1;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno)
    return -1;
  unsigned long long scale;
  if (*end == '\0' || strcmp(end, "B") == 0)
    scale = 1;
  else if (strcmp(end, "k") == 0 || strcmp(end, "K") == 0 || strcmp(end, "kB") == 0 ||
           strcmp(end, "KB") == 0)
    scale = 1ull << 10;
  else if (strcmp(end, "M") == 0 || strcmp(end, "MB") == 0)
    scale = 1ull << 20;
  else if (strcmp(end, "G") == 0 || strcmp(end, "GB") == 0)
    scale = 1ull << 30;
  else
    return -1;
  if (v > max / scale || v * scale < min || v * scale > max)
    return -1;
  *out = (size_t)(v * scale);
  return 0;
}

static void print_error(const struct cli *g, const char *fmt, va_list ap)
{
  char msg[2048];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (g->command)
    fprintf(stderr, "leash %s: %s\n", g->command, msg);
  else
    fprintf(stderr, "leash: %s\n", msg);
}

const char cli_global_help[] =
  "global options:\n"
  "  --db CONNINFO         libpq URI or key=value string (default $DATABASE_URL, then PG*)\n"
  "  --table NAME          queue table, NAME or SCHEMA.NAME (default agent_work_queue; no\n"
  "                        control characters, '$', '/*' or '*/')\n"
  "  --log-format FORMAT   text or json (default text)\n"
  "  --log-level LEVEL     debug, info, warn or error (default info)\n"
  "  -h, --help            this help\n"
  "  --version             print the version\n";

/* The version, and the versions of the libraries actually linked (not the headers built
   against), so a bug report says what ran. */
static void print_version(void)
{
  int pq = PQlibVersion();
  const curl_version_info_data *curl = curl_version_info(CURLVERSION_NOW);
  printf("leash %s\n", LEASH_VERSION);
  printf("libpq %d.%d, %s, jansson %s, libcurl %s, libmicrohttpd %s\n", pq / 10000, pq % 100,
         LUA_RELEASE, jansson_version_str(), curl->version, MHD_get_version());
}
