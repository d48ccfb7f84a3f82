/* The Lua boundary under hostile scripts and payloads (issue #12, classes 1 and 6): whatever
   a script returns, raises or logs, and whatever a payload holds, the task ends as an outcome
   with a clear error and the process goes on. A case that fails by a panic aborts the binary,
   so ctest reports it; under ASan a use-after-free does the same. */
#include "check.h"
#include "script_fixture.h"

#include "lifecycle.h"
#include "script.h"

#include <unistd.h>

#ifndef FIXTURES
#error "FIXTURES must name tests/fixtures/boundary"
#endif

struct limits {
  double timeout;        /* --task-timeout */
  size_t memory;         /* --lua-memory, bytes */
  size_t max_result;     /* --max-result-bytes */
};

static struct script_host host(struct limits l)
{
  return fixture_host(l.timeout, l.memory, l.max_result);
}

static struct task *new_task(const char *payload)
{
  return fixture_task(7, "t", payload);
}

/* Loads len bytes of text as a whole script (the case fails when it does not load) and runs
   one task. */
static struct task *run_script(const char *text, size_t len, const char *payload,
                               struct limits l)
{
  struct script_host h = host(l);
  char err[1024];
  struct script *s = script_load_text(FIXTURES "/inline.lua", text, len, &h, err, sizeof err);
  if (!s)
    fprintf(stderr, "load: %s\n", err);
  CHECK(s != NULL);
  struct task *t = new_task(payload);
  script_run(s, t);
  script_free(s);
  return t;
}

/* body is handle's body, with leash in scope. */
static struct task *run_body(const char *body, struct limits l)
{
  char text[8192];
  snprintf(text, sizeof text, "local leash = require 'leash'\nreturn function(task)\n%s\nend\n",
           body);
  return run_script(text, strlen(text), "{}", l);
}

static struct task *run_file(const char *name, const char *payload, struct limits l)
{
  char path[1024], err[1024];
  size_t len;
  snprintf(path, sizeof path, "%s/%s", FIXTURES, name);
  char *text = script_read_file(path, &len, err, sizeof err);
  CHECK(text != NULL);
  struct task *t = run_script(text, len, payload, l);
  free(text);
  return t;
}

/* A generous timeout: the cases also run under valgrind. */
static const struct limits plain = { 60, 64u << 20, 16u << 20 };

/* A retry whose cause is cause and whose error holds want (when want is not NULL). */
static void expect_retry(const char *body, enum outcome_cause cause, const char *want)
{
  struct task *t = run_body(body, plain);
  if (t->out.kind != OUTCOME_RETRY || t->out.cause != cause ||
      (want && (!t->out.error || !strstr(t->out.error, want))))
    fprintf(stderr, "body: %s\n  kind %d cause %s error: %s\n", body, t->out.kind,
            lifecycle_cause_name(t->out.cause), t->out.error ? t->out.error : "(none)");
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK_INT_EQ(t->out.cause, cause);
  if (want)
    CHECK(t->out.error && strstr(t->out.error, want));
  task_free(t);
}

static void expect_success(const char *body, const char *result)
{
  struct task *t = run_body(body, plain);
  if (t->out.kind != OUTCOME_SUCCESS)
    fprintf(stderr, "body: %s\n  error: %s\n", body, t->out.error ? t->out.error : "(none)");
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  if (result)
    CHECK_STR_EQ(t->out.result, result);
  else
    CHECK(t->out.result == NULL);
  task_free(t);
}

static void error_object_whose_tostring_raises_is_a_retry(void)
{
  /* raised: the message handler's __tostring call fails */
  expect_retry("error(setmetatable({}, { __tostring = function() error('boom from __tostring') end }))",
               CAUSE_ERROR, "__tostring failed");
  expect_retry("error(setmetatable({}, { __tostring = function() error('boom from __tostring') end }))",
               CAUSE_ERROR, "boom from __tostring");
  /* returned as false's message: reading the answer fails (the shared repro) */
  struct task *t = run_file("tostring_err.lua", "{}", plain);
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK_INT_EQ(t->out.cause, CAUSE_CONTRACT);
  CHECK(strstr(t->out.error, "boom from __tostring"));
  task_free(t);
  /* as nil's message, and raising a table instead of a string */
  expect_retry("return nil, setmetatable({}, { __tostring = function() error({}) end })",
               CAUSE_CONTRACT, "could not be read");
  /* error(e) inside __tostring, with e the object itself: no recursion through the handler */
  expect_retry("local e; e = setmetatable({}, { __tostring = function(x) error(x) end }); error(e)",
               CAUSE_ERROR, "__tostring failed");
}

