/* leash replay: a batch's recordings (sql/017) run through a new script offline, and what
   would have changed (replay.h; README "Replay"). */
#include "commands.h"
#include "db.h"
#include "migrate.h"
#include "record.h"
#include "replay.h"
#include "script.h"
#include "secrets.h"
#include "task.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
  "usage: leash replay NEW.lua --batch B [--tenant T] [--jobs N] [--json]\n"
  "                    [--env-allow NAME[,NAME...]] [--record-redact REGEX]...\n"
  "                    [--lua-path DIR]...\n\n"
  "Runs the latest recording of every task of batch B (`leash run --record all`) through\n"
  "NEW.lua's handle in the worker's sandbox, offline: leash.http.request, leash.db.query,\n"
  "leash.step and leash.enqueue are answered from the recording; no network, no write. A\n"
  "request the recording does not hold ends that task's replay as a divergence. Prints one\n"
  "line per task whose outcome (ok, retry, fatal, snooze) or result (compared as JSON)\n"
  "changed or that diverged, then the totals, the time taken and tasks/s. Changes are data:\n"
  "the exit is 0 when the replay ran; 2 for bad input (a script that does not load, a batch\n"
  "without recordings).\n\n"
  "options:\n"
  "  --batch B             the batch to replay (required)\n"
  "  --tenant T            only this tenant's tasks of the batch\n"
  "  --jobs N              scripts run at once, each its own Lua state (default: the CPUs,\n"
  "                        at most 8; 1..64)\n"
  "  --json                one JSON object: totals, changes by kind and the changed tasks\n"
  "  --env-allow NAME[,NAME...]  environment variables the script may read with leash.env\n"
  "                        (as for run; their values are redacted from what is printed)\n"
  "  --record-redact REGEX  POSIX extended regex (repeatable), as given to run: matches are\n"
  "                        redacted from what is printed, and from URLs and statements\n"
  "                        before they are matched with the recording's\n"
  "  --lua-path DIR        folders require searches after the script's own (repeatable)\n\n";

enum { OPT_BATCH = OPT_COMMAND_BASE, OPT_TENANT, OPT_JOBS, OPT_JSON, OPT_ENV_ALLOW,
       OPT_RECORD_REDACT, OPT_LUA_PATH };

#define REPLAY_PAGE "500"   /* recordings fetched and replayed at a time */
#define REPLAY_MAX_JOBS 64
#define REPLAY_MAX_LUA_PATH 16

/* The latest recording of each task of the batch after task $3, a page at a time. %s: the
   recordings table, then the queue table. */
static const char page_fmt[] =
  "SELECT DISTINCT ON (r.task_id) r.task_id, r.body::text "
  "  FROM %s r JOIN %s q ON q.id = r.task_id "
  " WHERE q.batch = $1 AND ($2::text IS NULL OR q.tenant_id = $2) AND r.task_id > $3::bigint "
  " ORDER BY r.task_id, r.recorded_at DESC, r.lease_token DESC LIMIT " REPLAY_PAGE;

/* The batch's tasks, and those with at least one recording. */
static const char count_fmt[] =
  "SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM %s r WHERE r.task_id = q.id)) "
  "  FROM %s q WHERE q.batch = $1 AND ($2::text IS NULL OR q.tenant_id = $2)";

/* One job: its own state (the script loaded once), host and replay source. */
struct job {
  struct script_host host;
  struct script *s;
  struct replay_src *src;
  const char *path, *text;
  size_t len;
  /* The page being replayed: shared, read-only but for next. */
  char **bodies;
  json_t **rows;
  int n;
  atomic_int *next;
  int failed;        /* a state could not be reloaded */
};

static void *job_main(void *arg)
{
  struct job *j = arg;
  int i;
  while ((i = atomic_fetch_add(j->next, 1)) < j->n) {
    j->rows[i] = replay_one(j->s, j->src, j->bodies[i], strlen(j->bodies[i]));
    if (script_broken(j->s)) {   /* as a slot does: a fresh state after the cap was hit */
      char err[512];
      script_free(j->s);
      j->s = script_load_text(j->path, j->text, j->len, &j->host, err, sizeof err);
      if (!j->s) {
        j->failed = 1;
        return NULL;
      }
    }
  }
  return NULL;
}

