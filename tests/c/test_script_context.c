/* The script side's lower units alone, without script.c: the task context (task_context.h)
   on a bare state with the leash module opened by hand, the protected push of malloc'd
   text (luatext.h), the byte buffer (buf.h) and the file reader (textfile.h). That
   these build and run with no script in the loop is the point: nothing here calls back
   up into script.c. */
#include "check.h"

#include "api.h"
#include "log.h"
#include "luatext.h"
#include "task_context.h"
#include "buf.h"
#include "textfile.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdint.h>
#include <unistd.h>

static atomic_int stopping;
static pthread_mutex_t wake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cv = PTHREAD_COND_INITIALIZER;
static struct script_host host = {
  .worker_id = "ctx-worker", .stopping = &stopping, .wake_mu = &wake_mu, .wake_cv = &wake_cv,
};
static struct task_ctx ctx;

static struct task *new_task(void)
{
  struct task *t = calloc(1, sizeof *t);
  t->id = 7;
  t->attempt = 2;
  t->tenant_id = strdup("acme");
  t->shard_key = strdup("s");
  t->payload = strdup("{}");
  atomic_init(&t->lost, 0);
  atomic_init(&t->lease_deadline, task_now() + 3600);
  return t;
}

/* A plain state with the context attached and `leash` in a global. */
static lua_State *bare_state(void)
{
  atomic_store(&stopping, 0);
  ctx = (struct task_ctx){ .host = &host, .dir = "." };
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  taskctx_attach(L, &ctx);
  lua_pushcfunction(L, api_leash_open);
  lua_call(L, 0, 1);
  lua_setglobal(L, "leash");
  return L;
}

/* Runs code in a protected call; returns its error text (static) or NULL on success. */
static const char *run(lua_State *L, const char *code)
{
  static char err[512];
  if (luaL_dostring(L, code) == LUA_OK)
    return NULL;
  snprintf(err, sizeof err, "%s", lua_tostring(L, -1));
  lua_pop(L, 1);
  return err;
}

static void side_effects_raise_without_a_live_task(void)
{
  lua_State *L = bare_state();
  const char *e = run(L, "leash.db.query('select 1')");
  CHECK(e && strstr(e, "leash.db.query: only available while a task runs"));
  e = run(L, "leash.enqueue{ payload = {} }");
  CHECK(e && strstr(e, "leash.enqueue: only available while a task runs"));

  struct task *t = new_task();
  taskctx_begin(L, t, 0);
  atomic_store(&t->lost, 1);
  e = run(L, "leash.step('s', function() end)");
  CHECK(e && strstr(e, "leash.step: lease lost"));
  e = run(L, "leash.sleep(5)");             /* wakes at once: the lease is gone */
  CHECK(e && strstr(e, "lease lost"));
  atomic_store(&t->lost, 0);
  atomic_store(&stopping, 1);
  e = run(L, "leash.db.query('select 1')");
  CHECK(e && strstr(e, "leash.db.query: the worker is stopping"));
  atomic_store(&stopping, 0);
  /* Alive, no pool (as in `leash check`): the call gets as far as the database. */
  e = run(L, "leash.db.query('select 1')");
  CHECK(e && strstr(e, "no database in this context"));
  taskctx_end(L);
  CHECK(ctx.task == NULL);
  lua_close(L);
  task_free(t);
}

/* The count hook stops code for each reason, says why, and a script's pcall cannot
   swallow the stop (the hook fires on every instruction once tripped). */
static void the_hook_stops_code_for_each_reason_and_records_it(void)
{
  static const char loop[] = "pcall(function() while true do end end) while true do end";
  lua_State *L = bare_state();
  struct task *t = new_task();

  taskctx_begin(L, t, 3600);
  ctx.deadline = task_now() - 1;             /* the timeout is already past */
  const char *e = run(L, loop);
  CHECK(e && strstr(e, "task timed out (--task-timeout)"));
  CHECK_STR_EQ(ctx.stop_reason, "task timed out (--task-timeout)");
  CHECK_INT_EQ(ctx.stop_cause, CAUSE_TIMEOUT);
  taskctx_end(L);

  taskctx_begin(L, t, 0);
  CHECK(ctx.stop_reason == NULL && ctx.deadline == 0);
  CHECK(taskctx_time_left(&ctx) > 1e8);      /* no deadline: a large number */
  atomic_store(&t->lease_deadline, task_now() - 1);   /* frozen past the lease */
  e = run(L, loop);
  CHECK(e && strstr(e, "lease lost"));
  CHECK_INT_EQ(ctx.stop_cause, CAUSE_LEASE_LOST);
  taskctx_end(L);
  atomic_store(&t->lease_deadline, task_now() + 3600);

  taskctx_begin(L, t, 0);
  atomic_store(&stopping, 1);
  e = run(L, loop);
  CHECK(e && strstr(e, "worker stopping"));
  CHECK_INT_EQ(ctx.stop_cause, CAUSE_STOPPING);
  taskctx_end(L);
  atomic_store(&stopping, 0);

  taskctx_begin(L, NULL, 3600);              /* loading: no task */
  ctx.deadline = task_now() - 1;
  e = run(L, loop);
  CHECK(e && strstr(e, "script took too long to load"));
  taskctx_end(L);

  /* Ended, the hook is gone: code runs to its end. */
  CHECK(run(L, "for i = 1, 100000 do end") == NULL);
  lua_close(L);
  task_free(t);
}

