#!/usr/bin/env bash
# Provider batch offload (issue #19, item 2; sql/022_llm_batch.sql, src/llm_batch.c,
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
n_hostile=0
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
  # Every pending row waiting without a time once broke the claim's next-due probe (fixed in 020).
  if log_has A "cycle failed"; then fail "a cycle failed while every task waited"; fi
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
  assert_eq "items, each handed to its task once (state|tries|answered)" \
    "$(q "select string_agg(distinct state || '|' || tries || '|' || (handed_at > answered_at), ',') from $IT")" "spent|0|true"
  # Retention (sql/023): the items and the batch go with their tasks.
  q "delete from $QT where id = (select min(id) from $QT)" >/dev/null
  assert_eq "a deleted task's item goes, its batch stays for the others (items|batches)" \
    "$(q "select (select count(*) from $IT) || '|' || (select count(*) from $BT)")" "4|1"
  expect_exit 0 "$LEASH" prune --older-than 0
  assert_eq "prune takes the rest and the ended batch (items|batches)" \
    "$(q "select (select count(*) from $IT) || '|' || (select count(*) from $BT)")" "0|0"
}

# Three processes at once, 30 tasks, batches of at most 10: exactly one process is the
# batcher (every batch row names it, the others log nothing of the kind), every item went
# to the provider in exactly one batch (the mock saw 30 items), and every task is done once.
case_three_processes_elect_one_batcher_and_every_item_is_in_exactly_one_batch() {
  lb_setup
  start_mock --batch-delay-s 1
  enqueue_n 30
  local w
  for w in A B C; do
    # shellcheck disable=SC2046
    start_worker "$w" "$AFIX" --concurrency 2 $(batch_flags) --llm-batch-max 10
  done
  wait_for "all 30 to be done" 120 q_true "select count(*) = 30 from $QT where status = 'done'"
  assert_eq "batchers named by the batches" "$(q "select count(distinct submitted_by) from $BT")" 1
  local leader
  leader=$(q "select min(submitted_by) from $BT")
  local n=0
  for w in A B C; do log_has "$w" "is the fleet's batcher" && n=$((n + 1)); done
  assert_eq "processes that led" "$n" 1
  log_has "$leader" "worker $leader is the fleet's batcher" || fail "the batches' author $leader did not log its lead"
  assert_eq "items answered, each in one batch (items|distinct tasks|batched)" \
    "$(q "select count(*) || '|' || count(distinct task_id) || '|' || count(batch_id) from $IT where answer is not null")" "30|30|30"
  assert_eq "batch sizes add up" "$(q "select sum(items) from $BT where state = 'ended'")" 30
  assert_eq "items the mock received" "$(mock_stat batches items)" 30
  assert_eq "batches the mock received = batch rows" "$(mock_stat batches created)" "$(q "select count(*) from $BT")"
  assert_eq "attempts" "$(q "select string_agg(distinct attempts::text, ',') from $QT")" 1
  assert_eq "executions that entered the step (30 asked, 30 answered)" "$(q "select count(*) from entered")" 60
  stop_workers A B C
}

# The batcher's process dies (SIGKILL) while its batch is open at the provider: another
# process takes the lead, polls the batch the dead one submitted, and every task is done;
# no item is sent again (the mock saw each once).
case_when_the_batcher_dies_another_process_takes_over_and_finishes_its_batch() {
  lb_setup
  start_mock --batch-delay-s 6
  enqueue_n 20
  # shellcheck disable=SC2046
  start_worker A "$AFIX" --concurrency 4 --visibility 5 $(batch_flags)
  wait_for "A to lead" 30 log_has A "worker A is the fleet's batcher"
  local w
  for w in B C; do
    # shellcheck disable=SC2046
    start_worker "$w" "$AFIX" --concurrency 2 --visibility 5 $(batch_flags)
  done
  wait_for "A to submit all 20 items" 60 q_true \
    "select count(*) = 20 from $IT where state = 'submitted'
      and batch_id in (select id from $BT where state = 'open' and submitted_by = 'A')"
  kill -KILL "${W_PID[A]}"
  wait_for "A to be gone" 10 exited "${W_PID[A]}"
  wait_for "B or C to lead" 60 eval 'log_has B "is the fleet'"'"'s batcher" || log_has C "is the fleet'"'"'s batcher"'
  wait_for "all 20 to be done" 120 q_true "select count(*) = 20 from $QT where status = 'done'"
  assert_eq "A's batches (state)" "$(q "select string_agg(distinct state, ',') from $BT where submitted_by = 'A'")" ended
  assert_eq "items the mock received" "$(mock_stat batches items)" 20
  assert_eq "batches the mock received" "$(mock_stat batches created)" "$(q "select count(*) from $BT")"
  assert_eq "items answered (count|tries)" \
    "$(q "select count(*) || '|' || max(tries) from $IT where answer is not null")" "20|0"
  stop_workers B C
}

