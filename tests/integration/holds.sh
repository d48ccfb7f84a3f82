#!/usr/bin/env bash
# Holds (sql/013_holds.sql): leash pause / resume of a tenant, a batch or a budget. Claims
# skip held tasks (several processes at once), never lease one, keep lanes in order across a
# pause, and pay nothing for parked work (measured on the index claims read). The fixture is
# the scheduler's (tests/fixtures/scheduler/record.lua: one execs row per execution).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"

REC=$LEASH_SRC/tests/fixtures/scheduler/record.lua
QT=agent_work_queue

# lines N FIELDS: N JSONL lines {"payload":{"i":k}, FIELDS}.
lines() {
  local i
  for ((i = 1; i <= $1; i++)); do printf '{"payload":{"i":%d},%s}\n' "$i" "$2"; done
}

done_where() { [[ $(q "select count(*) from $QT where status <> 'done' and ($1)") == 0 ]]; }

# probe [ENQUEUE FLAGS...]: enqueues a free task and waits for it to be done, so the workers'
# claims have passed over whatever else waits (an assertion that something does not run,
# made after a claim that could have taken it, rather than after a sleep).
probe() {
  local id
  id=$("$LEASH" enqueue "$@" '{"probe":true}') || fail "probe enqueue failed"
  wait_for "the probe task $id to run" 30 q_true "select status = 'done' from $QT where id = $id"
}

# ---------------------------------------------------------------- scopes

# A paused batch is skipped by two processes while another batch drains; none of its tasks is
# ever leased; resumed, it runs at once.
case_a_paused_batch_is_skipped_by_every_process_until_resumed() {
  need_pg
  run_setup
  expect_exit 0 "$LEASH" pause --batch held --reason "wrong prompt"
  assert_eq "pause says so" "$(<"$T_OUT")" "paused batch held until resumed"
  lines 60 '"batch":"held"' >"$T_TMP/a.jsonl"
  lines 60 '"batch":"free"' >>"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 120
  start_worker w1 "$REC" --concurrency 4
  start_worker w2 "$REC" --concurrency 4
  wait_for "the free batch to drain" 60 done_where "batch = 'free'"
  probe --batch free
  probe --batch free
  assert_eq "no held task was ever leased" \
    "$(q "select count(*) from $QT where batch = 'held' and (attempts > 0 or status <> 'pending')")" 0
  expect_exit 0 "$LEASH" pause --list
  assert_contains "list shows the hold and its pending tasks" "$(<"$T_OUT")" "held"
  assert_contains "list shows the reason" "$(<"$T_OUT")" "wrong prompt"
  expect_exit 0 "$LEASH" resume --batch held
  assert_eq "resume says so" "$(<"$T_OUT")" "resumed batch held"
  wait_for "the held batch to run after resume" 60 done_where "batch = 'held'"
  assert_eq "each task ran once" "$(q "select count(*) from execs")" 122
  expect_exit 0 "$LEASH" resume --batch held
  assert_eq "resume of a scope not paused" "$(<"$T_OUT")" "batch held was not paused"
}

# A paused tenant drops out of the claims' ring; the others share the slots.
case_a_paused_tenant_is_skipped_and_the_others_run() {
  need_pg
  run_setup
  expect_exit 0 "$LEASH" pause --tenant acme
  lines 30 '"tenant_id":"acme"' >"$T_TMP/a.jsonl"
  lines 30 '"tenant_id":"beta"' >>"$T_TMP/a.jsonl"
  lines 30 '"tenant_id":"gamma"' >>"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 90
  start_worker w1 "$REC" --concurrency 3
  start_worker w2 "$REC" --concurrency 3
  wait_for "beta and gamma to drain" 60 done_where "tenant_id <> 'acme'"
  assert_eq "acme's tasks all wait, unleased" \
    "$(q "select count(*) from $QT where tenant_id = 'acme' and status = 'pending' and attempts = 0")" 30
  assert_eq "acme's heads are parked" \
    "$(q "select count(*) from $QT where tenant_id = 'acme' and is_head and parked")" 30
  expect_exit 0 "$LEASH" resume --tenant acme
  wait_for "acme to run after resume" 60 done_where "true"
}

