#!/usr/bin/env bash
# Record and fixture (issue #16, items 3 and 4; README "Record and fixture"): `leash run
# --record` keeps what an execution did in <table>_recordings, redacted, within
# --record-max; `leash fixture ID` turns a dead task's recording into a busted spec that
# fails as the task failed and passes once the script is fixed. HTTP goes to the mock LLM
# (scripts/mock_llm.py) and to a loopback echo server; nothing leaves the machine.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/run_common.sh"

RFIX=$LEASH_SRC/tests/fixtures/record
KEY=sk-record-LEAKED-0123456789abcdef
BUSTED=(busted --lua=lua5.4 "--lpath=$LEASH_SRC/scripts/lib/?.lua")

# start_mock: the mock LLM on a free port; sets MOCK (its base URL).
start_mock() {
  python3 "$LEASH_SRC/scripts/mock_llm.py" --port 0 --idle-exit 120 \
    >"$T_TMP/mock.out" 2>"$T_TMP/mock.log" &
  MOCK_PID=$!
  t_on_exit t_kill "$MOCK_PID"
  wait_for "the mock LLM to print its port" 10 grep -q '^PORT [0-9]' "$T_TMP/mock.out"
  MOCK=http://127.0.0.1:$(sed -n '1s/^PORT //p' "$T_TMP/mock.out")
}

# start_echo: the echo server (tests/fixtures/record/echo_server.py); sets ECHO.
start_echo() {
  python3 "$RFIX/echo_server.py" 120 >"$T_TMP/echo.out" 2>"$T_TMP/echo.log" &
  t_on_exit t_kill "$!"
  wait_for "the echo server to print its port" 10 grep -q '^PORT [0-9]' "$T_TMP/echo.out"
  ECHO=http://127.0.0.1:$(sed -n '1s/^PORT //p' "$T_TMP/echo.out")
}

# grade_job PROMPT MAX_ATTEMPTS: one grade.lua task line.
grade_job() {
  printf '{"payload":{"url":"%s","prompt":"%s"},"max_attempts":%d}\n' "$MOCK" "$1" "$2"
}

# run_all SCRIPT [OPTIONS...]: one worker until the queue is empty; stderr in $T_TMP/run.log.
run_all() {
  local script=$1
  shift
  timeout --foreground 120 "$LEASH" run "$script" --until-empty --concurrency 2 \
    --backoff-cap 0 "$@" >"$T_TMP/run.out" 2>"$T_TMP/run.log" || {
    _t_tail "worker log" "$T_TMP/run.log" >&2
    fail "leash run $script $* failed"
  }
}

recordings() { q "select count(*) from agent_work_queue_recordings"; }

# ---------------------------------------------------------------- fixture

case_a_dead_tasks_fixture_fails_under_busted_as_recorded_and_passes_once_the_script_is_fixed() {
  run_setup
  start_mock
  grade_job "grade this [mock:bad-grade]" 1 >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 1
  run_all "$RFIX/grade.lua"
  assert_eq "the task is dead" "$(q "select status || ' ' || last_cause from agent_work_queue where id = 1")" "dead script_error"
  mkdir "$T_TMP/spec"
  expect_exit 0 "$LEASH" fixture 1 --out "$T_TMP/spec"
  assert_eq "fixture prints the two files" "$(<"$T_OUT")" "$T_TMP/spec/1_spec.lua"$'\n'"$T_TMP/spec/1_fixture.json"
  # Offline: the mock is stopped before the spec runs, so only the fixture can answer.
  t_kill "$MOCK_PID"
  expect_exit 1 "${BUSTED[@]}" "$T_TMP/spec/1_spec.lua"
  assert_contains "busted names the recorded failure" "$(<"$T_OUT")" \
    "task 1 ended as recorded: dead (script_error): grade 9 out of range"
  assert_contains "one test, failed" "$(<"$T_OUT")" "0 successes / 1 failure / 0 errors"
  LEASH_FIXTURE_SCRIPT=$RFIX/grade_fixed.lua expect_exit 0 "${BUSTED[@]}" "$T_TMP/spec/1_spec.lua"
  assert_contains "the fixed script passes" "$(<"$T_OUT")" "1 success / 0 failures / 0 errors"
  # Run from another folder, the spec still finds its fixture next to it.
  (cd / && LEASH_FIXTURE_SCRIPT=$RFIX/grade_fixed.lua "${BUSTED[@]}" "$T_TMP/spec/1_spec.lua" >/dev/null) ||
    fail "the spec depends on the folder it is run from"
}

