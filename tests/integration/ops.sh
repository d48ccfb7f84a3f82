#!/usr/bin/env bash
# Operating a batch: leash requeue, inspect, prune, report and status (throughput, ETA,
# --watch). Rows are crafted with SQL so every number the commands print is known.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"

lines_of() { wc -l <"$1" | tr -d ' '; }

# gone PID: true once PID has exited (a zombie counts: kill -0 succeeds on zombies).
gone() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ ${stat%% *} == Z ]]
}

# jget JSON EXPR: prints a Python expression over the parsed JSON `j` (json.dumps for
# containers, str otherwise). Python's json keeps integers of any size exactly.
jget() {
  python3 -c 'import json, sys
j = json.loads(sys.argv[1])
v = eval(sys.argv[2])
print(json.dumps(v, separators=(",", ":")) if isinstance(v, (dict, list)) or v is None else v)' "$1" "$2"
}

# new_queue: a fresh migrated database.
new_queue() {
  # shellcheck disable=SC2119 # t_newdb's SUFFIX is optional
  t_newdb
  expect_exit 0 "$LEASH" migrate
}

# ---------------------------------------------------------------- requeue

case_requeue_dead_resets_attempts() {
  new_queue
  q "insert into agent_work_queue (id, tenant_id, shard_key, payload, status, attempts,
                                   last_error, batch, run_after, lease_owner, locked_until)
     values (1, 'a', 's1', '{}', 'dead', 8, 'boom 1', 'b1', now() - interval '1 day', 'w0', null),
            (2, 'a', 's2', '{}', 'dead', 8, 'boom 2', 'b1', now() - interval '1 day', 'w0', null),
            (3, 'a', 's3', '{}', 'dead', 1, 'fatal 3', 'b1', now() - interval '1 day', 'w0', null),
            (4, 'b', 's4', '{}', 'dead', 8, 'boom 4', 'b1', now() - interval '1 day', 'w0', null),
            (5, 'a', 's5', '{}', 'dead', 8, 'boom 5', 'b2', now() - interval '1 day', 'w0', null),
            (6, 'a', 's6', '{}', 'leased', 2, 'was retried', 'b1', now() - interval '1 hour', 'w1',
             now() + interval '10 minutes'),
            (7, 'a', 's7', '{}', 'done', 1, null, 'b1', now() - interval '1 hour', 'w1', null),
            (8, 'a', 's8', '{}', 'pending', 3, 'retrying', 'b1', now() + interval '1 hour', 'w1', null);
     select setval(pg_get_serial_sequence('agent_work_queue', 'id'), 8)" >/dev/null
  local leased_before
  leased_before=$(q "select row(q.*)::text from agent_work_queue q where id = 6")

  # --dead, scoped by tenant and batch.
  expect_exit 0 "$LEASH" requeue --dead --tenant a --batch b1
  assert_eq "count printed" "$(<"$T_OUT")" 3
  assert_eq "requeued rows" \
    "$(q "select string_agg(format('%s %s %s %s %s', id, status, attempts, last_error,
                                   run_after <= now() and run_after > now() - interval '1 minute'
                                   and locked_until is null), ',' order by id)
            from agent_work_queue where id <= 5")" \
    "1 pending 0 boom 1 t,2 pending 0 boom 2 t,3 pending 0 fatal 3 t,4 dead 8 boom 4 f,5 dead 8 boom 5 f"

  # --id: only dead rows in scope change; the others are named on stderr, exit 0.
  expect_exit 0 "$LEASH" requeue --id 4 --id 6 --id 7 --id 8 --id 999 --id 4
  assert_eq "count printed (--id)" "$(<"$T_OUT")" 1
  assert_contains "skipped ids named" "$(<"$T_ERR")" \
    "4 ids not requeued (only dead tasks are): 6 (leased), 7 (done), 8 (pending), 999 (no such task)"
  assert_eq "stderr is one line" "$(lines_of "$T_ERR")" 1
  assert_eq "row 4" "$(q "select status || ' ' || attempts from agent_work_queue where id = 4")" "pending 0"
  assert_eq "leased row untouched" "$(q "select row(q.*)::text from agent_work_queue q where id = 6")" \
    "$leased_before"
  assert_eq "pending row untouched" \
    "$(q "select attempts || ' ' || (run_after > now() + interval '50 minutes') from agent_work_queue where id = 8")" \
    "3 true"

  # --id outside --batch is not requeued.
  expect_exit 0 "$LEASH" requeue --id 5 --batch b1
  assert_eq "outside scope: count" "$(<"$T_OUT")" 0
  assert_contains "outside scope: named" "$(<"$T_ERR")" "5 (outside --tenant/--batch)"
  expect_exit 0 "$LEASH" requeue --dead
  assert_eq "the rest" "$(<"$T_OUT")" 1
  assert_eq "no dead left" "$(q "select count(*) from agent_work_queue where status = 'dead'")" 0
  expect_exit 0 "$LEASH" requeue --dead
  assert_eq "nothing to requeue" "$(<"$T_OUT")" 0

  # More than one chunk (5,000 rows each).
  q "insert into agent_work_queue (tenant_id, shard_key, payload, status, attempts)
     select 'c', 'c' || g, '{}', 'dead', 8 from generate_series(1, 6001) g" >/dev/null
  expect_exit 0 "$LEASH" requeue --dead --tenant c
  assert_eq "chunked count" "$(<"$T_OUT")" 6001
  assert_eq "chunked rows" \
    "$(q "select count(*) from agent_work_queue where tenant_id = 'c' and status = 'pending' and attempts = 0")" 6001

  # Usage errors.
  expect_exit 2 "$LEASH" requeue
  assert_contains "neither" "$(<"$T_ERR")" "leash requeue: say which tasks"
  expect_exit 2 "$LEASH" requeue --dead --id 1
  assert_contains "both" "$(<"$T_ERR")" "either --dead or --id"
  expect_exit 2 "$LEASH" requeue --id x
  assert_contains "bad id" "$(<"$T_ERR")" "--id must be a task id"
  expect_exit 2 "$LEASH" requeue --dead 5
}

