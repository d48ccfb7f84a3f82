/* The sandbox (src/sandbox.c) through the real loader: what scripts see, that no state
   crosses tasks, and that no single library call outlives --task-timeout. Fixtures are
   the .lua files in tests/fixtures/sandbox. No database. */
#include "check.h"
#include "script_fixture.h"

#include "sandbox.h"
#include "script.h"

#include <jansson.h>
#include <lauxlib.h>
#include <lualib.h>

#ifndef FIXTURES
#error "FIXTURES must name tests/fixtures/sandbox"
#endif

static struct script_host host(double timeout, size_t memory)
{
  return fixture_host(timeout, memory, 0);
}

static struct task *new_task(const char *payload)
{
  return fixture_task(42, "tenant-a", payload);
}

static struct script *load(const struct script_host *h, const char *name)
{
  char err[1024], path[1024];
  snprintf(path, sizeof path, "%s/%s", FIXTURES, name);
  struct script *s = script_load(path, h, err, sizeof err);
  if (!s)
    fprintf(stderr, "load %s: %s\n", path, err);
  CHECK(s != NULL);
  return s;
}

static struct task *run(struct script *s, const char *payload)
{
  struct task *t = new_task(payload);
  script_run(s, t);
  return t;
}

/* ================================================================ no state crosses tasks */

/* Runs isolation.lua's variant as two tasks in one state; both must report no failures. */
static void two_tasks(const char *variant)
{
  struct script_host h = host(5, 64u << 20);
  struct script *s = load(&h, "isolation.lua");
  for (int step = 1; step <= 2; step++) {
    char payload[128];
    snprintf(payload, sizeof payload, "{\"variant\":\"%s\",\"step\":%d}", variant, step);
    struct task *t = run(s, payload);
    if (t->out.kind != OUTCOME_SUCCESS || strcmp(t->out.result, "{\"failures\":[]}") != 0)
      fprintf(stderr, "%s step %d: kind %d, error %s, result %s\n", variant, step,
              t->out.kind, t->out.error ? t->out.error : "-", t->out.result ? t->out.result : "-");
    CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
    CHECK_STR_EQ(t->out.result, "{\"failures\":[]}");
    task_free(t);
  }
  script_free(s);
}

static void global_set_by_a_task_is_nil_in_the_next(void)
{
  two_tasks("global");
}

static void patched_library_function_raises_and_the_next_task_sees_the_original(void)
{
  two_tasks("string_upper");
}

static void field_added_to_the_leash_module_raises_and_is_not_seen(void)
{
  two_tasks("leash_field");
}

static void metatable_set_on_G_is_gone_for_the_next_task(void)
{
  two_tasks("G_metatable");
}

static void rawset_and_raw_writers_cannot_change_a_library(void)
{
  two_tasks("raw_writers");
}

static void shared_tables_are_out_of_reach_without_debug(void)
{
  two_tasks("shared_tables");
}

static void coroutine_kept_in_a_global_is_gone_for_the_next_task(void)
{
  two_tasks("coroutine");
}

static void load_time_globals_stay_and_a_saved_G_cannot_write_them(void)
{
  two_tasks("load_time");
}

static void module_tables_are_read_only_and_task_modules_are_fresh(void)
{
  two_tasks("modules");
}

static void chunk_locals_are_the_documented_way_to_keep_state(void)
{
  two_tasks("kept");
}

/* shared/repro/hostile/leak.lua: its patches raise now (the task is a retry naming what
   is read-only), and what it set before the raise is not seen by the next task, which
   fails at the same place and not earlier. */
static void hostile_leak_repro_leaks_nothing(void)
{
  struct script_host h = host(5, 64u << 20);
  struct script *s = load(&h, "leak.lua");
  for (int i = 0; i < 2; i++) {
    struct task *t = run(s, "{\"n\":1}");
    CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
    CHECK_INT_EQ(t->out.cause, CAUSE_ERROR);
    CHECK(strstr(t->out.error, "cannot set string.upper"));
    CHECK(strstr(t->out.error, "leak.lua:14:"));   /* the patch of string.upper */
    task_free(t);
  }
  script_free(s);
}

