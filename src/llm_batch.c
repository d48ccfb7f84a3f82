/* llm_batch: the fleet's provider batcher. See llm_batch.h. */
#include "llm_batch.h"

#include "buf.h"
#include "log.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DB_TIMEOUT_MS 300000    /* a 50,000-item batch is answered in one statement */
#define HTTP_TIMEOUT_S 120L
#define HTTP_MAX_BODY (512u * 1024 * 1024)
#define SUBMIT_BACKOFF_MIN_S 1.0  /* after a failed upload the provider is tried again after
                                     --llm-batch-poll, at least this */
#define OPEN_PER_TICK 20          /* batches one provider may open in one tick */

static const char *const provider_names[LLM_PROVIDERS] = { "openai", "anthropic" };
static const char *const default_urls[LLM_PROVIDERS] = { "https://api.openai.com",
                                                         "https://api.anthropic.com" };
static const char *const key_vars[LLM_PROVIDERS] = { "OPENAI_API_KEY", "ANTHROPIC_API_KEY" };

struct llm_batch {
  struct llm_batch_config cfg;
  pthread_t thread;
  pthread_mutex_t mu;            /* guards quit */
  pthread_cond_t cv;             /* CLOCK_MONOTONIC */
  int quit;
  atomic_int stopping;           /* read by curl's progress callback: quit, without the lock */
  PGconn *conn;
  int leader;
  int down;                      /* the last database call failed (logged once) */
  char base[LLM_PROVIDERS][512];
  char *key[LLM_PROVIDERS];      /* from the environment; NULL: none (a mock) */
  double next_submit[LLM_PROVIDERS];   /* monotonic: after a failed upload */
  char *fn_open, *fn_submitted, *fn_abandon, *fn_recover, *fn_status, *fn_end, *batches;
  char *id_sql;                  /* a checked id field of a JSON answer */
  double wait_s;                 /* until the next tick (see next_wait) */
  int busy;                      /* this tick opened a batch or polled one */
};

static void *batch_main(void *arg);
static void tick(struct llm_batch *b);
static int become_leader(struct llm_batch *b);
static void submit_ready(struct llm_batch *b, int p);
static void poll_open(struct llm_batch *b);
static PGresult *sql(struct llm_batch *b, const char *text, int n, const char *const *params);
static double next_wait(const struct llm_batch *b);

static double mono_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int llm_provider_index(const char *name, size_t len)
{
  for (int i = 0; i < LLM_PROVIDERS; i++)
    if (strlen(provider_names[i]) == len && memcmp(provider_names[i], name, len) == 0)
      return i;
  return -1;
}

struct llm_batch *llm_batch_start(const struct llm_batch_config *cfg)
{
  if (cfg->opt.off)
    return NULL;
  struct llm_batch *b = calloc(1, sizeof *b);
  if (!b)
    return NULL;
  b->cfg = *cfg;
  for (int p = 0; p < LLM_PROVIDERS; p++) {
    const char *u = cfg->opt.url[p] ? cfg->opt.url[p] : default_urls[p];
    snprintf(b->base[p], sizeof b->base[p], "%s", u);
    size_t n = strlen(b->base[p]);
    while (n > 0 && b->base[p][n - 1] == '/')
      b->base[p][--n] = '\0';
    const char *k = getenv(key_vars[p]);
    b->key[p] = k && *k ? strdup(k) : NULL;
  }
  pthread_mutex_init(&b->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&b->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&b->thread, NULL, batch_main, b) != 0) {
    log_error("llm batch: cannot start the batcher thread");
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    for (int p = 0; p < LLM_PROVIDERS; p++)
      free(b->key[p]);
    free(b);
    return NULL;
  }
  return b;
}