static void error_object_whose_tostring_returns_a_non_string_is_a_retry(void)
{
  expect_retry("error(setmetatable({}, { __tostring = function() return {} end }))",
               CAUSE_ERROR, "must return a string");
  expect_retry("error(setmetatable({}, { __tostring = function() return nil end }))",
               CAUSE_ERROR, "must return a string");
  expect_retry("return nil, setmetatable({}, { __tostring = function() return true end })",
               CAUSE_CONTRACT, "must return a string");
  /* a number is a string to luaL_tolstring */
  expect_retry("return false, setmetatable({}, { __tostring = function() return 42 end })",
               CAUSE_RETURNED, "42");
  /* a string is the script's own text, shown as it is */
  expect_retry("error(setmetatable({}, { __tostring = function() return 'custom' end }))",
               CAUSE_ERROR, "custom");
}

static void error_object_whose_tostring_loops_ends_by_the_task_timeout(void)
{
  static const char *const bodies[] = {
    "error(setmetatable({}, { __tostring = function() while true do end end }))",
    "return false, setmetatable({}, { __tostring = function() while true do end end })",
    "return nil, setmetatable({}, { __tostring = function() while true do pcall(error) end end })",
    "leash.log.info('x', { k = setmetatable({}, { __tostring = function() while true do end end }) })",
    NULL,
  };
  struct limits l = { 0.3, 64u << 20, 16u << 20 };
  for (const char *const *b = bodies; *b; b++) {
    double start = task_now();
    struct task *t = run_body(*b, l);
    CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
    CHECK_INT_EQ(t->out.cause, CAUSE_TIMEOUT);
    CHECK(strstr(t->out.error, "timed out"));
    CHECK(task_now() - start < 3.0);
    task_free(t);
  }
}

static void error_object_with_raising_metamethods_is_a_retry(void)
{
  expect_retry("error(setmetatable({}, { __index = function() error('from __index') end }))",
               CAUSE_ERROR, "(error object is a table value)");
  expect_retry("error(setmetatable({}, { __name = 'thing', __index = function() error() end,"
               " __len = function() error() end, __eq = function() error() end }))",
               CAUSE_ERROR, "(error object is a table value)");
  /* a __tostring metafield reached through the metatable's own __index is not one */
  expect_retry("error(setmetatable({}, setmetatable({}, { __index = function() error('mt index') end })))",
               CAUSE_ERROR, "(error object is a table value)");
  expect_retry("error()", CAUSE_ERROR, "(error object is a nil value)");
  expect_retry("error(nil)", CAUSE_ERROR, "(error object is a nil value)");
  expect_retry("error(true)", CAUSE_ERROR, "(error object is a boolean value)");
  expect_retry("error(42)", CAUSE_ERROR, "42");
  expect_retry("error(coroutine.create(print))", CAUSE_ERROR, "(error object is a thread value)");
  /* without a memory cap, Lua's own stack limit ends it */
  struct limits uncapped = { 5, 0, 16u << 20 };
  struct task *t = run_body("local function f() return f() + 1 end return f()", uncapped);
  CHECK_INT_EQ(t->out.cause, CAUSE_ERROR);
  CHECK(strstr(t->out.error, "stack overflow"));
  task_free(t);
}

