#!/usr/bin/env bash
# The host API a task script sees (SPEC.md "The Lua contract", README "The Lua side"),
# through the real `leash run`: leash.db.query, leash.http.request against a local server,
# leash.step, leash.enqueue, calls refused after a lost lease, the memory cap and the task
# timeout, the sandbox, hot swap and `leash check`. Scripts are tests/fixtures/api/*.lua;
# the HTTP server is tests/fixtures/api/http_server.py (127.0.0.1, a free port).
# Figures (throughput, memory per slot) are in api_slow.sh.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"

API=$LEASH_SRC/tests/fixtures/api

# api_setup: a fresh migrated database.
api_setup() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
}

# enqueue_one PAYLOAD [FLAGS...]: one task; prints its id.
enqueue_one() {
  local payload=$1
  shift
  "$LEASH" enqueue "$@" "$payload" || fail "enqueue of $payload failed"
}

# http_start: the local HTTP server; sets HTTP_URL (http://127.0.0.1:PORT) and HTTP_LOG.
http_start() {
  HTTP_LOG=$T_TMP/http.log
  : >"$HTTP_LOG"
  python3 "$API/http_server.py" --idle 300 --log "$HTTP_LOG" >"$T_TMP/http.port" 2>"$T_TMP/http.err" &
  local pid=$!
  t_on_exit t_kill "$pid"
  wait_for "the HTTP server's port" 10 test -s "$T_TMP/http.port"
  HTTP_URL=http://127.0.0.1:$(head -n1 "$T_TMP/http.port")
}

# row ID EXPR: EXPR (SQL over the task's row) for task ID.
row() { q "select $2 from agent_work_queue where id = $1"; }

# settled ID: true once task ID is done or dead.
settled() { q_true "select status in ('done', 'dead') from agent_work_queue where id = $1"; }

# expect_done ID: fails with the row's last_error unless task ID is done.
expect_done() {
  local st
  st=$(row "$1" "status || ': ' || coalesce(last_error, '')")
  [[ $st == "done: " ]] || fail "task $1 is not done cleanly: $st"
}

