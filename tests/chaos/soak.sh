#!/usr/bin/env bash
# Chaos soak: P `leash run` processes × M slots over a stream of N tasks, while a seeded driver
# kills -9 and restarts workers, SIGSTOPs them past their lease, SIGTERMs them, terminates
# their database backends, restarts or freezes PostgreSQL and hot-swaps the script (one swap
# in three a broken version that must be refused). At the end it checks the invariants in SQL
# (tests/chaos/checks.sql) and prints them as figures; exit 1 if one fails.
#
#   tests/chaos/soak.sh [--duration S] [--tasks N] [--procs P] [--slots M] [--seed X] [--keep]
#                       [--workdir DIR] [--visibility S] [--heartbeat S] [--drain-max S]
#                       [--poison N] [--hostile PERMILLE] [--blocks] [--budget RPM]
#
# Defaults: 60 s, 3,000 tasks, 3 × 4, seed 1. The chaos lasts --duration; the producer
# enqueues everything during its first 80 %; afterwards the workers drain what is left (at
# most --drain-max, default 300 s) and are stopped with SIGTERM.
#
# The hostile mix (tests/chaos/task.lua): --poison N tasks (default one per 1,500, at least 2)
# kill every worker that runs them, half by the driver's kill -9 as soon as one is leased,
# half by wedging their slot in C until the watchdog restarts the worker; each must end
# quarantined after at most max_crashes (3) crashes. --hostile PERMILLE (default 10) of the
# other tasks misbehave on their first attempt (a raising __tostring, a memory bomb, loops,
# a backtracking pattern, nil-msg, CR/LF in logs, yields, __gc, a huge result, leaked
# globals) and must be done in the end. Other tasks carry max_crashes 100: the chaos's own
# kills are crashes too, and must not quarantine an innocent task.
#
# --blocks enqueues each chunk lane by lane (2 tenants x 25 shards), a lane's tasks
# together, instead of at random: the shard-by-shard order the scheduler's heads exist for
# (sql/011), with every lane still getting work all along. The driver also changes statuses by hand now and then (a pending head set
# dead, then pending again, in two transactions), which the heads' triggers must survive.
#
# --budget RPM puts every LLM call under a leash budget (issue 15): the mock refuses past RPM
# requests a minute for all clients together (429, Retry-After) instead of 5 % at random, and
# has an outage (every request 429, Retry-After: 5) from a third of --duration for a sixth of
# it; the budget is set to the same RPM and the tasks carry it (enqueue --budget). Then no
# task may die of a 429 or a budget wait (checks.sql).
#
# Everything is its own: a throwaway cluster (scripts/pg.sh), the mock LLM
# (scripts/mock_llm.py: 5 % 429, 5 % 500, latency 0-100 ms against a 100 ms client timeout),
# the workers (--visibility 3 --heartbeat 1, --worker-id w<slot>-gen<n>, one log per
# incarnation). The work folder (logs, the driver's events.tsv, produced.tsv, the figures and,
# on failure or with --keep, a pg_dump of the database) is removed on success unless --keep.
# LEASH_BIN picks the binary (default build/leash).
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LEASH=${LEASH_BIN:-$SRC/build/leash}
PGSH=$SRC/scripts/pg.sh

DURATION=60 TASKS=3000 PROCS=3 SLOTS=4 SEED=1 KEEP=0 WORK="" VIS=3 HB=1 DRAIN_MAX=300
POISON="" HOSTILE=10 BLOCKS=0 BUDGET_RPM=0
SQL_EVERY=53          # every task n with n % 53 = 0 goes in by plain SQL INSERT
PG_GAP_MIN=15 PG_GAP_MAX=45   # seconds between two PostgreSQL restarts

usage() { sed -n '2,30s/^# \{0,1\}//p' "$0"; }
die() { echo "soak: $*" >&2; RC=2; exit 2; }

while (($#)); do
  case $1 in
    --duration) DURATION=${2:?}; shift ;;
    --tasks) TASKS=${2:?}; shift ;;
    --procs) PROCS=${2:?}; shift ;;
    --slots) SLOTS=${2:?}; shift ;;
    --seed) SEED=${2:?}; shift ;;
    --keep) KEEP=1 ;;
    --workdir) WORK=${2:?}; shift ;;
    --visibility) VIS=${2:?}; shift ;;
    --heartbeat) HB=${2:?}; shift ;;
    --drain-max) DRAIN_MAX=${2:?}; shift ;;
    --poison) POISON=${2:?}; shift ;;
    --hostile) HOSTILE=${2:?}; shift ;;
    --blocks) BLOCKS=1 ;;
    --budget) BUDGET_RPM=${2:?}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
  shift
