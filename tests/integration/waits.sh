#!/usr/bin/env bash
# Durable waits (issue #19, item 1; sql/019_waits.sql, README "Waits"): `return leash.wait{...}`
# gives the attempt and the slot back, the task is not claimable until what it waits for holds,
# and its next execution sees it (leash.waited) with its steps kept. Every case runs the real
# host against tests/fixtures/waits/wait.lua.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
WFIX=$LEASH_SRC/tests/fixtures/waits/wait.lua
QT=agent_work_queue

waits_setup() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
}

enqueue_one() {
  local payload=$1
  shift
  "$LEASH" enqueue "$@" "$payload" || fail "enqueue of $payload failed"
}

row() { q "select $2 from $QT where id = $1"; }

stop_workers() {
  local w
  for w in "$@"; do kill -TERM "${W_PID[$w]}" 2>/dev/null || true; done
  for w in "$@"; do assert_worker_exit "$w" 60 0; done
  assert_no_sanitizer_reports
}

# "waiting": pending, not claimable, no lease held, the attempt given back.
is_waiting() {
  q_true "select status = 'pending' and last_cause = 'waiting' and locked_until is null
                 and run_after > now() from $QT where id = $1"
}

# One slot: the parent waits for 50 children, and they run in the slot it gave back. While it
# waits it holds no lease and its attempt is given back; resumed, it sees each child's result,
# its fanout step is given back (not run again), and it has spent one attempt.
case_a_parent_waiting_for_50_children_spends_no_attempt_and_no_slot() {
  waits_setup
  local p
  p=$(enqueue_one '{"role":"parent","n":50,"child_sleep":0.05}')
  start_worker A "$WFIX" --concurrency 1 --poll-ms 10-50
  wait_for "the parent (task $p) to wait" 30 is_waiting "$p"
  assert_eq "while it waits (status|attempts|lease|run_after|reason|children recorded)" \
    "$(row "$p" "concat_ws('|', status, attempts, locked_until is null, run_after = 'infinity',
                            wait_reason, cardinality(wait_ids))")" "pending|0|t|t|children|50"
  wait_for "the parent to be done" 120 q_true "select status = 'done' from $QT where id = $p"
  assert_eq "children done" "$(q "select count(*) from $QT where parent_id = $p and status = 'done'")" 50
  assert_eq "parent (attempts|snoozes|result)" \
    "$(row "$p" "concat_ws('|', attempts, snoozes, result->>'reason', result->>'tasks',
                            result->>'done', result->>'sum', result->>'fanout', result->>'expired')")" \
    "1|0|children|50|50|2550|50|false"
  assert_eq "the parent's history (attempt:kind:cause)" \
    "$(q "select string_agg(attempt || ':' || kind || ':' || cause, ',' order by finished_at)
            from ${QT}_attempts where task_id = $p")" "1:wait:waiting,1:done:none"
  assert_eq "report --by version counts the wait (tasks|attempts|done|wait|retry)" \
    "$("$LEASH" report --by version --json | jq -c '.versions[0] | [.tasks, .attempts,
        .counts.done, .counts.wait, .counts.retry]')" "[51,52,51,1,0]"
  stop_workers A
}

# A wait for given ids wakes when the last of them settles (done or dead), not before.
case_a_wait_for_ids_wakes_when_the_last_of_them_settles() {
  waits_setup
  local a b w
  a=$(enqueue_one '{"role":"child","n":1}' --delay 3600)
  b=$(enqueue_one '{"role":"child","n":2,"fail":true}' --delay 3600 --max-attempts 1)
  w=$(enqueue_one "{\"role\":\"ids\",\"ids\":[$a,$b]}")
  start_worker A "$WFIX" --concurrency 2 --poll-ms 10-50
  wait_for "the waiter (task $w) to wait" 30 is_waiting "$w"
  q "update $QT set run_after = now() where id = $a" >/dev/null
  wait_for "task $a to be done" 30 q_true "select status = 'done' from $QT where id = $a"
  assert_eq "one of two settled: still waiting" "$(row "$w" "status || '|' || last_cause")" "pending|waiting"
  q "update $QT set run_after = now() where id = $b" >/dev/null
  wait_for "the waiter to be done" 30 q_true "select status = 'done' from $QT where id = $w"
  assert_eq "waiter (attempts|reason|tasks|done|dead)" \
    "$(row "$w" "concat_ws('|', attempts, result->>'reason', result->>'tasks', result->>'done',
                            result->>'dead')")" "1|ids|2|1|1"
  stop_workers A
}