# A requeue or prune that fails after committed chunks says so in its one error line (exit 1):
# the first 5,000-row chunk stays done, the second fails on a row a trigger refuses.
case_requeue_and_prune_failing_after_a_chunk_print_one_line_with_the_count() {
  new_queue
  q "insert into agent_work_queue (id, tenant_id, shard_key, payload, status, attempts,
                                   finished_at)
     select g, 't', 's' || g, '{}', case when g <= 5001 then 'dead' else 'done' end, 8,
            now() - interval '2 days'
       from generate_series(1, 10002) g;
     select setval(pg_get_serial_sequence('agent_work_queue', 'id'), 10002);
     create function refuse() returns trigger language plpgsql as \$\$
       begin raise exception 'refused row %', old.id; end \$\$;
     create trigger refuse_update before update on agent_work_queue
       for each row when (old.id = 5001) execute function refuse();
     create trigger refuse_delete before delete on agent_work_queue
       for each row when (old.id = 10002) execute function refuse()" >/dev/null
  expect_exit 1 "$LEASH" requeue --dead
  assert_eq "requeue: stdout" "$(<"$T_OUT")" ""
  assert_eq "requeue: one line" "$(lines_of "$T_ERR")" 1
  assert_contains "requeue: the error" "$(<"$T_ERR")" "refused row 5001"
  assert_contains "requeue: the count" "$(<"$T_ERR")" "(5000 tasks had been requeued before the error)"
  assert_eq "requeue: first chunk kept" \
    "$(q "select count(*) from agent_work_queue where status = 'pending'")" 5000
  expect_exit 1 "$LEASH" prune --older-than 1d --status done
  assert_eq "prune: one line" "$(lines_of "$T_ERR")" 1
  assert_contains "prune: the error" "$(<"$T_ERR")" "refused row 10002"
  assert_contains "prune: the count" "$(<"$T_ERR")" "(5000 tasks had been deleted before the error)"
  assert_eq "prune: first chunk deleted" \
    "$(q "select count(*) from agent_work_queue where status = 'done'")" 1
}

# ---------------------------------------------------------------- inspect

