#!/usr/bin/env bash
# Provider batch offload (issue #19, item 2; sql/020_llm_batch.sql, src/llm_batch.c,
# src/api_llm.c, README "Provider batches"): leash.llm.batch inside a step stores an item and
# ends the execution waiting; the fleet's one batcher sends items to the mock's batch API
# (scripts/mock_llm.py), polls, writes the answers and wakes the tasks, whose next execution
# gets the answer from the step. Every case runs the real host against
# tests/fixtures/llm_batch/ask.lua and the mock over loopback.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
# shellcheck source=tests/integration/mock_common.sh
source "$(dirname "$0")/mock_common.sh"
AFIX=$LEASH_SRC/tests/fixtures/llm_batch/ask.lua
QT=agent_work_queue
IT=${QT}_llm_items
BT=${QT}_llm_batches

lb_setup() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  q "create table entered (task_id bigint not null, at timestamptz not null default now())" >/dev/null
}

# enqueue_n N [JSON FIELDS]: N tasks {"n": i, FIELDS}, i = 1..N.
enqueue_n() {
  local n=$1 extra=${2:-} i
  for ((i = 1; i <= n; i++)); do
    printf '{"payload": {"n": %d%s}}\n' "$i" "${extra:+, $extra}"
  done | "$LEASH" enqueue --file - >/dev/null || fail "enqueue failed"
}

# The batcher's flags for the mock: small batches soon, polled often.
batch_flags() {
  printf '%s\n' --llm-batch-url "openai=$MOCK" --llm-batch-url "anthropic=$MOCK" \
    --llm-batch-age 1 --llm-batch-poll 0.3 --poll-ms 10-50
}

# The mock's synchronous answer's content for question N (what the batch must give too).
sync_content() {
  curl -sf "$MOCK/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"mock-batch\",\"messages\":[{\"role\":\"user\",\"content\":\"question $1\"}]}" |
    jq -r '.choices[0].message.content'
}

stop_workers() {
  local w
  for w in "$@"; do kill -TERM "${W_PID[$w]}" 2>/dev/null || true; done
  for w in "$@"; do assert_worker_exit "$w" 60 0; done
  assert_no_sanitizer_reports
}

# One process, five tasks: each execution that asks ends waiting (pending, no lease, the
# attempt given back) while the mock holds the batch; one provider batch carries all five;
# every task is then done on its first attempt with the answer the synchronous endpoint
# gives for the same request, and its step ran once per execution (two: ask, then answer).
case_five_tasks_go_through_one_openai_batch_and_are_done_with_the_sync_answer() {
  lb_setup
  start_mock --batch-delay-s 4
  enqueue_n 5
  # shellcheck disable=SC2046
  start_worker A "$AFIX" --concurrency 2 $(batch_flags) --until-empty
  wait_for "all five to wait for the submitted batch, holding no lease" 60 q_true \
    "select count(*) = 5 from $QT where status = 'pending' and last_cause = 'waiting'
        and locked_until is null and attempts = 0
      and (select count(*) = 5 from $IT where state = 'submitted')"
  assert_worker_exit A 120 0
  assert_no_sanitizer_reports
  assert_eq "tasks (status|attempts)" \
    "$(q "select string_agg(distinct status || '|' || attempts, ',') from $QT")" "done|1"
  assert_eq "provider batches (count|items|state|status)" \
    "$(q "select count(*) || '|' || sum(items) || '|' || string_agg(distinct state, ',') || '|'
             || string_agg(distinct provider_status, ',') from $BT")" "1|5|ended|completed"
  assert_eq "the mock's batches" "$(mock_stat batches created)" 1
  assert_eq "the mock's synchronous calls" "$(mock_stat requests /v1/chat/completions)" 0
  local i id
  for i in 1 2 3 4 5; do
    id=$(q "select id from $QT where (payload->>'n')::int = $i")
    assert_eq "task $i's answer" "$(q "select result->>'content' from $QT where id = $id")" "$(sync_content "$i")"
    assert_eq "task $i's executions in the step" "$(q "select result->>'executions' from $QT where id = $id")" 2
    assert_eq "task $i's history" \
      "$(q "select string_agg(attempt || ':' || kind || ':' || cause, ',' order by finished_at)
              from ${QT}_attempts where task_id = $id")" "1:wait:waiting,1:done:none"
  done
  assert_eq "items (state|tries)" "$(q "select string_agg(distinct state || '|' || tries, ',') from $IT")" "done|0"
}

t_run "$@"
