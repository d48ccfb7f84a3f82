#!/usr/bin/env bash
# Snooze and backoff (issue #15, item 1; sql/012_snooze.sql, README "Snooze and backoff"):
# a snooze puts a task back to pending after its delay without spending an attempt, bounded
# by max_snoozes (then it is a retry, and dead once attempts run out, cause snooze_limit);
# bad snooze delays are the script's error; a retry's backoff is jittered and its base and
# cap are the run's unless the task names its own; snoozed rows wait their lane's turn.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
SNOOZER=$LEASH_SRC/tests/fixtures/snooze/snoozer.lua

# row SHARD COLUMNS: the columns of the row with shard_key SHARD, '|'-separated.
row() { q "select $2 from agent_work_queue where shard_key = '$1'"; }

# wait_settled DEADLINE: until nothing is pending or leased.
wait_settled() {
  wait_for "every task to settle ($(status_counts))" "$1" q_true \
    "select not exists (select 1 from agent_work_queue where status in ('pending', 'leased'))"
}

case_a_task_snoozing_five_times_then_succeeding_has_spent_one_attempt() {
  run_setup
  # max_attempts 2: five snoozes that spent attempts would kill it; the table form too.
  {
    printf '{"shard_key":"s5","max_attempts":2,"payload":{"snooze":5,"delay":0.05}}\n'
    printf '{"shard_key":"t5","max_attempts":2,"payload":{"snooze":5,"delay":0.05,"form":"table"}}\n'
    printf '{"shard_key":"s0","max_attempts":2,"max_snoozes":0,"payload":{}}\n'
  } >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 3
  start_worker A "$SNOOZER" --concurrency 2 --poll-ms 10-30 --until-empty
  assert_worker_exit A 60 0
  assert_eq "the snoozing task: done, attempts 1, 5 snoozes of 0.05 s" \
    "$(row s5 "status, attempts, snoozes, round(snoozed_s::numeric, 3), result->>'runs'")" \
    "done|1|5|0.250|5"
  assert_eq "the table form: the same" \
    "$(row t5 "status, attempts, snoozes, round(snoozed_s::numeric, 3)")" "done|1|5|0.250"
  assert_eq "every execution of both saw attempt 1" \
    "$(q "select count(*), count(*) filter (where attempt = 1) from execs where shard in ('s5', 't5')")" \
    "12|12"
  assert_contains "the worker logs the snoozes as snoozes" "$(worker_log A)" "snooze: busy upstream"
}

case_the_snooze_bound_turns_a_snooze_into_a_retry_and_then_dead_with_a_clear_cause() {
  run_setup
  {
    printf '{"shard_key":"b3","max_attempts":2,"max_snoozes":3,"payload":{"snooze":"forever","delay":0}}\n'
    printf '{"shard_key":"b0","max_attempts":1,"max_snoozes":0,"payload":{"snooze":"forever","delay":0}}\n'
  } >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 2
  start_worker A "$SNOOZER" --poll-ms 10-30 --until-empty
  assert_worker_exit A 60 0
  assert_eq "3 snoozes, then 2 snoozes that spent the 2 attempts: dead, snooze_limit" \
    "$(row b3 "status, attempts, snoozes, last_cause")" "dead|2|3|snooze_limit"
  assert_eq "executions: 3 given back + 2 spent" \
    "$(q "select count(*) from execs where shard = 'b3'")" 5
  assert_eq "the last error says why" "$(row b3 last_error)" \
    "snooze_limit: snoozed 3 times (max_snoozes 3), so this snooze spent an attempt: busy upstream"
  assert_eq "max_snoozes 0: the first snooze is a retry (dead on its only attempt)" \
    "$(row b0 "status, attempts, snoozes, last_cause")" "dead|1|0|snooze_limit"
  # A requeue starts the count again.
  local id
  id=$(row b3 id)
  expect_exit 0 "$LEASH" requeue --id "$id"
  assert_eq "requeued: attempts and snoozes 0" "$(row b3 "status, attempts, snoozes, snoozed_s")" \
    "pending|0|0|0"
}

