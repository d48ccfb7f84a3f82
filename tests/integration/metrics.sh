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
  assert_eq "/livez" "$(http_get "$port" /livez | head -1)" 200
  assert_eq "unknown path" "$(http_get "$port" /nope | head -1)" 404
  # The database goes away: health says so, the process stays up.
  admin "alter database \"$TDB\" allow_connections false"
  t_on_exit admin "alter database \"$TDB\" allow_connections true"
  admin "select pg_terminate_backend(pid) from pg_stat_activity
          where datname = '$TDB' and application_name = 'leash lease'"
  wait_for "/healthz to report the database unreachable" 30 \
    eval "[[ \$(http_get $port /healthz | head -1) == 503 ]]"
  assert_eq "/livez does not depend on the database" "$(http_get "$port" /livez | head -1)" 200
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

# scrape PORT FILE: one /metrics scrape with curl into FILE.
scrape() { curl -sf --max-time 10 -o "$2" "http://127.0.0.1:$1/metrics" || fail "scrape of :$1 failed"; }
# value FILE NAME: a series' value in a scrape file ("" when absent).
value() { awk -v n="$2" '$1 == n { print $2 }' "$1"; }
# agg sum|max NAME FILE...: sum or max of a series over scrapes (absent ones left out; "" when
# in none).
agg() {
  local op=$1 name=$2
  shift 2
  local f
  for f in "$@"; do value "$f" "$name"; done | awk -v op="$op" '
    { v = $1 + 0; n++; s += v; if (n == 1 || v > m) m = v }
    END { if (n) print (op == "sum" ? s : m) }'
}