void llm_batch_stop(struct llm_batch *b)
{
  if (!b)
    return;
  pthread_mutex_lock(&b->mu);
  b->quit = 1;
  atomic_store(&b->stopping, 1);
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
  pthread_join(b->thread, NULL);
  if (b->conn)
    PQfinish(b->conn);
  for (int p = 0; p < LLM_PROVIDERS; p++) {
    if (b->key[p])
      memset(b->key[p], 0, strlen(b->key[p]));
    free(b->key[p]);
  }
  free(b->fn_open);
  free(b->fn_submitted);
  free(b->fn_abandon);
  free(b->fn_recover);
  free(b->fn_status);
  free(b->fn_end);
  free(b->batches);
  free(b->id_sql);
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
  free(b);
}

static void *batch_main(void *arg)
{
  struct llm_batch *b = arg;
  pthread_mutex_lock(&b->mu);
  while (!b->quit) {
    pthread_mutex_unlock(&b->mu);
    b->busy = 0;
    tick(b);
    b->wait_s = next_wait(b);
    pthread_mutex_lock(&b->mu);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(b->wait_s * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    if (!b->quit)
      pthread_cond_timedwait(&b->cv, &b->mu, &ts);
  }
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

/* An idle process costs the database little (issue 6's idle target: under a statement a
   second for the whole process): a follower tries for the lead every LLM_BATCH_FOLLOW_S, a
   leader with nothing to open or poll waits twice as long each time up to
   LLM_BATCH_IDLE_MAX_S, and every LLM_BATCH_TICK_S again as soon as it has work. */
static double next_wait(const struct llm_batch *b)
{
  if (!b->leader)
    return LLM_BATCH_FOLLOW_S;
  if (b->busy || b->wait_s <= 0)
    return LLM_BATCH_TICK_S;
  double w = b->wait_s * 2;
  return w > LLM_BATCH_IDLE_MAX_S ? LLM_BATCH_IDLE_MAX_S : w;
}

/* The statements' function names, once per process. 0, or -1. */
static int names(struct llm_batch *b)
{
  if (b->fn_end)
    return 0;
  const struct db_table *t = b->cfg.table;
  b->fn_open = db_table_object(t, b->conn, "llm_batch_open", 1);
  b->fn_submitted = db_table_object(t, b->conn, "llm_batch_submitted", 1);
  b->fn_abandon = db_table_object(t, b->conn, "llm_batch_abandon", 1);
  b->fn_recover = db_table_object(t, b->conn, "llm_batch_recover", 1);
  b->fn_status = db_table_object(t, b->conn, "llm_batch_status", 1);
  b->batches = db_table_object(t, b->conn, "llm_batches", 1);
  char *js = db_table_object(t, b->conn, "llm_jsonb", 1);
  if (js && (b->id_sql = malloc(strlen(js) + 128)))
    sprintf(b->id_sql, "SELECT substring(%s($1)->>$2 FROM '^[A-Za-z0-9_-]{1,200}$')", js);
  free(js);
  b->fn_end = db_table_object(t, b->conn, "llm_batch_end", 1);
  return b->id_sql && b->fn_open && b->fn_submitted && b->fn_abandon && b->fn_recover && b->fn_status &&
         b->batches && b->fn_end ? 0 : -1;
}

static void tick(struct llm_batch *b)
{
  char err[DB_ERR_MAX];
  if (!b->conn) {
    b->leader = 0;
    b->conn = db_connect(b->cfg.conninfo, "llm-batch", DB_TIMEOUT_MS, err, sizeof err);
    if (!b->conn) {
      if (!b->down)
        log_warn("llm batch: cannot reach the database (tries again): %s", err);
      b->down = 1;
      return;
    }
  }
  if (names(b) != 0)
    return;
  if (!b->leader && become_leader(b) != 1)
    return;
  for (int p = 0; p < LLM_PROVIDERS && !atomic_load(&b->stopping) && b->conn; p++)
    submit_ready(b, p);
  if (!atomic_load(&b->stopping) && b->conn)
    poll_open(b);
}

/* Runs one statement; on failure logs once and, when the connection is gone, drops it (and
   with it the lead: the session's lock is gone too). */
static PGresult *sql(struct llm_batch *b, const char *text, int n, const char *const *params)
{
  char err[DB_ERR_MAX];
  PGresult *r = db_exec(b->conn, text, n, params, err, sizeof err);
  if (r) {
    b->down = 0;
    return r;
  }
  if (!b->down)
    log_warn("llm batch: database call failed (tries again): %s", err);
  b->down = 1;
  if (PQstatus(b->conn) != CONNECTION_OK) {
    if (b->leader)
      log_warn("llm batch: lost the database connection; no longer the batcher");
    PQfinish(b->conn);
    b->conn = NULL;
    b->leader = 0;
  }
  return NULL;
}

/* 1: this session leads (the lock is held until the session ends), 0: another does. */
static int become_leader(struct llm_batch *b)
{
  const char *params[] = { b->cfg.table->qualified };
  PGresult *r = sql(b, "SELECT pg_try_advisory_lock(hashtext($1 || ':llm_batch'), 19)", 1,
                    params);
  if (!r)
    return -1;
  int got = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  PQclear(r);
  if (!got)
    return 0;
  b->leader = 1;
  char q[300];
  snprintf(q, sizeof q, "SELECT %s()", b->fn_recover);
  r = sql(b, q, 0, NULL);
  long n = r ? atol(PQgetvalue(r, 0, 0)) : 0;
  if (r)
    PQclear(r);
  log_info("llm batch: worker %s is the fleet's batcher%s", b->cfg.worker_id,
           n > 0 ? " (abandoned its predecessor's unsent batches)" : "");
  return b->leader;
}

/* ---- HTTP ---- */

struct http {
  struct buf body;
  struct llm_batch *b;
};

static size_t on_body(char *data, size_t size, size_t n, void *ud)
{
  struct http *h = ud;
  if (h->body.len + size * n > HTTP_MAX_BODY)
    return 0;
  return buf_add(&h->body, data, size * n) == 0 ? size * n : 0;
}

static int on_progress(void *ud, curl_off_t a, curl_off_t b2, curl_off_t c, curl_off_t d)
{
  (void)a, (void)b2, (void)c, (void)d;
  struct http *h = ud;
  return atomic_load(&h->b->stopping);
}

/* One request to provider p: path under its base URL; body (JSON) or mime (multipart).
   Returns the HTTP status (0: no answer, err says why) with the body in *out (the caller
   frees it). Messages name the method and path only: never a header. */
static long http(struct llm_batch *b, int p, const char *method, const char *path,
                 const char *body, curl_mime *(*mime)(CURL *, const char *), const char *part,
                 char **out, char *err, size_t errlen)
{
  *out = NULL;
  CURL *c = curl_easy_init();
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return 0;
  }
  char url[1200], auth[1100];
  snprintf(url, sizeof url, "%s%s", b->base[p], path);
  struct curl_slist *hd = NULL;
  if (p == LLM_OPENAI && b->key[p]) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", b->key[p]);
    hd = curl_slist_append(hd, auth);
  } else if (p == LLM_ANTHROPIC) {
    if (b->key[p]) {
      snprintf(auth, sizeof auth, "x-api-key: %s", b->key[p]);
      hd = curl_slist_append(hd, auth);
    }
    hd = curl_slist_append(hd, "anthropic-version: 2023-06-01");
  }
  memset(auth, 0, sizeof auth);
  curl_mime *m = NULL;
  if (body) {
    hd = curl_slist_append(hd, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
  } else if (mime) {
    m = mime(c, part);
    curl_easy_setopt(c, CURLOPT_MIMEPOST, m);
  }
  struct http h = { .b = b };
  char errbuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, HTTP_TIMEOUT_S);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &h);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &h);
  curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  if (rc == CURLE_OK)
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  else
    snprintf(err, errlen, "%s %s: %s", method, path, errbuf[0] ? errbuf : curl_easy_strerror(rc));
  curl_easy_cleanup(c);
  curl_mime_free(m);
  /* The header list holds the key: wiped before it is freed. */
  for (struct curl_slist *s = hd; s; s = s->next)
    memset(s->data, 0, strlen(s->data));
  curl_slist_free_all(hd);
  if (rc != CURLE_OK) {
    buf_free(&h.body);
    return 0;
  }
  *out = buf_take(&h.body);
  if (!*out) {
    snprintf(err, errlen, "%s %s: out of memory", method, path);
    return 0;
  }
  if (status < 200 || status > 299)
    snprintf(err, errlen, "%s %s: HTTP %ld", method, path, status);
  return status;
}

