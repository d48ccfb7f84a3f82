#!/usr/bin/env bash
# `leash run` end to end: queue semantics (SPEC.md "Queue semantics"), the Lua contract as the
# host applies it, signals and options. Several real processes against the throwaway cluster;
# scripts are tests/fixtures/run/*.lua and record what they did in the database, on the
# server's clock. Slow cases (own cluster, restarts) live in run_slow.sh.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"

# 1. Three processes drain 5,000 tasks: each runs exactly once (no crash, long leases).
case_no_double_execution() {
  run_setup
  local log=${LEASH_PG_DIR:-}/server.log log_at=0
  [[ -r $log ]] && log_at=$(stat -c %s "$log")
  seq 1 5000 | awk '{ printf "{\"payload\":{\"n\":%d}}\n", $1 }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 5000
  local w
  for w in A B C; do
    start_worker "$w" "$FIX/record.lua" --concurrency 8 --until-empty --poll-ms 20-100
  done
  for w in A B C; do
    assert_worker_exit "$w" 240 0
  done
  assert_eq "queue after the batch" "$(status_counts)" "done=5000"
  assert_eq "executions / distinct tasks executed" \
    "$(q 'select count(*) || $$/$$ || count(distinct task_id) from execs')" "5000/5000"
  assert_eq "tasks executed more than once" \
    "$(q 'select count(*) from (select task_id from execs group by 1 having count(*) > 1) x')" 0
  assert_eq "rows with attempts <> 1" "$(q 'select count(*) from agent_work_queue where attempts <> 1')" 0
  assert_eq "executions whose attempt <> 1" "$(q 'select count(*) from execs where attempt <> 1')" 0
  # Every process took part (the queue is shared, not grabbed by the first one).
  assert_eq "workers that executed tasks" "$(q 'select count(distinct worker) from execs')" 3
  # A clean batch is quiet in the server's log too (a first EXECUTE of a statement not yet
  # prepared on its connection used to leave an ERROR there per worker and reconnect).
  if [[ -r $log ]]; then
    assert_eq "ERROR lines of this database in the server log since the case began" \
      "$(tail -c +$((log_at + 1)) "$log" | grep -c "@$TDB ERROR")" 0
  fi
  assert_no_sanitizer_reports
}

# 2. Shard exclusion across processes: no two executions of one (tenant, shard) overlap in
# time (server clock), while different shards do run at the same time.
case_shard_exclusion_across_processes() {
  run_setup
  # 40 shards x 25 tasks, interleaved: task i -> tenant t((i % 40) / 20), shard_key s(i % 20),
  # so both tenants use the shard keys s0..s19 (one key in two tenants is two shards).
  seq 0 999 | awk '{ printf "{\"tenant_id\":\"t%d\",\"shard_key\":\"s%d\",\"payload\":{\"sleep_min\":0.01,\"sleep_max\":0.03}}\n", int(($1 % 40) / 20), $1 % 20 }' \
    >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 1000
  assert_eq "distinct shards" "$(q 'select count(distinct (tenant_id, shard_key)) from agent_work_queue')" 40
  local w
  for w in A B C D; do
    start_worker "$w" "$FIX/record.lua" --concurrency 10 --until-empty --poll-ms 10-50
  done
  for w in A B C D; do
    assert_worker_exit "$w" 240 0
  done
  assert_eq "queue after the batch" "$(status_counts)" "done=1000"
  assert_eq "executions without an end" "$(q 'select count(*) from execs where finished is null')" 0
  assert_eq "tasks executed" "$(q 'select count(distinct task_id) from execs')" 1000
  local overlaps
  overlaps=$(q "select string_agg(format('%s/%s: task %s [%s, %s] (%s) and task %s [%s, %s] (%s)',
                  a.tenant, a.shard, a.task_id, a.started, a.finished, a.worker,
                  b.task_id, b.started, b.finished, b.worker), E'\n')
                from execs a join execs b
                  on a.tenant = b.tenant and a.shard = b.shard and a.id < b.id
                 and a.started < b.finished and b.started < a.finished")
  assert_eq "overlapping executions of one shard" "$overlaps" ""
  # Different shards did run concurrently, and across processes: exclusion is per shard.
  assert_eq "pairs of other shards that overlapped" \
    "$(q "select exists (select 1 from execs a join execs b
                          on (a.tenant, a.shard) <> (b.tenant, b.shard)
                         and a.started < b.finished and b.started < a.finished
                         and a.worker <> b.worker)")" t
  assert_eq "workers that executed tasks" "$(q 'select count(distinct worker) from execs')" 4
  assert_no_sanitizer_reports
}

