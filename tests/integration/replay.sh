#!/usr/bin/env bash
# Replay (issue #16, item 5; README "Replay"): `leash replay NEW.lua --batch B` runs the
# latest recording of each task of a batch through another script, offline, and reports
# what would have changed. Every case records a batch with `--record all` against the mock
# LLM, then stops the mock and drops the table the script reads before it replays: a replay
# that used the network or the database for the script's calls would fail.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/run_common.sh"
source "$(dirname "$0")/mock_common.sh"

GRADE=$LEASH_SRC/tests/fixtures/replay/grade.lua
export REPLAY_KEY=sk-replay-LEAKED-0123456789abcdef

# record_batch N [CONCURRENCY]: a fresh database, N tasks of batch "nightly" graded through
# the mock with --record all (every 7th asks for a malformed answer: it ends fatal), then
# the mock stopped and replay_weights dropped. The recording run's seconds in $REC_S.
record_batch() {
  local n=$1 conc=${2:-4} t0
  run_setup
  q "create table replay_weights (n int primary key, weight int not null);
     insert into replay_weights select n, n * 10 from generate_series(1, $n) n"
  start_mock
  MOCK_PID=$!
  python3 - "$MOCK" "$n" >"$T_TMP/jobs.jsonl" <<'PY'
import json, sys
url, n = sys.argv[1], int(sys.argv[2])
for i in range(1, n + 1):
    marker = " [mock:malformed]" if i % 7 == 0 else ""
    print(json.dumps({"payload": {"url": url, "n": i, "marker": marker},
                      "batch": "nightly", "max_attempts": 1}))
PY
  enqueue_file "$T_TMP/jobs.jsonl" "$n"
  t0=$(_t_now_us)
  timeout --foreground 240 "$LEASH" run "$GRADE" --until-empty --concurrency "$conc" \
    --record all --env-allow REPLAY_KEY >"$T_TMP/run.out" 2>"$T_TMP/run.log" || {
    _t_tail "worker log" "$T_TMP/run.log" >&2
    fail "the recording run failed"
  }
  REC_S=$(( ($(_t_now_us) - t0) / 1000 ))
  REC_S=$((REC_S / 1000)).$(printf '%03d' $((REC_S % 1000)))
  assert_eq "every task recorded once" \
    "$(q "select count(*), count(distinct task_id) from agent_work_queue_recordings")" "$n|$n"
  t_kill "$MOCK_PID"
  q "drop table replay_weights"
}

# variant_of SCRIPT NAME SED...: SCRIPT with the sed edits applied, as $T_TMP/NAME.lua.
variant_of() {
  local script=$1 name=$2
  shift 2
  sed "$@" "$script" >"$T_TMP/$name.lua"
  cmp -s "$script" "$T_TMP/$name.lua" && fail "variant $name: the edit changed nothing"
  printf '%s\n' "$T_TMP/$name.lua"
}

# variant NAME SED...: the grade script with the edits.
variant() { variant_of "$GRADE" "$@"; }

# ids_of CHANGE: the ids (comma-separated, ascending) the --json report in $T_OUT lists
# with that change ("ok -> fatal", "result", "divergence"; an outcome change by its kinds).
ids_of() {
  python3 - "$1" "$T_OUT" <<'PY'
import json, sys
want, path = sys.argv[1], sys.argv[2]
o = json.load(open(path))
ids = []
for t in o["tasks"]:
    key = t["change"]
    if key == "outcome":
        key = t["from"]["kind"] + " -> " + t["to"]["kind"]
    if key == want:
        ids.append(t["id"])
print(",".join(str(i) for i in sorted(ids)))
PY
}

# field KEY: a top-level number of the --json report in $T_OUT.
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[2]))[sys.argv[1]])' "$1" "$T_OUT"; }

