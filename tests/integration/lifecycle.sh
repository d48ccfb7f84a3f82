#!/usr/bin/env bash
# The lifecycle, kit against host (issue #13, item 2): the same task scripts run once through
# leash.testing (scripts/lib/leash/testing.lua) and once through the real host (`leash
# enqueue` + `leash run`), and the kit's outcome must be the row the host leaves: status,
# attempts spent, last_cause, the wait before the next attempt (the delay, or the backoff),
# the stored result and the error's first line. The policy numbers (backoff, default
# attempts) are checked against src/lifecycle.h, the SQL and the table's column default.
#
# Each case names fixtures of tests/fixtures/lifecycle/ as CASE SCRIPT PRESET MAX RUNS:
#   PRESET  the row's attempts before the run (the claim makes the run attempt PRESET + 1);
#           a retry's backoff is then 2^(PRESET+1) s, long enough that the worker is stopped
#           before the row is due again (4 gives 32 s)
#   MAX     max_attempts, or "default" to leave it to the table
#   RUNS    attempts run one after the other (between them the row is made due at once)
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
FIX=$LEASH_SRC/tests/fixtures/lifecycle
KIT_LUA_PATH="$LEASH_SRC/scripts/lib/?.lua;;"

# qv VALUE SQL: SQL with :'v' bound to VALUE (psql quotes it), unaligned tuples.
qv() {
  psql -X -A -t -q -v ON_ERROR_STOP=1 -v "v=$1" -d "$DATABASE_URL" <<<"$2"
}

kit_lua() { LUA_PATH=$KIT_LUA_PATH lua5.4 "$@"; }

# kit_record SCRIPT PRESET MAX RUNS: the kit's normalised record (field=value lines).
kit_record() {
  local out
  out=$(kit_lua "$FIX/driver/kit_record.lua" "$FIX/$1.lua" "$(($2 + 1))" "$3" "$4" 2>&1) \
    || fail "the kit could not run $1.lua: $out"
  _norm_result <<<"$out"
}

# The host's record of the row with shard_key CASE, in the kit's fields. The wait is
# run_after - finished_at: the settle sets both from one now().
host_record() {
  local out
  out=$(qv "$1" "select 'status=' || status, 'attempts=' || attempts,
           'cause=' || coalesce(last_cause, ''),
           'wait=' || case when status = 'pending'
                      then to_char(extract(epoch from run_after - finished_at), 'FM999990.000')
                      else '' end,
           'result=' || case when status = 'done' then coalesce(result::text, '') else '' end,
           'error=' || case when status = 'done' then ''
                       else split_part(coalesce(last_error, ''), E'\n', 1) end,
           'traceback=' || (status <> 'done' and coalesce(last_error, '') like '%stack traceback%')
      from agent_work_queue where shard_key = :'v'" | tr '|' '\n')
  _norm_result <<<"$out"
}

# A done row keeps last_error from an earlier attempt (the settle leaves it), which is why
# the error is compared only while the task is not done. jsonb prints its own spacing and
# key order, the kit its compact sorted form: both go through jq -cS.
_norm_result() {
  local line json
  while IFS= read -r line; do
    if [[ $line == result=?* ]]; then
      json=$(jq -cS . <<<"${line#result=}") || fail "result is not JSON: ${line#result=}"
      line="result=$json"
    fi
    # PostgreSQL words its refusal of a result itself (and by server version): the prefix
    # is the host's, the rest is compared by neither
    [[ $line == "error=result cannot be stored: "* ]] && line="error=result cannot be stored: ..."
    printf '%s\n' "$line"
  done
}

# lifecycle_setup: a fresh migrated database.
lifecycle_setup() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
}