# 3. kill -9 of a worker holding leases: its tasks come back once the leases expire and
# finish under another worker; none lost.
case_crash_recovery() {
  run_setup
  local i
  for i in $(seq 1 10); do
    printf '{"payload":{"sleep":{"A":60,"default":0.05}}}\n'
  done >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 10
  start_worker A "$FIX/record.lua" --concurrency 10 --visibility 2s --heartbeat 500ms --poll-ms 20-50
  wait_for "A to lease and start all 10 tasks" 30 q_true \
    "select count(*) = 10 from agent_work_queue where status = 'leased' and lease_owner = 'A'
     and (select count(*) from execs where worker = 'A') = 10"
  kill -KILL "${W_PID[A]}"
  wait_worker A 10
  start_worker B "$FIX/record.lua" --concurrency 10 --visibility 2s --heartbeat 500ms \
    --poll-ms 20-50 --until-empty
  assert_worker_exit B 60 0
  assert_eq "queue after recovery" "$(status_counts)" "done=10"
  assert_eq "tasks finished by B on attempt 2" \
    "$(q "select count(*) from agent_work_queue where lease_owner = 'B' and attempts = 2
          and result->>'worker' = 'B'")" 10
  assert_eq "executions: A started 10 (never finished), B ran 10" \
    "$(q "select string_agg(worker || ':' || n || ':' || unfinished, ' ' order by worker)
            from (select worker, count(*) n, count(*) filter (where finished is null) unfinished
                    from execs group by worker) x")" "A:10:10 B:10:0"
  log_has B "reaped" || fail "B's log does not mention reaping A's expired leases"$'\n'"$(worker_log B)"
  assert_no_sanitizer_reports
}

# 4. A worker frozen (SIGSTOP) past its leases while its tasks run: B takes the tasks over
# and finishes them; when A resumes, its late attempts change nothing and write nothing.
# Two rounds: tasks asleep in leash.sleep, then tasks in a CPU busy loop (stopped through the
# instruction hook). Four tasks on four slots each time: every slot that wakes on resume is a
# chance for a write to slip through before the host notices that the leases are gone.
case_zombie_late_outcome_changes_nothing() {
  run_setup
  zombie_round A1 B1 sleep
  zombie_round A2 B2 busy
  assert_no_sanitizer_reports
}

# zombie_round A B sleep|busy
zombie_round() {
  local a=$1 b=$2 how=$3 i
  local rows="select %s from agent_work_queue where payload->'$how' ? '$a'"
  for i in 1 2 3 4; do
    printf '{"payload":{"%s":{"%s":6,"default":0},"after":true}}\n' "$how" "$a"
  done >"$T_TMP/$a.jsonl"
  enqueue_file "$T_TMP/$a.jsonl" 4
  start_worker "$a" "$FIX/record.lua" --concurrency 4 --visibility 2s --heartbeat 500ms --poll-ms 20-50
  wait_for "$a to start 4 tasks" 30 q_true "select count(*) = 4 from execs where worker = '$a'"
  kill -STOP "${W_PID[$a]}"
  t_on_exit _cont "${W_PID[$a]}"
  start_worker "$b" "$FIX/record.lua" --concurrency 4 --visibility 2s --heartbeat 500ms \
    --poll-ms 20-50 --until-empty
  # shellcheck disable=SC2059
  wait_for "$b to lease the tasks" 30 q_true \
    "$(printf "$rows" "count(*) = 4 and bool_and(lease_owner = '$b' and status in ('leased', 'done'))")"
  assert_worker_exit "$b" 30 0
  # shellcheck disable=SC2059
  assert_eq "rows after $b ($how)" \
    "$(q "$(printf "$rows" "string_agg(distinct status || '|' || lease_owner || '|' || attempts, ',')")")" "done|$b|2"
  # Resume A only once its tasks' work is over by the clock: it wakes like a process back
  # from a long pause (GC, VM freeze), with its timers expired and its leases long gone.
  wait_for "$a's 6 s of work to be over" 30 q_true \
    "select bool_and(clock_timestamp() > started + interval '6.5 s') from execs where worker = '$a'"
  kill -CONT "${W_PID[$a]}"
  wait_for "$a to notice the lost leases" 15 \
    eval "log_has $a 'lease lost' || log_has $a 'late outcome rejected'"
  # SIGTERM drains: A exits once its attempts are over, so everything they did is visible.
  kill -TERM "${W_PID[$a]}"
  assert_worker_exit "$a" 40 0
  # shellcheck disable=SC2059
  assert_eq "rows after $a resumed ($how)" \
    "$(q "$(printf "$rows" "string_agg(distinct concat_ws('|', status, lease_owner, attempts, result->>'worker', result->>'attempt'), ',')")")" \
    "done|$b|2|$b|2"
  assert_eq "writes $a's attempts made after resuming ($how; after_rows)" \
    "$(q "select count(*) from after_rows where worker = '$a'")" 0
  assert_eq "$a's executions marked finished ($how; writes after resuming)" \
    "$(q "select count(*) from execs where worker = '$a' and finished is not null")" 0
  assert_eq "$b's attempts wrote their rows ($how)" \
    "$(q "select count(*) from after_rows where worker = '$b'")" 4
}

