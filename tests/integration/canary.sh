#!/usr/bin/env bash
# Canary roll-out (issue #16, item 2; sql/018_canary.sql, src/canary.c, src/cmd_canary.c,
# README "Nightly workflow"): a candidate stored in the database runs for a share of tasks on
# every `leash run`; one verdict for the fleet from the attempt history; a rollback gives the
# failed attempts back, a promotion moves every process to the candidate.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
CF=$LEASH_SRC/tests/fixtures/canary
A=agent_work_queue_attempts
C=agent_work_queue_canaries

version_of() { "$LEASH" check "$1" | sed -E 's/.*\(version ([0-9a-f]{64})\).*/\1/'; }

# tasks N PAYLOAD: N task lines with PAYLOAD, JSONL on stdout.
tasks() {
  local i
  for ((i = 0; i < $1; i++)); do printf '{"payload":%s}\n' "$2"; done
}

# start_fleet N SCRIPT [OPTIONS...]: workers W1..WN on SCRIPT, each with 2 slots.
start_fleet() {
  local n=$1 s=$2 i
  shift 2
  for ((i = 1; i <= n; i++)); do
    start_worker "W$i" "$s" --concurrency 2 --poll-ms 10-50 "$@"
  done
}

# all_logs_have N TEXT: every worker W1..WN logged TEXT.
all_logs_have() {
  local i
  for ((i = 1; i <= $1; i++)); do log_has "W$i" "$2" || return 1; done
}

# all_adopted N ID: every worker runs canary ID beside its version.
all_adopted() { all_logs_have "$1" "canary $2: "; }

# verdict_line W ID STATE: the part of W's decision line after "canary ID STATE by ".
verdict_line() {
  grep -oE "canary $2 $3 by .*" "$T_TMP/$1.log" | head -1
}

state_is() { [[ $(q "select state from $C order by id desc limit 1") == "$1" ]]; }
all_done() { [[ $(q "select count(*) from agent_work_queue where status <> 'done'") == 0 ]]; }

case_a_candidate_failing_30_percent_is_rolled_back_on_every_pod_within_100_tasks_and_none_die() {
  run_setup
  local cand
  cand=$(version_of "$CF/failing.lua")
  tasks 900 '{"sleep":0.1}' | "$LEASH" enqueue --file - >/dev/null || fail "enqueue failed"
  start_fleet 3 "$CF/current.lua"
  wait_for "the fleet to run" 60 q_true "select count(*) >= 30 from $A"
  expect_exit 0 "$LEASH" canary start "$CF/failing.lua" --share 30% --min-tasks 200
  assert_contains "start says what runs" "$(<"$T_OUT")" "canary 1 started: version $cand on 30% of tasks"
  wait_for "all three workers to run the candidate" 60 all_adopted 3 1
  wait_for "the verdict" 120 state_is rolled_back
  wait_for "all three workers to apply it" 60 all_logs_have 3 "canary 1 rolled_back by auto:"
  local v1 v2 v3
  v1=$(verdict_line W1 1 rolled_back) v2=$(verdict_line W2 1 rolled_back) v3=$(verdict_line W3 1 rolled_back)
  assert_contains "the verdict names the rate" "$v1" "rate"
  assert_eq "W2 logs the same verdict and numbers as W1" "$v2" "$v1"
  assert_eq "W3 logs the same verdict and numbers as W1" "$v3" "$v1"
  wait_for "every task to be done ($(status_counts))" 240 all_done
  local ran
  ran=$(q "select count(distinct task_id) from $A where version = '$cand'")
  ((ran > 0 && ran <= 100)) || fail "tasks that ran the candidate: $ran, want 1..100"
  assert_eq "no task is dead" "$(q "select count(*) from agent_work_queue where status = 'dead'")" 0
  assert_eq "every task the candidate failed ended done on the current version" \
    "$(q "select count(*) from agent_work_queue q
            where exists (select 1 from $A a where a.task_id = q.id and a.version = '$cand'
                                                and a.kind in ('retry', 'dead'))
              and not exists (select 1 from $A a where a.task_id = q.id and a.kind = 'done'
                                                   and a.version <> '$cand')")" 0
  assert_eq "some failed on it, and got their attempt back" \
    "$(q "select given_back > 0 and (select count(*) from agent_work_queue_canary_givebacks) = given_back from $C")" t
  assert_eq "no candidate execution started after every pod applied the rollback" \
    "$(q "select count(*) from $A where version = '$cand'
            and claimed_at > (select decided_at + interval '30 seconds' from $C)")" 0
  expect_exit 0 "$LEASH" canary status --json
  assert_eq "status --json keeps the decision" \
    "$(jq -r '[.state, .decided_by, .numbers.verdict, (.numbers.candidate_executions >= 20)] | join(",")' "$T_OUT")" \
    "rolled_back,auto,rollback,true"
  expect_exit 0 "$LEASH" status --json
  assert_eq "leash status --json has the canary" "$(jq -r '.canary.state' "$T_OUT")" rolled_back
  assert_no_sanitizer_reports
}