# host_run CASE SCRIPT PRESET MAX RUNS: one row (tenant and shard both CASE, so a worker
# scoped to the tenant runs only it), attempts set to PRESET, then a worker on SCRIPT runs
# it RUNS times and is stopped (a retried row stays pending: --until-empty would wait).
host_run() {
  local name=$1 script=$2 preset=$3 max=$4 runs=$5 r line
  line=$(jq -cn --arg c "$name" --arg m "$max" \
    '{tenant_id: $c, shard_key: $c, payload: {}} + (if $m == "default" then {} else {max_attempts: ($m | tonumber)} end)')
  "$LEASH" enqueue --file - <<<"$line" >/dev/null || fail "enqueue of $name failed"
  qv "$name" "update agent_work_queue set attempts = $preset where shard_key = :'v'" >/dev/null
  start_worker "$name" "$FIX/$script.lua" --tenant "$name" --poll-ms 20-50 --until-empty --backoff-jitter 0 \
    --drain-timeout 5
  for ((r = 1; r <= runs; r++)); do
    # a run is settled once the row holds its attempt, or gave it back with a snooze or a wait
    wait_for "attempt $((preset + r)) of $name to be settled" 30 q_true \
      "$(qv "$name" "select format('select exists (select 1 from agent_work_queue where shard_key = %L
                        and (attempts = %s or snoozes = %s or last_cause = ''waiting'')
                        and status <> ''leased''
                        and finished_at is not null)', :'v', $((preset + r)), $r)")"
    if ((r < runs)); then
      qv "$name" "update agent_work_queue set run_after = now() where shard_key = :'v'" >/dev/null
    fi
  done
  kill -TERM "${W_PID[$name]}" 2>/dev/null || true
  assert_worker_exit "$name" 20 0
}