# --------------------------------------------------------------------------- db
# leash.db.query maps column types to Lua values and Lua values to parameters; an SQL error
# raises and becomes a retry with the server's message; BEGIN without COMMIT leaves nothing
# open.
case_db_query_maps_types_and_params() {
  api_setup
  q "create table vals (task_id bigint, f float8, i int8, b boolean, t text, j jsonb)" >/dev/null
  local types err begin
  types=$(enqueue_one '{"mode":"types"}')
  err=$(enqueue_one '{"mode":"error"}' --max-attempts 2)
  begin=$(enqueue_one '{"mode":"begin"}')
  start_worker A "$API/db_types.lua" --concurrency 3 --poll-ms 20-50 --db-pool 2
  # The SQL error: a retry (pending again, the attempt charged, backoff ahead) with the
  # server's message. Looked at first: its next attempt comes 2 s later.
  wait_for "the failing task's first attempt to be retried" 30 q_true \
    "select status = 'pending' and attempts >= 1 from agent_work_queue where id = $err"
  local msg
  msg=$(row "$err" last_error)
  assert_contains "last_error of the SQL error" "$msg" 'relation "no_such_table_here" does not exist'
  assert_contains "last_error names the call" "$msg" "leash.db.query"
  assert_contains "last_error has the traceback" "$msg" "db_types.lua:"
  log_has A "retry: " || fail "no retry line in A's log"$'\n'"$(worker_log A)"

  wait_for "the types task to settle" 30 settled "$types"
  expect_done "$types"
  # Values as stored, read by psql: 0.1 + 0.2 went over as every digit of the float8.
  assert_eq "float8 stored from 0.1 + 0.2 (exact, not 0.3)" \
    "$(q "select f = 0.30000000000000004::float8 and f <> 0.3::float8 from vals where i = 9007199254740993")" t
  assert_eq "float8 stored from 1/3" \
    "$(q "select f = (1::float8 / 3) from vals where i = -1")" t
  assert_eq "rows stored (i|b|t|j)" \
    "$(q "select string_agg(concat_ws('|', i, coalesce(b::text, 'NULL'), coalesce(t, 'NULL'), coalesce(j::text, 'NULL')), ',' order by i desc) from vals")" \
    '9007199254740993|true|a!|{"x": 1},-1|NULL|NULL|NULL'

  # BEGIN without COMMIT: nothing stays open on the pool's connections (looked at once no
  # task runs: the failing one is dead after its second attempt).
  wait_for "the BEGIN task to settle" 30 settled "$begin"
  expect_done "$begin"
  wait_for "the failing task to go dead" 30 settled "$err"
  assert_eq "failing task at the end (status|attempts)" "$(row "$err" "status || '|' || attempts")" "dead|2"
  local states
  states=$(q "select coalesce(string_agg(state, ',' order by state), '(none)') from pg_stat_activity
              where datname = current_database() and application_name = 'leash script'")
  [[ $states =~ ^idle(,idle)*$ ]] \
    || fail "states of the worker's script connections after BEGIN without COMMIT: $states (want idle only)"
  assert_no_sanitizer_reports
}

# ------------------------------------------------------------------------- http
# leash.http.request against the local server: method, headers and body go out, response
# header names come back lower-cased, error statuses are answers, transport failures raise
# with messages that keep the URL's credentials, path and query out.
case_http_request_against_local_server() {
  api_setup
  http_start
  local id
  id=$(enqueue_one "{\"base\":\"$HTTP_URL\"}")
  start_worker A "$API/http.lua" --concurrency 2 --poll-ms 20-50 --until-empty
  assert_worker_exit A 60 0
  expect_done "$id"
  local refused timeout
  refused=$(row "$id" "result->>'refused'")
  timeout=$(row "$id" "result->>'timeout'")
  echo "# connection refused: $refused" >&2
  echo "# timeout: $timeout ($(row "$id" "round((result->>'timeout_took')::numeric, 2)") s)" >&2
  assert_contains "refused message" "$refused" "leash.http.request"
  assert_not_contains "refused message" "$refused" "SECRET"
  assert_not_contains "refused message" "$refused" "pw@"
  # The server saw each request once: nothing was retried behind the script's back.
  assert_eq "POST /echo requests the server saw" "$(grep -c ' request POST /echo$' "$HTTP_LOG")" 1
  # The worker's log holds no URL secret either.
  assert_not_contains "worker log" "$(worker_log A)" "SECRET"
  assert_no_sanitizer_reports
}

# CR, LF, NUL or another control in the url, the method, a header name or a header value
# (each), and header names or methods that are not tokens: every one raises a clear error
# that does not quote the value, and nothing of it reaches the server (no smuggled request,
# no injected header). A tab in a value and a token method still go through.
case_http_refuses_crlf_and_nul_in_every_part() {
  api_setup
  http_start
  local id
  id=$(enqueue_one "{\"base\":\"$HTTP_URL\"}")
  start_worker A "$API/http_hostile.lua" --concurrency 1 --poll-ms 20-50 --until-empty
  assert_worker_exit A 60 0
  expect_done "$id"
  assert_eq "variants tried" "$(row "$id" "jsonb_array_length(result->'variants')")" 37
  assert_eq "variants that were sent" \
    "$(row "$id" "(select string_agg(v->>'name', ',') from jsonb_array_elements(result->'variants') v where (v->>'ok')::boolean)")" ""
  assert_eq "variants whose error is not leash.http.request's" \
    "$(row "$id" "(select string_agg(v->>'name', ',') from jsonb_array_elements(result->'variants') v where v->>'err' not like '%leash.http.request: %')")" ""
  assert_eq "errors quoting the secret" \
    "$(row "$id" "(select count(*) from jsonb_array_elements(result->'variants') v where v->>'err' like '%SECRETVALUE%')")" 0
  echo "# e.g. $(row "$id" "result->'variants'->0->>'err'")" >&2
  assert_eq "clean request" "$(row "$id" "result->>'status' || ' ' || (result->>'method') || ' ' || (result->>'tab') || ' ' || (result->>'user') || '|' || (result->>'injected')")" $'200 PATCH a\tb alice|'
  # The server saw exactly the one clean request: nothing smuggled, nothing sent early.
  assert_eq "requests the server saw" "$(grep ' request ' "$HTTP_LOG" | awk '{print $3, $4}')" "PATCH /echo"
  assert_not_contains "worker log" "$(worker_log A)" "SECRETVALUE"
  assert_no_sanitizer_reports
}

# With --db-pool 1 each task gets the connection the last one used; whatever the last one
# did to its session (a role, SET SESSION AUTHORIZATION, search_path, statement_timeout or
# any SET, a temp table, a prepared statement, a LISTEN, session advisory locks, a WITH HOLD
# cursor, a BEGIN left open) must not be seen by the next: it sees a new connection's state.
# Twice: with --task-timeout (statement_timeout is set before every statement) and without
# (the next task's first statement goes out with no round trip before it when the pool's
# janitor has reset the session since: nothing but that reset stands between two tasks).
case_pooled_session_state_never_reaches_the_next_task() {
  api_setup
  q "create role leash_other; create table side (s text); grant select, insert on side to leash_other" >/dev/null
  t_on_exit q "drop owned by leash_other; drop role if exists leash_other"
  local modes=(set_role session_auth search_path st0 st_other set_config temp prepare listen advisory cursor begin app_name)
  local timeout
  for timeout in "--task-timeout 20" ""; do
    q "delete from agent_work_queue" >/dev/null
    local m ids=() baseline
    ids+=("$(enqueue_one '{"m":"who"}')")
    for m in "${modes[@]}"; do
      enqueue_one "{\"m\":\"$m\"}" >/dev/null
      ids+=("$(enqueue_one '{"m":"who"}')")
    done
    # shellcheck disable=SC2086 # the option is two words or none
    start_worker A "$API/db_session.lua" --concurrency 1 --db-pool 1 $timeout --poll-ms 20-50 --until-empty
    assert_worker_exit A 60 0
    assert_eq "tasks not done" "$(q "select count(*) from agent_work_queue where status <> 'done'")" 0
    # The misuses took effect in their own execution (else the test would prove nothing).
    assert_eq "misuses that failed" \
      "$(q "select string_agg(payload->>'m', ',') from agent_work_queue where payload->>'m' <> 'who' and result::text like '%\"err\"%'")" ""
    assert_eq "one connection for every task" "$(q "select count(distinct result->>'pid') from agent_work_queue")" 1
    baseline=$(row "${ids[0]}" "result - 'pid'")
    echo "# baseline session (${timeout:-no task timeout}): $baseline" >&2
    if [[ -n $timeout ]]; then
      assert_contains "baseline" "$baseline" '"st_set": true'
    else
      assert_contains "baseline" "$baseline" '"st_set": false'
    fi
    assert_contains "baseline" "$baseline" '"advisory": 0'
    local i
    for i in "${!modes[@]}"; do
      assert_eq "session after ${modes[$i]} (${timeout:-no task timeout})" \
        "$(row "${ids[$((i + 1))]}" "result - 'pid'")" "$baseline"
    done
  done
  assert_no_sanitizer_reports
}

# The pool prepares a script's statement the first time a connection runs its text and keeps
# it for every later execution on that connection (stmtcache.h). With --db-pool 1 every task
# shares one session: a statement run by six tasks is prepared once and run six times; then
# each way a script can pull the prepared statements from under the cache (DEALLOCATE ALL,
# DISCARD ALL, DEALLOCATE by name, PREPARE under the name it would give a text, ALTER TABLE
# under a cached SELECT *, more texts than it holds, a statement that fails) is followed by
# cached statements that must answer as if nothing were cached, and a script's own PREPAREd
# statements are gone for the next task. Then what a kept plan could get wrong: a statement
# failing inside what it runs is not run again; one text under two search_paths whose tables
# differ in the parameter's type, and after the column's type is altered, answers each time;
# a temp table shadowing a permanent one takes the writes of a text cached before it (the
# session had a temp schema already, so its creation invalidates nothing by itself).
# (Bind's errors carry a context when log_parameter_max_length_on_error is set: then the
# statement is not run again but prepared again on its next call.)
case_a_pooled_sessions_statements_are_prepared_once_and_survive_misuse() {
  api_setup
  q "create table side (s text); insert into side values ('a'), ('b');
     create sequence twice_seq;
     create function leash_twice() returns int language plpgsql as
       \$\$ begin perform nextval('twice_seq'); execute 'execute no_such_statement'; return 1; end \$\$;
     create schema rsa; create table rsa.t (k text); insert into rsa.t values ('1');
     create schema rsb; create table rsb.t (k int); insert into rsb.t values (1), (1);
     create schema rsc; create table rsc.t (k int); insert into rsc.t values (1), (1), (1)" >/dev/null
  local modes=(count count count count count count stats deallocate_all discard_all deallocate_each
    squat stats star alter star many stats broken count twice sp_a sp_b retype sp_b
    sp_logged temp_schema insert_side temp_side) m ids=()
  for m in "${modes[@]}"; do
    ids+=("$(enqueue_one "{\"m\":\"$m\"}")")
  done
  start_worker A "$API/db_cache.lua" --concurrency 1 --db-pool 1 --poll-ms 20-50 --until-empty
  assert_worker_exit A 60 0
  assert_eq "tasks not done" "$(q "select count(*) from agent_work_queue where status <> 'done'")" 0
  assert_eq "one connection for every task" "$(q "select count(distinct result->>'pid') from agent_work_queue")" 1
  local i out
  for i in "${!modes[@]}"; do
    out=$(row "${ids[$i]}" "result - 'pid'")
    echo "# ${modes[$i]}: $out" >&2
    case ${modes[$i]} in
      count | deallocate_all | discard_all | deallocate_each) assert_eq "${modes[$i]} (task $i)" "$out" '{"n": 2}' ;;
      squat) assert_eq "squat" "$out" '{"n": 42, "derived": 1}' ;;
      star) ;;
      alter) assert_eq "alter" "$out" '{}' ;;
      many) assert_eq "many" "$out" '{"bad": 0}' ;;
      broken) assert_contains "broken" "$out" 'no_such_column' ;;
      twice) assert_eq "twice" "$out" '{"n": 4}' ;;
      sp_logged) assert_contains "search_path c, parameters logged" "$out" '"n": 3' ;;
      sp_a) assert_eq "search_path a" "$out" '{"n": 1}' ;;
      sp_b) assert_eq "search_path b (task $i)" "$out" '{"n": 2}' ;;
      retype | temp_schema | insert_side) assert_eq "${modes[$i]}" "$out" '{}' ;;
      temp_side) assert_eq "temp_side" "$out" '{"temp_rows": 1}' ;;
    esac
  done
  assert_eq "rows the temp table's insert put in the permanent one" "$(q "select count(*) from side where s = 'y1'")" 0
  # Six runs of one text, one statement: prepared once (the runs are counted by the server).
  assert_eq "runs of the count statement" "$(row "${ids[6]}" "(result->>'runs')::int >= 6")" t
  assert_eq "scripts' statements at first" "$(row "${ids[6]}" "result->>'scripts'")" 0
  # The squatter's 300 PREPAREs did not outlive its task.
  assert_eq "scripts' statements after the squatter" "$(row "${ids[11]}" "result->>'scripts'")" 0
  assert_eq "star before the alter" "$(row "${ids[12]}" "result - 'pid'")" '{"s": "a"}'
  assert_eq "star after the alter" "$(row "${ids[14]}" "result - 'pid'")" '{"s": "a", "extra": 7}'
  assert_eq "statements kept after 150 texts" "$(row "${ids[16]}" "(result->>'ours')::int between 1 and 64")" t
  assert_no_sanitizer_reports
}