_cont() { kill -CONT "$1" 2>/dev/null || true; }

# 5. A task running longer than its visibility keeps its lease through heartbeats.
case_long_task_keeps_its_lease() {
  run_setup
  printf '{"payload":{"sleep":10}}\n' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 1
  start_worker A "$FIX/record.lua" --concurrency 2 --visibility 3s --heartbeat 1s \
    --poll-ms 20-50 --until-empty
  wait_for "the task to start" 30 q_true "select count(*) = 1 from execs"
  local first
  first=$(q "select locked_until from agent_work_queue where status = 'leased'")
  [[ -n $first ]] || fail "the task is not leased while it runs: $(status_counts)"
  wait_for "locked_until to advance" 5 q_true \
    "select locked_until > '$first'::timestamptz from agent_work_queue where status = 'leased'"
  local second
  second=$(q "select locked_until from agent_work_queue where status = 'leased'")
  wait_for "locked_until to advance again" 5 q_true \
    "select locked_until > '$second'::timestamptz from agent_work_queue where status = 'leased'"
  assert_worker_exit A 30 0
  assert_eq "row after the run" "$(q 'select status, attempts, lease_owner from agent_work_queue')" "done|1|A"
  assert_eq "executions" "$(q 'select count(*) from execs')" 1
  assert_eq "the task ran its 10 s" \
    "$(q "select finished - started >= interval '9.9 s' from execs")" t
  assert_not_contains "A's log" "$(worker_log A)" "lease lost"
  assert_no_sanitizer_reports
}

# 6. Backoff 2^attempts s after a retry without delay, equal jitter by default (a wait in
# [d/2, d], sql/012); attempts exhausted -> dead; fatal ->
# dead at once; a raised error is a retry whose last_error holds the message and traceback.
case_backoff_dead_and_fatal() {
  run_setup
  {
    printf '{"shard_key":"backoff","payload":{"outcome":"retry"}}\n'
    printf '{"shard_key":"exhaust","max_attempts":3,"payload":{"outcome":"retry0"}}\n'
    printf '{"shard_key":"fatal","payload":{"outcome":"fatal"}}\n'
    printf '{"shard_key":"error","payload":{"outcome":"error"}}\n'
  } >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 4
  start_worker A "$FIX/record.lua" --concurrency 4 --poll-ms 20-50 --drain-timeout 1
  local row="select %s from agent_work_queue where shard_key = '%s'"
  # shellcheck disable=SC2059
  wait_for "the retried task's first failure" 20 q_true \
    "$(printf "$row" "status = 'pending' and attempts = 1" backoff)"
  # shellcheck disable=SC2059
  assert_eq "backoff after attempt 1 (run_after - finished_at in [1, 2] s)" \
    "$(q "$(printf "$row" "extract(epoch from run_after - finished_at) between 0.999 and 2.001" backoff)")" t
  # shellcheck disable=SC2059
  assert_eq "last_error after a retry" "$(q "$(printf "$row" last_error backoff)")" "asked to retry"
  # shellcheck disable=SC2059
  wait_for "the retried task's second failure" 20 q_true \
    "$(printf "$row" "status = 'pending' and attempts = 2" backoff)"
  # shellcheck disable=SC2059
  assert_eq "backoff after attempt 2 (in [2, 4] s)" \
    "$(q "$(printf "$row" "extract(epoch from run_after - finished_at) between 1.999 and 4.001" backoff)")" t

  # shellcheck disable=SC2059
  wait_for "the exhausted task to die" 20 q_true "$(printf "$row" "status = 'dead'" exhaust)"
  # shellcheck disable=SC2059
  assert_eq "exhausted task" "$(q "$(printf "$row" "status, attempts, last_error" exhaust)")" \
    "dead|3|asked to retry at once"
  assert_eq "executions of the exhausted task" \
    "$(q "select count(*) from execs where shard = 'exhaust'")" 3
  # shellcheck disable=SC2059
  assert_eq "fatal task" "$(q "$(printf "$row" "status, attempts, last_error" fatal)")" "dead|1|asked to die"
  # shellcheck disable=SC2059
  wait_for "the raising task to fail and wait for its retry" 20 q_true \
    "$(printf "$row" "status = 'pending' and attempts >= 1" error)"
  local err
  # shellcheck disable=SC2059
  err=$(q "$(printf "$row" last_error error)")
  assert_contains "last_error of a raised error" "$err" "boom from task"
  assert_contains "last_error of a raised error" "$err" "stack traceback"
  assert_contains "last_error names the script" "$err" "record.lua"
  assert_no_sanitizer_reports
}

