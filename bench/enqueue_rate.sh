#!/usr/bin/env bash
# Figure (not a test): rows per second of one bulk `leash enqueue --file` of 100,000 JSONL
# lines into a freshly migrated queue, on a throwaway PostgreSQL that scripts/pg.sh starts
# with fsync and synchronous_commit on (LEASH_PG_FSYNC=on), so the commit is a real one.
#
#   bench/enqueue_rate.sh [ROWS]        # default 100000; LEASH_BIN overrides build/leash
#   LEASH_BENCH_RUNS=3 bench/enqueue_rate.sh   # several runs, each into a fresh database
#
# Prints one line per run: "enqueue_rate: ROWS rows in S s = R rows/s (...)".
# The time covers the whole command: reading and checking every line, COPY, the INSERT, the
# commit. Lines look like a nightly batch: a tenant, a batch, and a ~200-byte payload.
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS=${1:-100000}
RUNS=${LEASH_BENCH_RUNS:-1}
LEASH=${LEASH_BIN:-build/leash}
[[ $ROWS =~ ^[1-9][0-9]*$ ]] || { echo "enqueue_rate: ROWS must be a positive integer" >&2; exit 2; }
[[ -x $LEASH ]] || { echo "enqueue_rate: $LEASH is not built (cmake -S . -B build && cmake --build build)" >&2; exit 1; }

work=$(mktemp -d /tmp/leash-bench.XXXXXX)
PGDIR=""
cleanup() {
  if [[ -n $PGDIR ]]; then scripts/pg.sh stop "$PGDIR" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Our own server only: no stray connection settings from the caller.
mapfile -t pg_vars < <(compgen -e | grep '^PG' || true)
unset DATABASE_URL "${pg_vars[@]}"
eval "$(LEASH_PG_FSYNC=on scripts/pg.sh start)"
PGDIR=$LEASH_PG_DIR
grep -q '^fsync=on$' "$PGDIR/leash-pg.env" || { echo "enqueue_rate: cluster without fsync" >&2; exit 1; }

awk -v n="$ROWS" 'BEGIN {
  for (i = 1; i <= n; i++)
    printf "{\"tenant_id\":\"tenant-%d\",\"batch\":\"bench\",\"payload\":{\"ticket\":%d,\"subject\":\"Refund for order %d\",\"body\":\"The parcel arrived damaged and I would like a refund or a replacement, whichever is quicker.\",\"lang\":\"en\"}}\n", i % 7, i, 100000 + i
}' >"$work/tasks.jsonl"

version=$(psql -X -A -t -d postgres -c 'show server_version' | cut -d' ' -f1)
for ((run = 1; run <= RUNS; run++)); do
  DATABASE_URL=$(scripts/pg.sh newdb "bench_$run")
  export DATABASE_URL
  "$LEASH" migrate >/dev/null 2>&1
  t0=$EPOCHREALTIME
  count=$("$LEASH" enqueue --file "$work/tasks.jsonl")
  t1=$EPOCHREALTIME
  [[ $count == "$ROWS" ]] || { echo "enqueue_rate: enqueue printed '$count', want $ROWS" >&2; exit 1; }
  stored=$(psql -X -A -t -d "$DATABASE_URL" -c 'select count(*) from agent_work_queue')
  [[ $stored == "$ROWS" ]] || { echo "enqueue_rate: $stored rows stored, want $ROWS" >&2; exit 1; }
  awk -v n="$ROWS" -v t0="$t0" -v t1="$t1" -v v="$version" -v sz="$(stat -c %s "$work/tasks.jsonl")" 'BEGIN {
    s = t1 - t0
    printf "enqueue_rate: %d rows in %.3f s = %.0f rows/s (%.1f MB of JSONL, fsync on, PostgreSQL %s)\n",
           n, s, n / s, sz / 1e6, v
  }'
done
