# shellcheck shell=bash
# Shared helpers for tests/integration/<area>.sh. An area script looks like:
#
#   #!/usr/bin/env bash
#   source "$(dirname "$0")/../lib.sh"
#   case_enqueue_then_run() {
#     need_pg; t_newdb
#     expect_exit 0 "$LEASH" migrate
#     assert_eq "rows" "$(q 'select count(*) from agent_work_queue')" 0
#   }
#   t_run "$@"
#
# and is registered in tests/tests.cmake: leash_sh_test(<area> "db" enqueue_then_run ...).
# ctest runs `bash <area>.sh <case>`; `bash <area>.sh` alone runs every case.
#
# Rules: no bare sleeps (use wait_for); clean up with t_on_exit, never with your own
# `trap ... EXIT` (it would replace the one that runs the clean-ups); temporary files go
# in $T_TMP. fail/assert_* end the test with status 1. Exit 77 means "skipped".

set -Eeuo pipefail

LEASH_SRC=${LEASH_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
LEASH=${LEASH_BIN:-$LEASH_SRC/build/leash}
# LEASH_VALGRIND=1 (the "valgrind" ctest label): every leash the test starts runs under
# memcheck; a leak or memory error makes that leash exit 99, which the test sees as a failure.
if [[ ${LEASH_VALGRIND:-0} == 1 && $LEASH != *leash-vg* ]]; then
  _vg_wrapper=$(mktemp /tmp/leash-vg.XXXXXX)
  cat >"$_vg_wrapper" <<VG
#!/bin/sh
exec valgrind --quiet --leak-check=full --show-leak-kinds=definite,indirect \
  --errors-for-leak-kinds=definite,indirect --error-exitcode=99 --fair-sched=yes \
  --suppressions="$LEASH_SRC/tests/valgrind.supp" "$LEASH" "\$@"
VG
  chmod +x "$_vg_wrapper"
  LEASH=$_vg_wrapper
fi
export LEASH_SRC LEASH

T_AREA=$(basename "$0" .sh)
T_CASE=""
_T_PID=$BASHPID

# ------------------------------------------------------------------ clean-up
# One EXIT trap runs every registered clean-up, last registered first (like defer),
# each on its own, whatever the others do, and keeps the test's exit status.
_T_CLEANUPS=()

# t_on_exit CMD [ARGS...]: run CMD when the test exits (pass, fail or signal).
t_on_exit() {
  (($#)) || { echo "t_on_exit: no command" >&2; exit 2; }
  local q
  printf -v q '%q ' "$@"
  _T_CLEANUPS+=("$q")
}

# t_kill PID...: stops background processes (TERM, then KILL after 5 s) and reaps them;
# quiet about ones already gone. Typical: `"$LEASH" run ... & t_on_exit t_kill $!`.
t_kill() {
  local pid i
  for pid in "$@"; do
    kill -TERM "$pid" 2>/dev/null || continue
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  return 0
}

_t_exit() {
  local rc=$? i
  # Subshells (expect_exit, `( ... )`) must not run the parent's clean-ups.
  [[ $BASHPID == "$_T_PID" ]] || return "$rc"
  trap - ERR
  set +e
  for ((i = ${#_T_CLEANUPS[@]} - 1; i >= 0; i--)); do
    eval "${_T_CLEANUPS[i]}" </dev/null || echo "# clean-up failed: ${_T_CLEANUPS[i]}" >&2
  done
  _T_CLEANUPS=()
  return "$rc"
}
trap _t_exit EXIT
[[ -z ${_vg_wrapper:-} ]] || t_on_exit rm -f "$_vg_wrapper"
trap 'exit 130' INT
trap 'exit 143' TERM

# A command that fails under `set -e` says where, instead of ending the test silently.
_t_err() {
  local rc=$1 line=$2 cmd=$3
  # Once per process: a failure inside a function is reported, not its every caller.
  [[ ${_T_ERR_PID:-} != "$BASHPID" ]] || return 0
  _T_ERR_PID=$BASHPID
  echo "# command failed (status $rc) at ${BASH_SOURCE[1]##*/}:$line: $cmd" >&2
}
trap '_t_err $? $LINENO "$BASH_COMMAND"' ERR

# ------------------------------------------------------------------ temp dir
T_TMP=$(mktemp -d "${TMPDIR:-/tmp}/leash-t.$T_AREA.XXXXXX")
T_OUT=$T_TMP/stdout
T_ERR=$T_TMP/stderr
export T_TMP
t_on_exit rm -rf "$T_TMP"

# t_tmp: prints this test's private temp dir (removed when the test exits).
t_tmp() { printf '%s\n' "$T_TMP"; }

# free_port: a loopback TCP port for a server a test starts (metrics, dashboard, a stub).
# Nothing listening there is not enough: ctest runs areas at once, and two tests that both
# probe before either binds get the same port. So each port handed out is claimed under one
# lock by a file naming the test's shell ($$, the same in $(...)), taken again only once that
# process is gone. 19000..21999 lies below Linux's ephemeral range (32768..), so no outgoing
# connection holds one by chance.
free_port() {
  local dir=${TMPDIR:-/tmp}/leash-test-ports
  mkdir -p "$dir" 2>/dev/null
  (
    flock -w 30 9 || exit 1
    local i p f start=$((RANDOM % 3000))
    for ((i = 0; i < 3000; i++)); do
      p=$((19000 + (start + i) % 3000))
      f=$dir/$p
      [[ -s $f ]] && kill -0 "$(<"$f")" 2>/dev/null && continue
      (exec 6<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
      echo "$$" >"$f"
      echo "$p"
      exit 0
    done
    exit 1
  ) 9>>"$dir/.lock" || fail "no free port in 19000..21999"
}

# ------------------------------------------------------------------ failing
fail() {
  echo "FAIL ${T_AREA}${T_CASE:+.$T_CASE}: $*" >&2
  exit 1
}

# assert_eq DESC GOT WANT
assert_eq() {
  (($# == 3)) || fail "assert_eq needs DESC GOT WANT (got $# arguments)"
  [[ $2 == "$3" ]] && return 0
  fail "$1"$'\n'"  got:  $(_t_show "$2")"$'\n'"  want: $(_t_show "$3")"
}

# assert_contains DESC HAYSTACK NEEDLE (plain substring, no patterns)
assert_contains() {
  (($# == 3)) || fail "assert_contains needs DESC HAYSTACK NEEDLE (got $# arguments)"
  [[ $2 == *"$3"* ]] && return 0
  fail "$1: missing $(_t_show "$3")"$'\n'"  in: $(_t_show "$2")"
}

# assert_not_contains DESC HAYSTACK NEEDLE
assert_not_contains() {
  (($# == 3)) || fail "assert_not_contains needs DESC HAYSTACK NEEDLE (got $# arguments)"
  [[ $2 != *"$3"* ]] && return 0
  fail "$1: unexpected $(_t_show "$3")"$'\n'"  in: $(_t_show "$2")"
}

# Quote a value for a message; multi-line values are shown indented below.
_t_show() {
  if [[ $1 == *$'\n'* ]]; then
    printf '(%d lines)\n%s' "$(printf '%s\n' "$1" | wc -l)" "$(printf '%s\n' "$1" | sed 's/^/      | /')"
  else
    printf '%q' "$1"
  fi
}

# expect_exit CODE CMD [ARGS...]: runs CMD (a program or a shell function, in a
# subshell) with stdout in $T_OUT and stderr in $T_ERR, and fails unless it exits CODE.
expect_exit() {
  (($# >= 2)) || fail "expect_exit needs CODE CMD..."
  local want=$1 rc opts=$- err_trap
  shift
  err_trap=$(trap -p ERR)
  trap - ERR
  set +e
  # errexit as the caller had it (set +e above would otherwise leak into the subshell).
  (
    [[ $opts != *e* ]] || set -e
    "$@"
  ) >"$T_OUT" 2>"$T_ERR"
  rc=$?
  [[ $opts == *e* ]] && set -e
  eval "$err_trap"
  [[ $rc == "$want" ]] && return 0
  fail "exit status of: $*"$'\n'"  got:  $rc"$'\n'"  want: $want"$'\n'"$(_t_tail stdout "$T_OUT")"$'\n'"$(_t_tail stderr "$T_ERR")"
}

_t_tail() {
  if [[ -s $2 ]]; then
    printf '  %s (last 40 lines):\n' "$1"
    tail -n 40 "$2" | sed 's/^/      | /'
  else
    printf '  %s: (empty)' "$1"
  fi
}

# ------------------------------------------------------------------ waiting
_t_now_us() { local t=${EPOCHREALTIME//[!0-9]/}; echo $((10#$t)); }

# wait_for DESC TIMEOUT_S CMD [ARGS...]: re-runs CMD every 50 ms until it succeeds;
# after TIMEOUT_S seconds (decimals allowed) prints "timeout waiting for DESC" and fails.
wait_for() {
  (($# >= 3)) || fail "wait_for needs DESC TIMEOUT_S CMD..."
  local desc=$1 timeout=$2 whole frac deadline last=$T_TMP/wait_for.last
  shift 2
  [[ $timeout =~ ^([0-9]+)(\.([0-9]{1,6}))?$ ]] || fail "wait_for: bad timeout '$timeout'"
  whole=${BASH_REMATCH[1]} frac=${BASH_REMATCH[3]}000000
  deadline=$(($(_t_now_us) + 10#$whole * 1000000 + 10#${frac:0:6}))
  while :; do
    if "$@" >"$last" 2>&1; then return 0; fi
    (($(_t_now_us) < deadline)) || break
    sleep 0.05
  done
  fail "timeout waiting for $desc (${timeout}s; last try: $*)"$'\n'"$(_t_tail output "$last")"
}

# ------------------------------------------------------------------ database
# need_pg: skip (77) without the throwaway server, except in CI where that is a failure.
need_pg() {
  [[ -n ${PGHOST:-} && -n ${PGPORT:-} ]] && return 0
  if [[ ${CI:-} == true ]]; then
    fail "PGHOST/PGPORT are not set, and in CI database tests must run (scripts/test.sh starts the server)"
  fi
  echo "skip ${T_AREA}.${T_CASE}: no PostgreSQL (run via scripts/test.sh, or eval \"\$(scripts/pg.sh start)\")" >&2
  exit 77
}

# t_newdb [SUFFIX]: a fresh, empty database t_<area>_<case>[_<suffix>] (dropped and
# recreated if it exists, dropped again at exit); exports TDB and DATABASE_URL.
t_newdb() {
  need_pg
  local name sum
  name=t_${T_AREA}_${T_CASE}${1:+_$1}
  name=${name,,}
  name=${name//[^a-z0-9_]/_}
  if ((${#name} > 63)); then
    sum=$(printf '%s' "$name" | cksum | cut -d' ' -f1)
    name=${name:0:52}_$(printf '%010d' "$sum")
  fi
  local url
  url=$("$LEASH_SRC/scripts/pg.sh" newdb "$name") || fail "could not create database $name"
  TDB=$name
  DATABASE_URL=$url
  export TDB DATABASE_URL
  [[ ${LEASH_TEST_KEEP_DB:-} == 1 ]] || t_on_exit _t_dropdb "$name"
}

_t_dropdb() {
  psql -X -q -v "name=$1" -d postgres >/dev/null 2>&1 <<'SQL' || true
DROP DATABASE IF EXISTS :"name" WITH (FORCE);
SQL
}

# q SQL: runs SQL against $DATABASE_URL, prints the result unaligned, tuples only.
q() {
  (($# == 1)) || fail "q takes one SQL string (got $# arguments)"
  psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -c "$1"
}

# ------------------------------------------------------------------ dispatcher
# t_run CASE: runs case_CASE and prints "ok AREA.CASE". Without CASE: every case,
# each in its own process, like ctest would.
t_run() {
  if (($# == 0)); then
    local c rc failed=0
    for c in $(declare -F | awk '$3 ~ /^case_/ { sub(/^case_/, "", $3); print $3 }'); do
      rc=0
      bash "$0" "$c" || rc=$?
      case $rc in
        0) ;;
        77) echo "skip $T_AREA.$c" ;;
        *) echo "not ok $T_AREA.$c (status $rc)"; failed=1 ;;
      esac
    done
    exit "$failed"
  fi
  (($# == 1)) || { echo "usage: $0 [CASE]" >&2; exit 2; }
  declare -F "case_$1" >/dev/null || { echo "$0: no such case: $1" >&2; exit 2; }
  T_CASE=$1
  "case_$1"
  echo "ok $T_AREA.$T_CASE"
}