# A reset session waits in the pool for the next task, which sends its first statement with
# no round trip before it; a backend terminated meanwhile (a restart, an operator's
# pg_terminate_backend) must not cost that task its statement: the pool sees from the socket
# that the session is gone and opens a new one. Three times, each after the session was
# handed back reset.
case_a_pooled_session_terminated_while_idle_is_replaced_unseen() {
  api_setup
  q "create table side (s text)" >/dev/null
  start_worker A "$API/db_session.lua" --concurrency 1 --db-pool 1 --poll-ms 20-50
  local id pid i
  id=$(enqueue_one '{"m":"who"}')
  wait_for "the first task" 30 q_true "select status = 'done' from agent_work_queue where id = $id"
  for i in 1 2 3; do
    pid=$(row "$id" "result->>'pid'")
    # The janitor resets the session after the task: wait for its reset to be the last
    # statement the backend ran, so that the next task takes it as reset.
    wait_for "the session's reset" 10 q_true \
      "select state = 'idle' and query like '%DISCARD SEQUENCES%' from pg_stat_activity where pid = $pid"
    q "select pg_terminate_backend($pid)" >/dev/null
    wait_for "the backend to end" 10 q_true "select count(*) = 0 from pg_stat_activity where pid = $pid"
    id=$(enqueue_one '{"m":"who"}')
    wait_for "task $i after the termination" 30 q_true "select status = 'done' from agent_work_queue where id = $id"
    assert_eq "task $i's statement failed" "$(row "$id" "result->>'err'")" ""
    assert_not_contains "task $i ran on a new session" "$(row "$id" "result->>'pid'")" "$pid"
  done
  t_kill "${W_PID[A]}"
  assert_no_sanitizer_reports
}

# statement_timeout follows the task's time left and is set again before every statement:
# SET statement_timeout = 0, RESET or set_config in the statement itself cannot let
# pg_sleep(8) outlive --task-timeout 3. Each task ends as a retry near 3 s, not done at 8 s.
case_db_statement_cannot_outlive_the_task_timeout() {
  api_setup
  local m
  for m in set_then_sleep set_config_in_the_statement reset_then_sleep; do
    enqueue_one "{\"m\":\"$m\"}" --max-attempts 1 >/dev/null
  done
  local t0 ms
  t0=$(_t_now_us)
  start_worker A "$API/db_sleep.lua" --concurrency 1 --db-pool 1 --task-timeout 3 --poll-ms 20-50 --until-empty
  assert_worker_exit A 40 0
  ms=$((($(_t_now_us) - t0) / 1000))
  echo "# three 8 s sleeps under --task-timeout 3 took ${ms} ms" >&2
  assert_eq "tasks done" "$(q "select count(*) from agent_work_queue where status = 'done'")" 0
  assert_eq "tasks ended within 5 s each" \
    "$(q "select count(*) from agent_work_queue where finished_at - started_at < interval '5 s'")" 3
  ((ms < 20000)) || fail "the three tasks took ${ms} ms"
  assert_eq "sleeps still running" "$(q "select count(*) from pg_stat_activity where query like '%pg_sleep(8)%' and pid <> pg_backend_pid()")" 0
  assert_no_sanitizer_reports
}

