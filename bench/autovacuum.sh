#!/usr/bin/env bash
# Figure (not a test): what per-table autovacuum settings (sql/005_autovacuum.sql) change for
# a nightly batch. Two queue tables side by side on one throwaway PostgreSQL (scripts/pg.sh,
# stock autovacuum: naptime 1 min), both holding HISTORY done rows from earlier nights
# (retention not pruned yet) and analysed in that quiet state, as a table is by day:
#
#   q_default   the server's defaults (analyze after 10% of the table changed, vacuum 20%)
#   q_tuned     the settings of sql/005_autovacuum.sql
#
# Then BATCH tasks are enqueued into each (`leash enqueue --file`, as a CronJob does) and one
# `leash run --until-empty --concurrency 10` drains each table, at the same time. Every 10 s
# a line per table: tasks done, rows still pending, buffers and time of the claim's candidate
# scan (EXPLAIN ANALYZE, LIMIT 50), claim_idx pages, dead tuples, autovacuum and autoanalyze
# runs so far, for SECONDS (after a drain too: what idle claims then scan). At the end: how
# long each drain took, or that it had not finished.
#
#   bench/autovacuum.sh [HISTORY] [BATCH] [SECONDS]    # default 1000000 50000 240
#   LEASH_BENCH_NIGHTS=30 bench/autovacuum.sh            # history from 30 batches, not 1
set -euo pipefail
cd "$(dirname "$0")/.."

HISTORY=${1:-1000000}
BATCH=${2:-50000}
SECONDS_RUN=${3:-240}
NIGHTS=${LEASH_BENCH_NIGHTS:-1}   # how many batch names the history holds
LEASH=${LEASH_BIN:-build/leash}
[[ -x $LEASH ]] || { echo "autovacuum: $LEASH is not built" >&2; exit 1; }
LEASH=$(cd "$(dirname "$LEASH")" && pwd)/$(basename "$LEASH")