case_a_replay_with_the_same_script_reproduces_every_outcome_and_result_offline() {
  record_batch 60
  assert_eq "the batch has both outcomes" \
    "$(q "select string_agg(distinct status, ',') from agent_work_queue")" "dead,done"
  expect_exit 0 "$LEASH" replay "$GRADE" --batch nightly --env-allow REPLAY_KEY --jobs 2
  assert_eq "one line, the totals" "$(wc -l <"$T_OUT")" 1
  assert_contains "totals" "$(<"$T_OUT")" "replayed 60 tasks of batch nightly in "
  assert_contains "nothing changed" "$(<"$T_OUT")" ": 60 same, 0 changed, 0 divergent, 0 skipped without a recording"
  expect_exit 0 "$LEASH" replay "$GRADE" --batch nightly --env-allow REPLAY_KEY --json
  assert_eq "json: replayed" "$(field replayed)" 60
  assert_eq "json: same" "$(field same)" 60
  assert_eq "json: changed" "$(field changed)" 0
  assert_eq "json: no task listed" "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["tasks"]))' "$T_OUT")" 0
  # One job and eight give the same answer.
  expect_exit 0 "$LEASH" replay "$GRADE" --batch nightly --env-allow REPLAY_KEY --jobs 8 --json
  assert_eq "eight jobs: same" "$(field same)" 60
}

case_a_changed_script_reports_exactly_the_tasks_whose_outcome_or_result_changed() {
  record_batch 60
  # A new prompt (the same call with another body), grade 1 now rejected, an unparsable
  # answer now a retry, and a field added to grade 5's result.
  local v2
  v2=$(variant v2 \
    -e 's/"grade this ticket " .. p.n/"grade this ticket, strictly: " .. p.n/' \
    -e 's/return leash.fatal("the answer is not JSON")/return nil, "the answer is not JSON"/' \
    -e 's/  -- edit:reject/  if g == 1 then return leash.fatal("grade 1 rejected") end/' \
    -e 's/return leash.ok { grade = g, weight = rows\[1\].weight }/return leash.ok { grade = g, weight = rows[1].weight, top = g == 5 or nil }/')
  expect_exit 0 "$LEASH" replay "$v2" --batch nightly --env-allow REPLAY_KEY --json
  local want_rejected want_retry want_result
  want_rejected=$(q "select string_agg(id::text, ',' order by id) from agent_work_queue where result->>'grade' = '1'")
  want_retry=$(q "select string_agg(id::text, ',' order by id) from agent_work_queue where status = 'dead'")
  want_result=$(q "select string_agg(id::text, ',' order by id) from agent_work_queue where result->>'grade' = '5'")
  [[ -n $want_rejected && -n $want_retry && -n $want_result ]] || fail "the batch lacks a grade 1, a grade 5 or a dead task"
  assert_eq "ok -> fatal: the grade-1 tasks" "$(ids_of "ok -> fatal")" "$want_rejected"
  assert_eq "fatal -> retry: the malformed answers (every 7th)" "$(ids_of "fatal -> retry")" "$want_retry"
  assert_eq "the malformed ones are every 7th" "$want_retry" "$(seq -s, 7 7 60)"
  assert_eq "result: the grade-5 tasks" "$(ids_of result)" "$want_result"
  local n_changed
  n_changed=$(( $(tr ',' '\n' <<<"$want_rejected,$want_retry,$want_result" | wc -l) ))
  assert_eq "changed: those and no other" "$(field changed)" "$n_changed"
  assert_eq "same: the rest" "$(field same)" $((60 - n_changed))
  assert_eq "no divergence: the prompt change is the same call" "$(field divergent)" 0
  # The text report: one line per changed task, then the totals.
  expect_exit 0 "$LEASH" replay "$v2" --batch nightly --env-allow REPLAY_KEY
  assert_eq "lines" "$(wc -l <"$T_OUT")" $((n_changed + 1))
  local first_rejected=${want_rejected%%,*} first_result=${want_result%%,*}
  assert_contains "an outcome line" "$(<"$T_OUT")" "task $first_rejected: ok -> fatal (returned: grade 1 rejected)"
  assert_contains "a retry line" "$(<"$T_OUT")" "task 7: fatal -> retry (returned: the answer is not JSON)"
  assert_contains "a result line" "$(<"$T_OUT")" "task $first_result: result {\"grade\":5,\"weight\":$((first_result * 10))} -> {\"grade\":5,\"top\":true,\"weight\":$((first_result * 10))}"
  assert_contains "totals by change" "$(tail -1 "$T_OUT")" "$n_changed changed ("
}