case_inspect_shows_row_and_steps() {
  new_queue
  expect_exit 0 "$LEASH" enqueue --tenant acme --batch nightly '{"ticket":12345678901234567890123,"s":"x"}'
  q "update agent_work_queue
        set status = 'dead', attempts = 3, max_attempts = 3, lease_owner = 'w1',
            last_error = E'llm.lua:12: upstream 500\nstack traceback:\n  llm.lua:12: in function',
            started_at = '2026-01-01 00:00:00+00', finished_at = '2026-01-01 00:00:02.5+00'
      where id = 1;
     insert into agent_work_queue_steps (task_id, name, result, attempt)
     values (1, 'fetch', '{\"x\": 1}', 1), (1, 'grade', null, 2)" >/dev/null

  expect_exit 0 "$LEASH" inspect 1
  local out
  out=$(<"$T_OUT")
  grep -Eq '^status +dead$' <<<"$out" || fail "status line: $out"
  grep -Eq '^attempts +3$' <<<"$out" || fail "attempts line: $out"
  grep -Eq '^tenant_id +acme$' <<<"$out" || fail "tenant line: $out"
  grep -Eq '^last_attempt_s +2\.5$' <<<"$out" || fail "duration line: $out"
  grep -Eq '^last_error +llm.lua:12: upstream 500$' <<<"$out" || fail "last_error line: $out"
  grep -Eq '^ +stack traceback:$' <<<"$out" || fail "traceback indented: $out"
  assert_contains "payload exact" "$out" '12345678901234567890123'
  assert_contains "steps" "$out" "2 stored:"
  assert_contains "step fetch" "$out" '  fetch  (attempt 1, '
  assert_contains "step fetch result" "$out" '{"x": 1}'
  assert_contains "step grade" "$out" '  grade  (attempt 2, '
  # Written by hand: no execution of it was recorded (history.sh covers the attempts).
  grep -Eq '^history +0 attempts$' <<<"$out" || fail "history line: $out"

  expect_exit 0 "$LEASH" inspect --json 1
  assert_eq "json: one line" "$(lines_of "$T_OUT")" 1
  local j
  j=$(<"$T_OUT")
  assert_eq "json: status" "$(jget "$j" 'j["task"]["status"]')" dead
  assert_eq "json: attempts" "$(jget "$j" 'j["task"]["attempts"]')" 3
  assert_eq "json: payload" "$(jget "$j" 'j["task"]["payload"]["ticket"]')" 12345678901234567890123
  assert_eq "json: last_error" "$(jget "$j" 'j["task"]["last_error"].splitlines()[0]')" \
    "llm.lua:12: upstream 500"
  assert_eq "json: steps" "$(jget "$j" '[[s["name"], s["attempt"], s["result"]] for s in j["steps"]]')" \
    '[["fetch",1,{"x":1}],["grade",2,null]]'
  assert_eq "json: history" "$(jget "$j" 'j["history"]')" "[]"

  expect_exit 1 "$LEASH" inspect 999
  assert_eq "missing id" "$(<"$T_ERR")" "leash inspect: no task with id 999 in agent_work_queue"
  expect_exit 2 "$LEASH" inspect abc
  expect_exit 2 "$LEASH" inspect
  expect_exit 2 "$LEASH" inspect 1 2
}

# ---------------------------------------------------------------- prune

case_prune_deletes_in_chunks_and_keeps_recent() {
  new_queue
  # Old: 12,000 done and 500 dead of batch nightly (2 days), 300 done of batch other, one done
  # row without finished_at (its updated_at is old). Kept: 100 recent done, 50 old pending,
  # 5 old leased. Steps on 10 old dead tasks and on one pending task.
  q "insert into agent_work_queue (tenant_id, shard_key, payload, status, attempts, batch,
                                   started_at, finished_at, created_at, updated_at)
     select 't', 'o' || g, '{}', case when g <= 12000 then 'done' else 'dead' end, 1, 'nightly',
            now() - interval '2 days', now() - interval '2 days',
            now() - interval '2 days', now() - interval '2 days'
       from generate_series(1, 12500) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, status, batch, finished_at, updated_at)
     select 't', 'x' || g, '{}', 'done', 'other', now() - interval '3 days', now() - interval '3 days'
       from generate_series(1, 300) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, status, batch, finished_at, updated_at)
     values ('t', 'nofin', '{}', 'done', 'nightly', null, now() - interval '5 days');
     insert into agent_work_queue (tenant_id, shard_key, payload, status, batch, finished_at)
     select 't', 'r' || g, '{}', 'done', 'nightly', now() - interval '1 hour' from generate_series(1, 100) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, status, batch, created_at, updated_at)
     select 't', 'p' || g, '{}', 'pending', 'nightly', now() - interval '9 days', now() - interval '9 days'
       from generate_series(1, 50) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, status, batch, lease_owner,
                                   locked_until, attempts, updated_at, finished_at)
     select 't', 'l' || g, '{}', 'leased', 'nightly', 'w', now() + interval '1 hour', 1,
            now() - interval '9 days', now() - interval '9 days' from generate_series(1, 5) g;
     insert into agent_work_queue_steps (task_id, name, attempt)
     select id, 'step', 1 from agent_work_queue where status = 'dead' order by id limit 10;
     insert into agent_work_queue_steps (task_id, name, attempt)
     select id, 'step', 1 from agent_work_queue where status = 'pending' order by id limit 1" >/dev/null

  # A batch runs meanwhile: its rows are recent, so prune leaves them to the worker.
  cat >"$T_TMP/ok.lua" <<'LUA'
