#!/usr/bin/env bash
# The SQL API (issue #17, sql/015_sql_api.sql): plain INSERT with the CLI's defaults,
# <table>_enqueue and _enqueue_many, dedup keys (several processes at once), `leash cancel`
# of pending and running tasks (a worker and the cancelling CLI), `leash release` of a gone
# worker's leases, the enqueue examples in Python and Node, and the cause `cancelled` in
# src/lifecycle.c and the testing kit.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
FIX=$LEASH_SRC/tests/fixtures/sqlapi
QT=agent_work_queue

sqlapi_setup() {
  t_newdb "$@"
  expect_exit 0 "$LEASH" migrate
  q "create table started (task_id bigint, worker text,
                           at timestamptz not null default clock_timestamp());
     create table go (x int)" >/dev/null
}

# q_err SQL: runs SQL that must fail; prints its ERROR line (the first line of stderr).
q_err() {
  local out rc=0
  out=$(psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -c "$1" 2>&1 >/dev/null) || rc=$?
  ((rc != 0)) || fail "this SQL succeeded, it must fail: $1"
  printf '%s\n' "${out%%$'\n'*}"   # not `| head`: a reader gone early is SIGPIPE, an error
}

# ----------------------------------------------------------------------- defaults

case_plain_insert_of_a_payload_gets_the_clis_defaults_and_runs() {
  sqlapi_setup
  local ids
  ids=$(q "insert into $QT (payload) values ('{\"n\": 1}'), ('{\"n\": 2}') returning id" | paste -sd,)
  assert_eq "the rows as the CLI would write them" \
    "$(q "select string_agg(format('%s|%s|%s|%s|%s|%s|%s', tenant_id, shard_key = 'task:' || id,
                   status, max_attempts, max_crashes, priority, is_head), ',' order by id)
            from $QT")" "default|t|pending|8|3|0|t,default|t|pending|8|3|0|t"
  # The same as `leash enqueue` writes (its own row, compared column by column).
  local cli
  cli=$("$LEASH" enqueue '{"n": 3}')
  assert_eq "CLI row and plain-SQL row agree" \
    "$(q "select count(distinct (tenant_id, shard_key = 'task:' || id, status, max_attempts,
                                 max_crashes, priority, is_head, attempts)) from $QT")" 1
  # A shard the insert names is kept; the defaults trigger fires before the heads trigger.
  q "insert into $QT (payload, shard_key) values ('1', 'lane'), ('2', 'lane')" >/dev/null
  assert_eq "one head in the named lane" \
    "$(q "select count(*) filter (where is_head) || '/' || count(*) from $QT where shard_key = 'lane'")" "1/2"
  assert_eq "trigger order: defaults before heads_new_row" \
    "$(q "select string_agg(tgname, ',' order by tgname) from pg_trigger
           where tgrelid = '$QT'::regclass and tgname in ('${QT}_defaults', '${QT}_heads_new_row')")" \
    "${QT}_defaults,${QT}_heads_new_row"
  start_worker A "$FIX/hold.lua" --poll-ms 20-50 --until-empty
  assert_worker_exit A 60 0
  assert_eq "every task done" "$(status_counts)" "done=5"
  : "$ids" "$cli"
}

# ----------------------------------------------------------------------- the functions