static void answers_with_metamethods_are_read_raw_or_refused(void)
{
  /* a plain table, whatever its metatable does, is a contract error */
  expect_retry("return setmetatable({}, { __index = function() error('i') end,"
               " __tostring = function() error('t') end, __name = 'x' })",
               CAUSE_CONTRACT, "handle returned a table");
  /* an outcome's fields changed by the script */
  expect_retry("local o = leash.retry('x'); o.message = setmetatable({}, { __tostring = "
               "function() error('t') end }); return o", CAUSE_RETURNED, "retry");
  expect_retry("local o = leash.retry('x'); o.kind = setmetatable({}, { __tostring = "
               "function() error('t') end }); return o", CAUSE_CONTRACT, "handle returned a table");
  expect_retry("local o = leash.ok(1); o.kind = 42; return o", CAUSE_CONTRACT,
               "handle returned a table");
  /* the outcome metatable cannot be replaced */
  expect_retry("local o = leash.ok(1); setmetatable(o, { __index = function() error('x') end }); return o",
               CAUSE_ERROR, "protected metatable");
  /* results are encoded raw: no __pairs, __index, __len or __tostring runs */
  expect_success("return leash.ok(setmetatable({ a = 1 }, { __pairs = function() error('p') end,"
                 " __index = function() error('i') end, __len = function() error('l') end,"
                 " __tostring = function() error('t') end }))", "{\"a\":1}");
  expect_success("return leash.ok(setmetatable({ 1, 2 }, { __index = function() error('i') end,"
                 " __newindex = function() error('n') end, __len = function() return 99 end }))",
                 "[1,2]");
  expect_success("local t = setmetatable({}, { __index = function(_, k) return k end }); "
                 "return leash.ok({ v = t })", "{\"v\":{}}");
  /* many return values */
  expect_success("return true, table.unpack((function() local t = {} for i = 1, 5000 do t[i] = i end return t end)())",
                 NULL);
}

/* Runs a trivial handle on payload under a 4 MB cap; returns the task (caller frees). */
static struct task *run_payload(const char *payload, int *broken)
{
  struct limits l = { 5, 4u << 20, 1u << 20 };
  struct script_host h = host(l);
  char err[1024];
  static const char text[] = "return function(task) return true end";
  struct script *s = script_load_text(FIXTURES "/inline.lua", text, strlen(text), &h, err,
                                      sizeof err);
  CHECK(s != NULL);
  struct task *t = new_task(payload);
  script_run(s, t);
  *broken = script_broken(s);
  script_free(s);
  return t;
}

/* n copies of item, comma-separated, inside [ ] (malloc'd). */
static char *json_array_of(const char *item, size_t n)
{
  size_t len = strlen(item);
  char *p = malloc(n * (len + 1) + 3), *q = p;
  *q++ = '[';
  for (size_t i = 0; i < n; i++) {
    if (i)
      *q++ = ',';
    memcpy(q, item, len);
    q += len;
  }
  *q++ = ']';
  *q = '\0';
  return p;
}

static void huge_payload_decode_out_of_memory_is_a_retry(void)
{
  int broken;
  /* 1,000,000 empty objects: 3 MB of text, at least 72 MB as Lua tables, about three times
     that in jansson: refused before jansson builds the tree */
  char *payload = json_array_of("{}", 1000000);
  double start = task_now();
  struct task *t = run_payload(payload, &broken);
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK_INT_EQ(t->out.cause, CAUSE_MEMORY);
  CHECK(strstr(t->out.error, "out of memory") && strstr(t->out.error, "task table"));
  CHECK(strstr(t->out.error, "the payload needs at least 68 MB"));
  CHECK(task_now() - start < 1.0);
  CHECK(!broken);   /* nothing was decoded: the state is as it was */
  task_free(t);
  free(payload);
  /* strings the estimate does not count: decoded, and refused by the cap inside Lua */
  char item[320];
  memset(item, 'a', sizeof item);
  item[0] = '"';
  item[sizeof item - 2] = '"';
  item[sizeof item - 1] = '\0';
  payload = json_array_of(item, 20000);
  for (size_t i = 0; i < 20000; i++)   /* distinct strings: none shared */
    snprintf(payload + 1 + i * sizeof item + 1, 8, "%06zu", i), payload[1 + i * sizeof item + 7] = 'a';
  t = run_payload(payload, &broken);
  CHECK_INT_EQ(t->out.cause, CAUSE_MEMORY);
  CHECK(strstr(t->out.error, "task table"));
  CHECK(broken);
  task_free(t);
  free(payload);
  /* what fits is not refused: 20,000 empty objects are 1.4 MB as Lua tables */
  payload = json_array_of("{}", 20000);
  t = run_payload(payload, &broken);
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  task_free(t);
  free(payload);
}

