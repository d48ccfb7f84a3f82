#!/usr/bin/env bash
# The attempt history (issue #16, item 1; sql/016_history.sql, README "Attempt history"):
# one <table>_attempts row per execution, written by the settle, the reaper and the cancel in
# their own statements; shown by `leash inspect`, summarised by `leash report --by version`,
# pruned with its task and kept by a requeue.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
FLAKY=$LEASH_SRC/tests/fixtures/history/flaky.lua
A=agent_work_queue_attempts

# hist ID COLUMNS: the task's attempts in claim order, one line each, '|'-separated.
hist() { q "select $2 from $A where task_id = $1 order by lease_token"; }

# version_of SCRIPT: the version `leash check` prints.
version_of() { "$LEASH" check "$1" | sed -E 's/.*\(version ([0-9a-f]{64})\).*/\1/'; }

# enqueue_ids JSONL...: enqueues one task per argument, prints their ids (one a line).
enqueue_ids() {
  local p
  for p in "$@"; do
    "$LEASH" enqueue "$p" || fail "enqueue of $p failed"
  done
}

case_a_task_that_retries_then_succeeds_has_one_row_per_attempt_with_its_kind_cause_and_token() {
  run_setup
  local ok fatal snz v
  ok=$(enqueue_ids '{"fail":2}')
  fatal=$(enqueue_ids '{"fatal":true}')
  snz=$(enqueue_ids '{"snooze":2}')
  start_worker A "$FLAKY" --poll-ms 10-30 --until-empty
  assert_worker_exit A 60 0
  v=$(version_of "$FLAKY")
  assert_eq "three attempts: two retries, then done" \
    "$(hist "$ok" "attempt, kind, cause, status, error, crashed, worker, label, version = '$v'")" \
    "1|retry|returned|pending|attempt 1 fails|f|A|v1|t
2|retry|returned|pending|attempt 2 fails|f|A|v1|t
3|done|none|done||f|A|v1|t"
  assert_eq "the last attempt's token is the row's, each attempt has its own" \
    "$(q "select count(distinct a.lease_token) || '|' || bool_or(a.lease_token = q.lease_token)
            from $A a join agent_work_queue q on q.id = a.task_id where q.id = $ok")" "3|true"
  assert_eq "every attempt has its times and a queue wait" \
    "$(q "select count(*) from $A where task_id = $ok and claimed_at <= run_started_at
            and claimed_at <= finished_at and queue_wait_s >= 0")" 3
  assert_eq "the fatal one: one attempt, dead" \
    "$(hist "$fatal" "attempt, kind, cause, status, error")" "1|dead|returned|dead|asked to die"
  assert_eq "two snoozes gave the attempt back: three executions, all attempt 1" \
    "$(hist "$snz" "attempt, kind, cause, status")" \
    "1|snooze|snoozed|pending
1|snooze|snoozed|pending
1|done|none|done"
  assert_eq "as many attempt rows as executions" "$(q "select count(*) from $A")" \
    "$(q "select count(*) from execs")"

  expect_exit 0 "$LEASH" inspect "$ok"
  assert_contains "inspect counts the attempts" "$(<"$T_OUT")" "3 attempts:"
  assert_contains "inspect shows the first" "$(<"$T_OUT")" "#1  retry/returned -> pending"
  assert_contains "and its error" "$(<"$T_OUT")" "attempt 1 fails"
  assert_contains "and the version and label" "$(<"$T_OUT")" "version ${v:0:12} (v1)"
  assert_contains "inspect shows the last" "$(<"$T_OUT")" "#3  done/none -> done"
  expect_exit 0 "$LEASH" inspect "$ok" --json
  assert_eq "inspect --json lists the history" \
    "$(jq -r '[.history[] | "\(.attempt):\(.kind):\(.lease_token > 0):\(.version == "'"$v"'")"] | join(",")' "$T_OUT")" \
    "1:retry:true:true,2:retry:true:true,3:done:true:true"
  expect_exit 0 "$LEASH" report --by version --json
  assert_eq "report --by version: one version, its counts" \
    "$(jq -c '.versions[] | [.version == "'"$v"'", .label, .tasks, .attempts, .counts]' "$T_OUT")" \
    '[true,"v1",3,7,{"done":2,"retry":2,"fatal":1,"snooze":2,"wait":0,"crash":0,"lost":0,"dead":1}]'
  assert_eq "and its rates" "$(jq -c '.versions[0].rates | [.done, .fatal, .dead]' "$T_OUT")" \
    '[0.2857,0.1429,0.3333]'
  expect_exit 0 "$LEASH" report --by version
  assert_contains "report --by version as text" "$(<"$T_OUT")" "version ${v:0:12} (v1): 3 tasks, 7 attempts"
  assert_contains "with the counts" "$(<"$T_OUT")" "done 2 (28.6%), retry 2 (28.6%), fatal 1 (14.3%)"
}