case_enqueue_function_takes_every_option_and_refuses_bad_values() {
  sqlapi_setup
  local id
  id=$(q "select ${QT}_enqueue('{\"t\": 1}', tenant => 'acme', shard => 's1', delay_s => 3600,
                               max_attempts => 4, batch => 'b1', priority => 7,
                               dedup_key => 'k1', max_crashes => 2)")
  assert_eq "the row" "$(q "select format('%s|%s|%s|%s|%s|%s|%s|%s|%s', tenant_id, shard_key,
        run_after > now() + interval '3500 s', max_attempts, batch, priority, dedup_key,
        max_crashes, payload) from $QT where id = $id")" 'acme|s1|t|4|b1|7|k1|2|{"t": 1}'
  id=$(q "select ${QT}_enqueue('{\"t\": 2}', run_after => '2030-01-01T00:00:00Z')")
  assert_eq "run_after and the defaults" "$(q "select format('%s|%s|%s|%s|%s', tenant_id,
        shard_key = 'task:' || id, run_after = '2030-01-01T00:00:00Z', max_attempts, priority)
        from $QT where id = $id")" 'default|t|t|8|0'
  local n_before bad
  n_before=$(q "select count(*) from $QT")
  # Each class of bad value, several variants: one clear line each, nothing written.
  while IFS='|' read -r args want; do
    bad=$(q_err "select ${QT}_enqueue($args)")
    assert_contains "enqueue($args)" "$bad" "ERROR:  enqueue: $want"
  done <<'EOF'
NULL|payload must not be null
'null'|payload must not be null
'1', tenant => ''|tenant must be 1 to 512 bytes
'1', tenant => repeat('t', 513)|tenant must be 1 to 512 bytes
'1', shard => ''|shard must be 1 to 512 bytes
'1', shard => repeat('é', 257)|shard must be 1 to 512 bytes
'1', batch => ''|batch must be 1 to 512 bytes
'1', dedup_key => ''|dedup_key must be 1 to 512 bytes
'1', dedup_key => repeat('k', 513)|dedup_key must be 1 to 512 bytes
'1', run_after => now(), delay_s => 1|give either run_after or delay, not both
'1', run_after => 'infinity'|run_after must be a finite timestamp
'1', run_after => '-infinity'|run_after must be a finite timestamp
'1', delay_s => -1|delay must be a number of seconds
'1', delay_s => 'NaN'|delay must be a number of seconds
'1', delay_s => 'Infinity'|delay must be a number of seconds
'1', max_attempts => 0|max_attempts must be from 1 to 1000
'1', max_attempts => 1001|max_attempts must be from 1 to 1000
'1', max_crashes => 0|max_crashes must be from 1 to 1000
'1', priority => 1001|priority must be from -1000 to 1000
'1', priority => -1001|priority must be from -1000 to 1000
EOF
  assert_eq "rows after the refused calls" "$(q "select count(*) from $QT")" "$n_before"
  # The table's own bounds still hold for a plain INSERT (the safety net).
  assert_contains "plain insert of a too long dedup key" \
    "$(q_err "insert into $QT (payload, dedup_key) values ('1', repeat('k', 513))")" "leash_dedup_key_bytes"
}

