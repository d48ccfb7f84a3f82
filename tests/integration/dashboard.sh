#!/usr/bin/env bash
# `leash dashboard`: the web dashboard, without a browser (HTTP through python3's urllib) and
# in headless Chromium driven over the DevTools protocol (dashboard_browser.py).
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/run_common.sh"

# Debian's python3 (python3-websocket is installed for it, not for another python on PATH).
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
BROWSER_PY=$LEASH_SRC/tests/integration/dashboard_browser.py
TOKEN=dashboard-test-token-0123456789abcdef

# http METHOD URL [BODY [HEADER]]: prints the status on the first line, then the body.
http() {
  "$PY" - "$@" <<'PY'
import sys, urllib.request, urllib.error
method, url = sys.argv[1], sys.argv[2]
body = sys.argv[3].encode() if len(sys.argv) > 3 and method != "GET" else None
req = urllib.request.Request(url, data=body, method=method)
if body is not None:
    req.add_header("Content-Type", "application/x-www-form-urlencoded")
if len(sys.argv) > 4:
    k, v = sys.argv[4].split(": ", 1)
    req.add_header(k, v)
try:
    r = urllib.request.urlopen(req, timeout=30)
    status, text = r.status, r.read()
except urllib.error.HTTPError as e:
    status, text = e.code, e.read()
print(status)
sys.stdout.write(text.decode())
PY
}

# http_status METHOD URL [BODY [HEADER]]: the status only.
http_status() {
  local out
  out=$(http "$@")
  echo "${out%%$'\n'*}"
}

# The task script: sleeps payload.sleep seconds, then dies with payload.die if given.
write_script() {
  cat >"$T_TMP/batch.lua" <<'LUA'
local leash = require "leash"
return function(task)
  local p = task.payload
  if p.sleep then leash.sleep(p.sleep) end
  if p.die then return leash.fatal(p.die) end
  return leash.ok({ id = task.id })
end
LUA
}

# start_dashboard PORT [OPTIONS...]: in the background, log in $T_TMP/dashboard.log; waits
# until it answers.
start_dashboard() {
  local port=$1
  shift
  "$LEASH" dashboard --listen "127.0.0.1:$port" "$@" >"$T_TMP/dashboard.out" \
    2>"$T_TMP/dashboard.log" &
  DASH_PID=$!
  t_on_exit t_kill "$DASH_PID"
  wait_for "the dashboard to answer" 60 eval "[[ \$(http_status GET http://127.0.0.1:$port/api/overview) == 200 ]]"
}

# stop_dashboard: one TERM to its pid; it must exit 0 (under ASan: with no leak reported).
stop_dashboard() {
  kill -TERM "$DASH_PID"
  wait_for "the dashboard to exit" 60 exited "$DASH_PID"
  local rc=0
  wait "$DASH_PID" || rc=$?
  assert_eq "the dashboard's exit status after TERM" "$rc" 0
}

token_file() {
  printf '%s\n' "$TOKEN" >"$T_TMP/token"
  chmod 600 "$T_TMP/token"
}

case_actions_need_the_token_and_a_missing_or_wrong_one_changes_nothing() {
  run_setup
  token_file
  local port out
  port=$(free_port)
  "$LEASH" enqueue --batch b1 '{"die":"x"}' >/dev/null
  q "update agent_work_queue set status = 'dead', last_cause = 'returned'" >/dev/null
  start_dashboard "$port" --token-file "$T_TMP/token"
  local u="http://127.0.0.1:$port/api"
  # Every action, without a token (401) and with wrong ones (403): nothing changes.
  for action in requeue cancel pause resume; do
    out=$(http POST "$u/$action" "id=1&batch=b1")
    assert_eq "$action without a token" "$(head -1 <<<"$out")" 401
    for wrong in "${TOKEN}x" "${TOKEN:0:20}" "$(tr a-z A-Z <<<"$TOKEN")" "Bearer $TOKEN"; do
      out=$(http POST "$u/$action" "batch=b1" "Authorization: Bearer $wrong")
      assert_eq "$action with a wrong header token" "$(head -1 <<<"$out")" 403
      out=$(http POST "$u/$action" "batch=b1&token=$wrong")
      assert_eq "$action with a wrong form token" "$(head -1 <<<"$out")" 403
    done
  done
  # A token in the query string is not taken (URLs end up in logs).
  out=$(http POST "$u/requeue?token=$TOKEN" "id=1")
  assert_eq "token in the query string" "$(head -1 <<<"$out")" 401
  assert_eq "status after refused actions" "$(q "select status from agent_work_queue")" dead
  assert_eq "holds after refused actions" "$(q "select count(*) from agent_work_queue_holds")" 0
  # GET cannot act.
  assert_eq "GET of an action" "$(http_status GET "$u/requeue?id=1")" 404
  # The right token, as a header and as a form field.
  out=$(http POST "$u/requeue" "id=1" "Authorization: Bearer $TOKEN")
  assert_eq "requeue with the token" "$(head -1 <<<"$out")" 200
  assert_eq "status after requeue" "$(q "select status from agent_work_queue")" pending
  out=$(http POST "$u/pause" "batch=b1&token=$TOKEN")
  assert_eq "pause with the form token" "$(head -1 <<<"$out")" 200
  assert_eq "hold after pause" "$(q "select kind || ':' || scope from agent_work_queue_holds")" batch:b1
  out=$(http POST "$u/resume" "batch=b1&token=$TOKEN")
  assert_eq "resume" "$(head -1 <<<"$out")" 200
  assert_eq "holds after resume" "$(q "select count(*) from agent_work_queue_holds where until is null or until > now()")" 0
  out=$(http POST "$u/cancel" "id=1&token=$TOKEN")
  assert_eq "cancel" "$(head -1 <<<"$out")" 200
  assert_eq "status after cancel" "$(q "select status || ' ' || last_cause from agent_work_queue")" "dead cancelled"
  # The page's own pause form names the kind and the scope.
  out=$(http POST "$u/pause" "kind=tenant&scope=acme&for=10m&token=$TOKEN")
  assert_eq "pause by kind and scope" "$(head -1 <<<"$out")" 200
  assert_eq "tenant hold" "$(q "select kind || ':' || scope from agent_work_queue_holds where kind = 'tenant'")" tenant:acme
  # Bad fields: 400, nothing changed.
  out=$(http POST "$u/pause" "kind=table&scope=acme&token=$TOKEN")
  assert_eq "an unknown kind" "$(head -1 <<<"$out")" 400
  out=$(http POST "$u/pause" "kind=tenant&scope=acme&batch=b1&token=$TOKEN")
  assert_eq "two scopes" "$(head -1 <<<"$out")" 400
  out=$(http POST "$u/requeue" "id=abc&token=$TOKEN")
  assert_eq "bad id" "$(head -1 <<<"$out")" 400
  out=$(http POST "$u/pause" "token=$TOKEN")
  assert_eq "pause without a scope" "$(head -1 <<<"$out")" 400
  out=$(http POST "$u/pause" "batch=b1&for=soon&token=$TOKEN")
  assert_eq "bad duration" "$(head -1 <<<"$out")" 400
  assert_eq "unknown action" "$(http_status POST "$u/drop" "token=$TOKEN")" 404
  # The token never reaches the log.
  stop_dashboard
  assert_not_contains "dashboard log" "$(cat "$T_TMP/dashboard.log")" "$TOKEN"
  # Without --token-file every action is off, even on loopback.
  start_dashboard "$port"
  out=$(http POST "$u/requeue" "id=1&token=$TOKEN")
  assert_eq "action without a configured token" "$(head -1 <<<"$out")" 403
  assert_contains "why" "$out" "--token-file"
}