return function(task) return true end
LUA
  expect_exit 0 "$LEASH" enqueue --file - --batch live <<<"$(for i in $(seq 1 300); do echo "{\"payload\":{\"i\":$i}}"; done)"
  "$LEASH" run "$T_TMP/ok.lua" --batch live --until-empty --concurrency 4 >"$T_TMP/run.out" 2>"$T_TMP/run.log" &
  local run_pid=$!
  t_on_exit t_kill "$run_pid"

  expect_exit 0 "$LEASH" --log-level debug prune --older-than 1d --batch nightly
  assert_eq "count printed" "$(<"$T_OUT")" 12501
  assert_eq "chunks of 5,000" "$(grep -c 'prune: chunk' "$T_ERR")" 3
  assert_eq "left, by batch and status" \
    "$(q "select string_agg(format('%s/%s=%s', batch, status, n), ' ' order by batch, status)
            from (select batch, status, count(*) n from agent_work_queue
                   where batch <> 'live' group by 1, 2) s")" \
    "nightly/done=100 nightly/leased=5 nightly/pending=50 other/done=300"
  assert_eq "steps of deleted tasks went with them" \
    "$(q "select count(*) from agent_work_queue_steps")" 1

  expect_exit 0 "$LEASH" prune --older-than 1d --status dead
  assert_eq "no old dead left" "$(<"$T_OUT")" 0
  expect_exit 0 "$LEASH" prune --older-than 4d --status done,dead
  assert_eq "nothing older than 4 days" "$(<"$T_OUT")" 0
  expect_exit 0 "$LEASH" prune --older-than 1d --chunk 7
  assert_eq "batch other, small chunks" "$(<"$T_OUT")" 300

  wait "$run_pid" || fail "leash run --until-empty failed while prune ran: $(tail -5 "$T_TMP/run.log")"
  assert_eq "live batch done, not pruned" \
    "$(q "select count(*) from agent_work_queue where batch = 'live' and status = 'done'")" 300
  assert_eq "pending and leased never pruned" \
    "$(q "select count(*) from agent_work_queue where status in ('pending', 'leased')")" 55

  # Only done and dead; a duration is required.
  expect_exit 2 "$LEASH" prune --older-than 1d --status pending
  assert_contains "pending refused" "$(<"$T_ERR")" "prune deletes only done and dead tasks, not pending ones"
  expect_exit 2 "$LEASH" prune --older-than 1d --status done,leased
  expect_exit 2 "$LEASH" prune --older-than 1d --status finished
  expect_exit 2 "$LEASH" prune --status 'done'
  assert_contains "missing duration" "$(<"$T_ERR")" "missing --older-than"
  expect_exit 2 "$LEASH" prune --older-than soon
  expect_exit 2 "$LEASH" prune --older-than 1d --chunk 0
  assert_eq "pending and leased still there" \
    "$(q "select count(*) from agent_work_queue where status in ('pending', 'leased')")" 55
}

# ---------------------------------------------------------------- report