# A waiting task set dead by hand and made pending again (as an operator would, or the soak's
# driver) looks at its wait again (sql/030): its event was signalled, or its last awaited task
# settled, while it was dead, and neither wake saw it (they wake pending waiters only), so
# it would have waited for its deadline, an hour here. A waiter whose wait does not hold yet
# keeps waiting.
case_a_waiter_made_pending_by_hand_looks_at_its_wait_again() {
  waits_setup
  local e k a w
  e=$(enqueue_one '{"role":"event","event":"flip","deadline":3600}')
  k=$(enqueue_one '{"role":"event","event":"later","deadline":3600}')
  a=$(enqueue_one '{"role":"child","n":1}' --delay 3600)
  w=$(enqueue_one "{\"role\":\"ids\",\"ids\":[$a],\"deadline\":3600}")
  start_worker A "$WFIX" --concurrency 2 --poll-ms 10-50
  local id
  for id in "$e" "$k" "$w"; do wait_for "task $id to wait" 30 is_waiting "$id"; done
  q "update $QT set status = 'dead' where id in ($e, $k, $w)" >/dev/null
  assert_eq "tasks woken by the signal while its waiter is dead" "$("$LEASH" signal flip)" 0
  q "update $QT set run_after = now() where id = $a" >/dev/null
  wait_for "task $a to be done" 30 q_true "select status = 'done' from $QT where id = $a"
  q "update $QT set status = 'pending' where id in ($e, $k, $w)" >/dev/null
  wait_for "the event's waiter to be done" 30 q_true "select status = 'done' from $QT where id = $e"
  wait_for "the ids' waiter to be done" 30 q_true "select status = 'done' from $QT where id = $w"
  assert_eq "the waiter of an event not signalled yet (status|cause|waits without a time)" \
    "$(row "$k" "concat_ws('|', status, last_cause, run_after = 'infinity')")" "pending|waiting|t"
  assert_eq "tasks woken by its signal" "$("$LEASH" signal later)" 1
  wait_for "it to be done" 30 q_true "select status = 'done' from $QT where id = $k"
  stop_workers A
}

# A task cancelled (leash cancel) counts as settled: the last child cancelled wakes its
# parent, which sees it dead.
case_a_cancelled_child_wakes_its_waiting_parent() {
  waits_setup
  local p
  p=$(enqueue_one '{"role":"parent","n":2,"child_delay":3600}')
  start_worker A "$WFIX" --concurrency 1 --poll-ms 10-50
  wait_for "the parent (task $p) to wait" 30 is_waiting "$p"
  local kids
  kids=$(q "select string_agg(id::text, ' ' order by id) from $QT where parent_id = $p")
  local k
  for k in $kids; do expect_exit 0 "$LEASH" cancel --id "$k"; done
  wait_for "the parent to be done" 30 q_true "select status = 'done' from $QT where id = $p"
  assert_eq "(attempts|tasks|done|dead)" \
    "$(row "$p" "concat_ws('|', attempts, result->>'tasks', result->>'done', result->>'dead')")" "1|2|0|2"
  stop_workers A
}

# A waiting task is not its shard's head: a row enqueued into its shard while it waits runs,
# and the waiter still wakes and finishes when its child is let run.
case_a_waiting_task_does_not_hold_back_its_shard() {
  waits_setup
  local p next
  p=$(enqueue_one '{"role":"parent","n":1,"child_delay":3600}' --shard lane)
  start_worker A "$WFIX" --concurrency 2 --poll-ms 10-50
  wait_for "the parent (task $p) to wait" 30 is_waiting "$p"
  next=$(enqueue_one '{"role":"child","n":5}' --shard lane)
  wait_for "the shard's new row (task $next) to run while the parent waits" 30 q_true \
    "select status = 'done' from $QT where id = $next"
  assert_eq "the parent still waits" "$(row "$p" "status || '|' || last_cause")" "pending|waiting"
  q "update $QT set run_after = now() where parent_id = $p" >/dev/null
  wait_for "the parent to be done" 30 q_true "select status = 'done' from $QT where id = $p"
  assert_eq "(attempts|done)" "$(row "$p" "attempts || '|' || (result->>'done')")" "1|1"
  stop_workers A
}

