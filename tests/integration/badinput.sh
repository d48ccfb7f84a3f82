#!/usr/bin/env bash
# Database states that are wrong or hostile (docs/bad-input.md): leash says what is wrong in
# one line, loses nothing, and recovers when the state is fixed.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/run_common.sh"

NOOP=$LEASH_SRC/tests/fixtures/badinput/noop.lua

case_table_missing_a_column_is_refused_at_start() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  q "alter table agent_work_queue drop column finished_at" >/dev/null
  expect_exit 1 "$LEASH" run "$NOOP" --until-empty
  assert_contains "run names the column" "$(<"$T_ERR")" "has no column finished_at"
  expect_exit 1 "$LEASH" enqueue '{}'
  assert_contains "enqueue names the column" "$(<"$T_ERR")" "has no column finished_at"
  assert_eq "nothing enqueued" "$(q "select count(*) from agent_work_queue")" 0
}

case_row_in_an_unknown_status_is_left_alone() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  # Someone dropped the CHECK and parked a row by hand.
  q "alter table agent_work_queue drop constraint agent_work_queue_status_check" >/dev/null
  expect_exit 0 "$LEASH" enqueue '{"n":1}'
  q "insert into agent_work_queue (tenant_id, shard_key, payload, status)
     values ('default', 'parked', '{}', 'paused')" >/dev/null
  expect_exit 0 "$LEASH" run "$NOOP" --until-empty --concurrency 2
  assert_eq "statuses" "$(q "select string_agg(status, ',' order by id) from agent_work_queue")" "done,paused"
  expect_exit 0 "$LEASH" status --json
}

case_revoked_permission_is_logged_and_nothing_is_lost() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  q "drop role if exists leash_bad_t; create role leash_bad_t login" >/dev/null
  t_on_exit q "drop owned by leash_bad_t; drop role if exists leash_bad_t"
  sed -e 's/leash_worker/leash_bad_t/g' "$LEASH_SRC/docs/worker-role.sql" >"$T_TMP/grants.sql"
  psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -f "$T_TMP/grants.sql" >/dev/null
  q "revoke update on agent_work_queue from leash_bad_t" >/dev/null
  seq 1 20 | awk '{ print "{\"payload\":{}}" }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 20
  LEASH_DB="$DATABASE_URL user=leash_bad_t"
  "$LEASH" --db "$LEASH_DB" run "$NOOP" --worker-id R --until-empty --poll-ms 20-50 \
    >"$T_TMP/R.out" 2>"$T_TMP/R.log" &
  W_PID[R]=$!
  t_on_exit t_kill "$!"
  wait_for "the permission error in the log" 30 log_has R "permission denied"
  assert_eq "nothing claimed without UPDATE" "$(q "select count(*) from agent_work_queue where status <> 'pending'")" 0
  q "grant update on agent_work_queue to leash_bad_t" >/dev/null
  assert_worker_exit R 60 0
  assert_eq "all done once the grant is back" "$(q "select count(*) from agent_work_queue where status = 'done'")" 20
}

case_read_only_database_like_a_full_disk_recovers() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  seq 1 200 | awk '{ print "{\"payload\":{}}" }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 200
  # Writes fail the way they do on a full disk: every write is refused, reads work.
  psql -X -q -d postgres -c "alter database \"$TDB\" set default_transaction_read_only = on" >/dev/null
  t_on_exit psql -X -q -d postgres -c "alter database \"$TDB\" reset default_transaction_read_only"
  start_worker F "$NOOP" --concurrency 4 --until-empty --poll-ms 20-50
  wait_for "the write error in the log" 30 log_has F "read-only transaction"
  psql -X -q -d postgres -c "alter database \"$TDB\" reset default_transaction_read_only" >/dev/null
  # Sessions keep the setting they started with: end them, as a failover would.
  psql -X -q -d postgres -c "select pg_terminate_backend(pid) from pg_stat_activity
                             where datname = '$TDB' and application_name like 'leash%'" >/dev/null
  assert_worker_exit F 90 0
  assert_eq "every task done, none lost" "$(status_counts)" "done=200"
}

# --- A row cannot stall the queue (issue #12, class 4; docs/SECURITY.md). Each bad row is
# put in by plain SQL between ordinary tasks; the others must all run to done and the bad
# row end dead with cause bad_row and the database's error.

