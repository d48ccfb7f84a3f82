/*
 * cli: what every command shares: the global options (--db, --table, --log-format,
 * --log-level, -h/--help, --version), error lines (usage and data errors exit 2, only a
 * usage error adds the --help hint; runtime errors exit 1) and opening the database with the
 * queue table's name quoted. Each command parses its own options with getopt_long, listing
 * CLI_GLOBAL_OPTIONS in its table so global options work before or after it.
 *
 * The environment: every long option of a command's table (but --help and --version) is
 * also read from LEASH_<NAME> (--poll-ms: LEASH_POLL_MS). cli_next_option hands those
 * values to the command's own switch before argv's, as if they had been given first, so
 * validation is the same code; an option that argv uses at all leaves its variable unread
 * (for a repeatable option the variable is one value, replaced by the command line's). A
 * switch's variable takes 1/true/yes (on) or 0/false/no (off). A bad value's error line
 * names the variable and has no --help hint. No option takes an empty value: the command's
 * own check sees it first (its message wins), and cli_next_option refuses what it lets by.
 */
#ifndef LEASH_CLI_H
#define LEASH_CLI_H

#include "db.h"

#include <getopt.h>
#include <stdio.h>

enum {
  EXIT_OK = 0,
  EXIT_RUNTIME = 1,
  EXIT_USAGE = 2,
};

enum {
  OPT_DB = 1000,
  OPT_TABLE,
  OPT_LOG_FORMAT,
  OPT_LOG_LEVEL,
  OPT_VERSION,
  OPT_COMMAND_BASE = 1100,   /* commands number their own options from here */
};

#define CLI_GLOBAL_OPTIONS \
  { "db", required_argument, NULL, OPT_DB }, \
  { "table", required_argument, NULL, OPT_TABLE }, \
  { "log-format", required_argument, NULL, OPT_LOG_FORMAT }, \
  { "log-level", required_argument, NULL, OPT_LOG_LEVEL }, \
  { "help", no_argument, NULL, 'h' }, \
  { "version", no_argument, NULL, OPT_VERSION }

#define CLI_DEFAULT_TABLE "agent_work_queue"

/* Most options one table may have (the environment pass marks them in a bitmap). */
#define CLI_MAX_OPTIONS 128

struct cli {
  const char *db;      /* --db, or NULL */
  const char *table;   /* --table, default agent_work_queue */
  const char *command; /* for messages: "enqueue" */
  const char *usage;   /* the command's help text */
  /* The option parse's own state (zero-initialised; cli_next_option keeps it). */
  const struct option *opts;   /* the table being parsed, for --help's variables */
  const char *env_var;         /* while a value from the environment is handled: its name */
  int env_state;               /* 0 not started, 1 reading the environment, 2 argv */
  int env_next;                /* the next option of opts to look up */
  unsigned globals_given;      /* bit (OPT_x - OPT_DB): a global option given in argv */
  int empty_opt;               /* 1 + the index of an option just handed out with "" */
  unsigned char in_argv[CLI_MAX_OPTIONS];   /* options argv uses: their variables are unread */
  char env_name[80];
};

/* Handles a global option returned by getopt_long. Returns 1 when handled, 0 when opt is
   not a global option, or an exit code (>= 0 flagged by *done) after --help/--version or a
   bad value: then *done is set and the caller returns that code. */
int cli_global_option(struct cli *g, int opt, const char *arg, int *done);

/* A command's option loop: returns the next option of opts that is not a global one (the
   globals are handled here), -1 after the last option (optind is then the first argument),
   or CLI_STOP when the command must return *rc at once: after --help or --version (EXIT_OK),
   a bad global value or an unknown or incomplete option (the error is printed). */
#define CLI_STOP (-2)
int cli_next_option(struct cli *g, int argc, char **argv, const struct option *opts, int *rc);

/* LEASH_<NAME> of a long option's name into buf ("poll-ms": "LEASH_POLL_MS"); buf. */
char *cli_env_name(const char *option, char *buf, size_t len);

/* The "environment:" part of --help: every long option of opts (but --help, --version) and
   its variable, one a line; switches are marked. */
void cli_print_env_help(FILE *f, const struct option *opts);

/* Reads a switch's variable: 1 on (1, true, yes), 0 off (0, false, no; any case), -1 neither. */
int cli_parse_bool(const char *s);

/* Prints "leash CMD: MSG" and a hint to stderr; returns EXIT_USAGE. While a value from the
   environment is being handled the line is "leash CMD: LEASH_X: MSG", without the hint. */
int cli_usage_error(const struct cli *g, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));

/* Bad input data (a JSONL line, a payload, a file that cannot be opened): prints the one
   line "leash CMD: MSG", no hint (--help would not fix the data); returns EXIT_USAGE. */
int cli_data_error(const struct cli *g, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));

/* Prints "leash CMD: MSG" to stderr; returns EXIT_RUNTIME. */
int cli_runtime_error(const struct cli *g, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));

/* Prints o as one compact line of JSON (keys in order; reals to 12 digits), as every --json
   of a listing does, and releases o. EXIT_OK, or a runtime error when out of memory. */
struct json_t;
int cli_print_json(const struct cli *g, struct json_t *o);

/* Connects (role names the connection) and quotes the table. 0, or an exit code after
   printing the error. On success the caller closes with cli_close. */
int cli_open(const struct cli *g, const char *role, PGconn **conn, struct db_table *t);
void cli_close(PGconn *conn, struct db_table *t);

/* Strict number parsing for option values; 0 or -1. */
int cli_parse_int(const char *s, long min, long max, long *out);
#define CLI_DURATION_MAX 3153600000.0   /* 100 years, in seconds */

/* A duration in seconds: "30", "1.5", "500ms", "30s", "5m", "2h", "7d", at most 100 years. */
int cli_parse_duration(const char *s, double *out);

/* A size in bytes: "4096", "512k", "4M", "1G" (also kB/KB, MB, GB, B; powers of 1024), at
   least min and at most max bytes. 0 or -1. */
int cli_parse_size(const char *s, size_t min, size_t max, size_t *out);

/* A size whose plain number counts units of `plain` bytes (--lua-memory: 256 is 256 MB, as
   before units were taken), or with a unit as cli_parse_size; within min..max bytes. */
int cli_parse_size_in(const char *s, size_t plain, size_t min, size_t max, size_t *out);

/* "MIN-MAX" of two durations ("10ms-1s", "200ms-500ms"), or one duration D for D-D; each
   within min..max seconds and MIN <= MAX. 0 or -1. */
int cli_parse_duration_range(const char *s, double min, double max, double *lo, double *hi);

/* HOST:PORT to listen on: HOST a name, an IPv4 address, [an IPv6 address], or empty (every
   interface); PORT digits, 1 to 65535 (0, the kernel's choice, is refused: nothing would
   say which port a scraper should ask). 0, or -1 with the reason in err. */
int cli_check_listen_addr(const char *s, char *err, size_t errlen);

#endif