case_a_killed_worker_and_a_frozen_one_are_recorded_as_lost_by_the_reaper() {
  run_setup
  local opts=(--visibility 2 --heartbeat 0.5 --poll-ms 20-50)
  local crash frozen
  crash=$(enqueue_ids '{"sleep":60}')
  q "update agent_work_queue set max_crashes = 1 where id = $crash" >/dev/null
  start_worker A "$FLAKY" "${opts[@]}"
  wait_for "A to run the task" 30 q_true "select count(*) = 1 from execs where task_id = $crash"
  kill -KILL "${W_PID[A]}"
  wait "${W_PID[A]}" 2>/dev/null || true
  # B reaps A's expired lease: one crash at max_crashes 1 quarantines it.
  start_worker B "$FLAKY" "${opts[@]}"
  wait_for "the reaper to quarantine it" 30 q_true \
    "select status = 'dead' from agent_work_queue where id = $crash"
  assert_eq "the killed execution: lost, quarantined, a crash, worker A" \
    "$(hist "$crash" "attempt, kind, cause, status, crashed, worker, version is null")" \
    "1|lost|quarantined|dead|t|A|t"
  assert_contains "its error says whose lease expired" "$(hist "$crash" error)" \
    "the lease of worker A expired"

  # C freezes (SIGSTOP) while it runs a 3 s task: D reaps the lease and runs it again; C,
  # resumed, finds its lease lost (or, had it written first, its outcome rejected) and
  # writes no row of its own.
  # shellcheck disable=SC2317 # called through wait_for
  c_gave_up() { log_has C "outcome discarded: the lease was lost" || log_has C "late outcome rejected"; }
  t_kill "${W_PID[B]}"
  frozen=$(enqueue_ids '{"sleep":3}')
  start_worker C "$FLAKY" "${opts[@]}"
  wait_for "C to run it" 30 q_true "select count(*) = 1 from execs where task_id = $frozen and worker = 'C'"
  kill -STOP "${W_PID[C]}"
  t_on_exit kill -CONT "${W_PID[C]}"
  start_worker D "$FLAKY" "${opts[@]}"
  wait_for "D to run it to the end" 60 q_true "select status = 'done' from agent_work_queue where id = $frozen"
  kill -CONT "${W_PID[C]}"
  wait_for "C to end its execution without writing it" 30 c_gave_up
  assert_eq "two executions: C's lost to the reaper (a crash), D's done" \
    "$(hist "$frozen" "attempt, kind, cause, status, crashed, worker")" \
    "1|lost|crash|pending|t|C
2|done|none|done|f|D"
  assert_eq "each execution one row" "$(q "select count(*) from execs where task_id = $frozen")" 2
  expect_exit 0 "$LEASH" inspect "$frozen"
  assert_contains "inspect marks the crash" "$(<"$T_OUT")" "#1  lost/crash -> pending (crash)"
  expect_exit 0 "$LEASH" report --by version --json
  assert_eq "the lost ones have no version; D's done one has" \
    "$(jq -c '[.versions[] | [(.version != null), .counts.lost, .counts.crash, .counts.done]]' "$T_OUT")" \
    '[[false,2,2,0],[true,0,0,1]]'
}

case_a_task_wedged_past_the_watchdog_has_its_attempt_with_the_version_that_ran_it() {
  run_setup
  local id v
  id=$(enqueue_ids '{"wedge":"sort"}')
  v=$(version_of "$FIX/wedge.lua")
  start_worker A "$FIX/wedge.lua" --task-timeout 2 --watchdog-grace 1 --poll-ms 20-50
  assert_worker_exit A 60 3
  assert_eq "the watchdog's settle is the attempt: a wedged retry, a crash, with its version"     "$(hist "$id" "attempt, kind, cause, status, crashed, worker, version = '$v', run_started_at is not null")" \
    "1|retry|wedged|pending|t|A|t|t"
}