# 7b. A result PostgreSQL cannot store (jsonb refuses \u0000) fails its own attempt and no
# other: the cycle's statement fails, the outcomes are settled one by one, that one as a retry
# naming the reason, and once its attempts are spent it is dead, as the database counts it.
case_unstorable_result_fails_only_its_task() {
  run_setup
  {
    seq 1 5 | awk '{ printf "{\"shard_key\":\"ok%d\",\"payload\":{\"sleep\":0.2}}\n", $1 }'
    printf '{"shard_key":"nul","max_attempts":2,"payload":{"sleep":0.2,"outcome":"nul"}}\n'
  } >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 6
  start_worker A "$FIX/record.lua" --concurrency 6 --poll-ms 20-50 --until-empty
  assert_worker_exit A 30 0
  assert_eq "queue" "$(status_counts)" "dead=1 done=5"
  local err
  err=$(q "select status || '|' || attempts || '|' || last_error from agent_work_queue where shard_key = 'nul'")
  assert_contains "the unstorable task" "$err" "dead|2|result cannot be stored:"
  log_has A "settling one by one" || fail "no 'settling one by one' in the log"
  log_has A "7 claimed, 5 done, 1 retried, 1 dead, 0 lost, 0 late" \
    || fail "the summary does not count what the database wrote"$'\n'"$(worker_log A)"
  assert_no_sanitizer_reports
}

# 8. SIGTERM drains: running tasks finish and are settled, nothing new is claimed, exit 0.
# Past --drain-timeout, tasks still running go back to pending without the attempt charged.
case_drain_sigterm() {
  run_setup
  # Part 1: 4 tasks of 1 s on 4 slots, 4 more waiting.
  local i
  for i in $(seq 1 8); do
    printf '{"payload":{"sleep":1}}\n'
  done >"$T_TMP/short.jsonl"
  enqueue_file "$T_TMP/short.jsonl" 8
  start_worker A "$FIX/record.lua" --concurrency 4 --poll-ms 20-50 --claim-batch 4
  wait_for "4 tasks to start" 20 q_true "select count(*) = 4 from execs"
  local t_term
  t_term=$(q 'select clock_timestamp()')
  kill -TERM "${W_PID[A]}"
  assert_worker_exit A 20 0
  assert_eq "queue after the drain" "$(status_counts)" "done=4 pending=4"
  assert_eq "running tasks finished after SIGTERM" \
    "$(q "select count(*) from execs where finished > '$t_term'::timestamptz")" 4
  assert_eq "waiting tasks untouched" \
    "$(q "select count(*) from agent_work_queue where status = 'pending' and attempts = 0
          and lease_owner is null")" 4
  log_has A "draining" || fail "no 'draining' in A's log"$'\n'"$(worker_log A)"

  # Part 2: a 30 s task, --drain-timeout 1: gives its lease back and exits promptly.
  run_setup long
  printf '{"payload":{"sleep":30,"after":true}}\n' >"$T_TMP/long.jsonl"
  enqueue_file "$T_TMP/long.jsonl" 1
  start_worker B "$FIX/record.lua" --concurrency 2 --drain-timeout 1 --poll-ms 20-50
  wait_for "the long task to start" 20 q_true "select count(*) = 1 from execs"
  local t0
  t0=$(_t_now_us)
  kill -TERM "${W_PID[B]}"
  assert_worker_exit B 10 0
  local ms=$((($(_t_now_us) - t0) / 1000))
  ((ms < 4000)) || fail "B took ${ms} ms to exit after SIGTERM with --drain-timeout 1"
  assert_eq "long task after the drain (status|attempts|locked_until)" \
    "$(q "select status, attempts, coalesce(locked_until::text, 'null') from agent_work_queue")" \
    "pending|0|null"
  assert_eq "runnable at once" "$(q 'select run_after <= now() from agent_work_queue')" t
  assert_eq "writes after the sleep" "$(q 'select count(*) from after_rows')" 0
  log_has B "drain timeout: 1 lease given back to pending" \
    || fail "no drain timeout line in B's log"$'\n'"$(worker_log B)"
  assert_no_sanitizer_reports
}

