#!/usr/bin/env bash
# The chaos soak's short variant (tests/chaos/soak.sh): 3 processes × 4 slots over 3,000 tasks
# for 60 s of kill -9, SIGSTOP past the lease, SIGTERM, pg_terminate_backend, PostgreSQL
# restarts and hot swaps (good and broken), with a fixed seed; then every invariant, in SQL.
# The soak starts its own cluster (it restarts it), so it does not use the shared server; it
# needs the PostgreSQL 15 server binaries all the same. On failure its work folder (worker
# logs, the driver's events, a pg_dump) is kept and named in the output.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"

case_short_soak_keeps_every_invariant() {
  if [[ ! -x ${LEASH_PG_BIN:-/usr/lib/postgresql/15/bin}/initdb ]]; then
    [[ ${CI:-} != true ]] || fail "PostgreSQL 15 server binaries are missing, and in CI the soak must run"
    echo "skip chaos.short_soak_keeps_every_invariant: no PostgreSQL 15 server binaries" >&2
    exit 77
  fi
  local work rc=0
  work=$(mktemp -d "${TMPDIR:-/tmp}/leash-chaos.XXXXXX")
  LEASH_BIN=$LEASH bash "$LEASH_SRC/tests/chaos/soak.sh" --duration 60 --tasks 3000 --procs 3 \
    --slots 4 --seed 7 --drain-max 120 --workdir "$work" >"$T_TMP/soak.out" 2>&1 || rc=$?
  # The figures, for the log of the run (ctest -V, or the failure output).
  sed -n '/^chaos soak:/,$p' "$T_TMP/soak.out" | sed 's/^/# /'
  if ((rc != 0)); then
    tail -n 60 "$T_TMP/soak.out" | grep -v '^chaos soak:' >&2 || true
    fail "the chaos soak failed (exit $rc); evidence in $work"
  fi
  assert_contains "soak summary" "$(cat "$T_TMP/soak.out")" "invariants failed: 0"
}

t_run "$@"
