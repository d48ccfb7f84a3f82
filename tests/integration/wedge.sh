#!/usr/bin/env bash
# Wedged slots (issue #12, class 2, the host half): a script stuck inside ONE C call, where the
# count hook never fires, cannot hold a slot, a lease or the process forever. The watchdog
# (src/watchdog.c) settles the wedged task as a retry ("wedged: ..."), gives every other lease
# back at once, and exits with status 3; SIGTERM ends the process within --drain-timeout plus a
# few seconds; a version whose setup wedges is refused (hot swap) or fails the start (exit 1).
# The wedge is tests/fixtures/run/wedge.lua's: a sort of a million references to one 1 MB
# string (tens of minutes inside one call; see the fixture for why it stays legal whatever the
# sandbox bounds). The fixture's plain-find wedge no longer wedges: the sandbox's matcher
# checks the deadline (test_sandbox), which is the point of closing classes there.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"

# row SHARD COLUMNS: the columns of the task whose shard_key is SHARD.
row() { q "select $2 from agent_work_queue where shard_key = '$1'"; }
started() { q_true "select count(*) >= $1 from execs"; }
# innocents_released: both innocent tasks are pending again with the attempt not charged.
innocents_released() {
  assert_eq "innocent tasks after the worker exited (status|attempts|locked_until)" \
    "$(q "select string_agg(status || '|' || attempts || '|' || coalesce(locked_until::text, 'null'), ',')
            from agent_work_queue where shard_key like 'innocent%'")" "pending|0|null,pending|0|null"
}
enqueue() { "$LEASH" enqueue "$@" >/dev/null || fail "enqueue $* failed"; }
ms_since() { echo $((($(_t_now_us) - $1) / 1000)); }
# past T0_US MS: true once MS milliseconds have passed since T0_US (for wait_for).
past() { (($(_t_now_us) - $1 >= $2 * 1000)); }

# 1. A task wedged in C past --task-timeout + --watchdog-grace: the worker settles it as a
# retry with cause wedged (attempt charged, so a poison task runs out of attempts), gives the
# two innocent running tasks' leases back before it exits (rows pending, attempt not charged,
# long before the 600 s visibility), logs the cause once and exits 3. Twice: the second round
# on the task's last attempt, which the settle writes dead like any retry with none left.
case_task_wedged_past_the_timeout_is_settled_and_the_worker_exits_3() {
  local how want_row
  for how in first last; do
    run_setup "$how"
    if [[ $how == first ]]; then
      enqueue --shard wedge '{"wedge":"sort"}'
      want_row="pending|1|null"
    else
      enqueue --shard wedge --max-attempts 1 '{"wedge":"sort"}'
      want_row="dead|1|null"
    fi
    start_worker "T$how" "$FIX/wedge.lua" --concurrency 3 --task-timeout 5 --watchdog-grace 1 \
      --poll-ms 20-50
    wait_for "the wedging task to start ($how)" 20 started 1
    local t0
    t0=$(_t_now_us)
    # The innocents start 2.5 s into the wedge: with a 5 s timeout they are still running
    # when the watchdog fires at 6 s (a task started with the wedge would time out first).
    enqueue --shard innocent1 --delay 2.5s '{"sleep":60}'
    enqueue --shard innocent2 --delay 2.5s '{"sleep":60}'
    wait_for "the innocent tasks to start ($how)" 10 started 3
    assert_worker_exit "T$how" 20 3
    local ms
    ms=$(ms_since "$t0")
    ((ms < 9000)) || fail "the worker took ${ms} ms to exit after the wedge started ($how; timeout 5 s + grace 1 s)"
    innocents_released
    assert_eq "wedged task (status|attempts|locked_until)" \
      "$(row wedge "status || '|' || attempts || '|' || coalesce(locked_until::text, 'null')")" \
      "$want_row"
    local err
    err=$(row wedge last_error)
    assert_contains "last_error of the wedged task" "$err" "wedged: handle ran"
    assert_contains "last_error of the wedged task" "$err" "past --task-timeout (5 s) + --watchdog-grace (1 s); the worker restarted"
    assert_eq "watchdog lines naming the cause ($how)" "$(grep -c 'is wedged:' "$T_TMP/T$how.log")" 1
    log_has "T$how" "2 other leases given back to pending" \
      || fail "no release line in the log"$'\n'"$(worker_log "T$how")"
  done
  assert_no_sanitizer_reports
}

