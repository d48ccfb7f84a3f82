#!/usr/bin/env bash
# The Lua boundary with the real binary (issue #12, class 1): poison scripts and answers end
# as their task's retry or death with a clear last_error; the process stays up and every
# other task is done. The C side of the same classes is tests/c/test_boundary.c.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"

BFIX=$LEASH_SRC/tests/fixtures/boundary

# settled_or_gone PID SQL: true once SQL answers t, or once PID has exited (so a worker that
# aborts fails the case at once instead of at the deadline).
settled_or_gone() { exited "$1" || q_true "$2"; }

case_poison_answers_are_retries_and_the_process_lives() {
  run_setup
  local m
  {
    for m in tostring_err raise_tostring_err nil_msg infdelay yield huge_result log_tostring; do
      printf '{"shard_key":"%s","max_attempts":1,"payload":{"mode":"%s"}}\n' "$m" "$m"
    done
    # two attempts: the first retry's delay is what is checked
    printf '{"shard_key":"bigdelay","max_attempts":2,"payload":{"mode":"bigdelay"}}\n'
    printf '{"shard_key":"fine%d","tenant_id":"t%d","payload":{"mode":"fine"}}\n' 1 1 2 2 3 3
    # a tenant id that tries to forge a log line of its own
    printf '{"shard_key":"forge","tenant_id":"evil\\nFORGED info task done","payload":{"mode":"fine"}}\n'
  } >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 12
  start_worker A "$BFIX/poison.lua" --concurrency 2 --poll-ms 20-50 \
    --lua-memory 16 --task-timeout 5 --drain-timeout 2
  wait_for "every task but the delayed one to settle" 60 settled_or_gone "${W_PID[A]}" \
    "select count(*) = 11 from agent_work_queue where status in ('done', 'dead')"
  exited "${W_PID[A]}" && fail "the worker died: $(tail -3 "$T_TMP/A.log")"
  wait_for "the delayed task's first failure" 20 q_true \
    "select status = 'pending' and attempts = 1 from agent_work_queue where shard_key = 'bigdelay'"
  exited "${W_PID[A]}" && fail "the worker died"
  local row="select status || '|' || coalesce(last_error, '') from agent_work_queue where shard_key = '%s'"
  local got
  # shellcheck disable=SC2059
  for m in tostring_err raise_tostring_err log_tostring; do
    got=$(q "$(printf "$row" "$m")")
    [[ $got == dead\|* && $got == *"boom from __tostring"* ]] || fail "$m: $got"
  done
  # shellcheck disable=SC2059
  assert_eq "nil, msg" "$(q "$(printf "$row" nil_msg)")" "dead|upstream failed: 503"
  # shellcheck disable=SC2059
  got=$(q "$(printf "$row" infdelay)")
  [[ $got == "dead|retry delay must be a finite number of seconds >= 0, not inf (message: x)" ]] ||
    fail "infdelay: $got"
  # shellcheck disable=SC2059
  got=$(q "$(printf "$row" yield)")
  [[ $got == dead\|*"outside a coroutine"* ]] || fail "yield: $got"
  # shellcheck disable=SC2059
  got=$(q "$(printf "$row" huge_result)")
  [[ $got == dead\|*"--max-result-bytes"* ]] || fail "huge_result: $got"
  assert_eq "delay of 1e20 cut to the backoff cap (run_after - finished_at in [3590, 3610] s)" \
    "$(q "select extract(epoch from run_after - finished_at) between 3590 and 3610
          from agent_work_queue where shard_key = 'bigdelay'")" t
  assert_eq "innocent tasks done" \
    "$(q "select count(*) from agent_work_queue
          where (shard_key like 'fine%' or shard_key = 'forge') and status = 'done'")" 4
  log_has A "Lua panic" && fail "the panic handler was reached"
  grep -q '^FORGED' "$T_TMP/A.log" && fail "a tenant id forged a log line"
  log_has A 'tenant=evil\nFORGED info task done' || fail "the tenant id is not escaped in the log"
  kill -TERM "${W_PID[A]}"
  assert_worker_exit A 20 0
}

t_run "$@"