static void log_and_print_survive_hostile_tostring(void)
{
  /* the shared repro: a field key freed by the collector while __tostring runs */
  struct task *t = run_file("log_uaf.lua", "{}", plain);
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  task_free(t);
  /* the same with keys and values dropped and collected, and keys added mid-walk */
  expect_success(
      "local fields = {}\n"
      "local dropped = false\n"
      "local mt = { __tostring = function(self)\n"
      "  if dropped then return 'again' .. self.n end\n"
      "  dropped = true\n"
      "  for k in pairs(fields) do fields[k] = nil end\n"
      "  for i = 1, 100000 do local g = { i, tostring(i) .. string.rep('q', 40) } end\n"
      "  return string.rep('v', 70) .. self.n end }\n"
      "for i = 1, 10 do fields[string.rep('K', 50) .. i] = setmetatable({ n = i }, mt) end\n"
      "leash.log.warn('drop all', fields)\n"
      "return true", NULL);
  expect_success(
      "local fields = {}\n"
      "local mt = { __tostring = function(self)\n"
      "  for i = 1, 50 do fields['new' .. i .. string.rep('z', 40)] = i end\n"
      "  return 'v' end }\n"
      "for i = 1, 5 do fields[string.rep('K', 50) .. i] = setmetatable({}, mt) end\n"
      "leash.log.info('grow', fields)\n"
      "return true", NULL);
  expect_success(
      "local t = setmetatable({}, { __tostring = function() collectgarbage = nil; "
      "for i = 1, 50000 do local g = {} end return 'ok' end })\n"
      "print(t, string.rep('p', 100), t); return true", NULL);
  /* raising or non-string __tostring: the call raises, the task retries */
  expect_retry("leash.log.info('m', { k = setmetatable({}, { __tostring = function() error('in log') end }) })",
               CAUSE_ERROR, "in log");
  expect_retry("leash.log.error('m', { k = setmetatable({}, { __tostring = function() return {} end }) })",
               CAUSE_ERROR, "must return a string");
  expect_retry("print(setmetatable({}, { __tostring = function() error('in print') end }))",
               CAUSE_ERROR, "in print");
  /* more fields than a line holds, secrets, odd keys */
  expect_success("local f = { password = setmetatable({}, { __tostring = function() error('x') end }) }\n"
                 "for i = 1, 100 do f['k' .. i] = i end f[1] = 'x' f[true] = 'y'\n"
                 "leash.log.info('many', f) return true", NULL);
}

static void errors_crossing_coroutines_are_retries(void)
{
  expect_retry("coroutine.wrap(function() error('inside wrap') end)()", CAUSE_ERROR,
               "inside wrap");
  expect_retry("coroutine.wrap(function() error(setmetatable({}, { __tostring = "
               "function() error('x') end })) end)()", CAUSE_ERROR, "__tostring failed");
  expect_retry("local co = coroutine.wrap(function() coroutine.yield(1) error() end) co() co()",
               CAUSE_ERROR, "nil value");
  expect_retry("local ok, e = coroutine.resume(coroutine.create(function() error({}) end)) error(e)",
               CAUSE_ERROR, "(error object is a table value)");
}

static void yield_across_the_c_boundary_is_a_retry(void)
{
  expect_retry("coroutine.yield(1)", CAUSE_ERROR, "outside a coroutine");
  expect_retry("coroutine.wrap(function() table.sort({ 3, 2, 1 }, function(a, b) "
               "coroutine.yield() return a < b end) end)()", CAUSE_ERROR, "C-call boundary");
  expect_retry("coroutine.wrap(function() leash.log.info('m', { k = setmetatable({}, "
               "{ __tostring = function() coroutine.yield() return 'v' end }) }) end)()",
               CAUSE_ERROR, "C-call boundary");
  expect_retry("return false, setmetatable({}, { __tostring = function() coroutine.yield() end })",
               CAUSE_CONTRACT, "outside a coroutine");
}