static void log_fields_name_the_task_and_the_worker(void)
{
  struct task *t = new_task();
  struct task_ctx c = { .host = &host };
  struct log_field f[TASKCTX_LOG_FIELDS];
  char id[32], attempt[16];
  CHECK_INT_EQ(taskctx_log_fields(&c, f, id, attempt), 1);
  CHECK_STR_EQ(f[0].key, "worker");
  CHECK_STR_EQ(f[0].value, "ctx-worker");
  c.task = t;
  CHECK_INT_EQ(taskctx_log_fields(&c, f, id, attempt), 4);
  CHECK_STR_EQ(f[0].value, "7");
  CHECK_STR_EQ(f[1].value, "acme");
  CHECK_STR_EQ(f[2].value, "2");
  CHECK_STR_EQ(f[3].key, "worker");
  task_free(t);
}

/* An allocator that refuses growth past a budget. */
static size_t budget, used;
static void *capped(void *ud, void *ptr, size_t osize, size_t nsize)
{
  (void)ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    used -= old;
    return NULL;
  }
  if (nsize > old && used + (nsize - old) > budget)
    return NULL;
  void *p = realloc(ptr, nsize);
  if (p)
    used = used - old + nsize;
  return p;
}

static int push_big(lua_State *L)
{
  size_t n = (size_t)lua_tointeger(L, 1);
  char *text = malloc(n + 1);
  CHECK(text);
  memset(text, 'x', n);
  text[n] = '\0';
  luatext_pushfree(L, text);                 /* freed on both paths (valgrind/ASan tell) */
  return 1;
}

static void pushfree_frees_the_text_also_when_the_push_raises(void)
{
  budget = 256 * 1024;
  used = 0;
  lua_State *L = lua_newstate(capped, NULL);
  CHECK(L);
  lua_pushcfunction(L, push_big);
  lua_pushinteger(L, 100);
  CHECK_INT_EQ(lua_pcall(L, 1, 1, 0), LUA_OK);
  CHECK_INT_EQ(lua_rawlen(L, -1), 100);
  lua_pop(L, 1);
  lua_pushcfunction(L, push_big);
  lua_pushinteger(L, 1024 * 1024);           /* over the budget: the push raises */
  CHECK_INT_EQ(lua_pcall(L, 1, 1, 0), LUA_ERRMEM);
  lua_close(L);
}

static void byte_buffer_grows_and_refuses_what_cannot_fit(void)
{
  struct buf b = { 0 };
  CHECK_INT_EQ(buf_add(&b, "", 0), 0);
  CHECK_STR_EQ(b.s, "");
  for (int i = 0; i < 1000; i++)
    CHECK_INT_EQ(buf_add(&b, "abc", 3), 0);
  CHECK_INT_EQ(b.len, 3000);
  CHECK(b.s[2999] == 'c' && b.s[3000] == '\0');
  CHECK_INT_EQ(buf_add(&b, "x", SIZE_MAX), -1);   /* refused, unchanged */
  CHECK_INT_EQ(b.len, 3000);
  buf_free(&b);
  CHECK(b.s == NULL && b.len == 0);
}

static void textfile_reads_whole_files_and_names_the_path_on_error(void)
{
  char path[] = "/tmp/leash-textfile-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  static char big[100000];
  for (size_t i = 0; i < sizeof big; i++)
    big[i] = (char)(i % 251);                /* NULs included */
  CHECK_INT_EQ(write(fd, big, sizeof big), sizeof big);
  close(fd);
  size_t len = 0;
  char err[256];
  char *text = textfile_read(path, &len, err, sizeof err);
  CHECK(text);
  CHECK_INT_EQ(len, sizeof big);
  CHECK(memcmp(text, big, sizeof big) == 0 && text[len] == '\0');
  free(text);
  unlink(path);
  CHECK(textfile_read(path, &len, err, sizeof err) == NULL);
  CHECK(strstr(err, "cannot open") && strstr(err, path) && strstr(err, "No such file"));
  CHECK(textfile_read("/tmp", &len, err, sizeof err) == NULL);
  CHECK_STR_EQ(err, "cannot read /tmp");
}

int main(int argc, char **argv)
{
  static const struct check_case cases[] = {
    { "side_effects_raise_without_a_live_task", side_effects_raise_without_a_live_task },
    { "the_hook_stops_code_for_each_reason_and_records_it",
      the_hook_stops_code_for_each_reason_and_records_it },
    { "log_fields_name_the_task_and_the_worker", log_fields_name_the_task_and_the_worker },
    { "pushfree_frees_the_text_also_when_the_push_raises",
      pushfree_frees_the_text_also_when_the_push_raises },
    { "byte_buffer_grows_and_refuses_what_cannot_fit", byte_buffer_grows_and_refuses_what_cannot_fit },
    { "textfile_reads_whole_files_and_names_the_path_on_error",
      textfile_reads_whole_files_and_names_the_path_on_error },
    { NULL, NULL },
  };
  return check_main(cases, argc, argv);
}
