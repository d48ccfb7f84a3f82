/* The Lua bridge through the real loader, sandbox and outcome mapping (no database). */
#include "check.h"
#include "script_fixture.h"

#include "script.h"

#include <pthread.h>
#include <unistd.h>

#ifndef FIXTURES
#error "FIXTURES must name tests/fixtures/lua"
#endif

static struct script_host host(double timeout, size_t memory)
{
  return fixture_host(timeout, memory, 0);
}

static struct task *new_task(const char *payload)
{
  return fixture_task(42, "t", payload);
}

/* outcomes.lua, loaded for h; the case fails when it does not load. */
static struct script *load_outcomes(const struct script_host *h)
{
  char err[1024];
  struct script *s = script_load(FIXTURES "/outcomes.lua", h, err, sizeof err);
  if (!s)
    fprintf(stderr, "load: %s\n", err);
  CHECK(s != NULL);
  return s;
}

/* Runs one task of outcomes.lua and returns it (caller frees). */
static struct task *run(const struct script_host *h, const char *payload)
{
  struct script *s = load_outcomes(h);
  struct task *t = new_task(payload);
  script_run(s, t);
  script_free(s);
  return t;
}

static void outcomes_follow_the_contract(void)
{
  struct script_host h = host(0, 0);
  struct task *t = run(&h, "{\"kind\":\"nothing\"}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  CHECK(t->out.result == NULL);
  task_free(t);
  t = run(&h, "{\"kind\":\"true\"}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  task_free(t);
  t = run(&h, "{\"kind\":\"ok\",\"n\":3}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  CHECK_STR_EQ(t->out.result, "{\"id\":42,\"n\":3,\"sib\":4}");
  task_free(t);
  t = run(&h, "{\"kind\":\"false\"}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK_STR_EQ(t->out.error, "said false");
  CHECK(t->out.delay < 0);
  task_free(t);
  t = run(&h, "{\"kind\":\"retry\"}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK_STR_EQ(t->out.error, "later");
  CHECK(t->out.delay == 7.5);
  task_free(t);
  t = run(&h, "{\"kind\":\"fatal\"}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_FATAL);
  CHECK_STR_EQ(t->out.error, "never");
  task_free(t);
}

static void raised_error_is_a_retry_with_traceback(void)
{
  struct script_host h = host(0, 0);
  struct task *t = run(&h, "{\"kind\":\"error\"}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK(strstr(t->out.error, "outcomes.lua") && strstr(t->out.error, "exploded"));
  CHECK(strstr(t->out.error, "stack traceback"));
  task_free(t);
}

static void unexpected_return_is_a_contract_error(void)
{
  struct script_host h = host(0, 0);
  struct task *t = run(&h, "{\"kind\":\"string\"}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK(strstr(t->out.error, "handle returned a string"));
  task_free(t);
}

static void timeout_survives_script_pcall(void)
{
  struct script_host h = host(0.2, 0);
  struct task *t = run(&h, "{\"kind\":\"loop\"}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK(strstr(t->out.error, "timed out"));
  CHECK(t->duration < 2.0);
  task_free(t);
}

static void memory_cap_fails_the_task_not_the_process(void)
{
  struct script_host h = host(0, 8u * 1024 * 1024);
  struct script *s = load_outcomes(&h);
  struct task *t = new_task("{\"kind\":\"memory\"}");
  script_run(s, t);
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK(strstr(t->out.error, "out of memory"));
  CHECK(script_broken(s));
  task_free(t);
  script_free(s);
}

/* The state is collected in full only past a quarter of the cap; below that a task's
   garbage may still be there when the next task starts. A task that then needs most of the
   cap still runs: Lua collects in full before the cap refuses. */
static void garbage_of_earlier_tasks_does_not_fail_the_next(void)
{
  struct script_host h = host(0, 8u * 1024 * 1024);
  struct script *s = load_outcomes(&h);
  for (int i = 0; i < 3; i++) {
    struct task *t = new_task("{\"kind\":\"hold\",\"kb\":1500}");
    script_run(s, t);
    CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
    task_free(t);
  }
  struct task *t = new_task("{\"kind\":\"hold\",\"kb\":5000}");
  script_run(s, t);
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  CHECK_STR_EQ(t->out.result, "{\"held\":5000}");
  task_free(t);
  script_free(s);
}

/* A memory error the script catches (here one raised inside C, by leash.json.decode) keeps
   the script's outcome, but the state that ran into the cap is rebuilt before the next task. */
static void memory_error_caught_by_the_script_still_rebuilds_the_state(void)
{
  struct script_host h = host(0, 8u * 1024 * 1024);
  struct script *s = load_outcomes(&h);
  struct task *t = new_task("{\"kind\":\"memory_swallowed\"}");
  script_run(s, t);
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  CHECK_STR_EQ(t->out.result, "{\"caught\":true}");
  CHECK(script_broken(s));
  task_free(t);
  script_free(s);
}

/* A short regression next to test_sandbox's allow-list (scripts_see_exactly_the_allow_list,
   which holds every name a task sees): setup ran inside the sandbox, the shared string
   metatable stays locked while string methods work, and process control is out of reach
   while loading too (escape.lua calls os.exit at load time). */
static void strings_stay_locked_and_process_control_fails_at_load(void)
{
  struct script_host h = host(0, 0);
  struct task *t = run(&h, "{\"kind\":\"sandbox\"}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  CHECK_STR_EQ(t->out.result, "{\"exposed\":[],\"setup\":true}");
  task_free(t);
  char err[1024];
  CHECK(script_load(FIXTURES "/escape.lua", &h, err, sizeof err) == NULL);
  CHECK(strstr(err, "exit"));
}

static void payload_types_arrive_as_lua_values(void)
{
  struct script_host h = host(0, 0);
  struct task *t = run(&h, "{\"kind\":\"types\",\"i\":1,\"f\":1.5,\"null\":null,"
                           "\"arr\":[1,2,3],\"obj\":{\"k\":\"v\"}}");
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  CHECK_STR_EQ(t->out.result, "{\"ok\":true}");
  task_free(t);
}

static void bad_scripts_are_refused_with_the_lua_error(void)
{
  struct script_host h = host(0, 0);
  char err[1024];
  CHECK(script_load(FIXTURES "/bad_syntax.lua", &h, err, sizeof err) == NULL);
  CHECK(strstr(err, "bad_syntax.lua:1"));
  CHECK(script_load(FIXTURES "/bad_contract.lua", &h, err, sizeof err) == NULL);
  CHECK(strstr(err, "must return handle"));
  CHECK(script_load(FIXTURES "/missing.lua", &h, err, sizeof err) == NULL);
  CHECK(strstr(err, "cannot open"));
}

static void *lose_later(void *arg)
{
  usleep(100 * 1000);
  atomic_store(&((struct task *)arg)->lost, 1);
  return NULL;
}

static void lost_lease_stops_the_running_code(void)
{
  struct script_host h = host(0, 0);
  struct script *s = load_outcomes(&h);
  struct task *t = new_task("{\"kind\":\"lost\"}");
  pthread_t th;
  pthread_create(&th, NULL, lose_later, t);
  script_run(s, t);
  pthread_join(th, NULL);
  /* Either the hook stopped it, or it saw lease_lost() first: never a silent success. */
  CHECK(t->out.kind == OUTCOME_RETRY ? strstr(t->out.error, "lease lost") != NULL
                                 : strcmp(t->out.result, "{\"saw_lost\":true}") == 0);
  task_free(t);
  script_free(s);
}

static void shipped_scripts_load(void)
{
  struct script_host h = host(0, 0);
  char err[1024];
  static const char *const shipped[] = { SCRIPTS "/summarize_chunks.lua", SCRIPTS "/grade_ticket.lua",
                                         SCRIPTS "/backfill_embeddings.lua", NULL };
  for (const char *const *p = shipped; *p; p++) {
    struct script *s = script_load(*p, &h, err, sizeof err);
    if (!s)
      fprintf(stderr, "%s: %s\n", *p, err);
    CHECK(s != NULL);
    script_free(s);
  }
}

int main(int argc, char **argv)
{
  static const struct check_case cases[] = {
    { "outcomes_follow_the_contract", outcomes_follow_the_contract },
    { "raised_error_is_a_retry_with_traceback", raised_error_is_a_retry_with_traceback },
    { "unexpected_return_is_a_contract_error", unexpected_return_is_a_contract_error },
    { "timeout_survives_script_pcall", timeout_survives_script_pcall },
    { "memory_cap_fails_the_task_not_the_process", memory_cap_fails_the_task_not_the_process },
    { "garbage_of_earlier_tasks_does_not_fail_the_next",
      garbage_of_earlier_tasks_does_not_fail_the_next },
    { "memory_error_caught_by_the_script_still_rebuilds_the_state",
      memory_error_caught_by_the_script_still_rebuilds_the_state },
    { "strings_stay_locked_and_process_control_fails_at_load",
      strings_stay_locked_and_process_control_fails_at_load },
    { "payload_types_arrive_as_lua_values", payload_types_arrive_as_lua_values },
    { "bad_scripts_are_refused_with_the_lua_error", bad_scripts_are_refused_with_the_lua_error },
    { "lost_lease_stops_the_running_code", lost_lease_stops_the_running_code },
    { "shipped_scripts_load", shipped_scripts_load },
    { NULL, NULL },
  };
  return check_main(cases, argc, argv);
}