/* OpenAI's upload: purpose=batch and the JSONL as the file. */
static curl_mime *openai_file(CURL *c, const char *jsonl)
{
  curl_mime *m = curl_mime_init(c);
  curl_mimepart *part = curl_mime_addpart(m);
  curl_mime_name(part, "purpose");
  curl_mime_data(part, "batch", CURL_ZERO_TERMINATED);
  part = curl_mime_addpart(m);
  curl_mime_name(part, "file");
  curl_mime_filename(part, "leash-batch.jsonl");
  curl_mime_type(part, "application/jsonl");
  curl_mime_data(part, jsonl, CURL_ZERO_TERMINATED);
  return m;
}

/* A string field of a JSON object, read by the database (malloc'd), or NULL. Only an id
   made of [A-Za-z0-9_-] is returned: it goes into a URL path. */
static char *json_id(struct llm_batch *b, const char *body, const char *field)
{
  const char *params[] = { body, field };
  PGresult *r = sql(b, b->id_sql, 2, params);
  char *v = r && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) ? strdup(PQgetvalue(r, 0, 0)) : NULL;
  if (r)
    PQclear(r);
  return v;
}

/* ---- submitting ---- */

/* Gives batch id back (its items pending again; counted: the provider refused them). */
static void abandon(struct llm_batch *b, const char *id, const char *why, int counted)
{
  char q[400];
  snprintf(q, sizeof q, "SELECT %s($1::bigint, $2, $3::boolean)", b->fn_abandon);
  const char *params[] = { id, why, counted ? "true" : "false" };
  PGresult *r = sql(b, q, 3, params);
  if (r)
    PQclear(r);
}

