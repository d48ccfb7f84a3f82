#!/usr/bin/env bash
# Provider budgets (sql/014_budgets.sql, src/api_budget.c, src/provider.c) end to end: several
# `leash run` processes against scripts/mock_llm.py over loopback, sharing budgets through
# the database. Every promise is checked from outside the budget's own bookkeeping: calls as
# the fixture recorded them (tests/fixtures/budget/call.lua: the server clock after each
# answer) and the mock's own counts.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
# shellcheck source=tests/integration/mock_common.sh
source "$(dirname "$0")/mock_common.sh"

BFIX=$LEASH_SRC/tests/fixtures/budget/call.lua

# budget_setup: a fresh migrated database with the fixture's tables.
budget_setup() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  q "create table calls (task_id bigint, attempt int, status int,
                         at timestamptz not null default clock_timestamp());
     create table spans (task_id bigint, t0 float8, t1 float8)" >/dev/null
}

# jobs N PAYLOAD_JSON_FIELDS [LINE_FIELDS]: N JSONL lines whose payload is {"url":
# MOCK, "prompt": "p<i>", FIELDS}.
jobs() {
  local i
  for ((i = 1; i <= $1; i++)); do
    printf '{"payload":{"url":"%s","prompt":"p%d","model":"m"%s}%s}\n' "$MOCK" "$i" "${2:+,$2}" "${3:+,$3}"
  done
}

# metric PORT SERIES: a worker's /metrics value of SERIES (exact, labels included), or 0.
metric() {
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n { v = $2 } END { print v + 0 }'
}

all_done() { [[ $(q "select count(*) from agent_work_queue where status <> 'done'") == 0 ]]; }

# ---------------------------------------------------------------- shared limits

# Three processes share rpm 20 per 2 s: 90 calls take at least four windows (all at once,
# each process on its own, they would take one), and no window of the answers holds more
# than 20 (measured on the answers' server clock, with a 0.5 s margin for their latency).
case_an_rpm_limit_is_shared_by_three_processes() {
  need_pg
  budget_setup
  start_mock
  expect_exit 0 "$LEASH" budget set mock --rpm 20 --window 2s
  jobs 90 '"budget":"mock","tokens":10' >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 90
  local w
  for w in w1 w2 w3; do start_worker "$w" "$BFIX" --concurrency 4; done
  wait_for "every task to be done" 120 all_done
  assert_eq "every call answered 200" "$(q "select count(*) from calls where status = 200")" 90
  assert_eq "no attempt was spent on waiting" "$(q "select max(attempts) from agent_work_queue")" 1
  local span
  span=$(q "select extract(epoch from max(at) - min(at)) >= 7.5 from calls")
  assert_eq "90 calls at 20 per 2 s take four windows (first to last answer >= 7.5 s)" "$span" t
  local worst
  worst=$(q "select max(n) from (select (select count(*) from calls d
                                           where d.at > c.at - interval '1.5 seconds'
                                             and d.at <= c.at) n from calls c) x")
  (( worst <= 20 )) || fail "a 1.5 s window of answers held $worst calls; the budget allows 20 per 2 s"
  assert_eq "every process made calls" \
    "$(q "select count(distinct e.lease_owner) from agent_work_queue e")" 3
  assert_eq "the mock saw 90 calls and no refusal" \
    "$(mock_stat answers /v1/chat/completions 200)/$(mock_stat answers /v1/chat/completions 429)" "90/0"
}

# concurrency 2 across two processes of 4 slots: the blocks (leash.budget.hold, 0.3 s each)
# never overlap more than two at a time, by the tasks' own clocks.
case_a_concurrency_limit_is_shared_by_two_processes() {
  need_pg
  budget_setup
  start_mock
  expect_exit 0 "$LEASH" budget set gpu --concurrency 2
  jobs 16 '"budget":"gpu","hold":true,"hold_sleep":0.3' >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 16
  start_worker w1 "$BFIX" --concurrency 4
  start_worker w2 "$BFIX" --concurrency 4
  wait_for "every task to be done" 120 all_done
  local most
  # Most blocks in flight at once: at each block's start, the blocks running then.
  most=$(q "select max(n) from (select (select count(*) from spans d
                                          where d.t0 <= s.t0 and d.t1 > s.t0) n
                                  from spans s) x")
  assert_eq "spans recorded" "$(q "select count(*) from spans")" 16
  (( most <= 2 )) || fail "$most blocks overlapped; the budget allows 2 in flight"
  (( most == 2 )) || fail "the blocks never ran two at a time (most $most): the test proves nothing"
  assert_eq "nothing left in flight" \
    "$(q "select count(*) from agent_work_queue_budget_calls where not released")" 0
}