# A woken task takes its place in its lane (sql/028): woken while its shard has a pending
# head, it waits behind that head and the rows queued behind it (they come first by
# (run_after, id)) instead of becoming a second head and running before them. Three wakes,
# one shard each: a signal (<table>_signal), the settle of the task it awaits (the queue's
# cycle, by SQL), and its wait's deadline passing with a retry (<table>_wait_expire, as the
# reaper calls it; the deadline is moved into the past by hand). Then each shard must run its
# rows in (run_after, id) order, the woken task last. A fourth waiter, woken by the same
# signal, has only a row scheduled an hour later in its shard: that head does not hold it
# back (it becomes a head beside it and runs).
case_a_woken_task_waits_behind_the_rows_queued_before_it_in_its_shard() {
  waits_setup
  local c pe pb pi px
  c=$(enqueue_one '{"role":"child","n":1}' --shard other --delay 3600)
  pe=$(enqueue_one '{"role":"event","event":"go"}' --shard le)
  pb=$(enqueue_one '{"role":"event","event":"go"}' --shard lb)
  pi=$(enqueue_one "{\"role\":\"ids\",\"ids\":[$c]}" --shard li)
  px=$(enqueue_one '{"role":"parent","n":1,"child_delay":3600,"deadline":3600}' --shard lx)
  start_worker A "$WFIX" --concurrency 3 --poll-ms 10-50
  local id
  for id in "$pe" "$pb" "$pi" "$px"; do wait_for "task $id to wait" 30 is_waiting "$id"; done
  stop_workers A
  local sh
  for sh in le li lx; do
    enqueue_one '{"role":"child","n":1}' --shard "$sh" >/dev/null
    enqueue_one '{"role":"child","n":2}' --shard "$sh" >/dev/null
  done
  # In lb the only other row is scheduled an hour later (as a retry in backoff): it is the head
  # the waiter wakes beside, not behind.
  enqueue_one '{"role":"child","n":9}' --shard lb --delay 3600 >/dev/null
  heads() {
    q "select string_agg(shard_key || ':' || (payload->>'role') || coalesce(payload->>'n', ''), ','
                         order by shard_key, id)
         from $QT where is_head and shard_key like 'l%'"
  }
  assert_eq "heads before the wakes" "$(heads)" "lb:child9,le:child1,li:child1,lx:child1"
  assert_eq "woken by the signal" "$(q "select ${QT}_signal('go')")" 2
  q "update $QT set run_after = now() where id = $c" >/dev/null
  local tok
  tok=$(q "select token from ${QT}_claim('hand', 1, 60, NULL, NULL, NULL, NULL, $c)")
  [[ -n $tok ]] || fail "the awaited task (task $c) was not leased"
  assert_eq "the awaited task's settle" "$(q "$(cycle_sql hand "{$c}" "{$tok}" '{done}' 0)" | cut -d'|' -f4)" done
  q "update $QT set result = '{\"n\": 1, \"double\": 2}' where id = $c" >/dev/null   # what the waiter reads
  q "update $QT set wait_deadline = now() - interval '1 s' where id = $px" >/dev/null
  assert_eq "expired by wait_expire" "$(q "select ${QT}_wait_expire()")" 1
  assert_eq "woken (run_after due)" \
    "$(q "select count(*) from $QT where id in ($pe, $pb, $pi, $px) and status = 'pending' and run_after <= now()")" 4
  assert_eq "heads after the wakes" "$(heads)" "lb:event,lb:child9,le:child1,li:child1,lx:child1"
  start_worker B "$WFIX" --concurrency 2 --poll-ms 10-50
  wait_for "every shard's rows to be done" 30 q_true \
    "select count(*) = 10 from $QT where shard_key like 'l%' and status = 'done'"
  stop_workers B
  assert_eq "per shard, the order the rows' last executions were claimed in" \
    "$(q "select string_agg(x.shard_key || ':' || x.seq, ',' order by x.shard_key)
            from (select q.shard_key,
                         string_agg((q.payload->>'role') || coalesce(q.payload->>'n', ''), ' '
                                    order by q.started_at) seq
                    from $QT q where q.shard_key like 'l%' and q.status = 'done'
                   group by q.shard_key) x")" \
    "lb:event,le:child1 child2 event,li:child1 child2 ids,lx:child1 child2 parent1"
}