/* Uploads one opened batch; returns the provider's batch id (malloc'd) or NULL with err and
   *refused (a 4xx other than 429: the request itself is wrong). */
static char *upload(struct llm_batch *b, int p, const char *text, int *refused, char *err,
                    size_t errlen)
{
  char *resp = NULL, *pid = NULL;
  long st;
  *refused = 0;
  if (p == LLM_ANTHROPIC) {
    st = http(b, p, "POST", "/v1/messages/batches", text, NULL, NULL, &resp, err, errlen);
  } else {
    st = http(b, p, "POST", "/v1/files", NULL, openai_file, text, &resp, err, errlen);
    char *file = st >= 200 && st <= 299 ? json_id(b, resp, "id") : NULL;
    if (st >= 200 && st <= 299 && !file)
      snprintf(err, errlen, "POST /v1/files: the answer names no file id");
    free(resp);
    resp = NULL;
    if (!file) {
      *refused = st >= 400 && st <= 499 && st != 429 && st != 408;
      return NULL;
    }
    char body[400];
    snprintf(body, sizeof body, "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/chat/completions\","
             "\"completion_window\":\"24h\"}", file);
    free(file);
    st = http(b, p, "POST", "/v1/batches", body, NULL, NULL, &resp, err, errlen);
  }
  if (st >= 200 && st <= 299) {
    pid = json_id(b, resp, "id");
    if (!pid)
      snprintf(err, errlen, "the provider's batch answer names no batch id");
  }
  *refused = st >= 400 && st <= 499 && st != 429 && st != 408;
  free(resp);
  return pid;
}