# ordinary_tasks N [PREFIX]: N tasks with shard keys PREFIX1..PREFIXN (PREFIX: k).
ordinary_tasks() {
  q "insert into agent_work_queue (tenant_id, shard_key, payload)
     select 'default', '${2:-k}' || g, '{}' from generate_series(1, $1) g" >/dev/null
}

# assert_set_aside WHAT ERROR: the row whose shard_key starts with 'bad' is dead/bad_row with
# ERROR in last_error, and the 20 ordinary tasks are done.
assert_set_aside() {
  assert_eq "$1: the others" "$(q "select count(*) from agent_work_queue where shard_key not like 'bad%' and status = 'done'")" 20
  assert_eq "$1: the bad row" "$(q "select status || '|' || last_cause from agent_work_queue where shard_key like 'bad%'")" "dead|bad_row"
  assert_contains "$1: its error" "$(q "select last_error from agent_work_queue where shard_key like 'bad%'")" "$2"
}

case_plain_sql_cannot_insert_what_the_claim_cannot_lease() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  # tenant_id, shard_key, batch, attempts, max_attempts, max_crashes, crashes
  local v
  for v in "repeat('t', 513), 'k', 'b', 0, 8, 3, 0" "'t', repeat('é', 257), 'b', 0, 8, 3, 0" \
           "'t', 'k', repeat('b', 513), 0, 8, 3, 0" "'t', 'k', 'b', 2147483647, 8, 3, 0" \
           "'t', 'k', 'b', 0, 0, 3, 0" "'t', 'k', 'b', 0, 1001, 3, 0" "'t', 'k', 'b', 8, 8, 3, 0" \
           "'t', 'k', 'b', -1, 8, 3, 0" "'t', 'k', 'b', 0, 8, 0, 0" "'t', 'k', 'b', 0, 8, 1001, 0" \
           "'t', 'k', 'b', 0, 8, 3, 4" "'t', 'k', 'b', 0, 8, 3, -1"; do
    expect_exit 1 psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -c \
      "insert into agent_work_queue (tenant_id, shard_key, batch, attempts, max_attempts, max_crashes, crashes, payload)
       values ($v, '{}')"
    assert_contains "refused: $v" "$(<"$T_ERR")" 'violates check constraint "leash_'
  done
  # At the bounds: accepted (512 bytes each, 1000 attempts, 1000 crashes).
  q "insert into agent_work_queue (tenant_id, shard_key, payload, batch, attempts, max_attempts, max_crashes, crashes)
     values (repeat('t', 512), repeat('k', 512), '{}', repeat('b', 512), 999, 1000, 1000, 999)" >/dev/null
  assert_eq "constraints validated on a new table" \
    "$(q "select bool_and(convalidated) from pg_constraint where conrelid = 'agent_work_queue'::regclass and conname like 'leash_%'")" t
}

case_a_shard_key_the_index_cannot_hold_is_set_aside() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  q "alter table agent_work_queue drop constraint leash_shard_key_bytes" >/dev/null
  ordinary_tasks 10
  # 8,000 bytes that do not compress: too big for a btree entry. Since 011 a pending row's
  # shard key is in the heads' indexes, so such a row is refused at its INSERT (before, it
  # went in and one_lease_per_shard refused it at lease time: set aside by the fallback,
  # which a_trigger_refusing_one_lease_sets_that_row_aside still proves).
  local err
  err=$(psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -c "insert into agent_work_queue (tenant_id, shard_key, payload)
     values ('default', 'bad' || (select string_agg(md5(g::text), '') from generate_series(1, 250) g), '{}')" 2>&1) &&
    fail "an 8,000-byte shard key was inserted"
  assert_contains "refused by an index" "$err" "exceeds btree version 4 maximum"
  ordinary_tasks 10 j
  expect_exit 0 "$LEASH" run "$NOOP" --until-empty --concurrency 4 --claim-batch 8
  assert_eq "the others" "$(q "select count(*) from agent_work_queue where status = 'done'")" 20
  assert_eq "nothing else" "$(q "select count(*) from agent_work_queue")" 20
}