case_a_running_task_cancelled_ends_its_attempt_as_lost_cancelled() {
  run_setup
  local id
  id=$(enqueue_ids '{"sleep":60}')
  start_worker A "$FLAKY" --poll-ms 20-50
  wait_for "A to run it" 30 q_true "select count(*) = 1 from execs where task_id = $id"
  expect_exit 0 "$LEASH" cancel --id "$id"
  assert_eq "the cancelled lease: lost, cancelled, dead, worker A" \
    "$(hist "$id" "attempt, kind, cause, status, crashed, worker")" "1|lost|cancelled|dead|f|A"
  local pend
  pend=$("$LEASH" enqueue --delay 1h '{}') || fail "enqueue failed"
  expect_exit 0 "$LEASH" cancel --id "$pend"
  assert_eq "a pending task cancelled ran nothing: no attempt" "$(q "select count(*) from $A where task_id = $pend")" 0
}

case_prune_deletes_a_tasks_attempts_and_requeue_keeps_them() {
  run_setup
  local dead kept
  dead=$(enqueue_ids '{"fatal":true}')
  kept=$(enqueue_ids '{"fail":1}')
  start_worker A "$FLAKY" --poll-ms 10-30 --until-empty
  assert_worker_exit A 60 0
  expect_exit 0 "$LEASH" requeue --id "$dead"
  start_worker B "$FLAKY" --poll-ms 10-30 --until-empty
  assert_worker_exit B 60 0
  assert_eq "the requeued task kept its first attempt and added one (attempt 1 again)" \
    "$(hist "$dead" "attempt, kind, worker")" "1|dead|A
1|dead|B"
  assert_eq "the other: two attempts" "$(q "select count(*) from $A where task_id = $kept")" 2
  expect_exit 0 "$LEASH" prune --older-than 0 --status dead
  assert_eq "prune of the dead one took its attempts" "$(q "select count(*) from $A where task_id = $dead")" 0
  assert_eq "and left the done one's" "$(q "select count(*) from $A where task_id = $kept")" 2
  expect_exit 0 "$LEASH" prune --older-than 0 --chunk 1
  assert_eq "nothing of either is left" "$(q "select count(*) from $A")" 0
  # The history has no foreign key (sql/020): a DELETE or a TRUNCATE by hand takes it too.
  kept=$(enqueue_ids '{"fail":1}' '{"fail":1}')
  start_worker C "$FLAKY" --poll-ms 10-30 --until-empty
  assert_worker_exit C 60 0
  assert_eq "four attempts of two tasks" "$(q "select count(*) from $A")" 4
  q "delete from agent_work_queue where id = (select min(task_id) from $A)" >/dev/null
  assert_eq "a DELETE by hand took its task's two" "$(q "select count(*) from $A")" 2
  q "truncate agent_work_queue cascade" 2>/dev/null >/dev/null
  assert_eq "a TRUNCATE took the rest" "$(q "select count(*) from $A")" 0
}

