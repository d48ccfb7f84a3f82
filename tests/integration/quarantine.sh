#!/usr/bin/env bash
# Crash accounting and quarantine (issue #12, class 3; docs/SECURITY.md "Crashes and
# quarantine"): an execution that ends because its worker died counts as a crash of the task;
# max_crashes of them quarantine it (dead, cause quarantined), so a poison task that kills
# every worker running it takes down at most max_crashes processes while the rest flows.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/run_common.sh"

# Short leases, so that a killed worker's leases are reaped within a few seconds.
WORKER_OPTS=(--visibility 2 --heartbeat 0.5 --poll-ms 20-50 --concurrency 2 --claim-batch 2)
declare -g KILLS=0 SPAWNED=0

# spawn: one more worker process (W1, W2, ...), running until the queue is empty.
spawn() {
  SPAWNED=$((SPAWNED + 1))
  start_worker "W$SPAWNED" "$FIX/record.lua" "${WORKER_OPTS[@]}" --until-empty
}

# poison_settled ID: true once the poison row is no longer pending or leased.
poison_settled() { q_true "select status not in ('pending', 'leased') from agent_work_queue where id = $1"; }

# drive ID DEADLINE: plays the poison. Whenever a worker starts an execution of task ID (its
# record.lua wrote the execs row), that worker's process is killed with SIGKILL, as if the
# payload had crashed it, and a fresh process replaces it. Returns once the task settled.
drive() {
  local id=$1 deadline=$(($(_t_now_us) + $2 * 1000000)) seen=0 worker
  while ! poison_settled "$id"; do
    (($(_t_now_us) < deadline)) || fail "task $id still open after $2 s: $(status_counts)"
    worker=$(q "select worker from execs where task_id = $id order by id offset $seen limit 1")
    if [[ -n $worker ]]; then
      seen=$((seen + 1))
      [[ -n ${W_PID[$worker]:-} ]] || fail "execution by unknown worker '$worker'"
      kill -9 "${W_PID[$worker]}" 2>/dev/null && KILLS=$((KILLS + 1))
      wait "${W_PID[$worker]}" 2>/dev/null || true
      spawn
    fi
    sleep 0.05
  done
}

# quarantine_case K POISON_ENQUEUE...: 3 processes, 40 ordinary tasks (max_crashes 10, so the
# leases they lose when their process is killed under them cannot quarantine them) and one
# poison task enqueued by the given command, which must end quarantined after exactly K
# crashes, with K processes killed and every other task done.
quarantine_case() {
  local k=$1
  shift
  run_setup
  seq 1 40 | awk '{ printf "{\"max_crashes\":10,\"payload\":{\"sleep\":0.1}}\n" }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 40
  local poison
  poison=$("$@") || fail "enqueue of the poison failed"
  spawn
  spawn
  spawn
  drive "$poison" 90
  local w
  for w in "${!W_PID[@]}"; do
    exited "${W_PID[$w]}" && continue
    assert_worker_exit "$w" 60 0
  done
  assert_eq "processes killed" "$KILLS" "$k"
  assert_eq "executions of the poison" "$(q "select count(*) from execs where task_id = $poison")" "$k"
  assert_eq "the poison row" \
    "$(q "select status || '|' || last_cause || '|' || crashes || '|' || max_crashes || '|' || attempts
            from agent_work_queue where id = $poison")" "dead|quarantined|$k|$k|$k"
  assert_contains "its last_error" "$(q "select last_error from agent_work_queue where id = $poison")" \
    "quarantined: its executions crashed $k times (max_crashes $k)"
  assert_contains "and how to run it again" "$(q "select last_error from agent_work_queue where id = $poison")" \
    "requeue it to run it again"
  assert_eq "every other task done, none lost" \
    "$(q "select count(*) from agent_work_queue where id <> $poison and status = 'done'")" 40
  expect_exit 0 "$LEASH" inspect "$poison"
  assert_contains "inspect shows the cause" "$(<"$T_OUT")" "quarantined"
  assert_contains "inspect shows the crashes" "$(grep '^crashes' "$T_OUT")" "$k"
  expect_exit 0 "$LEASH" report --json
  assert_contains "report counts it by cause" "$(<"$T_OUT")" '"quarantined":1'
  assert_no_sanitizer_reports
}