static void submit_ready(struct llm_batch *b, int p)
{
  if (mono_now() < b->next_submit[p])
    return;
  char q[400], max[16], age[32];
  snprintf(q, sizeof q, "SELECT batch_id, items, upload FROM %s($1, $2::int, $3::float8, $4)",
           b->fn_open);
  snprintf(max, sizeof max, "%d", b->cfg.opt.max);
  snprintf(age, sizeof age, "%.3f", b->cfg.opt.age_s);
  for (int i = 0; i < OPEN_PER_TICK && !atomic_load(&b->stopping) && b->conn; i++) {
    const char *params[] = { provider_names[p], max, age, b->cfg.worker_id };
    PGresult *r = sql(b, q, 4, params);
    if (!r)
      return;
    if (PQntuples(r) != 1 || PQgetisnull(r, 0, 2)) {
      PQclear(r);
      return;
    }
    b->busy = 1;
    char id[24], err[512] = "";
    snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
    int n = atoi(PQgetvalue(r, 0, 1)), refused = 0;
    char *pid = upload(b, p, PQgetvalue(r, 0, 2), &refused, err, sizeof err);
    PQclear(r);
    if (!pid) {
      log_warn("llm batch: %s batch %s (%d items) not submitted%s: %s", provider_names[p], id,
               n, refused ? " (refused: each item spends a try)" : "; tries again", err);
      abandon(b, id, err, refused);
      if (!refused)
        b->next_submit[p] = mono_now() + (b->cfg.opt.poll_s > SUBMIT_BACKOFF_MIN_S
                                          ? b->cfg.opt.poll_s : SUBMIT_BACKOFF_MIN_S);
      return;
    }
    char s[300];
    snprintf(s, sizeof s, "SELECT %s($1::bigint, $2)", b->fn_submitted);
    const char *sp[] = { id, pid };
    r = sql(b, s, 2, sp);
    if (r) {
      log_info("llm batch: %s batch %s submitted as %s (%d items)", provider_names[p], id, pid, n);
      PQclear(r);
    }
    free(pid);
  }
}

/* ---- polling ---- */

/* The results of an ended batch as JSONL (malloc'd), or NULL with err (tried next poll). */
static char *results(struct llm_batch *b, int p, const char *pid, const char *output,
                     const char *errors, char *err, size_t errlen)
{
  struct buf all = { 0 };
  char path[400], *resp = NULL;
  if (p == LLM_ANTHROPIC) {
    snprintf(path, sizeof path, "/v1/messages/batches/%s/results", pid);
    long st = http(b, p, "GET", path, NULL, NULL, NULL, &resp, err, errlen);
    if (st < 200 || st > 299) {
      free(resp);
      return NULL;
    }
    return resp;
  }
  const char *files[] = { output, errors };
  for (int i = 0; i < 2; i++) {
    if (!files[i] || !*files[i])
      continue;
    snprintf(path, sizeof path, "/v1/files/%s/content", files[i]);
    long st = http(b, p, "GET", path, NULL, NULL, NULL, &resp, err, errlen);
    if (st < 200 || st > 299) {
      free(resp);
      buf_free(&all);
      return NULL;
    }
    buf_puts(&all, resp);
    buf_puts(&all, "\n");
    free(resp);
    resp = NULL;
  }
  buf_puts(&all, "");
  return buf_take(&all);
}

/* A file id from the status (already a JSON string), checked like a batch id. */
static int safe_id(const char *s)
{
  if (!s || !*s)
    return 1;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_' || *s == '-'))
      return 0;
  return 1;
}

