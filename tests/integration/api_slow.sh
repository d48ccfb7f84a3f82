#!/usr/bin/env bash
# Figures for the script API (not run under ThreadSanitizer): throughput of tasks doing one
# leash.db.query and one JSON round trip, and the memory an idle slot costs. Each case
# prints its figure as a "# figure:" line on stderr and fails only when it is far off.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"

API=$LEASH_SRC/tests/fixtures/api

# 5,000 tasks, --concurrency 10, --until-empty: tasks per second from start to exit.
case_throughput_db_json() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  local n=${LEASH_BENCH_TASKS:-5000}
  seq 1 "$n" | awk '{ printf "{\"payload\":{\"n\":%d,\"text\":\"chunk %d\",\"tags\":[1,2,3]}}\n", $1, $1 }' \
    >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" "$n"
  local t0 ms
  t0=$(_t_now_us)
  start_worker A "$API/bench_db_json.lua" --concurrency 10 --until-empty --poll-ms 20-50
  assert_worker_exit A 300 0
  ms=$((($(_t_now_us) - t0) / 1000))
  assert_eq "queue after the run" "$(status_counts)" "done=$n"
  echo "# figure: $n tasks (1 db.query + 1 JSON round trip each), --concurrency 10: ${ms} ms," \
    "$((n * 1000 / (ms > 0 ? ms : 1))) tasks/s" >&2
  ((n * 1000 / (ms > 0 ? ms : 1) >= 200)) || fail "throughput under 200 tasks/s"
}

# _rss_stable PID: true once VmRSS read the same on 10 calls in a row (wait_for calls it
# every 50 ms).
_rss_stable() {
  local rss prev count=0
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$1/status")
  if [[ -f $T_TMP/rss.$1 ]]; then
    read -r prev count <"$T_TMP/rss.$1"
    [[ $prev == "$rss" ]] && count=$((count + 1)) || count=0
  fi
  echo "$rss $count" >"$T_TMP/rss.$1"
  ((count >= 10))
}

# VmRSS of an idle worker at --concurrency 10 and 200: (RSS200 - RSS10) / 190 per slot.
case_rss_per_idle_slot() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  local n rss10 rss200
  for n in 10 200; do
    start_worker "W$n" "$API/bench_db_json.lua" --concurrency "$n" --poll-ms 50-100 --drain-timeout 1
    wait_for "W$n to run" 30 log_has "W$n" "running $n slots"
    # Idle: every slot is loaded before "running" is logged; wait for VmRSS to settle.
    wait_for "W$n's VmRSS to settle" 20 _rss_stable "${W_PID[W$n]}"
    local rss
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/${W_PID[W$n]}/status")
    [[ $rss =~ ^[0-9]+$ ]] || fail "no VmRSS for W$n"
    echo "# figure: idle worker at --concurrency $n: VmRSS ${rss} kB" >&2
    if [[ $n == 10 ]]; then rss10=$rss; else rss200=$rss; fi
    t_kill "${W_PID[W$n]}"
  done
  local per=$(((rss200 - rss10) / 190))
  echo "# figure: (RSS200 - RSS10) / 190 = ${per} kB per idle slot" >&2
  ((per < 2048)) || fail "an idle slot costs ${per} kB (want < 2 MB)"
}

t_run "$@"
