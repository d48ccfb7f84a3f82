#!/usr/bin/env bash
# leash.env and --env-allow: a script reads only the variables the operator allowed, and
# their values never reach a log line, a task's last_error or a metric (docs/SECURITY.md,
# "Secrets"). Results are the script's data and are stored as it made them.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/run_common.sh"

ENVFIX=$LEASH_SRC/tests/fixtures/env
KEY=sk-test-LEAKED-0123456789abcdef
QUOTED='pa"ss\word-LEAKED-42'

# http_get PORT PATH: the body of a GET (bash /dev/tcp: no HTTP client needed).
http_get() {
  local line body=0
  exec 7<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&7
  while IFS= read -r line <&7; do
    line=${line%$'\r'}
    if ((body)); then echo "$line"; elif [[ -z $line ]]; then body=1; fi
  done
  exec 7<&-
}

# enqueue_names NAME...: one read.lua task per name, in order, one attempt each.
enqueue_names() {
  local n
  for n in "$@"; do printf '{"payload":{"name":"%s"},"max_attempts":1}\n' "$n"; done >"$T_TMP/names.jsonl"
  enqueue_file "$T_TMP/names.jsonl" $#
}

# result_of NAME: what read.lua stored for that name, as compact JSON.
result_of() { q "select result - 'name' from agent_work_queue where payload->>'name' = '$1'"; }

case_env_returns_allowed_values_nil_for_unset_and_raises_for_the_rest() {
  run_setup
  enqueue_names LEASH_T_ONE LEASH_T_TWO LEASH_T_UNSET LEASH_T_DENIED HOME PATH "" "lower_case"
  LEASH_T_ONE=first-value LEASH_T_TWO="second value with spaces" LEASH_T_DENIED=nope \
    expect_exit 0 "$LEASH" run "$ENVFIX/read.lua" --until-empty --concurrency 2 \
      --env-allow LEASH_T_ONE,LEASH_T_UNSET --env-allow LEASH_T_TWO
  assert_eq "allowed" "$(result_of LEASH_T_ONE)" '{"ok": true, "value": "first-value", "getenv": "absent"}'
  assert_eq "second --env-allow adds to the list" "$(result_of LEASH_T_TWO)" \
    '{"ok": true, "value": "second value with spaces", "getenv": "absent"}'
  assert_eq "allowed but unset is nil" "$(result_of LEASH_T_UNSET)" '{"ok": true, "value": null, "getenv": "absent"}'
  assert_contains "the start names the unset one" "$(<"$T_ERR")" \
    "--env-allow: not set in the environment (leash.env returns nil): LEASH_T_UNSET"
  local n
  for n in LEASH_T_DENIED HOME PATH "" lower_case; do
    assert_eq "$n refused" "$(q "select result->>'ok' from agent_work_queue where payload->>'name' = '$n'")" false
    assert_contains "$n: the error names it and the flag" \
      "$(q "select result->'value'->>'error' from agent_work_queue where payload->>'name' = '$n'")" \
      "leash.env: '$n' is not allowed (the worker allows only the names given with --env-allow)"
  done
  assert_not_contains "a refused value is never read" "$(q "select string_agg(result::text, ' ') from agent_work_queue")" nope
  # Without the flag nothing is allowed, also not a name that is set.
  q "update agent_work_queue set status = 'pending', attempts = 0, result = null, run_after = now()" >/dev/null
  LEASH_T_ONE=first-value expect_exit 0 "$LEASH" run "$ENVFIX/read.lua" --until-empty --concurrency 2
  assert_eq "nothing allowed without --env-allow" \
    "$(q "select count(*) from agent_work_queue where result->>'ok' = 'false'")" 8
}