static void scripts_see_exactly_the_allow_list(void)
{
  struct script_host h = host(5, 64u << 20);
  struct script *s = load(&h, "allowlist.lua");
  struct task *t = run(s, "{}");
  if (t->out.kind != OUTCOME_SUCCESS || strcmp(t->out.result, "{\"failures\":[]}") != 0)
    fprintf(stderr, "error %s, result %s\n", t->out.error ? t->out.error : "-",
            t->out.result ? t->out.result : "-");
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  CHECK_STR_EQ(t->out.result, "{\"failures\":[]}");
  task_free(t);
  script_free(s);
}

/* A no-op task's cost with the per-task globals: printed, and bounded loosely so a
   regression by an order of magnitude fails (the copy is ~40 entries). */
static void fresh_globals_per_task_cost_microseconds(void)
{
  static const char text[] = "local leash = require 'leash'\n"
                             "return function(task) local x = string.len(tostring(task.id))"
                             " return true end\n";
  struct script_host h = host(5, 64u << 20);
  char err[512];
  struct script *s = script_load_text("noop.lua", text, sizeof text - 1, &h, err, sizeof err);
  CHECK(s != NULL);
  struct task *t = new_task("{}");
  int n = 20000;
  double t0 = task_now();
  for (int i = 0; i < n; i++) {
    outcome_clear(&t->out);
    script_run(s, t);
    CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  }
  double per = (task_now() - t0) / n * 1e6;
  printf("one no-op task: %.2f us (script_run, payload decode included)\n", per);
  CHECK(per < 200);
  task_free(t);
  script_free(s);
}

/* ============================================================ C-level loops are bounded */

struct loop_case {
  const char *kind;
  const char *want;   /* NULL: a timeout; "": success; else a substring of the error */
};

/* Under valgrind (ctest's valgrind.* entries) building the inputs alone can take longer
   than the short timeout, so the bounds scale. */
static int under_valgrind(void)
{
  const char *p = getenv("LD_PRELOAD");
  return p && strstr(p, "vgpreload");
}

static void run_loops(const struct loop_case *cases)
{
  const double timeout = under_valgrind() ? 4.0 : 0.5, slack = under_valgrind() ? 3.0 : 1.0;
  struct script_host h = host(timeout, 256u << 20);
  struct script *s = load(&h, "loops.lua");
  for (const struct loop_case *c = cases; c->kind; c++) {
    /* A case that must be refused gets ten times the time: building its input may take a
       while on a loaded machine, and the point is the refusal, not the clock. */
    const double limit = c->want && *c->want ? 10 * timeout : timeout;
    h.task_timeout = limit;
    char payload[128];
    snprintf(payload, sizeof payload, "{\"kind\":\"%s\"}", c->kind);
    struct task *t = run(s, payload);
    fprintf(stderr, "%-28s kind %d cause %d %.2f s: %.120s\n", c->kind, t->out.kind,
            t->out.cause, t->duration, t->out.error ? t->out.error : "-");
    CHECK(t->duration < limit + slack);
    if (!c->want) {
      CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
      CHECK_INT_EQ(t->out.cause, CAUSE_TIMEOUT);
    } else if (!*c->want) {
      CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
    } else {
      CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
      CHECK(t->out.error && strstr(t->out.error, c->want));
    }
    task_free(t);
    if (script_broken(s)) {          /* a memory refusal: the host rebuilds, so do we */
      script_free(s);
      s = load(&h, "loops.lua");
    }
  }
  script_free(s);
}

static void table_library_loops_stop_at_the_deadline(void)
{
  static const struct loop_case cases[] = {
    { "tmove", NULL }, { "tmove_backwards", NULL }, { "tinsert_huge_len", NULL },
    { "tremove_huge_len", NULL }, { "tconcat_index", NULL },
    { "tconcat_huge", "table.concat: result over 64 MB" },
    { "tunpack_huge", "too many results to unpack" },
    { "tsort_looping_comparator", NULL },
    { "tsort_huge_without_comparator", "table.sort: 1048577 elements without a comparator" },
    { "tsort_big_with_lua_comparator", NULL }, { NULL, NULL },
  };
  run_loops(cases);
}