# A wait on the clock (after = 2 s) makes the row due then, and spends nothing.
case_a_wait_on_the_clock_runs_again_when_its_time_comes() {
  waits_setup
  local c
  c=$(enqueue_one '{"role":"clock","after":2}')
  start_worker A "$WFIX" --concurrency 1 --poll-ms 10-50
  wait_for "the task (task $c) to wait" 30 q_true \
    "select last_cause = 'waiting' and status = 'pending' from $QT where id = $c"
  assert_eq "due 2 s after the wait (run_after - finished_at)" \
    "$(row "$c" "to_char(extract(epoch from run_after - finished_at), 'FM990.0')")" "2.0"
  wait_for "the task to be done" 60 q_true "select status = 'done' from $QT where id = $c"
  assert_eq "(attempts|reason|tasks)" \
    "$(row "$c" "concat_ws('|', attempts, result->>'reason', result->>'tasks')")" "1|until|0"
  stop_workers A
}

# Past its deadline a wait retries: the attempt it gave back is spent, cause wait_deadline,
# and the next execution sees the wait expired (its children never ran: delayed an hour).
case_a_wait_past_its_deadline_retries_with_an_attempt_spent() {
  waits_setup
  local p
  p=$(enqueue_one '{"role":"parent","n":2,"child_delay":3600,"deadline":1}')
  start_worker A "$WFIX" --concurrency 1 --poll-ms 10-50 --visibility 4
  wait_for "the parent to be done after its deadline" 60 q_true \
    "select status = 'done' from $QT where id = $p"
  assert_eq "parent (attempts|expired|tasks|done)" \
    "$(row "$p" "concat_ws('|', attempts, result->>'expired', result->>'tasks', result->>'done')")" \
    "2|true|2|0"
  assert_eq "children still pending" "$(q "select count(*) from $QT where parent_id = $p and status = 'pending'")" 2
  stop_workers A
}

# on_deadline = "dead": past the deadline the task is dead, cause wait_deadline, one clear line.
case_a_wait_past_its_deadline_with_on_deadline_dead_is_dead() {
  waits_setup
  local p
  p=$(enqueue_one '{"role":"parent","n":1,"child_delay":3600,"deadline":1,"on_deadline":"dead"}')
  start_worker A "$WFIX" --concurrency 1 --poll-ms 10-50 --visibility 4
  wait_for "the parent to be dead" 60 q_true "select status = 'dead' from $QT where id = $p"
  assert_eq "(cause|attempts)" "$(row "$p" "last_cause || '|' || attempts")" "wait_deadline|1"
  assert_contains "the error" "$(row "$p" last_error)" "wait_deadline: waited for children past its deadline"
  assert_contains "the error" "$(row "$p" last_error)" "on_deadline = dead"
  stop_workers A
}

# `leash signal` wakes the waiters of its event (in its --tenant only) and prints how many;
# <table>_signal does the same from SQL; each woken task reads the payload it was sent.
case_an_event_signalled_from_the_cli_or_sql_wakes_its_waiters_with_the_payload() {
  waits_setup
  local a b c
  a=$(enqueue_one '{"role":"event","event":"batch-7"}' --tenant t1)
  b=$(enqueue_one '{"role":"event","event":"batch-7"}' --tenant t1)
  c=$(enqueue_one '{"role":"event","event":"batch-7"}' --tenant t2)
  start_worker A "$WFIX" --concurrency 2 --poll-ms 10-50
  local id
  for id in "$a" "$b" "$c"; do wait_for "task $id to wait" 30 is_waiting "$id"; done
  # Only waits without a time are pending now: a claim finds nothing due and no time to look
  # again, without an error (its probe for the next due row once subtracted now() from their
  # run_after 'infinity', which PostgreSQL 15 refuses, and so failed every cycle).
  assert_eq "a claim while only they are pending (rows|next due)" \
    "$(q "select count(*) || '|' || coalesce(max(c.waited)::text, 'none')
            from ${QT}_claim('probe', 5, 60, NULL, NULL, NULL, 0) c")" "1|none"
  assert_eq "cycle errors in A's log" "$(grep -c 'infinite' "$T_TMP/A.log")" 0
  assert_eq "tasks woken by the CLI (tenant t1)" \
    "$("$LEASH" signal batch-7 --tenant t1 --payload '{"file":"out-7.jsonl"}')" 2
  wait_for "t1's waiters to be done" 30 q_true \
    "select count(*) = 2 from $QT where id in ($a, $b) and status = 'done'"
  assert_eq "a woken task's result (reason|name|payload)" \
    "$(row "$a" "concat_ws('|', result->>'reason', result->>'name', result->>'payload')")" \
    'event|batch-7|{"file": "out-7.jsonl"}'
  assert_eq "attempts of the woken" "$(q "select string_agg(attempts::text, ',') from $QT where id in ($a, $b)")" "1,1"
  assert_eq "t2's waiter still waits" "$(row "$c" "status || '|' || last_cause")" "pending|waiting"
  assert_eq "tasks woken by SQL (every tenant)" \
    "$(q "select ${QT}_signal('batch-7', '{\"n\": 2}'::jsonb)")" 1
  wait_for "t2's waiter to be done" 30 q_true "select status = 'done' from $QT where id = $c"
  assert_eq "its payload" "$(row "$c" "result->>'payload'")" '{"n": 2}'
  stop_workers A
}