case_report_numbers_are_right() {
  new_queue
  # Batch r: 20 done tasks, task i ran i seconds, started i s after T0; attempts 1 (1..15),
  # 2 (16..19), 3 (20). 5 dead: 21..23 "rate limited" (8 attempts, with a traceback),
  # 24..25 "bad input" (fatal, 1 attempt), all finished at T0 + 130 s. Other rows are noise.
  # Causes and crashes: 21..23 quarantined (3 crashes each), 24..25 returned; task 16 done
  # after 1 crash.
  q "insert into agent_work_queue (id, tenant_id, shard_key, payload, status, attempts, batch,
                                   started_at, finished_at, last_error, crashes)
     select g, 'acme', 's' || g, '{}', 'done',
            case when g <= 15 then 1 when g <= 19 then 2 else 3 end, 'r',
            timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second',
            timestamptz '2026-01-01 00:00:00+00' + 2 * g * interval '1 second',
            case when g > 15 then 'an earlier attempt failed' end,
            case when g = 16 then 1 else 0 end
       from generate_series(1, 20) g;
     insert into agent_work_queue (id, tenant_id, shard_key, payload, status, attempts, batch,
                                   started_at, finished_at, last_error, last_cause, crashes)
     select g, case when g = 25 then 'other' else 'acme' end, 's' || g, '{}', 'dead',
            case when g <= 23 then 8 else 1 end, 'r',
            timestamptz '2026-01-01 00:01:40+00', timestamptz '2026-01-01 00:02:10+00',
            case when g <= 23 then E'rate limited\nstack traceback:\n  [C]: in ?' else 'bad input' end,
            case when g <= 23 then 'quarantined' else 'returned' end,
            case when g <= 23 then 3 else 0 end
       from generate_series(21, 25) g;
     insert into agent_work_queue (id, tenant_id, shard_key, payload, status, attempts, batch,
                                   started_at, finished_at, last_error)
     values (30, 'acme', 'n1', '{}', 'dead', 1, 'noise', now(), now(), 'rate limited'),
            (31, 'acme', 'n2', '{}', 'done', 1, null, now() - interval '1 hour', now(), null)" >/dev/null

  expect_exit 0 "$LEASH" report --batch r --json
  assert_eq "report --json" "$(<"$T_OUT")" \
    '{"table":"agent_work_queue","tenants":null,"batch":"r","counts":{"pending":0,"leased":0,"done":20,"dead":5},"total":25,"settled":true,"attempts":{"1":17,"2":4,"3":1,"8":3},"retries":27,"retried_tasks":8,"crashes":10,"crashed_tasks":4,"dead_causes":{"quarantined":3,"returned":2},"duration_s":{"count":20,"p50":10,"p95":19,"max":20},"dead_reasons":[{"reason":"rate limited","count":3,"example_ids":[21,22,23]},{"reason":"bad input","count":2,"example_ids":[24,25]}],"dead_reasons_total":2,"first_claim_at":"2026-01-01T00:00:01.000000Z","last_finish_at":"2026-01-01T00:02:10.000000Z","wall_s":129,"pickup_wait_s":{"count":0,"p50":null,"p95":null,"max":null},"start_wait_s":{"count":0,"p50":null,"p95":null,"max":null},"usage":[]}'

  expect_exit 0 "$LEASH" report --batch r
  local out
  out=$(<"$T_OUT")
  assert_contains "text: tasks" "$out" "tasks      25: done 20, dead 5, pending 0, leased 0"
  assert_contains "text: attempts" "$out" "attempts   1: 17 2: 4 3: 1 8: 3"
  assert_contains "text: retries" "$out" "retries    27 (on 8 tasks)"
  assert_contains "text: crashes" "$out" "crashes    10 (on 4 tasks)"
  assert_contains "text: dead causes" "$out" "dead causes quarantined 3, returned 2"
  assert_contains "text: durations" "$out" "p50 10.0s, p95 19.0s, max 20.0s (20 done tasks"
  assert_contains "text: wall" "$out" "wall       2m 9s (first claim 2026-01-01T00:00:01.000000Z"
  assert_contains "text: reason 1" "$out" "       3  rate limited"
  assert_contains "text: examples 1" "$out" "e.g. id 21, 22, 23"
  assert_contains "text: reason 2" "$out" "       2  bad input"

  # A tenant scope, and a task still open: not settled, and counted.
  q "insert into agent_work_queue (id, tenant_id, shard_key, payload, status, attempts, batch)
     values (26, 'acme', 's26', '{}', 'pending', 1, 'r')" >/dev/null
  expect_exit 0 "$LEASH" report --batch r --tenant acme --json
  local j
  j=$(<"$T_OUT")
  assert_eq "tenant scope: counts" "$(jget "$j" 'j["counts"]')" '{"pending":1,"leased":0,"done":20,"dead":4}'
  assert_eq "tenant scope: settled" "$(jget "$j" 'j["settled"]')" False
  assert_eq "tenant scope: tenants" "$(jget "$j" 'j["tenants"]')" '["acme"]'
  assert_eq "tenant scope: reasons" "$(jget "$j" '[(r["reason"], r["count"]) for r in j["dead_reasons"]]')" \
    '[["rate limited",3],["bad input",1]]'
  expect_exit 0 "$LEASH" report --batch r --tenant 'acme' --tenant 'other' --json
  assert_eq "two tenants" "$(jget "$(<"$T_OUT")" 'j["total"]')" 26
  expect_exit 0 "$LEASH" report --batch r
  assert_contains "text: not settled" "$(<"$T_OUT")" "(not settled yet)"

  # An empty scope is a report of zeros, not an error.
  expect_exit 0 "$LEASH" report --batch nothing --json
  assert_eq "empty scope" "$(<"$T_OUT")" \
    '{"table":"agent_work_queue","tenants":null,"batch":"nothing","counts":{"pending":0,"leased":0,"done":0,"dead":0},"total":0,"settled":true,"attempts":{},"retries":0,"retried_tasks":0,"crashes":0,"crashed_tasks":0,"dead_causes":{},"duration_s":{"count":0,"p50":null,"p95":null,"max":null},"dead_reasons":[],"dead_reasons_total":0,"first_claim_at":null,"last_finish_at":null,"wall_s":null,"pickup_wait_s":{"count":0,"p50":null,"p95":null,"max":null},"start_wait_s":{"count":0,"p50":null,"p95":null,"max":null},"usage":[]}'
  expect_exit 2 "$LEASH" report extra
}

# ---------------------------------------------------------------- status