case_attempts_at_int_max_is_set_aside() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  q "alter table agent_work_queue drop constraint leash_attempts_range" >/dev/null
  ordinary_tasks 10
  q "insert into agent_work_queue (tenant_id, shard_key, payload, attempts) values ('default', 'bad', '{}', 2147483647)" >/dev/null
  ordinary_tasks 10 j
  expect_exit 0 "$LEASH" run "$NOOP" --until-empty --concurrency 4 --claim-batch 8
  assert_set_aside "attempts at INT_MAX" "integer out of range"
}

# refusing_trigger WHEN: a user's BEFORE UPDATE trigger that raises for the row with shard
# 'bad' when WHEN (an expression of OLD and NEW) holds.
refusing_trigger() {
  q "create function refuse() returns trigger language plpgsql as \$\$
     begin
       if NEW.shard_key = 'bad' and ($1) then
         raise exception 'refused by a user trigger';
       end if;
       return NEW;
     end \$\$;
     create trigger refuse before update on agent_work_queue for each row execute function refuse()" >/dev/null
}

case_a_trigger_refusing_one_lease_sets_that_row_aside() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  refusing_trigger "NEW.status = 'leased'"
  ordinary_tasks 10
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('default', 'bad', '{}')" >/dev/null
  ordinary_tasks 10 j
  expect_exit 0 "$LEASH" run "$NOOP" --until-empty --concurrency 4 --claim-batch 8
  assert_set_aside "a refused lease" "refused by a user trigger"
}

case_a_trigger_refusing_one_settle_sets_that_row_aside() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  refusing_trigger "NEW.status = 'done'"
  ordinary_tasks 10
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('default', 'bad', '{}')" >/dev/null
  ordinary_tasks 10 j
  expect_exit 0 "$LEASH" run "$NOOP" --until-empty --concurrency 4 --claim-batch 8
  assert_set_aside "a refused settle" "its outcome could not be written: refused by a user trigger"
}

case_a_trigger_refusing_one_reap_sets_that_row_aside() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  refusing_trigger "OLD.status = 'leased' and NEW.status = 'pending'"
  ordinary_tasks 20
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('default', 'bad', '{}')" >/dev/null
  # Two leases of a worker that died: one reaps, the other's reap is refused.
  q "update agent_work_queue set status = 'leased', lease_owner = 'gone', attempts = 1,
       locked_until = now() - interval '1 s' where shard_key in ('bad', 'k1')" >/dev/null
  expect_exit 0 "$LEASH" run "$NOOP" --until-empty --concurrency 4
  assert_set_aside "a refused reap" "its expired lease could not be reaped: refused by a user trigger"
  assert_eq "the other expired lease ran again" "$(q "select crashes || '|' || status from agent_work_queue where shard_key = 'k1'")" "1|done"
}

# A trigger refusing one lease's renewal must not make the process's other leases lapse (each
# lapse would count as a crash of an innocent task): the others are renewed one by one and
# finish with no crash; the refused one lapses, and its crashes quarantine it.
case_a_trigger_refusing_one_heartbeat_lets_the_others_renew() {
  run_setup
  refusing_trigger "OLD.status = 'leased' and NEW.status = 'leased' and NEW.locked_until > OLD.locked_until"
  q "insert into agent_work_queue (tenant_id, shard_key, payload)
     select 'default', s, '{\"sleep\": 3}' from unnest(array['bad', 'k1', 'k2', 'k3']) s" >/dev/null
  expect_exit 0 "$LEASH" run "$FIX/record.lua" --until-empty --concurrency 4 --visibility 2 \
    --heartbeat 0.5 --poll-ms 20-50
  assert_eq "the others: done, no crash" \
    "$(q "select string_agg(status || '|' || crashes, ',' order by id) from agent_work_queue where shard_key <> 'bad'")" \
    "done|0,done|0,done|0"
  assert_contains "the fallback said so" "$(<"$T_ERR")" "renewing one by one"
  assert_eq "the refused one" "$(q "select status || '|' || last_cause || '|' || crashes from agent_work_queue where shard_key = 'bad'")" \
    "dead|quarantined|3"
}