static void nil_with_a_message_is_a_retry(void)
{
  expect_retry("return nil, 'upstream failed: 503'", CAUSE_RETURNED, "upstream failed: 503");
  expect_retry("return nil, 503", CAUSE_RETURNED, "503");
  expect_retry("return false", CAUSE_RETURNED, "handle returned false");
  expect_success("return nil", NULL);
  expect_success("return nil, nil", NULL);
  expect_success("return", NULL);
  expect_success("return true, 'ignored'", NULL);
}

static void bad_retry_delays_are_contract_errors(void)
{
  /* at the call: the script's line in the message */
  expect_retry("return leash.retry('x', 0/0)", CAUSE_ERROR, "delay must be a finite number");
  expect_retry("return leash.retry('x', math.huge)", CAUSE_ERROR, "inline.lua:3:");
  expect_retry("return leash.retry('x', -1)", CAUSE_ERROR, "delay must be a finite number");
  expect_retry("return leash.retry('x', '5')", CAUSE_ERROR, "number of seconds expected");
  /* set by hand afterwards: read with the outcome (the shared repro's modes) */
  static const char *const modes[] = { "{\"mode\":\"inf\"}", "{\"mode\":\"neg\"}",
                                       "{\"mode\":\"str\"}", NULL };
  for (const char *const *m = modes; *m; m++) {
    struct task *t = run_file("bigdelay.lua", *m, plain);
    CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
    CHECK_INT_EQ(t->out.cause, CAUSE_CONTRACT);
    CHECK(strstr(t->out.error, "retry delay must be a finite number"));
    CHECK(t->out.delay < 0);
    task_free(t);
  }
  expect_retry("local o = leash.retry('x'); o.delay = 0/0; return o", CAUSE_CONTRACT, "not NaN");
  expect_retry("local o = leash.retry('x'); o.delay = {}; return o", CAUSE_CONTRACT, "not a table");
}

static void delay_above_the_backoff_cap_is_cut_to_the_cap(void)
{
  struct task *t = run_file("bigdelay.lua", "{\"mode\":\"api\",\"d\":1e20}", plain);
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK_INT_EQ(t->out.cause, CAUSE_RETURNED);
  CHECK(t->out.delay == LIFECYCLE_BACKOFF_CAP_S);
  task_free(t);
  t = run_body("local o = leash.retry('x'); o.delay = 7200; return o", plain);
  CHECK(t->out.delay == LIFECYCLE_BACKOFF_CAP_S);
  task_free(t);
  t = run_body("return leash.retry('x', 0)", plain);
  CHECK(t->out.delay == 0);
  task_free(t);
  t = run_body("return leash.retry('x', 3599.5)", plain);
  CHECK(t->out.delay == 3599.5);
  task_free(t);
}

static void result_larger_than_the_limit_is_a_memory_retry(void)
{
  struct limits l = { 10, 16u << 20, 1u << 20 };
  /* the shared repro, scaled: one 100 KB string 600 times is 60 MB of JSON */
  double start = task_now();
  struct task *t = run_body("local s = string.rep('x', 100000) local t = {}\n"
                            "for i = 1, 600 do t[i] = s end return leash.ok(t)", l);
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK_INT_EQ(t->out.cause, CAUSE_MEMORY);
  CHECK(strstr(t->out.error, "--max-result-bytes"));
  CHECK(strstr(t->out.error, "1048576"));
  CHECK(task_now() - start < 2.0);
  task_free(t);
  /* text that grows when escaped: 300 KB of control bytes is 1.8 MB of JSON */
  t = run_body("return leash.ok({ s = string.rep('\\1', 300000) })", l);
  CHECK_INT_EQ(t->out.cause, CAUSE_MEMORY);
  task_free(t);
  /* many small keys */
  t = run_body("local t = {} for i = 1, 200000 do t['k' .. i] = i end return leash.ok(t)", l);
  CHECK_INT_EQ(t->out.cause, CAUSE_MEMORY);
  task_free(t);
  /* under the limit, unchanged */
  t = run_body("return leash.ok({ s = string.rep('x', 1000000) })", l);
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  CHECK_INT_EQ(strlen(t->out.result), 1000008);
  task_free(t);
}

