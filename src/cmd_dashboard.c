/* leash dashboard: the web dashboard (dashboard.h) until SIGINT or SIGTERM. */
#include "commands.h"
#include "dashboard.h"
#include "log.h"
#include "migrate.h"
#include "textfile.h"

#include <openssl/crypto.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_LISTEN "127.0.0.1:8089"
#define TOKEN_MIN 16
#define TOKEN_MAX 4096

static const char usage[] =
  "usage: leash dashboard [--listen HOST:PORT] [--token-file FILE]\n\n"
  "Serves a web dashboard of the queue table, read from the database on every request:\n"
  "batches with progress (done, dead, leased, pending), settles per minute over the last\n"
  "hour, durations, the batch against the previous one, dead reasons with example tasks\n"
  "and each task's page with its attempt history, workers and the tasks they run, holds,\n"
  "budgets and canaries; the same as JSON under /api/. Actions (requeue,\n"
  "cancel, pause, resume) need the token, always: without --token-file they are off.\n"
  "Runs until SIGINT or SIGTERM.\n\n"
  "options:\n"
  "  --listen HOST:PORT    where to serve (default " DEFAULT_LISTEN "); an address that is not\n"
  "                        loopback needs --token-file\n"
  "  --token-file FILE     the action token: the file's first line, at least 16 bytes; give\n"
  "                        it as 'Authorization: Bearer TOKEN' or the page's token field\n\n";

enum { OPT_LISTEN = OPT_COMMAND_BASE, OPT_TOKEN_FILE };

/* The token: the file's first line without its line end; NULL with err. */
static char *read_token(const char *path, char *err, size_t errlen)
{
  size_t len;
  char *s = textfile_read(path, &len, err, errlen);
  if (!s)
    return NULL;
  size_t n = strcspn(s, "\r\n");
  if (n < len && s[n] == '\0')
    n = len;   /* a NUL before any line end: refused below */
  const char *why = NULL;
  if (memchr(s, '\0', n < len ? n : len))
    why = "holds a NUL byte";
  else if (n < TOKEN_MIN)
    why = "holds a token shorter than 16 bytes (its first line)";
  else if (n > TOKEN_MAX)
    why = "holds a token longer than 4096 bytes";
  if (why) {
    snprintf(err, errlen, "--token-file %s %s", path, why);
    OPENSSL_cleanse(s, len);
    free(s);
    return NULL;
  }
  s[n] = '\0';
  return s;
}

int cmd_dashboard(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "listen", required_argument, NULL, OPT_LISTEN },
    { "token-file", required_argument, NULL, OPT_TOKEN_FILE },
    { NULL, 0, NULL, 0 },
  };
  const char *listen = DEFAULT_LISTEN, *token_file = NULL;
  int opt, rc;
  char err[DB_ERR_MAX];
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_LISTEN:
      if (cli_check_listen_addr(optarg, err, sizeof err) != 0)
        return cli_usage_error(g, "--listen: %s", err);
      listen = optarg;
      break;
    case OPT_TOKEN_FILE:
      if (!*optarg)
        return cli_usage_error(g, "--token-file must not be empty");
      token_file = optarg;
      break;
    }
  }
  if (optind < argc)
    return cli_usage_error(g, "unexpected argument '%s'", argv[optind]);
  int loop = dashboard_addr_is_loopback(listen, err, sizeof err);
  if (loop < 0)
    return cli_usage_error(g, "%s", err);
  if (!loop && !token_file)
    return cli_data_error(g, "--listen %s is not a loopback address: give --token-file "
                             "(anyone who can reach it would see the queue)", listen);
  char *token = NULL;
  if (token_file && !(token = read_token(token_file, err, sizeof err)))
    return cli_data_error(g, "%s", err);

  PGconn *c;
  struct db_table t;
  if ((rc = cli_open(g, "dashboard", &c, &t)) != EXIT_OK)
    goto out_token;
  struct dashboard *d = NULL;
  if (migrate_check(c, &t, err, sizeof err) != 0) {
    rc = cli_runtime_error(g, "%s", err);
    goto out;
  }
  /* Blocked before MHD's thread starts (it inherits the mask): only sigwait takes them. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  if (!(d = dashboard_start(listen, token, c, &t, err, sizeof err))) {
    rc = cli_runtime_error(g, "%s", err);
    goto out;
  }
  log_info("dashboard: serving http://%s/ (actions %s)", listen,
           token ? "need the token" : "off: no --token-file");
  int sig = 0;
  sigwait(&set, &sig);
  log_info("dashboard: stopping (signal %d)", sig);
  dashboard_stop(d);
  rc = EXIT_OK;
out:
  cli_close(c, &t);
out_token:
  if (token) {
    OPENSSL_cleanse(token, strlen(token));
    free(token);
  }
  return rc;
}

struct dashboard_side {
  PGconn *c;
  struct db_table t;
  struct dashboard *d;
};

struct dashboard_side *dashboard_side_start(const char *addr, const char *conninfo,
                                            const char *table, char *err, size_t errlen)
{
  char why[DB_ERR_MAX];
  int loop = dashboard_addr_is_loopback(addr, why, sizeof why);
  if (loop < 0) {
    snprintf(err, errlen, "--dashboard: %s", why);
    return NULL;
  }
  if (!loop) {
    snprintf(err, errlen, "--dashboard %s is not a loopback address: the worker's dashboard "
                          "has no token (use leash dashboard --token-file for that)", addr);
    return NULL;
  }
  struct dashboard_side *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "--dashboard: out of memory");
    return NULL;
  }
  if (!(s->c = db_connect(conninfo, "dashboard", 0, why, sizeof why)) ||
      db_table_init(&s->t, s->c, table, why, sizeof why) != 0) {
    snprintf(err, errlen, "--dashboard: %s", why);
    PQfinish(s->c);
    free(s);
    return NULL;
  }
  /* Every signal blocked while MHD's thread starts (it inherits the mask), then the mask
     as it was: the worker's own signal thread takes them. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  s->d = dashboard_start(addr, NULL, s->c, &s->t, why, sizeof why);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (!s->d) {
    snprintf(err, errlen, "--dashboard: %s", why);
    dashboard_side_stop(s);
    return NULL;
  }
  log_info("dashboard: serving http://%s/ (read-only)", addr);
  return s;
}

void dashboard_side_stop(struct dashboard_side *s)
{
  if (!s)
    return;
  dashboard_stop(s->d);
  db_table_free(&s->t);
  PQfinish(s->c);
  free(s);
}