# A signal is kept for its TTL: a wait that starts after it is woken at once; one sent with
# --ttl 0 wakes only the tasks waiting then.
case_a_signal_sent_before_the_wait_wakes_it_unless_its_ttl_was_0() {
  waits_setup
  assert_eq "no waiter yet" "$("$LEASH" signal early --payload '"ready"')" 0
  assert_eq "no waiter yet" "$("$LEASH" signal gone --ttl 0)" 0
  local e g
  e=$(enqueue_one '{"role":"event","event":"early"}')
  g=$(enqueue_one '{"role":"event","event":"gone","deadline":3600}')
  start_worker A "$WFIX" --concurrency 2 --poll-ms 10-50
  wait_for "the task waiting for 'early' to be done" 30 q_true "select status = 'done' from $QT where id = $e"
  assert_eq "(attempts|payload)" "$(row "$e" "attempts || '|' || (result->'payload')::text")" '1|"ready"'
  wait_for "the task waiting for 'gone' to wait" 30 is_waiting "$g"
  assert_eq "its deadline (an hour)" \
    "$(row "$g" "extract(epoch from wait_deadline - finished_at)::int")" 3600
  stop_workers A
}

# The race of a child's settle with its parent's wait-settle, across 3 processes x 4 slots:
# 60 parents x 8 children, the children running at once (some finish before their parent's
# wait is written, some after, some at the same moment; parents pause 0-30 ms after their
# fanout to spread it). Every parent ends done with one attempt and every child's result;
# none is left waiting with all its children settled.
case_many_parents_and_children_across_three_processes_leave_no_parent_waiting() {
  waits_setup
  local i
  for ((i = 0; i < 60; i++)); do
    printf '{"payload":{"role":"parent","n":8,"pause":%s}}\n' "0.0$((i % 4))"
  done >"$T_TMP/parents.jsonl"
  enqueue_file "$T_TMP/parents.jsonl" 60
  local w
  for w in A B C; do start_worker "$w" "$WFIX" --concurrency 4 --poll-ms 10-50; done
  wait_for "every parent to be done" 300 q_true \
    "select count(*) = 60 from $QT where parent_id is null and status = 'done'"
  assert_eq "children done" "$(q "select count(*) from $QT where parent_id is not null and status = 'done'")" 480
  assert_eq "parents by (attempts, tasks, done, sum)" \
    "$(q "select string_agg(distinct concat_ws(',', attempts, result->>'tasks', result->>'done',
                                               result->>'sum'), ' ') from $QT where parent_id is null")" \
    "1,8,8,72"
  assert_eq "rows left pending" "$(q "select count(*) from $QT where status <> 'done'")" 0
  stop_workers A B C
  assert_no_sanitizer_reports
}

# Signals racing the waits across 3 processes x 4 slots: 90 tasks wait for events e-0..e-89
# while a signaller sends them in a shuffled order from the CLI and from SQL, some before the
# task waits, some while its wait is being written. Every task ends done with one attempt
# and its own payload; none is left waiting.
case_signals_racing_the_waits_across_three_processes_leave_no_task_waiting() {
  waits_setup
  local i
  for ((i = 0; i < 90; i++)); do
    printf '{"payload":{"role":"event","event":"e-%d"}}\n' "$i"
  done >"$T_TMP/waiters.jsonl"
  enqueue_file "$T_TMP/waiters.jsonl" 90
  local w
  for w in A B C; do start_worker "$w" "$WFIX" --concurrency 4 --poll-ms 10-50; done
  for i in $(seq 0 89 | shuf); do
    if ((i % 2)); then
      "$LEASH" signal "e-$i" --payload "$i" >/dev/null || fail "signal e-$i failed"
    else
      q "select ${QT}_signal('e-$i', '$i'::jsonb)" >/dev/null
    fi
  done
  wait_for "every waiter to be done" 300 q_true "select count(*) = 90 from $QT where status = 'done'"
  assert_eq "tasks whose payload is not their event's, or that spent more than one attempt" \
    "$(q "select count(*) from $QT where attempts <> 1
            or result->>'name' <> payload->>'event'
            or 'e-' || (result->>'payload') <> payload->>'event'")" 0
  stop_workers A B C
}