case_bad_snooze_delays_are_the_scripts_error_and_spend_the_attempt() {
  run_setup
  local v
  for v in nan inf negative string missing hand_nan hand_inf hand_negative hand_string \
           hand_missing table_nan table_no_after table_typo huge; do
    printf '{"shard_key":"%s","max_attempts":1,"payload":{"bad":"%s"}}\n' "$v" "$v"
  done >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 14
  start_worker A "$SNOOZER" --concurrency 4 --poll-ms 10-30
  wait_for "the bad snoozes to settle" 60 q_true \
    "select count(*) = 14 from agent_work_queue where status <> 'leased' and finished_at is not null"
  kill -TERM "${W_PID[A]}"
  assert_worker_exit A 20 0
  # leash.snooze and leash.retry{} refuse a bad delay where they are called: a raised error.
  for v in nan inf negative string missing table_nan table_no_after table_typo; do
    assert_eq "$v: raised where it was called, the attempt spent" \
      "$(row "$v" "status, attempts, snoozes, last_cause")" "dead|1|0|script_error"
  done
  assert_contains "nan" "$(row nan last_error)" \
    "bad argument #1 to 'snooze' (delay must be a finite number of seconds >= 0)"
  assert_contains "string" "$(row string last_error)" "bad argument #1 to 'snooze' (number of seconds expected, got string)"
  assert_contains "missing" "$(row missing last_error)" "number of seconds expected, got no value"
  assert_contains "table_nan" "$(row table_nan last_error)" "leash.retry{...}: after must be a finite number of seconds >= 0"
  assert_contains "table_no_after" "$(row table_no_after last_error)" "spend = false (a snooze) needs after = seconds"
  assert_contains "table_typo" "$(row table_typo last_error)" "unknown field aftr"
  # A delay changed by hand on the outcome is a contract error.
  for v in hand_nan hand_inf hand_negative hand_string hand_missing; do
    assert_eq "$v: a contract error, the attempt spent" \
      "$(row "$v" "status, attempts, snoozes, last_cause")" "dead|1|0|contract"
  done
  assert_eq "hand_nan's message" "$(row hand_nan last_error)" \
    "snooze delay must be a finite number of seconds >= 0, not NaN (message: by hand)"
  assert_eq "hand_string's message" "$(row hand_string last_error)" \
    "snooze delay must be a finite number of seconds >= 0, not a string (message: by hand)"
  assert_eq "hand_missing's message" "$(row hand_missing last_error)" \
    "snooze delay must be a finite number of seconds >= 0, not a nil (message: by hand)"
  # A huge delay is cut to an hour, like a retry's, and given back.
  assert_eq "huge: snoozed for 3600 s, the attempt given back" \
    "$(row huge "status, attempts, snoozes, last_cause, snoozed_s,
                 to_char(extract(epoch from run_after - finished_at), 'FM999990.000')")" \
    "pending|0|1|snoozed|3600|3600.000"
}

# burst_waits JITTER...: 40 tasks with max_attempts 2 run by one worker with --backoff-base
# 8 (the first backoff is 8 s) and the given jitter flags until they are dead: attempt 1
# retries, attempt 2 records the wait the first settle wrote (run_after - finished_at: the
# claim leaves both) and retries again, dead. Prints the 40 waits (s), one a line. Recorded
# by the next attempt, so a short wait (full jitter) cannot be overwritten before it is read.
burst_waits() {
  run_setup
  q "create table waits (task_id bigint, attempts int, wait float8)" >/dev/null
  local i
  for ((i = 0; i < 40; i++)); do
    printf '{"max_attempts":2,"payload":{"retry":true,"record_wait":true}}\n'
  done >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 40
  start_worker J "$SNOOZER" --concurrency 8 --poll-ms 10-30 --backoff-base 8 --until-empty "$@"
  assert_worker_exit J 120 0
  assert_eq "the burst: 40 dead after two attempts, 40 waits recorded" \
    "$(q "select count(*) filter (where status = 'dead' and attempts = 2),
                 (select count(*) from waits where attempts = 2) from agent_work_queue")" "40|40"
  q "select wait from waits where attempts = 2"
}
# stats: "min max stddev distinct" of the numbers on stdin (distinct to the millisecond).
stats() {
  awk '{ x[NR] = $1; s += $1; if (NR == 1 || $1 < lo) lo = $1; if (NR == 1 || $1 > hi) hi = $1;
         d[sprintf("%.3f", $1)] = 1 }
       END { m = s / NR; for (i = 1; i <= NR; i++) v += (x[i] - m) ^ 2; n = 0; for (k in d) n++;
             printf "%.3f %.3f %.3f %d\n", lo, hi, sqrt(v / NR), n }'
}

