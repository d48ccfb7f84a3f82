#!/usr/bin/env bash
# bench/run.sh must not rot: its smoke (every workload at tiny sizes) runs against the test
# cluster and prints a figure for each workload. The figures themselves are not judged here
# (the test cluster runs without fsync, on a machine shared with other tests).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"

case_smoke_runs_every_workload() {
  need_pg
  local w row
  LEASH_BENCH_USE_PG=1 expect_exit 0 "$LEASH_SRC/bench/run.sh" --smoke
  for w in drain serial latency depth one-row wide idle heartbeat blocks parked fairness priority tenants leases budget outage; do
    row=$(grep -E "^\| $w \| " "$T_OUT" || true)
    [[ -n $row ]] || fail "no row for $w in the table"$'\n'"$(_t_tail stdout "$T_OUT")"$'\n'"$(_t_tail stderr "$T_ERR")"
    # The figure column starts with a number (tasks/s, p50, a ratio, seconds, a rate).
    [[ $row =~ ^\|\ $w\ \|\ (p50\ )?[0-9]+(\.[0-9]+)?[^|]*\| ]] \
      || fail "no figure for $w: $row"$'\n'"$(_t_tail stderr "$T_ERR")"
  done
  assert_contains "serial's exclusion" "$(grep -E '^\| serial \| ' "$T_OUT")" ", 0 overlaps |"
}

t_run "$@"