case_a_script_that_makes_an_extra_http_call_reports_divergence_for_those_tasks() {
  record_batch 40
  local v3
  v3=$(variant v3 -e 's|  -- edit:extra|  if p.n % 4 == 0 then leash.http.request { url = p.url .. "/v1/models" } end|')
  expect_exit 0 "$LEASH" replay "$v3" --batch nightly --env-allow REPLAY_KEY --json
  assert_eq "divergent: every 4th" "$(ids_of divergence)" "$(seq -s, 4 4 40)"
  assert_eq "divergent count" "$(field divergent)" 10
  assert_eq "the rest the same" "$(field same)" 30
  assert_eq "no change counted" "$(field changed)" 0
  expect_exit 0 "$LEASH" replay "$v3" --batch nightly --env-allow REPLAY_KEY
  assert_contains "names the request" "$(<"$T_OUT")" "task 8: divergence: leash.http.request: GET $MOCK/v1/models is not in the recording"
  # A pcall around the call cannot swallow it: the replay of the task still ends there.
  local v4
  v4=$(variant v4 -e 's|  -- edit:extra|  if p.n % 4 == 0 then pcall(leash.http.request, { url = p.url .. "/v1/models" }) end|')
  expect_exit 0 "$LEASH" replay "$v4" --batch nightly --env-allow REPLAY_KEY --json
  assert_eq "pcall: still divergent" "$(ids_of divergence)" "$(seq -s, 4 4 40)"
  # A second statement is not in the recording either.
  local v5
  v5=$(variant v5 -e 's|  -- edit:extra|  if p.n == 3 then leash.db.query("SELECT 1") end|')
  expect_exit 0 "$LEASH" replay "$v5" --batch nightly --env-allow REPLAY_KEY
  assert_contains "a statement" "$(<"$T_OUT")" "task 3: divergence: leash.db.query: the statement is not in the recording: SELECT 1"
}

STEPS=$LEASH_SRC/tests/fixtures/replay/steps.lua

# record_steps: a fresh database, three tasks of batch "nightly" (and their six children)
# run by steps.lua with --record all: one process, no HTTP.
record_steps() {
  run_setup
  printf '{"payload":{"n":%d},"batch":"nightly","max_attempts":3}\n' 1 2 3 >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 3
  timeout --foreground 120 "$LEASH" run "$STEPS" --until-empty --concurrency 1 --record all \
    >"$T_TMP/run.out" 2>"$T_TMP/run.log" || fail "the recording run failed"
}

case_a_step_stored_by_an_earlier_attempt_is_given_back_and_a_child_gets_its_recorded_id() {
  local steps=$STEPS
  record_steps
  assert_eq "three parents, six children, all done" \
    "$(q "select count(*) filter (where status = 'done') from agent_work_queue")" 9
  assert_eq "the parents' latest recordings are of attempt 2, the step cached" \
    "$(q "select string_agg(distinct (r.attempt || ' ' || (e->>'cached')), ',') from agent_work_queue_recordings r, jsonb_array_elements(r.body->'events') e where r.attempt = 2 and e->>'type' = 'step'")" "2 true"
  expect_exit 0 "$LEASH" replay "$steps" --batch nightly --json
  assert_eq "replayed: parents and children" "$(field replayed)" 9
  assert_eq "the same: the step given back (not run again), each child's recorded id" "$(field same)" 9
  # Two children where the recording has one: the second is a divergence.
  local more
  more=$(variant_of "$steps" more -e 's|  -- edit:more|  leash.enqueue { payload = { noop = true } }|')
  expect_exit 0 "$LEASH" replay "$more" --batch nightly
  assert_contains "a child not recorded" "$(<"$T_OUT")" "task 1: divergence: leash.enqueue: a child task the recording does not hold"
  assert_contains "the parents only" "$(tail -1 "$T_OUT")" "6 same, 0 changed, 3 divergent"
}