# With equal jitter (the default) the waits of a burst lie in [4, 8] s and spread: a uniform
# spread over 4 s has a standard deviation of 1.15 s; below 0.6 s, or fewer than 30 distinct
# waits (to the millisecond) out of 40, is far less likely than one in a million by chance.
# Without jitter every wait is 8 s; full jitter spreads them over [0, 8] (sd 2.3 s).
case_jitter_spreads_the_retry_times_of_a_burst() {
  local lo hi sd n w
  burst_waits >"$T_TMP/equal"
  read -r lo hi sd n < <(stats <"$T_TMP/equal")
  w=$(sort -n "$T_TMP/equal" | tr '\n' ' ')
  awk -v lo="$lo" -v hi="$hi" 'BEGIN { exit !(lo >= 3.999 && hi <= 8.001) }' \
    || fail "equal jitter: waits from $lo to $hi s, want within [4, 8]: $w"
  awk -v sd="$sd" -v n="$n" 'BEGIN { exit !(sd >= 0.6 && n >= 30) }' \
    || fail "equal jitter: standard deviation $sd s over $n distinct waits; want >= 0.6 s and >= 30: $w"
  local equal_sd=$sd
  burst_waits --backoff-jitter 0 >"$T_TMP/none"
  read -r lo hi sd n < <(stats <"$T_TMP/none")
  assert_eq "no jitter: every wait 8 s" "$lo $hi $n" "8.000 8.000 1"
  burst_waits --backoff-jitter 1 >"$T_TMP/full"
  read -r lo hi sd n < <(stats <"$T_TMP/full")
  w=$(sort -n "$T_TMP/full" | tr '\n' ' ')
  awk -v lo="$lo" -v hi="$hi" -v sd="$sd" 'BEGIN { exit !(lo >= 0 && lo < 4 && hi <= 8.001 && sd >= 1.2) }' \
    || fail "full jitter: waits from $lo to $hi s (sd $sd); want within [0, 8], some below 4, sd >= 1.2: $w"
  echo "figures: 40 waits of d = 8 s: equal jitter sd $equal_sd s, full jitter sd $sd s"
}

# The run's --backoff-base/--backoff-cap, and a task's own (enqueue flags, JSONL fields)
# beating them. Each row starts at attempts 1 with max_attempts 3: attempt 2 retries and
# waits least(cap, base^2), attempt 3 records that wait (the fixture reads the row the
# settle left) and dies.
case_per_run_and_per_task_backoff_are_honoured() {
  run_setup
  q "create table waits (task_id bigint, attempts int, wait float8)" >/dev/null
  local p='{"retry":true,"record_wait":true}'
  "$LEASH" enqueue --shard run --max-attempts 3 "$p" >/dev/null
  "$LEASH" enqueue --shard flags --max-attempts 3 --backoff-base 2 --backoff-cap 5 "$p" >/dev/null
  {
    printf '{"shard_key":"line","backoff_base":1.5,"backoff_cap":100,"payload":%s}\n' "$p"
    printf '{"shard_key":"line_cap","backoff_cap":2,"payload":%s}\n' "$p"
    printf '{"shard_key":"line_zero","backoff_cap":0,"payload":%s}\n' "$p"
  } | "$LEASH" enqueue --backoff-base 4 --max-attempts 3 --file - >/dev/null
  q "update agent_work_queue set attempts = 1" >/dev/null
  assert_eq "what enqueue stored (NULL: the run's)" \
    "$(q "select string_agg(shard_key || '=' || coalesce(backoff_base::text, '-') || '/' ||
                            coalesce(backoff_cap::text, '-'), ' ' order by id) from agent_work_queue")" \
    "run=-/- flags=2/5 line=1.5/100 line_cap=4/2 line_zero=4/0"
  start_worker B "$SNOOZER" --poll-ms 10-30 --backoff-base 10 --backoff-cap 3 --backoff-jitter 0 \
    --until-empty
  assert_worker_exit B 60 0
  assert_eq "waits: run least(3, 10^2); flags least(5, 2^2); line least(100, 1.5^2); line_cap least(2, 4^2); cap 0" \
    "$(q "select string_agg(q.shard_key || '=' || to_char(w.wait, 'FM990.000'), ' ' order by q.id)
            from waits w join agent_work_queue q on q.id = w.task_id where w.attempts = 3")" \
    "run=3.000 flags=4.000 line=2.250 line_cap=2.000 line_zero=0.000"
  # Out of bounds: usage errors, nothing written.
  expect_exit 2 "$LEASH" run "$SNOOZER" --backoff-base 0.5
  expect_exit 2 "$LEASH" run "$SNOOZER" --backoff-base nan
  expect_exit 2 "$LEASH" run "$SNOOZER" --backoff-cap 2d
  expect_exit 2 "$LEASH" run "$SNOOZER" --backoff-cap -1
  expect_exit 2 "$LEASH" run "$SNOOZER" --backoff-jitter 1.5
  expect_exit 2 "$LEASH" run "$SNOOZER" --backoff-jitter inf
  expect_exit 2 "$LEASH" enqueue --backoff-base 1001 '{}'
  expect_exit 2 "$LEASH" enqueue --backoff-cap 100000 '{}'
  expect_exit 2 "$LEASH" enqueue --max-snoozes -1 '{}'
  expect_exit 2 "$LEASH" enqueue --file - <<<'{"payload":{},"backoff_base":0}'
  expect_exit 2 "$LEASH" enqueue --file - <<<'{"payload":{},"max_snoozes":1.5}'
  assert_eq "nothing more was enqueued" "$(q "select count(*) from agent_work_queue")" 5
  # Plain SQL meets the same bounds (the columns' CHECKs).
  expect_exit 1 psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
    -c "insert into agent_work_queue (payload, backoff_base) values ('{}', 0.5)"
  expect_exit 1 psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
    -c "insert into agent_work_queue (payload, max_snoozes) values ('{}', -1)"
}