work=$(mktemp -d /tmp/leash-bench-av.XXXXXX)
PGDIR=""
pids=()
cleanup() {
  # The workers first (a stuck one would retry against a stopped server for ever).
  for f in "$work"/*.pid; do
    if [[ -e $f ]]; then kill "$(<"$f")" 2>/dev/null || true; fi
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ -n $PGDIR ]]; then scripts/pg.sh stop "$PGDIR" >/dev/null 2>&1 || true; fi
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT

mapfile -t pg_vars < <(compgen -e | grep '^PG' || true)
unset DATABASE_URL "${pg_vars[@]}"
eval "$(scripts/pg.sh start)"
PGDIR=$LEASH_PG_DIR
DATABASE_URL=$(scripts/pg.sh newdb bench_av)
export DATABASE_URL
psqlq() { psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" "$@"; }

for t in q_default q_tuned; do
  "$LEASH" --table "$t" migrate >/dev/null 2>&1
  psqlq -c "INSERT INTO $t (tenant_id, shard_key, payload, status, attempts, batch,
                            started_at, finished_at, created_at, updated_at)
            SELECT 't' || g % 7, 'h:' || g, '{\"ticket\": 1, \"body\": \"some text of a ticket\"}',
                   'done', 1, 'nightly-' || (g % $NIGHTS), now() - interval '2 days',
                   now() - interval '2 days', now() - interval '2 days', now() - interval '2 days'
              FROM generate_series(1, $HISTORY) g"
done
# leash migrate applied sql/005_autovacuum.sql to both: q_default goes back to the server's
# defaults; q_tuned gets the file's settings again (so older binaries measure the same).
psqlq -c "ALTER TABLE q_default RESET (autovacuum_vacuum_scale_factor,
            autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor,
            autovacuum_analyze_threshold)"
psqlq -c "$(sed -n '/^ALTER TABLE/,/;/p' sql/005_autovacuum.sql | sed 's/{{table}}/q_tuned/')"
psqlq -c "SELECT relname, coalesce(reloptions::text, '(server defaults)') FROM pg_class
           WHERE relname IN ('q_default', 'q_tuned') ORDER BY 1" | tr '|' ' '
# A backend reports its table counters when it goes idle or exits, a little after the client
# saw the result: wait, so that VACUUM ANALYZE resets counts that include the history.
sleep 3
psqlq -c "VACUUM ANALYZE q_default" -c "VACUUM ANALYZE q_tuned"
# One autovacuum round over the quiet tables, as by day.
sleep 70
echo "before the batch (changes since analyze, inserts since vacuum, autoanalyze runs):"
psqlq -c "SELECT relname, n_mod_since_analyze, n_ins_since_vacuum, autoanalyze_count
            FROM pg_stat_user_tables WHERE relname IN ('q_default', 'q_tuned') ORDER BY 1" \
  | tr '|' ' ' | sed 's/^/  /'

cat >"$work/noop.lua" <<'LUA'
return function(task) return true end
LUA
awk -v n="$BATCH" 'BEGIN { for (i = 1; i <= n; i++)
  printf "{\"tenant_id\":\"t%d\",\"payload\":{\"ticket\":%d,\"body\":\"some text of a ticket\"}}\n", i % 7, i }' \
  >"$work/batch.jsonl"

declare -A started
for t in q_default q_tuned; do
  "$LEASH" --table "$t" enqueue --batch nightly-new --file "$work/batch.jsonl" >/dev/null
done
for t in q_default q_tuned; do
  started[$t]=$(date +%s.%N)
  ( "$LEASH" --table "$t" --log-level warn run "$work/noop.lua" --until-empty --concurrency 10 \
      --worker-id "$t" >"$work/$t.out" 2>"$work/$t.log" &
    echo $! >"$work/$t.pid"
    wait $! && date +%s.%N >"$work/$t.finished" ) &
  pids+=($!)
done

# The claim's candidate scan, measured: buffers touched and execution time.
psqlq <<'SQL'
CREATE FUNCTION probe_scan(t regclass, OUT bufs int, OUT ms numeric) LANGUAGE plpgsql AS $$
DECLARE p json;
BEGIN
  EXECUTE format('EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM %s '
                 'WHERE status = ''pending'' AND run_after <= now() ORDER BY run_after, id LIMIT 50', t)
    INTO p;
  bufs := (p->0->'Plan'->>'Shared Hit Blocks')::int + (p->0->'Plan'->>'Shared Read Blocks')::int;
  ms := round((p->0->>'Execution Time')::numeric, 2);
END $$;
SQL
probe() {
  local t=$1
  psqlq -c "SELECT '$t', (SELECT count(*) FROM $t WHERE batch = 'nightly-new' AND status = 'done'),
                   (SELECT count(*) FROM $t WHERE status = 'pending'), s.bufs, s.ms,
                   pg_relation_size('${t}_claim_idx') / 8192, n_dead_tup, autovacuum_count,
                   autoanalyze_count
              FROM pg_stat_user_tables, probe_scan('$t') s WHERE relname = '$t'" | tr '|' ' '
}

start=$(date +%s)
printf '%5s %-10s %8s %8s %8s %8s %9s %9s %4s %4s\n' t table 'done' pending scanbuf scan_ms \
  idx_pages dead_tup av aa
while (($(date +%s) - start < SECONDS_RUN)); do
  sleep 10
  for t in q_default q_tuned; do
    printf '%5d ' $(($(date +%s) - start))
    probe "$t" | awk '{ printf "%-10s %8s %8s %8s %8s %9s %9s %4s %4s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
  done
done

echo
for t in q_default q_tuned; do
  if [[ -e $work/$t.finished ]]; then
    awk -v a="${started[$t]}" -v b="$(<"$work/$t.finished")" -v t="$t" -v n="$BATCH" \
      'BEGIN { printf "%s: %d tasks drained in %.1f s\n", t, n, b - a }'
  else
    echo "$t: not drained after ${SECONDS_RUN} s ($(psqlq -c "SELECT count(*) FROM $t WHERE batch = 'nightly-new' AND status = 'done'") of $BATCH done)"
  fi
  grep -c 'canceling statement due to statement timeout' "$work/$t.log" \
    | sed "s/^/  claims cancelled by statement_timeout: /" || true
done