case_a_healthy_candidate_is_promoted_and_every_process_then_runs_it_at_about_its_share() {
  run_setup
  local cur next
  cur=$(version_of "$CF/current.lua") next=$(version_of "$CF/healthy.lua")
  tasks 1200 '{"sleep":0.05}' | "$LEASH" enqueue --file - >/dev/null || fail "enqueue failed"
  start_fleet 3 "$CF/current.lua"
  wait_for "the fleet to run" 60 q_true "select count(*) >= 30 from $A"
  expect_exit 0 "$LEASH" canary start "$CF/healthy.lua" --share 20 --min-tasks 60
  wait_for "the promotion" 120 state_is promoted
  wait_for "all three workers to apply it" 60 all_logs_have 3 "canary 1 promoted by auto:"
  assert_eq "W2 logs W1's verdict" "$(verdict_line W2 1 promoted)" "$(verdict_line W1 1 promoted)"
  assert_eq "W3 logs W1's verdict" "$(verdict_line W3 1 promoted)" "$(verdict_line W1 1 promoted)"
  # The share, over the tasks the canary saw (claimed between its start and its decision).
  local share
  share=$(q "select round(100.0 * count(*) filter (where a.version = '$next') / count(*))
               from $A a, $C c where a.claimed_at > c.started_at and a.finished_at < c.decided_at")
  ((share >= 8 && share <= 32)) || fail "candidate's share of executions: ${share}%, want about 20%"
  assert_eq "each task ran on one version only during the canary" \
    "$(q "select count(*) from (select a.task_id from $A a, $C c where a.claimed_at < c.decided_at
            group by a.task_id having count(distinct a.version) > 1) x")" 0
  local mark
  mark=$(q "select max(id) from agent_work_queue")
  tasks 60 '{}' | "$LEASH" enqueue --file - >/dev/null || fail "enqueue failed"
  wait_for "every task to be done ($(status_counts))" 240 all_done
  assert_eq "every task enqueued after the promotion ran the candidate, on every worker" \
    "$(q "select count(*) filter (where version = '$next') || '|' || count(*) filter (where version = '$cur')
            from $A where task_id > $mark")" "60|0"
  assert_eq "the candidate's result" \
    "$(q "select distinct result->>'version' from agent_work_queue where id > $mark")" next
  assert_no_sanitizer_reports
}

case_rollback_by_hand_gives_the_failed_attempts_back_and_promote_by_hand_switches_the_worker() {
  run_setup
  local port
  port=$(free_port)
  tasks 10 '{}' | "$LEASH" enqueue --file - >/dev/null || fail "enqueue failed"
  start_worker W1 "$CF/current.lua" --concurrency 2 --poll-ms 10-50 --metrics "127.0.0.1:$port"
  wait_for "the first tasks" 60 all_done
  # A candidate that kills every task, never judged automatically (a delta of 1 is never
  # exceeded), on every task.
  expect_exit 0 "$LEASH" canary start "$CF/failing.lua" --share 100% --min-tasks 100000 \
    --max-fatal-rate-delta 1 --max-retry-rate-delta 1 --wait-promote
  wait_for "the worker to run the candidate" 60 all_adopted 1 1
  tasks 12 '{"all_fatal":true}' | "$LEASH" enqueue --file - >/dev/null || fail "enqueue failed"
  wait_for "the candidate to kill them" 60 q_true "select count(*) = 12 from agent_work_queue where status = 'dead'"
  expect_exit 0 "$LEASH" canary rollback
  assert_eq "rollback names what it gave back" "$(<"$T_OUT")" "canary 1 rolled_back: 12 tasks given back"
  wait_for "the given-back tasks to succeed on the current version" 60 all_done
  assert_eq "each ran once more, as attempt 1 again" \
    "$(q "select count(*) from agent_work_queue where attempts = 1 and result->>'version' = 'current'
            and id > 10")" 12
  wait_for "the worker to apply the rollback" 30 log_has W1 "canary 1 rolled_back by ${USER:-unknown}: by hand: ${USER:-unknown}"
  expect_exit 2 "$LEASH" canary rollback
  assert_eq "a second rollback: nothing runs" "$(<"$T_ERR")" "leash canary: no canary is running on this table"

  expect_exit 0 "$LEASH" canary start "$CF/healthy.lua" --share 50 --wait-promote --min-tasks 5
  wait_for "the worker to run canary 2" 60 all_adopted 1 2
  expect_exit 0 "$LEASH" canary promote
  assert_eq "promote by hand" "$(<"$T_OUT")" "canary 2 promoted"
  wait_for "the worker to apply it" 30 log_has W1 "canary 2 promoted by ${USER:-unknown}"
  tasks 10 '{}' | "$LEASH" enqueue --file - >/dev/null || fail "enqueue failed"
  wait_for "the new tasks" 60 all_done
  assert_eq "after the promotion every task runs the candidate" \
    "$(q "select count(*) from agent_work_queue where id > 22 and result->>'version' = 'next'")" 10
  local m
  m=$(curl -sf "http://127.0.0.1:$port/metrics") || fail "metrics did not answer"
  assert_contains "rollbacks counted" "$m" "leash_canary_rollbacks_total 1"
  assert_contains "promotions counted" "$m" "leash_canary_promotions_total 1"
  assert_contains "no share while none runs" "$m" "leash_canary_share 0"
  # Stopped here, so that a leak report at exit (the candidate's states) is seen.
  kill -TERM "${W_PID[W1]}"
  assert_worker_exit W1 60 0
  assert_no_sanitizer_reports
}

case_a_candidate_whose_modules_load_as_another_version_in_the_worker_is_refused_there() {
  run_setup
  start_worker W1 "$CF/current.lua" --concurrency 2 --poll-ms 10-50
  expect_exit 0 "$LEASH" canary start "$CF/elsewhere/next.lua" --share 100
  wait_for "the worker to refuse it" 60 log_has W1 "canary 1 refused, slots keep version"
  assert_contains "and say why" "$(worker_log W1)" "put the candidate beside the running script"
  tasks 10 '{}' | "$LEASH" enqueue --file - >/dev/null || fail "enqueue failed"
  wait_for "the tasks" 60 all_done
  assert_eq "every task ran the current version" \
    "$(q "select count(*) from agent_work_queue where result->>'version' = 'current'")" 10
  expect_exit 0 "$LEASH" canary abort
  wait_for "the abort to be seen" 30 q_true "select state = 'aborted' from $C"
  kill -TERM "${W_PID[W1]}"
  assert_worker_exit W1 60 0
  assert_no_sanitizer_reports
}

# bad_start CASE_NAME WANT_TEXT ARGS...: exit 2, one error line on stderr (a usage error
# adds the house's "Try 'leash canary --help'." hint).
bad_start() {
  local what=$1 want=$2
  shift 2
  expect_exit 2 "$LEASH" canary "$@"
  assert_eq "$what: one error line" "$(grep -vc "^Try 'leash canary --help'.$" "$T_ERR")" 1
  assert_contains "$what: says why" "$(<"$T_ERR")" "$want"
}

case_bad_input_is_refused_with_one_line_and_exit_2() {
  run_setup
  local s
  for s in 0 101 -5 abc 10%% '' 1.5 '%'; do
    bad_start "share '$s'" "--share must be a percent from 1 to 100" start "$CF/healthy.lua" --share "$s"
  done
  bad_start "no share" "start needs --share" start "$CF/healthy.lua"
  bad_start "no file" "missing NEXT.lua" start --share 10
  bad_start "a missing file" "nope.lua" start "$CF/nope.lua" --share 10
  bad_start "a candidate that fails check" "handle" start "$CF/broken.lua" --share 10
  printf 'return {handle = function(' >"$T_TMP/syntax.lua"
  bad_start "a candidate with a syntax error" "syntax.lua" start "$T_TMP/syntax.lua" --share 10
  for s in -1 0 x; do
    bad_start "min-tasks '$s'" "--min-tasks must be" start "$CF/healthy.lua" --share 10 --min-tasks "$s"
  done
  for s in -0.1 2 x nan; do
    bad_start "delta '$s'" "--max-fatal-rate-delta must be" start "$CF/healthy.lua" --share 10 --max-fatal-rate-delta "$s"
  done
  bad_start "both promote modes" "not both" start "$CF/healthy.lua" --share 10 --auto-promote --wait-promote
  bad_start "an unknown action" "unknown action 'launch'" launch
  bad_start "no action" "say what to do" 
  bad_start "share on promote" "only start takes" promote --share 10
  bad_start "promote with none running" "no canary is running" promote
  bad_start "abort with none running" "no canary is running" abort
  assert_eq "nothing was stored" "$(q "select count(*) from $C")" 0
  expect_exit 0 "$LEASH" canary status
  assert_eq "status with none" "$(<"$T_OUT")" "no canary"
  expect_exit 0 "$LEASH" status --json
  assert_eq "status --json without a canary" "$(jq -c '.canary' "$T_OUT")" null
  expect_exit 0 "$LEASH" canary start "$CF/healthy.lua" --share 10
  expect_exit 0 "$LEASH" status
  assert_contains "status names the running canary" "$(<"$T_OUT")" "canary   1 running: 10% of tasks on"
  expect_exit 0 "$LEASH" status --json
  assert_eq "status --json: the canary field" \
    "$(jq -c '[.canary.state, .canary.share, .canary.numbers.verdict]' "$T_OUT")" '["running",10,"undecided"]'
  bad_start "start while one runs" "a canary is already running" start "$CF/failing.lua" --share 10
  expect_exit 0 "$LEASH" canary abort
  assert_eq "abort" "$(<"$T_OUT")" "canary 1 aborted"
  expect_exit 0 "$LEASH" canary status
  assert_contains "status shows the aborted one" "$(<"$T_OUT")" "canary 1: aborted"
}

t_run "$@"