# A pause with an end lifts itself at the first claim after it: nothing ran before it ended,
# everything after.
case_a_pause_with_an_end_lifts_itself() {
  need_pg
  run_setup
  expect_exit 0 "$LEASH" pause --budget llm --for 3s
  lines 10 '"budget":"llm"' >"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 10
  local until
  until=$(q "select until from agent_work_queue_holds where kind = 'budget' and scope = 'llm'")
  start_worker w1 "$REC" --concurrency 2
  wait_for "the tasks to run after the pause ends" 60 done_where "true"
  assert_eq "none started before the pause ended" \
    "$(q "select count(*) from execs where started < '$until'::timestamptz")" 0
  assert_eq "the hold is gone" "$(q "select count(*) from agent_work_queue_holds")" 0
  assert_eq "nothing is left parked" "$(q "select count(*) from $QT where parked")" 0
}

# A budget paused by a task (leash.budget.pause, as a provider's refusal does) holds every
# task that carries that budget: other processes do not claim them.
case_a_budget_paused_by_a_task_holds_the_tasks_that_carry_it() {
  need_pg
  run_setup
  cat >"$T_TMP/pauser.lua" <<'LUA'
local leash = require "leash"
return function(task)
  if task.payload.pause then leash.budget.pause("openai", 3600, "quota") end
  leash.db.query("insert into execs (task_id, attempt, worker) values ($1, $2, $3)",
    task.id, task.attempt, task.worker_id)
  return true
end
LUA
  expect_exit 0 "$LEASH" enqueue '{"pause":true}'
  start_worker w1 "$T_TMP/pauser.lua" --concurrency 2
  wait_for "the pausing task to run" 30 done_where "true"
  lines 20 '"budget":"openai"' >"$T_TMP/a.jsonl"
  lines 5 '"budget":"other"' >>"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 25
  start_worker w2 "$T_TMP/pauser.lua" --concurrency 2
  wait_for "the other budget's tasks to run" 30 done_where "budget = 'other'"
  assert_eq "the paused budget's tasks wait, unleased and parked" \
    "$(q "select count(*) from $QT where budget = 'openai' and status = 'pending' and attempts = 0 and parked")" 20
  expect_exit 0 "$LEASH" budget resume openai
  wait_for "them to run after resume" 30 done_where "true"
}

# ---------------------------------------------------------------- lanes and escapes

# A lane keeps its order across a pause: a free task behind a held one in the same shard
# waits for it (it is not its lane's head), and runs after it once resumed.
case_a_lane_keeps_its_order_across_a_pause() {
  need_pg
  run_setup
  expect_exit 0 "$LEASH" pause --batch held
  printf '%s\n' '{"payload":{"n":1},"shard_key":"lane","batch":"held"}' \
                '{"payload":{"n":2},"shard_key":"lane","batch":"free"}' \
                '{"payload":{"n":3},"shard_key":"solo","batch":"free"}' >"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 3
  start_worker w1 "$REC" --concurrency 2
  wait_for "the solo task to run" 30 done_where "shard_key = 'solo'"
  probe
  assert_eq "the lane waits behind its held head" \
    "$(q "select string_agg(status, ',' order by id) from $QT where shard_key = 'lane'")" "pending,pending"
  expect_exit 0 "$LEASH" resume --batch held
  wait_for "the lane to run" 30 done_where "true"
  assert_eq "in lane order" \
    "$(q "select string_agg(q.payload->>'n', ',' order by e.started) from execs e join $QT q on q.id = e.task_id where q.shard_key = 'lane'")" "1,2"
}

# The hand-over parks: a held task that becomes its lane's head when the task before it
# settles is parked by the trigger, and not run.
case_a_held_task_handed_its_lane_is_parked() {
  need_pg
  run_setup
  expect_exit 0 "$LEASH" pause --batch held
  printf '%s\n' '{"payload":{"first":1},"shard_key":"lane","batch":"free"}' \
                '{"payload":{},"shard_key":"lane","batch":"held"}' >"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 2
  start_worker w1 "$REC" --concurrency 2
  wait_for "the first task to run" 30 done_where "batch = 'free'"
  wait_for "the held task to be the lane's parked head" 10 q_true \
    "select is_head and parked and status = 'pending' and attempts = 0 from $QT where batch = 'held'"
  expect_exit 0 "$LEASH" resume --batch held
  wait_for "it to run after resume" 30 done_where "true"
}