case_a_request_the_recording_does_not_hold_is_reported_as_not_in_the_recording() {
  run_setup
  start_mock
  grade_job "grade this [mock:bad-grade]" 1 >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 1
  run_all "$RFIX/grade.lua"
  expect_exit 0 "$LEASH" fixture 1 --out "$T_TMP"
  # A "fix" that calls another endpoint diverges from the recording: the spec says so.
  sed 's#/v1/chat/completions#/v1/other#' "$RFIX/grade_fixed.lua" >"$T_TMP/diverged.lua"
  sed -i 's/method = "POST"/method = "PUT"/' "$T_TMP/diverged.lua"
  LEASH_FIXTURE_SCRIPT=$T_TMP/diverged.lua expect_exit 1 "${BUSTED[@]}" "$T_TMP/1_spec.lua"
  assert_contains "the divergence is named" "$(<"$T_OUT")" "/v1/other is not in the recording"
}

case_a_step_stored_by_an_earlier_attempt_is_given_back_in_the_replay_not_run() {
  run_setup
  start_mock
  grade_job "grade this [mock:bad-grade]" 2 >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 1
  run_all "$RFIX/step.lua"
  assert_eq "dead on attempt 2" "$(q "select status || ' ' || attempts from agent_work_queue")" "dead 2"
  assert_eq "the recording: one cached step, no exchange" \
    "$(q "select string_agg(e->>'type' || ':' || (e->>'cached'), ',') from agent_work_queue_recordings,
            jsonb_array_elements(body->'events') e")" "step:true"
  expect_exit 0 "$LEASH" fixture 1 --out "$T_TMP"
  t_kill "$MOCK_PID"
  # Had the replay run the step, its request would not be in the recording.
  expect_exit 1 "${BUSTED[@]}" "$T_TMP/1_spec.lua"
  assert_contains "fails as recorded" "$(<"$T_OUT")" "ended as recorded: dead (script_error): grade 9 out of range"
  sed 's/  if grade > 5 then error("grade " .. grade .. " out of range") end/  grade = math.min(grade, 5)/' \
    "$RFIX/step.lua" >"$T_TMP/step_fixed.lua"
  LEASH_FIXTURE_SCRIPT=$T_TMP/step_fixed.lua expect_exit 0 "${BUSTED[@]}" "$T_TMP/1_spec.lua"
}

case_a_fixture_of_a_task_that_did_not_die_checks_that_its_outcome_still_holds() {
  run_setup
  start_mock
  grade_job "grade this ticket" 1 >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 1
  run_all "$RFIX/grade.lua" --record all
  assert_eq "done" "$(q "select status from agent_work_queue")" "done"
  expect_exit 0 "$LEASH" fixture 1 --out "$T_TMP"
  t_kill "$MOCK_PID"
  expect_exit 0 "${BUSTED[@]}" "$T_TMP/1_spec.lua"
  # A change that breaks it is caught: the recorded outcome no longer holds.
  sed 's/  return leash.ok { grade = grade, n = rows\[1\].n }/  return leash.fatal("broken")/' \
    "$RFIX/grade.lua" >"$T_TMP/broken.lua"
  LEASH_FIXTURE_SCRIPT=$T_TMP/broken.lua expect_exit 1 "${BUSTED[@]}" "$T_TMP/1_spec.lua"
  assert_contains "names the change" "$(<"$T_OUT")" "Expected objects to be equal"
}

# ---------------------------------------------------------------- policy