static void strings_built_in_one_call_are_bounded(void)
{
  static const struct loop_case cases[] = {
    { "srep_huge", "string.rep: result over 64 MB" },
    { "srep_sep_huge", "string.rep: result over 64 MB" },
    { "utf8_char_huge_range", "too many results to unpack" },
    { "utf8_codepoint_huge_range", "string slice too long" },
    { "format_wide", "invalid conversion" },
    { "os_date_huge_format", "os.date: format of 2097152 bytes" },
    { "gsub_result_huge", "string.gsub: result over 64 MB" }, { NULL, NULL },
  };
  run_loops(cases);
}

static void pattern_backtracking_stops_at_the_deadline(void)
{
  static const struct loop_case cases[] = {
    { "find_backtracking", NULL }, { "gsub_backtracking", NULL }, { "match_lazy", NULL },
    { "gmatch_backtracking", NULL }, { "find_plain_long_needle", NULL },
    { "find_balance", NULL }, { "find_backreference", NULL }, { NULL, NULL },
  };
  run_loops(cases);
}

static void lua_code_called_from_c_is_reached_by_the_hook(void)
{
  static const struct loop_case cases[] = {
    { "gsub_looping_function", NULL }, { "tostring_looping", NULL },
    { "coroutine_loop", NULL }, { "index_loop_from_c", NULL }, { "close_looping", NULL },
    { "close_looping_while_unwinding", NULL }, { NULL, NULL },
  };
  run_loops(cases);
}

static void finalizers_cannot_be_set(void)
{
  static const struct loop_case cases[] = {
    { "gc_at_setmetatable", "__gc is not allowed" },
    { "gc_false_then_function", "__gc is not allowed" },
    { "gc_added_later_never_runs", "" }, { NULL, NULL },
  };
  run_loops(cases);
}

/* The three shared reproductions, as they were filed. */
static void hostile_c_loop_repros_end_within_the_timeout(void)
{
  static const struct { const char *file, *want; } repros[] = {
    { "gc_loop.lua", "__gc is not allowed" }, { "tmove.lua", NULL }, { "pattern.lua", NULL },
    { NULL, NULL },
  };
  const double timeout = under_valgrind() ? 4.0 : 0.5, slack = under_valgrind() ? 3.0 : 1.0;
  struct script_host h = host(timeout, 256u << 20);
  for (int i = 0; repros[i].file; i++) {
    struct script *s = load(&h, repros[i].file);
    struct task *t = run(s, "{}");
    CHECK(t->duration < timeout + slack);
    CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
    if (repros[i].want)
      CHECK(strstr(t->out.error, repros[i].want));
    else
      CHECK_INT_EQ(t->out.cause, CAUSE_TIMEOUT);
    task_free(t);
    script_free(s);
  }
}

/* A load (a new version's chunk or setup) that runs one C call too long is refused like a
   broken script, by the load deadline (5 s), so a hot swap cannot wedge on it. */
static void c_level_loop_while_loading_is_refused_like_a_broken_script(void)
{
  static const char text[] = "string.find(('a'):rep(40), ('a*'):rep(40) .. 'b')\n"
                             "return function() end\n";
  struct script_host h = host(0.5, 256u << 20);
  char err[512];
  double t0 = task_now();
  struct script *s = script_load_text("wedge.lua", text, sizeof text - 1, &h, err, sizeof err);
  CHECK(s == NULL);
  CHECK(strstr(err, "took too long to load"));
  CHECK(task_now() - t0 < (under_valgrind() ? 15.0 : 6.5));
}

/* =================================================== the matcher keeps Lua's semantics */

static int l_ok_stub(lua_State *L)
{
  lua_settop(L, 1);
  return 1;
}

static int l_require_stub(lua_State *L)
{
  lua_newtable(L);
  lua_pushcfunction(L, l_ok_stub);
  lua_setfield(L, -2, "ok");
  return 1;
}