done
for v in DURATION TASKS PROCS SLOTS SEED DRAIN_MAX; do
  [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || die "--${v,,} wants a positive integer"
done
((${#POISON})) || POISON=$((TASKS / 1500 > 2 ? TASKS / 1500 : 2))
for v in POISON HOSTILE BUDGET_RPM; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--${v,,} wants a whole number"
done
((HOSTILE <= 1000)) || die "--hostile is a per mille share (0-1000)"
[[ -x $LEASH ]] || die "no leash binary at $LEASH (build it, or set LEASH_BIN)"
command -v python3 >/dev/null || die "python3 is needed for the mock LLM"

if [[ -z $WORK ]]; then
  WORK=$(mktemp -d /tmp/leash-chaos.XXXXXX)
else
  mkdir -p "$WORK" || die "cannot create $WORK"
  WORK=$(cd "$WORK" && pwd)
fi
# pg.sh runs the server as `postgres` when we are root: it must be able to reach $WORK/pg.
chmod 0755 "$WORK"
mkdir -p "$WORK/logs" "$WORK/script"
: >"$WORK/events.tsv"
: >"$WORK/produced.tsv"
: >"$WORK/incarnations.tsv"

# ------------------------------------------------------------------ helpers
us() { local t=${EPOCHREALTIME/[.,]/}; echo $((10#$t)); }
T0=$(us)
say() { printf '[soak %6.1fs] %s\n' "$(( ($(us) - T0) / 100000 ))e-1" "$*" >&2; }
# ev KIND TARGET [DETAIL]: one line of the driver's record (loaded into `events` at the end).
ev() { printf '%s\t%s\t%s\t%s\n' "${EPOCHREALTIME/,/.}" "$1" "${2:-}" "${3:-}" >>"$WORK/events.tsv"; }
# rnd LO HI: an integer in [LO, HI] from the seeded RANDOM, in R (not through $(...): a
# subshell reseeds RANDOM, and the run would not follow its seed).
rnd() { R=$(($1 + RANDOM % ($2 - $1 + 1))); }
export PGCONNECT_TIMEOUT=5
psql_q() { psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" "$@"; }

PG_DIR="" MOCK_PID="" PRODUCER_PID="" PG_FROZEN="" PG_THAW_AT=0
declare -a W_PID W_GEN W_NAME W_STATE W_UNTIL
RC=1

# shellcheck disable=SC2317 # reached through the EXIT trap
cleanup() {
  local i pid
  trap - EXIT INT TERM
  for i in "${!W_PID[@]}"; do
    pid=${W_PID[i]}
    [[ -n $pid ]] || continue
    kill -CONT "$pid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  for pid in $PRODUCER_PID $MOCK_PID; do
    kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  done
  # shellcheck disable=SC2086 # a list of pids
  [[ -z $PG_FROZEN ]] || kill -CONT $PG_FROZEN 2>/dev/null
  if [[ -n $PG_DIR ]]; then
    if ((RC != 0 || KEEP)) && [[ -n ${DATABASE_URL:-} ]]; then
      pg_dump -Fc -d "$DATABASE_URL" -f "$WORK/chaos.dump" 2>/dev/null \
        && echo "soak: database dumped to $WORK/chaos.dump" >&2
    fi
    "$PGSH" stop "$PG_DIR" >/dev/null 2>&1
  fi
  if ((RC == 0 && KEEP == 0)); then
    rm -rf "$WORK"
  else
    echo "soak: evidence kept in $WORK" >&2
  fi
  exit "$RC"
}
trap cleanup EXIT
trap 'RC=130; exit' INT
trap 'RC=143; exit' TERM
trap 'RC=129; exit' HUP

# ------------------------------------------------------------------ set-up
say "work folder $WORK; seed $SEED; $PROCS procs x $SLOTS slots; $TASKS tasks over ${DURATION}s"
pg_env=$("$PGSH" start "$WORK/pg") || die "scripts/pg.sh start failed"
eval "$pg_env"
PG_DIR=$LEASH_PG_DIR
DATABASE_URL=$("$PGSH" newdb chaos) || die "cannot create the database"
export DATABASE_URL
"$LEASH" migrate >/dev/null 2>"$WORK/migrate.log" || die "leash migrate failed (see $WORK/migrate.log)"
psql_q -f "$SRC/tests/chaos/setup.sql" >/dev/null || die "setup.sql failed"

MOCK_FAULTS=(--rate-429 0.05 --rate-500 0.05)
if ((BUDGET_RPM)); then
  MOCK_FAULTS=(--rate-500 0.05 --rpm "$BUDGET_RPM" --outage "$((DURATION / 3))+$((DURATION / 6 + 1))"
               --outage-retry-after 5)
fi
python3 "$SRC/scripts/mock_llm.py" --port 0 "${MOCK_FAULTS[@]}" --latency-ms 0-100 \
  --seed "$SEED" --idle-exit $((DURATION + DRAIN_MAX + 600)) >"$WORK/mock.out" 2>"$WORK/mock.log" &
MOCK_PID=$!
for _ in $(seq 100); do grep -q '^PORT [0-9]' "$WORK/mock.out" 2>/dev/null && break; sleep 0.1; done
MOCK_PORT=$(sed -n '1s/^PORT //p' "$WORK/mock.out")
[[ -n $MOCK_PORT ]] || die "the mock LLM did not start"
psql_q -c "INSERT INTO chaos_config VALUES ('mock_url', 'http://127.0.0.1:$MOCK_PORT/v1/chat/completions')" \
  >/dev/null || die "cannot write chaos_config"
if ((BUDGET_RPM)); then
  psql_q -c "INSERT INTO chaos_config VALUES ('budget', 'llm')" >/dev/null || die "cannot write chaos_config"
  "$LEASH" budget set llm --rpm "$BUDGET_RPM" >/dev/null || die "leash budget set failed"
fi

SCRIPT=$WORK/script/task.lua
VERSION_N=1
SCRIPT_GOOD=1
cp "$SRC/tests/chaos/task.lua" "$SCRIPT"
"$LEASH" check "$SCRIPT" >/dev/null || die "tests/chaos/task.lua does not pass leash check"

# write_version V [broken]: rewrites the script's VERSION line into a temp file (not *.lua,
# so the watcher ignores it) and moves it over the script: one atomic change.
write_version() {
  local v=$1 how=${2:-}
  sed "s/^local VERSION = .*/local VERSION = \"$v\"/" "$SRC/tests/chaos/task.lua" >"$SCRIPT.tmp"
  case $how in
    syntax) printf '\nthis is not Lua (%s)\n' "$v" >>"$SCRIPT.tmp" ;;
    contract) sed -i "s/^return {$/do return 42 end -- $v: the chunk returns no handle\nreturn {/" "$SCRIPT.tmp" ;;
  esac
  mv -f "$SCRIPT.tmp" "$SCRIPT"
}

# ------------------------------------------------------------------ workers
# Worker slot i runs one incarnation at a time, w<i>-gen<g>. States: run, stopped (SIGSTOP
# until W_UNTIL), draining (SIGTERM sent), down (restart at W_UNTIL).
start_worker() {
  local i=$1
  W_GEN[i]=$((${W_GEN[i]:-0} + 1))
  W_NAME[i]=w$i-gen${W_GEN[i]}
  "$LEASH" --log-format json run "$SCRIPT" --concurrency "$SLOTS" --visibility "$VIS" \
    --heartbeat "$HB" --worker-id "${W_NAME[i]}" --drain-timeout 2 --poll-ms 50-200 \
    --task-timeout 5 --watchdog-grace 1 --lua-memory 64 \
    --llm-batch-url "openai=http://127.0.0.1:$MOCK_PORT" --llm-batch-age 1 --llm-batch-poll 1 \
    >/dev/null 2>"$WORK/logs/${W_NAME[i]}.log" &
  W_PID[i]=$!
  W_STATE[i]=run
  printf '%s\t%s\t%s\t%s\t\n' "${W_NAME[i]}" "$i" "${W_PID[i]}" "${EPOCHREALTIME/,/.}" \
    >>"$WORK/incarnations.tsv"
  ev start "${W_NAME[i]}" "pid ${W_PID[i]}"
}

# ended I HOW: the incarnation of slot i is gone (reaped); records how and its exit status.
ended() {
  local i=$1 how=$2 rc=0
  wait "${W_PID[i]}" 2>/dev/null || rc=$?
  printf '%s\tend\t%s\t%s\t%s\n' "${W_NAME[i]}" "${EPOCHREALTIME/,/.}" "$how" "$rc" >>"$WORK/incarnations.tsv"
  W_PID[i]=""
  LAST_RC=$rc
}

# gone PID: true once PID has exited (a zombie counts: it is our unreaped child).
gone() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ ${stat%% *} == Z ]]
}

# One pass over the worker slots: resume, restart, notice exits.
tend_workers() {
  local i now
  now=$(us)
  for ((i = 1; i <= PROCS; i++)); do
    case ${W_STATE[i]} in
      run|stopped)
        if gone "${W_PID[i]}"; then
          local name=${W_NAME[i]}
          ended "$i" "exited by itself"
          ev crash "$name" "exit $LAST_RC: $(tail -n 1 "$WORK/logs/$name.log" | cut -c1-300)"
          say "worker $name exited by itself (status $LAST_RC)"
          W_STATE[i]=down W_UNTIL[i]=$now
        elif [[ ${W_STATE[i]} == stopped ]] && ((now >= W_UNTIL[i])); then
          kill -CONT "${W_PID[i]}" 2>/dev/null
          ev resume "${W_NAME[i]}"
          W_STATE[i]=run
        fi
        ;;
      draining)
        if gone "${W_PID[i]}"; then
          local name=${W_NAME[i]}
          ended "$i" "SIGTERM (restart)"
          ((LAST_RC == 0)) || { ev bad_exit "$name" "exit $LAST_RC after SIGTERM"; say "worker $name: exit $LAST_RC after SIGTERM"; }
          W_STATE[i]=down W_UNTIL[i]=$((now + 200000))
        elif ((now >= W_UNTIL[i])); then
          ev sigterm_slow "${W_NAME[i]}" "still running 30 s after SIGTERM"
          W_UNTIL[i]=$((now + 30000000))
        fi
        ;;
      down)
        if ((SCRIPT_GOOD && now >= W_UNTIL[i])); then
          start_worker "$i"
        fi
        ;;
    esac
  done
}