case_bulk_function_returns_ordinals_ids_and_skips_repeated_keys() {
  sqlapi_setup
  local got
  got=$(q "select string_agg(format('%s:%s', ordinal, inserted), ',' order by ordinal)
             from ${QT}_enqueue_many('[{\"payload\": 1, \"dedup_key\": \"a\"},
                                      {\"payload\": 2},
                                      {\"payload\": 3, \"dedup_key\": \"a\"},
                                      {\"payload\": 4, \"dedup_key\": \"a\", \"tenant_id\": \"other\"},
                                      {\"payload\": 5, \"shard_key\": \"L\", \"delay\": 0.5,
                                       \"max_attempts\": 3, \"batch\": \"b\", \"priority\": -2,
                                       \"max_crashes\": 1, \"run_after\": null}]')" 2>&1 || true)
  # run_after null is a type error (a string is required), like the CLI's line check.
  assert_contains "run_after null refused" "$got" 'element 5: "run_after" must be a string'
  assert_eq "nothing written by the refused call" "$(q "select count(*) from $QT")" 0
  got=$(q "select string_agg(format('%s:%s', ordinal, inserted), ',' order by ordinal)
             from ${QT}_enqueue_many('[{\"payload\": 1, \"dedup_key\": \"a\"},
                                      {\"payload\": 2},
                                      {\"payload\": 3, \"dedup_key\": \"a\"},
                                      {\"payload\": 4, \"dedup_key\": \"a\", \"tenant_id\": \"other\"},
                                      {\"payload\": 5, \"shard_key\": \"L\", \"delay\": 0.5,
                                       \"max_attempts\": 3, \"batch\": \"b\", \"priority\": -2,
                                       \"max_crashes\": 1}]')")
  assert_eq "inserted flags" "$got" "1:t,2:t,3:f,4:t,5:t"
  assert_eq "the repeated key answered the first element's id" \
    "$(q "select count(distinct id) from ${QT}_enqueue_many('[{\"payload\": 9, \"dedup_key\": \"a\"}]')
          union all select count(*) from $QT where dedup_key = 'a' and tenant_id = 'default'" | paste -sd,)" "1,1"
  assert_eq "element 5's fields" "$(q "select format('%s|%s|%s|%s|%s|%s', shard_key, max_attempts, batch,
        priority, max_crashes, run_after > created_at) from $QT where payload = '5'")" "L|3|b|-2|1|t"
  # Bad elements by class, each naming the element; nothing written.
  local n bad
  n=$(q "select count(*) from $QT")
  while IFS='|' read -r arr want; do
    bad=$(q_err "select * from ${QT}_enqueue_many('$arr')")
    assert_contains "enqueue_many($arr)" "$bad" "$want"
  done <<'EOF'
{"payload": 1}|tasks must be a JSON array of objects
[1]|element 1: not a JSON object
[{"payload": 1}, "x"]|element 2: not a JSON object
[{"payload": 1, "tenat_id": "x"}]|element 1: unknown field "tenat_id"
[{"payload": 1}, {"payload": null}]|element 2: payload must not be null
[{}]|element 1: payload must not be null
[{"payload": 1, "tenant_id": 5}]|element 1: "tenant_id" must be a string
[{"payload": 1, "max_attempts": 1.5}]|element 1: "max_attempts" must be a whole number
[{"payload": 1, "max_attempts": "3"}]|element 1: "max_attempts" must be a number
[{"payload": 1, "priority": 1e9}]|element 1: "priority" is out of range
[{"payload": 1, "run_after": "nope"}]|element 1: invalid input syntax for type timestamp
[{"payload": 1, "run_after": "infinity"}]|element 1: run_after must be a finite timestamp
[{"payload": 1, "delay": -1}]|element 1: delay must be a number of seconds
[{"payload": 1, "delay": 1, "run_after": "2030-01-01"}]|element 1: give either run_after or delay
EOF
  assert_eq "rows after the refused calls" "$(q "select count(*) from $QT")" "$n"
}

# ----------------------------------------------------------------------- dedup

case_dedup_key_returns_the_live_task_and_frees_the_key_once_it_finished() {
  sqlapi_setup
  local a b c
  a=$("$LEASH" enqueue --dedup-key nightly-1 '{"n": 1}')
  expect_exit 0 "$LEASH" enqueue --dedup-key nightly-1 '{"n": 2}'
  assert_eq "the second enqueue printed the first id" "$(<"$T_OUT")" "$a"
  assert_eq "and said it skipped" "$(<"$T_ERR")" \
    "leash enqueue: 1 skipped: task $a has this dedup key and is pending or leased"
  b=$(q "select ${QT}_enqueue('{\"n\": 3}', dedup_key => 'nightly-1')")
  assert_eq "the function answers the same id" "$b" "$a"
  c=$("$LEASH" enqueue --tenant other --dedup-key nightly-1 '{"n": 4}')
  [[ $c != "$a" ]] || fail "another tenant's key must be a task of its own"
  # JSONL: a live key, a key repeated in the file, a new key, no key.
  printf '%s\n' '{"payload": 5, "dedup_key": "nightly-1"}' '{"payload": 6, "dedup_key": "n2"}' \
    '{"payload": 7, "dedup_key": "n2"}' '{"payload": 8}' >"$T_TMP/in.jsonl"
  expect_exit 0 "$LEASH" enqueue --file "$T_TMP/in.jsonl"
  assert_eq "lines inserted" "$(<"$T_OUT")" 2
  assert_contains "skipped count" "$(<"$T_ERR")" "leash enqueue: 2 skipped"
  assert_eq "the file's row for n2 is its first line's" "$(q "select payload from $QT where dedup_key = 'n2'")" 6
  # The plain INSERT of a live key fails with the index's error (the safety net).
  assert_contains "plain insert of a live key" \
    "$(q_err "insert into $QT (payload, dedup_key) values ('1', 'nightly-1')")" "${QT}_dedup_idx"
  # Leased still counts; done frees the key.
  q "update $QT set status = 'leased', lease_owner = 'w', attempts = 1, locked_until = now() + interval '1 h' where id = $a" >/dev/null
  assert_eq "leased: same id" "$(q "select ${QT}_enqueue('9', dedup_key => 'nightly-1')")" "$a"
  q "update $QT set status = 'done' where id = $a" >/dev/null
  b=$("$LEASH" enqueue --dedup-key nightly-1 '{"n": 10}')
  [[ $b != "$a" ]] || fail "after the task is done its key must make a new task"
  q "update $QT set status = 'dead' where id = $b" >/dev/null
  c=$(q "select ${QT}_enqueue('11', dedup_key => 'nightly-1')")
  [[ $c != "$b" && $c != "$a" ]] || fail "after the task is dead its key must make a new task"
  # Bad keys: one line, exit 2, nothing written.
  local n
  n=$(q "select count(*) from $QT")
  expect_exit 2 "$LEASH" enqueue --dedup-key '' 1
  expect_exit 2 "$LEASH" enqueue --dedup-key "$(printf 'k%.0s' {1..513})" 1
  assert_contains "too long" "$(<"$T_ERR")" '"dedup_key" is 513 bytes; at most 512'
  printf '%s\n' '{"payload": 1, "dedup_key": 5}' >"$T_TMP/bad.jsonl"
  expect_exit 2 "$LEASH" enqueue --file "$T_TMP/bad.jsonl"
  assert_eq "one line" "$(wc -l <"$T_ERR")" 1
  expect_exit 2 "$LEASH" enqueue --file "$T_TMP/bad.jsonl" --dedup-key x
  assert_eq "rows after the refused enqueues" "$(q "select count(*) from $QT")" "$n"
}

# Twelve processes enqueue one key at once: CLI single form, CLI files, the function and the
# bulk function. They are all held in flight (a session holds the table in EXCLUSIVE mode, so
# the first insert waits and the others wait behind the key's lock), then let go together
# (the holder commits once the test has seen all twelve waiting and inserted its `go` row).
# Without the lock-then-look, they would all pass the look and all but one fail on the index.
case_concurrent_enqueues_of_one_key_from_many_processes_make_one_row() {
  sqlapi_setup
  local round
  for round in 1 2; do
    local key="k$round" pids=() i
    psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$T_TMP/holder.log" 2>&1 <<SQL &
BEGIN;
LOCK TABLE $QT IN EXCLUSIVE MODE;
DO \$\$
BEGIN
  FOR i IN 1..1200 LOOP   -- at most 60 s
    EXIT WHEN EXISTS (SELECT 1 FROM go WHERE x = $round);   -- the test's word: let go
    PERFORM pg_sleep(0.05);
  END LOOP;
END \$\$;
COMMIT;
SQL
    local holder=$!
    t_on_exit t_kill "$holder"
    wait_for "the holder to hold the table" 30 q_true \
      "select count(*) = 1 from pg_locks where relation = '$QT'::regclass and mode = 'ExclusiveLock' and granted"
    printf '{"payload": {"f": 1}, "dedup_key": "%s"}\n{"payload": {"f": 2}}\n' "$key" >"$T_TMP/f.jsonl"
    for i in 1 2 3 4; do
      "$LEASH" enqueue --dedup-key "$key" "{\"cli\": $i}" >"$T_TMP/out.$i" 2>"$T_TMP/err.$i" &
      pids+=($!)
    done
    for i in 5 6 7; do
      "$LEASH" enqueue --file "$T_TMP/f.jsonl" >"$T_TMP/out.$i" 2>"$T_TMP/err.$i" &
      pids+=($!)
    done
    for i in 8 9 10; do
      psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
        -c "select ${QT}_enqueue('{\"fn\": $i}', dedup_key => '$key')" >"$T_TMP/out.$i" 2>"$T_TMP/err.$i" &
      pids+=($!)
    done
    for i in 11 12; do
      psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
        -c "select id from ${QT}_enqueue_many('[{\"payload\": $i, \"dedup_key\": \"$key\"}]')" \
        >"$T_TMP/out.$i" 2>"$T_TMP/err.$i" &
      pids+=($!)
    done
    for i in "${!pids[@]}"; do t_on_exit t_kill "${pids[$i]}"; done
    wait_for "all twelve enqueuers in flight (waiting on a lock)" 60 twelve_waiting
    q "insert into go values ($round)" >/dev/null
    wait "$holder" || fail "the lock holder failed: $(cat "$T_TMP/holder.log")"
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}" || fail "enqueuer $((i + 1)) failed: $(cat "$T_TMP/err.$((i + 1))")"
    done
    assert_eq "round $round: live rows with the key" \
      "$(q "select count(*) from $QT where dedup_key = '$key'")" 1
    local id
    id=$(q "select id from $QT where dedup_key = '$key'")
    for i in 1 2 3 4 8 9 10 11 12; do
      assert_eq "round $round: enqueuer $i's answer" "$(<"$T_TMP/out.$i")" "$id"
    done
    assert_eq "round $round: file lines without a key all landed" \
      "$(q "select count(*) from $QT where payload = '{\"f\": 2}'")" $((3 * round))
  done
  assert_eq "heads after the races" "$(q "select count(*) from $QT where status = 'pending' and is_head is not true")" 0
}

# twelve_waiting: true once twelve sessions of this database wait for a lock (shows them).
twelve_waiting() {
  q "select pid || ' ' || coalesce(wait_event_type, '-') || ' ' || left(query, 60) from pg_stat_activity
      where datname = current_database() and pid <> pg_backend_pid()"
  q "select locktype || ' ' || mode || ' ' || pid from pg_locks where not granted
        and database = (select oid from pg_database where datname = current_database())"
  q_true "select count(*) >= 12 from pg_locks where not granted
            and database = (select oid from pg_database where datname = current_database())"
}

# ----------------------------------------------------------------------- cancel

case_cancel_of_pending_tasks_by_id_batch_and_tenant_hands_each_lane_over() {
  sqlapi_setup
  local a b c
  a=$("$LEASH" enqueue --shard lane --batch b1 '{"n": 1}')
  b=$("$LEASH" enqueue --shard lane --batch b2 '{"n": 2}')
  c=$("$LEASH" enqueue --shard lane --batch b2 '{"n": 3}')
  "$LEASH" enqueue --tenant t2 --batch b3 '{"n": 4}' >/dev/null
  "$LEASH" enqueue --tenant t2 --batch b3 '{"n": 5}' >/dev/null
  assert_eq "the lane's head before" "$(q "select id from $QT where is_head and shard_key = 'lane'")" "$a"
  expect_exit 0 "$LEASH" cancel --id "$a" --json
  assert_eq "cancel --id's counts" "$(<"$T_OUT")" '{"pending":1,"running":0}'
  assert_eq "the cancelled row" "$(q "select format('%s|%s|%s|%s', status, last_cause, last_error, is_head)
                                        from $QT where id = $a")" "dead|cancelled|cancelled|f"
  assert_eq "the lane's next row is its head" "$(q "select id from $QT where is_head and shard_key = 'lane'")" "$b"
  expect_exit 0 "$LEASH" cancel --id "$a" --id 999999
  assert_eq "again, and a missing id: nothing" "$(<"$T_OUT")" "cancelled: 0 pending, 0 running"
  expect_exit 0 "$LEASH" cancel --batch b3
  assert_eq "cancel --batch" "$(<"$T_OUT")" "cancelled: 2 pending, 0 running"
  expect_exit 0 "$LEASH" cancel --tenant nobody
  assert_eq "cancel --tenant of nothing" "$(<"$T_OUT")" "cancelled: 0 pending, 0 running"
  start_worker A "$FIX/hold.lua" --poll-ms 20-50 --until-empty
  assert_worker_exit A 60 0
  assert_eq "the rest of the lane ran" "$(q "select string_agg(task_id::text, ',' order by at) from started")" "$b,$c"
  assert_eq "statuses" "$(q "select string_agg(status || ':' || coalesce(last_cause, '-'), ',' order by id) from $QT")" \
    "dead:cancelled,done:none,done:none,dead:cancelled,dead:cancelled"
  # requeue brings a cancelled task back.
  expect_exit 0 "$LEASH" requeue --id "$a"
  assert_eq "requeued" "$(q "select status || '|' || is_head from $QT where id = $a")" "pending|true"
  # Bad arguments: one line, exit 2, nothing cancelled.
  local args
  for args in "" "--id 0" "--id x" "--batch ''" "--tenant ''" "--id 1 --batch b" "--batch b --tenant t" "extra"; do
    eval "expect_exit 2 \"\$LEASH\" cancel $args"
    assert_eq "cancel $args: one line and the hint" "$(wc -l <"$T_ERR")" 2
  done
  assert_contains "the SQL function wants one scope" \
    "$(q_err "select * from ${QT}_cancel(NULL, NULL, NULL)")" "cancel: give exactly one of ids, batch, tenant"
  assert_contains "and not two" \
    "$(q_err "select * from ${QT}_cancel('{1}', 'b', NULL)")" "cancel: give exactly one of ids, batch, tenant"
  assert_eq "pending after the bad calls" "$(q "select count(*) from $QT where status = 'pending'")" 1
}

# A worker runs a task that stored step "before" and waits; `leash cancel` (another process)
# ends it. The worker's next writes (a step, a child enqueue) are refused, its heartbeat finds
# the lease lost and stops its sleep, and its success is discarded: the row stays dead,
# cancelled, without a result. The lane's next row runs.
case_a_running_task_cancelled_loses_its_lease_and_its_late_writes() {
  sqlapi_setup
  local id next
  id=$("$LEASH" enqueue --shard lane '{"hold": true}')
  next=$("$LEASH" enqueue --shard lane '{"hold": false}')
  start_worker A "$FIX/cancelled.lua" --concurrency 2 --visibility 30s --heartbeat 1s --poll-ms 20-50
  wait_for "the task to start" 60 q_true "select count(*) = 1 from started where task_id = $id"
  wait_for "its first step" 30 q_true "select count(*) = 1 from ${QT}_steps where task_id = $id"
  expect_exit 0 "$LEASH" cancel --id "$id" --id "$next"
  assert_eq "cancel's counts (the lane's second row was pending)" "$(<"$T_OUT")" "cancelled: 1 pending, 1 running"
  # Only the running one is under test: requeue the pending one, so it must run after.
  expect_exit 0 "$LEASH" requeue --id "$next"
  q "insert into go values (1)" >/dev/null
  wait_for "the script's report after the cancel" 60 log_has A "after-cancel sleep:"
  local log
  log=$(worker_log A)
  assert_contains "step after the cancel" "$(grep -F 'after-cancel step:' <<<"$log")" "ok=false"
  assert_contains "enqueue after the cancel" "$(grep -F 'after-cancel enqueue:' <<<"$log")" "ok=false"
  assert_contains "the sleep ended by the lost lease" "$(grep -F 'after-cancel sleep:' <<<"$log")" "lease lost"
  # (The step's function may have run: a step stores its result after it; the store is what
  # the fence refuses, checked below.)
  assert_contains "A's log" "$log" "lease lost"
  wait_for "the worker to discard the outcome" 30 log_has A "outcome discarded: the lease was lost"
  wait_for "the lane's next row to run" 60 q_true "select status = 'done' from $QT where id = $next"
  assert_eq "the cancelled row (late outcome discarded)" \
    "$(q "select format('%s|%s|%s|%s', status, last_cause, result is null, attempts) from $QT where id = $id")" \
    "dead|cancelled|t|1"
  assert_eq "steps stored (only the one before)" "$(q "select string_agg(name, ',') from ${QT}_steps where task_id = $id")" "before"
  assert_eq "no child task" "$(q "select count(*) from $QT")" 2
  t_kill "${W_PID[A]}"
  assert_no_sanitizer_reports
}

# ----------------------------------------------------------------------- release

case_release_refuses_a_live_worker_and_gives_back_a_gone_workers_leases() {
  sqlapi_setup
  local id
  id=$("$LEASH" enqueue '{"hold": true}')
  start_worker W "$FIX/hold.lua" --visibility 10m --poll-ms 20-50
  wait_for "W to start the task" 60 q_true "select count(*) = 1 from started where task_id = $id"
  expect_exit 1 "$LEASH" release --worker W
  assert_eq "refused in one line" "$(wc -l <"$T_ERR")" 1
  assert_contains "refused" "$(<"$T_ERR")" "leash release: that worker is alive (database session pid"
  # The function checks by itself too (under the lock a reconnecting worker waits for).
  assert_contains "the SQL function refuses as well" \
    "$(q_err "select ${QT}_release_worker('W')")" "release: worker W has a live session"
  assert_eq "the lease is untouched" "$(q "select status || '|' || lease_owner from $QT where id = $id")" "leased|W"
  # Another worker id has no session: nothing to release.
  expect_exit 0 "$LEASH" release --worker W2
  assert_eq "nobody's leases" "$(<"$T_OUT")" 0
  # W dies without a drain (its lease would otherwise stay for 10 minutes).
  kill -KILL "${W_PID[W]}"
  wait_for "W's session to end" 30 q_true "select count(*) = 0 from ${QT}_worker_sessions('W')"
  expect_exit 0 "$LEASH" release --worker W
  assert_eq "released" "$(<"$T_OUT")" 1
  assert_eq "the row: pending head, attempt given back" \
    "$(q "select format('%s|%s|%s|%s', status, attempts, is_head, run_after <= now()) from $QT where id = $id")" \
    "pending|0|t|t"
  q "update $QT set payload = '{}' where id = $id" >/dev/null
  start_worker X "$FIX/hold.lua" --poll-ms 20-50 --until-empty
  assert_worker_exit X 60 0
  assert_eq "run again by X, as attempt 1" "$(q "select status || '|' || attempts || '|' || (result->>'by') from $QT where id = $id")" "done|1|X"
  # Bad arguments: exit 2.
  expect_exit 2 "$LEASH" release
  expect_exit 2 "$LEASH" release --worker ''
  expect_exit 2 "$LEASH" release --worker W extra
}

case_release_force_takes_a_live_workers_leases_and_it_finds_them_lost() {
  sqlapi_setup
  local id
  id=$("$LEASH" enqueue '{"hold": true}')
  # One slot: W cannot claim the released task again while the old run holds its slot (a
  # worker that did would run it twice, the old run fenced but not stopped: see leash(1)).
  start_worker W "$FIX/hold.lua" --concurrency 1 --visibility 30s --heartbeat 1s --poll-ms 20-50
  wait_for "W to start the task" 60 q_true "select count(*) = 1 from started where task_id = $id"
  # The next run must not hold (the one running read its payload already).
  q "update $QT set payload = '{}' where id = $id" >/dev/null
  expect_exit 0 "$LEASH" release --worker W --force
  assert_eq "released" "$(<"$T_OUT")" 1
  assert_contains "warned" "$(<"$T_ERR")" "warning: the worker is alive"
  wait_for "W's sleep ended by the lost lease" 30 log_has W "hold sleep: ok=false"
  assert_contains "W's log" "$(worker_log W)" "lease lost"
  # The task runs again (W itself takes it), as attempt 1: the released attempt was not spent.
  wait_for "the task to be done" 60 q_true "select status = 'done' from $QT where id = $id"
  assert_eq "attempts" "$(q "select attempts from $QT where id = $id")" 1
  t_kill "${W_PID[W]}"
  assert_no_sanitizer_reports
}

# ----------------------------------------------------------------------- lifecycle mirror

case_the_cancelled_cause_agrees_in_lifecycle_c_the_kit_and_the_sql() {
  local c kit
  c=$(sed -nE 's/^ *\[CAUSE_[A-Z_]+\] = \{ "([a-z_]+)", [01] \},.*/\1/p' "$LEASH_SRC/src/lifecycle.c" | paste -sd,)
  [[ $c == *cancelled* ]] || fail "no cancelled cause in src/lifecycle.c: $c"
  kit=$(LUA_PATH="$LEASH_SRC/scripts/lib/?.lua;;" lua5.4 -e \
    'print(table.concat(require("leash.testing").CAUSES, ","))')
  assert_eq "the kit's CAUSES against src/lifecycle.c's table" "$kit" "$c"
  assert_contains "sql/015 writes the same word" "$(<"$LEASH_SRC/sql/015_sql_api.sql")" "last_cause = 'cancelled'"
}

# ----------------------------------------------------------------------- examples

case_python_example_enqueues_inside_the_applications_transaction() {
  sqlapi_setup
  # The first python3 that has psycopg2 (a pyenv shim may come before Debian's).
  local py="" p
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import psycopg2' 2>/dev/null; then py=$p; break; fi
  done
  if [[ -z $py ]]; then
    echo "skip sqlapi.$T_CASE: no python3 with psycopg2 (apt-get install python3-psycopg2)" >&2
    exit 77
  fi
  expect_exit 0 "$py" "$LEASH_SRC/docs/examples/enqueue_psycopg.py" "$DATABASE_URL"
  check_example_rows "python"
}

case_node_example_enqueues_inside_the_applications_transaction() {
  sqlapi_setup
  if ! command -v node >/dev/null; then
    echo "skip sqlapi.$T_CASE: node is not installed" >&2
    exit 77
  fi
  # node's pg from npm, once per machine (a cache outside the repository).
  local mods=${LEASH_NODE_MODULES:-${XDG_CACHE_HOME:-$HOME/.cache}/leash-test-node}
  if ! NODE_PATH=$mods/node_modules node -e 'require("pg")' 2>/dev/null; then
    if ! command -v npm >/dev/null ||
       ! npm install --silent --no-audit --no-fund --prefix "$mods" pg@8 >/dev/null 2>&1; then
      echo "skip sqlapi.$T_CASE: node's pg module is not available (npm install pg failed)" >&2
      exit 77
    fi
  fi
  # pg takes a URI or the PG* variables (DATABASE_URL here is key=value).
  expect_exit 0 env NODE_PATH="$mods/node_modules" PGDATABASE="$TDB" node "$LEASH_SRC/docs/examples/enqueue_pg.js"
  check_example_rows "node"
}

# The examples' rows: an order and its task in one transaction (committed), a rolled back
# one (neither), a dedup retry (one task), and a bulk call.
check_example_rows() {
  assert_eq "$1: stdout" "$(sed -n 's/^result: //p' "$T_OUT")" "committed=1 rolled_back=0 dedup_same_id=true bulk=3"
  assert_eq "$1: orders" "$(q "select string_agg(id::text, ',' order by id) from orders")" "1"
  assert_eq "$1: the order's task" "$(q "select format('%s|%s|%s', payload->>'order_id', batch, dedup_key)
                                           from $QT where dedup_key = 'order-1'")" "1|orders|order-1"
  assert_eq "$1: no task for the rolled back order" "$(q "select count(*) from $QT where payload->>'order_id' = '2'")" 0
  assert_eq "$1: bulk tasks" "$(q "select count(*) from $QT where batch = 'bulk'")" 3
}

t_run "$@"
