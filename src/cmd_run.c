/* leash run / leash check: options, then the host (host.c) or a load test of the script. */
#include "buf.h"
#include "commands.h"
#include "dashboard.h"
#include "host.h"
#include "lifecycle.h"
#include "log.h"
#include "queue.h"
#include "record.h"
#include "script.h"
#include "secrets.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char run_usage[] =
  "usage: leash run SCRIPT.lua [OPTIONS]\n\n"
  "Claims tasks from the queue table and runs handle(task) from SCRIPT.lua on each, in N\n"
  "slots (threads), renewing leases while tasks run. SIGTERM/SIGINT drain; SIGHUP or a\n"
  "change of a .lua file in the script's folder reloads the script between tasks.\n\n"
  "options:\n"
  "  --concurrency N       slots in this process (default 10)\n"
  "  --visibility S        lease length (default 600)\n"
  "  --heartbeat S         lease renewal interval (default visibility/3)\n"
  "  --tenant T            claim only tenant T (repeatable)\n"
  "  --batch B             claim only batch B\n"
  "  --worker-id ID        lease owner name (default $POD_NAME, else hostname:pid)\n"
  "  --poll MIN-MAX        idle polling interval, jittered between two durations\n"
  "                        (default 200ms-500ms; one duration D is D-D; 1ms to 60s)\n"
  "  --poll-ms MIN-MAX     deprecated: --poll in plain milliseconds (200-500)\n"
  "  --task-timeout S      stop a task after S (default: none; the lease is renewed)\n"
  "  --drain-timeout S     on SIGTERM, wait S for running tasks (default 30); then they are\n"
  "                        stopped and their leases given back\n"
  "  --watchdog-grace S    how long a slot may stay past its deadline before the worker\n"
  "                        counts it wedged in C code and restarts (default 10; see below)\n"
  "  --until-empty         exit 0 once the scope has no pending or leased task\n"
  "  --claim-batch N       most rows one claim asks for (default 100)\n"
  "  --db-pool N           connections shared by leash.db.query (default 2)\n"
  "  --settle-connection   the default: with 2+ slots, outcomes are written on a second\n"
  "                        connection while the claim runs on the first\n"
  "  --no-settle-connection  outcomes on the claim connection only (one connection less)\n"
  "  --lua-memory SIZE     memory cap per slot's Lua state (default 256MB, 0 = none; a\n"
  "                        plain number is MB, or give a unit: 512MB, 1GB; at least 1MB)\n"
  "  --max-result-bytes SIZE  most JSON one encoding may make: a leash.ok result,\n"
  "                        json.encode, a step result, a child payload (default 16MB;\n"
  "                        a plain number is bytes, or KB, MB, GB; never above\n"
  "                        --lua-memory; a larger result is a retry)\n"
  "  --lua-path DIR        another folder for require (repeatable; watched for hot swap)\n"
  "  --metrics HOST:PORT   serve /metrics (Prometheus), /livez, /healthz and /readyz;\n"
  "                        HOST a name, an IPv4 address, [IPv6] or empty for every\n"
  "                        interface, PORT 1-65535\n"
  "  --dashboard HOST:PORT  serve leash dashboard's pages from this process, read-only\n"
  "                        (no actions), on a loopback address only\n"
  "  --budget-wait S       the longest a slot waits for a budget grant (paused or full)\n"
  "                        before the task gives its slot back and runs again after the\n"
  "                        wait, spending no attempt (default 30s; 0 = never wait)\n"
  "  --env-allow NAME[,NAME...]  let scripts read these environment variables with\n"
  "                        leash.env (repeatable); their values (8 bytes and longer) are\n"
  "                        redacted from logs and task errors\n"
  "  --record none|dead|all  keep what an execution did (HTTP exchanges, leash.db.query\n"
  "                        statements and rows, steps, child tasks, the outcome) in\n"
  "                        <table>_recordings: dead (default) the last execution of a task\n"
  "                        that went dead, all every settled one; `leash fixture ID` makes\n"
  "                        a busted spec of it\n"
  "  --record-max SIZE     most bytes one recording keeps (default 1MB; a plain number is\n"
  "                        bytes; past it the recording stops adding and is truncated)\n"
  "  --record-redact REGEX  replace what matches this POSIX extended regex with [redacted]\n"
  "                        in recordings (repeatable; credential headers and --env-allow\n"
  "                        values are always redacted)\n"
  "  --backoff-base B      a retry without a delay waits least(cap, B ^ attempts) s, then\n"
  "                        jitter (default 2; 1 to 1000; a task's own backoff_base beats it)\n"
  "  --backoff-cap S       the longest backoff (default 1h; 0 to 1d; a task's backoff_cap\n"
  "                        beats it)\n"
  "  --backoff-jitter F    the backoff d becomes d x (1 - F x random): 0.5 (default) waits\n"
  "                        d/2 to d, 1 waits 0 to d, 0 exactly d\n"
  "  --llm-batch-url PROVIDER=URL  base URL of openai or anthropic for leash.llm.batch\n"
  "                        (repeatable; default https://api.openai.com and\n"
  "                        https://api.anthropic.com; keys from OPENAI_API_KEY and\n"
  "                        ANTHROPIC_API_KEY)\n"
  "  --llm-batch-max N     most items in one provider batch (default 1000; 1 to 50000)\n"
  "  --llm-batch-age S     send a smaller batch once its oldest item waited S (default 60s)\n"
  "  --llm-batch-poll S    between two polls of one open provider batch (default 30s)\n"
  "  --llm-batch-off       this process never becomes the fleet's batcher\n"
  "Durations are seconds, or take a unit: 500ms, 30s, 5m, 2h. Sizes take KB, MB, GB\n"
  "(powers of 1024).\n\n"
  "Wedged slots: code stuck inside one C call cannot be stopped. A slot still in handle()\n"
  "--watchdog-grace after --task-timeout (only with one), or after its lease was lost, or\n"
  "min(grace, 2 s) after the drain's stop, makes the worker settle that task as a retry\n"
  "(cause wedged), give every other lease back, and exit with status 3 (the supervisor\n"
  "restarts it). So SIGTERM always ends the process within --drain-timeout + 2 s or so.\n"
  "A version whose setup does not return within 5 s + grace is refused (at start: exit 1).\n"
  "Two SIGTERMs within 1 s count as one; a later second one stops at once (exit 1).\n\n"
  "exit status: 0 drained or --until-empty done; 1 start failure or second signal;\n"
  "2 usage error; 3 a slot was wedged (watchdog)\n\n";

