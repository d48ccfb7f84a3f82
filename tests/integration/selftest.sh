#!/usr/bin/env bash
# Checks that tests/lib.sh itself works against the throwaway cluster.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"

case_newdb_is_empty_and_isolated() {
  need_pg
  t_newdb
  assert_eq "database name" "$TDB" "t_selftest_newdb_is_empty_and_isolated"
  assert_eq "connected to" "$(q 'select current_database()')" "$TDB"
  assert_eq "user tables in a new database" \
    "$(q "select count(*) from pg_class where relnamespace = 'public'::regnamespace")" 0

  q 'create table marker (x int); insert into marker values (42)'
  assert_eq "marker row" "$(q 'select x from marker')" 42

  # A second database of the same test is a different, empty one.
  local first_url=$DATABASE_URL
  t_newdb other
  assert_eq "second database name" "$TDB" "t_selftest_newdb_is_empty_and_isolated_other"
  assert_eq "marker table in the second database" "$(q "select to_regclass('marker') is null")" t

  # newdb on an existing name (with a session still connected to it) starts afresh.
  DATABASE_URL=$first_url
  psql -X -q -d "$first_url" -c 'select pg_sleep(60)' >/dev/null 2>&1 &
  t_on_exit t_kill $!
  wait_for "the holding session" 10 holding_session_is_there
  t_newdb
  assert_eq "marker table after recreating" "$(q "select to_regclass('marker') is null")" t

  # Long names are cut to PostgreSQL's 63 bytes and stay distinct.
  local long=long_suffix_that_pushes_the_name_well_past_the_sixty_three_byte_limit
  t_newdb "${long}_a"; local a=$TDB
  t_newdb "${long}_b"; local b=$TDB
  assert_eq "length of a long name" "${#a}" 63
  [[ $a != "$b" ]] || fail "two long names collided: $a"
  assert_eq "connected to the long name" "$(q 'select current_database()')" "$b"

  # t_tmp is private to this test and is where expect_exit keeps its output.
  [[ -d $(t_tmp) && $T_OUT == "$(t_tmp)"/* ]] || fail "t_tmp/T_OUT not set up"
  expect_exit 3 bash -c 'echo out; echo err >&2; exit 3'
  assert_eq "expect_exit stdout" "$(<"$T_OUT")" out
  assert_eq "expect_exit stderr" "$(<"$T_ERR")" err
  assert_contains "a haystack" "hay needle stack" "needle"
  assert_not_contains "a haystack" "hay stack" "needle"
  [[ -n $LEASH ]] || fail "LEASH is empty"
}

holding_session_is_there() {
  [[ $(q "select count(*) from pg_stat_activity
          where datname = current_database() and query = 'select pg_sleep(60)'") == 1 ]]
}

case_wait_for_times_out() {
  local t0 elapsed_ms
  # A condition that can never hold: wait_for must fail (status 1) within its timeout.
  t0=$(_t_now_us)
  expect_exit 1 wait_for "the impossible" 1 false
  elapsed_ms=$((($(_t_now_us) - t0) / 1000))
  assert_contains "wait_for message" "$(<"$T_ERR")" "timeout waiting for the impossible"
  ((elapsed_ms >= 1000)) || fail "wait_for gave up early, after ${elapsed_ms} ms"
  ((elapsed_ms < 3000)) || fail "wait_for overran its 1 s timeout: ${elapsed_ms} ms"

  # A fractional timeout works too, and a condition that becomes true is seen quickly.
  expect_exit 1 wait_for "never" 0.2 false
  local flag
  flag=$(t_tmp)/flag
  (sleep 0.3 && touch "$flag") &
  t_on_exit t_kill $!
  t0=$(_t_now_us)
  wait_for "the flag file" 10 test -e "$flag"
  elapsed_ms=$((($(_t_now_us) - t0) / 1000))
  ((elapsed_ms < 2000)) || fail "wait_for took ${elapsed_ms} ms to see the flag"

  # Clean-ups run last-registered first, each even if another fails, in the main shell only.
  # shellcheck disable=SC2016 # $1 is for the inner bash
  expect_exit 5 bash -c '
    source "$1"
    t_on_exit echo first
    t_on_exit false
    t_on_exit echo second
    ( exit 0 )
    exit 5' selftest "$LEASH_SRC/tests/lib.sh"
  assert_eq "clean-up order" "$(<"$T_OUT")" $'second\nfirst'
  assert_contains "failed clean-up reported" "$(<"$T_ERR")" "clean-up failed: false"
}

t_run "$@"