case_on_loopback_a_request_naming_another_host_is_refused() {
  run_setup
  token_file
  local port
  port=$(free_port)
  "$LEASH" enqueue --batch b1 '{}' >/dev/null
  q "update agent_work_queue set status = 'dead', last_cause = 'returned'" >/dev/null
  start_dashboard "$port" --token-file "$T_TMP/token"
  local u="http://127.0.0.1:$port/api"
  # On loopback, a Host that is not this machine (DNS rebinding) is refused, reads too.
  local h
  for h in evil.example evil.example:$port 127.0.0.1.evil.example "[::2]:$port"; do
    assert_eq "GET with Host $h" "$(http_status GET "$u/overview" "" "Host: $h")" 403
    assert_eq "POST with Host $h" "$(http_status POST "$u/requeue" "id=1&token=$TOKEN" "Host: $h")" 403
  done
  for h in "localhost:$port" "127.0.0.1:$port" LOCALHOST; do
    assert_eq "GET with Host $h" "$(http_status GET "$u/overview" "" "Host: $h")" 200
  done
  assert_eq "status after refused hosts" "$(q "select status from agent_work_queue")" dead
  stop_dashboard
}

case_reload_every_n_seconds_is_a_meta_refresh_and_bad_values_are_refused() {
  run_setup
  local port page v
  port=$(free_port)
  "$LEASH" enqueue --batch b1 '{}' >/dev/null
  start_dashboard "$port"
  page=$(http GET "http://127.0.0.1:$port/")
  assert_not_contains "no reload by default" "$page" "http-equiv=refresh"
  assert_contains "a link to reload" "$page" 'href="/?refresh=10&amp;batch=b1"'
  page=$(http GET "http://127.0.0.1:$port/?batch=b1&refresh=10")
  assert_contains "reload every 10 s" "$page" "<meta http-equiv=refresh content=10>"
  assert_contains "a link to stop" "$page" 'href="/?batch=b1"'
  for v in 0 1 3601 abc -5 10s 2.5 ""; do
    assert_eq "refresh=$v" "$(http_status GET "http://127.0.0.1:$port/?refresh=$v")" 400
  done
  stop_dashboard
}

case_a_locked_table_or_a_lost_connection_is_a_503_and_the_dashboard_recovers() {
  run_setup
  local port out
  port=$(free_port)
  "$LEASH" enqueue --batch b1 '{}' >/dev/null
  start_dashboard "$port"
  local u="http://127.0.0.1:$port/api/overview"
  # A session holding the table: the read ends by the statement_timeout (5 s), not the lock.
  PGAPPNAME=dash-locker psql -X -q -d "$DATABASE_URL" -c \
    "begin; lock table agent_work_queue in access exclusive mode; select pg_sleep(120); commit" \
    >/dev/null 2>&1 &
  t_on_exit t_kill "$!"
  wait_for "the lock to be held" 30 q_true "select count(*) = 1 from pg_stat_activity
    where application_name = 'dash-locker' and state = 'active' and wait_event = 'PgSleep'"
  out=$(http GET "$u")
  assert_eq "overview while the table is locked" "${out%%$'\n'*}" 503
  assert_contains "why" "$out" "statement timeout"
  q "select pg_terminate_backend(pid) from pg_stat_activity
       where datname = current_database() and application_name = 'dash-locker'" >/dev/null
  wait_for "the overview to answer again" 60 eval "[[ \$(http_status GET $u) == 200 ]]"
  # Its own connection cut: a 503 at most once, then it reconnects by itself ...
  q "select pg_terminate_backend(pid) from pg_stat_activity
       where datname = current_database() and application_name = 'leash dashboard'" >/dev/null
  wait_for "the overview after a reconnect" 60 eval "[[ \$(http_status GET $u) == 200 ]]"
  # ... with its statement_timeout set again.
  PGAPPNAME=dash-locker psql -X -q -d "$DATABASE_URL" -c \
    "begin; lock table agent_work_queue in access exclusive mode; select pg_sleep(120); commit" \
    >/dev/null 2>&1 &
  t_on_exit t_kill "$!"
  wait_for "the lock to be held again" 30 q_true "select count(*) = 1 from pg_stat_activity
    where application_name = 'dash-locker' and state = 'active' and wait_event = 'PgSleep'"
  assert_eq "overview while locked, after the reconnect" "$(http_status GET "$u")" 503
  q "select pg_terminate_backend(pid) from pg_stat_activity
       where datname = current_database() and application_name = 'dash-locker'" >/dev/null
  stop_dashboard
}

case_a_non_loopback_address_without_a_token_is_refused_at_start_with_one_line() {
  token_file
  local addr
  for addr in 0.0.0.0:8089 :8089 "[::]:8089" 192.0.2.1:8089; do
    expect_exit 2 "$LEASH" dashboard --listen "$addr"
    assert_eq "stderr lines for $addr" "$(wc -l <"$T_ERR")" 1
    assert_contains "error for $addr" "$(cat "$T_ERR")" "not a loopback address: give --token-file"
  done
  expect_exit 2 env LEASH_LISTEN=0.0.0.0:8089 "$LEASH" dashboard
  assert_contains "from the environment" "$(cat "$T_ERR")" "not a loopback address"
  # Bad token files: one line naming the file, the token never echoed.
  printf 'short\n' >"$T_TMP/short"
  printf '\n%s\n' "$TOKEN" >"$T_TMP/first-line-empty"
  printf 'abc\0def-0123456789abcdef\n' >"$T_TMP/nul"
  local f
  for f in short first-line-empty nul missing; do
    expect_exit 2 "$LEASH" dashboard --listen 0.0.0.0:8089 --token-file "$T_TMP/$f"
    assert_eq "stderr lines for token file $f" "$(wc -l <"$T_ERR")" 1
    assert_contains "error for token file $f" "$(cat "$T_ERR")" "$T_TMP/$f"
    assert_not_contains "token file $f echoed" "$(cat "$T_ERR")" "def-0123"
  done
}