# A request in flight is aborted once the lease is lost: the row is taken away by SQL while
# the task waits on /slow?ms=20000; the next heartbeat misses it and the transfer stops.
case_http_aborted_when_lease_lost() {
  api_setup
  http_start
  q "create table execs (task_id bigint, attempt int, started timestamptz not null default clock_timestamp())" >/dev/null
  local id
  id=$(enqueue_one "{\"base\":\"$HTTP_URL\"}")
  start_worker A "$API/http_slow.lua" --concurrency 2 --visibility 2s --heartbeat 500ms --poll-ms 20-50
  wait_for "the slow request to reach the server" 30 grep -q "slow-start" "$HTTP_LOG"
  assert_eq "the task holds its lease" "$(row "$id" "status || '|' || lease_owner")" "leased|A"
  q "update agent_work_queue set lease_owner = 'someone-else' where id = $id" >/dev/null
  local t0 ms
  t0=$(_t_now_us)
  wait_for "the request to end after the lease was taken" 4 log_has A "http ended after"
  ms=$((($(_t_now_us) - t0) / 1000))
  echo "# request ended ${ms} ms after the lease was taken away by SQL" >&2
  local line took
  line=$(grep -F "http ended after" "$T_TMP/A.log")
  assert_contains "how the request ended" "$line" "ok=false"
  assert_contains "how the request ended" "$line" "lease lost: request aborted"
  took=$(sed -E 's/.*http ended after ([0-9.]+) s.*/\1/' <<<"$line")
  awk -v t="$took" 'BEGIN { exit !(t < 6) }' \
    || fail "the 20 s request ran ${took} s in the task (want well under 20 s)"
  log_has A "lease lost" || fail "no 'lease lost' in A's log"$'\n'"$(worker_log A)"
  wait_for "the server to see the client hang up" 5 grep -q "slow-gone" "$HTTP_LOG"
  assert_eq "slow requests the server finished" "$(grep -c "slow-done" "$HTTP_LOG" || true)" 0
  # Attempt 1's outcome was discarded; once the stolen lease expires the task runs again.
  wait_for "the task to be done on a later attempt" 30 settled "$id"
  assert_eq "row at the end (status|attempts|result)" \
    "$(row "$id" "status || '|' || attempts || '|' || result::text")" 'done|2|{"rerun": true}'
  assert_no_sanitizer_reports
}

# -------------------------------------------------------------------------- step
# leash.step runs its function once per task across attempts: a task that retries twice
# then succeeds paid once; its steps are removed when it is done and kept when it goes dead.
case_steps_skip_on_retry() {
  api_setup
  q "create table step_runs (task_id bigint, step text, attempt int);
     create table attempts_seen (task_id bigint, attempt int, paid jsonb, nothing_is_nil boolean)" >/dev/null
  local good dead
  good=$(enqueue_one '{"succeed_on":3}')
  dead=$(enqueue_one '{}' --max-attempts 2)
  start_worker A "$API/steps.lua" --concurrency 2 --poll-ms 20-50 --until-empty
  assert_worker_exit A 60 0
  assert_eq "task that retried twice (status|attempts)" "$(row "$good" "status || '|' || attempts")" "done|3"
  assert_eq "its step functions ran (step:attempt)" \
    "$(q "select string_agg(step || ':' || attempt, ',' order by step) from step_runs where task_id = $good")" \
    "nothing:1,paid:1"
  assert_eq "what each attempt got from the steps (attempt|paid|nil)" \
    "$(q "select string_agg(attempt || '|' || paid::text || '|' || nothing_is_nil, ',' order by attempt)
            from attempts_seen where task_id = $good")" \
    '1|{"tags": [], "amount": 42, "paid_on_attempt": 1}|true,2|{"tags": [], "amount": 42, "paid_on_attempt": 1}|true,3|{"tags": [], "amount": 42, "paid_on_attempt": 1}|true'
  assert_eq "result of the done task" "$(row "$good" "result->>'paid_on_attempt'")" 1
  assert_eq "steps kept for the done task" \
    "$(q "select count(*) from agent_work_queue_steps where task_id = $good")" 0
  # The dead one: ran its steps once, kept them (a requeue resumes after its paid steps).
  assert_eq "dead task (status|attempts)" "$(row "$dead" "status || '|' || attempts")" "dead|2"
  assert_eq "its step functions ran" \
    "$(q "select count(*) from step_runs where task_id = $dead")" 2
  assert_eq "steps kept for the dead task (name|result|attempt)" \
    "$(q "select string_agg(name || '|' || coalesce(result::text, 'NULL') || '|' || attempt, ',' order by name)
            from agent_work_queue_steps where task_id = $dead")" \
    'nothing|NULL|1,paid|{"tags": [], "amount": 42, "paid_on_attempt": 1}|1'
  assert_no_sanitizer_reports
}