/* The totals' key of a changed row: "ok -> fatal", "result", "divergence". */
static void change_key(const json_t *row, char *out, size_t n)
{
  const char *change = json_string_value(json_object_get(row, "change"));
  if (strcmp(change, "outcome") == 0)
    snprintf(out, n, "%s -> %s",
             json_string_value(json_object_get(json_object_get(row, "from"), "kind")),
             json_string_value(json_object_get(json_object_get(row, "to"), "kind")));
  else
    snprintf(out, n, "%s", change);
}

/* Compact JSON of v, cut to 120 bytes for a line. */
static void short_json(const json_t *v, char *out, size_t n)
{
  char *text = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  snprintf(out, n, "%s", text ? text : "null");
  if (strlen(out) > 120)
    strcpy(out + 117, "...");
  free(text);
}

static void print_row(const json_t *row)
{
  const char *change = json_string_value(json_object_get(row, "change"));
  long long id = (long long)json_integer_value(json_object_get(row, "id"));
  const json_t *from = json_object_get(row, "from"), *to = json_object_get(row, "to");
  char key[64];
  change_key(row, key, sizeof key);
  if (strcmp(change, "outcome") == 0) {
    const char *e = json_string_value(json_object_get(to, "error"));
    char res[160];
    short_json(json_object_get(to, "result"), res, sizeof res);
    if (e)   /* the new error says why; a success shows what it now gives */
      printf("task %lld: %s (%s: %s)\n", id, key,
             json_string_value(json_object_get(to, "cause")), e);
    else
      printf("task %lld: %s (result %s)\n", id, key, res);
  } else if (strcmp(change, "result") == 0) {
    char a[160], b[160];
    short_json(json_object_get(from, "result"), a, sizeof a);
    short_json(json_object_get(to, "result"), b, sizeof b);
    printf("task %lld: result %s -> %s\n", id, a, b);
  } else if (strcmp(change, "divergence") == 0) {
    printf("task %lld: divergence: %s\n", id,
           json_string_value(json_object_get(row, "divergence")));
  } else {
    printf("task %lld: its recording cannot be replayed (no payload or outcome kept)\n", id);
  }
}