static const char check_usage[] =
  "usage: leash check [--lua-path DIR]... [--env-allow NAME[,NAME...]] SCRIPT.lua\n\n"
  "Loads SCRIPT.lua as `leash run` would (sandbox, setup, contract) and reports the first\n"
  "error; exit 0 when the script is fit to run.\n\n"
  "options:\n"
  "  --lua-path DIR        another folder for require (repeatable)\n"
  "  --env-allow NAME[,NAME...]  environment variables a setup may read with leash.env\n\n";

enum {
  OPT_CONCURRENCY = OPT_COMMAND_BASE, OPT_VISIBILITY, OPT_HEARTBEAT, OPT_TENANT, OPT_BATCH,
  OPT_WORKER_ID, OPT_POLL_MS, OPT_TASK_TIMEOUT, OPT_DRAIN_TIMEOUT, OPT_UNTIL_EMPTY,
  OPT_CLAIM_BATCH, OPT_DB_POOL, OPT_DASHBOARD, OPT_LUA_MEMORY, OPT_LUA_PATH, OPT_METRICS, OPT_WATCHDOG_GRACE,
  OPT_MAX_RESULT_BYTES, OPT_BUDGET_WAIT, OPT_ENV_ALLOW, OPT_POLL, OPT_BACKOFF_BASE,
  OPT_BACKOFF_CAP, OPT_BACKOFF_JITTER, OPT_RECORD, OPT_RECORD_MAX, OPT_RECORD_REDACT,
  OPT_LLM_BATCH_URL, OPT_LLM_BATCH_MAX, OPT_LLM_BATCH_AGE, OPT_LLM_BATCH_POLL, OPT_LLM_BATCH_OFF, OPT_SETTLE_CONNECTION,
  OPT_NO_SETTLE_CONNECTION,
};