# ------------------------------------------------------------------- lease loss
# After the lease is lost (taken away by SQL while the script sleeps), leash.db.query,
# leash.http.request, leash.step and leash.enqueue raise instead of acting; pure functions
# still work. The script reports through print, since the database refuses it.
case_calls_refused_after_lease_loss() {
  api_setup
  http_start
  q "create table started (task_id bigint); create table late_writes (task_id bigint)" >/dev/null
  local id
  id=$(enqueue_one "{\"base\":\"$HTTP_URL\"}")
  start_worker A "$API/refused.lua" --concurrency 2 --visibility 2s --heartbeat 500ms --poll-ms 20-50
  wait_for "the task to start" 30 q_true "select count(*) = 1 from started"
  q "update agent_work_queue set lease_owner = 'someone-else' where id = $id" >/dev/null
  wait_for "the script's report after the loss" 5 log_has A "after-loss json.encode"
  local log line
  log=$(worker_log A)
  _after() {
    grep -F "after-loss $1:" "$T_TMP/A.log" | head -n1
  }
  line=$(_after sleep)
  assert_contains "leash.sleep after the loss" "$line" "ok=false"
  assert_contains "leash.sleep after the loss" "$line" "lease lost"
  assert_contains "task:lease_lost() after the loss" "$(grep -F "after-loss lease_lost()" "$T_TMP/A.log")" "=true"
  local call
  for call in db.query http.request step enqueue; do
    line=$(_after "$call")
    [[ -n $line ]] || fail "no report for $call in A's log"$'\n'"$log"
    assert_contains "$call after the loss" "$line" "ok=false"
    assert_contains "$call after the loss" "$line" "lease lost"
  done
  assert_contains "json.encode after the loss (pure: still works)" "$(_after json.encode)" 'ok=true {"still":"pure"}'
  assert_not_contains "A's log" "$log" "after-loss step fn ran"
  assert_contains "A's log" "$log" "lease lost: heartbeat found the row no longer leased"
  # Nothing acted: no late row, no request, no step, no child task.
  assert_eq "rows written after the loss" "$(q 'select count(*) from late_writes')" 0
  assert_eq "late requests the server saw" "$(grep -c 'late' "$HTTP_LOG" || true)" 0
  assert_eq "requests the server saw at all" "$(grep -c ' request ' "$HTTP_LOG" || true)" 0
  assert_eq "steps stored" "$(q 'select count(*) from agent_work_queue_steps')" 0
  assert_eq "tasks in the queue (no child)" "$(q 'select count(*) from agent_work_queue')" 1
  # Once the stolen lease expires the task runs again and is done.
  wait_for "the task to be done on a later attempt" 30 settled "$id"
  assert_eq "row at the end" "$(row "$id" "status || '|' || attempts || '|' || result::text")" 'done|2|{"rerun": true}'
  assert_eq "tasks in the queue at the end" "$(q 'select count(*) from agent_work_queue')" 1
  assert_no_sanitizer_reports
}

# ----------------------------------------------------------------------- enqueue
# leash.enqueue: defaults (the parent's tenant and batch, a shard of its own), explicit
# fields honoured, misuse raises; and the write is fenced in the database: a parent whose
# lease was taken (without the host knowing yet) cannot enqueue nor store a step.
case_enqueue_children_fenced() {
  api_setup
  local parent fence
  parent=$(enqueue_one '{"role":"parent"}' --tenant acme --batch nightly --shard p)
  fence=$(enqueue_one '{"role":"fence"}' --tenant acme --batch nightly --shard f)
  start_worker A "$API/enqueue.lua" --concurrency 4 --poll-ms 20-50 --batch nightly --until-empty
  assert_worker_exit A 60 0
  expect_done "$parent"
  expect_done "$fence"
  local kid="select %s from agent_work_queue where payload->>'kind' = '%s'"
  # shellcheck disable=SC2059
  _kid() { q "$(printf "$kid" "$2" "$1")"; }
  assert_eq "ids returned match the rows" \
    "$(row "$parent" "concat_ws(',', result->'ids'->>'default', result->'ids'->>'explicit', result->'ids'->>'nobatch', result->'ids'->>'short_delay')")" \
    "$(_kid default id),$(_kid explicit id),$(_kid nobatch id),$(_kid short_delay id)"
  assert_eq "default child (tenant|batch|shard = task:<id>|max_attempts|runnable at once|parent)" \
    "$(_kid default "concat_ws('|', tenant_id, batch, shard_key = 'task:' || id, max_attempts,
                               run_after <= created_at + interval '1 s', payload->>'parent')")" \
    "acme|nightly|t|8|t|$parent"
  assert_eq "default child ran in the parent's batch (status|result)" \
    "$(_kid default "status || '|' || result::text")" 'done|{"batch": "nightly", "child": true, "tenant": "acme"}'
  assert_eq "explicit child (tenant|shard|batch|max_attempts|status|attempts)" \
    "$(_kid explicit "concat_ws('|', tenant_id, shard_key, batch, max_attempts, status, attempts)")" \
    "other|s1|b2|3|pending|0"
  assert_eq "explicit child's delay (run_after - created_at in [3599, 3601] s)" \
    "$(_kid explicit "extract(epoch from run_after - created_at) between 3599 and 3601")" t
  assert_eq "child with batch = leash.null (tenant|shard|batch is null)" \
    "$(_kid nobatch "concat_ws('|', tenant_id, shard_key, batch is null)")" "acme|shared|t"
  assert_eq "child with a fractional delay (run_after - created_at in [1.4, 1.6] s)" \
    "$(_kid short_delay "extract(epoch from run_after - created_at) between 1.4 and 1.6")" t
  assert_eq "misuse of leash.enqueue" \
    "$(row "$parent" "(select string_agg(key || '=' || value, ',' order by key) from jsonb_each_text(result->'bad'))")" \
    "float_max=raised,fn_payload=raised,neg_delay=raised,no_payload=raised,not_a_table=raised,table_tenant=raised,text_delay=raised,zero_max=raised"
  # The fence: both writes refused by the database, nothing written.
  assert_contains "leash.enqueue with the lease taken" "$(row "$fence" "result->>'enqueue'")" "lease lost"
  assert_contains "leash.step with the lease taken" "$(row "$fence" "result->>'step'")" "lease lost"
  assert_eq "fenced child rows" "$(q "select count(*) from agent_work_queue where payload->>'kind' = 'fenced'")" 0
  assert_eq "fenced step rows" "$(q "select count(*) from agent_work_queue_steps where task_id = $fence")" 0
  assert_eq "tasks in the queue (2 parents, 4 children)" "$(q 'select count(*) from agent_work_queue')" 6
  assert_no_sanitizer_reports
}