# ready I: the incarnation of slot i has logged that it runs (its script loaded, its
# signal handling in place; a SIGTERM before that ends it with 143, as it should).
ready() { grep -q '"msg":"worker [^ ]* running ' "$WORK/logs/${W_NAME[$1]}.log" 2>/dev/null; }

# all_ready: every live incarnation has loaded its script (a broken version written while
# one is starting would rightly make it refuse to start).
all_ready() {
  local i
  for ((i = 1; i <= PROCS; i++)); do
    [[ ${W_STATE[i]} != run && ${W_STATE[i]} != stopped ]] || ready "$i" || return 1
  done
}

# pick_worker [--ready] STATE...: a random slot in one of the states (with --ready: whose
# incarnation is up), in PICKED (empty if none).
pick_worker() {
  local i c=() need_ready=0
  [[ $1 != --ready ]] || { need_ready=1; shift; }
  for ((i = 1; i <= PROCS; i++)); do
    [[ " $* " == *" ${W_STATE[i]} "* ]] || continue
    ((!need_ready)) || ready "$i" || continue
    c+=("$i")
  done
  PICKED=""
  ((${#c[@]})) && PICKED=${c[RANDOM % ${#c[@]}]}
}

# ------------------------------------------------------------------ producer
# Enqueues task n = 1..TASKS in chunks every 0.5 s over the first 80 % of the run: a JSONL
# file through `leash enqueue --file -`, and the chunk's n % SQL_EVERY = 0 by plain INSERT.
# ~50 shards (2 tenants × 25 keys), 10 % delayed 0-3 s, 2 % max_attempts 2, 0.5 % fatal.
# A failed chunk (server restarting) is retried after checking whether it landed after all.
# Records every chunk it enqueued in produced.tsv.
producer() {
  RANDOM=$((SEED * 7919 + 13))
  local interval_us=500000
  local chunks=$(((DURATION * 8000000 / 10 + interval_us - 1) / interval_us))
  ((chunks >= 1)) || chunks=1
  local size=$(((TASKS + chunks - 1) / chunks))
  local c lo hi start file=$WORK/chunk.jsonl sqlf=$WORK/chunk.sql
  start=$(us)
  for ((c = 0; c * size < TASKS; c++)); do
    lo=$((c * size + 1)) hi=$(((c + 1) * size))
    ((hi <= TASKS)) || hi=$TASKS
    local wait_us=$((start + c * interval_us - $(us)))
    ((wait_us <= 0)) || sleep "$((wait_us / 1000000)).$(printf '%06d' $((wait_us % 1000000)))"
    awk -v lo="$lo" -v hi="$hi" -v seed="$((SEED * 100003 + c))" -v every="$SQL_EVERY" \
        -v jf="$file" -v sf="$sqlf" -v poison_every="$((POISON ? TASKS / POISON : 0))" \
        -v npoison="$POISON" -v hostile_pm="$HOSTILE" -v blocks="$BLOCKS" -v tasks="$TASKS" \
        -v budget="$BUDGET_RPM" '
      BEGIN {
        srand(seed); nj = 0; ns = 0
        printf "" > jf; printf "" > sf
        nk = split("tostring_err oom loop pattern nilmsg crlf yield gc bigresult leak", kinds, " ")
        for (n = lo; n <= hi; n++) {
          tenant = (rand() < 0.5) ? "ta" : "tb"
          shard = sprintf("s%02d", int(rand() * 25))
          if (blocks) {
            lane = int((n - lo) * 50 / (hi - lo + 1))
            tenant = (lane % 2) ? "tb" : "ta"
            shard = sprintf("s%02d", int(lane / 2))
          }
          fatal = (rand() < 0.005) ? "true" : "false"
          # Poison tasks: evenly spread, kill and wedge in turn, the default max_crashes (3).
          hostile = ""; crashes = 100
          if (poison_every > 0 && n % poison_every == int(poison_every / 2) \
              && int(n / poison_every) < npoison) {
            hostile = (int(n / poison_every) % 2 == 0) ? "kill" : "wedge"; crashes = 3; fatal = "false"
          } else if (rand() * 1000 < hostile_pm) {
            hostile = kinds[1 + int(rand() * nk)]; fatal = "false"
          }
          h = hostile == "" ? "" : ", \"hostile\": \"" hostile "\""
          # Waiters (task.lua): 1 in 29 waits on the clock, 1 in 31 for two children first.
          if (hostile == "" && fatal == "false" && n % 29 == 0) h = h ", \"wait\": \"clock\""
          else if (hostile == "" && fatal == "false" && n % 31 == 0) h = h ", \"wait\": \"children\""
          else if (hostile == "" && fatal == "false" && n % 23 == 0) h = h ", \"via_batch\": true"
          if (n % every == 0) {
            printf "%s(%s, %s, %s, %s, %d)", (ns++ ? ",\n" : "INSERT INTO agent_work_queue (tenant_id, shard_key, payload, batch, max_crashes) VALUES\n"), \
              "\047" tenant "\047", "\047" shard "\047", \
              "\047{\"n\": " n ", \"via\": \"sql\", \"fatal\": " fatal h "}\047", "\047chaos\047", crashes > sf
            continue
          }
          extra = sprintf(", \"max_crashes\": %d", crashes)
          if (budget) extra = extra ", \"budget\": \"llm\""
          if (rand() < 0.10) extra = extra sprintf(", \"delay\": %.2f", rand() * 3)
          if (rand() < 0.02 && hostile == "" && h == "") extra = extra ", \"max_attempts\": 2"
          printf "{\"payload\": {\"n\": %d, \"via\": \"copy\", \"fatal\": %s%s}, \"tenant_id\": \"%s\", \"shard_key\": \"%s\", \"batch\": \"chaos\"%s}\n", \
            n, fatal, h, tenant, shard, extra > jf
          nj++
        }
        if (ns) printf ";\n" > sf
      }'
    enqueue_chunk "$lo" "$hi" copy "$file" "$(grep -c . "$file")"
    [[ ! -s $sqlf ]] || enqueue_chunk "$lo" "$hi" sql "$sqlf" "$(grep -c "via" "$sqlf")"
  done
  rm -f "$file" "$sqlf"
}

# enqueue_chunk LO HI VIA FILE COUNT: enqueues until it is in, for at most 90 s.
enqueue_chunk() {
  local lo=$1 hi=$2 via=$3 f=$4 want=$5 deadline=$(($(us) + 90000000)) ok=0 have
  ((want > 0)) || return 0
  while (($(us) < deadline)); do
    if [[ $via == copy ]]; then
      "$LEASH" enqueue --file - <"$f" >/dev/null 2>>"$WORK/producer.log" && { ok=1; break; }
    else
      psql_q -f "$f" >/dev/null 2>>"$WORK/producer.log" && { ok=1; break; }
    fi
    # Did it commit although we saw an error? (COPY and INSERT are one transaction each.)
    # Ask until the server answers: enqueuing again on no answer made duplicates when the
    # first try had committed just before a restart (seen in a 30-minute soak).
    have=""
    while [[ -z $have ]] && (($(us) < deadline)); do
      have=$(psql_q -c "SELECT count(*) FROM agent_work_queue
                         WHERE (payload->>'n')::int BETWEEN $lo AND $hi AND payload->>'via' = '$via'" 2>/dev/null) \
        || { have=""; sleep 0.5; }
    done
    if [[ $have == "$want" ]]; then ok=1; break; fi
    if [[ -n $have && $have != 0 ]]; then
      echo "chunk $lo-$hi $via: $have of $want rows after a failure" >>"$WORK/producer.log"
      break
    fi
    sleep 0.5
  done
  if ((ok)); then
    printf '%s\t%s\t%s\n' "$lo" "$hi" "$via" >>"$WORK/produced.tsv"
  else
    echo "chunk $lo-$hi $via: not enqueued" >>"$WORK/producer.log"
  fi
}

# ------------------------------------------------------------------ chaos driver
# terminate_backends one|all: pg_terminate_backend on one random leash connection (claim,
# lease, script pool; the producer's `leash enqueue` too), or on all of them.
terminate_backends() {
  local all=$1 rows row ids="" what=""
  all_ready || return 0
  rows=$(psql_q -c "SELECT pid || ':' || replace(application_name, ' ', '_') FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name LIKE 'leash %'
                       AND pid <> pg_backend_pid() ORDER BY pid" 2>/dev/null) || return 0
  local arr=()
  [[ -z $rows ]] || mapfile -t arr <<<"$rows"
  ((${#arr[@]})) || return 0
  [[ $all == all ]] || arr=("${arr[RANDOM % ${#arr[@]}]}")
  for row in "${arr[@]}"; do
    ids+=${ids:+,}${row%%:*}
    what+=${what:+,}$row
  done
  psql_q -c "SELECT pg_terminate_backend(p::int) FROM unnest(string_to_array('$ids', ',')) p" \
    >/dev/null 2>&1
  ev terminate_backend "$all" "$what"
}

# hand_flip: a random pending head is set dead by hand, then pending again a moment later, in
# separate transactions (as an operator would): its shard is handed over and back by the
# heads' triggers, and the task still ends done.
hand_flip() {
  [[ -z $PG_FROZEN ]] || return 0
  local id
  id=$(psql_q -c "UPDATE agent_work_queue q SET status = 'dead', updated_at = now()
                   FROM (SELECT id FROM agent_work_queue WHERE is_head ORDER BY random() LIMIT 1) h
                  WHERE q.id = h.id AND q.status = 'pending' RETURNING q.id" 2>/dev/null) || return 0
  [[ -n $id ]] || return 0
  sleep 0.2
  local i
  for ((i = 0; i < 40; i++)); do   # the server may be restarting: the task must come back
    timeout 5 psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
      -c "UPDATE agent_work_queue SET status = 'pending', updated_at = now()
           WHERE id = $id AND status = 'dead'" >/dev/null 2>&1 && break
    sleep 0.5
  done
  ev hand_flip server "task $id dead and back"
}

# poison_kill: whichever worker holds a leased "kill" poison task is killed -9 at once (the
# stand-in for a payload that crashes any process that runs it), and restarted after 0.5 s.
poison_kill() {
  [[ -z $PG_FROZEN ]] || return 0
  local rows row i
  rows=$(psql_q -c "SELECT id || ' ' || lease_owner FROM agent_work_queue
                     WHERE status = 'leased' AND payload->>'hostile' = 'kill'" 2>/dev/null) || return 0
  [[ -n $rows ]] || return 0
  while read -r id owner; do
    for ((i = 1; i <= PROCS; i++)); do
      [[ ${W_NAME[i]} == "$owner" && -n ${W_PID[i]} ]] || continue
      [[ ${W_STATE[i]} == run || ${W_STATE[i]} == stopped || ${W_STATE[i]} == draining ]] || continue
      kill -KILL "${W_PID[i]}"
      ev kill9 "${W_NAME[i]}" "poison task $id"
      ended "$i" "kill -9 (poison)"
      W_STATE[i]=down W_UNTIL[i]=$(($(us) + 500000))
    done
  done <<<"$rows"
}

fault() {
  local r=$((RANDOM % 100)) now
  now=$(us)
  if ((r < 25)); then                          # kill -9, restart after 0.5-3 s
    pick_worker run stopped
    [[ -n $PICKED ]] || return 0
    kill -KILL "${W_PID[PICKED]}"
    ev kill9 "${W_NAME[PICKED]}"
    ended "$PICKED" "kill -9"
    rnd 500 3000
    W_STATE[PICKED]=down W_UNTIL[PICKED]=$((now + R * 1000))
  elif ((r < 47)); then                        # SIGSTOP past the lease: visibility + 0.5-3 s
    pick_worker run
    [[ -n $PICKED ]] || return 0
    rnd 500 3000
    local ms=$((VIS * 1000 + R))
    kill -STOP "${W_PID[PICKED]}"
    ev stop "${W_NAME[PICKED]}" "${ms} ms"
    W_STATE[PICKED]=stopped W_UNTIL[PICKED]=$((now + ms * 1000))
  elif ((r < 55)); then                        # a short SIGSTOP, within the lease
    pick_worker run
    [[ -n $PICKED ]] || return 0
    rnd 200 1500
    local ms=$R
    kill -STOP "${W_PID[PICKED]}"
    ev stop "${W_NAME[PICKED]}" "${ms} ms"
    W_STATE[PICKED]=stopped W_UNTIL[PICKED]=$((now + ms * 1000))
  elif ((r < 62)); then                        # graceful restart: SIGTERM, drain, exit 0
    pick_worker --ready run
    [[ -n $PICKED ]] || return 0
    kill -TERM "${W_PID[PICKED]}"
    ev sigterm "${W_NAME[PICKED]}"
    W_STATE[PICKED]=draining W_UNTIL[PICKED]=$((now + 30000000))
  elif ((r < 91)); then                        # one backend of some worker
    terminate_backends one
  elif ((r < 94)); then                        # a status changed by hand, and back
    hand_flip
  else                                         # every leash backend at once
    terminate_backends all
  fi
}

# Hot swaps come on their own schedule, every 4-12 s; one in three writes a broken version
# (a syntax error, or a script that does not return a handle), which every worker must
# refuse, and which is fixed by a good version 1-3 s later. No worker is (re)started while
# the file is broken, and no broken version is written while a worker is starting: a fresh
# process would rightly refuse to start on it.
hot_swap() {
  local now
  now=$(us)
  VERSION_N=$((VERSION_N + 1))
  if ((RANDOM % 3 == 0)) && all_ready; then
    local how=syntax
    ((RANDOM % 2)) && how=contract
    write_version "v$VERSION_N-broken" "$how"
    ev swap_broken "v$VERSION_N-broken" "$how"
    rnd 1000 3000
    SCRIPT_GOOD=0 FIX_AT=$((now + R * 1000))
  else
    write_version "v$VERSION_N"
    ev swap "v$VERSION_N"
  fi
  rnd 4000 12000
  NEXT_SWAP=$((now + R * 1000))
}

# The database's turn comes on its own schedule, so that a short run sees it too: the first
# within 20-45 % of the run or of 100 s, whichever is shorter, then every PG_GAP_MIN-PG_GAP_MAX
# s, but never while a worker is starting (leash exits 1 when it loses its connection before
# it runs; see all_ready). Two times in three a restart (pg_ctl restart -m fast: every
# connection is cut), else a freeze (SIGSTOP of the postmaster and every backend, like a hung
# server or a partition) for visibility + 0.5-2.5 s, so every lease runs out while nothing
# can be written.
pg_fault() {
  if ((RANDOM % 3)); then
    ev pg_restart_begin server
    if ! "$PGSH" restart "$PG_DIR" >>"$WORK/pg_restart.log" 2>&1; then
      ev pg_restart_failed server
      say "PostgreSQL did not restart; see $WORK/pg_restart.log"
      RC=3
      exit
    fi
    ev pg_restart_end server
  else
    local pm
    read -r pm <"$PG_DIR/data/postmaster.pid" || return 0
    PG_FROZEN="$pm $(pgrep -P "$pm" | tr '\n' ' ')"
    rnd 500 2500
    local ms=$((VIS * 1000 + R))
    # shellcheck disable=SC2086 # a list of pids
    kill -STOP $PG_FROZEN
    ev pg_freeze server "${ms} ms"
    PG_THAW_AT=$(($(us) + ms * 1000))
  fi
  rnd "$PG_GAP_MIN" "$PG_GAP_MAX"
  NEXT_PG=$(($(us) + R * 1000000))
}

pg_thaw() {
  if [[ -n $PG_FROZEN ]] && (($(us) >= PG_THAW_AT)); then
    # shellcheck disable=SC2086 # a list of pids
    kill -CONT $PG_FROZEN
    ev pg_thaw server
    PG_FROZEN=""
  fi
}

fix_script() {
  if ((!SCRIPT_GOOD && $(us) >= FIX_AT)); then
    VERSION_N=$((VERSION_N + 1))
    write_version "v$VERSION_N"
    ev swap "v$VERSION_N"
    SCRIPT_GOOD=1
  fi
}

# ------------------------------------------------------------------ run
for ((i = 1; i <= PROCS; i++)); do start_worker "$i"; done
producer &
PRODUCER_PID=$!

RANDOM=$SEED
FIX_AT=0
rnd 20 45
NEXT_PG=$((T0 + (DURATION < 100 ? DURATION : 100) * R * 10000))
rnd 3000 8000
NEXT_SWAP=$((T0 + R * 1000))
END=$((T0 + DURATION * 1000000))
next_fault=$((T0 + 2000000))
say "chaos for ${DURATION}s"
while (($(us) < END)); do
  tend_workers
  fix_script
  pg_thaw
  poison_kill
  if [[ -n $PG_FROZEN ]]; then
    :   # nothing that needs the database while it is frozen
  elif (($(us) >= NEXT_PG)) && all_ready; then
    pg_fault
  elif ((SCRIPT_GOOD && $(us) >= NEXT_SWAP)); then
    hot_swap
  elif (($(us) >= next_fault)); then
    fault
    rnd 300 2500
    next_fault=$(($(us) + R * 1000))
  fi
  sleep 0.1
done
say "chaos over: resuming and restarting workers"
PG_THAW_AT=0
pg_thaw
FIX_AT=0
fix_script
for ((i = 1; i <= PROCS; i++)); do
  [[ ${W_STATE[i]} == stopped ]] && W_UNTIL[i]=0
  [[ ${W_STATE[i]} == down ]] && W_UNTIL[i]=0
done
tend_workers

say "waiting for the producer"
# (Not `wait PID`: bash forgets the status of its oldest children once it has started
# hundreds of workers; gone() looks at /proc.)
while ! gone "$PRODUCER_PID"; do sleep 0.2; done
wait "$PRODUCER_PID" 2>/dev/null
PRODUCER_PID=""

say "draining (at most ${DRAIN_MAX}s)"
drain_end=$(($(us) + DRAIN_MAX * 1000000))
open=""
while (($(us) < drain_end)); do
  tend_workers
  poison_kill
  open=$(psql_q -c "SELECT count(*) FROM agent_work_queue WHERE status IN ('pending', 'leased')" 2>/dev/null)
  [[ $open == 0 ]] && break
  sleep 0.5
done
# A worker still draining from a chaos SIGTERM must not get a second one (that one stops at
# once, exit 1), nor one that is still starting (143): let them get there first.
for _ in $(seq 300); do
  if [[ " ${W_STATE[*]} " != *" draining "* && " ${W_STATE[*]} " != *" down "* ]] && all_ready; then
    break
  fi
  tend_workers
  sleep 0.1
done
say "queue open: ${open:-?}; stopping workers with SIGTERM"
for ((i = 1; i <= PROCS; i++)); do
  [[ -n ${W_PID[i]} ]] && { kill -CONT "${W_PID[i]}"; kill -TERM "${W_PID[i]}"; }
done
for ((i = 1; i <= PROCS; i++)); do
  [[ -n ${W_PID[i]} ]] || continue
  for _ in $(seq 300); do gone "${W_PID[i]}" && break; sleep 0.1; done
  if gone "${W_PID[i]}"; then
    ended "$i" "SIGTERM (end of run)"
  else
    kill -KILL "${W_PID[i]}"
    ev bad_exit "${W_NAME[i]}" "still running 30 s after SIGTERM"
    ended "$i" "SIGTERM (end of run), killed after 30 s"
  fi
done
ev end soak

python3 - "http://127.0.0.1:$MOCK_PORT/stats" >"$WORK/mock_stats.json" 2>/dev/null <<'PY'
import json, sys, urllib.request
print(json.dumps(json.load(urllib.request.urlopen(sys.argv[1], timeout=10))["answers"], sort_keys=True))
PY
kill -TERM "$MOCK_PID" 2>/dev/null; wait "$MOCK_PID" 2>/dev/null; MOCK_PID=""

# ------------------------------------------------------------------ load and check
say "loading the records and checking the invariants"
# events.tsv: epoch seconds → timestamptz through a staging column.
psql_q >/dev/null <<SQL || { say "loading the records failed"; exit 1; }
\copy produced (lo, hi, via) FROM '$WORK/produced.tsv'
CREATE TEMP TABLE ev_raw (at float8, kind text, target text, detail text);
\copy ev_raw FROM '$WORK/events.tsv' WITH (FORMAT csv, DELIMITER E'\t', QUOTE E'\x01')
INSERT INTO events SELECT to_timestamp(at), kind, nullif(target, ''), nullif(detail, '') FROM ev_raw;
CREATE TEMP TABLE inc_raw (worker text, a text, b text, c text, d text);
\copy inc_raw FROM '$WORK/incarnations.tsv' WITH (FORMAT csv, DELIMITER E'\t', QUOTE E'\x01')
INSERT INTO incarnations (worker, slot, pid, started)
SELECT worker, a::int, b::int, to_timestamp(c::float8) FROM inc_raw WHERE a <> 'end';
UPDATE incarnations i SET ended = to_timestamp(r.b::float8), how = r.c, rc = r.d::int
  FROM inc_raw r WHERE r.worker = i.worker AND r.a = 'end';
SQL
for f in "$WORK"/logs/*.log; do
  name=$(basename "$f" .log)
  awk -v w="$name" '{ print w "\002" $0 }' "$f"
done | psql_q -c "\\copy wlog_raw (worker, line) FROM pstdin WITH (FORMAT csv, DELIMITER E'\\x02', QUOTE E'\\x01')" \
  >/dev/null || { say "loading the worker logs failed"; exit 1; }

psql_q -v tasks="$TASKS" -v sql_every="$SQL_EVERY" -v visibility="$VIS" -f "$SRC/tests/chaos/checks.sql" \
  >"$WORK/figures.txt" 2>"$WORK/checks.err" || { cat "$WORK/checks.err" >&2; say "checks.sql failed"; exit 1; }

elapsed=$(( ($(us) - T0) / 1000000 ))
{
  echo "chaos soak: seed $SEED, $PROCS procs x $SLOTS slots, $TASKS tasks, chaos ${DURATION}s, visibility ${VIS}s, heartbeat ${HB}s, wall ${elapsed}s"
  echo "mock answers: $(cat "$WORK/mock_stats.json" 2>/dev/null)"
  [[ ! -s $WORK/producer.log ]] || echo "producer retries: $(grep -c . "$WORK/producer.log") error lines (producer.log)"
  cat "$WORK/figures.txt"
} | tee "$WORK/report.txt"
if grep -q '^invariants failed: 0$' "$WORK/figures.txt"; then
  RC=0
else
  RC=1
fi
exit