# 8b. A drain that begins while tasks are buffered (claimed, not started) and others have
# just finished gives the buffered ones back and still settles the finished ones: the drain
# ends at once with nothing leased, not at the drain deadline (the finished ones were once
# dropped with the buffer, stayed held, and the worker never exited). Short tasks keep the
# ready buffer full; five workers in turn, so that a SIGTERM lands mid-stream (the old code
# hung in about half of the runs of this case).
case_drain_with_buffered_tasks_settles_the_finished_ones() {
  run_setup
  local i n=6000
  for i in $(seq 1 "$n"); do
    printf '{"payload":{"sleep":0.003}}\n'
  done >"$T_TMP/many.jsonl"
  enqueue_file "$T_TMP/many.jsonl" "$n"
  local w before
  for w in A B C D E; do
    before=$(q "select count(*) from execs where finished is not null")
    start_worker "$w" "$FIX/record.lua" --concurrency 4 --claim-batch 64 --drain-timeout 20 \
      --poll-ms 20-50
    wait_for "$w to run 150 tasks" 30 q_true \
      "select count(*) >= $before + 150 from execs where finished is not null"
    kill -TERM "${W_PID[$w]}"
    # Well within the drain timeout: only the tasks running at SIGTERM (3 ms each) remain.
    assert_worker_exit "$w" 10 0
    assert_eq "rows still leased after $w's drain" \
      "$(q "select count(*) from agent_work_queue where status = 'leased'")" 0
    log_has "$w" "drain timeout" && fail "$w reached the drain deadline"$'\n'"$(worker_log "$w")"
  done
  assert_eq "every execution that finished was settled done" \
    "$(q "select count(*) from execs e join agent_work_queue q on q.id = e.task_id
          where e.finished is not null and q.status <> 'done'")" 0
  assert_no_sanitizer_reports
}

# 9. A script that does not load stops `run` at start (exit 1, the Lua error on stderr);
# an unknown option is a usage error (exit 2).
case_script_load_failure_exits_1() {
  run_setup
  expect_exit 1 "$LEASH" run "$FIX/syntax_error.lua" --until-empty
  local err
  err=$(<"$T_ERR")
  assert_contains "stderr of a script that does not compile" "$err" "syntax_error.lua:3:"
  assert_contains "stderr of a script that does not compile" "$err" "near 'then'"
  expect_exit 2 "$LEASH" run "$FIX/noop.lua" --no-such-option
  assert_contains "stderr of an unknown option" "$(<"$T_ERR")" "--no-such-option"
  expect_exit 1 "$LEASH" run "$FIX/does_not_exist.lua" --until-empty
  assert_contains "stderr of a missing script" "$(<"$T_ERR")" "does_not_exist.lua"
  assert_no_sanitizer_reports
}

# 10. JSON payload values reach Lua with their types, and leash.ok(payload) stores them back
# unchanged (jsonb equality).
case_payload_types_reach_lua() {
  run_setup
  local unit="漢字かな한글中文" big="" i
  for ((i = 0; i < 4000; i++)); do big+=$unit; done
  local chars=$((8 * 4000)) bytes
  bytes=$(printf '%s' "$big" | wc -c)
  printf '{"payload":{"int":1,"float":1.5,"neg":-42,"null":null,"yes":true,"no":false,"arr":[1,"two",3.5,true,null,{"k":"v"}],"obj":{"a":{"name":"deep","b":[1,2,{"c":null}]}},"empty_obj":{},"empty_arr":[],"escapes":"tab\\there \\"quoted\\" back\\\\slash\\nnew line","big":"%s","big_chars":%d,"big_bytes":%d}}\n' \
    "$big" "$chars" "$bytes" >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 1
  expect_exit 0 "$LEASH" run "$FIX/payload_types.lua" --until-empty --poll-ms 20-50
  assert_eq "row after the run (status|last_error)" \
    "$(q "select status || '|' || coalesce(last_error, '') from agent_work_queue")" "done|"
  assert_eq "result = payload (jsonb)" "$(q 'select result = payload from agent_work_queue')" t
  assert_eq "empty object and array kept apart" \
    "$(q "select jsonb_typeof(result->'empty_obj') || ',' || jsonb_typeof(result->'empty_arr')
            from agent_work_queue")" "object,array"
  assert_no_sanitizer_reports
}