# Rows 1-4 of one lane, row 1 snoozing once for 1.5 s: it waits its turn like a retry (the
# lane hands over to rows 2, 3, 4, which are older by run_after), then runs again; the lane's
# executions never overlap, with three processes claiming. A second lane does the same.
case_snoozed_rows_of_a_lane_keep_the_lane_order_and_the_lane_hands_over() {
  run_setup
  local lane i
  for lane in L1 L2; do
    printf '{"shard_key":"%s","payload":{"snooze":1,"delay":1.5}}\n' "$lane"
    for ((i = 2; i <= 4; i++)); do printf '{"shard_key":"%s","payload":{"sleep":0.05}}\n' "$lane"; done
  done >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 8
  for i in 1 2 3; do start_worker "W$i" "$SNOOZER" --concurrency 2 --poll-ms 10-30 --until-empty; done
  for i in 1 2 3; do assert_worker_exit "W$i" 60 0; done
  for lane in L1 L2; do
    assert_eq "$lane: executions in lane order, the snoozed row last" \
      "$(q "select string_agg((e.task_id - f.first + 1)::text, ' ' order by e.started)
              from execs e, (select min(id) first from agent_work_queue where shard_key = '$lane') f
             where e.shard = '$lane'")" "1 2 3 4 1"
  done
  assert_eq "no two executions of a lane overlap" \
    "$(q "select count(*) from execs a join execs b on a.shard = b.shard and a.id < b.id
           where a.started < b.finished and b.started < a.finished")" 0
  assert_eq "every row done on its first attempt, each snoozed row snoozed once" \
    "$(q "select string_agg(distinct status || ':' || attempts || ':' || snoozes, ' ') from agent_work_queue")" \
    "done:1:0 done:1:1"
}

# Three processes, 200 tasks in 20 lanes, each snoozing twice: all done, nothing run twice at
# once, no attempt spent, every execution counted.
case_three_processes_snoozing_at_once_lose_and_double_nothing() {
  run_setup
  local i
  for ((i = 0; i < 200; i++)); do
    printf '{"shard_key":"lane%d","max_attempts":1,"payload":{"snooze":2,"delay":0.02}}\n' $((i % 20))
  done >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 200
  for i in 1 2 3; do start_worker "P$i" "$SNOOZER" --concurrency 4 --poll-ms 10-30 --until-empty; done
  for i in 1 2 3; do assert_worker_exit "P$i" 240 0; done
  assert_eq "all done, attempts 1, two snoozes each" \
    "$(q "select status, attempts, snoozes, count(*) from agent_work_queue group by 1, 2, 3")" \
    "done|1|2|200"
  assert_eq "executions: three per task, every one attempt 1" \
    "$(q "select count(*), count(distinct task_id), count(*) filter (where attempt = 1) from execs")" \
    "600|200|600"
  assert_eq "no two executions of a lane overlap" \
    "$(q "select count(*) from execs a join execs b on a.shard = b.shard and a.id < b.id
           where a.started < b.finished and b.started < a.finished")" 0
  assert_eq "more than one process ran them" \
    "$(q "select count(distinct worker) > 1 from execs")" t
  assert_no_sanitizer_reports
}

t_run "$@"