static void poll_one(struct llm_batch *b, const char *id, int p, const char *pid)
{
  char path[400], err[512] = "", *resp = NULL;
  snprintf(path, sizeof path, p == LLM_OPENAI ? "/v1/batches/%s" : "/v1/messages/batches/%s",
           pid);
  long st = http(b, p, "GET", path, NULL, NULL, NULL, &resp, err, sizeof err);
  char q[600];
  if (st < 200 || st > 299) {
    log_warn("llm batch: %s batch %s (%s) not polled (tries again): %s", provider_names[p], id,
             pid, err);
    free(resp);
    snprintf(q, sizeof q, "UPDATE %s SET polled_at = now() WHERE id = $1::bigint", b->batches);
    const char *params[] = { id };
    PGresult *r = sql(b, q, 1, params);
    if (r)
      PQclear(r);
    return;
  }
  snprintf(q, sizeof q, "SELECT ended, status, output, errors FROM %s($1, $2)", b->fn_status);
  const char *sp[] = { provider_names[p], resp };
  PGresult *r = sql(b, q, 2, sp);
  free(resp);
  if (!r)
    return;
  int ended = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  char status[64];
  snprintf(status, sizeof status, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 1) : "unreadable");
  char *output = PQntuples(r) == 1 && !PQgetisnull(r, 0, 2) ? strdup(PQgetvalue(r, 0, 2)) : NULL;
  char *errors = PQntuples(r) == 1 && !PQgetisnull(r, 0, 3) ? strdup(PQgetvalue(r, 0, 3)) : NULL;
  PQclear(r);
  if (!ended) {
    snprintf(q, sizeof q, "UPDATE %s SET polled_at = now(), provider_status = left($2, 100) "
             "WHERE id = $1::bigint", b->batches);
    const char *up[] = { id, status };
    if ((r = sql(b, q, 2, up)))
      PQclear(r);
    free(output);
    free(errors);
    return;
  }
  char *text = NULL;
  if (p == LLM_OPENAI && (!safe_id(output) || !safe_id(errors)))
    snprintf(err, sizeof err, "the batch names a file id that is not [A-Za-z0-9_-]");
  else
    text = results(b, p, pid, output, errors, err, sizeof err);
  free(output);
  free(errors);
  if (!text) {
    log_warn("llm batch: %s batch %s (%s) %s, results not read (tries again): %s",
             provider_names[p], id, pid, status, err);
    return;
  }
  snprintf(q, sizeof q, "SELECT done, retried, failed, fallback FROM %s($1::bigint, $2, $3)",
           b->fn_end);
  const char *ep[] = { id, status, text };
  r = sql(b, q, 3, ep);
  free(text);
  if (r && PQntuples(r) == 1)
    log_info("llm batch: %s batch %s (%s) %s: %s answered, %s to a later batch, %s failed, "
             "%s to their fallback", provider_names[p], id, pid, status, PQgetvalue(r, 0, 0),
             PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 3));
  if (r)
    PQclear(r);
}

static void poll_open(struct llm_batch *b)
{
  char q[600], every[32];
  snprintf(every, sizeof every, "%.3f", b->cfg.opt.poll_s);
  snprintf(q, sizeof q, "SELECT id, provider, provider_batch_id FROM %s "
           " WHERE state = 'open' AND (polled_at IS NULL OR "
           "       polled_at <= now() - make_interval(secs => $1::float8)) "
           " ORDER BY id LIMIT 100", b->batches);
  const char *params[] = { every };
  PGresult *r = sql(b, q, 1, params);
  if (!r)
    return;
  if (PQntuples(r) > 0)
    b->busy = 1;
  for (int i = 0; i < PQntuples(r) && !atomic_load(&b->stopping) && b->conn; i++) {
    const char *prov = PQgetvalue(r, i, 1);
    int p = llm_provider_index(prov, strlen(prov));
    const char *pid = PQgetvalue(r, i, 2);
    if (p < 0 || !safe_id(pid) || !*pid)
      continue;
    poll_one(b, PQgetvalue(r, i, 0), p, pid);
  }
  PQclear(r);
}