case_record_none_keeps_nothing_dead_keeps_the_last_execution_of_dead_tasks_all_keeps_every_one() {
  local policy
  start_mock
  for policy in none dead all; do
    run_setup "$policy"
    {
      grade_job "grade this ticket" 1             # done
      grade_job "grade this [mock:bad-grade]" 2   # a retry, then dead on attempt 2
    } >"$T_TMP/jobs.jsonl"
    enqueue_file "$T_TMP/jobs.jsonl" 2
    run_all "$RFIX/grade.lua" --record "$policy"
    assert_eq "$policy: statuses" "$(q "select string_agg(status, ',' order by id) from agent_work_queue")" "done,dead"
    local got
    got=$(q "select coalesce(string_agg(task_id || ':' || attempt || ':' || (body->'outcome'->>'status'), ','
                                         order by task_id, attempt), '')
               from agent_work_queue_recordings")
    case $policy in
      none) assert_eq "none: no recording" "$got" "" ;;
      dead) assert_eq "dead: the dead task's last execution only" "$got" "2:2:dead" ;;
      all) assert_eq "all: every settled execution" "$got" "1:1:done,2:1:retry,2:2:dead" ;;
    esac
  done
  # The stored rows name the execution: the script's version as leash check prints it, and
  # each execution's own lease token.
  local version
  version=$("$LEASH" check "$RFIX/grade.lua" | sed -n 's/.*(version \([0-9a-f]*\)).*/\1/p')
  assert_eq "version, tokens, sizes" \
    "$(q "select bool_and(version = '$version') and count(distinct lease_token) = 3
                 and bool_and(bytes > 0) and bool_and(not truncated)
            from agent_work_queue_recordings")" "t"
}

case_a_recording_past_record_max_stops_adding_and_is_marked_truncated() {
  run_setup
  start_echo
  cat >"$T_TMP/many.lua" <<'EOF'
local leash = require "leash"
return function(task)
  for i = 1, 40 do
    leash.http.request { url = task.payload.url .. "/call/" .. i, body = string.rep("x", 500) }
  end
  return leash.fatal("after 40 calls")
end
EOF
  printf '{"payload":{"url":"%s"},"max_attempts":1}\n{"payload":{"url":"%s","n":2},"max_attempts":1}\n' \
    "$ECHO" "$ECHO" >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 2
  run_all "$T_TMP/many.lua" --record-max 8KB --concurrency 1
  local calls bytes
  calls=$(q "select jsonb_array_length(body->'events') from agent_work_queue_recordings where task_id = 1")
  bytes=$(q "select bytes from agent_work_queue_recordings where task_id = 1")
  assert_eq "truncated" "$(q "select string_agg(truncated::text, ',' order by task_id) from agent_work_queue_recordings")" "true,true"
  ((calls >= 1 && calls < 40)) || fail "events kept under the cap: $calls"
  # The events stay within the cap; task, outcome and names come on top, a few hundred bytes.
  ((bytes <= 8192 + 2048)) || fail "bytes stored: $bytes"
  assert_eq "the outcome is kept" "$(q "select body->'outcome'->>'error' from agent_work_queue_recordings where task_id = 1")" "after 40 calls"
  expect_exit 0 "$LEASH" fixture 1 --out "$T_TMP"
  assert_contains "fixture of a cut recording says so" "$(<"$T_ERR")" "truncated at --record-max"
  # Under the default cap (1MB) the same task is kept whole.
  run_setup whole
  enqueue_file "$T_TMP/jobs.jsonl" 2
  run_all "$T_TMP/many.lua" --concurrency 1
  assert_eq "whole under 1MB" "$(q "select string_agg(truncated::text || ':' || jsonb_array_length(body->'events'), ',' order by task_id) from agent_work_queue_recordings")" "false:40,false:40"
  expect_exit 0 "$LEASH" fixture 1 --out "$T_TMP"
}

# ---------------------------------------------------------------- redaction

