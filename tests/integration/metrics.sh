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

# slow_clients PORT N SECONDS STATE: N sockets to the metrics port for SECONDS (loopback only,
# bounded): half trickle a request header one byte every 2 s, half connect and send nothing;
# a socket the server closes is opened again at once, as an attacker would. STATE gets
# "open=<sockets open> cut=<closed by the server> cut_trickle=<of those, trickling ones>"
# every half second.
slow_clients() {
  python3 - "$@" <<'PY'
import socket, sys, time
port, n, secs, state = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
end = time.monotonic() + secs
socks, cut, cut_trickle = {}, 0, 0
def connect(i):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.setblocking(False)
    socks[i] = [s, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10000, 0]
for i in range(n):
    connect(i)
last_byte = last_state = 0.0
while time.monotonic() < end:
    now = time.monotonic()
    for i, entry in list(socks.items()):
        s = entry[0]
        try:
            if s.recv(4096) == b"":
                raise ConnectionResetError
        except BlockingIOError:
            pass
        except OSError:
            s.close(); cut += 1; cut_trickle += i % 2 == 0
            try:
                connect(i)
            except OSError:
                del socks[i]
            continue
        if i % 2 == 0 and now - last_byte >= 2:
            try:
                s.send(entry[1][entry[2]:entry[2] + 1]); entry[2] += 1
            except OSError:
                pass
    if now - last_byte >= 2:
        last_byte = now
    if now - last_state >= 0.5:
        last_state = now
        with open(state + ".tmp", "w") as f:
            f.write(f"open={len(socks)} cut={cut} cut_trickle={cut_trickle}\n")
        import os; os.replace(state + ".tmp", state)
    time.sleep(0.05)
PY
}

# 200 slow sockets (trickling one header byte every 2 s, or silent) must not starve the
# port: /healthz answers every probe within 2 s while they hold their sockets, and each is
# cut at the whole-request deadline (5 s) though it keeps sending bytes (an idle timer that
# each byte resets never cut them: 40 such sockets failed 30 of 30 probes).
case_slow_clients_cannot_starve_healthz() {
  run_setup
  local port state=$T_TMP/slow.state
  port=$(free_port)
  start_worker M "$FIX/noop.lua" --concurrency 1 --metrics "127.0.0.1:$port" --poll-ms 20-50
  wait_for "/healthz" 30 eval "[[ \$(http_get $port /healthz | head -1) == 200 ]]"
  slow_clients "$port" 200 40 "$state" 2>"$T_TMP/slow.err" &
  local driver=$!
  t_on_exit t_kill "$driver"
  wait_for "200 slow sockets open" 20 grep -q '^open=200 ' "$state"
  local i ok=0 code
  for ((i = 0; i < 20; i++)); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/healthz" || true)
    [[ $code == 200 ]] && ok=$((ok + 1))
    sleep 0.25   # spread the probes over the slow clients' lives (not a wait for a condition)
  done
  assert_eq "/healthz probes answered" "$ok" 20
  # The trickling half keeps sending and must be cut anyway (reopened sockets count again).
  wait_for "slow sockets to be cut at the deadline" 20 \
    eval "(( \$(sed -n 's/.*cut_trickle=\([0-9]*\).*/\1/p' '$state') >= 100 ))"
  echo "# slow clients: $(<"$state")" >&2
  assert_eq "/metrics still answers" "$(metric "$port" leash_slots)" 1
  t_kill "$driver"
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

# Every task that goes dead is counted, by reason and the last execution's cause: leash.fatal,
# a retry with no attempt left (the commonest kind: it was missing before), and a lease the
# reaper found expired that quarantined its task; the script's version is exported as info.
case_dead_tasks_are_counted_by_reason_and_cause() {
  run_setup
  local port
  port=$(free_port)
  "$LEASH" enqueue '{"outcome":"fatal"}' >/dev/null
  "$LEASH" enqueue --max-attempts 1 '{"outcome":"error"}' >/dev/null
  local crashed
  crashed=$("$LEASH" enqueue --max-crashes 1 '{}')
  # A worker that died holding it: leased, its lease run out.
  q "update agent_work_queue set status = 'leased', lease_owner = 'gone', attempts = 1,
            locked_until = now() - interval '1 second' where id = $crashed" >/dev/null
  start_worker M "$FIX/record.lua" --concurrency 2 --metrics "127.0.0.1:$port" --poll-ms 20-50
  _dead() { metric "$port" "leash_tasks_dead_total{reason=\"$1\",cause=\"$2\"}"; }
  wait_for "three dead tasks on /metrics" 30 \
    eval '[[ $(_dead fatal returned) == 1 && $(_dead exhausted script_error) == 1 && $(_dead quarantined crash) == 1 ]]'
  assert_eq "rows by status and cause" \
    "$(q "select string_agg(status || ':' || last_cause, ',' order by id) from agent_work_queue")" \
    "dead:returned,dead:script_error,dead:quarantined"
  assert_eq "retried (pending again) counts none of them" "$(metric "$port" leash_tasks_retried_total)" 0
  local v
  v=$("$LEASH" check "$FIX/record.lua" | sed -E 's/.*\(version ([0-9a-f]+)\).*/\1/')
  assert_eq "script info" "$(metric "$port" "leash_script_info{version=\"$v\"}")" 1
  assert_eq "reloads so far" "$(metric "$port" 'leash_script_reloads_total{result="loaded"}')" 0
  kill -TERM "${W_PID[M]}"
  assert_worker_exit M 30 0
}

t_run "$@"
