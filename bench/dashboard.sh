#!/usr/bin/env bash
# The dashboard's cost on a big table (issue 18): 2,000,000 rows over 20 nightly batches
# (bench/dashboard_seed.sql: 19 finished, tonight's running), then `leash dashboard` answers
# each page 5 times; prints the median milliseconds per page (end to end, over loopback) and
# every statement's execution time of the last round (auto_explain, ANALYZE, from the
# server's log), so a slow query names itself.
#
#   bench/dashboard.sh [ROWS_PER_BATCH]        (default 100000: 2,000,000 rows)
#
# Uses the running cluster of PGHOST/PGPORT/PGUSER (scripts/pg.sh start) and its server.log
# ($LEASH_PG_DIR/server.log); creates and drops the database leash_bench_dashboard.
# LEASH_BIN: the binary (default build/leash); LEASH_BIN_BEFORE: an earlier one whose
# running-batch page is timed too (before sql/024: a pass over the batch's rows).
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${1:-100000}
LEASH=${LEASH_BIN:-build/leash}
LOG=${LEASH_PG_DIR:?run scripts/pg.sh start first}/server.log
PY=/usr/bin/python3
DB=leash_bench_dashboard
dropdb --if-exists "$DB" && createdb "$DB"
export DATABASE_URL="host=$PGHOST port=$PGPORT user=${PGUSER:-postgres} dbname=$DB"
trap 'kill "$DASH" 2>/dev/null || true; wait 2>/dev/null || true; dropdb --if-exists "$DB" || true' EXIT
"$LEASH" migrate >/dev/null 2>&1
start=$(date +%s.%N)
psql -X -q -v ON_ERROR_STOP=1 -v rows_per_batch="$ROWS" -d "$DATABASE_URL" \
  -f bench/dashboard_seed.sql
# Tonight's settled rows' attempts (the attempt history, sql/016), one each, as the settle
# writes them: what the running batch's page reads (sql/024, dashboard_data.c live_fmt).
psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -c "
  INSERT INTO agent_work_queue_attempts (task_id, lease_token, attempt, worker, claimed_at,
         run_started_at, finished_at, kind, status, error)
  SELECT id, id, attempts, 'pod-' || (id % 4), started_at, run_started_at, finished_at,
         status, status, last_error
    FROM agent_work_queue WHERE batch = 'night-2026-12-01' AND status IN ('done', 'dead')" \
  -c "VACUUM ANALYZE agent_work_queue_attempts"
printf 'seeded %d rows in %.1f s\n' "$((ROWS * 20))" "$(echo "$(date +%s.%N) - $start" | bc)"
port=$(source tests/lib.sh >/dev/null 2>&1; free_port)
# Every statement of the dashboard's session explained, with its real time, in the log.
PGOPTIONS="-c session_preload_libraries=auto_explain -c auto_explain.log_min_duration=0
  -c auto_explain.log_analyze=on -c auto_explain.log_timing=off -c log_min_messages=log
  -c auto_explain.log_nested_statements=on" \
  "$LEASH" dashboard --listen "127.0.0.1:$port" 2>/dev/null &
DASH=$!
"$PY" - "$port" "$LOG" "$LEASH" <<'PY'
import re, statistics, subprocess, sys, time, urllib.error, urllib.request
port, log, leash = sys.argv[1], sys.argv[2], sys.argv[3]
base = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + 60
while True:   # the first answer is the cold one: it computes and keeps the reports
    t = time.monotonic()
    try:
        urllib.request.urlopen(base + "/", timeout=60).read(); break
    except urllib.error.URLError as e:
        if not isinstance(e.reason, ConnectionRefusedError) or time.monotonic() > deadline:
            sys.exit(f"the dashboard did not answer: {e}")
        time.sleep(0.2)
print(f"{'first load (keeps 9 finished reports)':40s} {(time.monotonic() - t) * 1000:8.1f} ms")
# Before sql/024 a running batch's page was a pass over its rows: its report (the statement
# of leash report --batch, which the page ran), then its chart by each row's last settle.
times = []
for _ in range(5):
    t = time.monotonic()
    subprocess.run([leash, "report", "--batch", "night-2026-12-01", "--json"], check=True,
                   stdout=subprocess.DEVNULL)
    times.append((time.monotonic() - t) * 1000)