case_status_json_has_throughput_and_eta() {
  new_queue
  expect_exit 0 "$LEASH" status --json
  assert_eq "empty queue" "$(<"$T_OUT")" \
    '{"table":"agent_work_queue","tenant":null,"batch":null,"counts":{"pending":0,"leased":0,"done":0,"dead":0},"runnable":0,"scheduled":0,"oldest_runnable_age_s":null,"leases_by_worker":{},"throughput_per_s_1m":0.0,"eta_s":null,"paused":[],"budgets":[],"canary":null}'

  # 30 done and 10 dead in the last minute (40/60 per second), 20 done earlier; 50 pending
  # and 10 leased: 60 open at 0.667/s is 90 s.
  q "insert into agent_work_queue (tenant_id, shard_key, payload, status, finished_at)
     select 't', 'd' || g, '{}', 'done', now() - interval '10 seconds' from generate_series(1, 30) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, status, finished_at)
     select 't', 'x' || g, '{}', 'dead', now() - interval '20 seconds' from generate_series(1, 10) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, status, finished_at)
     select 't', 'o' || g, '{}', 'done', now() - interval '2 minutes' from generate_series(1, 20) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, status, finished_at)
     select 't', 'r' || g, '{}', 'pending', now() - interval '5 seconds' from generate_series(1, 50) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, status, lease_owner, locked_until)
     select 't', 'l' || g, '{}', 'leased', 'w1', now() + interval '1 minute' from generate_series(1, 10) g" >/dev/null
  expect_exit 0 "$LEASH" status --json
  local j
  j=$(<"$T_OUT")
  assert_contains "existing keys first, unchanged" "$j" \
    '{"table":"agent_work_queue","tenant":null,"batch":null,"counts":{"pending":50,"leased":10,"done":50,"dead":10},"runnable":50,"scheduled":0,"oldest_runnable_age_s":'
  assert_contains "new keys last" "$j" ',"leases_by_worker":{"w1":10},"throughput_per_s_1m":0.667,"eta_s":90.0,"paused":[],"budgets":[],"canary":null}'

  expect_exit 0 "$LEASH" status
  assert_contains "text: rate" "$(<"$T_OUT")" "rate     0.67/s (done and dead in the last minute, or since the first claim)"
  assert_contains "text: eta" "$(<"$T_OUT")" "eta      1m 30s (pending and leased at that rate)"

  # Scoped: a tenant with nothing finishing has no ETA.
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('idle', 'i', '{}')" >/dev/null
  expect_exit 0 "$LEASH" status --json --tenant idle
  assert_contains "no throughput, no eta" "$(<"$T_OUT")" '"throughput_per_s_1m":0.0,"eta_s":null,"paused":[],"budgets":[],"canary":null}'

  expect_exit 2 "$LEASH" status --interval 1
  assert_contains "interval needs watch" "$(<"$T_ERR")" "--interval goes with --watch"
  expect_exit 2 "$LEASH" status --watch --interval 0
}

case_status_watch_falls_back_to_lines_when_not_a_tty() {
  new_queue
  local i
  for i in 1 2 3 4; do expect_exit 0 "$LEASH" enqueue --batch w "{\"i\":$i}"; done
  expect_exit 0 "$LEASH" enqueue --batch quiet '{"i":0}'
  q "update agent_work_queue set status = 'done', started_at = now() - interval '2 seconds',
            finished_at = now() where id = 1;
     update agent_work_queue set status = 'done', finished_at = now() - interval '1 hour',
            started_at = now() - interval '2 hours' where batch = 'quiet'" >/dev/null

  # Not a terminal: plain lines, one per active batch per interval, until stopped.
  # --foreground: timeout's default also signals the whole group and then sends SIGCONT; a
  # second signal landing while LeakSanitizer's exit-time tracer has the process stopped
  # hangs the tracer (seen in CI: "already traced", killed after -k). One TERM is the test.
  expect_exit 124 timeout --foreground -k 3 2 "$LEASH" status --watch --interval 0.2
  local out n
  out=$(<"$T_OUT")
  n=$(lines_of "$T_OUT")
  ((n >= 3)) || fail "want at least 3 lines in 2 s at 0.2 s, got $n: $out"
  grep -Evq '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z batch=w done=1 dead=0 pending=3 leased=0 total=4 progress=25\.0% rate=[0-9.]+/s eta=[^ ]+$' <<<"$out" \
    && fail "unexpected line in: $out"
  assert_not_contains "no escape codes" "$out" $'\033'
  assert_not_contains "quiet batch not shown" "$out" "batch=quiet"
  assert_eq "stderr" "$(<"$T_ERR")" ""

  # --batch shows that batch even when it is quiet; --until-empty stops by itself.
  expect_exit 0 "$LEASH" status --watch --interval 0.2 --batch quiet --until-empty
  assert_eq "one frame" "$(lines_of "$T_OUT")" 1
  assert_contains "quiet batch" "$(<"$T_OUT")" "batch=quiet done=1 dead=0 pending=0 leased=0 total=1 progress=100.0%"

  # --json: one object per interval.
  expect_exit 124 timeout --foreground -k 3 0.7 "$LEASH" status --watch --json --interval 0.2
  local first
  first=$(head -n 1 "$T_OUT")
  assert_eq "json frame: batches" "$(jget "$first" '[(b["batch"], b["counts"]["done"], b["total"], b["progress"]) for b in j["batches"]]')" \
    '[["w",1,4,0.25]]'
  assert_eq "json frame: open" "$(jget "$first" 'j["open"]')" 3

  # SIGINT ends it with status 0.
  "$LEASH" status --watch --interval 0.2 >"$T_TMP/int.out" 2>&1 &
  local pid=$!
  t_on_exit t_kill "$pid"
  wait_for "a first frame" 10 test -s "$T_TMP/int.out"
  kill -INT "$pid"
  wait_for "status --watch to exit after SIGINT" 10 gone "$pid"
  local rc=0
  wait "$pid" || rc=$?
  assert_eq "exit status after SIGINT" "$rc" 0

  # On a terminal (script(1) gives it a pseudo-terminal): a bar, redrawn in place, that
  # moves while tasks finish, and --until-empty ends it once the batch has settled.
  command -v script >/dev/null || { echo "# no script(1): terminal part skipped" >&2; return 0; }
  (
    # Once the first frame is out, one more task finishes every 0.4 s.
    for ((i = 0; i < 200; i++)); do
      grep -q '25.0%' "$T_OUT" 2>/dev/null && break
      sleep 0.05
    done
    for i in 2 3 4; do
      sleep 0.4
      q "update agent_work_queue set status = 'done', started_at = now() - interval '1 second',
                finished_at = now() where id = $i" >/dev/null
    done
  ) &
  local updater=$!
  t_on_exit t_kill "$updater"
  expect_exit 0 env TERM=xterm timeout -k 5 30 script -qec \
    "$(printf '%q ' "$LEASH" status --watch --interval 0.2 --until-empty --batch w)" /dev/null
  wait "$updater"
  out=$(tr -d '\r' <"$T_OUT")
  assert_contains "redraws in place" "$out" $'\033[2F\033[J'
  assert_contains "bar at 25%" "$out" " 25.0%"
  assert_contains "bar at 100%" "$out" "[##########"
  assert_contains "full bar" "$out" "100.0%  eta 0s"
  assert_contains "header" "$out" "agent_work_queue  "
}