case_poison_with_max_crashes_1_kills_one_process() {
  quarantine_case 1 "$LEASH" enqueue --shard poison --max-crashes 1 '{"sleep":60}'
}

case_poison_with_default_max_crashes_kills_three_processes() {
  quarantine_case 3 "$LEASH" enqueue --shard poison '{"sleep":60}'
}

# enqueue_poison_line: the poison as a JSONL line whose max_crashes (2) overrides the flag's
# (7); prints its id.
enqueue_poison_line() {
  printf '%s\n' '{"shard_key":"poison","max_crashes":2,"payload":{"sleep":60}}' |
    "$LEASH" enqueue --max-crashes 7 --file - >/dev/null || return 1
  q "select id from agent_work_queue where shard_key = 'poison'"
}

case_per_task_max_crashes_overrides_the_flag() {
  quarantine_case 2 enqueue_poison_line
}

case_requeue_of_a_quarantined_task_resets_its_crashes() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  local id
  id=$("$LEASH" enqueue --max-crashes 2 '{}') || fail "enqueue failed"
  # Two crashes by hand: lease it as a worker would, let the lease expire, reap.
  local n
  for n in 1 2; do
    q "update agent_work_queue set status = 'leased', lease_owner = 'gone$n', attempts = attempts + 1,
         locked_until = now() - interval '1 s' where id = $id" >/dev/null
    q "select count(*) from agent_work_queue_reap()" >/dev/null
  done
  assert_eq "quarantined after 2" "$(q "select status || '|' || last_cause || '|' || crashes from agent_work_queue where id = $id")" \
    "dead|quarantined|2"
  assert_contains "it names the last worker" "$(q "select last_error from agent_work_queue where id = $id")" "worker gone2"
  expect_exit 0 "$LEASH" requeue --id "$id"
  assert_eq "requeued fresh" "$(q "select status || '|' || coalesce(last_cause, '-') || '|' || crashes || '|' || attempts
                                   from agent_work_queue where id = $id")" "pending|-|0|0"
  expect_exit 0 "$LEASH" run "$LEASH_SRC/tests/fixtures/badinput/noop.lua" --until-empty
  assert_eq "and it runs again" "$(q "select status from agent_work_queue where id = $id")" "done"
}

case_a_crash_is_counted_and_a_release_is_not() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  local id
  id=$("$LEASH" enqueue '{}') || fail "enqueue failed"
  q "update agent_work_queue set status = 'leased', lease_owner = 'w', attempts = 1, lease_token = 1,
       locked_until = now() + interval '1 min' where id = $id" >/dev/null
  # Drain gives the lease back: not a crash.
  q "select count(*) from agent_work_queue_release('w', '{$id}', '{1}')" >/dev/null
  assert_eq "release" "$(q "select status || '|' || crashes from agent_work_queue where id = $id")" "pending|0"
  q "update agent_work_queue set status = 'leased', lease_owner = 'w', attempts = 1,
       locked_until = now() - interval '1 s' where id = $id" >/dev/null
  q "select count(*) from agent_work_queue_reap()" >/dev/null
  assert_eq "reap" "$(q "select status || '|' || crashes || '|' || last_cause from agent_work_queue where id = $id")" \
    "pending|1|crash"
  assert_contains "the crash is said" "$(q "select last_error from agent_work_queue where id = $id")" \
    "crash: the lease of worker w expired"
}

case_max_crashes_out_of_range_is_refused_at_enqueue() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  local v
  for v in 0 1001 -1 1.5 x; do
    expect_exit 2 "$LEASH" enqueue --max-crashes "$v" '{}'
    assert_contains "--max-crashes $v" "$(<"$T_ERR")" "--max-crashes must be an integer from 1 to 1000"
  done
  for v in 0 1001 1.5 '"3"' null; do
    expect_exit 2 "$LEASH" enqueue --file - <<<"{\"payload\":{},\"max_crashes\":$v}"
    assert_contains "max_crashes $v" "$(<"$T_ERR")" '"max_crashes" must be an integer from 1 to 1000'
  done
  assert_eq "nothing enqueued" "$(q "select count(*) from agent_work_queue")" 0
  expect_exit 0 "$LEASH" enqueue --file - <<<'{"payload":{},"max_crashes":1000}'
  assert_eq "the bound itself" "$(q "select max_crashes from agent_work_queue")" 1000
}

t_run "$@"