# 2. No task timeout, but the wedged task's lease is taken (requeued by hand, or reaped): the
# loss cannot stop code in C, so after the grace the worker gives the rest back and exits 3;
# the stolen row is left to its new owner.
case_wedge_ignoring_a_lost_lease_exits_3_and_gives_back_the_rest() {
  run_setup
  enqueue --shard wedge '{"wedge":"sort"}'
  enqueue --shard innocent1 '{"sleep":60}'
  enqueue --shard innocent2 '{"sleep":60}'
  start_worker L "$FIX/wedge.lua" --concurrency 3 --visibility 30 --heartbeat 500ms \
    --watchdog-grace 1 --poll-ms 20-50
  wait_for "three tasks to start" 20 started 3
  q "update agent_work_queue set lease_owner = 'thief' where shard_key = 'wedge'" >/dev/null
  local t0
  t0=$(_t_now_us)
  assert_worker_exit L 15 3
  local ms
  ms=$(ms_since "$t0")
  ((ms < 5000)) || fail "L took ${ms} ms to exit after losing the lease (heartbeat 0.5 s + grace 1 s)"
  innocents_released
  assert_eq "the stolen row is the thief's, untouched" \
    "$(row wedge "status || '|' || lease_owner || '|' || attempts")" "leased|thief|1"
  log_has L "of losing its lease" || fail "no lost-lease cause in the log"$'\n'"$(worker_log L)"
  assert_no_sanitizer_reports
}

# 3. SIGTERM with a slot wedged in C and no task timeout: at --drain-timeout every lease goes
# back (not charged), and since the wedged slot does not come back within min(grace, 2 s) of
# the stop, the process exits 3 by itself: within --drain-timeout + ~3 s, not never.
case_sigterm_with_a_wedged_slot_exits_within_the_drain_timeout() {
  run_setup
  enqueue --shard wedge '{"wedge":"sort"}'
  enqueue --shard innocent1 '{"sleep":60}'
  enqueue --shard innocent2 '{"sleep":60}'
  start_worker S "$FIX/wedge.lua" --concurrency 3 --drain-timeout 1 --poll-ms 20-50
  wait_for "three tasks to start" 20 started 3
  local t0
  t0=$(_t_now_us)
  kill -TERM "${W_PID[S]}"
  assert_worker_exit S 15 3
  local ms
  ms=$(ms_since "$t0")
  ((ms < 4500)) || fail "S took ${ms} ms to exit after SIGTERM (drain timeout 1 s + stop grace 2 s)"
  innocents_released
  assert_eq "wedged task (status|attempts)" "$(row wedge "status || '|' || attempts")" "pending|0"
  log_has S "drain timeout: 3 leases given back to pending" \
    || fail "no drain release in the log"$'\n'"$(worker_log S)"
  log_has S "of the drain deadline's stop" || fail "no stop cause in the log"$'\n'"$(worker_log S)"
  assert_no_sanitizer_reports
}

# 4. Two SIGTERMs within a second are one request (timeout(1) signals the process and its
# group): the drain goes on, the running task finishes, exit 0. A second one later than that
# still means stop now (exit 1).
case_two_sigterms_within_a_second_are_one_drain() {
  run_setup
  enqueue --shard innocent1 '{"sleep":3}'
  start_worker D "$FIX/wedge.lua" --concurrency 2 --drain-timeout 20 --poll-ms 20-50
  wait_for "the task to start" 20 started 1
  kill -TERM "${W_PID[D]}"
  # After the first is taken (two pending SIGTERMs would merge in the kernel into one).
  wait_for "the drain to start" 5 log_has D "SIGTERM: draining"
  kill -TERM "${W_PID[D]}"
  assert_worker_exit D 20 0
  assert_eq "the task finished during the drain" "$(row innocent1 status)" "done"
  log_has D "the same request, still draining" || fail "no coalescing line"$'\n'"$(worker_log D)"

  run_setup later
  enqueue --shard innocent2 '{"sleep":30}'
  start_worker E "$FIX/wedge.lua" --concurrency 2 --drain-timeout 20 --poll-ms 20-50
  wait_for "the task to start" 20 started 1
  local t0
  t0=$(_t_now_us)
  kill -TERM "${W_PID[E]}"
  wait_for "1.2 s since the first signal" 5 past "$t0" 1200
  kill -TERM "${W_PID[E]}"
  assert_worker_exit E 5 1
  log_has E "second signal: stopping at once" || fail "no stop line"$'\n'"$(worker_log E)"
  assert_no_sanitizer_reports
}

