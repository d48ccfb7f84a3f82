#!/usr/bin/env bash
# `leash run --metrics`: the Prometheus endpoint, /healthz and /readyz.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/run_common.sh"

# http_get PORT PATH: prints "STATUS" on the first line, then the body (bash /dev/tcp, so
# the test needs no HTTP client).
http_get() {
  local line status body=0
  exec 7<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&7
  while IFS= read -r line <&7; do
    line=${line%$'\r'}
    if [[ -z ${status:-} ]]; then
      status=${line#* }
      status=${status%% *}
      echo "$status"
    elif ((body)); then
      echo "$line"
    elif [[ -z $line ]]; then
      body=1
    fi
  done
  exec 7<&-
}

free_port() {
  local p
  for ((p = 19200 + RANDOM % 500; p < 20000; p++)); do
    (exec 6<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  fail "no free port"
}

# admin SQL: runs on the maintenance database (a database cannot lock itself out).
admin() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d postgres -c "$1" >/dev/null; }

metric() { http_get "$1" /metrics | awk -v n="$2" '$1 == n { print $2 }'; }

case_metrics_count_tasks_and_health_follows_the_database() {
  run_setup
  local port
  port=$(free_port)
  seq 1 200 | awk '{ print "{\"payload\":{}}" }' >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 200
  start_worker M "$FIX/noop.lua" --concurrency 4 --metrics "127.0.0.1:$port" --poll-ms 20-50
  wait_for "/metrics to count 200 done tasks" 30 \
    eval "[[ \$(metric $port leash_tasks_done_total) == 200 ]]"
  assert_eq "claimed" "$(metric "$port" leash_tasks_claimed_total)" 200
  assert_eq "slots" "$(metric "$port" leash_slots)" 4
  assert_eq "task duration count" "$(metric "$port" leash_task_duration_seconds_count)" 200
  assert_eq "pickup latency count" "$(metric "$port" leash_pickup_latency_seconds_count)" 200
  assert_eq "/healthz" "$(http_get "$port" /healthz | head -1)" 200
  assert_eq "/readyz" "$(http_get "$port" /readyz | head -1)" 200
  assert_eq "unknown path" "$(http_get "$port" /nope | head -1)" 404
  # The database goes away: health says so, the process stays up.
  admin "alter database \"$TDB\" allow_connections false"
  t_on_exit admin "alter database \"$TDB\" allow_connections true"
  admin "select pg_terminate_backend(pid) from pg_stat_activity
          where datname = '$TDB' and application_name = 'leash lease'"
  wait_for "/healthz to report the database unreachable" 30 \
    eval "[[ \$(http_get $port /healthz | head -1) == 503 ]]"
  admin "alter database \"$TDB\" allow_connections true"
  wait_for "/healthz to recover" 30 eval "[[ \$(http_get $port /healthz | head -1) == 200 ]]"
  kill -TERM "${W_PID[M]}"
  assert_worker_exit M 30 0
}

case_metrics_address_in_use_is_a_start_failure() {
  run_setup
  local port
  port=$(free_port)
  start_worker M1 "$FIX/noop.lua" --concurrency 1 --metrics "127.0.0.1:$port"
  wait_for "M1 to serve" 30 eval "[[ \$(http_get $port /healthz | head -1) == 200 ]]"
  expect_exit 1 "$LEASH" run "$FIX/noop.lua" --concurrency 1 --metrics "127.0.0.1:$port"
  assert_contains "error" "$(<"$T_ERR")" "cannot listen"
}

t_run "$@"