static void replaced_library_functions_give_luas_own_answers(void)
{
  /* Lua's matcher: a plain state with the standard libraries. */
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  lua_register(L, "require", l_require_stub);
  CHECK(luaL_dofile(L, FIXTURES "/patterns.lua") == LUA_OK);
  lua_newtable(L);
  CHECK(lua_pcall(L, 1, 1, 0) == LUA_OK);
  lua_getfield(L, -1, "text");
  const char *want = lua_tostring(L, -1);
  CHECK(want != NULL);

  struct script_host h = host(10, 256u << 20);
  struct script *s = load(&h, "patterns.lua");
  struct task *t = run(s, "{}");
  if (t->out.kind != OUTCOME_SUCCESS)
    fprintf(stderr, "%s\n", t->out.error);
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  json_t *j = json_loads(t->out.result, 0, NULL);
  CHECK(j != NULL);
  const char *got = json_string_value(json_object_get(j, "text"));
  CHECK(got != NULL);
  if (strcmp(got, want) != 0) {
    /* the first differing line, for the reader */
    const char *a = want, *b = got;
    while (*a && *a == *b) {
      a++;
      b++;
    }
    while (a > want && a[-1] != '\n') {
      a--;
      b--;
    }
    fprintf(stderr, "lua:     %.200s\nsandbox: %.200s\n", a, b);
  }
  CHECK(strcmp(got, want) == 0);
  printf("%zu bytes of results compared\n", strlen(want));
  json_decref(j);
  task_free(t);
  script_free(s);
  lua_close(L);
}

int main(int argc, char **argv)
{
  static const struct check_case cases[] = {
    { "global_set_by_a_task_is_nil_in_the_next", global_set_by_a_task_is_nil_in_the_next },
    { "patched_library_function_raises_and_the_next_task_sees_the_original",
      patched_library_function_raises_and_the_next_task_sees_the_original },
    { "field_added_to_the_leash_module_raises_and_is_not_seen",
      field_added_to_the_leash_module_raises_and_is_not_seen },
    { "metatable_set_on_G_is_gone_for_the_next_task", metatable_set_on_G_is_gone_for_the_next_task },
    { "rawset_and_raw_writers_cannot_change_a_library",
      rawset_and_raw_writers_cannot_change_a_library },
    { "shared_tables_are_out_of_reach_without_debug", shared_tables_are_out_of_reach_without_debug },
    { "coroutine_kept_in_a_global_is_gone_for_the_next_task",
      coroutine_kept_in_a_global_is_gone_for_the_next_task },
    { "load_time_globals_stay_and_a_saved_G_cannot_write_them",
      load_time_globals_stay_and_a_saved_G_cannot_write_them },
    { "module_tables_are_read_only_and_task_modules_are_fresh",
      module_tables_are_read_only_and_task_modules_are_fresh },
    { "chunk_locals_are_the_documented_way_to_keep_state",
      chunk_locals_are_the_documented_way_to_keep_state },
    { "hostile_leak_repro_leaks_nothing", hostile_leak_repro_leaks_nothing },
    { "scripts_see_exactly_the_allow_list", scripts_see_exactly_the_allow_list },
    { "fresh_globals_per_task_cost_microseconds", fresh_globals_per_task_cost_microseconds },
    { "table_library_loops_stop_at_the_deadline", table_library_loops_stop_at_the_deadline },
    { "strings_built_in_one_call_are_bounded", strings_built_in_one_call_are_bounded },
    { "pattern_backtracking_stops_at_the_deadline", pattern_backtracking_stops_at_the_deadline },
    { "lua_code_called_from_c_is_reached_by_the_hook",
      lua_code_called_from_c_is_reached_by_the_hook },
    { "finalizers_cannot_be_set", finalizers_cannot_be_set },
    { "hostile_c_loop_repros_end_within_the_timeout", hostile_c_loop_repros_end_within_the_timeout },
    { "c_level_loop_while_loading_is_refused_like_a_broken_script",
      c_level_loop_while_loading_is_refused_like_a_broken_script },
    { "replaced_library_functions_give_luas_own_answers", replaced_library_functions_give_luas_own_answers },
    { NULL, NULL },
  };
  return check_main(cases, argc, argv);
}