# The fence against a takeover in flight: another session has moved the task's row to a new
# owner but not committed yet when the script stores a step and enqueues a child. Both writes
# lock the row, so they wait for that commit, then see the new owner and are refused; read
# from a snapshot taken before the commit, they went through (found by the chaos soak: a step
# stored for attempt 1 after attempt 2 had taken the lease).
case_fence_holds_against_a_takeover_in_flight() {
  api_setup
  q "create table go (x int)" >/dev/null
  local id
  id=$(enqueue_one '{}')
  start_worker A "$API/fence_race.lua" --concurrency 1 --visibility 60s --heartbeat 20s --poll-ms 20-50
  wait_for "the task to be leased" 30 q_true "select status = 'leased' from agent_work_queue where id = $id"
  PGAPPNAME=thief psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$T_TMP/thief.out" 2>&1 <<SQL &
BEGIN;
UPDATE agent_work_queue SET lease_owner = 'thief', attempts = attempts + 1 WHERE id = $id;
SELECT pg_sleep(2);
COMMIT;
SQL
  local thief=$!
  t_on_exit t_kill "$thief"
  wait_for "the takeover to be in flight" 10 q_true \
    "select count(*) = 1 from pg_stat_activity where application_name = 'thief' and query like '%pg_sleep%'"
  q "insert into go values (1)" >/dev/null
  wait_for "the script's report" 20 log_has A "race enqueue:"
  wait "$thief" || fail "the takeover session failed: $(<"$T_TMP/thief.out")"
  assert_contains "leash.step during the takeover" "$(grep -F "race step:" "$T_TMP/A.log")" "ok=false"
  assert_contains "leash.step during the takeover" "$(grep -F "race step:" "$T_TMP/A.log")" "lease lost"
  assert_contains "leash.enqueue during the takeover" "$(grep -F "race enqueue:" "$T_TMP/A.log")" "ok=false"
  assert_eq "steps stored" "$(q 'select count(*) from agent_work_queue_steps')" 0
  assert_eq "tasks in the queue (no child)" "$(q 'select count(*) from agent_work_queue')" 1
  assert_eq "the row belongs to the thief" "$(row "$id" "status || '|' || lease_owner")" "leased|thief"
  assert_no_sanitizer_reports
}

# ------------------------------------------------------------------ limits
# --lua-memory and --task-timeout: a task that allocates forever and tasks that loop forever
# (also inside pcall) fail as retries with a clear last_error, and go dead after
# max_attempts; meanwhile 20 normal tasks run on the other slots; the process survives and
# --until-empty exits 0.
case_memory_bomb_and_infinite_loop_are_retries() {
  api_setup
  q "create table runs (task_id bigint, kind text, attempt int, at timestamptz not null default clock_timestamp())" >/dev/null
  local bomb loop loop_pcall i
  bomb=$(enqueue_one '{"kind":"bomb"}' --max-attempts 2)
  loop=$(enqueue_one '{"kind":"loop"}' --max-attempts 2)
  loop_pcall=$(enqueue_one '{"kind":"loop_pcall"}' --max-attempts 2)
  for i in $(seq 1 20); do printf '{"payload":{"n":%d}}\n' "$i"; done >"$T_TMP/normal.jsonl"
  enqueue_file "$T_TMP/normal.jsonl" 20
  start_worker A "$API/bad.lua" --concurrency 5 --lua-memory 16 --task-timeout 1 \
    --poll-ms 20-50 --until-empty
  # After the first failures the process is still there, running the retries.
  wait_for "the bad tasks' first attempts to fail" 30 q_true \
    "select count(*) = 3 from agent_work_queue where id in ($bomb, $loop, $loop_pcall)
       and attempts >= 1 and status <> 'leased'"
  exited "${W_PID[A]}" && fail "the worker exited after the first failures"$'\n'"$(worker_log A)"
  assert_worker_exit A 60 0
  assert_eq "normal tasks" \
    "$(q "select status || '=' || count(*) from agent_work_queue where payload ? 'n' group by status")" "done=20"
  # They ran while the bad ones were stuck: all 20 ended before the first bad attempt could.
  assert_eq "normal tasks that ran within 0.9 s of the first bad task's start" \
    "$(q "select count(*) from runs where kind = 'normal'
            and at < (select min(at) from runs where kind <> 'normal') + interval '0.9 s'")" 20
  assert_eq "bomb (status|attempts)" "$(row "$bomb" "status || '|' || attempts")" "dead|2"
  assert_contains "bomb's last_error" "$(row "$bomb" last_error)" "out of memory"
  assert_eq "loop (status|attempts)" "$(row "$loop" "status || '|' || attempts")" "dead|2"
  assert_contains "loop's last_error" "$(row "$loop" last_error)" "timed out"
  assert_eq "loop inside pcall (status|attempts)" "$(row "$loop_pcall" "status || '|' || attempts")" "dead|2"
  assert_contains "loop inside pcall's last_error" "$(row "$loop_pcall" last_error)" "timed out"
  assert_eq "runs of the bad tasks" "$(q "select count(*) from runs where kind <> 'normal'")" 6
  # (What the summary says of the dead ones is exhausted_retries_are_reported_dead's.)
  assert_contains "A's summary" "$(worker_log A)" "claimed, 20 done, "
  assert_contains "A's summary" "$(worker_log A)" " 0 lost"
  assert_no_sanitizer_reports
}

# A retry on the last attempt makes the task dead: the worker's log line for that task and
# its summary must say so ("dead"), as they do for leash.fatal.
case_exhausted_retries_are_reported_dead() {
  api_setup
  q "create table runs (task_id bigint, kind text, attempt int, at timestamptz not null default clock_timestamp())" >/dev/null
  local id
  id=$(enqueue_one '{"kind":"loop"}' --max-attempts 1)
  start_worker A "$API/bad.lua" --concurrency 1 --task-timeout 0.2 --poll-ms 20-50 --until-empty
  assert_worker_exit A 30 0
  assert_eq "task (status|attempts)" "$(row "$id" "status || '|' || attempts")" "dead|1"
  log_has A "dead: task timed out" \
    || fail "no 'dead: task timed out' line for the task that went dead"$'\n'"$(worker_log A)"
  assert_contains "A's summary" "$(worker_log A)" "1 claimed, 0 done, 0 retried, 1 dead, 0 lost"
  assert_no_sanitizer_reports
}