case_two_versions_of_a_hot_swap_mid_batch_are_split_by_report_by_version() {
  run_setup
  local dir=$T_TMP/hs script v1 v2
  mkdir -p "$dir"
  script=$dir/flaky.lua
  cp "$FLAKY" "$script"
  v1=$(version_of "$script")
  start_worker A "$script" --concurrency 2 --poll-ms 10-30
  wait_for "A to run" 20 log_has A "running 2 slots"
  seq 1 20 | awk '{ print "{\"batch\":\"nightly\",\"payload\":{\"fail\":1}}" }' >"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 20
  wait_for "the first half to finish" 60 q_true \
    "select count(*) = 20 from agent_work_queue where batch = 'nightly' and status = 'done'"
  sed 's/^local V = "v1"$/local V = "v2"/' "$FLAKY" >"$script.tmp"
  mv "$script.tmp" "$script"
  v2=$(version_of "$script")
  [[ $v1 != "$v2" ]] || fail "the two versions hash alike"
  wait_for "the swap to v2" 20 log_has A "slots load version $v2"
  seq 1 10 | awk '{ print "{\"batch\":\"nightly\",\"payload\":{\"fatal\":true}}" }' >"$T_TMP/b.jsonl"
  enqueue_file "$T_TMP/b.jsonl" 10
  wait_for "the second half to finish" 60 q_true \
    "select count(*) = 10 from agent_work_queue where batch = 'nightly' and status = 'dead'"
  expect_exit 0 "$LEASH" report --by version --batch nightly --json
  assert_eq "v1: 20 tasks, 40 attempts, half retries; v2: 10 tasks fatal and dead" \
    "$(jq -c '[.versions[] | [.version, .label, .tasks, .attempts, .counts.retry, .counts.done, .counts.fatal, .counts.dead]]' "$T_OUT")" \
    "[[\"$v1\",\"v1\",20,40,20,20,0,0],[\"$v2\",\"v2\",10,10,0,0,10,10]]"
  expect_exit 0 "$LEASH" report --by version --batch nightly
  assert_contains "text: v1" "$(<"$T_OUT")" "version ${v1:0:12} (v1): 20 tasks, 40 attempts"
  assert_contains "text: v2" "$(<"$T_OUT")" "version ${v2:0:12} (v2): 10 tasks, 10 attempts"
  expect_exit 0 "$LEASH" report --by version --batch other --json
  assert_eq "another batch: no versions" "$(jq -c .versions "$T_OUT")" "[]"
}

case_every_execution_by_two_processes_has_exactly_one_attempt_row_with_its_token() {
  run_setup
  # 600 tasks: a third retry once, a sixth snooze once, a tenth fatal; two processes at once.
  seq 1 600 | awk '{ p = "{}"
    if ($1 % 10 == 0) p = "{\"fatal\":true}"
    else if ($1 % 6 == 0) p = "{\"snooze\":1}"
    else if ($1 % 3 == 0) p = "{\"fail\":1}"
    print "{\"payload\":" p "}" }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 600
  start_worker A "$FLAKY" --concurrency 4 --poll-ms 10-30 --until-empty
  start_worker B "$FLAKY" --concurrency 4 --poll-ms 10-30 --until-empty
  assert_worker_exit A 120 0
  assert_worker_exit B 120 0
  assert_eq "every task settled" "$(status_counts)" "dead=60 done=540"
  # Executions as the script saw them (task, attempt, worker) against the history's rows.
  assert_eq "one row per execution, none missing, none extra" \
    "$(q "select count(*) from (
            (select task_id, attempt, worker, count(*) from execs group by 1, 2, 3
             except all select task_id, attempt, worker, count(*) from $A group by 1, 2, 3)
            union all
            (select task_id, attempt, worker, count(*) from $A group by 1, 2, 3
             except all select task_id, attempt, worker, count(*) from execs group by 1, 2, 3)) d")" 0
  assert_eq "as many rows as executions" "$(q "select count(*) from $A")" "$(q "select count(*) from execs")"
  assert_eq "tokens are unique, and each task's last is its row's token" \
    "$(q "select count(*) = count(distinct lease_token) from $A")|$(q "select count(*) from agent_work_queue q
            where q.lease_token <> (select max(a.lease_token) from $A a where a.task_id = q.id)")" "t|0"
  assert_eq "both processes wrote rows" "$(q "select count(distinct worker) from $A")" 2
  assert_eq "the kinds add up" \
    "$(q "select string_agg(kind || '=' || n, ' ' order by kind) from (select kind, count(*) n from $A group by kind) k")" \
    "dead=60 done=540 retry=100 snooze=80"
  assert_no_sanitizer_reports
}

case_bad_labels_are_refused_at_load_with_one_line() {
  local bad f long
  long=$(printf 'x%.0s' $(seq 1 65))
  for bad in '42' '{}' '""' "\"$long\"" '"a\nb"' '"tab\there"' 'true'; do
    f=$T_TMP/bad.lua
    printf 'return { label = %s, handle = function() return true end }\n' "$bad" >"$f"
    expect_exit 1 "$LEASH" check "$f"
    assert_contains "label $bad is refused" "$(<"$T_ERR")" "label must be a string of 1 to 64 bytes without control characters"
    assert_eq "in one line" "$(wc -l <"$T_ERR")" 1
  done
  printf 'return { label = "%s", handle = function() return true end }\n' "${long:1}" >"$f"
  expect_exit 0 "$LEASH" check "$f"
}

t_run "$@"
