#!/usr/bin/env bash
# `leash run` cases too slow or too disruptive for the ThreadSanitizer set (see run.sh for
# the rest). server_restart_mid_batch restarts PostgreSQL, so it starts a private cluster of
# its own rather than disturb the tests that share the throwaway one.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"

# private_cluster: a PostgreSQL of this case's own (these cases restart or stop it), removed
# at exit; PGHOST/PGPORT point at it from here on.
private_cluster() {
  need_pg
  local env
  if ! env=$("$LEASH_SRC/scripts/pg.sh" start) || [[ $env == false ]]; then
    fail "could not start a private PostgreSQL cluster"
  fi
  eval "$env"
  t_on_exit "$LEASH_SRC/scripts/pg.sh" stop "$LEASH_PG_DIR"
}

# 7. PostgreSQL restarts (fast shutdown) in the middle of a batch: both workers reconnect, the
# batch settles, --until-empty exits 0, and every task is done (at least once).
case_server_restart_mid_batch() {
  private_cluster
  run_setup
  seq 1 2000 | awk '{ printf "{\"payload\":{\"sleep\":0.005,\"n\":%d}}\n", $1 }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 2000
  local w
  for w in A B; do
    start_worker "$w" "$FIX/record.lua" --concurrency 4 --visibility 60s --heartbeat 1s \
      --until-empty --poll-ms 20-100
  done
  wait_for "the batch to be under way" 60 q_true \
    "select count(*) >= 100 from agent_work_queue where status = 'done'"
  local before
  before=$(q "select count(*) from agent_work_queue where status = 'done'")
  "$LEASH_SRC/scripts/pg.sh" restart "$LEASH_PG_DIR" || fail "pg.sh restart failed"
  local after
  after=$(q "select count(*) from agent_work_queue where status = 'done'")
  echo "# restart: $before done before, $after right after" >&2
  ((after < 2000)) || fail "the batch was over before the restart completed ($after done): not mid-batch"
  # A restart of under a second must cost seconds, not a lease: the leases (60 s) are far
  # longer than the batch needs, so a task whose outcome the host dropped during the outage
  # (or whose lease it forgot) shows up as a row still leased at the deadline.
  for w in A B; do
    wait_for "worker $w to settle the batch and exit after the restart" 40 _gone_or_report "${W_PID[$w]}"
    assert_worker_exit "$w" 1 0
  done
  assert_eq "queue after the batch" "$(status_counts)" "done=2000"
  assert_eq "tasks executed" "$(q 'select count(distinct task_id) from execs')" 2000
  assert_eq "done tasks without an execution that finished" \
    "$(q "select count(*) from agent_work_queue q where not exists
            (select 1 from execs e where e.task_id = q.id and e.finished is not null)")" 0
  # Both workers saw the restart and came back, rather than dying or hanging.
  for w in A B; do
    log_has "$w" "re-established" || log_has "$w" "lease thread:" \
      || fail "worker $w's log shows no reconnection"$'\n'"$(worker_log "$w")"
  done
  assert_no_sanitizer_reports
}

# 8. A worker that starts while PostgreSQL is down (a pod scheduled before its database, a
# failover) waits for it and then runs; a database that answers "no" (no such database)
# fails at once, with one line.
case_start_waits_for_a_database_that_is_down() {
  private_cluster
  run_setup
  seq 1 20 | awk '{ printf "{\"payload\":{\"n\":%d}}\n", $1 }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 20

  "$LEASH_SRC/scripts/pg.sh" halt "$LEASH_PG_DIR" || fail "pg.sh halt failed"
  start_worker A "$FIX/record.lua" --concurrency 2 --until-empty --poll-ms 20-100
  wait_for "worker A to try the database three times" 30 _retries_at_least A 3
  exited "${W_PID[A]}" && fail "worker A gave up on a database that is only down"
  "$LEASH_SRC/scripts/pg.sh" resume "$LEASH_PG_DIR" || fail "pg.sh resume failed"
  assert_worker_exit A 60 0
  assert_eq "queue after the batch" "$(status_counts)" "done=20"

  # The server answers, and the answer is final: no waiting.
  local t0=$SECONDS
  expect_exit 1 timeout 30 "$LEASH" run "$FIX/record.lua" --db "$DATABASE_URL dbname=leash_no_such_db"
  ((SECONDS - t0 < 10)) || fail "a missing database took $((SECONDS - t0)) s to fail"
  assert_contains "last line of stderr" "$(tail -n 1 "$T_ERR")" 'database "leash_no_such_db" does not exist'
  assert_not_contains "stderr" "$(<"$T_ERR")" "retrying"
  assert_no_sanitizer_reports
}

_retries_at_least() { (($(grep -c "retrying in" "$T_TMP/$1.log") >= $2)); }

# _gone_or_report PID: true once PID exited; else prints what is still open in the queue.
_gone_or_report() {
  exited "$1" && return 0
  echo "queue: $(status_counts)"
  q "select 'leased: task ' || id || ' by ' || lease_owner || ', attempt ' || attempts
            || ', lease ends in ' || round(extract(epoch from locked_until - now())) || ' s'
       from agent_work_queue where status = 'leased' order by id"
  return 1
}

t_run "$@"