# The mock fails half the items of every batch (the same ones every run): each failed item
# goes into a later batch with its cause recorded, and every task is done on its first
# attempt.
case_failed_items_go_to_a_later_batch_and_every_task_is_done_with_the_causes_recorded() {
  failed_items_case openai
}

# The same in Anthropic's shape (errored results).
case_failed_anthropic_items_go_to_a_later_batch_and_every_task_is_done() {
  failed_items_case anthropic
}

# failed_items_case PROVIDER
failed_items_case() {
  local provider=$1
  lb_setup
  start_mock --batch-delay-s 1 --batch-fail-rate 0.5
  enqueue_n 10 "\"tries\": 20, \"provider\": \"$provider\""
  # shellcheck disable=SC2046
  start_worker A "$AFIX" --concurrency 2 $(batch_flags) --until-empty
  assert_worker_exit A 180 0
  assert_no_sanitizer_reports
  assert_eq "tasks (status|attempts)" "$(q "select string_agg(distinct status || '|' || attempts, ',') from $QT")" "done|1"
  local retried
  retried=$(q "select count(*) from $IT where tries > 0")
  [[ $retried -ge 1 ]] || fail "no item failed at a fail rate of 0.5 (the mock's seed changed?)"
  assert_eq "batches: more than one" "$(q "select count(*) > 1 from $BT")" t
  assert_eq "every retried item's causes are its failures" \
    "$(q "select bool_and(cardinality(causes) = tries and causes[1] like 'item_failed: %') from $IT where tries > 0")" t
  assert_eq "items failed by the mock = tries spent" "$(mock_stat batches items_failed)" "$(q "select sum(tries) from $IT")"
  assert_eq "answers are still the sync ones (task 1)" \
    "$(q "select result->>'content' from $QT where (payload->>'n')::int = 1")" \
    "$(if [[ $provider == openai ]]; then sync_content 1; else sync_message 1; fi)"
}

# An item that fails every try (the mock's [mock:500] marker): after its tries the task's
# leash.llm.batch raises, a retry that spends an attempt; the next attempt asks afresh; past
# max_attempts the task is dead with the item's cause in its error. Its neighbour in the
# same batches is done.
case_an_item_failing_every_try_retries_its_task_and_then_the_task_is_dead_with_the_cause() {
  lb_setup
  start_mock --batch-delay-s 1
  local bad good
  bad=$("$LEASH" enqueue --max-attempts 2 '{"n": 1, "marker": " [mock:500]", "tries": 2}')
  good=$("$LEASH" enqueue '{"n": 2, "tries": 2}')
  # shellcheck disable=SC2046
  start_worker A "$AFIX" --concurrency 2 $(batch_flags) --backoff-base 1.5 --until-empty
  assert_worker_exit A 180 0
  assert_no_sanitizer_reports
  assert_eq "the bad task (status|attempts|cause)" \
    "$(q "select status || '|' || attempts || '|' || last_cause from $QT where id = $bad")" "dead|2|script_error"
  assert_contains "its error" "$(q "select last_error from $QT where id = $bad")" "failed after 2 tries: item_failed:"
  assert_eq "its items (state|tries|causes), one per attempt" \
    "$(q "select string_agg(state || '|' || tries || '|' || cardinality(causes), ',' order by id) from $IT where task_id = $bad")" \
    "spent|2|2,spent|2|2"
  assert_eq "the good task (status|attempts)" "$(q "select status || '|' || attempts from $QT where id = $good")" "done|1"
}

# A batch that expires with half its items done: the done half is answered; of the rest,
# the items whose call gave a fallback wake to it (a synchronous call: the task's result
# says so), the others go into a new batch (the mock stops expiring after the first), and
# every task is done on its first attempt with cause batch_expired recorded on its item.
case_an_expired_batch_sends_the_unanswered_to_their_fallback_or_to_a_new_batch() {
  expired_case openai
}

# The same in Anthropic's shape (expired results; the fallback calls /v1/messages).
case_an_expired_anthropic_batch_sends_the_unanswered_to_their_fallback_or_to_a_new_batch() {
  expired_case anthropic
}