# --------------------------------------------------------------------- sandbox
# No process control in the script's reach: os.exit/os.execute/io.popen/package.loadlib,
# C modules, bytecode (load, require of a binary chunk, string.dump) all fail; libraries and
# leash are read-only, globals are on the allow-list and each task's own; the worker goes on. `leash check` of a script that calls os.exit while loading exits 1 with file:line.
case_sandbox_has_no_process_control() {
  api_setup
  local dir=$T_TMP/sandbox
  mkdir -p "$dir"
  cp "$API/sandbox.lua" "$dir/sandbox.lua"
  # A bytecode chunk (the signature is enough: the loader refuses on the first byte).
  printf '\033Lua\124\000\031\223\015\012\032\012\004\010\010' >"$dir/bc.lua"
  expect_exit 1 "$LEASH" check "$API/exit_at_load.lua"
  assert_contains "leash check of a script calling os.exit" "$(<"$T_ERR")" "exit_at_load.lua:3:"
  assert_contains "leash check of a script calling os.exit" "$(<"$T_ERR")" "exit"
  expect_exit 1 "$LEASH" run "$API/exit_at_load.lua" --until-empty
  assert_contains "leash run of a script calling os.exit" "$(<"$T_ERR")" "exit_at_load.lua:3:"

  # Three tasks in one slot: the fixture checks that no global of an earlier task is seen.
  local ids=() i
  for i in 1 2 3; do ids+=("$(enqueue_one "{\"i\":$i}")"); done
  start_worker A "$dir/sandbox.lua" --concurrency 1 --poll-ms 20-50 --until-empty
  assert_worker_exit A 30 0
  for i in "${ids[@]}"; do expect_done "$i"; done
  assert_no_sanitizer_reports
}

# One C call cannot hold a slot past --task-timeout (issue #12): the three shared
# reproductions (a finalizer, table.move, pattern backtracking) and more of the same class
# from tests/fixtures/sandbox/loops.lua, through the real binary. Each ends as a retry with
# cause timeout or a refusal, within the timeout plus a second, and the worker exits.
case_c_level_loops_end_within_the_task_timeout() {
  api_setup
  local SBX=$LEASH_SRC/tests/fixtures/sandbox f id kind
  declare -A want=()
  for f in gc_loop tmove pattern; do
    id=$(enqueue_one '{}' --max-attempts 1)
    start_worker "$f" "$SBX/$f.lua" --concurrency 1 --task-timeout 1 --poll-ms 20-50 --until-empty
    assert_worker_exit "$f" 30 0
    assert_eq "$f.lua (status)" "$(row "$id" status)" "dead"
    case $f in
      gc_loop) assert_contains "$f.lua's last_error" "$(row "$id" last_error)" "__gc is not allowed" ;;
      *) assert_contains "$f.lua's last_error" "$(row "$id" last_error)" "timed out" ;;
    esac
  done
  for kind in tmove tinsert_huge_len find_backtracking gsub_backtracking find_balance \
              coroutine_loop tsort_looping_comparator srep_huge; do
    want[$(enqueue_one "{\"kind\":\"$kind\"}" --max-attempts 1)]=$kind
  done
  local t0=$SECONDS
  start_worker L "$SBX/loops.lua" --concurrency 4 --task-timeout 1 --poll-ms 20-50 --until-empty
  assert_worker_exit L 60 0
  # 8 tasks on 4 slots, each at most 1 s + grace: far less than one task's worth of hang.
  ((SECONDS - t0 <= 8)) || fail "loops.lua took $((SECONDS - t0)) s for 8 bounded tasks"
  for id in "${!want[@]}"; do
    assert_eq "${want[$id]} (status)" "$(row "$id" status)" "dead"
    case ${want[$id]} in
      srep_huge) assert_contains "${want[$id]}'s last_error" "$(row "$id" last_error)" "over 64 MB" ;;
      *) assert_contains "${want[$id]}'s last_error" "$(row "$id" last_error)" "timed out" ;;
    esac
  done
  assert_no_sanitizer_reports
}