# The lease statement checks holds itself: a held head that escaped parking (set by hand
# here, as a hand-over racing the hold's parking would leave it) is not leased, and is parked
# by the claim that found it.
case_no_held_task_is_leased_even_when_not_parked() {
  need_pg
  run_setup
  expect_exit 0 "$LEASH" pause --tenant acme
  lines 5 '"tenant_id":"acme"' >"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 5
  q "update $QT set parked = false" >/dev/null
  start_worker w1 "$REC" --concurrency 2
  wait_for "the claim to park the escaped heads" 20 q_true \
    "select count(*) = 5 from $QT where parked"
  assert_eq "none was leased" "$(q "select count(*) from $QT where attempts > 0")" 0
  # A batch-scoped worker reads rows, not heads: the lease statement stops it too.
  lines 3 '"batch":"b2","tenant_id":"acme"' >"$T_TMP/b.jsonl"
  enqueue_file "$T_TMP/b.jsonl" 3
  start_worker w2 "$REC" --concurrency 2 --batch b2
  probe --batch b2
  assert_eq "a batch-scoped claim leases nothing held" \
    "$(q "select count(*) from $QT where batch = 'b2' and tenant_id = 'acme' and attempts > 0")" 0
}

# Parked work costs the claims nothing: with 20,000 parked heads in a tenant, draining 200
# runnable tasks of the same tenant reads, per scan of heads_ready_idx (the claims' only heads
# index), a tenth of what a claim would read if it saw the parked heads (pg_stat_user_indexes:
# entries read over scans). What a scan does read is the runnable heads and the dead entries
# the leases left behind, at most a few hundred; how many scans there are depends on the
# machine (a slow one makes many small claims: one CI run's total was 31,001, where six local
# runs read ~800), so the bound is per scan.
case_parked_work_is_out_of_the_claims_index() {
  need_pg
  run_setup
  expect_exit 0 "$LEASH" pause --batch parked
  lines 20000 '"batch":"parked"' >"$T_TMP/a.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 20000
  lines 200 '"batch":"free"' >"$T_TMP/b.jsonl"
  enqueue_file "$T_TMP/b.jsonl" 200
  assert_eq "the parked heads are out of the claims' index" \
    "$(q "select count(*) from $QT where is_head and not parked")" 200
  q "select pg_stat_reset()" >/dev/null
  start_worker w1 "$REC" --concurrency 4
  wait_for "the free tasks to run" 60 done_where "batch = 'free'"
  wait_for "the statistics to arrive" 10 q_true \
    "select idx_scan > 0 from pg_stat_user_indexes where indexrelname = 'agent_work_queue_heads_ready_idx'"
  local read scans
  read=$(q "select idx_tup_read from pg_stat_user_indexes where indexrelname = 'agent_work_queue_heads_ready_idx'")
  scans=$(q "select idx_scan from pg_stat_user_indexes where indexrelname = 'agent_work_queue_heads_ready_idx'")
  echo "# heads_ready_idx: $read entries read in $scans scans" >&2
  (( read < 2000 * scans )) || fail "the claims read $read entries of heads_ready_idx in $scans scans for 200 tasks beside 20,000 parked"
}

# ---------------------------------------------------------------- bad input

case_bad_pause_arguments_are_refused_with_one_line() {
  need_pg
  run_setup
  local bad
  for bad in "" "--tenant" "--tenant a --batch b" "--tenant a --for 0s" "--tenant a --for -1m" \
             "--tenant a --for 2y" "--tenant a --for soon" "--list --tenant a" "--json" \
             "--tenant a extra" "--budget"; do
    # shellcheck disable=SC2086 # word splitting is the point
    expect_exit 2 "$LEASH" pause $bad
  done
  expect_exit 2 "$LEASH" pause --tenant ""
  expect_exit 2 "$LEASH" pause --batch "$(printf '%0513d' 0)"
  expect_exit 2 "$LEASH" pause --budget "$(printf '%0201d' 0)"
  expect_exit 2 "$LEASH" pause --tenant a --reason "$(printf '%0301d' 0)"
  expect_exit 2 "$LEASH" resume --tenant a --for 1s
  expect_exit 2 "$LEASH" resume
  assert_eq "nothing was held" "$(q "select count(*) from agent_work_queue_holds")" 0
  # Names are data: quotes, control characters and SQL round-trip exactly.
  local evil
  evil=$(printf "x'; drop table execs; --\n\x1b[31m")
  expect_exit 0 "$LEASH" pause --tenant "$evil"
  assert_eq "the name round-trips" "$(q "select scope = E'x''; drop table execs; --\\n\\x1b[31m' from agent_work_queue_holds")" t
  expect_exit 0 "$LEASH" pause --list
  assert_not_contains "control characters do not reach the terminal" "$(<"$T_OUT")" $'\x1b'
  expect_exit 0 "$LEASH" resume --tenant "$evil"
  assert_eq "resumed" "$(q "select count(*) from agent_work_queue_holds")" 0
}

t_run "$@"
