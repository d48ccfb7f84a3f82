#!/usr/bin/env bash
# The settle connection (src/settler.c; docs/ARCHITECTURE.md "How leash run works"): by
# default a process with more than one slot writes a turn's outcomes on a second connection
# while it claims on the first. Every outcome must still be written exactly once, whatever
# happens to that connection: while it is down, or when a settle there fails, the outcomes
# go on the claim connection.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"

# settle_backends: the pids of the worker's settle connections.
settle_backends() {
  q "select coalesce(string_agg(pid::text, ' '), '') from pg_stat_activity
      where datname = current_database() and application_name = 'leash settle'"
}

# has_settle_backend: true while a settle connection is open.
has_settle_backend() { [[ -n $(settle_backends) ]]; }

# every_task_written_once N: N tasks, each done with one attempt and one attempts row.
every_task_written_once() {
  assert_eq "queue after the batch" "$(status_counts)" "done=$1"
  assert_eq "executions / distinct tasks executed" \
    "$(q 'select count(*) || $$/$$ || count(distinct task_id) from execs')" "$1/$1"
  assert_eq "rows with attempts <> 1" "$(q 'select count(*) from agent_work_queue where attempts <> 1')" 0
  assert_eq "attempts rows / tasks with one, all done" \
    "$(q "select count(*) || '/' || count(distinct task_id) || '/' || bool_and(kind = 'done' and status = 'done')
            from agent_work_queue_attempts")" "$1/$1/true"
}

# 1. A drain's outcomes are written on the settle connection, once each.
case_outcomes_go_on_the_settle_connection_once_each() {
  run_setup
  seq 1 3000 | awk '{ printf "{\"payload\":{\"n\":%d}}\n", $1 }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 3000
  start_worker A "$FIX/record.lua" --concurrency 4 --poll-ms 20-50
  wait_for "the settle connection" 30 has_settle_backend
  wait_for "the batch to drain" 120 q_true "select count(*) = 3000 from agent_work_queue where status = 'done'"
  every_task_written_once 3000
  kill -TERM "${W_PID[A]}"
  assert_worker_exit A 60 0
  if log_has A "settle connection:"; then
    fail "the settle connection failed with nothing done to it:"$'\n'"$(grep -F 'settle connection:' "$T_TMP/A.log" | head -3)"
  fi
}

# 2. The settle connection killed again and again mid-drain (pg_terminate_backend, every
# 50 ms): no outcome is lost or written twice, the worker says it wrote them on the claim
# connection, and it ends cleanly.
case_a_settle_connection_killed_again_and_again_loses_no_outcome() {
  run_setup
  seq 1 3000 | awk '{ printf "{\"payload\":{\"n\":%d}}\n", $1 }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 3000
  start_worker A "$FIX/record.lua" --concurrency 4 --settle-connection --poll-ms 20-50 --until-empty
  wait_for "the settle connection" 30 has_settle_backend
  local kills=0 pid deadline=$(($(_t_now_us) + 120 * 1000000))
  while ! exited "${W_PID[A]}"; do
    (($(_t_now_us) < deadline)) || fail "the drain did not end in 120 s: $(status_counts)"
    for pid in $(settle_backends); do
      q "select pg_terminate_backend($pid)" >/dev/null && kills=$((kills + 1))
    done
    sleep 0.05
  done
  assert_worker_exit A 10 0
  ((kills > 0)) || fail "no settle connection was killed (the drain ended first)"
  log_has A "on the claim connection" || fail "no outcome was written on the claim connection after $kills kills"
  every_task_written_once 3000
}

# 3. With --no-settle-connection, and at one slot: no settle connection; all done.
case_turned_off_or_with_one_slot_no_settle_connection_opens() {
  local opts
  for opts in "--concurrency 4 --no-settle-connection" "--concurrency 1 --settle-connection"; do
    run_setup "${opts//[^a-z0-9]/_}"
    seq 1 1000 | awk '{ printf "{\"payload\":{\"n\":%d}}\n", $1 }' >"$T_TMP/tasks.jsonl"
    enqueue_file "$T_TMP/tasks.jsonl" 1000
    # shellcheck disable=SC2086 # the options are words
    start_worker A "$FIX/record.lua" $opts --poll-ms 20-50 --until-empty
    local seen=0 deadline=$(($(_t_now_us) + 120 * 1000000))
    while ! exited "${W_PID[A]}"; do
      (($(_t_now_us) < deadline)) || fail "$opts: the drain did not end in 120 s: $(status_counts)"
      has_settle_backend && seen=$((seen + 1))
      sleep 0.05
    done
    assert_worker_exit A 10 0
    assert_eq "$opts: looks that saw a settle connection" "$seen" 0
    every_task_written_once 1000
  done
}

# 4. Three processes with the settle connection drain shards enqueued in blocks: a shard's
# executions never overlap (its settle and the next claim now run on two connections of one
# process, and on three processes), and every task runs once.
case_three_processes_with_settle_connections_keep_shards_exclusive() {
  run_setup
  seq 0 1999 | awk '{ printf "{\"shard_key\":\"s%d\",\"payload\":{\"n\":%d}}\n", $1 / 100, $1 }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 2000
  local w
  for w in A B C; do
    start_worker "$w" "$FIX/record.lua" --concurrency 4 --settle-connection --poll-ms 20-50 --until-empty
  done
  wait_for "a settle connection" 30 has_settle_backend
  for w in A B C; do assert_worker_exit "$w" 180 0; done
  every_task_written_once 2000
  assert_eq "overlapping executions of one shard" \
    "$(q "select count(*) from execs a join execs b on a.shard = b.shard and a.id < b.id
            and a.started < coalesce(b.finished, 'infinity') and b.started < coalesce(a.finished, 'infinity')")" 0
}

t_run "$@"
