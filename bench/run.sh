#!/usr/bin/env bash
# leash's own benchmark: one command, a table of figures (not pass/fail; issue 6 has targets).
#
#   bench/run.sh [--smoke] [--workloads a,b,...] [--n N] [--c C]
#
# Workloads (default: all of them, in this order):
#   drain      N no-op tasks, each its own shard, drained by one `leash run --concurrency C
#              --until-empty`: tasks/s = N / wall time of that process.
#   serial     the same over 100 shard keys: tasks/s, and overlaps = rows whose lease
#              [started_at, finished_at] began before an earlier lease of the same
#              (tenant_id, shard_key) had ended, from the rows themselves (must be 0).
#   latency    C idle slots; one psql session INSERTs one row every 20 ms for 10 s; pickup =
#              started_at - created_at (both the server's clock): p50/p95/p99/max ms; beside
#              it the INSERT's own time with its commit, pickup to the handler's first
#              statement (bench/lua/stamp.lua stamps the server clock, as compare.sh's
#              handler does) and a one-row commit alone on the same schedule (the claim's
#              commit), for issue #14's allowance (INSERT and commit + that commit + 0.3 ms).
#   depth      N tasks of one batch drained with --batch, without and then with 1,000,000 rows
#              scheduled ten years ahead (plain SQL INSERT): rate with / rate without.
#   one-row    10 processes x --concurrency 1 --claim-batch 1 draining N tasks, against the
#              two-transaction floor on the same cluster: pgbench -M prepared, 10 clients,
#              10 s, floor_2tx.sql on its seed table with 600,000 runnable rows. leash's rate
#              is over its work (first claim to last settle), as pgbench's tps leaves out
#              connecting; the rate over the wall time is shown beside it. Three rounds,
#              alternating the two; the figure is the median of their ratios.
#   wide       one process, --concurrency 1000, 10,000 tasks that each leash.sleep(1): wall
#              time, most connections of its database seen in pg_stat_activity (sampled every
#              100 ms), RSS per idle slot = (VmRSS idle at 1000 slots - at 10 slots) / 990.
#   idle       one worker (C slots) with nothing to do, 30 s: transactions/s of its database
#              (pg_stat_database xact_commit + xact_rollback).
#   heartbeat  one process, 50 slots each in a leash.sleep, --heartbeat 1s: transactions in a
#              5 s window, per heartbeat interval; cross-checked by a statement trigger that
#              counts UPDATE statements on the queue. PostgreSQL 15 may hold a backend's
#              counters up to 10 s before pg_stat_database shows them, so idle and heartbeat
#              windows start 11 s after the last burst, and the sleeps last 20 s, not 10.
#
# The scheduler's targets (issue 14); each figure is printed with its target. Rows are plain SQL
# INSERT ... SELECT generate_series (triggers keep the heads); a task's shard is its own
# unless said otherwise.
#   blocks     N no-op tasks over 100 shards, one process at C slots, --until-empty: enqueued
#              interleaved (k = i % 100) and then, in a fresh database, shard by shard
#              (k = i / (N/100)): the two rates and blocks / interleaved (>= 0.8), median of
#              3 alternating rounds.
#   parked     2,000 free tasks, one process --concurrency 20: alone (process start to their
#              last settle), then enqueued after 100,000 runnable tasks in 10 shards: their
#              rate behind the parked ones / alone (>= 0.5), median of 3 alternating rounds.
#   fairness   tenant A's 50,000 tasks queued first, B's 500 after, leash.sleep(0.005), 2
#              processes x 10 slots: B's share of the rows claimed while both had work
#              (started_at <= the start of B's last task), 50% +- 5; then with weight A 3 in
#              <table>_tenants, A's share, 75% +- 5.
#   priority   one process at C slots draining 50,000 priority-0 tasks; after 2,000 are done
#              one priority-10 task is inserted: the tasks claimed after its commit and before
#              it (<= claim batch + slots), its pickup in ms.
#   tenants    N no-op tasks in one tenant, then spread over N/2 tenants (2 each): drain
#              rates at C slots and many / one (>= 0.7), median of 3 alternating rounds.
#   leases     one process --concurrency 2, tasks of 2 ms and (1 in 4) 150 ms: the leased rows
#              sampled every 50 ms while it drains, the most seen (<= 4 = 2 x slots).
#
# The budgets' targets (issue 15), against scripts/mock_llm.py over loopback:
#   budget     3 processes x 20 slots, one call per task (~320 tokens) under one budget set
#              to the mock's own limit, 300 requests/min and 100,000 tokens/min for all
#              clients together, for 5 minutes: the share of the limit achieved after the
#              first minute (>= 90%) and the share of requests the mock answered 429 then
#              (<= 1%), from the mock's own per-minute counts.
#   outage     3,000 tasks (budget llm, enqueued with --budget llm; 600 requests/min) and a
#              second budget's 600 tasks on another endpoint, 3 processes x 20 slots, default
#              settings; after a third of llm's tasks, a 10-minute outage of llm's endpoint
#              (every request 429, Retry-After: 60): tasks dead (0), attempts spent on 429s
#              (0: the most attempts of a task is 1), seconds from the outage's end to llm's
#              next answer (<= Retry-After + 5), the other budget's answers during the
#              outage (> 0).
#
# Every workload gets a fresh database (dropped afterwards). --smoke runs each at tiny sizes,
# in well under a minute, to prove the bench still works (tests/integration/bench.sh).
#
# Environment:
#   LEASH_BIN            the binary (default build/leash; this script builds nothing)
#   LEASH_BENCH_USE_PG=1 use the running cluster of PGHOST/PGPORT/PGUSER; otherwise a throwaway
#                        one is started with fsync on (scripts/pg.sh) and stopped at exit
#   LEASH_BENCH_SQL      folder of the floor's seed.sql and floor_2tx.sql (default bench/sql,
#                        copies of shared/bench/sql)
#   LEASH_BENCH_KEEP=1   keep every workload's database (and a throwaway cluster, running) for
#                        inspection afterwards: auto_explain, the rows' timestamps
#
# The figures of one run share the machine with whatever else runs on it: the table shows
# the 1-minute load average when each workload started.
# shellcheck disable=SC2317 # the w_* functions run by name ("w_$w"), cleanup by trap
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