# compare CASE SCRIPT PRESET MAX RUNS...: runs each case (five words each) through both and
# fails with a diff naming every case that differs.
compare() {
  local diffs="" d
  lifecycle_setup
  while (($#)); do
    host_run "$1" "$2" "$3" "$4" "$5"
    kit_record "$2" "$3" "$4" "$5" >"$T_TMP/$1.kit"
    host_record "$1" >"$T_TMP/$1.host"
    if ! d=$(diff -u --label "kit  $1 ($2.lua)" --label "host $1 ($2.lua)" "$T_TMP/$1.kit" "$T_TMP/$1.host"); then
      diffs+="$d"$'\n'
    fi
    shift 5
  done
  [[ -z $diffs ]] || fail "the kit and the host disagree:"$'\n'"$diffs"
  assert_no_sanitizer_reports
}

# expect_record CASE FIELD=VALUE...: the host's record (compare ran) holds each line: what
# both must say, so that agreeing on a wrong answer fails too.
expect_record() {
  local name=$1 want
  shift
  for want in "$@"; do
    grep -qxF -- "$want" "$T_TMP/$name.host" \
      || fail "$name: want $want, the record is:"$'\n'"$(cat "$T_TMP/$name.host")"
  done
}

case_success_answers_are_done_in_both() {
  compare nothing done_returns_nothing 4 default 1 \
          nil done_returns_nil 4 default 1 \
          true done_returns_true 4 default 1 \
          ok_result done_ok_result 4 default 1
  local c
  for c in nothing nil true; do expect_record "$c" status=done attempts=5 cause=none result=; done
  expect_record ok_result status=done cause=none \
    'result={"empty":[],"list":[1,2.5,"x"],"n":1,"nested":{"ok":true}}'
}

case_returned_failures_retries_and_fatal_match() {
  compare false_msg returned_false_msg 4 default 1 \
          nil_msg returned_nil_msg 4 default 1 \
          retry retry_backoff 4 default 1 \
          retry_delay retry_delay 4 default 1 \
          fatal fatal 4 default 1
  expect_record false_msg status=pending attempts=5 cause=returned wait=32.000 "error=upstream said no"
  expect_record nil_msg status=pending cause=returned wait=32.000 "error=upstream failed: 503"
  expect_record retry status=pending cause=returned wait=32.000 error=later
  expect_record retry_delay status=pending cause=returned wait=30.000 "error=rate limited"
  expect_record fatal status=dead attempts=5 cause=returned wait= "error=never again"
}

case_bad_delays_are_contract_errors_or_cut_to_the_cap_in_both() {
  compare huge retry_delay_huge 4 default 1 \
          nan_argument retry_delay_nan_argument 4 default 1 \
          nan_by_hand retry_delay_nan_by_hand 4 default 1 \
          negative_by_hand retry_delay_negative_by_hand 4 default 1
  expect_record huge status=pending cause=returned wait=3600.000
  # leash.retry refuses the NaN where it is called: a raised error, by backoff
  expect_record nan_argument status=pending cause=script_error wait=32.000 traceback=true
  expect_record nan_by_hand status=pending cause=contract wait=32.000
  expect_record negative_by_hand status=pending cause=contract wait=32.000
}

case_raised_errors_match() {
  compare raises raises 4 default 1 \
          raises_table raises_table_tostring 4 default 1
  expect_record raises status=pending cause=script_error wait=32.000 traceback=true
  expect_record raises_table status=pending cause=script_error "error=upstream error 42" traceback=false
}

case_contract_errors_match() {
  compare wrong_type wrong_type 4 default 1 \
          unstorable unstorable_result 4 default 1 \
          mixed_keys unstorable_mixed_keys 4 default 1 \
          nul unstorable_nul 4 default 1
  expect_record wrong_type status=pending cause=contract wait=32.000
  expect_record nul status=pending cause=contract result= "error=result cannot be stored: ..."
  expect_record unstorable status=pending cause=contract \
    'error=leash.ok: result cannot be stored as JSON: cannot encode a function at $.f'
  expect_record mixed_keys status=pending cause=contract \
    'error=leash.ok: result cannot be stored as JSON: cannot encode table key "x" at $.items[1]: the table mixes integer and string keys'
}

case_a_step_is_skipped_on_the_next_attempt_in_both() {
  compare steps steps_then_retry 0 default 2
  expect_record steps status=done attempts=2 cause=none 'result={"now":2,"step_ran_in":1}'
}

case_a_retry_on_the_last_attempt_is_dead_in_both() {
  compare last_retry retry_backoff 0 1 1 \
          last_raise raises 7 default 1 \
          last_contract wrong_type 2 3 1
  expect_record last_retry status=dead attempts=1 cause=returned wait=
  expect_record last_raise status=dead attempts=8 cause=script_error wait=
  expect_record last_contract status=dead attempts=3 cause=contract wait=
}

# The backoff: the kit's testing.backoff(n) against the SQL's least(3600, 2^n) for every n
# up to past the cap, and against the rows the host wrote (retries without a delay).
case_backoff_is_two_to_the_attempts_up_to_the_cap_in_all_three() {
  compare b5 retry_backoff 4 20 1 \
          b10 retry_backoff 9 20 1 \
          b11 retry_backoff 10 20 1 \
          b12 retry_backoff 11 20 1 \
          b15 retry_backoff 14 20 1
  expect_record b5 wait=32.000
  expect_record b10 wait=1024.000
  expect_record b11 wait=2048.000
  expect_record b12 wait=3600.000
  expect_record b15 wait=3600.000
  local kit sql
  kit=$(kit_lua -e 'local t = require "leash.testing"
    for n = 0, 20 do print(n .. " " .. string.format("%.3f", t.backoff(n))) end')
  sql=$(q "select n || ' ' || to_char(least(3600, 2 ^ n), 'FM999990.000')
             from generate_series(0, 20) n order by n")
  assert_eq "testing.backoff(n) against the SQL's least(3600, 2^n)" "$kit" "$sql"
  local cap
  cap=$(sed -nE 's/^#define LIFECYCLE_BACKOFF_CAP_S +([0-9.]+).*/\1/p' "$LEASH_SRC/src/lifecycle.h")
  [[ -n $cap ]] || fail "LIFECYCLE_BACKOFF_CAP_S not found in src/lifecycle.h"
  assert_eq "the kit's cap against LIFECYCLE_BACKOFF_CAP_S" \
    "$(kit_lua -e 'print(string.format("%.1f", require("leash.testing").BACKOFF_CAP))')" \
    "$(printf '%.1f' "$cap")"
}

case_snoozes_match_in_both() {
  compare snooze snooze 4 default 1 \
          snooze_table snooze_table 4 default 1 \
          snooze_huge snooze_huge 4 default 1 \
          snooze_nan_argument snooze_nan_argument 4 default 1 \
          snooze_nan_by_hand snooze_nan_by_hand 4 default 1 \
          snooze_no_delay snooze_no_delay_by_hand 4 default 1 \
          snooze_last snooze 7 default 1
  # the attempt given back: the row holds PRESET attempts, not PRESET + 1
  expect_record snooze status=pending attempts=4 cause=snoozed wait=30.000 "error=provider busy"
  expect_record snooze_table status=pending attempts=4 cause=snoozed wait=45.000 "error=provider busy"
  expect_record snooze_huge status=pending attempts=4 cause=snoozed wait=3600.000
  expect_record snooze_nan_argument status=pending attempts=5 cause=script_error wait=32.000 traceback=true
  expect_record snooze_nan_by_hand status=pending attempts=5 cause=contract wait=32.000 \
    "error=snooze delay must be a finite number of seconds >= 0, not NaN (message: nan by hand)"
  expect_record snooze_no_delay status=pending attempts=5 cause=contract wait=32.000
  # a snooze on the last attempt is still a snooze: nothing is spent
  expect_record snooze_last status=pending attempts=7 cause=snoozed wait=30.000
}

# A wait (sql/019_waits.sql) in both: pending with the attempt given back, cause waiting, and
# never counted as a snooze; a bad leash.wait is a script error that spends the attempt.
case_waits_match_in_both() {
  compare wait_after wait_after 4 default 1 \
          wait_bad wait_bad 4 default 1 \
          wait_event wait_event 4 default 1 \
          wait_last wait_last 7 default 1
  expect_record wait_after status=pending attempts=4 cause=waiting wait=30.000 "error=batch submitted"
  expect_record wait_bad status=pending attempts=5 cause=script_error wait=32.000 traceback=true
  expect_record wait_event status=pending attempts=5 cause=script_error wait=32.000 traceback=true
  expect_record wait_last status=pending attempts=7 cause=waiting wait=45.000 error=waiting
  assert_eq "a wait is no snooze (snoozes)" "$(q "select snoozes from agent_work_queue where shard_key = 'wait_after'")" 0
}

# The backoff with base, cap and jitter: the kit's testing.backoff and lifecycle.c's
# lifecycle_backoff against the SQL's <table>_backoff (the function the settle calls) over a grid past every edge (base 1, cap
# 0, overflow of base^n), and the defaults in the header, the kit and the settle's own
# parameter defaults.
case_backoff_with_base_cap_and_jitter_agrees_in_all_three() {
  lifecycle_setup
  local grid kit sql g
  grid='{1,1.5,2,3,10,1000} {0,0.5,60,3600,86400} {0,1,5,12,20,100,1000} {0,0.5,1} {0,0.25,0.999}'
  read -r -a g <<<"$grid"
  kit=$(kit_lua - "${g[@]}" <<'LUA'
local t = require "leash.testing"
local function list(s) local r = {} for x in s:gmatch("[^{},]+") do r[#r + 1] = tonumber(x) end return r end
for _, b in ipairs(list(arg[1])) do for _, c in ipairs(list(arg[2])) do
  for _, n in ipairs(list(arg[3])) do for _, j in ipairs(list(arg[4])) do
    for _, u in ipairs(list(arg[5])) do
      print(string.format("%g %g %d %g %g %.6f", b, c, n, j, u,
                          t.backoff(n, { base = b, cap = c, jitter = j, u = u })))
end end end end end
LUA
)
  sql=$(q "select format('%s %s %s %s %s %s', b, c, n, j, u,
                         to_char(agent_work_queue_backoff(b, c, n, j, u), 'FM9999990.000000'))
             from unnest('${g[0]}'::float8[]) with ordinality b(b, bo),
                  unnest('${g[1]}'::float8[]) with ordinality c(c, co),
                  unnest('${g[2]}'::int[]) with ordinality n(n, no),
                  unnest('${g[3]}'::float8[]) with ordinality j(j, jo),
                  unnest('${g[4]}'::float8[]) with ordinality u(u, uo)
            order by bo, co, no, jo, uo")
  assert_eq "rows compared" "$(wc -l <<<"$kit")" 1890
  assert_eq "testing.backoff against the SQL's agent_work_queue_backoff" "$kit" "$sql"
  # and lifecycle.c's lifecycle_backoff against the same lines (tests/c/test_lifecycle.c)
  local unit out
  unit=$(dirname "$LEASH")/tests/test_lifecycle
  [[ -x $unit ]] || unit=$LEASH_SRC/build/tests/test_lifecycle
  [[ -x $unit ]] || fail "tests/test_lifecycle not built next to $LEASH"
  printf '%s\n' "$sql" >"$T_TMP/grid"
  out=$(LEASH_BACKOFF_GRID=$T_TMP/grid "$unit" backoff_agrees_with_the_grid_the_sql_wrote 2>&1) \
    || fail "lifecycle_backoff disagrees with the SQL:"$'\n'"$out"
  assert_contains "lifecycle_backoff against the SQL" "$out" "1890 lines agree"
  local h_base h_cap h_jitter settle
  h_base=$(sed -nE 's/^#define LIFECYCLE_BACKOFF_BASE +([0-9.]+).*/\1/p' "$LEASH_SRC/src/lifecycle.h")
  h_cap=$(sed -nE 's/^#define LIFECYCLE_BACKOFF_CAP_S +([0-9.]+).*/\1/p' "$LEASH_SRC/src/lifecycle.h")
  h_jitter=$(sed -nE 's/^#define LIFECYCLE_BACKOFF_JITTER +([0-9.]+).*/\1/p' "$LEASH_SRC/src/lifecycle.h")
  [[ -n $h_base && -n $h_cap && -n $h_jitter ]] || fail "the backoff defaults not found in src/lifecycle.h"
  assert_eq "the kit's defaults against lifecycle.h's" \
    "$(kit_lua -e 'local t = require "leash.testing"
                   print(string.format("%g %g %g", t.BACKOFF_BASE, t.BACKOFF_CAP, t.BACKOFF_JITTER))')" \
    "$(printf '%g %g %g' "$h_base" "$h_cap" "$h_jitter")"
  for f in settle cycle cycle_rows; do
    settle=$(q "select pg_get_function_arguments('agent_work_queue_$f'::regproc)")
    assert_contains "$f's default base" "$settle" "p_backoff_base double precision DEFAULT $(printf '%g' "$h_base")"
    assert_contains "$f's default cap" "$settle" "p_backoff_cap double precision DEFAULT $(printf '%g' "$h_cap")"
    assert_contains "$f's default jitter" "$settle" "p_backoff_jitter double precision DEFAULT $(printf '%g' "$h_jitter")"
  done
  local snoozes
  snoozes=$(sed -nE 's/^#define LIFECYCLE_DEFAULT_MAX_SNOOZES +([0-9]+).*/\1/p' "$LEASH_SRC/src/lifecycle.h")
  assert_eq "max_snoozes: the column's default, the kit's, lifecycle.h's" \
    "$(q "select column_default from information_schema.columns
           where table_name = 'agent_work_queue' and column_name = 'max_snoozes'") $(kit_lua -e 'print(require("leash.testing").DEFAULT_MAX_SNOOZES)')" \
    "$snoozes $snoozes"
}

# The default max_attempts: src/lifecycle.h, the table's column default and the kit's, and
# the kit's behaviour without max_attempts (dead on exactly that attempt).
case_default_max_attempts_agree_in_header_table_and_kit() {
  lifecycle_setup
  local header column kit
  header=$(sed -nE 's/^#define LIFECYCLE_DEFAULT_MAX_ATTEMPTS +([0-9]+).*/\1/p' "$LEASH_SRC/src/lifecycle.h")
  [[ -n $header ]] || fail "LIFECYCLE_DEFAULT_MAX_ATTEMPTS not found in src/lifecycle.h"
  column=$(q "select column_default from information_schema.columns
               where table_name = 'agent_work_queue' and column_name = 'max_attempts'")
  kit=$(kit_lua -e 'print(require("leash.testing").DEFAULT_MAX_ATTEMPTS)')
  assert_eq "the table's max_attempts default against LIFECYCLE_DEFAULT_MAX_ATTEMPTS" "$column" "$header"
  assert_eq "the kit's DEFAULT_MAX_ATTEMPTS against LIFECYCLE_DEFAULT_MAX_ATTEMPTS" "$kit" "$header"
  assert_eq "the kit's task without max_attempts, one attempt before the last and the last" \
    "$(kit_record retry_backoff $((header - 2)) default 1 | grep '^status='; kit_record retry_backoff $((header - 1)) default 1 | grep '^status=')" \
    $'status=pending\nstatus=dead'
}

t_run "$@"