# 5. Hot swap to a version whose setup wedges in C: refused once the load limit (5 s + grace)
# passes, the slots keep v1 and go on serving; a further SIGHUP is refused while that setup
# is still stuck; SIGTERM still drains and exits 0.
case_hot_swap_to_a_version_whose_setup_wedges_is_refused() {
  run_setup
  local dir=$T_TMP/hs
  mkdir -p "$dir"
  cp "$FIX/wedge.lua" "$dir/script.lua"
  start_worker H "$dir/script.lua" --concurrency 2 --watchdog-grace 1 --poll-ms 20-50
  wait_for "H to run" 20 log_has H "running 2 slots"
  enqueue --shard before '{}'
  wait_for "the first task" 20 q_true "select status = 'done' from agent_work_queue where shard_key = 'before'"
  assert_eq "result before the swap" "$(row before "result->>'v'")" 1
  cp "$FIX/wedge_setup.lua" "$dir/script.lua.tmp"
  mv "$dir/script.lua.tmp" "$dir/script.lua"
  wait_for "the swap to be refused" 20 log_has H "hot swap (file change) refused"
  log_has H "setup did not return within 6 s" || fail "no load-limit reason"$'\n'"$(worker_log H)"
  enqueue --shard after '{}'
  wait_for "a task after the refusal" 20 q_true "select status = 'done' from agent_work_queue where shard_key = 'after'"
  assert_eq "result after the refused swap (v1 still serves)" "$(row after "result->>'v'")" 1
  kill -HUP "${W_PID[H]}"
  wait_for "the SIGHUP to be refused" 10 log_has H "an earlier version's setup is still stuck"
  kill -TERM "${W_PID[H]}"
  assert_worker_exit H 15 0
  assert_no_sanitizer_reports
}

# 6. A start whose setup wedges in C fails (exit 1, one clear line) after the load limit,
# instead of hanging before the first task.
case_start_with_a_wedged_setup_exits_1() {
  run_setup
  enqueue '{}'
  local t0
  t0=$(_t_now_us)
  start_worker B "$FIX/wedge_setup.lua" --watchdog-grace 1
  assert_worker_exit B 20 1
  local ms
  ms=$(ms_since "$t0")
  ((ms < 10000)) || fail "B took ${ms} ms to fail the start (load limit 6 s)"
  log_has B "cannot load $FIX/wedge_setup.lua: setup did not return within 6 s" \
    || fail "no clear start failure"$'\n'"$(worker_log B)"
  assert_eq "the task was never claimed" "$(q "select status || '|' || attempts from agent_work_queue")" "pending|0"
}

# 7. SIGTERM ends the process even when a finalizer loops forever as the slot closes its state
# at shutdown (C code: lua_close runs finalizers with hooks off). The drain itself succeeded,
# so the task is done; the exit is 3 when the watchdog had to end the close, or 0 where the
# sandbox refuses such a finalizer (it does: the fixture's setmetatable raises, caught). Either way within --drain-timeout + ~3 s, not never.
case_sigterm_ends_even_when_a_finalizer_loops_at_state_close() {
  run_setup
  enqueue --shard gc '{"gc_at_close":true}'
  start_worker G "$FIX/wedge.lua" --concurrency 1 --drain-timeout 1 --poll-ms 20-50
  wait_for "the task to be done" 20 q_true "select status = 'done' from agent_work_queue"
  local t0
  t0=$(_t_now_us)
  kill -TERM "${W_PID[G]}"
  wait_worker G 15
  [[ $W_RC == 0 || $W_RC == 3 ]] || fail "exit status of G: $W_RC (want 0, or 3 from the watchdog)"
  local ms
  ms=$(ms_since "$t0")
  ((ms < 4500)) || fail "G took ${ms} ms to exit after SIGTERM (drain timeout 1 s + stop grace 2 s)"
  if ((W_RC == 3)); then
    log_has G "closing a Lua state did not finish within 2 s" \
      || fail "exit 3 without the cause"$'\n'"$(worker_log G)"
  fi
  assert_no_sanitizer_reports
}

t_run "$@"