# A process killed in the middle of a budgeted block does not keep its share of the budget:
# its call stops counting as in flight once its lease is gone (reaped), long before the
# call's own hold (an hour and more for a block without a task timeout) would run out.
case_a_killed_process_gives_back_its_calls_in_flight() {
  need_pg
  budget_setup
  start_mock
  expect_exit 0 "$LEASH" budget set one --concurrency 1
  jobs 1 '"budget":"one","hold":true,"hold_sleep":600' '"max_attempts":1' >"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 1
  start_worker w1 "$BFIX" --concurrency 1 --visibility 2s --heartbeat 500ms
  wait_for "w1 to hold the budget's one call" 30 q_true \
    "select count(*) = 1 from agent_work_queue_budget_calls where budget = 'one' and not released"
  kill -KILL "${W_PID[w1]}"
  jobs 1 '"budget":"one","hold":true' >"$T_TMP/b.jsonl"
  enqueue_file "$T_TMP/b.jsonl" 1
  start_worker w2 "$BFIX" --concurrency 1 --visibility 2s --heartbeat 500ms
  wait_for "the second task to get the budget" 30 q_true \
    "select status = 'done' and attempts = 1 from agent_work_queue where id = 2"
  assert_eq "the killed call was never released: its lease, not its hold, freed it" \
    "$(q "select count(*) from agent_work_queue_budget_calls
           where budget = 'one' and not released and hold_until > now() + interval '30 minutes'")" 1
  # Its lease stopped counting when it ran out; the reaper writes it dead a moment later.
  wait_for "the killed task to be reaped dead (its one attempt spent by the crash)" 30 q_true \
    "select status = 'dead' from agent_work_queue where id = 1"
}

# ---------------------------------------------------------------- pauses

# A refusal pauses the budget for the fleet and spends no attempt: with half the mock's
# answers 429 (Retry-After: 1), two processes finish every task at its first attempt, each
# call is sent again after the pause, and the budget counts the refusals the mock made.
case_a_429_pauses_the_budget_and_spends_no_attempt() {
  need_pg
  budget_setup
  start_mock --rate-429 0.5 --seed 11
  jobs 30 '"budget":"llm","tokens":5' >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 30
  local p1 p2
  p1=$(free_port)
  start_worker w1 "$BFIX" --concurrency 3 --metrics "127.0.0.1:$p1"
  p2=$(free_port)
  [[ $p2 != "$p1" ]] || p2=$((p1 + 1))
  start_worker w2 "$BFIX" --concurrency 3 --metrics "127.0.0.1:$p2"
  wait_for "every task to be done" 120 all_done
  local m_refused m_grants
  m_refused=$(( $(metric "$p1" 'leash_budget_refused_total{budget="llm"}') + $(metric "$p2" 'leash_budget_refused_total{budget="llm"}') ))
  m_grants=$(( $(metric "$p1" 'leash_budget_grants_total{budget="llm"}') + $(metric "$p2" 'leash_budget_grants_total{budget="llm"}') ))
  local refused mock429
  refused=$(q "select refused from agent_work_queue_budgets where name = 'llm'")
  mock429=$(mock_stat answers /v1/chat/completions 429)
  (( mock429 > 0 )) || fail "the mock refused nothing: the test proves nothing"
  assert_eq "the budget counted every refusal" "$refused" "$mock429"
  assert_eq "the workers' metrics counted every refusal" "$m_refused" "$mock429"
  assert_eq "the workers' metrics counted a grant per call the mock saw" "$m_grants" \
    "$(( $(mock_stat answers /v1/chat/completions 200) + mock429 ))"
  assert_eq "the script saw only 200s" "$(q "select count(*) from calls where status <> 200")" 0
  assert_eq "every task done at its first attempt" \
    "$(q "select count(*) from agent_work_queue where status = 'done' and attempts = 1")" 30
}

