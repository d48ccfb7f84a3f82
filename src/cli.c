/* cli: global options, error lines, opening the database. See cli.h. */
#include "cli.h"

#include "commands.h"
#include "log.h"

#include <arpa/inet.h>
#include <ctype.h>
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
#include <strings.h>

static void print_error(const struct cli *g, int escape, const char *fmt, va_list ap);
static void print_version(void);
static unsigned global_bit(int opt);
static int scan_argv(struct cli *g, int argc, char **argv, const struct option *opts);
static int next_from_env(struct cli *g, const struct option *opts, int *rc);
static int next_from_argv(struct cli *g, int argc, char **argv, const struct option *opts,
                          int *rc);

int cli_global_option(struct cli *g, int opt, const char *arg, int *done)
{
  *done = 0;
  /* Given in argv (main's part or the command's): the variable must not override it. */
  if (global_bit(opt) && !g->env_var)
    g->globals_given |= global_bit(opt);
  switch (opt) {
  case OPT_DB:
    /* "" would quietly mean $DATABASE_URL or libpq's defaults: not what was written. */
    if (*arg == '\0') {
      *done = 1;
      return cli_usage_error(g, "--db must not be empty");
    }
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
    if (g->opts) {
      fputs("\n", stdout);
      cli_print_env_help(stdout, g->opts);
    }
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
  int opt;
  /* An empty value the command's own check let through: no option has a use for "" (an
     empty tenant or batch is a scope nothing matches, an empty worker a name nobody can
     read). Refused here so the command's message, when it has one, comes first. */
  if (g->empty_opt) {
    *rc = cli_usage_error(g, "--%s must not be empty", opts[g->empty_opt - 1].name);
    return CLI_STOP;
  }
  g->env_var = NULL;   /* the value handed out last time has been handled */
  if (g->env_state == 0) {
    g->opts = opts;
    /* --help and --version work whatever the environment holds. */
    g->env_state = scan_argv(g, argc, argv, opts) ? 2 : 1;
  }
  if (g->env_state == 1) {
    if ((opt = next_from_env(g, opts, rc)) != -1)
      return opt;
    g->env_state = 2;
  }
  return next_from_argv(g, argc, argv, opts, rc);
}

/* Marks in g->in_argv the options argv uses (a dry run of getopt_long, which also resolves
   abbreviations like --conc); 1 when argv asks for --help or --version. optind is left for
   a full restart. */
static int scan_argv(struct cli *g, int argc, char **argv, const struct option *opts)
{
  int n = 0, opt, idx, help = 0;
  while (opts[n].name)
    n++;
  if (n > CLI_MAX_OPTIONS) {
    /* A programming error, found by the first test that runs the command. */
    fprintf(stderr, "leash: an option table has more than %d options\n", CLI_MAX_OPTIONS);
    abort();
  }
  memset(g->in_argv, 0, sizeof g->in_argv);
  opterr = 0;
  optind = 0;
  for (idx = -1; (opt = getopt_long(argc, argv, "h", opts, &idx)) != -1; idx = -1) {
    if (opt == 'h' || opt == OPT_VERSION)
      help = 1;
    else if (opt != '?' && opt != ':' && idx >= 0)
      g->in_argv[idx] = 1;
  }
  optind = 0;   /* glibc: full re-initialisation for the real parse */
  return help;
}

/* The next option whose variable is set, handed to the caller like one from argv (optarg
   is the variable's value; NULL for a switch); globals are handled here. -1 after the
   last, CLI_STOP after a bad value. g->env_var names the variable until the next call. */
static int next_from_env(struct cli *g, const struct option *opts, int *rc)
{
  for (; opts[g->env_next].name; g->env_next++) {
    const struct option *o = &opts[g->env_next];
    if (o->val == 'h' || o->val == OPT_VERSION || g->in_argv[g->env_next] ||
        (global_bit(o->val) & g->globals_given))
      continue;
    const char *v = getenv(cli_env_name(o->name, g->env_name, sizeof g->env_name));
    if (!v)
      continue;
    g->env_var = g->env_name;
    if (o->has_arg == no_argument) {
      int on = cli_parse_bool(v);
      if (on < 0) {
        *rc = cli_usage_error(g, "--%s is a switch: 1, true, yes, 0, false or no, not '%s'",
                              o->name, v);
        return CLI_STOP;
      }
      if (!on) {
        g->env_var = NULL;
        continue;
      }
      optarg = NULL;
    } else {
      optarg = (char *)v;
    }
    int done;
    *rc = cli_global_option(g, o->val, optarg, &done);
    if (done)
      return CLI_STOP;
    if (*rc == 1) {
      g->env_var = NULL;
      continue;
    }
    if (optarg && *optarg == '\0')
      g->empty_opt = g->env_next + 1;
    g->env_next++;   /* the caller handles this one; the next call goes on after it */
    return o->val;
  }
  g->env_var = NULL;
  return -1;
}

static int next_from_argv(struct cli *g, int argc, char **argv, const struct option *opts,
                          int *rc)
{
  int opt, idx, done;
  opterr = 0;   /* our own one-line errors, not getopt's */
  for (idx = -1; (opt = getopt_long(argc, argv, "h", opts, &idx)) != -1; idx = -1) {
    if (opt == '?' || opt == ':') {
      *rc = cli_usage_error(g, "unknown or incomplete option '%s'", argv[optind - 1]);
      return CLI_STOP;
    }
    *rc = cli_global_option(g, opt, optarg, &done);
    if (done)
      return CLI_STOP;
    if (*rc == 1)
      continue;
    if (idx >= 0 && optarg && *optarg == '\0')
      g->empty_opt = idx + 1;   /* refused at the next call, after the command's check */
    return opt;
  }
  return -1;
}

char *cli_env_name(const char *option, char *buf, size_t len)
{
  size_t n = (size_t)snprintf(buf, len, "LEASH_");
  for (const char *p = option; *p && n + 1 < len; p++)
    buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
  buf[n < len ? n : len - 1] = '\0';
  return buf;
}

void cli_print_env_help(FILE *f, const struct option *opts)
{
  fputs("environment: each option is also read from LEASH_ and its name in capitals, '-' as\n"
        "'_' (--lua-memory: LEASH_LUA_MEMORY), by every command that has the option. One\n"
        "given on the command line leaves its variable unread; a repeatable option's\n"
        "variable is one value, replaced by any use of the option. A switch's variable is\n"
        "1, true or yes (on), 0, false or no (off). Empty values are refused. Arguments\n"
        "that are not options have no variable.\n", f);
  for (const struct option *o = opts; o->name; o++) {
    if (o->val == 'h' || o->val == OPT_VERSION)
      continue;
    char name[80];
    /* At least one space: a long name (LEASH_MAX_FATAL_RATE_DELTA) must not run into it. */
    fprintf(f, "  %-25s --%s%s\n", cli_env_name(o->name, name, sizeof name), o->name,
            o->has_arg == no_argument ? " (switch)" : "");
  }
}

int cli_parse_bool(const char *s)
{
  static const char *const on[] = { "1", "true", "yes" }, *const off[] = { "0", "false", "no" };
  for (size_t i = 0; i < 3; i++) {
    if (strcasecmp(s, on[i]) == 0)
      return 1;
    if (strcasecmp(s, off[i]) == 0)
      return 0;
  }
  return -1;
}

/* The globals that take a value and may come from the environment. */
static unsigned global_bit(int opt)
{
  return opt >= OPT_DB && opt <= OPT_LOG_LEVEL ? 1u << (opt - OPT_DB) : 0;
}

int cli_usage_error(const struct cli *g, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  print_error(g, 1, fmt, ap);
  va_end(ap);
  /* A variable's value is not on the command line: --help would not show the mistake, and
     the line already names the variable to fix. */
  if (!g->env_var)
    fprintf(stderr, "Try 'leash %s%s--help'.\n", g->command ? g->command : "",
            g->command ? " " : "");
  return EXIT_USAGE;
}

int cli_data_error(const struct cli *g, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  print_error(g, 0, fmt, ap);
  va_end(ap);
  return EXIT_USAGE;
}

int cli_runtime_error(const struct cli *g, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  print_error(g, 0, fmt, ap);
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

int cli_parse_size_in(const char *s, size_t plain, size_t min, size_t max, size_t *out)
{
  const char *p = s;
  while (*p >= '0' && *p <= '9')
    p++;
  if (p == s || *p != '\0')
    return cli_parse_size(s, min, max, out);
  size_t v;
  /* Plain digits: units of `plain`; the bounds are in bytes either way. */
  if (cli_parse_size(s, 0, max / plain, &v) != 0 || v * plain < min)
    return -1;
  *out = v * plain;
  return 0;
}

int cli_parse_duration_range(const char *s, double min, double max, double *lo, double *hi)
{
  /* A duration has no '-' (negative ones are refused), so the first one splits. */
  char first[64];
  const char *dash = strchr(s, '-');
  size_t n = dash ? (size_t)(dash - s) : strlen(s);
  if (n == 0 || n >= sizeof first)
    return -1;
  memcpy(first, s, n);
  first[n] = '\0';
  double a, b;
  if (cli_parse_duration(first, &a) != 0)
    return -1;
  b = a;
  if (dash && cli_parse_duration(dash + 1, &b) != 0)
    return -1;
  if (a < min || b > max || a > b)
    return -1;
  *lo = a;
  *hi = b;
  return 0;
}

int cli_check_listen_addr(const char *s, char *err, size_t errlen)
{
  const char *colon = strrchr(s, ':');
  if (!colon) {
    snprintf(err, errlen, "'%s' is not HOST:PORT (e.g. 127.0.0.1:9100, [::1]:9100, :9100)", s);
    return -1;
  }
  /* The port: digits only (getaddrinfo would also take "http", and 99999 wraps around to
     a port nobody asked for). */
  const char *port = colon + 1;
  size_t pl = strlen(port);
  long v = 0;
  if (pl == 0 || pl > 5 || strspn(port, "0123456789") != pl || (v = strtol(port, NULL, 10)) < 1 ||
      v > 65535) {
    snprintf(err, errlen, "the port of '%s' must be a number from 1 to 65535", s);
    return -1;
  }
  size_t hl = (size_t)(colon - s);
  char host[256];
  if (hl >= sizeof host) {
    snprintf(err, errlen, "the host of '%.40s...' is too long", s);
    return -1;
  }
  memcpy(host, s, hl);
  host[hl] = '\0';
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
    struct in6_addr a6;
    host[hl - 1] = '\0';
    if (inet_pton(AF_INET6, host + 1, &a6) != 1) {
      snprintf(err, errlen, "'%s' is not an IPv6 address", host + 1);
      return -1;
    }
    return 0;
  }
  /* Empty: every interface. Otherwise a name or an IPv4 address; an IPv6 one needs its
     brackets, or its last ':' would be read as the port's. */
  if (strspn(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != hl ||
      host[0] == '-' || host[0] == '.') {
    snprintf(err, errlen, "the host of '%s' must be a name, an IPv4 address, [an IPv6 address] "
             "or empty (every interface)", s);
    return -1;
  }
  /* Digits and dots only must be a whole IPv4 address: 127.1 or 1.2.3.999 is a typo. */
  struct in_addr a4;
  if (hl > 0 && strspn(host, "0123456789.") == hl && inet_pton(AF_INET, host, &a4) != 1) {
    snprintf(err, errlen, "'%s' is not an IPv4 address", host);
    return -1;
  }
  return 0;
}

static void print_error(const struct cli *g, int escape, const char *fmt, va_list ap)
{
  char msg[2048], shown[sizeof msg * 4];
  vsnprintf(msg, sizeof msg, fmt, ap);
  /* A usage error echoes what was typed or set; a newline in it must not make two lines. */
  if (escape) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
      if (*p < 0x20 || *p == 0x7f)
        n += (size_t)snprintf(shown + n, sizeof shown - n, "\\x%02x", *p);
      else
        shown[n++] = (char)*p;
    shown[n] = '\0';
    memcpy(msg, shown, n < sizeof msg ? n + 1 : sizeof msg);
    msg[sizeof msg - 1] = '\0';
  }
  fprintf(stderr, "leash%s%s: %s%s%s\n", g->command ? " " : "", g->command ? g->command : "",
          g->env_var ? g->env_var : "", g->env_var ? ": " : "", msg);
}

const char cli_global_help[] =
  "global options:\n"
  "  --db CONNINFO         libpq URI or key=value string (default $LEASH_DB, then\n"
  "                        $DATABASE_URL, then libpq's PG* variables)\n"
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

int cli_print_json(const struct cli *g, json_t *o)
{
  char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(12));
  json_decref(o);
  if (!s)
    return cli_runtime_error(g, "out of memory");
  printf("%s\n", s);
  free(s);
  return EXIT_OK;
}