#define DEFAULT_MAX_RESULT_BYTES (16u * 1024 * 1024)

#define MAX_TENANTS 64

static int parse_duration_opt(struct cli *g, const char *name, const char *arg, double *out,
                              int positive);
static int allow_env(struct cli *g, const char *list);
static void warn_env(void);
static int parse_number(const char *arg, double min, double max, double *out);

int cmd_run(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "concurrency", required_argument, NULL, OPT_CONCURRENCY },
    { "visibility", required_argument, NULL, OPT_VISIBILITY },
    { "heartbeat", required_argument, NULL, OPT_HEARTBEAT },
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "worker-id", required_argument, NULL, OPT_WORKER_ID },
    { "poll", required_argument, NULL, OPT_POLL },
    { "poll-ms", required_argument, NULL, OPT_POLL_MS },
    { "task-timeout", required_argument, NULL, OPT_TASK_TIMEOUT },
    { "drain-timeout", required_argument, NULL, OPT_DRAIN_TIMEOUT },
    { "watchdog-grace", required_argument, NULL, OPT_WATCHDOG_GRACE },
    { "until-empty", no_argument, NULL, OPT_UNTIL_EMPTY },
    { "claim-batch", required_argument, NULL, OPT_CLAIM_BATCH },
    { "db-pool", required_argument, NULL, OPT_DB_POOL },
    { "lua-memory", required_argument, NULL, OPT_LUA_MEMORY },
    { "lua-path", required_argument, NULL, OPT_LUA_PATH },
    { "metrics", required_argument, NULL, OPT_METRICS },
    { "dashboard", required_argument, NULL, OPT_DASHBOARD },
    { "max-result-bytes", required_argument, NULL, OPT_MAX_RESULT_BYTES },
    { "budget-wait", required_argument, NULL, OPT_BUDGET_WAIT },
    { "env-allow", required_argument, NULL, OPT_ENV_ALLOW },
    { "backoff-base", required_argument, NULL, OPT_BACKOFF_BASE },
    { "backoff-cap", required_argument, NULL, OPT_BACKOFF_CAP },
    { "backoff-jitter", required_argument, NULL, OPT_BACKOFF_JITTER },
    { "record", required_argument, NULL, OPT_RECORD },
    { "record-max", required_argument, NULL, OPT_RECORD_MAX },
    { "record-redact", required_argument, NULL, OPT_RECORD_REDACT },
    { "llm-batch-url", required_argument, NULL, OPT_LLM_BATCH_URL },
    { "llm-batch-max", required_argument, NULL, OPT_LLM_BATCH_MAX },
    { "llm-batch-age", required_argument, NULL, OPT_LLM_BATCH_AGE },
    { "llm-batch-poll", required_argument, NULL, OPT_LLM_BATCH_POLL },
    { "llm-batch-off", no_argument, NULL, OPT_LLM_BATCH_OFF },
    { "settle-connection", no_argument, NULL, OPT_SETTLE_CONNECTION },
    { "no-settle-connection", no_argument, NULL, OPT_NO_SETTLE_CONNECTION },
    { NULL, 0, NULL, 0 },
  };
  size_t max_result = 0, record_max = RECORD_DEFAULT_MAX;
  enum record_policy record = RECORD_DEAD;
  struct host_config cfg = {
    .concurrency = 10, .visibility = 600, .heartbeat = 0, .drain_timeout = 30, .watchdog_grace = 10,
    .poll_min_ms = 200, .poll_max_ms = 500, .claim_batch = 100, .db_pool = 2,
    .settle_connection = 1,
    .lua_memory = 256u * 1024 * 1024, .budget_wait = 30, .backoff_base = LIFECYCLE_BACKOFF_BASE,
    .backoff_cap = LIFECYCLE_BACKOFF_CAP_S, .backoff_jitter = LIFECYCLE_BACKOFF_JITTER,
    .llm_batch = LLM_BATCH_DEFAULTS,
  };
  const char *tenants[MAX_TENANTS], *lua_path[MAX_TENANTS];
  const char *dashboard_addr = NULL;
  int ntenants = 0, opt, rc;
  long n;
  char worker[300];
  g->usage = run_usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    switch (opt) {
    case OPT_CONCURRENCY:
      if (cli_parse_int(optarg, 1, 10000, &n) != 0)
        return cli_usage_error(g, "--concurrency must be an integer from 1 to 10000");
      cfg.concurrency = (int)n;
      break;
    case OPT_CLAIM_BATCH:
      if (cli_parse_int(optarg, 1, 1000, &n) != 0)
        return cli_usage_error(g, "--claim-batch must be an integer from 1 to 1000");
      cfg.claim_batch = (int)n;
      break;
    case OPT_DB_POOL:
      if (cli_parse_int(optarg, 1, 100, &n) != 0)
        return cli_usage_error(g, "--db-pool must be an integer from 1 to 100");
      cfg.db_pool = (int)n;
      break;
    case OPT_LUA_MEMORY:
      if (cli_parse_size_in(optarg, (size_t)1 << 20, 0, (size_t)1 << 40, &cfg.lua_memory) != 0 ||
          (cfg.lua_memory > 0 && cfg.lua_memory < (size_t)1 << 20))
        return cli_usage_error(g, "--lua-memory must be a size from 1MB to 1024GB (a plain "
                               "number is MB; 0 = no cap), not '%s'", optarg);
      break;
    case OPT_MAX_RESULT_BYTES:
      if (cli_parse_size_in(optarg, 1, 1, (size_t)1 << 40, &max_result) != 0)
        return cli_usage_error(g, "--max-result-bytes must be a size from 1 byte to 1024GB "
                               "(a plain number is bytes; 64KB, 16MB), not '%s'", optarg);
      break;
    case OPT_BACKOFF_BASE:
      if (parse_number(optarg, LIFECYCLE_MIN_BACKOFF_BASE, LIFECYCLE_MAX_BACKOFF_BASE,
                       &cfg.backoff_base) != 0)
        return cli_usage_error(g, "--backoff-base must be a number from %g to %g, not '%s'",
                               LIFECYCLE_MIN_BACKOFF_BASE, LIFECYCLE_MAX_BACKOFF_BASE, optarg);
      break;
    case OPT_BACKOFF_CAP:
      if (cli_parse_duration(optarg, &cfg.backoff_cap) != 0 || cfg.backoff_cap < 0 ||
          cfg.backoff_cap > LIFECYCLE_MAX_BACKOFF_CAP_S)
        return cli_usage_error(g, "--backoff-cap must be a duration from 0 to 1d (e.g. 30, "
                               "5m, 2h), not '%s'", optarg);
      break;
    case OPT_BACKOFF_JITTER:
      if (parse_number(optarg, 0, 1, &cfg.backoff_jitter) != 0)
        return cli_usage_error(g, "--backoff-jitter must be a number from 0 to 1, not '%s'",
                               optarg);
      break;
    case OPT_VISIBILITY:
      if ((rc = parse_duration_opt(g, "--visibility", optarg, &cfg.visibility, 1)) != 0)
        return rc;
      break;
    case OPT_HEARTBEAT:
      if ((rc = parse_duration_opt(g, "--heartbeat", optarg, &cfg.heartbeat, 1)) != 0)
        return rc;
      break;
    case OPT_TASK_TIMEOUT:
      if ((rc = parse_duration_opt(g, "--task-timeout", optarg, &cfg.task_timeout, 0)) != 0)
        return rc;
      break;
    case OPT_DRAIN_TIMEOUT:
      if ((rc = parse_duration_opt(g, "--drain-timeout", optarg, &cfg.drain_timeout, 0)) != 0)
        return rc;
      break;
    case OPT_BUDGET_WAIT:
      if ((rc = parse_duration_opt(g, "--budget-wait", optarg, &cfg.budget_wait, 0)) != 0)
        return rc;
      break;
    case OPT_WATCHDOG_GRACE:
      if ((rc = parse_duration_opt(g, "--watchdog-grace", optarg, &cfg.watchdog_grace, 1)) != 0)
        return rc;
      break;
    case OPT_TENANT:
      if (ntenants == MAX_TENANTS)
        return cli_usage_error(g, "at most %d --tenant options", MAX_TENANTS);
      tenants[ntenants++] = optarg;
      break;
    case OPT_LUA_PATH:
      if (cfg.nlua_path == MAX_TENANTS)
        return cli_usage_error(g, "at most %d --lua-path options", MAX_TENANTS);
      lua_path[cfg.nlua_path++] = optarg;
      cfg.lua_path = lua_path;
      break;
    case OPT_METRICS: {
      char err[300];
      if (cli_check_listen_addr(optarg, err, sizeof err) != 0)
        return cli_usage_error(g, "--metrics: %s", err);
      cfg.metrics_addr = optarg;
      break;
    }
    case OPT_DASHBOARD: {
      char err[300];
      if (cli_check_listen_addr(optarg, err, sizeof err) != 0)
        return cli_usage_error(g, "--dashboard: %s", err);
      if (dashboard_addr_is_loopback(optarg, err, sizeof err) != 1)
        return cli_data_error(g, "--dashboard %s is not a loopback address: the worker's "
                                 "dashboard has no token (leash dashboard --token-file has)",
                              optarg);
      dashboard_addr = optarg;
      break;
    }
    case OPT_BATCH:
      cfg.scope.batch = optarg;
      break;
    case OPT_WORKER_ID:
      if (*optarg == '\0')
        return cli_usage_error(g, "--worker-id must not be empty");
      cfg.worker_id = optarg;
      break;
    case OPT_POLL: {
      double lo, hi;
      if (cli_parse_duration_range(optarg, 0.001, 60, &lo, &hi) != 0)
        return cli_usage_error(g, "--poll must be MIN-MAX or one duration, from 1ms to 60s, "
                               "plain numbers in seconds (e.g. 10ms-1s), not '%s'", optarg);
      cfg.poll_min_ms = (int)(lo * 1000 + 0.5);
      cfg.poll_max_ms = (int)(hi * 1000 + 0.5);
      break;
    }
    case OPT_POLL_MS: {
      /* The old form, kept for existing manifests: --poll with each bound in ms. */
      char lo_s[16];
      const char *dash = strchr(optarg, '-');
      long lo, hi;
      size_t ln = dash ? (size_t)(dash - optarg) : 0;
      if (!dash || ln >= sizeof lo_s || (memcpy(lo_s, optarg, ln), lo_s[ln] = '\0',
                                         cli_parse_int(lo_s, 1, 60000, &lo)) != 0 ||
          cli_parse_int(dash + 1, lo, 60000, &hi) != 0)
        return cli_usage_error(g, "--poll-ms must be MIN-MAX in milliseconds from 1 to 60000, "
                               "e.g. 200-500 (or use --poll 200ms-500ms)");
      cfg.poll_min_ms = (int)lo;
      cfg.poll_max_ms = (int)hi;
      break;
    }
    case OPT_UNTIL_EMPTY:
      cfg.until_empty = 1;
      break;
    case OPT_ENV_ALLOW:
      if ((rc = allow_env(g, optarg)) != 0)
        return rc;
      record_note_env(optarg);
      break;
    case OPT_RECORD:
      if (record_parse_policy(optarg, &record) != 0)
        return cli_usage_error(g, "--record must be none, dead or all, not '%s'", optarg);
      break;
    case OPT_RECORD_MAX:
      if (cli_parse_size_in(optarg, 1, 1024, (size_t)1 << 30, &record_max) != 0)
        return cli_usage_error(g, "--record-max must be a size from 1KB to 1GB (a plain "
                               "number is bytes; 64KB, 1MB), not '%s'", optarg);
      break;
    case OPT_LLM_BATCH_URL: {
      const char *eq = strchr(optarg, '=');
      int p = eq ? llm_provider_index(optarg, (size_t)(eq - optarg)) : -1;
      if (p < 0 || (strncmp(eq + 1, "http://", 7) != 0 && strncmp(eq + 1, "https://", 8) != 0) ||
          strlen(eq + 1) > 500)
        return cli_usage_error(g, "--llm-batch-url must be openai=URL or anthropic=URL with an "
                               "http:// or https:// URL of at most 500 bytes");
      cfg.llm_batch.url[p] = eq + 1;
      break;
    }
    case OPT_LLM_BATCH_MAX:
      if (cli_parse_int(optarg, 1, 50000, &n) != 0)
        return cli_usage_error(g, "--llm-batch-max must be an integer from 1 to 50000");
      cfg.llm_batch.max = (int)n;
      break;
    case OPT_LLM_BATCH_AGE:
      if ((rc = parse_duration_opt(g, "--llm-batch-age", optarg, &cfg.llm_batch.age_s, 0)) != 0)
        return rc;
      break;
    case OPT_LLM_BATCH_POLL:
      if ((rc = parse_duration_opt(g, "--llm-batch-poll", optarg, &cfg.llm_batch.poll_s, 1)) != 0)
        return rc;
      break;
    case OPT_LLM_BATCH_OFF:
      cfg.llm_batch.off = 1;
      break;
    case OPT_SETTLE_CONNECTION:
      cfg.settle_connection = 1;
      break;
    case OPT_NO_SETTLE_CONNECTION:
      cfg.settle_connection = 0;
      break;
    case OPT_RECORD_REDACT: {
      char err[300];
      if (record_add_pattern(optarg, err, sizeof err) != 0)
        return cli_usage_error(g, "%s", err);
      break;
    }
    }
  }
  if (argc - optind != 1)
    return cli_usage_error(g, argc == optind ? "missing SCRIPT.lua" : "too many arguments");
  cfg.script_path = argv[optind];
  record_configure(record, record_max, cfg.script_path);
  /* The result's text lives outside the Lua heap, so it may never be larger than the heap
     is allowed to be: with --lua-memory 16 no task makes 600 MB of JSON. */
  cfg.max_result_bytes = max_result > 0 ? max_result : DEFAULT_MAX_RESULT_BYTES;
  if (cfg.lua_memory && cfg.lua_memory < cfg.max_result_bytes)
    cfg.max_result_bytes = cfg.lua_memory;
  if (cfg.heartbeat == 0)
    cfg.heartbeat = cfg.visibility / 3;
  if (cfg.heartbeat >= cfg.visibility)
    return cli_usage_error(g, "--heartbeat (%g s) must be shorter than --visibility (%g s)",
                           cfg.heartbeat, cfg.visibility);
  if (!cfg.worker_id) {
    const char *pod = getenv("POD_NAME");
    if (pod && *pod) {
      cfg.worker_id = pod;
    } else {
      char host[256] = "localhost";
      gethostname(host, sizeof host - 1);
      snprintf(worker, sizeof worker, "%s:%ld", host, (long)getpid());
      cfg.worker_id = worker;
    }
  }
  char *tenant_list = NULL;
  if (ntenants > 0) {
    tenant_list = text_array_literal(tenants, (size_t)ntenants);
    if (!tenant_list)
      return cli_runtime_error(g, "out of memory");
    cfg.scope.tenants = tenant_list;
    cfg.tenants = tenants;
    cfg.ntenants = ntenants;
  }
  cfg.conninfo = db_conninfo(g->db);
  cfg.table = g->table;
  srand((unsigned)getpid() ^ (unsigned)(task_now() * 1e6));
  warn_env();
  struct dashboard_side *dash = NULL;
  if (dashboard_addr) {
    char err[DB_ERR_MAX + 64];
    if (!(dash = dashboard_side_start(dashboard_addr, cfg.conninfo, cfg.table, err, sizeof err))) {
      free(tenant_list);
      return cli_runtime_error(g, "%s", err);
    }
  }
  rc = host_run(&cfg);
  dashboard_side_stop(dash);
  free(tenant_list);
  return rc;
}