static void every_encoding_obeys_the_result_limit(void)
{
  struct limits l = { 10, 16u << 20, 1u << 20 };
  struct task *t = run_body("local t = {} for i = 1, 100 do t[i] = string.rep('y', 20000) end\n"
                            "return leash.json.encode(t)", l);
  CHECK_INT_EQ(t->out.kind, OUTCOME_RETRY);
  CHECK_INT_EQ(t->out.cause, CAUSE_ERROR);
  CHECK(strstr(t->out.error, "json.encode") && strstr(t->out.error, "larger than the limit"));
  task_free(t);
  /* a script may catch it and go on */
  t = run_body("local ok = pcall(leash.json.encode, { string.rep('y', 2000000) })\n"
               "return leash.ok({ caught = not ok, small = leash.json.encode({ 1 }) })", l);
  CHECK_INT_EQ(t->out.kind, OUTCOME_SUCCESS);
  CHECK_STR_EQ(t->out.result, "{\"caught\":true,\"small\":\"[1]\"}");
  task_free(t);
}

/* A setup that fills the state to its cap and catches the error: whatever comes after it at
   load time (the handle's reference) and in the first task runs protected. */
static void setup_that_leaves_the_state_at_its_cap_is_not_a_panic(void)
{
  static const char text[] =
      "keep = {}\n"
      "return { setup = function()\n"
      "  pcall(function() while true do keep[#keep + 1] = {} end end)\n"
      "end, handle = function() return true end }\n";
  struct limits l = { 5, 2u << 20, 1u << 20 };
  for (int round = 0; round < 20; round++) {
    struct script_host h = host(l);
    char err[1024];
    struct script *s = script_load_text(FIXTURES "/inline.lua", text, strlen(text), &h, err,
                                        sizeof err);
    if (!s) {
      CHECK(strstr(err, "out of memory") || strstr(err, "not enough memory"));
      continue;
    }
    struct task *t = new_task("{}");
    script_run(s, t);
    CHECK(t->out.kind == OUTCOME_SUCCESS || t->out.cause == CAUSE_MEMORY);
    task_free(t);
    script_free(s);
    l.memory += 4096 * 3;   /* a slightly different cap: a different place to run out */
  }
}

int main(int argc, char **argv)
{
  static const struct check_case cases[] = {
    { "error_object_whose_tostring_raises_is_a_retry", error_object_whose_tostring_raises_is_a_retry },
    { "error_object_whose_tostring_returns_a_non_string_is_a_retry",
      error_object_whose_tostring_returns_a_non_string_is_a_retry },
    { "error_object_whose_tostring_loops_ends_by_the_task_timeout",
      error_object_whose_tostring_loops_ends_by_the_task_timeout },
    { "error_object_with_raising_metamethods_is_a_retry",
      error_object_with_raising_metamethods_is_a_retry },
    { "answers_with_metamethods_are_read_raw_or_refused",
      answers_with_metamethods_are_read_raw_or_refused },
    { "huge_payload_decode_out_of_memory_is_a_retry", huge_payload_decode_out_of_memory_is_a_retry },
    { "log_and_print_survive_hostile_tostring", log_and_print_survive_hostile_tostring },
    { "errors_crossing_coroutines_are_retries", errors_crossing_coroutines_are_retries },
    { "yield_across_the_c_boundary_is_a_retry", yield_across_the_c_boundary_is_a_retry },
    { "nil_with_a_message_is_a_retry", nil_with_a_message_is_a_retry },
    { "bad_retry_delays_are_contract_errors", bad_retry_delays_are_contract_errors },
    { "delay_above_the_backoff_cap_is_cut_to_the_cap", delay_above_the_backoff_cap_is_cut_to_the_cap },
    { "result_larger_than_the_limit_is_a_memory_retry", result_larger_than_the_limit_is_a_memory_retry },
    { "every_encoding_obeys_the_result_limit", every_encoding_obeys_the_result_limit },
    { "setup_that_leaves_the_state_at_its_cap_is_not_a_panic",
      setup_that_leaves_the_state_at_its_cap_is_not_a_panic },
    { NULL, NULL },
  };
  return check_main(cases, argc, argv);
}