case_bad_env_allow_names_exit_2_with_one_line() {
  local bad
  for bad in "" "," "A," "9LIVES" "A-B" "A B" "A=B" "KEY;rm" $'A\nB'; do
    expect_exit 2 "$LEASH" run "$ENVFIX/read.lua" --env-allow "$bad"
    assert_contains "names the flag ($bad)" "$(head -1 "$T_ERR")" "leash run: --env-allow:"
    assert_eq "one line and the hint ($bad)" "$(wc -l <"$T_ERR")" 2
    expect_exit 2 "$LEASH" check --env-allow "$bad" "$ENVFIX/read.lua"
  done
  local many
  many=$(seq -f 'V%g' 1 65 | paste -sd,)
  expect_exit 2 "$LEASH" run "$ENVFIX/read.lua" --env-allow "$many"
  assert_contains "a bound on the names" "$(<"$T_ERR")" "at most 64 names"
}

# modes of leaks.lua, each its own task
LEAK_MODES=(error error_at_level_0 retry fatal nil_message false_message json_error error_object
            step coroutine log long)

enqueue_leaks() {
  local m
  for m in "${LEAK_MODES[@]}"; do printf '{"payload":{"mode":"%s"},"max_attempts":1}\n' "$m"; done \
    >"$T_TMP/leaks.jsonl"
  enqueue_file "$T_TMP/leaks.jsonl" ${#LEAK_MODES[@]}
}

# assert_clean WHAT TEXT: no piece of either value in TEXT.
assert_clean() {
  assert_not_contains "$1: the key" "$2" "LEAKED"
  assert_not_contains "$1: the start of the key" "$2" "sk-test"
  assert_not_contains "$1: a piece of the key" "$2" "0123456789"
  assert_not_contains "$1: a piece of the quoted value" "$2" 'ss\\word'
}

case_allowed_values_never_reach_last_error_logs_or_metrics() {
  run_setup
  enqueue_leaks
  local port
  port=$(free_port)
  LEASH_TEST_KEY=$KEY LEASH_TEST_QUOTED=$QUOTED start_worker W "$ENVFIX/leaks.lua" \
    --env-allow LEASH_TEST_KEY,LEASH_TEST_QUOTED --concurrency 3 --poll-ms 20-50 \
    --metrics "127.0.0.1:$port" --log-level debug
  wait_for "every leak task to be dead" 60 \
    q_true "select count(*) = ${#LEAK_MODES[@]} from agent_work_queue where status = 'dead'"
  local metrics
  metrics=$(http_get "$port" /metrics)
  assert_contains "the metrics were read" "$metrics" "leash_tasks_dead_total"
  kill -TERM "${W_PID[W]}"
  assert_worker_exit W 60 0
  local errors log
  errors=$(q "select string_agg(payload->>'mode' || ': ' || last_error, E'\n' order by id) from agent_work_queue")
  log=$(worker_log W)
  assert_clean "last_error" "$errors"
  assert_clean "the log" "$log"
  assert_clean "the metrics" "$metrics"
  assert_clean "report" "$("$LEASH" report 2>&1)"
  # Each variant did fail with its message, the value marked where it was.
  local m
  for m in "${LEAK_MODES[@]}"; do
    assert_contains "$m: redacted in last_error" \
      "$(q "select last_error from agent_work_queue where payload->>'mode' = '$m'")" "[redacted]"
  done
  assert_contains "error()" "$errors" "error: /"
  assert_contains "error() text" "$errors" "calling the model with key [redacted]"
  assert_contains "leash.retry" "$errors" "retry: provider refused [redacted]"
  assert_contains "leash.fatal" "$errors" "fatal: bad key: [redacted]"
  assert_contains "nil, msg" "$errors" "nil_message: key was [redacted]"
  assert_contains "false, msg" "$errors" "false_message: [redacted] at the start"
  assert_contains "JSON-escaped form" "$errors" '"q":"[redacted]"'
  assert_contains "__tostring" "$errors" "object says [redacted]"
  assert_contains "a step" "$errors" "inside a step [redacted]"
  assert_contains "a coroutine" "$errors" "inside a coroutine [redacted]"
  assert_contains "at the 8 KB cut" "$errors" "eeee[redac"
  assert_contains "a log message" "$log" "log message [redacted]"
  assert_contains "log fields" "$log" "nested=x[redacted]y"
  assert_contains "a field's name" "$log" "by_[redacted]=named"
  assert_contains "print" "$log" 'printed\t[redacted]'
}

case_json_log_lines_are_redacted_too() {
  run_setup
  enqueue_leaks
  LEASH_TEST_KEY=$KEY LEASH_TEST_QUOTED=$QUOTED expect_exit 0 "$LEASH" --log-format json \
    run "$ENVFIX/leaks.lua" --env-allow LEASH_TEST_KEY,LEASH_TEST_QUOTED --until-empty --concurrency 2
  assert_clean "json log" "$(<"$T_ERR")"
  assert_contains "json log fields" "$(<"$T_ERR")" '"nested":"x[redacted]y"'
  assert_eq "every line is JSON" "$(python3 -c 'import json, sys
n = 0
for line in open(sys.argv[1]):
    json.loads(line); n += 1
print(n > 0)' "$T_ERR")" True
}

# The choice docs/SECURITY.md records: a result is data the script stores on purpose (like
# a db.query write or a child payload), so it is stored exactly as made, never rewritten.
case_results_are_stored_as_the_script_made_them() {
  run_setup
  enqueue_names LEASH_TEST_KEY
  LEASH_TEST_KEY=$KEY expect_exit 0 "$LEASH" run "$ENVFIX/read.lua" --until-empty \
    --env-allow LEASH_TEST_KEY
  assert_eq "the result holds the value" "$(q "select result->>'value' from agent_work_queue")" "$KEY"
}

case_short_values_are_returned_and_the_start_warns_they_are_not_redacted() {
  run_setup
  expect_exit 0 "$LEASH" enqueue --max-attempts 1 '{}'
  LEASH_TEST_SHORT=eu-1 expect_exit 0 "$LEASH" run "$ENVFIX/short.lua" --until-empty \
    --env-allow LEASH_TEST_SHORT
  assert_contains "the start warns, naming the variable" "$(<"$T_ERR")" \
    "--env-allow: values shorter than 8 bytes are not redacted from logs and errors: LEASH_TEST_SHORT"
  assert_contains "the short value is not redacted" "$(q "select last_error from agent_work_queue")" "region eu-1"
}

case_check_takes_env_allow_for_a_setup_that_reads_the_environment() {
  LEASH_TEST_KEY=$KEY expect_exit 1 "$LEASH" check "$ENVFIX/setup_reads.lua"
  assert_contains "not allowed without the flag" "$(<"$T_ERR")" "'LEASH_TEST_KEY' is not allowed"
  LEASH_TEST_KEY=$KEY expect_exit 0 "$LEASH" check --env-allow LEASH_TEST_KEY "$ENVFIX/setup_reads.lua"
  assert_contains "fit to run" "$(<"$T_OUT")" ": ok (version"
  # A load error that quotes the value is redacted on check's stderr too.
  printf 'local leash = require "leash"\nerror("bad key " .. leash.env("LEASH_TEST_KEY"))\n' >"$T_TMP/loud.lua"
  LEASH_TEST_KEY=$KEY expect_exit 1 "$LEASH" check --env-allow LEASH_TEST_KEY "$T_TMP/loud.lua"
  assert_contains "the load error" "$(<"$T_ERR")" "bad key [redacted]"
  assert_clean "check's stderr" "$(<"$T_ERR")"
  LEASH_TEST_KEY=$KEY expect_exit 1 "$LEASH" run --env-allow LEASH_TEST_KEY "$T_TMP/loud.lua"
  assert_clean "run's start failure" "$(<"$T_ERR")"
  assert_contains "run's start failure names it" "$(<"$T_ERR")" "bad key [redacted]"
}

t_run "$@"