# frames_of FILE: a terminal capture as plain lines: carriage returns and the redraw
# sequences (ESC [ n F, ESC [ J) removed, so every frame's lines are lines.
frames_of() { tr -d '\r' <"$1" | sed -E $'s/\033\\[[0-9]*F//g; s/\033\\[J//g'; }

# watch_tty COLS OUT: one capture of `status --watch` on a pseudo-terminal COLS wide, of
# about three frames, stopped by one TERM from timeout (exit 124 through script -e).
watch_tty() {
  expect_exit 124 env TERM=xterm timeout -k 5 30 script -qec \
    "stty cols $1; $(printf '%q ' timeout --foreground -k 3 1.5 "$LEASH" status --watch --interval 0.4)" /dev/null
  frames_of "$T_OUT" >"$2"
}

case_watch_on_80_and_40_columns_keeps_every_count_and_shows_dead_tasks() {
  command -v script >/dev/null || { echo "# no script(1): skipped" >&2; return 0; }
  new_queue
  local long=nightly-batch-with-a-long-name   # 30 characters, the widest label
  q "insert into agent_work_queue (tenant_id, shard_key, payload, batch, status, finished_at)
     select 't', 'd' || g, '{}', '$long', 'done', now() - interval '2 minutes' from generate_series(1, 9000) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, batch, status, finished_at)
     select 't', 'x' || g, '{}', '$long', 'dead', now() - interval '2 minutes' from generate_series(1, 1061) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, batch)
     select 't', 'p' || g, '{}', '$long' from generate_series(1, 1234) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, batch, status, lease_owner, locked_until)
     select 't', 'l' || g, '{}', '$long', 'leased', 'w1', now() + interval '1 hour' from generate_series(1, 567) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, batch, status, finished_at)
     select 't', 'c' || g, '{}', 'clean-looking', 'done', now() - interval '1 second' from generate_series(1, 939) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, batch, status, finished_at)
     select 't', 'k' || g, '{}', 'clean-looking', 'dead', now() - interval '1 second' from generate_series(1, 61) g" >/dev/null
  local cols out
  for cols in 80 40; do
    watch_tty "$cols" "$T_TMP/w$cols"
    out=$(<"$T_TMP/w$cols")
    local long_lines
    long_lines=$(awk -v w="$cols" 'length($0) > w - 1' "$T_TMP/w$cols")
    assert_eq "$cols columns: no line is wider than the terminal" "$long_lines" ""
    assert_not_contains "$cols columns: nothing is cut" "$out" "nightly-batch-with-a-long-nam "
    # Each count of both batches, whole, in every frame (wrapped or not).
    local frames word
    frames=$(grep -c "^agent_work_queue  " <<<"$out")
    ((frames >= 2)) || fail "$cols columns: want at least 2 frames, got $frames: $out"
    for word in "done 9000" "dead 1061" "pending 1234" "leased 567" "done 939" "dead 61" \
                "pending 0" "leased 0" "84.8%" "100.0%" "eta -" "eta 0s"; do
      local seen
      seen=$(grep -Ec "(^| )${word}( |$)" <<<"$out")
      ((seen >= frames)) || fail "$cols columns: '$word' in $seen of $frames frames: $out"
    done
  done
  # At 80 columns the bars stay (the stats wrap under them) and dead tasks have their own
  # glyph: a batch that finished with 61 dead does not look clean.
  out=$(<"$T_TMP/w80")
  grep -Eq '^clean-looking +\[#+x+\]$' <<<"$out" \
    || fail "80 columns: want a bar with dead tasks for clean-looking: $out"
  grep -Eq '^nightly-batch-with-a-long-name \[#+x+\.+\]$' <<<"$out" \
    || fail "80 columns: want done, dead and open in the long batch's bar: $out"
  assert_contains "legend" "$out" "(# done, x dead;"
  # At 40 the bar goes first, then the stats wrap under the label.
  assert_not_contains "40 columns: no bar" "$(<"$T_TMP/w40")" "[#"
}