# The queue-wide gauges (leash_queue_depth, leash_queue_oldest_runnable_age_seconds,
# leash_budgets_paused) come from one process of the fleet, the metrics leader (an advisory
# lock on its lease connection), so sum() and max() over the pods are the table's numbers;
# when the leader dies another takes over.
case_queue_wide_gauges_are_exported_once_and_another_process_takes_over() {
  run_setup
  local p1 p2
  p1=$(free_port)
  p2=$(free_port)
  # 5 runnable (their batch paused, so no claim moves them), 3 scheduled, 1 paused budget.
  q "insert into agent_work_queue (tenant_id, shard_key, payload, batch, run_after)
     select 't', 'r' || g, '{}', 'held', now() - interval '30 seconds' from generate_series(1, 5) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, run_after)
     select 't', 's' || g, '{}', now() + interval '1 day' from generate_series(1, 3) g" >/dev/null
  expect_exit 0 "$LEASH" pause --batch held
  expect_exit 0 "$LEASH" budget set openai --rpm 100
  expect_exit 0 "$LEASH" budget pause openai --for 1h
  start_worker A "$FIX/noop.lua" --concurrency 1 --metrics "127.0.0.1:$p1" --poll-ms 20-50
  start_worker B "$FIX/noop.lua" --concurrency 1 --metrics "127.0.0.1:$p2" --poll-ms 20-50
  _leaders() {
    scrape "$p1" "$T_TMP/a.prom"
    scrape "$p2" "$T_TMP/b.prom"
    agg sum leash_metrics_leader "$T_TMP/a.prom" "$T_TMP/b.prom"
  }
  wait_for "one leader of two" 60 eval '[[ $(_leaders) == 1 ]]'
  local f=("$T_TMP/a.prom" "$T_TMP/b.prom") state want op
  for state in runnable scheduled leased; do
    want=$(q "select count(*) from agent_work_queue where status in ('pending', 'leased')
              and case '$state' when 'runnable' then status = 'pending' and run_after <= now()
                                when 'scheduled' then status = 'pending' and run_after > now()
                                else status = 'leased' end")
    for op in sum max; do
      assert_eq "$op of $state over both pods = SQL" \
        "$(agg "$op" "leash_queue_depth{state=\"$state\"}" "${f[@]}")" "$want"
    done
  done
  assert_eq "runnable: 5" "$(agg sum 'leash_queue_depth{state="runnable"}' "${f[@]}")" 5
  assert_eq "budgets paused, sum" "$(agg sum leash_budgets_paused "${f[@]}")" 1
  assert_eq "budgets paused, max" "$(agg max leash_budgets_paused "${f[@]}")" 1
  # The oldest runnable waited 30 s at insert; the leader samples every 10 s.
  local age sql_age
  age=$(agg sum leash_queue_oldest_runnable_age_seconds "${f[@]}")
  sql_age=$(q "select extract(epoch from now() - min(run_after)) from agent_work_queue
               where status = 'pending' and run_after <= now()")
  python3 -c "import sys; a, s = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if s - 15 <= a <= s + 1 and a >= 29 else 1)" \
    "$age" "$sql_age" || fail "oldest runnable age $age, SQL says $sql_age"
  local series
  series=$(grep -c '^leash_queue_depth{' "$T_TMP/a.prom" "$T_TMP/b.prom" | awk -F: '{ print $2 }' | sort | tr '\n' ' ')
  assert_eq "one pod exports the depth, the other not at all" "$series" "0 3 "

  # The leader dies (SIGKILL: its connection, and the lock, go at once); the other takes over.
  local leader other op_port
  if [[ $(value "$T_TMP/a.prom" leash_metrics_leader) == 1 ]]; then leader=A other=B op_port=$p2
  else leader=B other=A op_port=$p1; fi
  kill -KILL "${W_PID[$leader]}"
  _took_over() {
    scrape "$op_port" "$T_TMP/o.prom"
    [[ $(value "$T_TMP/o.prom" leash_metrics_leader) == 1 ]]
  }
  wait_for "worker $other to take the queue-wide gauges over" 60 _took_over
  assert_eq "the new leader's runnable = SQL" "$(value "$T_TMP/o.prom" 'leash_queue_depth{state="runnable"}')" 5
  assert_eq "the new leader's scheduled = SQL" "$(value "$T_TMP/o.prom" 'leash_queue_depth{state="scheduled"}')" 3
  kill -TERM "${W_PID[$other]}"
  assert_worker_exit "$other" 30 0
}

# Responses of leash.http.request by class and budget, the process metrics from /proc, the
# renamed cycle histogram (and its deprecated old name), and promtool's lint of a real scrape.
case_http_responses_process_metrics_and_a_scrape_promtool_accepts() {
  run_setup
  local port
  port=$(free_port)
  python3 "$LEASH_SRC/tests/fixtures/api/http_server.py" --idle 120 >"$T_TMP/http.port" 2>"$T_TMP/http.err" &
  t_on_exit t_kill "$!"
  wait_for "the HTTP server's port" 20 test -s "$T_TMP/http.port"
  local hp closed
  hp=$(<"$T_TMP/http.port")
  closed=$(free_port)
  cat >"$T_TMP/calls.lua" <<'LUA'
local leash = require "leash"
return function(task)
  for _, url in ipairs(task.payload.urls) do
    pcall(leash.http.request, { url = url, budget = task.payload.budget, timeout = 5 })
  end
end
LUA
  local b="http://127.0.0.1:$hp/status"
  expect_exit 0 "$LEASH" budget set api --rpm 1000
  "$LEASH" enqueue "{\"urls\":[\"$b/200\",\"$b/204\",\"$b/302\",\"$b/404\",\"$b/429\",\"$b/500\",\"$b/503\",\"http://127.0.0.1:$closed/\"]}" >/dev/null
  "$LEASH" enqueue "{\"budget\":\"api\",\"urls\":[\"$b/200\",\"$b/201\",\"$b/404\"]}" >/dev/null
  local started
  started=$(date +%s)
  start_worker M "$T_TMP/calls.lua" --concurrency 1 --metrics "127.0.0.1:$port" --poll-ms 20-50
  wait_for "two tasks done" 30 eval "[[ \$(metric $port leash_tasks_done_total) == 2 ]]"
  scrape "$port" "$T_TMP/m.prom"
  local cls want
  for cls in 2xx:2 3xx:1 4xx:1 429:1 5xx:2 error:1; do
    assert_eq "no budget, ${cls%%:*}" "$(value "$T_TMP/m.prom" "leash_http_responses_total{class=\"${cls%%:*}\",budget=\"\"}")" "${cls#*:}"
  done
  assert_eq "budget api, 2xx" "$(value "$T_TMP/m.prom" 'leash_http_responses_total{class="2xx",budget="api"}')" 2
  assert_eq "budget api, 4xx" "$(value "$T_TMP/m.prom" 'leash_http_responses_total{class="4xx",budget="api"}')" 1
  # Process metrics against /proc and the clock.
  local pid=${W_PID[M]} v
  v=$(value "$T_TMP/m.prom" process_start_time_seconds)
  python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) <= 5 else 1)" "$v" "$started" \
    || fail "process_start_time_seconds $v, started at $started"
  v=$(value "$T_TMP/m.prom" process_open_fds)
  local fds
  fds=$(ls "/proc/$pid/fd" | wc -l)
  ((v > 3 && v <= fds + 5 && v >= fds - 5)) || fail "process_open_fds $v, /proc says $fds"
  v=$(value "$T_TMP/m.prom" process_resident_memory_bytes)
  local rss
  rss=$(awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$pid/status")
  python3 -c "import sys; v, r = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if 0.5 * r <= v <= 2 * r else 1)" "$v" "$rss" \
    || fail "process_resident_memory_bytes $v, VmRSS $rss"
  v=$(value "$T_TMP/m.prom" process_cpu_seconds_total)
  [[ -n $v ]] || fail "no process_cpu_seconds_total"
  # The cycle histogram under its name, and the old one while it is deprecated.
  assert_eq "cycle histogram" "$(value "$T_TMP/m.prom" leash_cycle_duration_seconds_count)" \
    "$(value "$T_TMP/m.prom" leash_claim_duration_seconds_count)"
  assert_contains "old name says deprecated" "$(<"$T_TMP/m.prom")" "# HELP leash_claim_duration_seconds DEPRECATED"
  if command -v promtool >/dev/null; then
    promtool check metrics <"$T_TMP/m.prom" >"$T_TMP/lint" 2>&1 || fail "promtool check metrics: $(<"$T_TMP/lint")"
    echo "# promtool check metrics: ok ($(wc -l <"$T_TMP/m.prom") lines)" >&2
  else
    echo "# no promtool (Debian package prometheus): check metrics skipped" >&2
  fi
  kill -TERM "$pid"
  assert_worker_exit M 30 0
}

t_run "$@"