# A pause (leash budget pause, or one task's leash.budget.pause) holds every process's calls
# of that budget until it ends; calls of another budget keep flowing through it.
case_a_pause_stops_that_budget_everywhere_and_no_other() {
  need_pg
  budget_setup
  start_mock
  expect_exit 0 "$LEASH" budget pause slow --for 3s --reason "maintenance window"
  expect_exit 0 "$LEASH" budget show slow
  assert_contains "show says paused" "$(<"$T_OUT")" "paused"
  assert_contains "show gives the reason" "$(<"$T_OUT")" "maintenance window"
  jobs 6 '"budget":"slow"' >"$T_TMP/jobs.jsonl"
  jobs 20 '"budget":"fast"' >>"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 26
  local t0
  t0=$(q "select extract(epoch from paused_until) from agent_work_queue_budgets where name = 'slow'")
  start_worker w1 "$BFIX" --concurrency 4
  start_worker w2 "$BFIX" --concurrency 4
  wait_for "every task to be done" 120 all_done
  local early
  early=$(q "select count(*) from calls c join agent_work_queue q on q.id = c.task_id
              where q.payload->>'budget' = 'slow' and extract(epoch from c.at) < $t0")
  assert_eq "no call of the paused budget was answered during the pause" "$early" 0
  local fast_first
  fast_first=$(q "select count(*) from calls c join agent_work_queue q on q.id = c.task_id
                   where q.payload->>'budget' = 'fast' and extract(epoch from c.at) < $t0")
  (( fast_first == 20 )) || fail "only $fast_first of 20 calls of the other budget ran during the pause"
}

# A pause longer than --budget-wait is not waited in the slot: the task yields (cause
# budget, runnable again when the pause ends) and the slot runs other work meanwhile.
case_a_pause_longer_than_budget_wait_gives_the_slot_back() {
  need_pg
  budget_setup
  start_mock
  expect_exit 0 "$LEASH" budget pause later --for 4s
  jobs 2 '"budget":"later"' >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 2
  start_worker w1 "$BFIX" --concurrency 1 --budget-wait 1s
  wait_for "both tasks to yield" 30 q_true \
    "select count(*) = 2 from agent_work_queue where status = 'pending' and last_cause = 'budget'
        and run_after > now() + interval '2 seconds'"
  # One slot, both tasks parked: other work runs at once.
  jobs 3 >"$T_TMP/more.jsonl"
  enqueue_file "$T_TMP/more.jsonl" 3
  wait_for "the unbudgeted tasks to run while the budget is paused" 10 q_true \
    "select count(*) = 3 from agent_work_queue where status = 'done' and payload->>'budget' is null"
  assert_eq "the parked tasks still wait" \
    "$(q "select count(*) from agent_work_queue where payload->>'budget' = 'later' and status = 'pending'")" 2
  wait_for "the parked tasks to run after the pause" 30 all_done
  assert_contains "the yield names the budget" \
    "$(q "select string_agg(last_error, ' ') from agent_work_queue where payload->>'budget' = 'later'")" \
    "budget 'later' (paused: "
}

# The yield is the host's: a script that catches it with pcall (or xpcall, or inside a
# coroutine) and answers ok still gives its slot back, with cause budget.
case_a_script_cannot_swallow_the_yield() {
  need_pg
  budget_setup
  start_mock
  expect_exit 0 "$LEASH" budget pause held --for 1h
  local variants=(
    'local ok = pcall(leash.http.request, {url = MOCK, budget = "held"}) return leash.ok{caught = not ok}'
    'local ok = xpcall(function() return leash.budget.hold("held", {}, function() end) end, debug and debug.traceback or tostring) return leash.ok()'
    'local co = coroutine.wrap(function() return pcall(leash.http.request, {url = MOCK, budget = "held"}) end) co() return leash.ok()'
    'for i = 1, 3 do pcall(leash.http.request, {url = MOCK, budget = "held"}) end return leash.ok()'
  )
  local i=0 v
  for v in "${variants[@]}"; do
    i=$((i + 1))
    printf 'local leash = require "leash"\nlocal MOCK = "%s"\nreturn function() %s end\n' \
      "$MOCK/v1/chat/completions" "$v" >"$T_TMP/swallow$i.lua"
    q "delete from agent_work_queue" >/dev/null
    expect_exit 0 "$LEASH" enqueue '{}'
    start_worker "w$i" "$T_TMP/swallow$i.lua" --concurrency 1 --budget-wait 0
    wait_for "variant $i to yield" 20 q_true \
      "select status = 'pending' and last_cause = 'budget' and run_after > now() + interval '50 minutes'
         from agent_work_queue"
    kill -TERM "${W_PID[w$i]}"
    assert_worker_exit "w$i" 30 0
  done
  assert_eq "the mock got no call" "$(mock_stat answers /v1/chat/completions 200)" 0
}

# A window used up for a while holds the tasks that carry the budget (source window): claims
# leave them pending and parked instead of taking them to wait in a slot, other work gets the
# slots, and they run once the window has room, still within the limit.
case_a_full_window_holds_the_budgets_tasks_out_of_the_claims() {
  need_pg
  budget_setup
  start_mock
  expect_exit 0 "$LEASH" budget set slow --rpm 2 --window 8s
  jobs 6 '"budget":"slow"' '"budget":"slow"' >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 6
  start_worker w1 "$BFIX" --concurrency 4
  wait_for "the window to hold the budget's tasks" 30 q_true \
    "select count(*) = 1 from agent_work_queue_holds where kind = 'budget' and scope = 'slow' and source = 'window'"
  wait_for "the budget's pending tasks to be parked" 10 q_true \
    "select count(*) > 0 and bool_and(parked) from agent_work_queue where status = 'pending' and is_head"
  jobs 3 >"$T_TMP/free.jsonl"
  enqueue_file "$T_TMP/free.jsonl" 3
  wait_for "other work to run while the window is full" 20 q_true \
    "select count(*) = 3 from agent_work_queue where budget is null and status = 'done'"
  assert_eq "and the budget's tasks still wait" \
    "$(q "select count(*) > 0 from agent_work_queue where budget = 'slow' and status = 'pending'")" t
  wait_for "every task to be done" 90 all_done
  local worst
  worst=$(q "select max(n) from (select (select count(*) from calls d join agent_work_queue t on t.id = d.task_id
                                           where t.budget = 'slow' and d.at > c.at - interval '7.5 seconds'
                                             and d.at <= c.at) n
                                  from calls c join agent_work_queue t on t.id = c.task_id
                                 where t.budget = 'slow') x")
  (( worst <= 2 )) || fail "$worst calls of budget slow in 7.5 s; it allows 2 per 8 s"
  assert_eq "no attempt was spent" "$(q "select max(attempts) from agent_work_queue")" 1
}

# ---------------------------------------------------------------- usage

# Tokens: the answer's usage (the mock reports prompt + completion tokens), or what
# leash.usage says inside a hold, replace the estimate.
case_usage_from_answers_and_leash_usage_is_counted() {
  need_pg
  budget_setup
  start_mock
  jobs 4 '"budget":"u1","tokens":1000' >"$T_TMP/jobs.jsonl"
  jobs 3 '"budget":"u2","tokens":1000,"hold":true,"usage":7' >>"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 7
  start_worker w1 "$BFIX" --concurrency 2
  wait_for "every task to be done" 60 all_done
  local per_call
  per_call=$(python3 - "$MOCK" <<'PY'
import json, sys, urllib.request
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "p1"}]}).encode()
r = json.load(urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/v1/chat/completions", body, {"content-type": "application/json"}), timeout=10))
u = r["usage"]
print(u.get("total_tokens", u.get("prompt_tokens", 0) + u.get("completion_tokens", 0)))
PY
)
  (( per_call > 0 && per_call < 1000 )) || fail "the mock's usage per call is $per_call"
  local u1
  u1=$(q "select tokens from agent_work_queue_budgets where name = 'u1'")
  (( u1 < 4000 )) || fail "u1 counted $u1 tokens: the estimates (4 x 1000), not the answers' usage"
  (( u1 >= 4 )) || fail "u1 counted $u1 tokens"
  assert_eq "leash.usage inside a hold replaces the estimate" \
    "$(q "select tokens from agent_work_queue_budgets where name = 'u2'")" 21
  expect_exit 0 "$LEASH" budget show --json
  assert_contains "show --json lists both" "$(<"$T_OUT")" '"name":"u2"'
}