case_bad_input_is_refused_with_one_line_and_exit_2() {
  record_steps
  echo 'return function( end' >"$T_TMP/syntax.lua"
  echo 'return 42' >"$T_TMP/contract.lua"
  printf '{"payload":{"n":1},"batch":"unrecorded"}\n' >"$T_TMP/unrecorded.jsonl"
  enqueue_file "$T_TMP/unrecorded.jsonl" 1
  # Bad data: one line. A usage mistake: its line, then the --help hint (as every command).
  local what kind args
  while IFS='|' read -r what kind args; do
    # shellcheck disable=SC2086
    expect_exit 2 "$LEASH" replay $args
    assert_contains "$what: names the command" "$(head -1 "$T_ERR")" "leash replay: "
    if [[ $kind == data ]]; then
      assert_eq "$what: one line" "$(wc -l <"$T_ERR")" 1
    else
      assert_eq "$what: its line and the hint" "$(sed -n 2p "$T_ERR")$(wc -l <"$T_ERR")" "Try 'leash replay --help'.2"
    fi
    [[ -s $T_OUT ]] && fail "$what: printed a report"
  done <<EOF2
no such script|data|$T_TMP/missing.lua --batch nightly
a folder|data|$T_TMP --batch nightly
a syntax error|data|$T_TMP/syntax.lua --batch nightly
no handle|data|$T_TMP/contract.lua --batch nightly
a batch with no tasks|data|$GRADE --batch nosuch
a batch without recordings|data|$GRADE --batch unrecorded
no --batch|usage|$GRADE
no script|usage|--batch nightly
two scripts|usage|$GRADE $GRADE --batch nightly
--jobs 0|usage|$GRADE --batch nightly --jobs 0
--jobs not a number|usage|$GRADE --batch nightly --jobs many
--jobs too many|usage|$GRADE --batch nightly --jobs 65
a bad --env-allow name|usage|$GRADE --batch nightly --env-allow 1BAD
EOF2
  expect_exit 2 "$LEASH" replay "$GRADE" --batch unrecorded
  assert_contains "names the batch" "$(<"$T_ERR")" "batch 'unrecorded': no recordings among its 1 task ("
  assert_contains "says how to record" "$(<"$T_ERR")" "(record it with \`leash run --record all\`)"
}

case_no_env_allow_value_appears_in_what_a_replay_prints() {
  record_batch 14
  [[ $(q "select count(*) from agent_work_queue_recordings where body::text like '%LEAKED%'") == 0 ]] \
    || fail "a recording holds the key (record.c's redaction)"
  # The key in an error, in a result and in a URL that diverges.
  local leaky
  leaky=$(variant leaky \
    -e 's/  -- edit:reject/  if g == 1 then return leash.fatal("rejected with key " .. leash.env("REPLAY_KEY")) end/' \
    -e 's/return leash.ok { grade = g, weight = rows\[1\].weight }/return leash.ok { grade = g, weight = rows[1].weight, key = g == 5 and leash.env("REPLAY_KEY") or nil, tag = "case-4242" }/' \
    -e 's|  -- edit:extra|  if p.n == 3 then leash.http.request { url = p.url .. "/v1/models?key=" .. leash.env("REPLAY_KEY") } end|')
  local out
  for out in "" --json; do
    # shellcheck disable=SC2086
    expect_exit 0 "$LEASH" replay "$leaky" --batch nightly --env-allow REPLAY_KEY \
      --record-redact 'case-[0-9]+' $out
    assert_not_contains "stdout $out" "$(<"$T_OUT")" "LEAKED"
    assert_not_contains "stderr $out" "$(<"$T_ERR")" "LEAKED"
    assert_not_contains "a --record-redact match $out" "$(<"$T_OUT")" "case-4242"
    assert_contains "the divergence is there, redacted $out" "$(<"$T_OUT")" "/v1/models?key=[redacted]"
  done
  assert_contains "the error, redacted" "$(<"$T_OUT")" "rejected with key [redacted]"
  expect_exit 0 "$LEASH" replay "$leaky" --batch nightly --env-allow REPLAY_KEY
  assert_contains "without the pattern the tag is data" "$(<"$T_OUT")" '"tag":"case-4242"'
  if q "select 1 from agent_work_queue where result->>'grade' = '5'" | grep -q 1; then
    assert_contains "the result, redacted" "$(<"$T_OUT")" '"key":"[redacted]"'
  fi
}

case_a_replay_of_3000_recorded_tasks_prints_its_time() {
  # 3,000 tasks when recording them takes under 60 s here; the number is printed, not judged.
  record_batch 3000 8
  echo "recorded 3000 tasks in ${REC_S}s"
  expect_exit 0 "$LEASH" replay "$GRADE" --batch nightly --env-allow REPLAY_KEY
  echo "replay: $(tail -1 "$T_OUT")"
  assert_contains "reproduces every one" "$(tail -1 "$T_OUT")" ": 3000 same, 0 changed, 0 divergent"
}

t_run "$@"