# expired_case PROVIDER
expired_case() {
  local provider=$1 sync_path=/v1/chat/completions
  [[ $provider == anthropic ]] && sync_path=/v1/messages
  lb_setup
  start_mock --batch-delay-s 2 --batch-expire --batch-expire-done 0.5
  local i
  for i in 1 2 3 4 5 6 7 8 9 10; do
    if ((i % 2)); then
      "$LEASH" enqueue "{\"n\": $i, \"provider\": \"$provider\", \"fallback_url\": \"$MOCK\"}" >/dev/null
    else
      "$LEASH" enqueue "{\"n\": $i, \"provider\": \"$provider\"}" >/dev/null
    fi
  done
  # shellcheck disable=SC2046
  start_worker A "$AFIX" --concurrency 2 $(batch_flags) --until-empty
  wait_for "the first batch to be open at the provider" 60 q_true \
    "select count(*) = 1 from $BT where state = 'open' and items = 10"
  curl -sf "$MOCK/_control" -d '{"batch_expire": false}' >/dev/null || fail "control refused"
  assert_worker_exit A 180 0
  assert_no_sanitizer_reports
  assert_eq "tasks (status|attempts)" "$(q "select string_agg(distinct status || '|' || attempts, ',') from $QT")" "done|1"
  # Anthropic's batch says only "ended"; its lines say which items expired.
  assert_eq "the first batch" "$(q "select provider_status from $BT order by id limit 1")" \
    "$([[ $provider == openai ]] && echo expired || echo ended)"
  local fb rebatched
  fb=$(q "select count(*) from $IT where state = 'fallback'")
  rebatched=$(q "select count(*) from $IT where answer is not null and tries = 1")
  [[ $fb -ge 1 && $rebatched -ge 1 ]] || fail "want some items to fallback ($fb) and some to a new batch ($rebatched)"
  assert_eq "every unanswered item's cause" \
    "$(q "select string_agg(distinct last_cause, ',') from $IT where state = 'fallback' or tries > 0")" batch_expired
  assert_eq "fallback items are those that gave one" \
    "$(q "select bool_and(fallback) from $IT where state = 'fallback'")" t
  assert_eq "tasks answered by their fallback" "$(q "select count(*) from $QT where (result->>'fallback')::boolean")" "$fb"
  assert_eq "the mock's synchronous calls" "$(mock_stat requests "$sync_path")" "$fb"
  assert_eq "items answered by the mock's expired batch + the new one" \
    "$(q "select count(*) from $IT where answer is not null")" $((10 - fb))
}

# The mock's synchronous Anthropic answer's content for question N.
sync_message() {
  curl -sf "$MOCK/v1/messages" -H 'Content-Type: application/json' \
    -d "{\"model\":\"mock-batch\",\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"question $1\"}]}" |
    jq -r '.content[0].text'
}

# Anthropic's Message Batches carry the requests too, and the answers are the synchronous
# messages. Each answered item's usage is spend at batch prices (the price row's
# batch_factor, 0.5 by default) with the synchronous price kept beside it: `leash report`
# shows both, and the batch's spend is the batch-priced sum.
case_anthropic_batches_answer_and_report_shows_the_cost_at_batch_prices_beside_sync() {
  lb_setup
  start_mock --batch-delay-s 1
  q "insert into ${QT}_prices (model, input_per_mtok, output_per_mtok) values ('mock-batch', 1000, 3000)" >/dev/null
  local i
  for i in 1 2 3 4; do
    "$LEASH" enqueue --batch nightly "{\"n\": $i, \"provider\": \"anthropic\"}" >/dev/null
  done
  # shellcheck disable=SC2046
  start_worker A "$AFIX" --concurrency 2 $(batch_flags) --until-empty
  assert_worker_exit A 120 0
  assert_no_sanitizer_reports
  assert_eq "tasks (status|attempts)" "$(q "select string_agg(distinct status || '|' || attempts, ',') from $QT")" "done|1"
  assert_eq "the mock's Anthropic batches" "$(mock_stat batches by_provider anthropic created)" 1
  assert_eq "the mock's OpenAI batches" "$(mock_stat batches by_provider openai created)" 0
  for i in 1 4; do
    assert_eq "task $i's answer" \
      "$(q "select result->>'content' from $QT where (payload->>'n')::int = $i")" "$(sync_message "$i")"
  done
  assert_eq "usage rows (count|budget|batch)" \
    "$(q "select count(*) || '|' || string_agg(distinct budget, ',') || '|' || string_agg(distinct batch, ',') from ${QT}_usage")" \
    "4|llm-batch:anthropic|nightly"
  assert_eq "each cost is half its synchronous cost, both from the tokens" \
    "$(q "select bool_and(cost * 2 = sync_cost and sync_cost = (input_tokens * 1000 + output_tokens * 3000) / 1e6
                        and input_tokens > 0 and output_tokens > 0) from ${QT}_usage")" t
  local cost sync
  cost=$(q "select round(sum(cost), 6) from ${QT}_usage")
  sync=$(q "select round(sum(sync_cost), 6) from ${QT}_usage")
  assert_eq "the batch's spend" "$(q "select round(spent, 6) from ${QT}_spend where kind = 'batch' and scope = 'nightly'")" "$cost"
  assert_eq "report --json: cost and sync_cost" \
    "$("$LEASH" report --batch nightly --json | jq -r '.usage[0] | "\(.calls)|\(.cost)|\(.sync_cost)"')" \
    "4|$(jq -n "$cost")|$(jq -n "$sync")"
  assert_contains "report's text" "$("$LEASH" report --batch nightly)" \
    "llm-batch:anthropic/mock-batch: 4 calls, $(q "select sum(tokens) from ${QT}_usage") tokens, cost $(printf '%.4f' "$cost") at batch prices ($(printf '%.4f' "$sync") synchronously)"
}

