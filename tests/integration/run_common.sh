# shellcheck shell=bash
# Helpers shared by tests/integration/run.sh and run_slow.sh (`leash run` end to end).
# Not an area of its own: sourced after tests/lib.sh.

# shellcheck disable=SC2034 # used by the area scripts
FIX=$LEASH_SRC/tests/fixtures/run
declare -gA W_PID=()

# shellcheck disable=SC2120 # SUFFIX is optional
# run_setup [SUFFIX]: a fresh migrated database with the tables the fixtures write:
#   execs       one row per execution (server clock: started on insert, finished at the end)
#   after_rows  one row per execution that got past its sleep/busy part with payload.after
run_setup() {
  t_newdb "$@"
  expect_exit 0 "$LEASH" migrate
  q "create table execs (
       id bigserial primary key, task_id bigint not null, attempt int not null,
       worker text not null, tenant text, shard text,
       started timestamptz not null default clock_timestamp(), finished timestamptz);
     create table after_rows (task_id bigint, attempt int, worker text,
       at timestamptz not null default clock_timestamp())" >/dev/null
}

# enqueue_file FILE WANT: bulk-enqueues FILE (JSONL) and checks the printed count.
enqueue_file() {
  local out
  out=$("$LEASH" enqueue --file - <"$1") || fail "enqueue of $1 failed"
  assert_eq "tasks enqueued from $1" "$out" "$2"
}

# start_worker NAME SCRIPT [OPTIONS...]: `leash run SCRIPT --worker-id NAME OPTIONS` in the
# background, stderr in $T_TMP/NAME.log, pid in W_PID[NAME]; killed at exit.
start_worker() {
  local name=$1 script=$2
  shift 2
  "$LEASH" run "$script" --worker-id "$name" "$@" >"$T_TMP/$name.out" 2>"$T_TMP/$name.log" &
  W_PID[$name]=$!
  t_on_exit _show_log_on_failure "$name"
  t_on_exit t_kill "$!"
}

# Clean-up: a failed test (or any, with LEASH_TEST_SHOW_LOGS=1) shows the worker's log, its
# last 40 lines. Clean-ups run inside lib.sh's exit handler, whose local `rc` is the test's
# exit status (when unknown, the log is shown).
_show_log_on_failure() {
  [[ ${rc:-1} != 0 || ${LEASH_TEST_SHOW_LOGS:-} == 1 ]] || return 0
  [[ -s $T_TMP/$1.log ]] || return 0
  _t_tail "log of worker $1" "$T_TMP/$1.log" >&2
  echo >&2
}

# exited PID: true once PID is gone or a zombie (kill -0 succeeds on zombies).
exited() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ ${stat%% *} == Z ]]
}

# wait_worker NAME TIMEOUT: waits for the worker to exit; sets W_RC to its exit status.
wait_worker() {
  local pid=${W_PID[$1]}
  wait_for "worker $1 to exit" "$2" exited "$pid"
  W_RC=0
  wait "$pid" || W_RC=$?
}

# worker_log NAME: what the worker wrote on stderr so far.
worker_log() { cat "$T_TMP/$1.log"; }

# log_has NAME TEXT: true when the worker's log holds TEXT.
log_has() { grep -qF -- "$2" "$T_TMP/$1.log"; }

# q_true SQL: true when SQL (one boolean) answers t.
q_true() { [[ $(q "$1") == t ]]; }

# assert_worker_exit NAME TIMEOUT WANT: waits for the worker and checks its exit status.
assert_worker_exit() {
  wait_worker "$1" "$2"
  [[ $W_RC == "$3" ]] && return 0
  fail "exit status of worker $1: got $W_RC, want $3"$'\n'"$(_t_tail "log of $1" "$T_TMP/$1.log")"
}

# status_counts: "status=count ..." of the queue, for messages.
status_counts() {
  q "select coalesce(string_agg(status || '=' || n, ' ' order by status), '(empty)')
       from (select status, count(*) n from agent_work_queue group by status) s"
}

# assert_no_sanitizer_reports: fails when a worker's log holds a sanitizer report (workers
# that a case stops itself would otherwise hide one; under TSan, halt_on_error exits 66).
assert_no_sanitizer_reports() {
  local f pat='WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:'
  for f in "$T_TMP"/*.log; do
    [[ -e $f ]] || continue
    if grep -qE "$pat" "$f"; then
      fail "sanitizer report in the log of worker $(basename "$f" .log):"$'\n'"$(grep -E -A40 -m1 "$pat" "$f")"
    fi
  done
}

# cycle_sql OWNER IDS TOKENS KINDS N: SQL for the queue's own cycle on $QT (settle these
# leases with these kinds, then claim N), the answer's rows as settled|id|attempts|status|token.
cycle_sql() {
  local n=$(($(tr -cd , <<<"$2" | wc -c) + 1))
  [[ $2 == '{}' ]] && n=0
  local nulls
  nulls=$(printf 'NULL,%.0s' $(seq 1 "$n"))
  nulls="{${nulls%,}}"
  [[ $n == 0 ]] && nulls='{}'
  echo "select settled, id, attempts, status, token
          from ${QT}_cycle('$1', '$2', '$3', '$4', '$nulls', '$nulls', '$nulls', '$nulls',
                           '${nulls//NULL/f}', '$nulls', $5, 60, NULL, NULL, NULL, 0)
         where id is not null"
}
