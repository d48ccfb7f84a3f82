#!/usr/bin/env bash
# The scheduler's command-line side: leash tenant (fair-share weights), enqueue --priority
# and the JSONL "priority" field, and report/inspect timings from run_started_at.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"

new_queue() {
  # shellcheck disable=SC2119 # t_newdb's SUFFIX is optional
  t_newdb
  expect_exit 0 "$LEASH" migrate
}

# jget JSON EXPR: a Python expression over j (the parsed JSON), printed compactly.
jget() {
  python3 -c 'import json, sys
j = json.loads(sys.argv[1])
v = eval(sys.argv[2])
print(json.dumps(v, separators=(",", ":"), ensure_ascii=False) if isinstance(v, (dict, list)) or v is None else v)' "$1" "$2"
}

# json_weight JSON NAME: the weight list --json gives the tenant NAME (compared exactly, as
# Python strings), or "absent".
json_weight() {
  python3 -c 'import json, sys
j = json.loads(sys.argv[1])
w = [t["weight"] for t in j["tenants"] if t["tenant_id"] == sys.argv[2]]
print(w[0] if w else "absent")' "$1" "$2"
}

# hex S: the bytes of S in hex, to compare with encode(convert_to(col, 'UTF8'), 'hex').
hex() { printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n'; }

weights() { q "select coalesce(string_agg(tenant_id || '=' || weight, ',' order by tenant_id collate \"C\"), '')
                 from agent_work_queue_tenants"; }

# ---------------------------------------------------------------- tenant

case_set_list_and_reset_round_trip() {
  need_pg
  new_queue
  expect_exit 0 "$LEASH" tenant list --json
  assert_eq "empty list" "$(<"$T_OUT")" '{"table":"agent_work_queue","tenants":[]}'

  expect_exit 0 "$LEASH" tenant set acme --weight 5
  assert_eq "set: old weight is the default" "$(<"$T_OUT")" "weight 5 (was 1, the default)"
  expect_exit 0 "$LEASH" tenant set acme --weight 7
  assert_eq "set again: upsert" "$(<"$T_OUT")" "weight 7 (was 5)"
  # Options before the action work too, as in every other command.
  expect_exit 0 "$LEASH" tenant --weight 1000 set big
  assert_eq "rows" "$(weights)" "acme=7,big=1000"
  assert_eq "updated_at is now" \
    "$(q "select bool_and(updated_at > now() - interval '1 minute') from agent_work_queue_tenants")" t

  # Tenants with open work and no weight are listed at the default; settled-only ones are not.
  expect_exit 0 "$LEASH" enqueue --tenant beta '{"n":1}'
  expect_exit 0 "$LEASH" enqueue --tenant beta '{"n":2}'
  expect_exit 0 "$LEASH" enqueue --tenant gamma '{"n":3}'
  expect_exit 0 "$LEASH" enqueue --tenant acme '{"n":4}'
  expect_exit 0 "$LEASH" enqueue --tenant finished '{"n":5}'
  q "update agent_work_queue set status = 'leased', lease_owner = 'w1', lease_token = 1,
            locked_until = now() + interval '1 minute', started_at = now(), attempts = 1
      where id = 3;
     update agent_work_queue set status = 'done', finished_at = now() where id = 5" >/dev/null

  expect_exit 0 "$LEASH" tenant list --json
  local j
  j=$(<"$T_OUT")
  assert_eq "list: rows" \
    "$(jget "$j" '[(t["tenant_id"], t["weight"], t["weight_set"], t["pending"], t["leased"]) for t in j["tenants"]]')" \
    '[["acme",7,true,1,0],["beta",1,false,2,0],["big",1000,true,0,0],["gamma",1,false,0,1]]'
  assert_eq "list: updated_at only for set weights" \
    "$(jget "$j" '[t["updated_at"] is None for t in j["tenants"]]')" '[false,true,false,true]'

  expect_exit 0 "$LEASH" tenant list
  assert_eq "text list" "$(<"$T_OUT")" \
"tenant  weight         pending     leased
acme    7                    1          0
beta    1 (default)          2          0
big     1000                 0          0
gamma   1 (default)          0          1"

  expect_exit 0 "$LEASH" tenant reset acme
  assert_eq "reset: says what it was" "$(<"$T_OUT")" "weight 1, the default (was 7)"
  expect_exit 0 "$LEASH" tenant reset acme
  assert_eq "reset again: nothing to remove" "$(<"$T_OUT")" "weight 1, the default (no weight was set)"
  assert_eq "rows after reset" "$(weights)" "big=1000"
  expect_exit 0 "$LEASH" tenant list --json
  assert_eq "acme back at the default" "$(jget "$(<"$T_OUT")" '[t for t in j["tenants"] if t["tenant_id"] == "acme"][0]["weight_set"]')" False

  # --table is honoured: another queue has its own weights.
  expect_exit 0 "$LEASH" --table other migrate
  expect_exit 0 "$LEASH" tenant set acme --weight 3 --table other
  assert_eq "other table's weights" "$(q "select tenant_id || '=' || weight from other_tenants")" "acme=3"
  assert_eq "this table's weights unchanged" "$(weights)" "big=1000"
}

case_bad_weights_and_arguments_are_refused_with_exit_2_and_nothing_written() {
  need_pg
  new_queue
  expect_exit 0 "$LEASH" tenant set acme --weight 5
  local before
  before=$(q "select updated_at from agent_work_queue_tenants")
  local w
  for w in 0 1001 x '' -1 1.5 ' 5' '+5' 5x 99999999999999999999 0x10; do
    expect_exit 2 "$LEASH" tenant set acme --weight "$w"
    assert_eq "weight '$w': the error" "$(head -n 1 "$T_ERR")" \
      "leash tenant: --weight must be an integer from 1 to 1000, not '$w'"
    assert_eq "weight '$w': the hint" "$(sed -n 2p "$T_ERR")" "Try 'leash tenant --help'."
    assert_eq "weight '$w': two lines" "$(wc -l <"$T_ERR" | tr -d ' ')" 2
    assert_eq "weight '$w': stdout" "$(<"$T_OUT")" ""
  done
  local long
  long=$(printf 'a%.0s' {1..513})
  local -a cases=(
    "the tenant T must not be empty|set|--weight|3|"
    "the tenant T is 513 bytes; at most 512|set|--weight|3|$long"
    "set: missing --weight W|set|acme"
    "set: missing the tenant T|set|--weight|3"
    "set takes one tenant (quote a name with spaces)|set|a|b|--weight|3"
    "reset: missing the tenant T|reset"
    "the tenant T must not be empty|reset|"
    "--weight goes with set|reset|acme|--weight|3"
    "list takes no tenant (unexpected 'acme')|list|acme"
    "--json goes with list|set|acme|--weight|3|--json"
    "missing what to do: set, list or reset"
    "unknown action 'frob' (set, list or reset)|frob"
  )
  local entry want
  local -a args
  for entry in "${cases[@]}"; do
    IFS='|' read -r -a args <<<"$entry"
    want=${args[0]}
    args=("${args[@]:1}")
    # A trailing empty field is an empty argument.
    [[ $entry != *'|' ]] || args+=("")
    expect_exit 2 "$LEASH" tenant "${args[@]}"
    assert_eq "${args[*]}: the error" "$(head -n 1 "$T_ERR")" "leash tenant: $want"
    assert_eq "${args[*]}: stdout" "$(<"$T_OUT")" ""
  done
  # Bytes the database's encoding cannot hold are the user's data: exit 2, one line.
  expect_exit 2 "$LEASH" tenant set $'\xff' --weight 3
  assert_eq "invalid UTF-8: one line" "$(wc -l <"$T_ERR" | tr -d ' ')" 1
  assert_contains "invalid UTF-8: names it" "$(<"$T_ERR")" 'invalid byte sequence for encoding "UTF8"'
  assert_contains "invalid UTF-8: nothing written" "$(<"$T_ERR")" "nothing was written"

  # --table is checked as for every command, before and after the command's name.
  local bad=$'x\nDROP TABLE IF EXISTS agent_work_queue_tenants;--'
  expect_exit 2 "$LEASH" --table "$bad" tenant set acme --weight 3
  assert_contains "--table before" "$(head -n 1 "$T_ERR")" "leash: --table: "
  expect_exit 2 "$LEASH" tenant list --table "$bad"
  assert_contains "--table after" "$(head -n 1 "$T_ERR")" "leash tenant: --table: "
  assert_not_contains "no raw name echoed" "$(<"$T_ERR")" "DROP TABLE"
  # A queue that was never migrated has no tenants table: the fix is named, exit 1.
  expect_exit 1 "$LEASH" --table unmigrated tenant set acme --weight 3
  assert_contains "unmigrated" "$(<"$T_ERR")" "run 'leash migrate' first"

  assert_eq "nothing written" "$(weights)" "acme=5"
  assert_eq "acme's row untouched" "$(q "select updated_at from agent_work_queue_tenants")" "$before"
}

case_hostile_tenant_names_round_trip_exactly() {
  need_pg
  new_queue
  local e512 e513 a512
  e512=$(printf 'é%.0s' {1..256})   # 512 bytes, 256 characters
  e513=${e512}a
  a512=$(printf 'a%.0s' {1..512})
  local -a names=(
    "it's \"quoted\""
    'back\slash \\ \N'
    "x'); DROP TABLE agent_work_queue_tenants; --"
    'пример 日本語 🙂'
    $'tab\there\nnewline'
    "\$1"
    '-starts-with-dash'
    '%s%n'
    ' spaced '
    "$e512"
    "$a512"
  )
  local name i=0
  for name in "${names[@]}"; do
    i=$((i + 1))
    expect_exit 0 "$LEASH" tenant set --weight "$i" -- "$name"
  done
  assert_eq "every row" "$(q 'select count(*) from agent_work_queue_tenants')" "${#names[@]}"
  expect_exit 0 "$LEASH" tenant list --json
  local j
  j=$(<"$T_OUT")
  i=0
  for name in "${names[@]}"; do
    i=$((i + 1))
    assert_eq "stored bytes of $(printf %q "$name")" \
      "$(q "select weight || ':' || encode(convert_to(tenant_id, 'UTF8'), 'hex') from agent_work_queue_tenants
             where weight = $i")" "$i:$(hex "$name")"
    assert_eq "list --json has $(printf %q "$name")" "$(json_weight "$j" "$name")" "$i"
  done
  # The text form cannot be forged into extra lines by a name.
  expect_exit 0 "$LEASH" tenant list
  assert_eq "text list: header + one line per tenant" "$(wc -l <"$T_OUT" | tr -d ' ')" $((${#names[@]} + 1))
  assert_contains "text list: control characters escaped" "$(<"$T_OUT")" 'tab\x09here\x0anewline'

  # One byte over is refused, in bytes not characters, and writes nothing.
  expect_exit 2 "$LEASH" tenant set "$e513" --weight 3
  assert_eq "513 bytes" "$(head -n 1 "$T_ERR")" "leash tenant: the tenant T is 513 bytes; at most 512"
  expect_exit 2 "$LEASH" tenant set "${a512}b" --weight 3
  assert_eq "still the same rows" "$(q 'select count(*) from agent_work_queue_tenants')" "${#names[@]}"

  # The injection attempt was only a name: the table is there, and reset removes it exactly.
  for name in "${names[@]}"; do
    expect_exit 0 "$LEASH" tenant reset -- "$name"
    assert_contains "reset $(printf %q "$name")" "$(<"$T_OUT")" "(was "
  done
  assert_eq "all reset" "$(q 'select count(*) from agent_work_queue_tenants')" 0
}

# ---------------------------------------------------------------- priority

case_enqueue_priority_flag_and_field_land_in_the_column() {
  need_pg
  new_queue
  expect_exit 0 "$LEASH" enqueue '{"n":1}'
  expect_exit 0 "$LEASH" enqueue --priority 7 '{"n":2}'
  expect_exit 0 "$LEASH" enqueue --priority -1000 '{"n":3}'
  expect_exit 0 "$LEASH" enqueue --priority 1000 '{"n":4}'
  # The flag is every line's default; a line's field beats it, in any JSON spelling of a
  # whole number.
  printf '%s\n' '{"payload":5}' '{"payload":6,"priority":-3}' '{"payload":7,"priority":1e2}' \
    '{"payload":8,"priority":0}' '{"payload":9,"priority":12.0}' >"$T_TMP/p.jsonl"
  expect_exit 0 "$LEASH" enqueue --priority 5 --file "$T_TMP/p.jsonl"
  assert_eq "count" "$(<"$T_OUT")" 5
  printf '%s\n' '{"payload":10}' '{"payload":11,"priority":9}' >"$T_TMP/q.jsonl"
  expect_exit 0 "$LEASH" enqueue --file "$T_TMP/q.jsonl"
  assert_eq "priorities by id" \
    "$(q "select string_agg(priority::text, ',' order by id) from agent_work_queue")" \
    "0,7,-1000,1000,5,-3,100,0,12,0,9"
}

case_bad_priorities_are_refused_and_insert_nothing() {
  need_pg
  new_queue
  local p
  for p in 1001 -1001 x '' 1.5 ' 1' '+1' 1e2 99999999999999999999; do
    expect_exit 2 "$LEASH" enqueue --priority "$p" '{"n":1}'
    assert_eq "--priority '$p'" "$(head -n 1 "$T_ERR")" \
      "leash enqueue: --priority must be an integer from -1000 to 1000, not '$p'"
    expect_exit 2 "$LEASH" enqueue --priority "$p" --file /dev/null
  done
  local v
  for v in 1001 -1001 0.5 '"5"' null true '[1]'; do
    printf '%s\n' '{"payload":1,"priority":1}' "{\"payload\":2,\"priority\":$v}" >"$T_TMP/bad.jsonl"
    expect_exit 2 "$LEASH" enqueue --file "$T_TMP/bad.jsonl"
    assert_eq "line priority $v" "$(<"$T_ERR")" \
      "leash enqueue: $T_TMP/bad.jsonl line 2: \"priority\" must be an integer from -1000 to 1000; nothing was enqueued"
  done
  assert_eq "nothing inserted" "$(q 'select count(*) from agent_work_queue')" 0
}

# ---------------------------------------------------------------- report and inspect

case_report_and_inspect_time_runs_from_run_started_at() {
  need_pg
  new_queue
  # Task 1: runnable at T0+2 (created at T0), claimed at T0+3, handle started at T0+3.5,
  # finished at T0+13.5: ran 10 s, waited 1 s to be claimed and 0.5 s to start.
  # Task 2, settled before run_started_at existed: claimed at T0+4 (runnable at T0),
  # finished at T0+24: ran 20 s from its claim, waited 4 s, start wait unknown.
  # Task 3 is dead and task 4 is in another batch: neither counts.
  q "insert into agent_work_queue (id, tenant_id, shard_key, payload, status, attempts, batch,
                                   created_at, run_after, started_at, run_started_at, finished_at)
     values (1, 'acme', 's1', '{}', 'done', 1, 'r', timestamptz '2026-01-01 00:00:00+00',
             timestamptz '2026-01-01 00:00:02+00', timestamptz '2026-01-01 00:00:03+00',
             timestamptz '2026-01-01 00:00:03.5+00', timestamptz '2026-01-01 00:00:13.5+00'),
            (2, 'acme', 's2', '{}', 'done', 1, 'r', timestamptz '2026-01-01 00:00:00+00',
             timestamptz '2026-01-01 00:00:00+00', timestamptz '2026-01-01 00:00:04+00',
             null, timestamptz '2026-01-01 00:00:24+00'),
            (3, 'acme', 's3', '{}', 'dead', 1, 'r', timestamptz '2026-01-01 00:00:00+00',
             timestamptz '2026-01-01 00:00:00+00', timestamptz '2026-01-01 00:00:05+00',
             timestamptz '2026-01-01 00:00:06+00', timestamptz '2026-01-01 00:01:00+00'),
            (4, 'acme', 's4', '{}', 'done', 1, 'other', timestamptz '2026-01-01 00:00:00+00',
             timestamptz '2026-01-01 00:00:00+00', timestamptz '2026-01-01 00:00:00+00',
             timestamptz '2026-01-01 00:00:50+00', timestamptz '2026-01-01 00:01:40+00')" >/dev/null

  expect_exit 0 "$LEASH" report --batch r --json
  local j
  j=$(<"$T_OUT")
  assert_eq "durations from run_started_at, started_at when it is missing" \
    "$(jget "$j" 'j["duration_s"]')" '{"count":2,"p50":10,"p95":20,"max":20}'
  assert_eq "pickup wait from greatest(created_at, run_after)" \
    "$(jget "$j" 'j["pickup_wait_s"]')" '{"count":2,"p50":1,"p95":4,"max":4}'
  assert_eq "claim-to-start wait only where recorded" \
    "$(jget "$j" 'j["start_wait_s"]')" '{"count":1,"p50":0.5,"p95":0.5,"max":0.5}'
  assert_eq "the keys before them keep their order" \
    "$(jget "$j" 'list(j)')" \
    '["table","tenants","batch","counts","total","settled","attempts","retries","retried_tasks","crashes","crashed_tasks","dead_causes","duration_s","dead_reasons","dead_reasons_total","first_claim_at","last_finish_at","wall_s","pickup_wait_s","start_wait_s","usage"]'

  expect_exit 0 "$LEASH" report --batch r
  local out
  out=$(<"$T_OUT")
  assert_contains "text: duration" "$out" \
    "duration   p50 10.0s, p95 20.0s, max 20.0s (2 done tasks, last attempt from its start)"
  assert_contains "text: waits" "$out" \
    "waits      pickup p50 1.0s, p95 4.0s; claim to start p50 500ms, p95 500ms"

  expect_exit 0 "$LEASH" inspect 1
  out=$(<"$T_OUT")
  grep -Eq '^last_attempt_s +10$' <<<"$out" || fail "last_attempt_s: $out"
  grep -Eq '^start_wait_s +0\.5$' <<<"$out" || fail "start_wait_s: $out"
  grep -Eq '^pickup_wait_s +1$' <<<"$out" || fail "pickup_wait_s: $out"
  local col
  for col in priority is_head lease_token run_started_at; do
    grep -Eq "^$col " <<<"$out" || fail "inspect prints $col: $out"
  done
  expect_exit 0 "$LEASH" inspect 2 --json
  j=$(<"$T_OUT")
  assert_eq "inspect --json: timings of a row from before 011" "$(jget "$j" 'j["timings"]')" \
    '{"last_attempt_s":20,"start_wait_s":null,"pickup_wait_s":4}'
  assert_eq "inspect --json: the row has the scheduler's columns" \
    "$(jget "$j" '[j["task"]["priority"]] + [k in j["task"] for k in ("is_head", "lease_token", "run_started_at")]')" \
    '[0,true,true,true]'
}

t_run "$@"