int cmd_replay(struct cli *g, int argc, char **argv)
{
  static const struct option opts[] = {
    CLI_GLOBAL_OPTIONS,
    { "batch", required_argument, NULL, OPT_BATCH },
    { "tenant", required_argument, NULL, OPT_TENANT },
    { "jobs", required_argument, NULL, OPT_JOBS },
    { "json", no_argument, NULL, OPT_JSON },
    { "env-allow", required_argument, NULL, OPT_ENV_ALLOW },
    { "record-redact", required_argument, NULL, OPT_RECORD_REDACT },
    { "lua-path", required_argument, NULL, OPT_LUA_PATH },
    { NULL, 0, NULL, 0 },
  };
  const char *batch = NULL, *tenant = NULL, *lua_path[REPLAY_MAX_LUA_PATH];
  int nlua_path = 0, as_json = 0, opt, rc;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN), njobs = cpus < 1 ? 1 : cpus > 8 ? 8 : cpus;
  char err[2048];
  g->usage = usage;
  while ((opt = cli_next_option(g, argc, argv, opts, &rc)) != -1) {
    switch (opt) {
    case CLI_STOP:
      return rc;
    case OPT_BATCH: batch = optarg; break;
    case OPT_TENANT: tenant = optarg; break;
    case OPT_JSON: as_json = 1; break;
    case OPT_JOBS:
      if (cli_parse_int(optarg, 1, REPLAY_MAX_JOBS, &njobs) != 0)
        return cli_usage_error(g, "--jobs must be an integer from 1 to %d, not '%s'",
                               REPLAY_MAX_JOBS, optarg);
      break;
    case OPT_ENV_ALLOW:
      if (secrets_allow(optarg, err, sizeof err) != 0)
        return cli_usage_error(g, "%s", err);
      break;
    case OPT_RECORD_REDACT:
      if (record_add_pattern(optarg, err, sizeof err) != 0)
        return cli_usage_error(g, "%s", err);
      break;
    case OPT_LUA_PATH:
      if (nlua_path == REPLAY_MAX_LUA_PATH)
        return cli_usage_error(g, "at most %d --lua-path options", REPLAY_MAX_LUA_PATH);
      lua_path[nlua_path++] = optarg;
      break;
    }
  }
  if (argc - optind != 1)
    return cli_usage_error(g, argc == optind ? "missing NEW.lua" : "too many arguments");
  if (!batch)
    return cli_usage_error(g, "--batch B is required (the batch whose recordings to replay)");
  const char *path = argv[optind];
  record_configure(RECORD_NONE, RECORD_DEFAULT_MAX, NULL);   /* a replay records nothing */

  /* The script first: a script that does not load needs no database to say so. */
  size_t len;
  char *text = script_read_file(path, &len, err, sizeof err);
  if (!text)
    return cli_data_error(g, "%s", err);
  atomic_int stopping;
  atomic_init(&stopping, 0);
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  struct job *jobs = calloc((size_t)njobs, sizeof *jobs);
  atomic_int next;
  if (!jobs) {
    free(text);
    return cli_runtime_error(g, "out of memory");
  }
  rc = EXIT_OK;
  for (long i = 0; i < njobs && rc == EXIT_OK; i++) {
    struct job *j = &jobs[i];
    /* run's default caps (--lua-memory, --max-result-bytes), so a result too big there is
       too big here; 60 s a task, so a script stuck in a loop cannot stall the replay. */
    j->host = (struct script_host){
      .worker_id = "replay", .stopping = &stopping, .wake_mu = &mu, .wake_cv = &cv,
      .task_timeout = 60, .memory_limit = 256u * 1024 * 1024,
      .max_result_bytes = 16u * 1024 * 1024, .lua_path = lua_path,
      .nlua_path = nlua_path,
    };
    j->path = path;
    j->text = text;
    j->len = len;
    j->next = &next;
    if (!(j->src = replay_src_new())) {
      rc = cli_runtime_error(g, "out of memory");
      break;
    }
    j->host.replay = j->src;
    if (!(j->s = script_load_text(path, text, len, &j->host, err, sizeof err))) {
      char *clean = secrets_found(err, strlen(err)) ? secrets_redact(err) : NULL;
      rc = cli_data_error(g, "%s", clean ? clean : err);
      free(clean);
    }
  }

  PGconn *c = NULL;
  struct db_table t = { 0 };
  char *rec_t = NULL, *sql = NULL;
  PGresult *r = NULL;
  json_t *changes = json_object(), *listed = json_array();
  long long replayed = 0, same = 0, changed = 0, divergent = 0, unreadable = 0, skipped = 0;
  double started = 0;
  if (rc != EXIT_OK)
    goto done;
  if ((rc = cli_open(g, "replay", &c, &t)) != EXIT_OK) {
    c = NULL;
    goto done;
  }
  if (migrate_check(c, &t, err, sizeof err) != 0 ||
      !(rec_t = db_table_object(&t, c, "recordings", 1))) {
    rc = cli_runtime_error(g, "%s", err);
    goto done;
  }
  size_t cap = sizeof page_fmt + sizeof count_fmt + strlen(rec_t) + strlen(t.qualified);
  if (!(sql = malloc(cap)) || !changes || !listed) {
    rc = cli_runtime_error(g, "out of memory");
    goto done;
  }
  snprintf(sql, cap, count_fmt, rec_t, t.qualified);
  const char *cparams[] = { batch, tenant };
  if (!(r = db_exec(c, sql, 2, cparams, err, sizeof err))) {
    rc = cli_runtime_error(g, "%s", err);
    goto done;
  }
  long long ntasks = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
  long long nrec = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
  PQclear(r);
  r = NULL;
  if (ntasks == 0) {
    rc = cli_data_error(g, "no tasks in batch '%s'%s%s in %s", batch, tenant ? " of tenant " : "",
                        tenant ? tenant : "", g->table);
    goto done;
  }
  if (nrec == 0) {
    rc = cli_data_error(g, "batch '%s': no recordings among its %lld task%s (record it with "
                        "`leash run --record all`)", batch, ntasks, ntasks == 1 ? "" : "s");
    goto done;
  }
  skipped = ntasks - nrec;

  snprintf(sql, cap, page_fmt, rec_t, t.qualified);
  started = task_now();
  char after[24] = "0";
  for (;;) {
    const char *params[] = { batch, tenant, after };
    if (!(r = db_exec(c, sql, 3, params, err, sizeof err))) {
      rc = cli_runtime_error(g, "%s", err);
      goto done;
    }
    int n = PQntuples(r);
    if (n == 0)
      break;
    char **bodies = malloc((size_t)n * sizeof *bodies);
    json_t **rows = calloc((size_t)n, sizeof *rows);
    if (!bodies || !rows) {
      free(bodies);
      free(rows);
      rc = cli_runtime_error(g, "out of memory");
      goto done;
    }
    for (int i = 0; i < n; i++)
      bodies[i] = PQgetvalue(r, i, 1);
    snprintf(after, sizeof after, "%s", PQgetvalue(r, n - 1, 0));
    atomic_init(&next, 0);
    pthread_t tid[REPLAY_MAX_JOBS];
    int started_jobs = 0;
    for (long i = 0; i < njobs; i++) {
      jobs[i].bodies = bodies;
      jobs[i].rows = rows;
      jobs[i].n = n;
      if (jobs[i].s && pthread_create(&tid[i], NULL, job_main, &jobs[i]) == 0)
        started_jobs++;
      else
        tid[i] = 0;
    }
    if (started_jobs == 0)
      job_main(&jobs[0]);   /* no thread could start: this one does the work */
    for (long i = 0; i < njobs; i++)
      if (tid[i])
        pthread_join(tid[i], NULL);
    int lost = 0;
    for (int i = 0; i < n; i++) {
      json_t *row = rows[i];
      if (!row) {
        lost++;
        continue;
      }
      const char *what = json_string_value(json_object_get(row, "change"));
      replayed++;
      if (strcmp(what, "same") == 0) {
        same++;
        json_decref(row);
        continue;
      }
      if (strcmp(what, "divergence") == 0)
        divergent++;
      else if (strcmp(what, "unreadable") == 0)
        unreadable++;
      else
        changed++;
      if (strcmp(what, "outcome") == 0 || strcmp(what, "result") == 0) {
        char key[64];
        change_key(row, key, sizeof key);
        json_int_t had = json_integer_value(json_object_get(changes, key));
        json_object_set_new(changes, key, json_integer(had + 1));
      }
      if (!as_json)
        print_row(row);
      json_array_append_new(listed, row);
      if (!as_json)
        json_array_clear(listed);   /* printed: not kept */
    }
    free(bodies);
    free(rows);
    PQclear(r);
    r = NULL;
    for (long i = 0; i < njobs; i++)
      if (jobs[i].failed || !jobs[i].s)
        lost = 1;
    if (lost) {
      rc = cli_runtime_error(g, "a replay job could not go on (out of memory reloading "
                             "the script)");
      goto done;
    }
  }
  double secs = task_now() - started;
  double rate = secs > 0 ? (double)replayed / secs : 0;
  if (as_json) {
    json_t *o = json_pack("{ss ss? ss sI sI sI sO sI sI sI sf sf so}", "batch", batch,
                          "tenant", tenant, "version", script_version(jobs[0].s),
                          "replayed", (json_int_t)replayed, "same", (json_int_t)same,
                          "changed", (json_int_t)changed, "changes", changes,
                          "divergent", (json_int_t)divergent,
                          "unreadable", (json_int_t)unreadable,
                          "skipped", (json_int_t)skipped, "seconds", secs,
                          "tasks_per_s", rate, "tasks", json_incref(listed));
    if (!o)
      rc = cli_runtime_error(g, "out of memory");
    else
      rc = cli_print_json(g, o);
  } else {
    printf("replayed %lld tasks of batch %s in %.3f s (%.*f tasks/s): %lld same, %lld changed",
           replayed, batch, secs, rate < 10 ? 1 : 0, rate, same, changed);
    const char *k;
    json_t *v;
    int first = 1;
    json_object_foreach(changes, k, v) {
      printf("%s%s %lld", first ? " (" : ", ", k, (long long)json_integer_value(v));
      first = 0;
    }
    printf("%s, %lld divergent, %lld skipped without a recording", first ? "" : ")",
           divergent, skipped);
    if (unreadable)
      printf(", %lld not replayable", unreadable);
    printf("\n");
  }

done:
  PQclear(r);
  free(sql);
  free(rec_t);
  json_decref(changes);
  json_decref(listed);
  if (c)
    cli_close(c, &t);
  for (long i = 0; i < njobs; i++) {
    script_free(jobs[i].s);
    replay_src_free(jobs[i].src);
  }
  free(jobs);
  free(text);
  return rc;
}