int cmd_check(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "lua-path", required_argument, NULL, OPT_LUA_PATH },
    { "env-allow", required_argument, NULL, OPT_ENV_ALLOW },
    { NULL, 0, NULL, 0 },
  };
  const char *lua_path[MAX_TENANTS];
  int nlua_path = 0, opt, rc;
  g->usage = check_usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    if (opt == CLI_STOP)
      return rc;
    if (opt == OPT_ENV_ALLOW) {
      if ((rc = allow_env(g, optarg)) != 0)
        return rc;
      continue;
    }
    if (nlua_path == MAX_TENANTS)
      return cli_usage_error(g, "at most %d --lua-path options", MAX_TENANTS);
    lua_path[nlua_path++] = optarg;
  }
  if (argc - optind != 1)
    return cli_usage_error(g, argc == optind ? "missing SCRIPT.lua" : "too many arguments");
  atomic_int stopping;
  atomic_init(&stopping, 0);
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  struct script_host sh = {
    .worker_id = "check", .stopping = &stopping, .wake_mu = &mu, .wake_cv = &cv,
    .memory_limit = 256u * 1024 * 1024, .lua_path = lua_path, .nlua_path = nlua_path,
  };
  char err[2048];
  warn_env();
  struct script *s = script_load(argv[optind], &sh, err, sizeof err);
  if (!s) {
    /* The message goes to stderr without log.c: redact it here like any task error. */
    char *clean = secrets_found(err, strlen(err)) ? secrets_redact(err) : NULL;
    rc = cli_runtime_error(g, "%s", clean ? clean : err);
    free(clean);
    return rc;
  }
  printf("%s: ok (version %s)\n", argv[optind], script_version(s));
  script_free(s);
  return EXIT_OK;
}