# ---------------------------------------------------------------- spend

# A spend cap stops its batch after the call that crossed it: with one slot, no task of the
# batch starts after it (the rest wait, parked, unleased); another batch keeps running;
# raising the cap resumes the batch at once.
case_a_spend_cap_stops_its_batch_and_raising_it_resumes() {
  need_pg
  budget_setup
  start_mock
  expect_exit 0 "$LEASH" spend price m --input 1000000 --output 1000000   # 1 per token
  expect_exit 0 "$LEASH" spend cap --batch capped 20
  assert_eq "cap set" "$(<"$T_OUT")" "batch capped: cap 20, spent 0.0000"
  jobs 12 '"budget":"llm"' '"batch":"capped"' >"$T_TMP/jobs.jsonl"
  enqueue_file "$T_TMP/jobs.jsonl" 12
  start_worker w1 "$BFIX" --concurrency 1
  wait_for "the cap to pause the batch" 60 q_true \
    "select count(*) = 1 from agent_work_queue_holds where kind = 'batch' and scope = 'capped' and source = 'spend'"
  jobs 3 '"budget":"llm"' '"batch":"other"' >"$T_TMP/more.jsonl"
  enqueue_file "$T_TMP/more.jsonl" 3
  wait_for "the other batch to run" 60 q_true \
    "select count(*) = 0 from agent_work_queue where batch = 'other' and status <> 'done'"
  local calls done_n spent before_last
  calls=$(q "select count(*) from agent_work_queue_usage where batch = 'capped'")
  done_n=$(q "select count(*) from agent_work_queue where batch = 'capped' and status = 'done'")
  assert_eq "every call of the batch was a task that finished" "$calls" "$done_n"
  spent=$(q "select spent >= 20 from agent_work_queue_spend where kind = 'batch' and scope = 'capped'")
  assert_eq "the spend reached the cap" "$spent" t
  before_last=$(q "select sum(cost) - (array_agg(cost order by id desc))[1] < 20
                     from agent_work_queue_usage where batch = 'capped'")
  assert_eq "no call of the batch was made after the one that crossed the cap" "$before_last" t
  assert_eq "the rest wait unleased" \
    "$(q "select count(*) from agent_work_queue where batch = 'capped' and status = 'pending' and attempts = 0")" \
    "$((12 - done_n))"
  expect_exit 0 "$LEASH" status
  assert_contains "status says why" "$(<"$T_OUT")" "paused   batch capped by spend"
  expect_exit 0 "$LEASH" spend cap --batch capped 100000
  wait_for "the batch to resume" 60 q_true \
    "select count(*) = 0 from agent_work_queue where batch = 'capped' and status <> 'done'"
  expect_exit 0 "$LEASH" report --batch capped
  assert_contains "report sums the batch's usage" "$(<"$T_OUT")" "usage      llm/m: 12 calls"
  expect_exit 0 "$LEASH" spend show --json
  assert_contains "show has the tenant's spend" "$(<"$T_OUT")" '"kind":"tenant","scope":"default"'
  assert_contains "show has the usage by model" "$(<"$T_OUT")" '"budget":"llm","model":"m"'
}

# ---------------------------------------------------------------- bad input

case_bad_budget_arguments_are_refused_with_one_line() {
  need_pg
  budget_setup
  local bad
  for bad in "set x --rpm 0" "set x --rpm -1" "set x --rpm 1.5" "set x --tpm abc" \
             "set x --concurrency 99999999999" "set x --window 0s" "set x --window 2d" \
             "pause x" "pause x --for 0s" "pause x --for -3s" "pause x --for 25h" \
             "show x y" "frobnicate x" "set" "resume" "show --rpm 5"; do
    # shellcheck disable=SC2086 # word splitting is the point
    expect_exit 2 "$LEASH" budget $bad
    assert_eq "one line for: budget $bad" "$(grep -c . "$T_ERR")" 2   # the error and the hint
  done
  expect_exit 2 "$LEASH" budget set ""
  expect_exit 2 "$LEASH" budget set "$(printf 'a\nb')"
  expect_exit 2 "$LEASH" budget set "$(printf '%0201d' 0)"
  expect_exit 2 "$LEASH" budget resume nothing-here
  assert_eq "an unknown budget is named" "$(<"$T_ERR")" "leash budget: no budget named 'nothing-here'"
  assert_eq "nothing was written" "$(q "select count(*) from agent_work_queue_budgets")" 0
  expect_exit 0 "$LEASH" budget set x --rpm 5 --tpm none --window 1s
  assert_eq "set" "$(<"$T_OUT")" "budget x: rpm 5, tpm none, concurrency none, window 1 s"
  expect_exit 0 "$LEASH" budget set x --concurrency 3
  assert_eq "set keeps what it is not given" "$(<"$T_OUT")" \
    "budget x: rpm 5, tpm none, concurrency 3, window 1 s"
  expect_exit 0 "$LEASH" budget delete x
  expect_exit 2 "$LEASH" budget show x
  for bad in "cap 5" "cap --batch b" "cap --batch b -1" "cap --batch b 1e3" "cap --batch b abc" \
             "cap --batch b --tenant t 5" "price m" "price m --input 1" "price m --input -1 --output 1" \
             "price m --input 1 --output 1 --delete" "show x" "show --tenant t" "spent"; do
    # shellcheck disable=SC2086 # word splitting is the point
    expect_exit 2 "$LEASH" spend $bad
  done
  expect_exit 2 "$LEASH" spend price m --delete
  assert_eq "nothing was written by spend" \
    "$(q "select (select count(*) from agent_work_queue_spend) + (select count(*) from agent_work_queue_prices)")" 0
}

# A script's bad budget arguments fail its task (script_error), never the process.
case_bad_budget_calls_fail_the_task_not_the_process() {
  need_pg
  budget_setup
  start_mock
  local variants=(
    'leash.http.request{url = MOCK, budget = ""}'
    'leash.http.request{url = MOCK, budget = ("x"):rep(201)}'
    'leash.http.request{url = MOCK, budget = "a\nb"}'
    'leash.http.request{url = MOCK, budget = {}}'
    'leash.http.request{url = MOCK, budget = "b", tokens = -1}'
    'leash.http.request{url = MOCK, budget = "b", tokens = 1.5}'
    'leash.http.request{url = MOCK, budget = "b", tokens = "many"}'
    'leash.budget.hold("b", {tokens = -5}, function() end)'
    'leash.budget.hold("b", nil, "not a function")'
    'leash.budget.pause("b", 0/0)'
    'leash.budget.pause("b", -1)'
    'leash.budget.pause("b", math.huge)'
    'leash.usage{tokens = 5}'
    'leash.budget.hold("b", {}, function() leash.usage{tokens = -1} end)'
    'leash.budget.hold("b", {}, function() leash.usage{} end)'
  )
  local i=0 v
  for v in "${variants[@]}"; do
    i=$((i + 1))
    printf 'local leash = require "leash"\nlocal MOCK = "%s"\nreturn function() %s return leash.ok() end\n' \
      "$MOCK" "$v" >"$T_TMP/bad$i.lua"
    q "delete from agent_work_queue" >/dev/null
    expect_exit 0 "$LEASH" enqueue --max-attempts 1 '{}'
    expect_exit 0 "$LEASH" run "$T_TMP/bad$i.lua" --until-empty --concurrency 1
    assert_eq "variant $i ($v): the task failed as a script error" \
      "$(q "select status || '/' || last_cause from agent_work_queue")" "dead/script_error"
  done
  assert_eq "no budget was paused by a refused call" \
    "$(q "select count(*) from agent_work_queue_budgets where paused_until > now()")" 0
}

t_run "$@"