case_bad_listen_addresses_are_refused_with_one_line() {
  local addr
  for addr in nope 127.0.0.1 127.0.0.1:0 127.0.0.1:65536 127.0.0.1:http "[zz]:80" \
              "127.0.0.1:-1" "no.such.host.invalid:8089"; do
    expect_exit 2 "$LEASH" dashboard --listen "$addr"
    assert_contains "error for $addr" "$(head -1 "$T_ERR")" "leash dashboard: --listen"
    assert_eq "stdout for $addr" "$(cat "$T_OUT")" ""
  done
}

case_hostile_values_are_escaped_in_every_page() {
  run_setup
  token_file
  local port page id hostile
  port=$(free_port)
  # Classes of hostile text: a tag, an attribute break, a quote break, entities.
  local -a values=('<script>alert(1)</script>' '"><img src=x onerror=alert(2)>'
                   "'><svg onload=alert(3)>" '&lt;b&gt; & </pre></td>')
  local i=0 v
  for v in "${values[@]}"; do
    "$PY" -c 'import json,sys; v=sys.argv[1]; print(json.dumps({"payload":{"note":v},
      "tenant_id":v,"batch":"b"+v,"shard_key":v}))' "$v" | "$LEASH" enqueue --file - >/dev/null
    i=$((i + 1))
  done
  q "update agent_work_queue set status = 'dead', last_cause = 'returned',
       last_error = payload->>'note', finished_at = now(), lease_owner = payload->>'note'" >/dev/null
  q "update agent_work_queue set status = 'leased', lease_token = 1, locked_until = now() + interval '1 hour'
      where id = 1" >/dev/null
  q "insert into agent_work_queue_holds (kind, scope, source, reason)
     select 'tenant', payload->>'note', 'pause', payload->>'note' from agent_work_queue" >/dev/null
  q "insert into agent_work_queue_attempts (task_id, lease_token, attempt, worker, label, kind,
       cause, status, error)
     select id, 1, 1, payload->>'note', payload->>'note', 'dead', payload->>'note', 'dead',
            payload->>'note' from agent_work_queue" >/dev/null
  q "insert into agent_work_queue_canaries (script, script_name, version, label, share,
       min_tasks, max_fail_delta, max_retry_delta, auto_promote, state, decision)
     select 'x', payload->>'note', repeat('ab', 32), payload->>'note', 10, 5, 0.1, 0.1, false,
            'aborted', jsonb_build_object('verdict', payload->>'note', 'reason', payload->>'note')
       from agent_work_queue" >/dev/null
  q "insert into agent_work_queue_usage (task_id, batch, budget, model, input_tokens,
       output_tokens, tokens, cost)
     select id, batch, payload->>'note', payload->>'note', 1, 2, 3, 0.5 from agent_work_queue" >/dev/null
  start_dashboard "$port" --token-file "$T_TMP/token"
  local -a pages=("/")
  for id in $(q "select id from agent_work_queue order by id"); do
    pages+=("/task?id=$id" "/?batch=$(q "select batch from agent_work_queue where id = $id" |
                                      "$PY" -c 'import sys,urllib.parse; print(urllib.parse.quote(sys.stdin.read().strip()))')")
  done
  pages+=("/api/resume")   # the result page of an action (html=1) echoes the scope too
  local p
  for p in "${pages[@]}"; do
    if [[ $p == /api/* ]]; then
      page=$(http POST "http://127.0.0.1:$port$p" "html=1&batch=$(
        "$PY" -c 'import urllib.parse,sys; print(urllib.parse.quote(sys.argv[1]))' "${values[0]}")&token=$TOKEN&back=$(
        "$PY" -c 'import urllib.parse,sys; print(urllib.parse.quote(sys.argv[1]))' "/\"><script>x</script>")")
    else
      page=$(http GET "http://127.0.0.1:$port$p")
    fi
    assert_eq "status of $p" "$(head -1 <<<"$page")" 200
    for v in "${values[@]}"; do
      assert_not_contains "raw hostile value in $p" "$page" "$v"
    done
    assert_not_contains "a script tag in $p" "$page" "<script"
    assert_not_contains "an onerror attribute in $p" "$page" "<img"
    assert_not_contains "an svg from a value in $p" "$page" "<svg onload"
  done
  page=$(http GET "http://127.0.0.1:$port/task?id=1")
  assert_contains "escaped tag on a task page" "$page" "&lt;script&gt;alert(1)&lt;/script&gt;"
  page=$(http GET "http://127.0.0.1:$port/task?id=2")
  assert_contains "escaped quote on a task page" "$page" "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;"
  page=$(http GET "http://127.0.0.1:$port/")
  assert_contains "escaped hold reason" "$page" "&#39;&gt;&lt;svg onload=alert(3)&gt;"
  page=$(http GET "http://127.0.0.1:$port/?batch=b%3Cscript%3Ealert(1)%3C%2Fscript%3E")
  assert_contains "escaped budget in the usage table" "$page" "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>"
  # The JSON has the values as they are (JSON-escaped by the database, not HTML-escaped).
  page=$(http GET "http://127.0.0.1:$port/api/task?id=1")
  assert_eq "task JSON keeps the value" "$(tail -n +2 <<<"$page" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["task"]["last_error"])')" "${values[0]}"
  # No script runs and nothing is fetched elsewhere: the policy header says so.
  "$PY" - "http://127.0.0.1:$port/" >"$T_TMP/csp" <<'PY'
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=30).headers["Content-Security-Policy"])
PY
  assert_contains "content security policy" "$(cat "$T_TMP/csp")" "default-src 'none'"
  stop_dashboard
}

# overview_check PORT [QUERY]: every listed batch's counts in /api/overview equal SQL's, and
# the list is the open batches and the 10 newest; prints the JSON (in $T_TMP/overview.json).
overview_check() {
  local port=$1 query=${2:-}
  http GET "http://127.0.0.1:$port/api/overview$query" | tail -n +2 >"$T_TMP/overview.json"
  "$PY" - "$T_TMP/overview.json" >"$T_TMP/shown.txt" <<'PY' || fail "overview: $(cat "$T_TMP/overview.json")"
import json, sys
for b in json.load(open(sys.argv[1]))["batches"]:
    print(b["batch"], b["total"], b["pending"], b["leased"], b["done"], b["dead"])
PY
  q "select batch, count(*), count(*) filter (where status = 'pending'),
            count(*) filter (where status = 'leased'), count(*) filter (where status = 'done'),
            count(*) filter (where status = 'dead')
       from agent_work_queue where batch in (
         select batch from (select batch, max(id) m from agent_work_queue where batch is not null
                             group by batch order by m desc limit 10) n
         union select batch from agent_work_queue where status in ('pending', 'leased'))
      group by batch order by max(id) desc" | tr '|' ' ' >"$T_TMP/sql.txt"
  assert_eq "batches and counts shown${query:+ for $query} against SQL" "$(cat "$T_TMP/shown.txt")" "$(cat "$T_TMP/sql.txt")"
}

# report_kept PORT QUERY: overview_check, and true when the batch shown had its kept report.
report_kept() {
  overview_check "$1" "$2"
  [[ $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["report"]["kept"])' "$T_TMP/overview.json") == True ]]
}

case_batch_counts_stay_equal_to_sql_through_enqueues_requeues_and_prunes() {
  run_setup
  write_script
  local port i
  port=$(free_port)
  # One batch (opened again below), then 12 finished of 3 to 14 tasks, every third task
  # dead: the open one is older than the 10 newest and listed too.
  "$LEASH" enqueue --batch open1 '{}' >/dev/null
  for ((i = 1; i <= 12; i++)); do
    "$PY" -c 'import json,sys; n=int(sys.argv[1])
for k in range(n): print(json.dumps({"payload": {"die": "no"} if k % 3 == 0 else {}, "batch": sys.argv[2]}))' \
      $((i + 2)) "b$i" | "$LEASH" enqueue --file - >/dev/null
  done
  expect_exit 0 "$LEASH" run "$T_TMP/batch.lua" --until-empty --concurrency 4
  q "update agent_work_queue set status = 'pending', run_after = now() + interval '1 hour'
      where batch = 'open1'" >/dev/null
  # The totals the triggers keep: the table's own counts, per batch.
  assert_eq "kept totals" "$(q "select batch || ':' || sum(total) from agent_work_queue_batch_totals group by batch order by batch")" \
    "$(q "select batch || ':' || count(*) from agent_work_queue where batch is not null group by batch order by batch")"
  start_dashboard "$port"
  overview_check "$port"
  assert_eq "batches listed" "$(wc -l <"$T_TMP/shown.txt")" 11
  assert_not_contains "the oldest batches are not listed" "$(cut -d' ' -f1 "$T_TMP/shown.txt")" "b2"
  # The finished batches' reports are kept now, and used: the second look says so.
  assert_eq "reports kept" "$(q "select count(*) from agent_work_queue_batch_reports")" 10
  # (Kept reports hold once their batch's last attempt is 5 s old: see dashboard_data.c.)
  wait_for "b5's report to be the kept one" 60 report_kept "$port" "?batch=b5"
  # A batch that does not exist is shown empty, and nothing is kept for it.
  assert_eq "a look at no batch" "$(http_status GET "http://127.0.0.1:$port/api/overview?batch=no-such-batch")" 200
  assert_eq "reports kept after a look at no batch" "$(q "select count(*) from agent_work_queue_batch_reports where batch = 'no-such-batch'")" 0
  # A requeue of b5's dead and a new run: the kept report no longer holds (new attempts).
  expect_exit 0 "$LEASH" requeue --dead --batch b5
  q "update agent_work_queue set payload = '{}' where batch = 'b5'" >/dev/null
  expect_exit 0 "$LEASH" run "$T_TMP/batch.lua" --until-empty --concurrency 2 --batch b5
  overview_check "$port" "?batch=b5"
  assert_eq "b5 dead after the requeue" "$(grep '^b5 ' "$T_TMP/shown.txt" | cut -d' ' -f6)" 0
  # A prune (rows deleted): the totals follow, and so do the counts.
  q "delete from agent_work_queue where batch = 'b7' and status = 'dead'" >/dev/null
  overview_check "$port" "?batch=b7"
  assert_eq "b7 after the delete" "$(grep '^b7 ' "$T_TMP/shown.txt" | cut -d' ' -f2,6)" "6 0"
  # A batch deleted whole leaves no total behind.
  q "delete from agent_work_queue where batch = 'b12'" >/dev/null
  assert_eq "b12's totals" "$(q "select count(*) from agent_work_queue_batch_totals where batch = 'b12'")" 0
  overview_check "$port"
  # Four processes enqueueing into one batch at once: no count lost.
  for i in 1 2 3 4; do
    "$PY" -c 'import json
for k in range(300): print(json.dumps({"payload": {}, "batch": "par"}))' >"$T_TMP/par$i.jsonl"
  done
  local pids=()
  for i in 1 2 3 4; do
    "$LEASH" enqueue --file - <"$T_TMP/par$i.jsonl" >/dev/null &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || fail "a parallel enqueue failed"; done
  assert_eq "par's total" "$(q "select sum(total) from agent_work_queue_batch_totals where batch = 'par'")" 1200
  overview_check "$port"
  stop_dashboard
}

# live_check PORT BATCH: the running batch's page (/api/overview?batch=B) against SQL: its
# counts and total exact (in the report and in the list), its dead reasons (every dead row
# read: fewer than the page's limit), its durations those of its done attempts (fewer than
# the sample's limit: all of them), and the HTML says which numbers are a sample.
live_check() {
  local port=$1 batch=$2 what=$3
  overview_check "$port" "?batch=$batch"
  "$PY" - "$T_TMP/overview.json" >"$T_TMP/live.txt" <<'PY' || fail "live report: $(cat "$T_TMP/overview.json")"
import json, sys
r = json.load(open(sys.argv[1]))["report"]
k = r["counts"]
print(r["total"], k["pending"], k["leased"], k["done"], k["dead"], r["settled"])
print(";".join(f'{e["count"]} {e["reason"]} {e["example_ids"][0]}' for e in r["dead_reasons"]))
d = r["duration_s"]
print(d["count"], *("None" if d[k] is None else f"{d[k]:.6f}" for k in ("p50", "p95", "max")))
print(sorted(r["live"]))
PY
  local b="batch = '$batch'" d="kind = 'done' and task_id in (select id from agent_work_queue where batch = '$batch')"
  local run="greatest(extract(epoch from finished_at - coalesce(run_started_at, claimed_at)), 0)::float8"
  assert_eq "$what: the live report against SQL" "$(cat "$T_TMP/live.txt")" "$(q "
    select count(*) || ' ' || count(*) filter (where status = 'pending') || ' ' ||
           count(*) filter (where status = 'leased') || ' ' || count(*) filter (where status = 'done')
           || ' ' || count(*) filter (where status = 'dead') || ' False' from agent_work_queue where $b")
$(q "select coalesce(string_agg(n || ' ' || r || ' ' || i, ';' order by n desc, r), '') from (
       select coalesce(nullif(left(split_part(last_error, E'\n', 1), 200), ''), '(no message)') r,
              count(*) n, min(id) i from agent_work_queue where $b and status = 'dead' group by 1
        order by 2 desc, 1 limit 5) x")
$(q "select count(*) || ' ' || coalesce(round((percentile_disc(0.5) within group (order by $run))::numeric, 6)::text, 'None')
           || ' ' || coalesce(round((percentile_disc(0.95) within group (order by $run))::numeric, 6)::text, 'None')
           || ' ' || coalesce(round(max($run)::numeric, 6)::text, 'None') from agent_work_queue_attempts where $d")
['attempts_limit', 'attempts_read', 'dead_limit', 'dead_read', 'scan_limit']"
  http GET "http://127.0.0.1:$port/?batch=$batch" >"$T_TMP/live.html"
  assert_contains "$what: the page says what is a sample" "$(cat "$T_TMP/live.html")" "id=live-note>Running: the counts are exact"
}

case_a_running_batchs_numbers_equal_sql_as_tasks_settle_and_after_a_requeue_and_a_change_by_hand() {
  run_setup
  write_script
  local port
  port=$(free_port)
  # One batch over three tenants, every fifth task dead with one of two reasons: drained a
  # tenant at a time, so it runs still (tc pending) while it is looked at.
  "$PY" -c 'import json
for i in range(500):
    p = {"die": "quota" if i % 10 == 0 else "bad input"} if i % 5 == 0 else {}
    print(json.dumps({"payload": p, "batch": "live", "tenant_id": "ta" if i < 250 else "tb" if i < 450 else "tc"}))' \
    >"$T_TMP/live.jsonl"
  enqueue_file "$T_TMP/live.jsonl" 500
  start_dashboard "$port"
  live_check "$port" live "nothing run yet"
  expect_exit 0 "$LEASH" run "$T_TMP/batch.lua" --until-empty --concurrency 4 --tenant ta
  live_check "$port" live "tenant ta settled"
  expect_exit 0 "$LEASH" run "$T_TMP/batch.lua" --until-empty --concurrency 4 --tenant tb
  live_check "$port" live "tenants ta and tb settled"
  # A requeue of its dead (no attempt written): the counts follow at once.
  expect_exit 0 "$LEASH" requeue --dead --batch live --tenant ta
  live_check "$port" live "ta's dead requeued"
  # Changes by hand, none through leash: done rows made pending and dead, pending made done.
  q "update agent_work_queue set status = 'pending', run_after = now() + interval '1 hour'
      where id in (select id from agent_work_queue where batch = 'live' and tenant_id = 'tb'
                     and status = 'done' order by id limit 7);
     update agent_work_queue set status = 'dead', last_error = 'made dead by hand'
      where id in (select id from agent_work_queue where batch = 'live' and tenant_id = 'tb'
                     and status = 'done' order by id limit 3);
     update agent_work_queue set status = 'done', finished_at = now()
      where id in (select id from agent_work_queue where batch = 'live' and tenant_id = 'tc'
                     order by id limit 11)" >/dev/null
  live_check "$port" live "after changes by hand"
  # A row added to it and one deleted: the total follows.
  "$LEASH" enqueue --batch live --tenant tc '{}' >/dev/null
  q "delete from agent_work_queue where id = (select min(id) from agent_work_queue where batch = 'live' and tenant_id = 'tb' and status = 'done')" >/dev/null
  live_check "$port" live "after an enqueue and a delete"
  # Rows moved into a batch by hand (UPDATE ... SET batch: its total does not follow): the
  # live counts cannot hold (more open rows than its total), so it is counted by a pass.
  q "update agent_work_queue set batch = 'moved'
      where id in (select id from agent_work_queue where batch = 'live' and tenant_id = 'tc'
                     and status = 'pending' order by id limit 4)" >/dev/null
  http GET "http://127.0.0.1:$port/api/overview?batch=moved" | tail -n +2 >"$T_TMP/moved.json"
  assert_eq "a batch of rows moved by hand, counted" "$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]))
r=d["report"]; k=r["counts"]; b=[x for x in d["batches"] if x["batch"] == "moved"][0]
print(r["total"], k["pending"], k["done"], "live" in r, b["total"], b["pending"], b["done"])' "$T_TMP/moved.json")" "4 4 0 False 4 4 0"
  http GET "http://127.0.0.1:$port/api/overview?batch=live" | tail -n +2 >"$T_TMP/moved.json"
  assert_eq "the same batch listed beside another" "$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]))
b=[x for x in d["batches"] if x["batch"] == "moved"][0]
print(b["total"], b["pending"], b["leased"], b["done"], b["dead"])' "$T_TMP/moved.json")" "4 4 0 0 0"
  stop_dashboard
}

# queue_reads: the queue table's rows read so far by sequential scans and fetched through
# indexes (pg_stat_user_tables, as the server has them).
queue_reads() {
  q "select seq_tup_read + coalesce(idx_tup_fetch, 0) from pg_stat_user_tables
      where relid = 'agent_work_queue'::regclass"
}

case_a_running_batchs_page_reads_a_bounded_part_of_its_rows() {
  run_setup
  local port n=100000 before after
  port=$(free_port)
  # A running batch of 100,000 rows written by hand: 99,600 done within the last hour (an
  # attempt each), 100 dead with two reasons, 300 pending; vacuumed, as autovacuum would.
  q "insert into agent_work_queue (tenant_id, shard_key, payload, batch, status, attempts,
       started_at, run_started_at, finished_at, last_error)
     select 't', 's' || i, '{}', 'big', case when i <= 99600 then 'done' when i <= 99700 then 'dead' else 'pending' end,
            case when i <= 99700 then 1 else 0 end,
            case when i <= 99700 then now() - interval '50 minutes' + interval '30 ms' * i end,
            case when i <= 99700 then now() - interval '50 minutes' + interval '30 ms' * i end,
            case when i <= 99700 then now() - interval '50 minutes' + interval '30 ms' * i + interval '1 ms' * (i % 97) end,
            case when i > 99600 and i <= 99700 then case when i % 2 = 0 then 'quota' else 'bad input' end end
       from generate_series(1, $n) i;
     insert into agent_work_queue_attempts (task_id, lease_token, attempt, worker, claimed_at,
       run_started_at, finished_at, kind, status)
     select id, id, 1, 'w', started_at, run_started_at, finished_at, status, status
       from agent_work_queue where status in ('done', 'dead')" >/dev/null
  psql -X -q -d "$DATABASE_URL" -c "vacuum analyze agent_work_queue" -c "vacuum analyze agent_work_queue_attempts" >/dev/null
  before=$(queue_reads)
  # Two looks (start_dashboard's, then the page), then the dashboard's session ends: its
  # counters are the server's once its backend is gone.
  start_dashboard "$port"
  http GET "http://127.0.0.1:$port/?batch=big" >"$T_TMP/big.html"
  stop_dashboard
  wait_for "the dashboard's session to end" 60 q_true "select count(*) = 0 from pg_stat_activity
    where datname = current_database() and pid <> pg_backend_pid() and backend_type = 'client backend'"
  after=$(queue_reads)
  # A pass over the batch would read its 100,000 rows per look (the report alone, once): a
  # look reads at most the 5,000 newest attempts of the sample, the first claim's 1,000,
  # the chart's 10,000 (each checked by key), the dead and the open rows: 16,400.
  (((after - before) <= 2 * 16400)) || fail "two looks at the running batch read $((after - before)) of the queue's rows"
  echo "two looks read $((after - before)) queue rows (batch of $n)" >&2
  assert_contains "the page shows the batch running" "$(cat "$T_TMP/big.html")" "id=live-note>Running"
  # And its numbers are SQL's (a third look).
  start_dashboard "$port"
  overview_check "$port" "?batch=big"
  assert_eq "the page's report of big" "$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1]))["report"]; k=r["counts"]
print(r["total"], k["done"], k["dead"], k["pending"], r["duration_s"]["count"], r["live"]["attempts_read"], r["dead_reasons_total"], r["dead_reasons"][0]["count"])' "$T_TMP/overview.json")" \
    "100000 99600 100 300 $(q "select count(*) filter (where kind = 'done') from (select kind from agent_work_queue_attempts order by finished_at desc limit 2000) s") 2000 2 50"
  stop_dashboard
}

case_a_task_page_shows_its_attempt_history_as_sql_has_it() {
  run_setup
  local port id
  port=$(free_port)
  cat >"$T_TMP/flaky.lua" <<'LUA'
local leash = require "leash"
return { label = "v9", handle = function(task)
  if task.attempt < 3 then return leash.retry("try " .. task.attempt, 0) end
  return leash.fatal("gave up <b>")
end }
LUA
  id=$("$LEASH" enqueue --batch h '{}')
  expect_exit 0 "$LEASH" run "$T_TMP/flaky.lua" --until-empty --worker-id pod-a
  start_dashboard "$port"
  local page want
  page=$(http GET "http://127.0.0.1:$port/api/task?id=$id" | tail -n +2)
  want=$(q "select string_agg(attempt || ' ' || kind || ' ' || coalesce(cause, '-') || ' ' || worker || ' ' || label, ',' order by finished_at, lease_token) from agent_work_queue_attempts where task_id = $id")
  assert_eq "attempts in the JSON against SQL" "$("$PY" -c 'import json,sys
print(",".join("%s %s %s %s %s" % (a["attempt"], a["kind"], a["cause"] or "-", a["worker"], a["label"]) for a in json.loads(sys.argv[1])["attempts"]))' "$page")" "$want"
  [[ $want == *"dead"* ]] || fail "the history has no dead attempt: $want"
  page=$(http GET "http://127.0.0.1:$port/task?id=$id")
  assert_eq "attempt rows on the page" "$(grep -o '<tr class=attempt>' <<<"$page" | wc -l)" \
    "$(q "select count(*) from agent_work_queue_attempts where task_id = $id")"
  assert_contains "the error, escaped" "$page" "gave up &lt;b&gt;"
  assert_contains "the label" "$page" "(v9)"
  stop_dashboard
}

case_a_batch_is_compared_with_the_previous_one_of_its_name_else_the_previous_run() {
  run_setup
  local port
  port=$(free_port)
  # Three batches in this order, finished by hand with wall times of 40, 25 and 10 s.
  local b w
  for b in "nightly-2026-11-30:40" "adhoc <x>:25" "nightly-2026-12-01:10"; do
    w=${b##*:} b=${b%:*}
    q "insert into agent_work_queue (tenant_id, shard_key, payload, batch, status, started_at,
         run_started_at, finished_at)
       select 't', md5(random()::text), '{}', '$b', case when i = 1 then 'dead' else 'done' end,
              now() - interval '2 hours', now() - interval '2 hours',
              now() - interval '2 hours' + interval '1 second' * ($w * i / 5)
         from generate_series(1, 5) i" >/dev/null
  done
  start_dashboard "$port"
  # prev BATCH: the previous batch, how it was matched and its wall time, from the JSON.
  prev() {
    http GET "http://127.0.0.1:$port/api/overview?batch=$("$PY" -c 'import sys,urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$1")" |
      tail -n +2 | "$PY" -c 'import json,sys; p=json.load(sys.stdin)["previous"]
print("none" if p is None else "%s|%s|%s" % (p["batch"], p["how"], p["wall_s"]))'
  }
  wall() { q "select extract(epoch from max(finished_at) - min(started_at))::float8 from agent_work_queue where batch = '$1'"; }
  assert_eq "tonight against last night (same name, digits aside)" "$(prev nightly-2026-12-01)" \
    "nightly-2026-11-30|name|$(wall nightly-2026-11-30)"
  assert_eq "a batch of a new name against the previous run" "$(prev "adhoc <x>")" \
    "nightly-2026-11-30|previous|$(wall nightly-2026-11-30)"
  assert_eq "the first batch has none" "$(prev nightly-2026-11-30)" none
  local page
  page=$(http GET "http://127.0.0.1:$port/?batch=nightly-2026-12-01")
  assert_contains "the comparison on the page" "$page" '<td id=wall-previous>40.00 s</td><td>-75.0%</td>'
  stop_dashboard
}

case_a_worker_serves_the_dashboard_read_only_on_loopback_only() {
  run_setup
  write_script
  token_file
  local port addr
  port=$(free_port)
  for addr in 0.0.0.0:8089 :8089 "[::]:8089" 192.0.2.1:8089; do
    expect_exit 2 "$LEASH" run "$T_TMP/batch.lua" --dashboard "$addr"
    assert_eq "stderr lines for $addr" "$(wc -l <"$T_ERR")" 1
    assert_contains "error for $addr" "$(cat "$T_ERR")" "not a loopback address"
  done
  expect_exit 2 "$LEASH" run "$T_TMP/batch.lua" --dashboard 127.0.0.1:0
  "$PY" -c 'import json
for k in range(30): print(json.dumps({"payload": {"sleep": 0.1, "die": "x"} if k % 5 == 0 else {"sleep": 0.1}, "batch": "w1"}))' |
    "$LEASH" enqueue --file - >/dev/null
  start_worker W "$T_TMP/batch.lua" --concurrency 2 --poll-ms 20-100 --dashboard "127.0.0.1:$port"
  wait_for "the worker's dashboard to answer" 60 eval "[[ \$(http_status GET http://127.0.0.1:$port/api/overview) == 200 ]]"
  wait_for "the batch to finish" 120 q_true "select count(*) = 0 from agent_work_queue where status in ('pending', 'leased')"
  overview_check "$port" "?batch=w1"
  assert_eq "w1 as the worker's dashboard shows it" "$(cat "$T_TMP/shown.txt")" "w1 30 0 0 24 6"
  local id
  id=$(q "select min(id) from agent_work_queue where status = 'dead'")
  assert_contains "a task's page" "$(http GET "http://127.0.0.1:$port/task?id=$id")" "<tr class=attempt>"
  # Read-only: every action refused, with any token; nothing changes.
  for action in requeue cancel pause resume; do
    assert_eq "$action on the worker's dashboard" \
      "$(http_status POST "http://127.0.0.1:$port/api/$action" "batch=w1" "Authorization: Bearer $TOKEN")" 403
  done
  assert_eq "dead after refused actions" "$(q "select count(*) from agent_work_queue where status = 'dead'")" 6
  assert_eq "holds after refused actions" "$(q "select count(*) from agent_work_queue_holds")" 0
  # One TERM: the worker drains and exits 0, the dashboard with it (under ASan: no leak).
  kill -TERM "${W_PID[W]}"
  assert_worker_exit W 60 0
  [[ $(http_status GET "http://127.0.0.1:$port/api/overview" 2>/dev/null) != 200 ]] ||
    fail "the worker's dashboard still answers after the worker exited"
}

# pixels JSON KEY: a number from the screenshot step's output.
jget() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); v=eval("d"+sys.argv[2]); print(json.dumps(v) if not isinstance(v,str) else v)' "$1" "$2"; }

case_the_browser_shows_the_live_batch_and_its_actions_change_the_database() {
  command -v chromium >/dev/null 2>&1 || {
    echo "skip ${T_AREA}.${T_CASE}: no chromium (Debian's chromium package)" >&2
    exit 77
  }
  "$PY" -c 'import websocket' 2>/dev/null || {
    echo "skip ${T_AREA}.${T_CASE}: $PY has no websocket module (python3-websocket)" >&2
    exit 77
  }
  run_setup
  token_file
  write_script
  local port batch='night <2026>' s
  port=$(free_port)
  # 240 tasks of 0.5 s (a minute on two slots), every sixth dies with a hostile message: a
  # batch that runs long enough to be looked at and acted on while it runs.
  "$PY" -c '
import json, sys
for i in range(240):
    p = {"sleep": 0.5}
    if i % 6 == 0:
        p["die"] = "<script>document.title=\"pwned\"</script> quota & \"limits\""
    print(json.dumps({"payload": p, "batch": sys.argv[1]}))' "$batch" >"$T_TMP/tasks.jsonl"
  # Last night's batch of the same name's shape, finished (by hand: 10 done, 2 dead, 100 s
  # of wall time), enqueued before tonight's: the page's comparison.
  q "insert into agent_work_queue (tenant_id, shard_key, payload, batch, status, started_at,
       run_started_at, finished_at)
     select 't', 'prev' || i, '{}', 'night <2025>', case when i <= 2 then 'dead' else 'done' end,
            timestamptz '2026-11-30 01:00Z', timestamptz '2026-11-30 01:00Z',
            timestamptz '2026-11-30 01:00Z' + interval '1 second' * (100 * i / 12)
       from generate_series(1, 12) i;
     " >/dev/null
  enqueue_file "$T_TMP/tasks.jsonl" 240
  # A canary rolled back: the canary section.
  q "insert into agent_work_queue_canaries (script, script_name, version, share, min_tasks,
       max_fail_delta, max_retry_delta, auto_promote, state, decided_at, decided_by, decision)
     values ('return 1', 'grade.lua', repeat('ab', 32), 10, 50, 0.05, 0.1, false, 'rolled_back',
       now(), 'auto', jsonb_build_object('verdict', 'rollback', 'reason', 'failure 40% vs 2%',
       'candidate_executions', 25, 'candidate_failed', 10, 'current_executions', 200,
       'current_failed', 4))" >/dev/null
  start_dashboard "$port" --token-file "$T_TMP/token"
  local bq="batch = 'night <2026>'"
  # The browser first, with its own profile (skipped when it cannot start here), so the
  # batch's time is not spent waiting for it.
  mkdir -p "$T_TMP/chromium"
  chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --hide-scrollbars --remote-debugging-port=0 --remote-allow-origins='*' \
    --user-data-dir="$T_TMP/chromium" --window-size=1100,1300 about:blank \
    >"$T_TMP/chromium.log" 2>&1 &
  local cpid=$!
  t_on_exit t_kill "$cpid"
  local i
  for ((i = 0; i < 1200; i++)); do
    [[ -s $T_TMP/chromium/DevToolsActivePort ]] && break
    exited "$cpid" && break
    sleep 0.05
  done
  if [[ ! -s $T_TMP/chromium/DevToolsActivePort ]]; then
    echo "skip ${T_AREA}.${T_CASE}: chromium did not start: $(tail -1 "$T_TMP/chromium.log")" >&2
    exit 77
  fi
  start_worker W "$T_TMP/batch.lua" --concurrency 2 --poll-ms 20-100
  wait_for "a done and a dead task" 60 \
    q_true "select count(*) filter (where status = 'done') > 0 and count(*) filter (where status = 'dead') > 0 from agent_work_queue where $bq"
  local base="http://127.0.0.1:$port" b="$T_TMP/browser"
  browser() { "$PY" "$BROWSER_PY" "$T_TMP/chromium" "$@"; }

  # 1. Live: the numbers shown lie between SQL's before and after the load; the bar's
  #    pixels match the counts shown; the chart is drawn.
  local before after
  before=$(q "select count(*) filter (where status = 'done') || ' ' || count(*) filter (where status = 'dead') from agent_work_queue where $bq")
  browser screenshot "$base/" "$T_TMP/live.png" >"$b.live" || fail "browser: $(cat "$b.live")"
  after=$(q "select count(*) filter (where status = 'done') || ' ' || count(*) filter (where status = 'dead') || ' ' || count(*) filter (where status in ('pending', 'leased')) from agent_work_queue where $bq")
  read -r done0 dead0 <<<"$before"
  read -r done1 dead1 open1 <<<"$after"
  local done dead total
  done=$(jget "$b.live" '["done"]') dead=$(jget "$b.live" '["dead"]') total=$(jget "$b.live" '["total"]')
  assert_eq "batch shown" "$(jget "$b.live" '["batch"]')" "$batch"
  assert_eq "total shown" "$total" 240
  ((done0 <= done && done <= done1)) || fail "done shown $done, SQL $done0 before and $done1 after"
  ((dead0 <= dead && dead <= dead1)) || fail "dead shown $dead, SQL $dead0 before and $dead1 after"
  ((open1 > 0)) || fail "the batch finished before the page was looked at: not live"
  assert_eq "no script on the page" "$(jget "$b.live" '["scripts"]')" 0
  assert_eq "the page's title (a hostile reason did not run)" "$(jget "$b.live" '["title"]')" "overview · leash"
  assert_contains "the dead reason as text" "$(jget "$b.live" '["reasons"][0]')" '<script>document.title="pwned"</script>'
  # The bar's pixels, along its middle line: each colour's share within 4 of its ~600
  # pixels (edges blend) of what the counts shown say, and present (done and dead are not 0).
  local share
  share=$(jget "$b.live" '["bar_share"]["done"]')
  "$PY" -c "import sys; sys.exit(0 if abs($share - $done / $total) < 4 / 600 and $share > 0 else 1)" ||
    fail "the bar's done pixels are $share of its width, the counts say $done/$total"
  share=$(jget "$b.live" '["bar_share"]["dead"]')
  "$PY" -c "import sys; sys.exit(0 if abs($share - $dead / $total) < 4 / 600 and $share > 0 else 1)" ||
    fail "the bar's dead pixels are $share of its width, the counts say $dead/$total"
  (($(jget "$b.live" '["chart_pixels"]["done"]') > 0)) || fail "no done bar in the chart"
  (($(jget "$b.live" '["chart_pixels"]["dead"]') > 0)) || fail "no dead bar in the chart"
  [[ -z ${LEASH_DASHBOARD_SCREENSHOT:-} ]] || cp "$T_TMP/live.png" "$LEASH_DASHBOARD_SCREENSHOT"
  # Against last night (the batch of the same shape): its wall and dead as SQL has them.
  assert_eq "previous batch shown" "$(jget "$b.live" '["previous_batch"]')" "night <2025>"
  assert_eq "previous wall shown" "$(jget "$b.live" '["wall_previous"]')" \
    "$(q "select to_char(extract(epoch from max(finished_at) - min(started_at)), 'FM990.00') || ' s'
          from agent_work_queue where batch = 'night <2025>'")"
  assert_eq "previous dead shown" "$(jget "$b.live" '["previous_dead"]')" \
    "$(q "select count(*) from agent_work_queue where batch = 'night <2025>' and status = 'dead'")"
  # The canary as SQL has it.
  assert_eq "canary shown" "$(jget "$b.live" '["canaries"]')" \
    "$(q "select json_build_array(json_build_array(state, decision->>'verdict', decision->>'reason'))
          from agent_work_queue_canaries")"

  # 2. Pause the batch through the page: the hold is in SQL, the workers stop claiming it;
  #    once its leases are settled the page's numbers equal SQL's exactly.
  browser submit "$base/" pause "$TOKEN" "batch=$batch" >"$b.pause" || fail "browser: $(cat "$b.pause")"
  assert_eq "pause result" "$(jget "$b.pause" '["message"]')" "paused batch $batch until resumed"
  assert_eq "hold in SQL" "$(q "select kind || ':' || scope || ':' || source from agent_work_queue_holds")" "batch:$batch:pause"
  wait_for "the paused batch's leases to settle" 60 \
    q_true "select count(*) = 0 from agent_work_queue where $bq and status = 'leased'"
  browser load "$base/?batch=night%20%3C2026%3E" >"$b.still" || fail "browser: $(cat "$b.still")"
  for s in done dead leased pending; do
    assert_eq "$s shown while paused" "$(jget "$b.still" "[\"$s\"]")" \
      "$(q "select count(*) from agent_work_queue where $bq and status = '$s'")"
  done
  assert_eq "the hold is listed" "$(jget "$b.still" '["holds"][0]')" "$batch"

  # 3. A dead task: follow its example link, requeue it through its page.
  local id
  id=$(jget "$b.still" '["example_ids"][0]')
  browser click "$base/?batch=night%20%3C2026%3E" "#dead-reasons a.task" >"$b.task" || fail "browser: $(cat "$b.task")"
  assert_eq "task page" "$(jget "$b.task" '["url"]')" "/task?id=$id"
  assert_eq "task status shown" "$(jget "$b.task" '["task_status"]')" dead
  assert_eq "last error shown as text" "$(jget "$b.task" '["last_error"]')" \
    "$(q "select last_error from agent_work_queue where id = $id")"
  assert_eq "no script on the task page" "$(jget "$b.task" '["scripts"]')" 0
  assert_eq "its attempts shown as SQL has them" "$(jget "$b.task" '["attempts"]')" \
    "$(q "select json_agg(attempt || ' ' || kind order by finished_at, lease_token)
          from agent_work_queue_attempts where task_id = $id")"
  browser submit "$base/task?id=$id" requeue "$TOKEN" "id=$id" >"$b.requeue" || fail "browser: $(cat "$b.requeue")"
  assert_eq "requeue result" "$(jget "$b.requeue" '["message"]')" "requeued task $id"
  assert_eq "requeued in SQL" "$(q "select status || ' ' || attempts from agent_work_queue where id = $id")" "pending 0"
  # A wrong token through the page changes nothing.
  browser submit "$base/" resume "wrong-token-wrong-token" "batch=$batch" >"$b.wrong" || fail "browser: $(cat "$b.wrong")"
  assert_eq "wrong token result" "$(jget "$b.wrong" '["message"]')" "wrong token"
  assert_eq "still held" "$(q "select count(*) from agent_work_queue_holds")" 1

  # 4. Resume through the page: the workers take the batch again.
  local done_paused
  done_paused=$(q "select count(*) from agent_work_queue where $bq and status in ('done', 'dead')")
  browser submit "$base/" resume "$TOKEN" "batch=$batch" >"$b.resume" || fail "browser: $(cat "$b.resume")"
  assert_eq "resume result" "$(jget "$b.resume" '["message"]')" "resumed batch $batch"
  assert_eq "no hold in SQL" "$(q "select count(*) from agent_work_queue_holds where until is null or until > now()")" 0
  wait_for "the batch to run again" 60 \
    q_true "select count(*) > $done_paused from agent_work_queue where $bq and status in ('done', 'dead')"
  stop_dashboard
}

t_run "$@"