case_watch_notes_when_a_batch_total_grows() {
  new_queue
  local i
  for i in 1 2 3; do expect_exit 0 "$LEASH" enqueue --batch g "{\"i\":$i}"; done
  "$LEASH" status --watch --interval 0.2 --batch g >"$T_TMP/g.out" 2>&1 &
  local pid=$!
  t_on_exit t_kill "$pid"
  wait_for "a first frame" 10 grep -q 'total=3 ' "$T_TMP/g.out"
  assert_not_contains "no note before it grows" "$(<"$T_TMP/g.out")" "total_grew_by"
  q "insert into agent_work_queue (tenant_id, shard_key, payload, batch)
     select 'default', 'n' || g, '{}', 'g' from generate_series(1, 5) g" >/dev/null
  wait_for "a frame that says the total grew by 5" 10 grep -q 'total=8 .* total_grew_by=5$' "$T_TMP/g.out"
  wait_for "the next frame without the note" 10 grep -Eq 'total=8 progress=[0-9.]+% rate=[0-9.]+/s eta=[^ ]+$' "$T_TMP/g.out"
  kill -TERM "$pid"
  wait_for "status --watch to exit" 10 gone "$pid"

  # --json: every batch has total_grew_by, 0 when it did not grow.
  expect_exit 124 timeout --foreground -k 3 0.5 "$LEASH" status --watch --json --interval 0.2
  assert_eq "json: total_grew_by" "$(jget "$(head -n 1 "$T_OUT")" '[b["total_grew_by"] for b in j["batches"]]')" '[0]'

  # On a terminal: a note line under the bar that stays, with the growth since the start.
  command -v script >/dev/null || { echo "# no script(1): terminal part skipped" >&2; return 0; }
  (
    for ((i = 0; i < 200; i++)); do grep -q 'every 0.3s' "$T_OUT" 2>/dev/null && break; sleep 0.05; done
    q "insert into agent_work_queue (tenant_id, shard_key, payload, batch)
       select 'default', 'm' || g, '{}', 'g' from generate_series(1, 2) g" >/dev/null
  ) &
  local updater=$!
  t_on_exit t_kill "$updater"
  expect_exit 124 env TERM=xterm timeout -k 5 30 script -qec \
    "$(printf '%q ' timeout --foreground -k 3 3 "$LEASH" status --watch --interval 0.3 --batch g)" /dev/null
  wait "$updater"
  assert_contains "tty note" "$(frames_of "$T_OUT")" "^ total grew: +2 since the last frame, +2 since the watch began"
  assert_contains "tty note stays" "$(frames_of "$T_OUT")" "^ total grew: +0 since the last frame, +2 since the watch began"
}

case_status_and_the_watch_give_one_eta_for_a_batch() {
  new_queue
  # A batch whose first claim was 20 s ago: 10 finished, 30 open. Rate 10/20 s = 0.5/s, ETA
  # 60 s, in status, status --json and the watch (a second or two later: within 10%).
  q "insert into agent_work_queue (tenant_id, shard_key, payload, batch, status, started_at, finished_at)
     select 't', 'd' || g, '{}', 'e', 'done', now() - interval '20 seconds', now() - interval '5 seconds' from generate_series(1, 10) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, batch)
     select 't', 'p' || g, '{}', 'e' from generate_series(1, 30) g" >/dev/null
  expect_exit 0 "$LEASH" status --json --batch e
  local once all watch
  once=$(jget "$(<"$T_OUT")" 'j["eta_s"]')
  expect_exit 0 "$LEASH" status --json
  all=$(jget "$(<"$T_OUT")" 'j["eta_s"]')
  expect_exit 124 timeout --foreground -k 3 0.5 "$LEASH" status --watch --json --interval 0.2
  watch=$(jget "$(head -n 1 "$T_OUT")" 'j["batches"][0]["eta_s"]')
  python3 - "$once" "$all" "$watch" <<'PY' || fail "ETAs disagree: status --batch $once, status $all, watch $watch"
import sys
v = [float(x) for x in sys.argv[1:]]
sys.exit(0 if all(57 <= x <= 66 for x in v) else 1)
PY
  expect_exit 0 "$LEASH" status --batch e
  assert_contains "text states the window" "$(<"$T_OUT")" "(done and dead in the last minute, or since the first claim)"
  expect_exit 0 "$LEASH" status --help
  assert_contains "help states the definition" "$(<"$T_OUT")" "ETA"
}

t_run "$@"