# ---------------------------------------------------------------------- hot swap
# The script file replaced atomically (write + rename): later tasks run the new version, a
# task running during the swap finishes on the old one; a version that does not load is
# refused and the old one keeps running; SIGHUP reloads; a module under --lua-path counts.
case_hot_swap_v1_v2_and_broken_v3_refused() {
  api_setup
  local dir=$T_TMP/hs lib=$T_TMP/lib
  mkdir -p "$dir" "$lib"
  local script=$dir/script.lua
  _version_text() { sed "s/^local V = 1\$/local V = $1/" "$API/hotswap.lua"; }
  # The version hash `leash check` prints (of the script's text alone).
  _version_hash() {
    _version_text "$1" >"$T_TMP/probe.lua"
    "$LEASH" check --lua-path "$lib" "$T_TMP/probe.lua" | sed -E 's/.*\(version ([0-9a-f]+)\).*/\1/'
  }
  # put FILE CONTENT-COMMAND...: the way editors and deploys replace a file.
  _put() {
    local f=$1
    shift
    "$@" >"$f.tmp"
    mv "$f.tmp" "$f"
  }
  _lines() { grep -cF -- "$1" "$T_TMP/A.log" || true; }
  # shellcheck disable=SC2317 # called through wait_for
  _more_lines() { (($(_lines "$1") > $2)); }
  _task() {
    local id
    id=$(enqueue_one "$1")
    wait_for "task $id ($1) to settle" 20 settled "$id"
    expect_done "$id"
    row "$id" "result->>'v' || ',' || (result->>'mod')"
  }
  _version_text 1 >"$script"
  cp "$API/hsmod.lua" "$lib/hsmod.lua"
  local v1 v2 v4
  v1=$(_version_hash 1) v2=$(_version_hash 2)
  [[ $v1 =~ ^[0-9a-f]{64}$ && $v1 != "$v2" ]] || fail "version hashes: $v1 $v2"

  start_worker A "$script" --lua-path "$lib" --concurrency 2 --poll-ms 20-50
  wait_for "A to run" 20 log_has A "running 2 slots"
  assert_contains "A's start" "$(worker_log A)" "version $v1"
  assert_eq "result before any swap" "$(_task '{}')" "1,m1"

  # v2 while a 2 s task runs on v1.
  local long
  long=$(enqueue_one '{"sleep":2}')
  wait_for "the long task to start" 20 q_true "select status = 'leased' from agent_work_queue where id = $long"
  _put "$script" _version_text 2
  wait_for "the swap to v2" 10 log_has A "hot swap (file change): slots load version $v2 between tasks"
  assert_eq "the long task still runs after the swap" "$(row "$long" status)" leased
  assert_eq "result after the swap to v2" "$(_task '{}')" "2,m1"
  wait_for "the long task to settle" 20 settled "$long"
  expect_done "$long"
  assert_eq "the task that ran during the swap finished on" "$(row "$long" "result->>'v'")" 1
  assert_eq "result of a second task on v2" "$(_task '{}')" "2,m1"

  # A module under --lua-path changes: the script is reloaded with it, as a new version (the
  # version is a SHA-256 over the script and the modules it loaded).
  local before
  _put "$lib/hsmod.lua" sed 's/"m1"/"m2"/' "$API/hsmod.lua"
  local v2m
  v2m=$(_version_hash 2)
  [[ $v2m =~ ^[0-9a-f]{64}$ && $v2m != "$v2" ]] || fail "a changed module kept the version: $v2 $v2m"
  wait_for "the module change to reload" 10 log_has A "slots load version $v2m between tasks"
  assert_eq "result after the module change" "$(_task '{}')" "2,m2"
  # Files that are not Lua do not count.
  before=$(_lines "hot swap")
  echo "notes" >"$dir/README.txt"
  echo "x" >"$lib/hsmod.lua.swp"
  assert_eq "result after non-Lua files changed" "$(_task '{}')" "2,m2"
  sleep 0.5   # past the coalescing window (200 ms): a reload would have been logged
  assert_eq "swaps after non-Lua files changed" "$(_lines "hot swap")" "$before"

  # A broken v3 is refused; v2 goes on.
  _put "$script" printf 'local leash = require "leash"\nreturn function(task)\n  if then end\nend\n'
  wait_for "v3 to be refused" 10 log_has A "hot swap (file change) refused, slots keep version $v2m"
  assert_contains "why v3 was refused" "$(grep -F "refused" "$T_TMP/A.log")" "script.lua:3:"
  assert_eq "result after the broken v3" "$(_task '{}')" "2,m2"
  assert_eq "result after the broken v3, again" "$(_task '{}')" "2,m2"

  # v4 written in place and not closed yet (no file event): SIGHUP alone makes the swap.
  local fd
  v4=$(_version_hash 4)
  [[ $v4 != "$v2m" ]] || fail "v4 hashed like v2: $v4"
  exec {fd}>"$script"
  _version_text 4 >&"$fd"
  kill -HUP "${W_PID[A]}"
  wait_for "the SIGHUP swap to v4" 10 log_has A "hot swap (SIGHUP): slots load version $v4 between tasks"
  assert_eq "result after SIGHUP with v4" "$(_task '{}')" "4,m2"
  # File changes still count after a SIGHUP: the close, then a module change.
  before=$(_lines "hot swap (file change)")
  exec {fd}>&-
  wait_for "the file change after SIGHUP (closing the script) to be seen" 10 \
    _more_lines "hot swap (file change)" "$before"
  _put "$lib/hsmod.lua" sed 's/"m1"/"m3"/' "$API/hsmod.lua"
  local v4m
  v4m=$(_version_hash 4)
  wait_for "the module change after SIGHUP to reload" 10 \
    log_has A "hot swap (file change): slots load version $v4m between tasks"
  assert_eq "result after the module change after SIGHUP" "$(_task '{}')" "4,m3"
  assert_no_sanitizer_reports
}

# ------------------------------------------------------------------------- check
# `leash check` loads a script as run does: file:line on the first line of stderr and exit 1
# for syntax errors, errors while loading or in setup, and contract errors; exit 0 and the
# version hash (of the text: stable, and new for any change) for a fit script.
case_check_reports_file_and_line() {
  local f first
  expect_exit 0 "$LEASH" check "$API/check_good.lua"
  local out
  out=$(<"$T_OUT")
  [[ $out =~ ^.*check_good\.lua:\ ok\ \(version\ [0-9a-f]{64}\)$ ]] || fail "leash check of a good script printed: $out"
  assert_eq "stderr of a good check" "$(<"$T_ERR")" ""
  expect_exit 0 "$LEASH" check "$API/check_good.lua"
  assert_eq "version hash of the same text" "$(<"$T_OUT")" "$out"
  cp "$API/check_good.lua" "$T_TMP/check_good.lua"
  mkdir -p "$T_TMP/checkmods"
  cp "$API/checkmods/util.lua" "$T_TMP/checkmods/"
  expect_exit 0 "$LEASH" check "$T_TMP/check_good.lua"
  assert_eq "version hash of the same text elsewhere" "${out##* }" "$(sed 's/.* //' "$T_OUT")"
  printf -- '-- one more line\n' >>"$T_TMP/check_good.lua"
  expect_exit 0 "$LEASH" check "$T_TMP/check_good.lua"
  [[ ${out##* } != "$(sed 's/.* //' "$T_OUT")" ]] || fail "the version hash did not change with the text"

  for f in syntax:5:"unexpected symbol near '='" runtime:4:"missing configuration" \
           setup:5:"attempt to index a nil value"; do
    local name=${f%%:*} rest=${f#*:}
    local line=${rest%%:*} want=${rest#*:}
    expect_exit 1 "$LEASH" check "$API/check_$name.lua"
    first=$(head -n1 "$T_ERR")
    assert_contains "first line of stderr for check_$name.lua" "$first" "check_$name.lua:$line:"
    assert_contains "first line of stderr for check_$name.lua" "$first" "$want"
    assert_contains "first line of stderr for check_$name.lua" "$first" "leash check:"
    assert_eq "stdout of a failed check" "$(<"$T_OUT")" ""
  done
  expect_exit 1 "$LEASH" check "$API/check_contract.lua"
  assert_contains "contract error" "$(head -n1 "$T_ERR")" "check_contract.lua: the script must return handle(task)"
  expect_exit 1 "$LEASH" check "$T_TMP/no_such_script.lua"
  assert_contains "missing script" "$(head -n1 "$T_ERR")" "no_such_script.lua"
  expect_exit 2 "$LEASH" check
  expect_exit 2 "$LEASH" check "$API/check_good.lua" extra.lua
}

# `leash check` must load a script as `leash run` would, --lua-path included: a script
# whose modules live under a --lua-path folder cannot be checked otherwise.
case_check_accepts_lua_path() {
  expect_exit 0 "$LEASH" check --lua-path "$API/lib" "$API/check_libpath.lua"
  assert_contains "leash check with --lua-path" "$(<"$T_OUT")" "ok (version"
}

t_run "$@"
