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

t_run "$@"