usage() { sed -n '2,/^# shellcheck/{/^# shellcheck/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "bench/run.sh: $*" >&2; exit 1; }

ALL_WORKLOADS=drain,serial,latency,depth,one-row,wide,idle,heartbeat,blocks,parked,fairness,priority,tenants,leases,budget,outage
SMOKE=0 WORKLOADS=$ALL_WORKLOADS N="" C=""
while (($#)); do
  case $1 in
    --smoke) SMOKE=1 ;;
    --workloads) (($# >= 2)) || die "--workloads needs a value"; WORKLOADS=$2; shift ;;
    --workloads=*) WORKLOADS=${1#*=} ;;
    --n) (($# >= 2)) || die "--n needs a value"; N=$2; shift ;;
    --n=*) N=${1#*=} ;;
    --c) (($# >= 2)) || die "--c needs a value"; C=$2; shift ;;
    --c=*) C=${1#*=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench/run.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
IFS=, read -r -a WL <<<"$WORKLOADS"
((${#WL[@]})) || die "--workloads is empty"
for w in "${WL[@]}"; do
  [[ ,$ALL_WORKLOADS, == *,"$w",* ]] || { echo "bench/run.sh: unknown workload $w (known: $ALL_WORKLOADS)" >&2; exit 2; }
done

# ------------------------------------------------------------------ sizes
if ((SMOKE)); then
  : "${N:=300}" "${C:=4}"
  LAT_SECONDS=2 LAT_SETTLE=1
  DEPTH_BACKLOG=20000
  ONEROW_PROCS=10 ONEROW_ROUNDS=1 FLOOR_SECONDS=1 FLOOR_ROWS=50000
  WIDE_TASKS=200 WIDE_C=100 WIDE_SLEEP=0.2
  IDLE_SECONDS=3 IDLE_WARM=1
  HB_SLOTS=10 HB_SLEEP=6 HB_INTERVAL=0.5 HB_WINDOW=2 HB_WARM=1
  PARK_ROWS=5000 PARK_FREE=200 FAIR_A=2000 FAIR_B=50 PRIO_ROWS=3000 PRIO_AFTER=300 LEASE_TASKS=40
  PARK_ROUNDS=1 PAIR_ROUNDS=1
  BUDGET_RPM=120 BUDGET_TPM=40000 BUDGET_WINDOW=5 BUDGET_SECONDS=15 BUDGET_WARM=5
  OUT_TASKS=90 OUT_OTHER=20 OUT_RPM=10 OUT_WINDOW=1 OUT_SECONDS=4 OUT_RETRY=2
  OUT_ARGS=(--budget-wait 1s)   # the smoke's Retry-After is shorter than the default's 30 s
else
  : "${N:=20000}" "${C:=10}"
  LAT_SECONDS=10 LAT_SETTLE=3
  DEPTH_BACKLOG=1000000
  ONEROW_PROCS=10 ONEROW_ROUNDS=3 FLOOR_SECONDS=10 FLOOR_ROWS=600000
  WIDE_TASKS=10000 WIDE_C=1000 WIDE_SLEEP=1
  # PostgreSQL 15 holds a backend's counters for up to 10 s (PGSTAT_IDLE_INTERVAL) before
  # they reach pg_stat_database, so a window of transaction counts starts 11 s after the last
  # burst (start-up, claims); the heartbeat's tasks sleep long enough to cover that.
  IDLE_SECONDS=30 IDLE_WARM=11
  HB_SLOTS=50 HB_SLEEP=20 HB_INTERVAL=1 HB_WINDOW=5 HB_WARM=11
  PARK_ROWS=100000 PARK_FREE=2000 FAIR_A=50000 FAIR_B=500 PRIO_ROWS=50000 PRIO_AFTER=2000
  LEASE_TASKS=400 PARK_ROUNDS=3 PAIR_ROUNDS=3
  BUDGET_RPM=300 BUDGET_TPM=100000 BUDGET_WINDOW=60 BUDGET_SECONDS=300 BUDGET_WARM=60
  OUT_TASKS=3000 OUT_OTHER=600 OUT_RPM=600 OUT_WINDOW=60 OUT_SECONDS=600 OUT_RETRY=60
  OUT_ARGS=()
fi
[[ $N =~ ^[1-9][0-9]*$ ]] || die "--n must be a positive integer"
[[ $C =~ ^[1-9][0-9]*$ ]] || die "--c must be a positive integer"
SERIAL_KEYS=100 PARK_C=20 LAT_INTERVAL_MS=20 FLOOR_CLIENTS=10 IDLE_SLOTS=$C

LEASH=${LEASH_BIN:-build/leash}
[[ $LEASH == /* ]] || LEASH=$ROOT/$LEASH
[[ -x $LEASH ]] || die "$LEASH is not built (cmake -S . -B build && cmake --build build)"
LUA=$ROOT/bench/lua
# The floor's scripts are copies of shared/bench/sql (bench/sql/), so a checkout alone runs.
FLOOR_SQL=${LEASH_BENCH_SQL:-$ROOT/bench/sql}
for tool in psql pgbench awk; do command -v "$tool" >/dev/null || die "$tool not found"; done

# ------------------------------------------------------------------ clean-up
WORK=$(mktemp -d /tmp/leash-bench.XXXXXX)
: >"$WORK/dbs"
: >"$WORK/rows"
OWN_PG=""
WL_PID=""
# The workload running now is a subshell (below) that stops its own workers when it exits.
cleanup() {
  local rc=$? db i
  trap - EXIT INT TERM
  if [[ -n $WL_PID ]] && kill -TERM "$WL_PID" 2>/dev/null; then
    for ((i = 0; i < 150; i++)); do kill -0 "$WL_PID" 2>/dev/null || break; sleep 0.1; done
  fi
  if [[ ${LEASH_BENCH_KEEP:-} == 1 ]]; then
    echo "bench/run.sh: kept $(paste -sd' ' "$WORK/dbs")${OWN_PG:+ on the running cluster in $OWN_PG}" >&2
  elif [[ -z $OWN_PG ]]; then   # someone else's cluster: leave no database behind
    while read -r db; do
      [[ -n $db ]] && psql -X -q -d postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1
    done <"$WORK/dbs"
  else
    scripts/pg.sh stop "$OWN_PG" >/dev/null 2>&1 || echo "bench/run.sh: could not stop $OWN_PG" >&2
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ cluster
if [[ ${LEASH_BENCH_USE_PG:-0} == 1 ]]; then
  [[ -n ${PGHOST:-} && -n ${PGPORT:-} ]] || die "LEASH_BENCH_USE_PG=1 needs PGHOST and PGPORT"
  unset DATABASE_URL
  export PGUSER=${PGUSER:-postgres}
else
  mapfile -t pg_vars < <(compgen -e | grep '^PG' || true)
  unset DATABASE_URL "${pg_vars[@]}"
  eval "$(LEASH_PG_FSYNC=on scripts/pg.sh start)"
  OWN_PG=$LEASH_PG_DIR
  grep -q '^fsync=on$' "$OWN_PG/leash-pg.env" || die "the cluster came up without fsync"
fi
DB_PREFIX=lb$$

# ------------------------------------------------------------------ helpers
say() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }
now_us() { local t=${EPOCHREALTIME//[!0-9]/}; echo $((10#$t)); }
# calc FORMAT EXPR: awk arithmetic, printed with FORMAT.
calc() { awk "BEGIN { x = ($2); printf \"$1\", x }"; }   # x first: a ">" in printf's list is a redirect (mawk)
load1() { cut -d' ' -f1 /proc/loadavg; }

q() { psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -c "$1"; }
qp() { psql -X -A -t -q -v ON_ERROR_STOP=1 -d postgres -c "$1"; }
q_true() { [[ $(q "$1") == t ]]; }

# newdb NAME: a fresh migrated database ${DB_PREFIX}_NAME; sets DB and DATABASE_URL.
newdb() {
  DB=${DB_PREFIX}_${1//-/_}
  echo "$DB" >>"$WORK/dbs"
  DATABASE_URL=$(scripts/pg.sh newdb "$DB")
  export DATABASE_URL
  "$LEASH" migrate >/dev/null 2>"$WORK/migrate.log" || die "leash migrate: $(tail -n 3 "$WORK/migrate.log")"
}
dropdb() { [[ ${LEASH_BENCH_KEEP:-} == 1 ]] && return 0; qp "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null; }

# tasks N KEYS [BATCH] [PAYLOAD_JSON]: JSONL on stdout; KEYS=0 gives every task its own shard.
tasks() {
  awk -v n="$1" -v k="$2" -v b="${3:-}" -v p="${4:-}" 'BEGIN {
    for (i = 0; i < n; i++) {
      key = k > 0 ? "k" (i % k) : "d" i
      printf "{\"payload\":%s,\"shard_key\":\"%s\"%s}\n", (p == "" ? "{\"i\":" i "}" : p), key,
             (b == "" ? "" : ",\"batch\":\"" b "\"")
    }
  }'
}
# enqueue FILE WANT: bulk enqueue (tenant bench) and check the count.
enqueue() {
  local got
  got=$("$LEASH" enqueue --tenant bench --file "$1" 2>"$WORK/enqueue.log") \
    || die "leash enqueue: $(tail -n 3 "$WORK/enqueue.log")"
  [[ $got == "$2" ]] || die "leash enqueue printed $got, want $2"
}
# settle_db: statistics fresh, and no checkpoint from the set-up inside the measurement.
# (The smoke skips the CHECKPOINT: it measures nothing and each one costs most of a second.)
settle_db() {
  q "VACUUM ANALYZE" >/dev/null
  ((SMOKE)) || q "CHECKPOINT" >/dev/null
}

# Workers not yet waited for (pid -> 1); a workload's subshell stops them when it exits.
declare -A LIVE=()
stop_live() {
  local pid
  for pid in "${!LIVE[@]}"; do stop "" "$pid"; done
}
# start NAME ARGS...: `leash run ARGS --worker-id NAME` in the background; stderr in
# $WORK/NAME.log; sets PID.
start() {
  local name=$1
  shift
  "$LEASH" run "$@" --worker-id "$name" >"$WORK/$name.out" 2>"$WORK/$name.log" &
  PID=$!
  LIVE[$PID]=1
}
# finish NAME PID: waits for the worker and fails unless it exited 0.
finish() {
  local rc=0
  wait "$2" || rc=$?
  unset "LIVE[$2]"
  ((rc == 0)) || die "leash run ($1) exited $rc: $(tail -n 5 "$WORK/$1.log")"
}
# stop NAME PID: SIGTERM, then SIGKILL after 10 s.
stop() {
  local i
  unset "LIVE[$2]"
  kill -TERM "$2" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do kill -0 "$2" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$2" 2>/dev/null || true
  wait "$2" 2>/dev/null || true
}
# nap S: a sleep that a signal interrupts (the trap runs at once, not after the sleep).
nap() { sleep "$1" & wait $!; }
# wait_until DESC TIMEOUT_S CMD...: re-runs CMD every 50 ms until it succeeds.
wait_until() {
  local desc=$1 deadline=$(($(now_us) + $2 * 1000000))
  shift 2
  until "$@" >/dev/null 2>&1; do
    (($(now_us) < deadline)) || die "timeout waiting for $desc"
    sleep 0.05
  done
}
running() { grep -qF "running $2 slot" "$WORK/$1.log"; }
vmrss() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }
# rss_idle PID: VmRSS (kB) once it read the same 10 times in a row, 100 ms apart (or after 30 s).
rss_idle() {
  local prev="" cur same=0 i
  for ((i = 0; i < 300 && same < 10; i++)); do
    cur=$(vmrss "$1")
    [[ -n $cur ]] || die "process $1 is gone"
    if [[ $cur == "$prev" ]]; then same=$((same + 1)); else same=0; fi
    prev=$cur
    sleep 0.1
  done
  echo "$prev"
}
# xacts: "transactions|server time" — the transactions of $DB so far (commits + rollbacks, as
# pg_stat_database has them), read from another database so that reading adds none.
xacts() {
  qp "SELECT xact_commit + xact_rollback, clock_timestamp() FROM pg_stat_database WHERE datname = '$DB'"
}
done_count() { q "SELECT count(*) FROM agent_work_queue WHERE status = 'done'"; }
# timed_drain NAME ARGS...: runs `leash run ARGS` to its end; sets WALL (seconds) and PARTS,
# which splits it (the host's clock and the server's are one here) into start-up (process
# start to first claim), work (first claim to last settle) and exit (last settle to exit).
timed_drain() {
  local name=$1 t0 t1
  shift
  t0=$(now_us)
  start "$name" "$@"
  finish "$name" "$PID"
  t1=$(now_us)
  WALL=$(calc %.3f "($t1 - $t0) / 1e6")
  split_wall "$t0" "$t1"
}
# split_wall T0_US T1_US: sets PARTS (see timed_drain) and WORK_S (the work alone, seconds)
# from the rows' started_at/finished_at.
split_wall() {
  local t0=$1 t1=$2 r up work tail
  r=$(q "SELECT round(extract(epoch FROM min(started_at)) - $t0 / 1e6, 3),
                round(extract(epoch FROM max(finished_at) - min(started_at))::numeric, 3),
                round($t1 / 1e6 - extract(epoch FROM max(finished_at)), 3)
           FROM agent_work_queue WHERE started_at IS NOT NULL")
  IFS='|' read -r up work tail <<<"$r"
  WORK_S=$work
  PARTS="start-up $up s + work $work s + exit $tail s after the last settle"
}

# fig WORKLOAD FIGURE DETAILS: one row of the table.
fig() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$WL_LOAD" >>"$WORK/rows"
  say "$1: $2 ($3)"
}

# ------------------------------------------------------------------ workloads
w_drain() {
  newdb drain
  tasks "$N" 0 >"$WORK/t.jsonl"
  enqueue "$WORK/t.jsonl" "$N"
  settle_db
  timed_drain drain "$LUA/noop.lua" --concurrency "$C" --until-empty
  local d
  d=$(done_count)
  [[ $d == "$N" ]] || die "drain: $d of $N tasks done"
  fig drain "$(calc %.0f "$N / $WALL") tasks/s" "$N no-op tasks, one shard each, C=$C: ${WALL} s = $PARTS"
  dropdb
}

w_serial() {
  newdb serial
  tasks "$N" "$SERIAL_KEYS" >"$WORK/t.jsonl"
  enqueue "$WORK/t.jsonl" "$N"
  settle_db
  timed_drain serial "$LUA/noop.lua" --concurrency "$C" --until-empty
  local d r
  d=$(done_count)
  [[ $d == "$N" ]] || die "serial: $d of $N tasks done"
  # A row overlaps when its lease began before the latest end of an earlier-started lease of
  # its shard. started_at/finished_at are the claim's and the settle's transaction times, so a
  # shard released and claimed again in one cycle gives finished_at = started_at: no overlap.
  r=$(q "WITH r AS (
           SELECT started_at, finished_at, attempts,
                  max(finished_at) OVER (PARTITION BY tenant_id, shard_key ORDER BY started_at, id
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
             FROM agent_work_queue)
         SELECT count(*) FILTER (WHERE started_at < prev_end),
                count(*) FILTER (WHERE attempts <> 1),
                count(*) FILTER (WHERE started_at IS NULL OR finished_at IS NULL)
           FROM r")
  local overlaps retried unstamped
  IFS='|' read -r overlaps retried unstamped <<<"$r"
  fig serial "$(calc %.0f "$N / $WALL") tasks/s, $overlaps overlaps" \
    "$N no-op tasks over $SERIAL_KEYS shard keys, C=$C: ${WALL} s = $PARTS; same-shard lease overlaps $overlaps (rows retried $retried, without timestamps $unstamped)"
  dropdb
}

# paced_timing TOTAL FORMAT TSV: one psql session sends TOTAL statements (printf FORMAT with
# the statement's number j, given twice) one every LAT_INTERVAL_MS on a fixed schedule (a
# missed tick is sent at once, not skipped); sleeps are `read -t` on a fifo, no fork per
# statement. TSV gets "j<TAB>ms" per statement: psql's \timing, the statement and its commit.
paced_timing() {
  local total=$1 format=$2 tsv=$3 fifo
  fifo=$(mktemp -u "$WORK/tick.XXXXXX")
  mkfifo "$fifo"
  (
    exec {tick}<>"$fifo"
    echo '\timing on'
    start_us=$(now_us)
    for ((j = 0; j < total; j++)); do
      d=$((start_us + j * LAT_INTERVAL_MS * 1000 - $(now_us)))
      if ((d > 0)); then read -r -t "$((d / 1000000)).$(printf %06d $((d % 1000000)))" -u "$tick" || true; fi
      # shellcheck disable=SC2059 # the format is the caller's statement
      printf "$format\n" "$j" "$j"
    done
  ) | psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$tsv.timing"
  rm -f "$fifo"
  awk '/^Time: / { printf "%d\t%s\n", n++, $2 }' "$tsv.timing" >"$tsv"
}

w_latency() {
  newdb latency
  q "CREATE TABLE bench_stamp (id bigint PRIMARY KEY, at timestamptz NOT NULL)" >/dev/null
  settle_db
  start latency "$LUA/stamp.lua" --concurrency "$C"
  local pid=$PID total=$((LAT_SECONDS * 1000 / LAT_INTERVAL_MS))
  wait_until "the latency worker to run" 60 running latency "$C"
  nap "$LAT_SETTLE"   # let it settle into its idle loop
  paced_timing "$total" "INSERT INTO agent_work_queue (tenant_id, shard_key, payload) VALUES ('bench', 'l%d', '{\"i\": %d}');" \
    "$WORK/latency.tsv"
  wait_until "every row to be picked up" 30 q_true "SELECT count(*) = $total FROM agent_work_queue WHERE status = 'done'"
  stop latency "$pid"
  # The claim's commit, measured alone on the same cluster and schedule: a one-row UPDATE of a
  # table of its own and its commit (the WAL flush a durable claim waits for; the statement
  # itself is a few hundredths of a millisecond).
  q "CREATE TABLE bench_commit (n int NOT NULL); INSERT INTO bench_commit VALUES (0)" >/dev/null
  paced_timing "$total" "UPDATE bench_commit SET n = n + 1 WHERE %d >= 0;" "$WORK/commit.tsv"
  local c50 c99
  IFS='|' read -r c50 c99 <<<"$(sort -n -k2 "$WORK/commit.tsv" | awk -v n="$total" '
    { v[NR] = $2 } END { printf "%.2f|%.2f", v[int((n - 1) * 0.50) + 1], v[int((n - 1) * 0.99) + 1] }')"
  psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
    -c "CREATE TABLE bench_insert (j int PRIMARY KEY, ms float8 NOT NULL)" \
    -c "\\copy bench_insert FROM '$WORK/latency.tsv'" >/dev/null
  local r n p50 p95 p99 max i50 i99 a50 a99 h50 h99
  r=$(q "WITH l AS (SELECT extract(epoch FROM started_at - created_at) * 1000 AS ms, i.ms AS ins,
                           extract(epoch FROM s.at - created_at) * 1000 AS hms
                      FROM agent_work_queue q
                      LEFT JOIN bench_insert i ON i.j = substr(q.shard_key, 2)::int
                      LEFT JOIN bench_stamp s ON s.id = q.id)
         SELECT count(*),
                round(percentile_cont(0.50) WITHIN GROUP (ORDER BY ms)::numeric, 2),
                round(percentile_cont(0.95) WITHIN GROUP (ORDER BY ms)::numeric, 2),
                round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2),
                round(max(ms)::numeric, 2),
                round(percentile_cont(0.50) WITHIN GROUP (ORDER BY ins)::numeric, 2),
                round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ins)::numeric, 2),
                round(percentile_cont(0.50) WITHIN GROUP (ORDER BY ms - ins)::numeric, 2),
                round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms - ins)::numeric, 2),
                round(percentile_cont(0.50) WITHIN GROUP (ORDER BY hms)::numeric, 2),
                round(percentile_cont(0.99) WITHIN GROUP (ORDER BY hms)::numeric, 2)
           FROM l")
  IFS='|' read -r n p50 p95 p99 max i50 i99 a50 a99 h50 h99 <<<"$r"
  # Issue #14's allowance for a pickup that ends in the handler (compare.sh's, which the
  # handler's first statement stamps on the server's clock, as stamp.lua does here): the
  # producer's INSERT and commit, plus the claim's commit (the claim is durable), plus 0.3 ms.
  # The lease's started_at comes before the claim commits, so the first figure has no commit.
  local allow
  allow=$(calc %.2f "$i50 + $c50 + 0.3")
  fig latency "p50 $p50 ms, p99 $p99 ms" \
    "pickup (started_at - created_at) of $n rows, 1 INSERT per ${LAT_INTERVAL_MS} ms for ${LAT_SECONDS} s, C=$C idle slots: p50 $p50 / p95 $p95 / p99 $p99 / max $max ms; of which the INSERT's own statement and commit (psql \\timing) p50 $i50 / p99 $i99 ms; pickup after the INSERT returned p50 $a50 / p99 $a99 ms; to the handler's first statement p50 $h50 / p99 $h99 ms, against the allowance of the INSERT and its commit, a commit alone (the claim's: p50 $c50 / p99 $c99 ms) and 0.3 ms: $allow ms"
  dropdb
}

# depth_side NAME BACKLOG: drains N batch-scoped tasks with BACKLOG future rows; sets RATE.
depth_side() {
  newdb "$1"
  if (($2 > 0)); then
    q "INSERT INTO agent_work_queue (tenant_id, shard_key, payload, run_after)
       SELECT 'bench', 'b' || g, jsonb_build_object('b', g), now() + interval '10 years'
         FROM generate_series(1, $2) g" >/dev/null
  fi
  tasks "$N" 0 depth >"$WORK/t.jsonl"
  enqueue "$WORK/t.jsonl" "$N"
  settle_db
  timed_drain "$1" "$LUA/noop.lua" --concurrency "$C" --until-empty --batch depth
  local d
  d=$(done_count)
  [[ $d == "$N" ]] || die "depth: $d of $N tasks done"
  RATE=$(calc %.1f "$N / $WALL")
  SIDE_WALL="$WALL s ($PARTS)"
  dropdb
}
w_depth() {
  local without with w0
  depth_side depth0 0
  without=$RATE w0=$SIDE_WALL
  depth_side depth1 "$DEPTH_BACKLOG"
  with=$RATE
  fig depth "$(calc %.2f "$with / $without")x" \
    "$N tasks of one batch, C=$C: $(calc %.0f "$without") tasks/s in $w0 without, $(calc %.0f "$with") tasks/s in $SIDE_WALL with $DEPTH_BACKLOG rows 10 years ahead"
}

w_one_row() {
  [[ -f $FLOOR_SQL/seed.sql && -f $FLOOR_SQL/floor_2tx.sql ]] \
    || die "no seed.sql and floor_2tx.sql in $FLOOR_SQL (set LEASH_BENCH_SQL)"
  # The floor: PostgreSQL moving rows pending -> leased -> done, two transactions per row.
  # Its table is made once; each round's pgbench takes rows from it.
  local floor_db=${DB_PREFIX}_floor floor_url
  echo "$floor_db" >>"$WORK/dbs"
  floor_url=$(scripts/pg.sh newdb "$floor_db")
  psql -X -q -v ON_ERROR_STOP=1 -d "$floor_url" -f "$FLOOR_SQL/seed.sql" >/dev/null
  DATABASE_URL=$floor_url q "INSERT INTO agent_work_queue (tenant_id, shard_key, payload, run_after)
     SELECT 'bench', 'f' || g, jsonb_build_object('i', g), now() - interval '1 hour'
       FROM generate_series(1, $FLOOR_ROWS) g" >/dev/null
  # One run of each swings by 10-20 % on this kind of machine, and not together: rounds
  # alternate leash and the floor, and the figure is the median of the rounds' ratios.
  local r ratios=() rounds=""
  for ((r = 1; r <= ONEROW_ROUNDS; r++)); do
    one_row_leash
    one_row_floor "$floor_url"
    ratios+=("$(calc %.3f "$ONEROW_RATE / $FLOOR_TPS")")
    rounds+="${rounds:+; }round $r: leash $(calc %.0f "$ONEROW_RATE") tasks/s over the work (${ONEROW_WALL} s = $PARTS; over the wall time $(calc %.0f "$N / $ONEROW_WALL")), floor $(calc %.0f "$FLOOR_TPS") rows/s, $(calc %.2f "$ONEROW_RATE / $FLOOR_TPS")x"
  done
  DB=$floor_db dropdb
  local median
  median=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  fig one-row "$(calc %.2f "$median")x floor" \
    "median of $ONEROW_ROUNDS rounds; leash: $N tasks, $ONEROW_PROCS processes x --concurrency 1 --claim-batch 1; floor: pgbench floor_2tx.sql, $FLOOR_CLIENTS clients, ${FLOOR_SECONDS} s, -M prepared; $rounds"
}

# one_row_leash: one drain of N tasks by ONEROW_PROCS one-slot processes. Like pgbench's tps
# (steady work, connection time left out), ONEROW_RATE is over the work: first claim to last
# settle. Start-up and exit (each process prints the scope's report when it ends) are in
# PARTS, and ONEROW_WALL is the whole.
one_row_leash() {
  newdb one-row
  tasks "$N" 0 >"$WORK/t.jsonl"
  enqueue "$WORK/t.jsonl" "$N"
  settle_db
  local i t0 t1 d pids=()
  t0=$(now_us)
  for ((i = 1; i <= ONEROW_PROCS; i++)); do
    start "onerow$i" "$LUA/noop.lua" --concurrency 1 --claim-batch 1 --until-empty
    pids+=("$PID")
  done
  for ((i = 1; i <= ONEROW_PROCS; i++)); do finish "onerow$i" "${pids[i - 1]}"; done
  t1=$(now_us)
  ONEROW_WALL=$(calc %.3f "($t1 - $t0) / 1e6")
  split_wall "$t0" "$t1"
  d=$(done_count)
  [[ $d == "$N" ]] || die "one-row: $d of $N tasks done"
  ONEROW_RATE=$(calc %.1f "$N / $WORK_S")
  dropdb
}

# one_row_floor URL: one pgbench run of the floor; sets FLOOR_TPS.
one_row_floor() {
  local url=$1 jobs out left
  DATABASE_URL=$url settle_db
  jobs=$(nproc 2>/dev/null || echo 2)
  ((jobs <= FLOOR_CLIENTS)) || jobs=$FLOOR_CLIENTS
  out=$(pgbench -n -c "$FLOOR_CLIENTS" -j "$jobs" -T "$FLOOR_SECONDS" -M prepared \
          -f "$FLOOR_SQL/floor_2tx.sql" "$url" 2>"$WORK/pgbench.err") \
    || die "pgbench: $(tail -n 3 "$WORK/pgbench.err")"
  FLOOR_TPS=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' <<<"$out")
  [[ -n $FLOOR_TPS ]] || die "no tps in pgbench's output: $out"
  left=$(DATABASE_URL=$url q "SELECT count(*) FROM agent_work_queue WHERE status = 'pending'")
  ((left > 0)) || die "the floor's table ran dry ($FLOOR_ROWS rows)"
}

w_wide() {
  newdb wide
  tasks "$WIDE_TASKS" 0 "" "{\"s\":$WIDE_SLEEP}" >"$WORK/t.jsonl"
  enqueue "$WORK/t.jsonl" "$WIDE_TASKS"
  settle_db
  local t0 t1 pid wall
  t0=$(now_us)
  start wide "$LUA/sleep.lua" --concurrency "$WIDE_C" --until-empty
  pid=$PID
  # Sampler: every 100 ms, the number of backends in the worker's database (one psql
  # session in another database) and the worker's VmRSS.
  (
    while kill -0 "$pid" 2>/dev/null; do
      echo "SELECT count(*) FROM pg_stat_activity WHERE datname = '$DB';"
      vmrss "$pid" >>"$WORK/wide.rss" || true
      sleep 0.1
    done
  ) | psql -X -A -t -q -d postgres >"$WORK/wide.conns" &
  local sampler=$!
  finish wide "$pid"
  t1=$(now_us)
  wait "$sampler" || true
  wall=$(calc %.2f "($t1 - $t0) / 1e6")
  split_wall "$t0" "$t1"
  local d maxc peak samples
  d=$(done_count)
  [[ $d == "$WIDE_TASKS" ]] || die "wide: $d of $WIDE_TASKS tasks done"
  maxc=$(sort -n "$WORK/wide.conns" | tail -n 1)
  samples=$(wc -l <"$WORK/wide.conns")
  peak=$(sort -n "$WORK/wide.rss" | tail -n 1)

  # RSS per idle slot: idle workers (nothing runnable) at 10 and at WIDE_C slots.
  local n rss_small rss_big
  for n in 10 "$WIDE_C"; do
    start "idle$n" "$LUA/sleep.lua" --concurrency "$n" --drain-timeout 1
    wait_until "$n slots to run" 120 running "idle$n" "$n"
    if ((n == 10)); then rss_small=$(rss_idle "$PID"); else rss_big=$(rss_idle "$PID"); fi
    stop "idle$n" "$PID"
  done
  fig wide "${wall} s, $maxc connections, $(calc %.0f "($rss_big - $rss_small) / ($WIDE_C - 10)") KB/idle slot" \
    "$WIDE_TASKS tasks x leash.sleep($WIDE_SLEEP), one process, --concurrency $WIDE_C: ${wall} s = $PARTS; most connections seen $maxc ($samples samples); VmRSS peak ${peak} kB; idle VmRSS ${rss_small} kB at 10 slots, ${rss_big} kB at $WIDE_C"
  dropdb
}

w_idle() {
  newdb idle
  settle_db
  start idle "$LUA/noop.lua" --concurrency "$IDLE_SLOTS"
  local pid=$PID x0 x1 t0 t1 secs
  wait_until "the idle worker to run" 60 running idle "$IDLE_SLOTS"
  nap "$IDLE_WARM"   # past the start-up statements, their counters flushed
  x0=$(xacts) t0=$(now_us)
  nap "$IDLE_SECONDS"
  x1=$(xacts) t1=$(now_us)
  stop idle "$pid"
  x0=${x0%%|*} x1=${x1%%|*}
  secs=$(calc %.1f "($t1 - $t0) / 1e6")
  fig idle "$(calc %.2f "($x1 - $x0) / $secs") statements/s" \
    "$((x1 - x0)) transactions in ${secs} s from one idle worker (--concurrency $IDLE_SLOTS, from ${IDLE_WARM} s after start), pg_stat_database"
  dropdb
}

w_heartbeat() {
  newdb heartbeat
  # An exact cross-check that no statistics delay blurs: a statement-level trigger logs, by
  # the server's clock, every UPDATE statement on the queue and how many rows it touched.
  q "CREATE TABLE bench_updates (at timestamptz NOT NULL DEFAULT clock_timestamp(), n int NOT NULL);
     CREATE FUNCTION bench_updates_f() RETURNS trigger LANGUAGE plpgsql AS \$\$
     BEGIN INSERT INTO bench_updates (n) SELECT count(*) FROM new_rows; RETURN NULL; END \$\$;
     CREATE TRIGGER bench_updates AFTER UPDATE ON agent_work_queue REFERENCING NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION bench_updates_f()" >/dev/null
  tasks "$HB_SLOTS" 0 "" "{\"s\":$HB_SLEEP}" >"$WORK/t.jsonl"
  enqueue "$WORK/t.jsonl" "$HB_SLOTS"
  settle_db
  start hb "$LUA/sleep.lua" --concurrency "$HB_SLOTS" --heartbeat "$HB_INTERVAL" --drain-timeout 1
  local pid=$PID x0 x1 s0 s1 t0 t1 secs r ups rows
  wait_until "$HB_SLOTS leases" 30 q_true "SELECT count(*) = $HB_SLOTS FROM agent_work_queue WHERE status = 'leased'"
  nap "$HB_WARM"   # the claims' counters flushed
  x0=$(xacts) t0=$(now_us)
  nap "$HB_WINDOW"
  x1=$(xacts) t1=$(now_us)
  s0=${x0#*|} s1=${x1#*|} x0=${x0%%|*} x1=${x1%%|*}
  r=$(q "SELECT count(*), coalesce(string_agg(DISTINCT n::text, ','), '-') FROM bench_updates
          WHERE at > '$s0' AND at <= '$s1'")
  IFS='|' read -r ups rows <<<"$r"
  stop hb "$pid"
  secs=$(calc %.2f "($t1 - $t0) / 1e6")
  fig heartbeat "$(calc %.2f "($x1 - $x0) / ($secs / $HB_INTERVAL)") statements/interval" \
    "$((x1 - x0)) transactions (pg_stat_database) in ${secs} s, one process holding $HB_SLOTS leases, --heartbeat ${HB_INTERVAL}s, from ${HB_WARM} s after the claims; UPDATE statements on the queue in the window (trigger): $ups, rows each: $rows"
  dropdb
}

# ------------------------------------------------------------------ scheduler workloads (issue 14)
# ins N TENANT SHARD [PAYLOAD] [PRIORITY]: plain SQL INSERT ... SELECT of N rows, g = 0..N-1,
# in g order (ids follow g); the arguments are SQL expressions in g (the table is the API:
# its triggers make the heads). Checks the count.
ins() {
  local got
  got=$(q "WITH i AS (INSERT INTO agent_work_queue (tenant_id, shard_key, payload, priority)
                      SELECT $2, $3, ${4:-"'{}'::jsonb"}, ${5:-0} FROM generate_series(0, $1 - 1) g
                       ORDER BY g RETURNING 1)
           SELECT count(*) FROM i")
  [[ $got == "$1" ]] || die "inserted $got rows, want $1"
}
# median X...: the median of the numbers, to 2 decimals.
median() {
  printf '%s\n' "$@" | sort -g \
    | awk '{ v[NR] = $1 } END { printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# drain_rate NAME ARGS...: timed_drain of noop.lua at C slots, all rows done; sets RATE.
drain_rate() {
  local name=$1 d
  shift
  timed_drain "$name" "$LUA/noop.lua" --concurrency "$C" --until-empty "$@"
  d=$(done_count)
  [[ $d == "$(q "SELECT count(*) FROM agent_work_queue")" ]] || die "$name: only $d tasks done"
  RATE=$(calc %.1f "$d / $WALL")
}
# since T0_US WHERE: seconds from T0 (the host's clock, the server's is the same one) to the
# last finished_at of the rows WHERE selects, and their count: "seconds|count".
since() {
  q "SELECT round(extract(epoch FROM max(finished_at)) - $1 / 1e6, 3), count(*)
       FROM agent_work_queue WHERE $2"
}

# block_side NAME SHARD_EXPR: N no-op tasks with that shard key (an SQL expression in g);
# sets RATE and SIDE ("rate in wall time (parts)").
block_side() {
  newdb "$1"
  ins "$N" "'bench'" "$2"
  settle_db
  drain_rate "$1"
  # A drain that ends on a few shards runs its tail one lane each: how many shards the last
  # tenth of the settles were on, and how long that tenth took.
  local tail
  tail=$(q "WITH l AS (SELECT shard_key, finished_at FROM agent_work_queue
                        ORDER BY finished_at DESC LIMIT greatest(1, $N / 10))
            SELECT count(DISTINCT shard_key) || ' shards in '
                   || round(extract(epoch FROM max(finished_at) - min(finished_at))::numeric, 3) || ' s'
              FROM l")
  SIDE="$(calc %.0f "$RATE") tasks/s in $WALL s ($PARTS; the last tenth on $tail)"
  dropdb
}
w_blocks() {
  local per=$(((N + 99) / 100)) r inter ratios=() rounds=""
  for ((r = 1; r <= PAIR_ROUNDS; r++)); do
    block_side blocks-i "'k' || (g % 100)"
    inter=$RATE
    rounds+="${rounds:+; }round $r: interleaved $SIDE"
    block_side blocks-b "'k' || (g / $per)"
    ratios+=("$(calc %.3f "$RATE / $inter")")
    rounds+=", shard by shard $SIDE, $(calc %.2f "$RATE / $inter")x"
  done
  fig blocks "$(median "${ratios[@]}")x interleaved (target >= 0.8)" \
    "median of $PAIR_ROUNDS rounds; $N no-op tasks over 100 shards, one process, C=$C, enqueued interleaved (k = i % 100) and shard by shard ($per a shard, k = i / $per); $rounds"
}

# parked_side NAME PARKED: PARK_FREE free tasks (own shards) after PARKED runnable ones in 10
# shards of the same tenant (one lease per shard at a time: all but 10 wait behind their
# heads), one process at PARK_C slots; sets PARK_S (process start to the last free one's
# settle) and PARK_BUSY (parked ones done by then).
parked_side() {
  local t0 pid r n
  newdb "$1"
  (($2 == 0)) || ins "$2" "'bench'" "'p' || (g % 10)"
  ins "$PARK_FREE" "'bench'" "'f' || g"
  settle_db
  t0=$(now_us)
  start "$1" "$LUA/noop.lua" --concurrency "$PARK_C" --drain-timeout 5
  pid=$PID
  wait_until "the free tasks to be done" 300 q_true \
    "SELECT count(*) = $PARK_FREE FROM agent_work_queue WHERE shard_key LIKE 'f%' AND status = 'done'"
  stop "$1" "$pid"
  r=$(since "$t0" "shard_key LIKE 'f%'")
  IFS='|' read -r PARK_S n <<<"$r"
  [[ $n == "$PARK_FREE" ]] || die "parked: $n free tasks, want $PARK_FREE"
  PARK_BUSY=$(q "SELECT count(*) FROM agent_work_queue WHERE shard_key LIKE 'p%' AND status = 'done'")
  dropdb
}
w_parked() {
  # A drain of 2,000 no-op tasks lasts a few tenths of a second, and one swings by 2x or
  # more on a shared machine: rounds alternate the two sides, the figure is the median ratio.
  local r ratios=() rounds="" plain park
  for ((r = 1; r <= PARK_ROUNDS; r++)); do
    parked_side parked-plain 0
    plain=$(calc %.1f "$PARK_FREE / $PARK_S")
    rounds+="${rounds:+; }round $r: alone $(calc %.0f "$plain") tasks/s (${PARK_S} s)"
    parked_side parked "$PARK_ROWS"
    park=$(calc %.1f "$PARK_FREE / $PARK_S")
    ratios+=("$(calc %.3f "$park / $plain")")
    rounds+=", behind the parked $(calc %.0f "$park") tasks/s (${PARK_S} s, $PARK_BUSY parked done by then), $(calc %.2f "$park / $plain")x"
  done
  fig parked "$(median "${ratios[@]}")x alone (target >= 0.5)" \
    "median of $PARK_ROUNDS rounds; $PARK_FREE free tasks (own shards), one process, --concurrency $PARK_C, process start to the last one's settle, alone and enqueued after $PARK_ROWS runnable tasks in 10 shards; $rounds"
}

# fair_side NAME WEIGHT_A: A's FAIR_A tasks, then B's FAIR_B (own shards each), 2 processes x
# 10 slots of 5 ms tasks until all of B has started; sets SHARE_B (%) and SEEN (rows claimed
# while both had work: started_at <= the start of B's last task).
fair_side() {
  newdb "$1"
  ins "$FAIR_A" "'A'" "'a' || g" "'{\"s\":0.005}'::jsonb"
  ins "$FAIR_B" "'B'" "'b' || g" "'{\"s\":0.005}'::jsonb"
  (($2 == 1)) || q "INSERT INTO agent_work_queue_tenants (tenant_id, weight) VALUES ('A', $2)" >/dev/null
  settle_db
  local p1 p2 r
  start "$1-1" "$LUA/sleep.lua" --concurrency 10 --drain-timeout 5
  p1=$PID
  start "$1-2" "$LUA/sleep.lua" --concurrency 10 --drain-timeout 5
  p2=$PID
  wait_until "all of B to start" 300 q_true \
    "SELECT count(*) = $FAIR_B FROM agent_work_queue WHERE tenant_id = 'B' AND started_at IS NOT NULL"
  stop "$1-1" "$p1"
  stop "$1-2" "$p2"
  r=$(q "WITH t AS (SELECT max(started_at) AS b_end FROM agent_work_queue WHERE tenant_id = 'B')
         SELECT round(100.0 * count(*) FILTER (WHERE tenant_id = 'B') / count(*), 1), count(*)
           FROM agent_work_queue, t WHERE started_at <= t.b_end")
  IFS='|' read -r SHARE_B SEEN <<<"$r"
  dropdb
}
w_fairness() {
  local b1 n1 b3 n3
  fair_side fair1 1
  b1=$SHARE_B n1=$SEEN
  fair_side fair3 3
  b3=$SHARE_B n3=$SEEN
  fig fairness "$b1% B at 1:1 (target 50 +- 5), $(calc %.1f "100 - $b3")% A at 3:1 (target 75 +- 5)" \
    "tenant A $FAIR_A tasks queued first, B $FAIR_B after, own shards each, leash.sleep(0.005), 2 processes x 10 slots; share of the claims while both had work (started_at <= B's last start): weights 1:1 B $b1% of $n1 rows; weights A 3 : B 1 B $b3% of $n3 rows"
}

w_priority() {
  newdb priority
  ins "$PRIO_ROWS" "'bench'" "'d' || g"
  settle_db
  local pid r before after same claims pickup ran
  start priority "$LUA/noop.lua" --concurrency "$C" --drain-timeout 5
  pid=$PID
  wait_until "$PRIO_AFTER tasks done" 120 q_true \
    "SELECT count(*) >= $PRIO_AFTER FROM agent_work_queue WHERE status = 'done'"
  q "INSERT INTO agent_work_queue (tenant_id, shard_key, payload, priority)
     VALUES ('bench', 'urgent', '{}', 10)" >/dev/null
  wait_until "the priority-10 task to be done" 120 q_true \
    "SELECT status = 'done' FROM agent_work_queue WHERE shard_key = 'urgent'"
  stop priority "$pid"
  # "After it was inserted" is from its created_at (its transaction's start, the server's
  # clock, as started_at is): claims begun while its INSERT was still open count too, so the
  # figure errs high, never low. started_at is the claim's transaction time: one claim's
  # rows share it. run_started_at (when handle began) shows the ready buffer's part: tasks
  # claimed before it and run before it all the same.
  r=$(q "WITH u AS (SELECT created_at AS c, started_at AS s, run_started_at AS rs
                      FROM agent_work_queue WHERE shard_key = 'urgent'),
              b AS (SELECT q.started_at FROM agent_work_queue q, u
                     WHERE q.started_at >= u.c AND q.started_at < u.s)
         SELECT (SELECT count(*) FROM agent_work_queue q, u WHERE q.started_at < u.c),
                (SELECT count(*) FROM b), (SELECT count(DISTINCT started_at) FROM b),
                (SELECT count(*) FROM agent_work_queue q, u
                  WHERE q.started_at = u.s AND q.shard_key <> 'urgent'),
                (SELECT round(extract(epoch FROM u.s - u.c) * 1000, 1) FROM u),
                (SELECT count(*) FROM agent_work_queue q, u
                  WHERE q.run_started_at > u.c AND q.run_started_at < u.rs)")
  IFS='|' read -r before after claims same pickup ran <<<"$r"
  dropdb
  fig priority "$after tasks claimed before it (target <= claim batch + slots = $((100 + C)))" \
    "one process, C=$C, --claim-batch 100 (the default), $PRIO_ROWS priority-0 tasks (own shards); a priority-10 task inserted after $before had been claimed: claimed ${pickup} ms after its INSERT began, $after tasks claimed in between (in $claims claims), $same beside it in its own claim; $ran tasks began to run after its INSERT and before it did"
}

w_tenants() {
  local r one ratios=() rounds=""
  for ((r = 1; r <= PAIR_ROUNDS; r++)); do
    block_side tenants-one "'d' || g"
    one=$RATE
    rounds+="${rounds:+; }round $r: one tenant $SIDE"
    # block_side's tasks are tenant 'bench'; here they move to N/2 tenants before the drain.
    newdb tenants-many
    ins "$N" "'t' || (g % $((N / 2)))" "'d' || g"
    settle_db
    drain_rate tenants-many
    dropdb
    ratios+=("$(calc %.3f "$RATE / $one")")
    rounds+=", $((N / 2)) tenants $(calc %.0f "$RATE") tasks/s in $WALL s ($PARTS), $(calc %.2f "$RATE / $one")x"
  done
  fig tenants "$(median "${ratios[@]}")x one tenant (target >= 0.7)" \
    "median of $PAIR_ROUNDS rounds; $N no-op tasks (own shards), one process, C=$C, in one tenant and over $((N / 2)) tenants (2 each); $rounds"
}

w_leases() {
  newdb leases
  # One task in four sleeps 150 ms, the others 2 ms.
  ins "$LEASE_TASKS" "'bench'" "'d' || g" \
    "CASE WHEN g % 4 = 0 THEN '{\"s\":0.15}' ELSE '{\"s\":0.002}' END::jsonb"
  settle_db
  local pid t0 t1 maxl samples d
  t0=$(now_us)
  start leases "$LUA/sleep.lua" --concurrency 2 --until-empty
  pid=$PID
  # Sampler: one psql session, every 50 ms, the leased rows (all of them are this process's).
  (
    while kill -0 "$pid" 2>/dev/null; do
      echo "SELECT count(*) FROM agent_work_queue WHERE status = 'leased';"
      sleep 0.05
    done
  ) | psql -X -A -t -q -d "$DATABASE_URL" >"$WORK/leases.samples" &
  local sampler=$!
  finish leases "$pid"
  t1=$(now_us)
  wait "$sampler" || true
  split_wall "$t0" "$t1"
  d=$(done_count)
  [[ $d == "$LEASE_TASKS" ]] || die "leases: $d of $LEASE_TASKS tasks done"
  maxl=$(sort -n "$WORK/leases.samples" | tail -n 1)
  samples=$(wc -l <"$WORK/leases.samples")
  local dist
  dist=$(sort -n "$WORK/leases.samples" | uniq -c | awk '{ printf "%s%s: %s", (NR > 1 ? ", " : ""), $2, $1 }')
  dropdb
  fig leases "$maxl leases at most (target <= 4 = 2 x slots)" \
    "one process, --concurrency 2, $LEASE_TASKS tasks (1 in 4 leash.sleep(0.15), the rest 0.002): $(calc %.2f "($t1 - $t0) / 1e6") s = $PARTS; leased rows sampled every 50 ms ($samples samples, leased: count) $dist"
}

# ------------------------------------------------------------------ budgets
# mock ARGS...: scripts/mock_llm.py on a free port (stopped when the workload ends); MOCK_URL.
mock() {
  python3 scripts/mock_llm.py --port 0 --idle-exit 900 "$@" >"$WORK/mock.out" 2>"$WORK/mock.log" &
  LIVE_MOCK=$!
  LIVE[$LIVE_MOCK]=1
  wait_until "the mock to print its port" 10 grep -q '^PORT [0-9]' "$WORK/mock.out"
  MOCK_URL=http://127.0.0.1:$(sed -n '1s/^PORT //p' "$WORK/mock.out")
}
# mock_json EXPR: a Python expression over s, the mock's /_stats.
mock_json() {
  python3 -c 'import json, sys, urllib.request
s = json.load(urllib.request.urlopen(sys.argv[1] + "/_stats", timeout=10))
print(eval(sys.argv[2]))' "$MOCK_URL" "$1"
}
calls_table() {
  q "CREATE TABLE calls (task_id bigint, attempt int, status int, budget text,
                         at timestamptz NOT NULL DEFAULT clock_timestamp())" >/dev/null
}
# llm_tasks N URL BUDGET TOKENS PROMPT_BYTES: JSONL for bench/lua/llm_call.lua.
llm_tasks() {
  awk -v n="$1" -v u="$2" -v b="$3" -v t="$4" -v len="$5" 'BEGIN {
    pad = sprintf("%*s", len, ""); gsub(/ /, "x", pad)
    for (i = 0; i < n; i++)
      printf "{\"payload\":{\"url\":\"%s\",\"budget\":\"%s\",\"tokens\":%d,\"prompt\":\"%d %s\"}}\n", u, b, t, i, pad
  }'
}

w_budget() {
  newdb budget
  calls_table
  mock --rpm "$BUDGET_RPM" --tpm "$BUDGET_TPM" --window-s "$BUDGET_WINDOW"
  local per=$((BUDGET_TPM / BUDGET_RPM)) n=$((BUDGET_RPM * BUDGET_SECONDS / BUDGET_WINDOW * 2))
  # Prompts of (per - 20) tokens at 4 bytes each: with the answer's ~12 tokens, a call uses
  # about per tokens, so both limits bind together.
  "$LEASH" budget set llm --rpm "$BUDGET_RPM" --tpm "$BUDGET_TPM" --window "${BUDGET_WINDOW}s" >/dev/null
  llm_tasks "$n" "$MOCK_URL/v1/chat/completions" llm "$per" $(((per - 20) * 4)) >"$WORK/llm.jsonl"
  enqueue "$WORK/llm.jsonl" "$n"
  settle_db
  local p i
  for i in 1 2 3; do start "b$i" "$LUA/llm_call.lua" --concurrency 20; p[$i]=$PID; done
  nap "$BUDGET_WARM"
  local r0 t0 ok0 r1 t1 ok1
  IFS='|' read -r r0 ok0 t0 < <(mock_json '"%d|%d|%d" % (s["total"], s["answers"].get("/v1/chat/completions", {}).get("429", 0), s["tokens"]["total"])')
  local s0; s0=$(now_us)
  nap "$((BUDGET_SECONDS - BUDGET_WARM))"
  IFS='|' read -r r1 ok1 t1 < <(mock_json '"%d|%d|%d" % (s["total"], s["answers"].get("/v1/chat/completions", {}).get("429", 0), s["tokens"]["total"])')
  local s1; s1=$(now_us)
  for i in 1 2 3; do stop "b$i" "${p[$i]}"; done
  local secs reqs refused toks share_r share_t share_429
  secs=$(calc %.1f "($s1 - $s0) / 1e6")
  reqs=$((r1 - r0)) refused=$((ok1 - ok0)) toks=$((t1 - t0))
  share_r=$(calc %.1f "100 * ($reqs - $refused) / ($BUDGET_RPM * $secs / $BUDGET_WINDOW)")
  share_t=$(calc %.1f "100 * $toks / ($BUDGET_TPM * $secs / $BUDGET_WINDOW)")
  share_429=$(calc %.2f "($reqs > 0 ? 100 * $refused / $reqs : 0)")
  kill "$LIVE_MOCK" 2>/dev/null || true
  dropdb
  fig budget "$share_r% of the request limit, $share_t% of the token limit (target >= 90%); $share_429% answered 429 (target <= 1%)" \
    "3 processes x 20 slots, one budget = the mock's limit ($BUDGET_RPM requests, $BUDGET_TPM tokens per ${BUDGET_WINDOW} s, all clients together), measured from ${BUDGET_WARM} s to ${BUDGET_SECONDS} s ($secs s): $((reqs - refused)) answered, $refused refused, $toks tokens, by the mock's own counts"
}

w_outage() {
  newdb outage
  calls_table
  mock
  "$LEASH" budget set llm --rpm "$OUT_RPM" --window "${OUT_WINDOW}s" >/dev/null
  "$LEASH" budget set embed --rpm "$OUT_RPM" --window "${OUT_WINDOW}s" >/dev/null
  llm_tasks "$OUT_TASKS" "$MOCK_URL/v1/chat/completions" llm 20 40 >"$WORK/a.jsonl"
  llm_tasks "$OUT_OTHER" "$MOCK_URL/v1/embeddings" embed 20 40 >"$WORK/b.jsonl"
  local got
  got=$("$LEASH" enqueue --budget llm --file "$WORK/a.jsonl") || die "enqueue failed"
  [[ $got == "$OUT_TASKS" ]] || die "enqueued $got of $OUT_TASKS"
  # The other budget's tasks trickle in (as a second provider's work would): a tenth of them
  # now, the rest during the outage.
  head -n $((OUT_OTHER / 10)) "$WORK/b.jsonl" | "$LEASH" enqueue --budget embed --file - >/dev/null
  settle_db
  local p i
  for i in 1 2 3; do start "o$i" "$LUA/llm_call.lua" --concurrency 20 "${OUT_ARGS[@]}"; p[$i]=$PID; done
  wait_until "a third of llm's tasks" 600 q_true \
    "SELECT count(*) >= $((OUT_TASKS / 3)) FROM calls WHERE budget = 'llm' AND status = 200"
  curl -sf -X POST -d "{\"outage_s\": $OUT_SECONDS, \"retry_after\": $OUT_RETRY, \"paths\": [\"/v1/chat/completions\"]}" \
    "$MOCK_URL/_control" >/dev/null || die "the mock refused the outage"
  local o0 o1
  o0=$(q "SELECT extract(epoch FROM clock_timestamp())")
  tail -n +$((OUT_OTHER / 10 + 1)) "$WORK/b.jsonl" | "$LEASH" enqueue --budget embed --file - >/dev/null
  o1=$(calc %.3f "$o0 + $OUT_SECONDS")
  wait_until "every task to settle" $((OUT_SECONDS + 1800)) q_true \
    "SELECT count(*) = 0 FROM agent_work_queue WHERE status IN ('pending', 'leased')"
  for i in 1 2 3; do stop "o$i" "${p[$i]}"; done
  local dead most resume during refused
  dead=$(q "SELECT count(*) FROM agent_work_queue WHERE status = 'dead'")
  most=$(q "SELECT max(attempts) FROM agent_work_queue")
  resume=$(q "SELECT round((extract(epoch FROM min(at)) - $o1)::numeric, 1) FROM calls
               WHERE budget = 'llm' AND status = 200 AND extract(epoch FROM at) > $o1")
  during=$(q "SELECT count(*) FROM calls WHERE budget = 'embed' AND status = 200
               AND extract(epoch FROM at) BETWEEN $o0 AND $o1")
  refused=$(mock_json 's["outage_refused"]')
  kill "$LIVE_MOCK" 2>/dev/null || true
  dropdb
  fig outage "$dead dead (target 0), most attempts $most (target 1: none spent on 429s), llm answered again $resume s after the outage (target <= $((OUT_RETRY + 5))), $during answers of the other budget during it (target > 0)" \
    "3 processes x 20 slots, ${OUT_ARGS[*]:-default settings}; $OUT_TASKS tasks of budget llm ($OUT_RPM per $OUT_WINDOW s) and $OUT_OTHER of budget embed on another endpoint; an outage of llm's endpoint for $OUT_SECONDS s (429, Retry-After: $OUT_RETRY) after a third of llm's tasks; the mock refused $refused requests in it"
}

# ------------------------------------------------------------------ main
server=$(qp "SHOW server_version" | cut -d' ' -f1)
fsync=$(qp "SHOW fsync") sync=$(qp "SHOW synchronous_commit")
say "leash $("$LEASH" --version | awk 'NR == 1 { print $NF }'), PostgreSQL $server (fsync=$fsync), N=$N C=$C$( ((SMOKE)) && echo ", smoke")"

failed=0
for w in "${WL[@]}"; do
  WL_LOAD=$(load1)
  say "$w ... (load $WL_LOAD)"
  # Each workload in its own subshell (set -e holds there: it is not a condition), so that
  # one failing is reported and the others still run.
  (
    trap stop_live EXIT
    trap 'exit 143' TERM
    "w_${w//-/_}"
  ) &
  WL_PID=$!
  rc=0
  wait "$WL_PID" || rc=$?
  WL_PID=""
  if ((rc != 0)); then
    failed=1
    printf '%s\t%s\t%s\t%s\n' "$w" "failed (status $rc)" "see the messages above" "$WL_LOAD" >>"$WORK/rows"
  fi
done

echo
echo "leash bench: leash $("$LEASH" --version | awk 'NR == 1 { print $NF }') ($LEASH), PostgreSQL $server, fsync=$fsync, synchronous_commit=$sync, $(nproc) CPUs, N=$N, C=$C$( ((SMOKE)) && echo ", --smoke")"
echo
echo "| workload | figure | details | load |"
echo "|---|---|---|---|"
while IFS=$'\t' read -r w f d l; do
  echo "| $w | $f | $d | $l |"
done <"$WORK/rows"
exit "$failed"