# The reduce target (issue #19): a parent over 1,000 children spends no attempt and holds no
# lease while it waits (checked from SQL during the wait), and then sums every chunk.
case_a_reduce_over_1000_children_spends_no_attempt_and_no_slot_while_it_waits() {
  waits_setup
  local p
  # the children wait 3 s before they run: the wait is long enough to be looked at
  p=$(enqueue_one '{"role":"parent","n":1000,"child_delay":3}')
  start_worker A "$WFIX" --concurrency 2 --poll-ms 10-50
  wait_for "the reduce (task $p) to wait" 60 is_waiting "$p"
  assert_eq "while it waits (attempts|leased rows of its shard|children recorded)" \
    "$(row "$p" "concat_ws('|', attempts,
                            (select count(*) from $QT o where o.shard_key = 'task:' || $p
                                and o.status = 'leased'), cardinality(wait_ids))")" "0|0|1000"
  wait_for "the reduce to be done" 300 q_true "select status = 'done' from $QT where id = $p"
  assert_eq "(attempts|tasks|done|sum)" \
    "$(row "$p" "concat_ws('|', attempts, result->>'tasks', result->>'done', result->>'sum')")" \
    "1|1000|1000|1001000"
  assert_eq "its executions (kinds)" \
    "$(q "select string_agg(kind, ',' order by finished_at) from ${QT}_attempts where task_id = $p")" "wait,done"
  stop_workers A
}

# Bad input to leash.wait, by class (wrong types, out-of-range numbers, unknown or missing
# keys, two conditions): a script error for that task, with one message naming the field.
case_bad_input_to_leash_wait_is_a_script_error_naming_the_field() {
  waits_setup
  local -a specs=(
    '"children"'                                   'bad argument #1 to'
    '{"children":"yes"}'                           'children must be true'
    '{"children":false}'                           'children must be true, not false'
    '{"ids":"1,2"}'                                'ids must be a list of task ids, not a string'
    '{"ids":[]}'                                   'ids must list 1 to 10000 task ids'
    '{"ids":[1.5]}'                                'ids[1] must be a task id'
    '{"ids":[1,-2]}'                               'ids[2] must be a task id'
    '{"ids":[1,"2"]}'                              'ids[2] must be a task id'
    '{"after":-5}'                                 'after must be a finite number of seconds >= 0'
    '{"after":"soon"}'                             'after must be a finite number of seconds >= 0, not string'
    '{"until":-1}'                                 'until must be a finite number of seconds >= 0'
    '{"children":true,"deadline":-1}'              'deadline must be a finite number of seconds > 0'
    '{"children":true,"deadline":0}'               'deadline must be a finite number of seconds > 0'
    '{"children":true,"deadline":"1h"}'            'deadline must be a finite number'
    '{"children":true,"on_deadline":"never"}'      'on_deadline must be "retry" or "dead"'
    '{"children":true,"on_deadline":1}'            'on_deadline must be "retry" or "dead"'
    '{"childs":true}'                              'unknown field childs'
    '{"children":true,"deadlin":5}'                'unknown field deadlin'
    '{}'                                           'give exactly one of'
    '{"children":true,"after":1}'                  'give exactly one of'
    '{"children":true,"message":5}'                'message must be a string'
    '{"event":""}'                                 'event must be a name of 1 to 200'
    '{"event":"a\"b"}'                            'event must be a name of 1 to 200'
    '{"event":7}'                                  'event must be a name of 1 to 200'
  )
  local i ids=()
  for ((i = 0; i < ${#specs[@]}; i += 2)); do
    ids+=("$(enqueue_one "{\"role\":\"bad\",\"spec\":${specs[i]}}" --max-attempts 1)")
  done
  start_worker A "$WFIX" --concurrency 4 --poll-ms 10-50
  wait_for "every bad wait to be dead" 60 q_true \
    "select count(*) = ${#ids[@]} from $QT where status = 'dead'"
  for ((i = 0; i < ${#specs[@]}; i += 2)); do
    local id=${ids[i / 2]}
    assert_eq "spec ${specs[i]}: cause" "$(row "$id" last_cause)" script_error
    assert_contains "spec ${specs[i]}: error" "$(row "$id" "split_part(last_error, E'\n', 1)")" "${specs[i + 1]}"
  done
  stop_workers A
}

t_run "$@"