# 11. --tenant A claims only A's tasks, and --until-empty exits once A's scope is settled
# even though B's tasks are still pending.
case_tenant_scope() {
  run_setup
  local i
  for i in $(seq 1 20); do
    printf '{"tenant_id":"%s","payload":{}}\n' "$([[ $((i % 2)) == 0 ]] && echo A || echo B)"
  done >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 20
  start_worker W "$FIX/record.lua" --tenant A --concurrency 4 --until-empty --poll-ms 20-50
  assert_worker_exit W 30 0
  assert_eq "tenant A" "$(q "select status || '=' || count(*) from agent_work_queue where tenant_id = 'A' group by status")" "done=10"
  assert_eq "tenant B" "$(q "select status || ':' || max(attempts) || '=' || count(*) from agent_work_queue where tenant_id = 'B' group by status")" "pending:0=10"
  assert_eq "tenants executed" "$(q "select string_agg(distinct tenant, ',') from execs")" "A"
  log_has W "queue empty for this scope" || fail "no until-empty line in W's log"$'\n'"$(worker_log W)"
  assert_no_sanitizer_reports
}

# 12. Heartbeats are batched: one UPDATE renews every lease the process holds.
case_heartbeat_is_batched() {
  run_setup
  q "create table hb_count (at timestamptz not null default clock_timestamp(), n int not null);
     create function hb_count_f() returns trigger language plpgsql as \$\$
     begin insert into hb_count (n) select count(*) from new_rows; return null; end \$\$;
     create trigger hb_count after update on agent_work_queue referencing new table as new_rows
       for each statement execute function hb_count_f()" >/dev/null
  local i
  for i in $(seq 1 20); do printf '{"payload":{"sleep":60}}\n'; done >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 20
  start_worker A "$FIX/record.lua" --concurrency 20 --visibility 5s --heartbeat 200ms \
    --drain-timeout 1 --poll-ms 20-50
  wait_for "20 tasks to run" 30 q_true \
    "select count(*) = 20 from execs where finished is null
     and (select count(*) from agent_work_queue where status = 'leased') = 20"
  local t0
  t0=$(q 'select clock_timestamp()')
  wait_for "2 s of server time" 10 q_true "select clock_timestamp() > '$t0'::timestamptz + interval '2 s'"
  local window="at > '$t0'::timestamptz and at <= '$t0'::timestamptz + interval '2 s'"
  local stmts rows
  stmts=$(q "select count(*) from hb_count where $window and n > 0")
  rows=$(q "select coalesce(sum(n), 0) from hb_count where $window and n > 0")
  echo "# heartbeat window: $stmts UPDATE statements touching $rows rows in 2 s" >&2
  ((stmts >= 5 && stmts <= 15)) \
    || fail "UPDATE statements touching rows in 2 s: $stmts (want ~10: one per 200 ms heartbeat)"
  assert_eq "rows per heartbeat statement (all 20 leases each time)" \
    "$(q "select string_agg(distinct n::text, ',') from hb_count where $window and n > 0")" 20
  assert_eq "leases still held" "$(q "select count(*) from agent_work_queue where status = 'leased'")" 20
  assert_no_sanitizer_reports
}

# Extra: heartbeats racing settles. One worker, leases (2 s) far longer than its tasks (2-12 ms),
# a heartbeat every 2 ms so that renewals keep meeting settles: no lease can be lost, so the
# host must not say one was ("lease lost ... the outcome will be discarded") for a task whose
# outcome it is writing.
case_heartbeat_racing_settle_loses_nothing() {
  run_setup
  seq 1 6000 | awk '{ print "{\"payload\":{\"min\":0.002,\"max\":0.012}}" }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 6000
  start_worker A "$FIX/sleep.lua" --concurrency 32 --visibility 2s --heartbeat 2ms \
    --until-empty --poll-ms 10-20
  assert_worker_exit A 120 0
  assert_eq "queue after the batch" "$(status_counts)" "done=6000"
  assert_eq "rows with attempts <> 1" "$(q 'select count(*) from agent_work_queue where attempts <> 1')" 0
  assert_contains "A's summary" "$(worker_log A)" "6000 done, 0 retried, 0 dead, 0 lost"
  local lost
  lost=$(grep -F "lease lost" "$T_TMP/A.log" || true)
  assert_eq "'lease lost' warnings for tasks that were settled done" "$lost" ""
  assert_no_sanitizer_reports
}