static int parse_duration_opt(struct cli *g, const char *name, const char *arg, double *out,
                              int positive)
{
  if (cli_parse_duration(arg, out) != 0 || (positive && *out <= 0))
    return cli_usage_error(g, "%s: '%s' is not a duration%s (e.g. 30, 500ms, 5m)", name, arg,
                           positive ? " above zero" : "");
  return 0;
}

/* --env-allow NAME[,NAME...]: the names leash.env may read; a bad name is a usage error. */
static int allow_env(struct cli *g, const char *list)
{
  char err[256];
  if (secrets_allow(list, err, sizeof err) != 0)
    return cli_usage_error(g, "%s", err);
  return 0;
}

/* A word at start for allowed names that will not behave as the operator may think (the
   names only, never a value). */
static void warn_env(void)
{
  char names[512];
  if (secrets_list(SECRETS_UNSET, names, sizeof names) > 0)
    log_warn("--env-allow: not set in the environment (leash.env returns nil): %s", names);
  if (secrets_list(SECRETS_SHORT, names, sizeof names) > 0)
    log_warn("--env-allow: values shorter than %d bytes are not redacted from logs and "
             "errors: %s", SECRETS_MIN_REDACT, names);
}

/* A plain decimal number within [min, max]: the whole text, finite (strtod takes "nan",
   "inf" and hex floats; none of them is a backoff). 0, or -1. */
static int parse_number(const char *arg, double min, double max, double *out)
{
  char *end;
  for (const char *p = arg; *p; p++)
    if (!strchr("0123456789.+-eE", *p))
      return -1;
  errno = 0;
  double v = strtod(arg, &end);
  if (end == arg || *end != '\0' || errno != 0 || !isfinite(v) || v < min || v > max)
    return -1;
  *out = v;
  return 0;
}