case_secrets_are_redacted_by_class_from_recordings_logs_fixtures_and_last_error() {
  run_setup
  start_echo
  printf '{"payload":{"url":"%s"},"max_attempts":1}\n' "$ECHO" >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 1
  RECORD_TEST_KEY=$KEY run_all "$RFIX/leaks.lua" --env-allow RECORD_TEST_KEY \
    --record-redact 'acct-[0-9]+' --record-redact 'never-matches-[0-9]{40}'
  assert_eq "the task is dead" "$(q "select status from agent_work_queue")" "dead"
  assert_eq "one recording" "$(recordings)" 1
  expect_exit 0 "$LEASH" fixture 1 --out "$T_TMP"
  local body last_error
  body=$(q "select body::text from agent_work_queue_recordings")
  last_error=$(q "select last_error from agent_work_queue")
  # Each credential header by name, whatever its case, in the request and the response.
  local h
  for h in Authorization Proxy-Authorization x-api-key API-Key Cookie; do
    assert_eq "request header $h" "$(q "select body->'events'->0->'headers'->>'$h' from agent_work_queue_recordings")" "[redacted]"
  done
  assert_eq "response Set-Cookie" "$(q "select body->'events'->0->'response'->'headers'->>'set-cookie' from agent_work_queue_recordings")" "[redacted]"
  # A header outside the list keeps its name, its secrets are redacted inside it.
  assert_eq "X-Echo" "$(q "select body->'events'->0->'headers'->>'X-Echo' from agent_work_queue_recordings")" "[redacted] [redacted]"
  assert_contains "the URL keeps its shape" "$body" '"http://[redacted]@127.0.0.1:'
  assert_contains "the URL keeps its query" "$body" '/echo?api_key=[redacted]&acct=[redacted]'
  assert_contains "db params" "$body" '"params": ["[redacted]", "[redacted]"]'
  # No secret anywhere: the env value (URL, header, body, db param and rows, error), the plain
  # header values (echoed back in the response body too) and the custom pattern's matches.
  local where text secret
  for where in recording fixture spec last_error log; do
    case $where in
      recording) text=$body ;;
      fixture) text=$(<"$T_TMP/1_fixture.json") ;;
      spec) text=$(<"$T_TMP/1_spec.lua") ;;
      last_error) text=$last_error ;;
      log) text=$(<"$T_TMP/run.log") ;;
    esac
    for secret in "$KEY" sk-record auth-plain-111111 proxy-plain-222222 xkey-plain-333333 \
      apikey-plain-444444 cookie-plain-555555 setcookie-plain-666666 userinfo-plain-777777; do
      assert_not_contains "$where holds no $secret" "$text" "$secret"
    done
    [[ $where == last_error || $where == log ]] && continue   # patterns are the recording's
    [[ ! $text =~ acct-[0-9] ]] || fail "$where holds an acct- number: ${BASH_REMATCH[0]}"
  done
  assert_contains "the error was kept, redacted" "$last_error" "[redacted]"
}

# ---------------------------------------------------------------- prune, bad input

case_prune_deletes_a_tasks_recordings_with_it() {
  run_setup
  start_mock
  grade_job "grade this [mock:bad-grade]" 1 >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 1
  run_all "$RFIX/grade.lua"
  assert_eq "recorded" "$(recordings)" 1
  expect_exit 0 "$LEASH" prune --status dead --older-than 0
  assert_eq "gone with its task" "$(recordings)" 0
}

case_bad_record_values_and_a_fixture_without_a_recording_are_refused_with_one_line() {
  run_setup
  local bad
  for bad in "--record sometimes" "--record DEAD" "--record-max 12" "--record-max -1" \
    "--record-max 2GB" "--record-redact (unclosed" "--record-redact a|"; do
    # shellcheck disable=SC2086 # the option and its value are two words
    expect_exit 2 "$LEASH" run "$RFIX/grade.lua" $bad
    assert_eq "$bad: error and hint" "$(wc -l <"$T_ERR")" 2
    [[ $(head -n1 "$T_ERR") == "leash run: --record"* ]] || fail "$bad: $(head -n1 "$T_ERR")"
  done
  assert_not_contains "the pattern is not echoed" "$(
    "$LEASH" run "$RFIX/grade.lua" --record-redact '(sk-secret' 2>&1 || true)" "sk-secret"
  expect_exit 2 env LEASH_RECORD=maybe "$LEASH" run "$RFIX/grade.lua"
  assert_contains "the variable is named" "$(<"$T_ERR")" "LEASH_RECORD"
  q "insert into agent_work_queue (payload) values ('{}')" >/dev/null
  expect_exit 2 "$LEASH" fixture 1 --out "$T_TMP"
  assert_eq "no recording: one line" "$(wc -l <"$T_ERR")" 1
  assert_contains "no recording" "$(<"$T_ERR")" "task 1 has no recording"
  expect_exit 2 "$LEASH" fixture 99 --out "$T_TMP"
  assert_eq "no task: one line" "$(<"$T_ERR")" "leash fixture: no task with id 99 in agent_work_queue"
  expect_exit 2 "$LEASH" fixture abc
  expect_exit 2 "$LEASH" fixture 1 --out ""
  # A folder that cannot be written: a runtime error, one line.
  q "insert into agent_work_queue_recordings (task_id, attempt, lease_token, version, bytes, body)
     values (1, 1, 1, 'v', 2, '{}')" >/dev/null
  expect_exit 1 "$LEASH" fixture 1 --out "$T_TMP/missing"
  assert_eq "unwritable: one line" "$(wc -l <"$T_ERR")" 1
  [[ ! -e $T_TMP/missing ]] || fail "the folder was made"
}

t_run "$@"