print(f"{'before: the running batch, its report':40s} {statistics.median(times):8.1f} ms  (median of 5, leash report --batch: the pass the page ran)")
pages = [("overview (tonight's batch, running)", "/"),
         ("a finished batch (night-2026-11-20)", "/?batch=night-2026-11-20"),
         ("a task page", "/task?id=1")]
for name, path in pages:
    times = []
    for _ in range(5):
        mark = open(log, "rb").seek(0, 2)
        t = time.monotonic()
        urllib.request.urlopen(base + path, timeout=60).read()
        times.append((time.monotonic() - t) * 1000)
    print(f"{name:40s} {statistics.median(times):8.1f} ms  (median of 5, end to end)")
    with open(log, "rb") as f:
        f.seek(mark); text = f.read().decode(errors="replace")
    for m in re.finditer(r"duration: ([0-9.]+) ms\s+plan:\s*\n\s*Query Text: (.*)", text):
        q = re.sub(r"\s+", " ", m.group(2))[:90]
        print(f"    {float(m.group(1)):8.1f} ms  {q}")
PY
kill "$DASH"
wait "$DASH" || true
# LEASH_BIN_BEFORE: an earlier build (e.g. main's before sql/024) answers the running batch's
# page too, on the same table, for the figure before.
if [[ -n ${LEASH_BIN_BEFORE:-} ]]; then
  "$LEASH_BIN_BEFORE" dashboard --listen "127.0.0.1:$port" 2>/dev/null &
  DASH=$!
  "$PY" - "$port" <<'PY'
import statistics, sys, time, urllib.error, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
deadline = time.monotonic() + 60
while True:
    try:
        urllib.request.urlopen(base + "/", timeout=60).read(); break
    except urllib.error.URLError as e:
        if not isinstance(e.reason, ConnectionRefusedError) or time.monotonic() > deadline:
            sys.exit(f"the earlier dashboard did not answer: {e}")
        time.sleep(0.2)
times = []
for _ in range(5):
    t = time.monotonic()
    urllib.request.urlopen(base + "/", timeout=60).read()
    times.append((time.monotonic() - t) * 1000)
print(f"{'before (LEASH_BIN_BEFORE): overview':40s} {statistics.median(times):8.1f} ms  (median of 5, end to end)")
PY
  kill "$DASH"
  wait "$DASH" || true
fi
# Before sql/024 the running batch's chart was read from its rows too (batch_idx, each
# row's finished_at): that statement's time.
psql -X -q -d "$DATABASE_URL" -c '\timing on' -c "
  SELECT count(*) FROM (SELECT date_trunc('minute', finished_at), count(*)
                          FROM agent_work_queue WHERE batch = 'night-2026-12-01'
                           AND finished_at > now() - interval '1 hour' GROUP BY 1) m" |
  sed -n 's/^Time: \(.*\)/before: the running batch'"'"'s chart from its rows: \1/p'
# Before sql/021 each listed batch was counted by status through batch_idx: that count, for
# the 10 newest batches, as the old list would have paid for them (it listed only batches
# among the newest 10,000 rows: here tonight's alone).
psql -X -q -d "$DATABASE_URL" -c '\timing on' -c "
  SELECT sum(pending + leased + done + dead) FROM (SELECT DISTINCT batch FROM agent_work_queue_batch_totals
                         ORDER BY batch DESC LIMIT 10) b
   CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE q.status = 'pending') AS pending,
                              count(*) FILTER (WHERE q.status = 'leased') AS leased,
                              count(*) FILTER (WHERE q.status = 'done') AS done,
                              count(*) FILTER (WHERE q.status = 'dead') AS dead
                         FROM agent_work_queue q WHERE q.batch = b.batch) k" |
  sed -n 's/^Time: \(.*\)/counting the 10 newest batches by status (the list before sql\/021): \1/p'
# What the totals' INSERT trigger costs a child enqueue (one row per statement, every client
# into the same batch, so its total rows are shared): pgbench, 4 clients, 5 s, with the
# trigger and without, two alternating rounds (tps; a loaded machine is noisy: compare the
# pairs).
for round in 1 2; do
  for mode in ENABLE DISABLE; do
    psql -X -q -d "$DATABASE_URL" -c "ALTER TABLE agent_work_queue $mode TRIGGER agent_work_queue_batch_totals_insert"
    printf 'child inserts, trigger %-7s round %d: ' "${mode,,}d" "$round"
    pgbench -n -f bench/sql/child_insert.sql -c 4 -j 2 -T 5 "$DB" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1 tps/p'
  done
done