# Bad calls, by class (unknown field, wrong provider, request not an object, tries and
# deadline out of range or of the wrong type, fallback not a function, outside a step, two
# in one step): a script error naming the problem, and nothing stored.
case_bad_calls_to_leash_llm_batch_are_script_errors_naming_the_problem() {
  lb_setup
  local specs=(
    '{"provider":"openai","request":{"model":"m"},"model":"x"}' 'unknown field model'
    '{"provider":"gemini","request":{"model":"m"}}'           'provider must be "openai" or "anthropic"'
    '{"request":{"model":"m"}}'                                'provider must be "openai" or "anthropic"'
    '{"provider":"openai"}'                                    'request must be a table'
    '{"provider":"openai","request":"hi"}'                     'request must be a table'
    '{"provider":"openai","request":[1,2]}'                    'request must be a JSON object, not a list'
    '{"provider":"openai","request":{"model":"m"},"tries":0}'   'tries must be an integer from 1 to 100'
    '{"provider":"openai","request":{"model":"m"},"tries":1.5}' 'tries must be an integer from 1 to 100'
    '{"provider":"openai","request":{"model":"m"},"tries":101}' 'tries must be an integer from 1 to 100'
    '{"provider":"openai","request":{"model":"m"},"deadline":0}' 'deadline must be a number of seconds from 1'
    '{"provider":"openai","request":{"model":"m"},"deadline":"soon"}' 'deadline must be a number of seconds from 1'
    '{"provider":"openai","request":{"model":"m"},"fallback":"sync"}' 'fallback must be a function'
  )
  local i ids=()
  for ((i = 0; i < ${#specs[@]}; i += 2)); do
    ids+=("$("$LEASH" enqueue --max-attempts 1 "{\"bad\":${specs[i]}}")")
  done
  local outside
  outside=$("$LEASH" enqueue --max-attempts 1 '{"n": 1, "outside_step": true}')
  start_worker A "$AFIX" --concurrency 2 --poll-ms 10-50 --until-empty
  assert_worker_exit A 60 0
  assert_no_sanitizer_reports
  for ((i = 0; i < ${#specs[@]}; i += 2)); do
    local id=${ids[i / 2]}
    assert_eq "spec ${specs[i]}: status|cause" "$(q "select status || '|' || last_cause from $QT where id = $id")" "dead|script_error"
    assert_contains "spec ${specs[i]}: error" "$(q "select split_part(last_error, E'\n', 1) from $QT where id = $id")" "${specs[i + 1]}"
  done
  assert_contains "outside a step" "$(q "select split_part(last_error, E'\n', 1) from $QT where id = $outside")" \
    "leash.llm.batch: only inside leash.step"
  assert_eq "items stored" "$(q "select count(*) from $IT")" 0
  # Two requests in one step: the first waits and is answered (by hand here); then the
  # second is refused, since the step's one item holds the first's answer.
  local twice
  twice=$("$LEASH" enqueue --max-attempts 1 '{"n": 1, "twice": true}')
  start_worker B "$AFIX" --concurrency 1 --poll-ms 10-50 --llm-batch-off
  wait_for "the first call to wait" 60 q_true "select count(*) = 1 from $IT where task_id = $twice"
  q "update $IT set state = 'done', answer = '{\"choices\": []}' where task_id = $twice;
     select ${QT}_signal('llm:' || id) from $IT where task_id = $twice" >/dev/null
  wait_for "the task to be dead" 60 q_true "select status = 'dead' from $QT where id = $twice"
  assert_contains "two calls in one step" "$(q "select split_part(last_error, E'\n', 1) from $QT where id = $twice")" \
    "leash.llm.batch: one call per leash.step run"
  stop_workers B
}

# The grading example's --batch-api mode (scripts/grade_ticket.lua, payload batch_api): 300
# tickets (LEASH_LLM_BATCH_TICKETS: the issue's target is 3000), one process with 4 slots. While the provider works every task waits and no lease
# is held (the slots are free); then every ticket is graded once, by batch answers only (no
# synchronous call), and the report shows the cost at batch prices beside the synchronous.
case_the_grading_example_in_batch_api_mode_grades_every_ticket_once_with_slots_free_meanwhile() {
  lb_setup
  local n=${LEASH_LLM_BATCH_TICKETS:-300} t0
  t0=$(date +%s)
  start_mock --batch-delay-s 5
  q "CREATE TABLE tickets (id bigint PRIMARY KEY, subject text, body text);
     CREATE TABLE ticket_grades (ticket_id bigint PRIMARY KEY, grade int NOT NULL,
       reason text, graded_by text, graded_at timestamptz NOT NULL DEFAULT now());
     INSERT INTO tickets SELECT i, 'Ticket ' || i, 'Customer ' || i || ' reports error E' || (i % 17)
       FROM generate_series(1, $n) i;
     INSERT INTO ${QT}_prices (model, input_per_mtok, output_per_mtok) VALUES ('mock-grader', 150, 600)" >/dev/null
  local i
  for i in $(seq 1 "$n"); do printf '{"payload":{"ticket_id":%d,"batch_api":true}}\n' "$i"; done |
    "$LEASH" enqueue --batch nightly --file - >/dev/null || fail "enqueue failed"
  # shellcheck disable=SC2046
  start_worker A "$LEASH_SRC/scripts/grade_ticket.lua" --concurrency 4 $(batch_flags) --until-empty
  wait_for "all $n to wait for their submitted batch with no lease held" 300 q_true \
    "select count(*) filter (where last_cause = 'waiting' and status = 'pending') = $n
            and count(*) filter (where status = 'leased') = 0
            and (select count(*) = $n from $IT where state = 'submitted') from $QT"
  assert_worker_exit A 600 0
  assert_no_sanitizer_reports
  assert_eq "queue after the batch" "$(status_counts)" "done=$n"
  assert_eq "graded tickets, once each" "$(q "select count(*) || ' ' || count(distinct ticket_id) from ticket_grades")" "$n $n"
  assert_eq "attempts" "$(q "select string_agg(distinct attempts::text, ',') from $QT")" 1
  assert_eq "items the mock batched / synchronous calls" \
    "$(mock_stat batches items) $(mock_stat requests /v1/chat/completions)" "$n 0"
  assert_contains "report's cost line" "$("$LEASH" report --batch nightly)" \
    "llm-batch:openai/mock-grader: $n calls"
  assert_contains "report's cost line" "$("$LEASH" report --batch nightly)" "at batch prices ("
  assert_eq "batch cost is half the synchronous" \
    "$("$LEASH" report --batch nightly --json | jq '.usage[0] | .cost * 2 == .sync_cost and .cost > 0')" true
  echo "#   $n tickets through $(q "select count(*) from $BT") provider batches in $(($(date +%s) - t0)) s;" \
    "$("$LEASH" report --batch nightly | grep 'llm-batch:')"
}

# The batcher's API keys (OPENAI_API_KEY, ANTHROPIC_API_KEY of its process) go in a header
# only: an upload that fails (nothing listens at the base URL) is logged, its batch
# abandoned with the error stored and its items sent again later, and the key is in no log
# line and nowhere in the database.
case_the_api_key_reaches_no_log_and_no_table_even_when_uploads_fail() {
  lb_setup
  start_mock --batch-delay-s 1
  local key=sk-leash-test-0123456789abcdef dead
  dead=$(free_port)
  enqueue_n 3
  OPENAI_API_KEY=$key start_worker A "$AFIX" --concurrency 2 --poll-ms 10-50 \
    --llm-batch-url "openai=http://127.0.0.1:$dead" --llm-batch-age 0
  wait_for "an upload to fail" 60 log_has A "not submitted; tries again"
  stop_workers A
  assert_eq "the abandoned batch (state|error says where)" \
    "$(q "select state || '|' || (error like 'POST /v1/files:%') from $BT order by id limit 1")" "abandoned|true"
  assert_eq "its items wait for another batch" "$(q "select string_agg(distinct state, ',') from $IT")" pending
  # shellcheck disable=SC2046
  OPENAI_API_KEY=$key start_worker B "$AFIX" --concurrency 2 $(batch_flags) --until-empty
  assert_worker_exit B 120 0
  assert_eq "tasks" "$(status_counts)" "done=3"
  local w
  for w in A B; do
    if grep -qF -- "$key" "$T_TMP/$w.log" "$T_TMP/$w.out"; then fail "the key is in worker $w's output"; fi
  done
  pg_dump --data-only "$DATABASE_URL" >"$T_TMP/dump.sql" || fail "pg_dump failed"
  grep -qF -- "question 1" "$T_TMP/dump.sql" || fail "the dump does not hold the requests"
  if grep -qF -- "sk-leash" "$T_TMP/dump.sql"; then fail "the key is in the database"; fi
}

# Bad --llm-batch-* values, by class (no provider, an unknown one, a URL that is not
# http(s), numbers out of range or not numbers, durations negative or zero where a poll
# needs time): exit 2 with one line naming the option (and the usual --help hint), before
# anything starts.
case_bad_llm_batch_flags_exit_2_with_one_line_naming_the_option() {
  local cases=(
    "--llm-batch-url http://x"            "--llm-batch-url must be openai=URL or anthropic=URL"
    "--llm-batch-url gemini=http://x"     "--llm-batch-url must be openai=URL or anthropic=URL"
    "--llm-batch-url openai=ftp://x"      "--llm-batch-url must be openai=URL or anthropic=URL"
    "--llm-batch-url openai="             "--llm-batch-url must be openai=URL or anthropic=URL"
    "--llm-batch-max 0"                   "--llm-batch-max must be an integer from 1 to 50000"
    "--llm-batch-max 50001"               "--llm-batch-max must be an integer from 1 to 50000"
    "--llm-batch-max ten"                 "--llm-batch-max must be an integer from 1 to 50000"
    "--llm-batch-age -1"                  "--llm-batch-age"
    "--llm-batch-age soon"                "--llm-batch-age"
    "--llm-batch-poll 0"                  "--llm-batch-poll"
  )
  local i
  for ((i = 0; i < ${#cases[@]}; i += 2)); do
    # shellcheck disable=SC2086 # the flag and its value are two words
    expect_exit 2 "$LEASH" run "$AFIX" ${cases[i]}
    assert_eq "${cases[i]}: stderr (lines|hint)" \
      "$(grep -c . "$T_ERR")|$(sed -n 2p "$T_ERR")" "2|Try 'leash run --help'."
    assert_contains "${cases[i]}: the line" "$(head -1 "$T_ERR")" "leash run: ${cases[i + 1]}"
  done
}

# A provider batch holds one model (the mock, as OpenAI, fails a file that mixes them at
# validation): items of two models, interleaved, go in one batch per model, and every task
# is done on its first attempt.
case_items_of_two_models_go_in_one_batch_per_model() {
  lb_setup
  start_mock --batch-delay-s 1
  local i
  for i in 1 2 3 4 5 6; do
    "$LEASH" enqueue "{\"n\": $i, \"model\": \"mock-$((i % 2))\"}" >/dev/null
  done
  # shellcheck disable=SC2046
  start_worker A "$AFIX" --concurrency 2 $(batch_flags) --until-empty
  assert_worker_exit A 120 0
  assert_no_sanitizer_reports
  assert_eq "tasks (status|attempts)" "$(q "select string_agg(distinct status || '|' || attempts, ',') from $QT")" "done|1"
  assert_eq "models per batch" \
    "$(q "select string_agg(distinct n::text, ',') from (select count(distinct model) n from $IT group by batch_id) x")" 1
  assert_eq "batches (count|items)" "$(q "select count(*) || '|' || sum(items) from $BT")" "2|6"
  assert_eq "the mock's batches (created|completed|failed)" \
    "$(mock_stat batches created)|$(mock_stat batches completed)|$(mock_stat batches failed)" "2|2|0"
}

# What a provider (or something in its place) hands back cannot touch what is not its batch's
# nor abort the transaction, by class: lines that are not JSON, JSON that is not an object,
# custom_ids that are not ours ("leash-abc", 20 digits, another prefix), the custom_id of
# another batch's item, a duplicate line (an answer wins over an error), a 200 whose body is
# not an object. Each of this batch's items gets its answer or a try spent with its cause;
# the other batch's item is untouched. A status that is not JSON is "not ended".
case_hostile_result_lines_touch_only_their_batchs_items() {
  lb_setup
  local t1 t2 t3 t4
  t1=$("$LEASH" enqueue '{"n": 1}'); t2=$("$LEASH" enqueue '{"n": 2}')
  t3=$("$LEASH" enqueue '{"n": 3}'); t4=$("$LEASH" enqueue '{"n": 4}')
  q "insert into $BT (id, provider, state, items) values (1, 'openai', 'open', 3), (2, 'openai', 'open', 1);
     insert into $IT (id, task_id, step, provider, request, state, batch_id) values
       (11, $t1, 'ask', 'openai', '{}', 'submitted', 1), (12, $t2, 'ask', 'openai', '{}', 'submitted', 1),
       (13, $t3, 'ask', 'openai', '{}', 'submitted', 1), (21, $t4, 'ask', 'openai', '{}', 'submitted', 2)" >/dev/null
  local ok='{"custom_id":"leash-11","response":{"status_code":200,"body":{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}}}}'
  local lines=(
    'not json at all'
    '[1, 2, 3]'
    '"a string"'
    '{"custom_id":"leash-abc","response":{"status_code":200,"body":{}}}'
    '{"custom_id":"leash-12345678901234567890","response":{"status_code":200,"body":{}}}'
    '{"custom_id":"other-12","response":{"status_code":200,"body":{}}}'
    '{"custom_id":"leash-21","response":{"status_code":200,"body":{"stolen":true}}}'
    '{"custom_id":"leash-11","response":{"status_code":500,"body":{"error":{"message":"boom"}}}}'
    "$ok"
    '{"custom_id":"leash-12","response":{"status_code":200,"body":"not an object"}}'
  )
  local text
  text=$(printf '%s\n' "${lines[@]}")
  assert_eq "the end's counts (done|retried|failed|fallback)" \
    "$(q "select done || '|' || retried || '|' || failed || '|' || fallback
            from ${QT}_llm_batch_end(1, 'completed', \$\$$text\$\$)")" "1|2|0|0"
  assert_eq "this batch's items (id:state:tries:cause)" \
    "$(q "select string_agg(id || ':' || state || ':' || tries || ':' || coalesce(last_cause, '-'), ',' order by id) from $IT where id < 20")" \
    "11:done:0:-,12:pending:1:item_failed: no message,13:pending:1:no_result"
  assert_eq "the answer kept and its tokens" \
    "$(q "select (answer ? 'choices') || '|' || input_tokens || '|' || output_tokens from $IT where id = 11")" "true|2|3"
  assert_eq "the other batch's item" "$(q "select state || '|' || (answer is null) from $IT where id = 21")" "submitted|true"
  assert_eq "the batch (state|answered)" "$(q "select state || '|' || answered from $BT where id = 1")" "ended|1"
  assert_eq "ending it again changes nothing" \
    "$(q "select done || '|' || retried from ${QT}_llm_batch_end(1, 'completed', \$\$$ok\$\$)")" "0|0"
  assert_eq "a status that is not JSON" \
    "$(q "select ended || '|' || status from ${QT}_llm_batch_status('openai', 'oops')")" "false|unreadable"
  assert_eq "a file id is read as given (the batcher checks ids before a URL)" \
    "$(q "select ended || '|' || output from ${QT}_llm_batch_status('openai', '{\"status\":\"completed\",\"output_file_id\":\"../x\"}')")" "true|../x"
}

# start_hostile NAME BATCH_ID [FILE_ID [OPTIONS...]]: tests/fixtures/llm_batch/hostile_provider.py
# on a free port, killed at exit; sets HOSTILE (its base URL); its requests go to
# $T_TMP/NAME.req.
start_hostile() {
  local name=$1 bid=$2 fid=${3:-file-out}
  shift 2
  (($# == 0)) || shift
  python3 "$LEASH_SRC/tests/fixtures/llm_batch/hostile_provider.py" --batch-id "$bid" \
    --file-id "$fid" --log "$T_TMP/$name.req" "$@" >"$T_TMP/$name.port" 2>"$T_TMP/$name.err" &
  t_on_exit t_kill "$!"
  wait_for "the hostile provider to print its port" 10 grep -q '^PORT [0-9]' "$T_TMP/$name.port"
  HOSTILE=http://127.0.0.1:$(sed -n '1s/^PORT //p' "$T_TMP/$name.port")
}

# A provider whose batch id, or whose output file id, would climb out of the URL path
# ("../../v1/files", "a/b", "x?y"): the batcher never puts it in a URL. A bad batch id
# abandons the batch (its items wait for another); a bad file id leaves the batch open,
# logged, and no request goes to any path with it.
case_provider_ids_that_would_escape_the_url_path_are_refused() {
  lb_setup
  enqueue_n 2
  local bid
  for bid in '../../v1/files' 'a/b' 'x?y=1'; do
    start_hostile "b$((++n_hostile))" "$bid"
    # shellcheck disable=SC2046
    start_worker "W$n_hostile" "$AFIX" --concurrency 2 --poll-ms 10-50 --llm-batch-age 0 \
      --llm-batch-url "openai=$HOSTILE"
    wait_for "batch id $bid to be refused" 60 log_has "W$n_hostile" "names no batch id"
    stop_workers "W$n_hostile"
    assert_eq "batch id $bid: requests made" "$(cat "$T_TMP/b$n_hostile.req")" $'POST /v1/files\nPOST /v1/batches'
  done
  assert_eq "the batches (abandoned|open)" \
    "$(q "select count(*) filter (where state = 'abandoned') || '|' || count(*) filter (where state = 'open') from $BT")" "3|0"
  assert_eq "the items wait for another batch" "$(q "select string_agg(distinct state, ',') from $IT")" pending
  start_hostile f batch_ok '../../etc'
  # shellcheck disable=SC2046
  start_worker F "$AFIX" --concurrency 2 --poll-ms 10-50 --llm-batch-age 0 --llm-batch-poll 0.2 \
    --llm-batch-url "openai=$HOSTILE"
  wait_for "the bad file id to be refused" 60 log_has F "names a file id that is not [A-Za-z0-9_-]"
  stop_workers F
  if grep -q 'etc' "$T_TMP/f.req"; then fail "a request went to the file id's path: $(cat "$T_TMP/f.req")"; fi
  assert_contains "the batch was polled" "$(cat "$T_TMP/f.req")" "GET /v1/batches/batch_ok"
  assert_eq "that batch stays open (its items submitted)" \
    "$(q "select state from $BT where provider_batch_id = 'batch_ok'")|$(q "select string_agg(distinct state, ',') from $IT")" "open|submitted"
}

# The provider refuses (429 with Retry-After) the first uploads, and later two polls; its
# result lines come shuffled. Each refused upload is abandoned without spending a try and
# sent again after --llm-batch-poll; a refused poll is tried at the next one; every answer
# still lands on its own task (the results are matched by custom_id, not by order).
case_refused_uploads_and_polls_are_tried_again_and_shuffled_results_keep_their_items() {
  lb_setup
  start_mock --batch-delay-s 2 --batch-refuse 2 --batch-refuse-status 429 --batch-shuffle
  enqueue_n 6
  # shellcheck disable=SC2046
  start_worker A "$AFIX" --concurrency 2 $(batch_flags) --until-empty
  wait_for "a batch to be open at the provider" 60 q_true "select count(*) = 1 from $BT where state = 'open'"
  curl -sf "$MOCK/_control" -d '{"batch_refuse": 2}' >/dev/null || fail "control refused"
  assert_worker_exit A 120 0
  assert_no_sanitizer_reports
  assert_eq "tasks (status|attempts)" "$(q "select string_agg(distinct status || '|' || attempts, ',') from $QT")" "done|1"
  assert_eq "batches (abandoned|ended)" \
    "$(q "select count(*) filter (where state = 'abandoned') || '|' || count(*) filter (where state = 'ended') from $BT")" "2|1"
  assert_eq "tries spent on refusals" "$(q "select sum(tries) from $IT")" 0
  assert_eq "the mock's refusals" "$(mock_stat batches refused)" 4
  log_has A "not polled (tries again)" || fail "no refused poll was logged"
  local i
  for i in 1 2 3 4 5 6; do
    assert_eq "task $i's answer" "$(q "select result->>'content' from $QT where (payload->>'n')::int = $i")" "$(sync_content "$i")"
  done
}

# An upload the provider refuses with a 400 (the request itself is wrong) spends a try of
# each item: out of tries, the item fails with the provider's refusal as its cause, and its
# task's leash.llm.batch raises it (dead here, with one attempt).
case_an_upload_refused_with_400_spends_a_try_and_fails_the_items_out_of_tries() {
  lb_setup
  local t
  t=$("$LEASH" enqueue --max-attempts 1 '{"n": 1, "tries": 1}')
  start_hostile r batch_x file-out --files-status 400
  start_worker A "$AFIX" --concurrency 1 --poll-ms 10-50 --llm-batch-age 0 \
    --llm-batch-url "openai=$HOSTILE" --until-empty
  assert_worker_exit A 60 0
  assert_no_sanitizer_reports
  assert_eq "the task (status|attempts)" "$(q "select status || '|' || attempts from $QT where id = $t")" "dead|1"
  assert_contains "its error" "$(q "select split_part(last_error, E'\n', 1) from $QT where id = $t")" \
    "failed after 1 tries: POST /v1/files: HTTP 400"
  assert_eq "its item (state|tries|cause)" "$(q "select state || '|' || tries || '|' || last_cause from $IT")" "spent|1|upload_refused"
  assert_eq "requests made" "$(cat "$T_TMP/r.req")" "POST /v1/files"
}

t_run "$@"