# Extra: connections do not grow with the number of slots (claim + lease; the script pool
# opens on use).
case_connections_do_not_grow_with_slots() {
  run_setup
  local n c10 c100
  for n in 10 100; do
    start_worker "W$n" "$FIX/noop.lua" --concurrency "$n" --poll-ms 20-50 --drain-timeout 1
    wait_for "W$n to run" 20 log_has "W$n" "running $n slots"
    wait_for "W$n's connections" 10 q_true \
      "select count(*) >= 2 from pg_stat_activity where datname = current_database()
         and application_name like 'leash%'"
    local c
    c=$(q "select count(*) from pg_stat_activity where datname = current_database()
             and application_name like 'leash%'")
    echo "# idle connections at --concurrency $n: $c" >&2
    [[ $n == 10 ]] && c10=$c || c100=$c
    t_kill "${W_PID[W$n]}"
    wait_for "W$n's connections to close" 10 q_true \
      "select count(*) = 0 from pg_stat_activity where datname = current_database()
         and application_name like 'leash%'"
  done
  assert_eq "connections at 100 slots vs 10" "$c100" "$c10"
  # claim, settle, lease, the canary's poll, the provider batcher's
  ((c100 <= 5)) || fail "idle connections at --concurrency 100: $c100 (want <= 5)"
  assert_no_sanitizer_reports
}

# A worker whose slots are all busy waits for one to finish; it does not poll in a loop. Two
# slots each sleep 3 s in leash.sleep: over that time the process may use a fraction of a
# core-second. (The dispatcher once spun on clock_gettime here, a whole core, whenever its
# poll time had passed while no slot was free.)
case_busy_slots_do_not_spin() {
  run_setup
  {
    printf '{"payload":{"min":3,"max":3}}\n'
    printf '{"payload":{"min":3,"max":3}}\n'
  } >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 2
  start_worker A "$FIX/sleep.lua" --concurrency 2 --poll-ms 20-50
  local pid=${W_PID[A]}
  wait_for "both slots to be busy" 20 q_true "select count(*) = 2 from agent_work_queue where status = 'leased'"
  local t0 t1 ticks
  t0=$(_cpu_ticks "$pid")
  sleep 2
  t1=$(_cpu_ticks "$pid")
  ticks=$(getconf CLK_TCK)
  echo "# CPU while both slots slept: $((t1 - t0)) ticks of 1/$ticks s in 2 s" >&2
  # Under valgrind or a sanitizer everything costs more; a spin costs a whole core.
  (((t1 - t0) * 4 < ticks * 2)) || fail "the worker used $((t1 - t0))/$ticks s of CPU in 2 s with every slot asleep"
  assert_no_sanitizer_reports
}

# The wake-up (NOTIFY) reaches idle workers. With a 3 s poll, a missed wake-up shows as a
# pickup of seconds: (1) an insert into an empty queue; (2) an insert on a free shard behind
# a backlog of rows whose shard is busy (a rule "notify only when the backlog was empty"
# would skip this one); (3) a burst of 50 rows from 5 parallel producers, each row its own
# transaction: every row starts well within the poll.
case_wakeups_reach_idle_workers() {
  run_setup
  start_worker A "$FIX/record.lua" --concurrency 3 --poll-ms 3000-3000
  wait_for "A to run" 20 log_has A "running 3 slots"
  sleep 4   # past the first poll: from here on only a NOTIFY wakes A quickly
  _pickup_ms() {
    q "select round(extract(epoch from e.started - q.created_at) * 1000)
         from agent_work_queue q join execs e on e.task_id = q.id where q.shard_key = '$1'
        order by e.started limit 1"
  }
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('default', 'first', '{}')" >/dev/null
  wait_for "the first row to run" 5 q_true "select count(*) = 1 from execs e join agent_work_queue q on q.id = e.task_id where q.shard_key = 'first'"
  local ms
  ms=$(_pickup_ms first)
  echo "# pickup into an empty queue: $ms ms" >&2
  ((ms < 1500)) || fail "an insert into an empty queue waited $ms ms (no wake-up?)"
  # A busy shard with a backlog, then a row on a free shard.
  q "insert into agent_work_queue (tenant_id, shard_key, payload)
       select 'default', 'busy', '{\"sleep\": 6}' from generate_series(1, 4)" >/dev/null
  wait_for "the busy shard's first row to run" 10 q_true "select count(*) = 1 from agent_work_queue where shard_key = 'busy' and status = 'leased'"
  sleep 4
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('default', 'free', '{}')" >/dev/null
  wait_for "the free shard's row to run" 5 q_true "select count(*) = 1 from execs e join agent_work_queue q on q.id = e.task_id where q.shard_key = 'free'"
  ms=$(_pickup_ms free)
  echo "# pickup behind a blocked backlog: $ms ms" >&2
  ((ms < 1500)) || fail "a row on a free shard behind a blocked backlog waited $ms ms"
  # A burst from parallel producers.
  local i pids=()
  for i in $(seq 1 5); do
    ( for j in $(seq 1 10); do
        echo "insert into agent_work_queue (tenant_id, shard_key, payload) values ('default', 'burst$i-$j', '{}');"
      done ) | psql -X -q -d "$DATABASE_URL" >/dev/null &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  wait_for "the burst to be done" 20 q_true "select count(*) = 50 from agent_work_queue where shard_key like 'burst%' and status = 'done'"
  ms=$(q "select round(max(extract(epoch from e.started - q.created_at)) * 1000)
            from agent_work_queue q
            join (select task_id, min(started) as started from execs group by task_id) e
              on e.task_id = q.id
           where q.shard_key like 'burst%'")
  echo "# slowest pickup of the burst: $ms ms" >&2
  ((ms < 1500)) || fail "a row of the parallel burst waited $ms ms (a wake-up missed?)"
  assert_no_sanitizer_reports
}

# The cycle keeps its plans for the whole session (007: generic plans). Plans made while the
# table was empty must still walk the indexes once it is full: before 009 they were a
# sequential scan with a sequential-scan NOT EXISTS per row, kept until autovacuum refreshed
# the statistics (the claim took 4 ms at 200 rows, and grew with the square of the rows).
# auto_explain prints every statement the cycle runs, with its plan, to this session.
case_cycle_plans_do_not_depend_on_the_first_statistics() {
  run_setup
  q "vacuum analyze agent_work_queue" >/dev/null
  local out
  out=$(psql -X -A -t -v ON_ERROR_STOP=1 -d "$DATABASE_URL" 2>&1 <<'SQL'
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET client_min_messages = log;
-- The first call of the session, on the empty table: its plans are made now.
SELECT count(*) FROM agent_work_queue_cycle('w1', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}',
                                            '{}', 1, 60, NULL, NULL, NULL, 0);
INSERT INTO agent_work_queue (tenant_id, shard_key, payload)
SELECT 't', 'k' || g, '{}' FROM generate_series(1, 3000) g;
SELECT id AS claimed, token AS tok
  FROM agent_work_queue_cycle('w1', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', 1, 60,
                              NULL, NULL, NULL, 0)
 WHERE settled = false \gset
SELECT count(*) FROM agent_work_queue_cycle('w1', ARRAY[:claimed]::bigint[], ARRAY[:tok]::bigint[],
                                            ARRAY['done'], ARRAY[NULL]::float8[],
                                            ARRAY[NULL]::text[], ARRAY['{}']::jsonb[],
                                            ARRAY['none'], ARRAY[false], ARRAY[0.001], 1, 60,
                                            NULL, NULL, NULL, 0);
SET auto_explain.log_min_duration = -1;
SELECT 'done rows: ' || count(*) FROM agent_work_queue WHERE status = 'done';
SQL
  ) || fail "the cycle failed: $out"
  assert_contains "the settle applied" "$out" "done rows: 1"
  # Since 011 the claim reads heads only (heads_ready_idx since 013): never claim_idx, whose rows include
  # every pending row parked behind a busy shard.
  assert_contains "the claim walks heads_ready_idx" "$out" "Index Scan using agent_work_queue_heads_ready_idx"
  # (The queue table itself: a scan of a side table of a few rows, the holds, is fine.)
  if grep -qE "Seq Scan on agent_work_queue( |$)" <<<"$out"; then
    fail "a plan of the cycle scans the table: $(grep -E -B3 -A3 "Seq Scan on agent_work_queue( |$)" <<<"$out" | head -20)"
  fi
}

# _cpu_ticks PID: user + system time of PID so far, in clock ticks.
_cpu_ticks() {
  local stat
  stat=$(<"/proc/$1/stat")
  stat=${stat##*) }
  local -a f
  read -r -a f <<<"$stat"
  echo $((f[11] + f[12]))
}

t_run "$@"