# An error that is not the row's (here a serialization failure raised by a trigger) must not
# set rows aside: the cycle fails as before, and once the cause is gone everything runs.
case_an_error_that_is_not_the_rows_sets_nothing_aside() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  q "create function refuse() returns trigger language plpgsql as \$\$
     begin
       if NEW.shard_key = 'bad' and NEW.status = 'leased' then
         raise exception 'not the row''s fault' using errcode = 'serialization_failure';
       end if;
       return NEW;
     end \$\$;
     create trigger refuse before update on agent_work_queue for each row execute function refuse()" >/dev/null
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('default', 'bad', '{}')" >/dev/null
  ordinary_tasks 20
  start_worker S "$NOOP" --concurrency 2 --until-empty --poll-ms 20-50
  wait_for "the error in the log" 30 log_has S "not the row's fault"
  assert_eq "nothing set aside" "$(q "select count(*) from agent_work_queue where status = 'dead'")" 0
  assert_eq "no fallback" "$(grep -c 'row by row' "$T_TMP/S.log" || true)" 0
  q "drop trigger refuse on agent_work_queue" >/dev/null
  assert_worker_exit S 60 0
  assert_eq "all done once the cause is gone" "$(status_counts)" "done=21"
}

# A table from before 010 that holds rows breaking the new bounds: the migration sets the
# claimable ones aside (dead, bad_row, naming the constraint) instead of failing, keeps
# finished ones as they are, and leaves a constraint such rows break NOT VALID.
case_migration_sets_aside_rows_that_break_the_bounds() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  # Back to the state before 010: the constraints, functions, triggers and objects of 010 and
  # 011 gone, their records removed (the columns 010 added stay: it adds them IF NOT EXISTS).
  q "alter table agent_work_queue drop constraint leash_tenant_id_bytes, drop constraint leash_shard_key_bytes,
       drop constraint leash_batch_bytes, drop constraint leash_max_attempts_range,
       drop constraint leash_attempts_range, drop constraint leash_max_crashes_range,
       drop constraint leash_crashes_range, drop constraint leash_priority_range,
       drop constraint leash_head_is_pending,
       drop column priority cascade, drop column is_head cascade, drop column lease_token,
       drop column run_started_at;
     do \$\$ declare f regprocedure; begin
       for f in select p.oid::regprocedure from pg_proc p
                 where p.proname like 'agent_work_queue%' and p.proname <> 'agent_work_queue_notify' loop
         execute format('drop function %s cascade', f);
       end loop; end \$\$;
     drop table agent_work_queue_tenants; drop sequence agent_work_queue_lease_token_seq;
     delete from agent_work_queue_migrations where version >= 10" >/dev/null
  ordinary_tasks 5
  q "insert into agent_work_queue (tenant_id, shard_key, payload, status, attempts, max_attempts) values
       ('default', repeat('s', 600), '{}', 'pending', 0, 8),
       ('default', 'kmax', '{}', 'pending', 0, 5000),
       ('default', 'katt', '{}', 'pending', 8, 8),
       ('default', repeat('d', 600), '{}', 'done', 1, 8)" >/dev/null
  expect_exit 0 "$LEASH" migrate
  assert_eq "set aside" "$(q "select string_agg(status || '|' || coalesce(last_cause, '-'), ',' order by id) from agent_work_queue where id > 5")" \
    "dead|bad_row,dead|bad_row,dead|bad_row,done|-"
  assert_contains "the shard key" "$(q "select last_error from agent_work_queue where id = 6")" "constraint leash_shard_key_bytes"
  assert_contains "max_attempts" "$(q "select last_error from agent_work_queue where id = 7")" "constraint leash_max_attempts_range"
  assert_contains "attempts" "$(q "select last_error from agent_work_queue where id = 8")" "constraint leash_attempts_range"
  assert_eq "validated where no old row breaks it" \
    "$(q "select string_agg(conname || '=' || convalidated, ',' order by conname) from pg_constraint
          where conrelid = 'agent_work_queue'::regclass and conname in ('leash_shard_key_bytes', 'leash_tenant_id_bytes')")" \
    "leash_shard_key_bytes=false,leash_tenant_id_bytes=true"
  expect_exit 0 "$LEASH" run "$NOOP" --until-empty
  assert_eq "the others ran" "$(q "select count(*) from agent_work_queue where status = 'done'")" 6
}

t_run "$@"
