#!/usr/bin/env bash
# leash enqueue: one task from the command line, many from JSONL (--file F, - for stdin).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"

# qv NAME=VALUE... SQL: like q, with psql variables (:'NAME' a literal).
qv() {
  local args=()
  while (($# > 1)); do args+=(-v "$1"); shift; done
  printf '%s\n' "$1" | psql -X -A -t -q -v ON_ERROR_STOP=1 "${args[@]}" -d "$DATABASE_URL" -f -
}

# json_str S: S as a JSON string literal (UTF-8 kept as it is).
json_str() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/\\r}
  printf '"%s"' "$s"
}

# hex S: the bytes of S in hex, to compare with encode(convert_to(col, 'UTF8'), 'hex').
hex() { printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n'; }

rows() { q 'select count(*) from agent_work_queue'; }

migrated_db() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
}

# row ID: tenant|shard|payload|batch|max_attempts|run_after - created_at (s)|status|attempts
row() {
  q "select tenant_id, shard_key, payload::text, coalesce(batch, '<null>'), max_attempts,
            extract(epoch from run_after - created_at)::numeric(12,3), status, attempts
       from agent_work_queue where id = $1"
}

# ten_thousand FILE [BAD_LINE]: 10,000 good lines (blank ones at 100 and 5000, tabs and
# backslashes on line 42), with line 7777 replaced by BAD_LINE when given.
ten_thousand() {
  local file=$1 bad=${2-}
  awk -v bad="$bad" 'BEGIN {
      for (i = 1; i <= 10000; i++) {
        if (i == 100) print ""
        else if (i == 5000) print "   "
        else if (i == 42) printf "{\"payload\":{\"i\":%d,\"s\":\"tab\\there \\\\N back\\\\slash\"}}\n", i
        else if (i == 7777 && bad != "") print bad
        else printf "{\"payload\":{\"i\":%d}}\n", i
      }
    }' >"$file"
}

# ---------------------------------------------------------------- one task

case_single_payload_prints_id_and_defaults() {
  need_pg
  migrated_db
  expect_exit 0 "$LEASH" enqueue '{"k": "v"}'
  assert_eq "stdout: the id" "$(<"$T_OUT")" 1
  assert_eq "stderr" "$(<"$T_ERR")" ""
  assert_eq "row 1" "$(row 1)" 'default|task:1|{"k": "v"}|<null>|8|0.000|pending|0'
  assert_eq "runnable now" "$(q "select run_after <= now() and run_after > now() - interval '1 minute'
                                   and locked_until is null and lease_owner is null
                                   from agent_work_queue where id = 1")" t

  expect_exit 0 "$LEASH" enqueue '{"k": "w"}'
  assert_eq "second id" "$(<"$T_OUT")" 2
  assert_eq "row 2: its own shard" "$(row 2)" 'default|task:2|{"k": "w"}|<null>|8|0.000|pending|0'

  # Any JSON value but null is a payload.
  local p id=2
  for p in '[1, 2]' '"text"' '42' 'true' '{}'; do
    expect_exit 0 "$LEASH" enqueue "$p"
    id=$((id + 1))
    assert_eq "id for $p" "$(<"$T_OUT")" "$id"
    assert_eq "payload $p" "$(q "select payload::text from agent_work_queue where id = $id")" "$p"
  done

  # Not JSON, or null: a usage error, and no row.
  for p in 'null' '{' '{"a":1} x' '' "{'a': 1}" '{"a":1,"a":2}'; do
    expect_exit 2 "$LEASH" enqueue "$p"
    assert_eq "stdout for bad payload $p" "$(<"$T_OUT")" ""
    assert_contains "stderr for bad payload $p" "$(<"$T_ERR")" "leash enqueue: "
  done
  assert_eq "rows" "$(rows)" "$id"
}

case_flags_give_defaults_and_lines_override() {
  need_pg
  migrated_db
  # One task with every flag.
  expect_exit 0 "$LEASH" enqueue --tenant T --shard S --batch B --max-attempts 3 --delay 1h '{"n":0}'
  assert_eq "single with flags" "$(row 1)" 'T|S|{"n": 0}|B|3|3600.000|pending|0'

  local f=$T_TMP/lines.jsonl
  cat >"$f" <<'EOF'
{"payload":{"n":1}}
{"payload":{"n":2},"tenant_id":"t2","shard_key":"k2","batch":"b2","max_attempts":5,"run_after":"2031-01-02T03:04:05Z"}
{"payload":{"n":3},"batch":null}
{"payload":{"n":4},"delay":0}
{"payload":{"n":5},"delay":90,"max_attempts":1}
EOF
  # Flags are the defaults for what a line leaves out.
  expect_exit 0 "$LEASH" enqueue --tenant T --shard S --batch B --max-attempts 3 --delay 1h --file "$f"
  assert_eq "count" "$(<"$T_OUT")" 5
  assert_eq "line 1: all flags" "$(row 2)" 'T|S|{"n": 1}|B|3|3600.000|pending|0'
  assert_eq "line 2: all its own" \
    "$(q "select tenant_id, shard_key, batch, max_attempts, run_after = '2031-01-02 03:04:05+00'
            from agent_work_queue where id = 3")" 't2|k2|b2|5|t'
  assert_eq "line 3: batch null beats --batch" "$(row 4)" 'T|S|{"n": 3}|<null>|3|3600.000|pending|0'
  assert_eq "line 4: delay 0 beats --delay" "$(row 5)" 'T|S|{"n": 4}|B|3|0.000|pending|0'
  assert_eq "line 5: own delay and max_attempts" "$(row 6)" 'T|S|{"n": 5}|B|1|90.000|pending|0'

  # --run-after as the default; a line's delay still wins.
  expect_exit 0 "$LEASH" enqueue --run-after 2030-05-06T07:08:09Z --file "$f"
  assert_eq "count" "$(<"$T_OUT")" 5
  assert_eq "--run-after default" \
    "$(q "select run_after = '2030-05-06 07:08:09+00' from agent_work_queue where id = 7")" t
  assert_eq "line 2 keeps its run_after" \
    "$(q "select run_after = '2031-01-02 03:04:05+00' from agent_work_queue where id = 8")" t
  assert_eq "line 4's delay beats --run-after" "$(row 10)" 'default|task:10|{"n": 4}|<null>|8|0.000|pending|0'
  assert_eq "line 5's delay beats --run-after" "$(row 11)" 'default|task:11|{"n": 5}|<null>|1|90.000|pending|0'

  # No flags: the built-in defaults.
  expect_exit 0 "$LEASH" enqueue --file "$f"
  assert_eq "line 1 with no flags" "$(row 12)" 'default|task:12|{"n": 1}|<null>|8|0.000|pending|0'
  assert_eq "line 2 with no flags" "$(q 'select tenant_id, shard_key, batch from agent_work_queue where id = 13')" \
    't2|k2|b2'
  assert_eq "rows" "$(rows)" 16
}

case_bad_flags_are_usage_errors_and_insert_nothing() {
  need_pg
  migrated_db
  local args
  while IFS= read -r args; do
    # shellcheck disable=SC2086 # word splitting wanted
    expect_exit 2 "$LEASH" enqueue $args '{}'
    assert_eq "$args: stdout" "$(<"$T_OUT")" ""
    assert_contains "$args: hint" "$(<"$T_ERR")" "Try 'leash enqueue --help'."
  done <<'EOF'
--delay abc
--delay -5
--delay 5x
--delay 0x10
--delay inf
--delay 1e3
--delay 5 --run-after 2030-01-01T00:00:00Z
--max-attempts 0
--max-attempts -1
--max-attempts 1.5
--max-attempts 99999999999
--max-attempts x
--run-after not-a-time
--run-after 2030-13-45
EOF
  expect_exit 2 "$LEASH" enqueue --tenant '' '{}'
  expect_exit 2 "$LEASH" enqueue --shard '' '{}'
  expect_exit 2 "$LEASH" enqueue --file "$T_TMP/missing.jsonl"
  assert_contains "missing file" "$(<"$T_ERR")" "missing.jsonl"
  expect_exit 2 "$LEASH" enqueue --file "$T_TMP/missing.jsonl" '{}'
  # A bad flag with a file inserts nothing either.
  printf '%s\n' '{"payload":1}' '{"payload":2}' >"$T_TMP/two.jsonl"
  expect_exit 2 "$LEASH" enqueue --run-after not-a-time --file "$T_TMP/two.jsonl"
  assert_contains "bad --run-after with --file" "$(<"$T_ERR")" "not-a-time"
  assert_eq "rows" "$(rows)" 0
  # The good durations.
  local d
  for d in 0 30 1.5 500ms 30s 5m 2h 1d; do
    expect_exit 0 "$LEASH" enqueue --delay "$d" '{}'
  done
  assert_eq "rows" "$(rows)" 8
}

# ---------------------------------------------------------------- files

case_ten_thousand_lines_land_in_one_go() {
  need_pg
  migrated_db
  # One task first, so the file's ids do not start at 1.
  expect_exit 0 "$LEASH" enqueue '{"first":true}'
  local f=$T_TMP/10k.jsonl
  seq 1 10000 | awk '{ printf "{\"payload\":{\"i\":%d}}\n", $1 }' >"$f"
  expect_exit 0 "$LEASH" enqueue --file "$f"
  assert_eq "count printed" "$(<"$T_OUT")" 10000
  assert_eq "stderr" "$(<"$T_ERR")" ""
  assert_eq "rows" "$(q "select count(*) from agent_work_queue where payload ? 'i'")" 10000
  assert_eq "ids in line order" \
    "$(q "select count(*) from (select (payload->>'i')::int as i, row_number() over (order by id) as n
                                 from agent_work_queue where payload ? 'i') s where i <> n")" 0
  assert_eq "ids after the first task" \
    "$(q "select min(id) > 1 from agent_work_queue where payload ? 'i'")" t
  assert_eq "default shards" \
    "$(q "select count(*) from agent_work_queue where shard_key <> 'task:' || id or tenant_id <> 'default'")" 0
  # One transaction: one now() for every row.
  assert_eq "one transaction" \
    "$(q "select count(distinct created_at) from agent_work_queue where payload ? 'i'")" 1
}

case_one_bad_line_inserts_nothing_and_names_it() {
  need_pg
  migrated_db
  expect_exit 0 "$LEASH" enqueue '{"before":1}'
  expect_exit 0 "$LEASH" enqueue '{"before":2}'
  local f=$T_TMP/bad.jsonl name bad n=0
  # The good file lands (blank lines skipped), so the bad line is all that differs.
  ten_thousand "$f"
  expect_exit 0 "$LEASH" enqueue --file "$f"
  assert_eq "good file count" "$(<"$T_OUT")" 9998
  assert_eq "line 42 kept tabs and backslashes" \
    "$(q "select payload->>'s' from agent_work_queue where payload->>'i' = '42'")" \
    $'tab\there \\N back\\slash'
  local before
  before=$(rows)
  while IFS='|' read -r name bad; do
    n=$((n + 1))
    ten_thousand "$f" "$bad"
    expect_exit 2 "$LEASH" enqueue --file "$f"
    assert_eq "$name: stdout" "$(<"$T_OUT")" ""
    assert_contains "$name: names the line" "$(head -n1 "$T_ERR")" "$f line 7777:"
    assert_contains "$name: says nothing was enqueued" "$(head -n1 "$T_ERR")" "nothing was enqueued"
    assert_eq "$name: rows" "$(rows)" "$before"
  done <<'EOF'
invalid JSON|{"payload": {"i": 7777}
not an object|[{"payload": 1}]
missing payload|{"tenant_id": "acme"}
null payload|{"payload": null}
wrong type (tenant_id number)|{"payload": {}, "tenant_id": 5}
wrong type (shard_key object)|{"payload": {}, "shard_key": {"a": 1}}
wrong type (delay string)|{"payload": {}, "delay": "5"}
unknown field|{"payload": {}, "tenantid": "acme"}
bad run_after timestamp (server-side)|{"payload": {}, "run_after": "not a time"}
bad run_after date (server-side)|{"payload": {}, "run_after": "2030-02-30T00:00:00Z"}
delay and run_after both|{"payload": {}, "delay": 5, "run_after": "2030-01-01T00:00:00Z"}
max_attempts 0|{"payload": {}, "max_attempts": 0}
duplicate key|{"payload": {}, "payload": {}}
EOF
  ((n == 13)) || fail "ran $n bad-line variants"
  # The next id shows nothing was inserted and rolled back in between either.
  expect_exit 0 "$LEASH" enqueue '{"after":1}'
  assert_eq "rows at the end" "$(rows)" "$((before + 1))"
}

# ---------------------------------------------------------------- values

case_tenant_and_shard_values_round_trip_exactly() {
  need_pg
  migrated_db
  local values=(
    "it's \"quoted\""
    'back\slash \\ \n \N \. literal'
    $'tab\there'
    $'new\nline and \r return'
    '中文租户'
    '🚀 launch'
    '  spaces around  '
    '\N'
  )
  local v id lines=() f=$T_TMP/values.jsonl
  for v in "${values[@]}"; do
    # One task, by flags.
    expect_exit 0 "$LEASH" enqueue --tenant "$v" --shard "$v/shard" --batch "$v" "{\"s\": $(json_str "$v")}"
    id=$(<"$T_OUT")
    check_values "single $(printf '%q' "$v")" "$id" "$v"
    lines+=("{\"payload\": {\"s\": $(json_str "$v")}, \"tenant_id\": $(json_str "$v"), \"shard_key\": $(json_str "$v/shard"), \"batch\": $(json_str "$v")}")
  done

  # The same values from a file, as lines ...
  printf '%s\n' "${lines[@]}" >"$f"
  expect_exit 0 "$LEASH" enqueue --file "$f"
  assert_eq "count" "$(<"$T_OUT")" "${#values[@]}"
  local first=$((id + 1)) i
  for i in "${!values[@]}"; do
    check_values "file line $((i + 1))" "$((first + i))" "${values[i]}"
  done
  # ... and as the flags' defaults for a file.
  for v in "${values[@]}"; do
    printf '%s\n' "{\"payload\": {\"s\": $(json_str "$v")}}" >"$f"
    expect_exit 0 "$LEASH" enqueue --tenant "$v" --shard "$v/shard" --batch "$v" --file "$f"
    id=$(q 'select max(id) from agent_work_queue')
    check_values "file with flags $(printf '%q' "$v")" "$id" "$v"
  done

  # Raw tabs (JSON whitespace) and CR LF line ends around the same values.
  printf '{"payload":\t{"s": %s},\t"tenant_id":\t%s, "shard_key": %s, "batch": %s}\r\n' \
    "$(json_str "${values[2]}")" "$(json_str "${values[2]}")" "$(json_str "${values[2]}/shard")" \
    "$(json_str "${values[2]}")" >"$f"
  expect_exit 0 "$LEASH" enqueue --file "$f"
  check_values "line with raw tabs" "$(q 'select max(id) from agent_work_queue')" "${values[2]}"

  # JSON escapes decode to the same characters: \u4e2d\u6587 and a surrogate pair.
  printf '%s\n' '{"payload": {"s": "\u4e2d\u6587 \ud83d\ude80"}, "tenant_id": "\u4e2d\u6587 \ud83d\ude80", "shard_key": "\u4e2d\u6587 \ud83d\ude80/shard", "batch": "\u4e2d\u6587 \ud83d\ude80"}' >"$f"
  expect_exit 0 "$LEASH" enqueue --file "$f"
  check_values "escaped line" "$(q 'select max(id) from agent_work_queue')" '中文 🚀'
  expect_exit 0 "$LEASH" enqueue --tenant '中文 🚀' --shard '中文 🚀/shard' --batch '中文 🚀' \
    '{"s": "\u4e2d\u6587 \ud83d\ude80"}'
  check_values "escaped single" "$(<"$T_OUT")" '中文 🚀'
}

# check_values DESC ID V: row ID holds tenant V, shard V/shard, batch V, payload {"s": V}.
check_values() {
  local desc=$1 id=$2 v=$3
  assert_eq "$desc: tenant_id" "$(q "select tenant_id from agent_work_queue where id = $id")" "$v"
  assert_eq "$desc: shard_key" "$(q "select shard_key from agent_work_queue where id = $id")" "$v/shard"
  assert_eq "$desc: batch" "$(q "select batch from agent_work_queue where id = $id")" "$v"
  assert_eq "$desc: payload" "$(q "select payload->>'s' from agent_work_queue where id = $id")" "$v"
  assert_eq "$desc: bytes" \
    "$(q "select encode(convert_to(tenant_id, 'UTF8'), 'hex') || '|' || encode(convert_to(shard_key, 'UTF8'), 'hex')
              || '|' || encode(convert_to(payload->>'s', 'UTF8'), 'hex') from agent_work_queue where id = $id")" \
    "$(hex "$v")|$(hex "$v/shard")|$(hex "$v")"
}

case_big_integers_keep_precision() {
  need_pg
  migrated_db
  local big='{"n": 123456789012345678901234567890}'
  expect_exit 0 "$LEASH" enqueue "$big"
  assert_eq "single: payload text" "$(q 'select payload::text from agent_work_queue where id = 1')" "$big"
  assert_eq "single: the number" "$(q "select payload->>'n' from agent_work_queue where id = 1")" \
    123456789012345678901234567890
  assert_eq "single: exact numeric" \
    "$(q "select (payload->'n')::numeric = 123456789012345678901234567890 from agent_work_queue where id = 1")" t

  local more='{"d": 0.1000000000000000055511151231257827, "m": -98765432109876543210987654321, "z": 9007199254740993}'
  expect_exit 0 "$LEASH" enqueue "$more"
  assert_eq "single: more numbers" "$(q 'select payload::text from agent_work_queue where id = 2')" "$more"

  printf '%s\n' "{\"payload\": $big}" "{\"payload\": $more}" "{\"payload\": 123456789012345678901234567890}" \
    >"$T_TMP/big.jsonl"
  expect_exit 0 "$LEASH" enqueue --file "$T_TMP/big.jsonl"
  assert_eq "file: count" "$(<"$T_OUT")" 3
  assert_eq "file: payloads" "$(q 'select payload::text from agent_work_queue where id > 2 order by id')" \
    "$big"$'\n'"$more"$'\n'"123456789012345678901234567890"
}

case_delay_and_run_after_schedule_later() {
  need_pg
  migrated_db
  local d want id=0
  for d in 30:30.000 500ms:0.500 1.5:1.500 90s:90.000 5m:300.000 2h:7200.000 1d:86400.000; do
    want=${d#*:} d=${d%%:*}
    expect_exit 0 "$LEASH" enqueue --delay "$d" '{}'
    id=$(<"$T_OUT")
    assert_eq "--delay $d" "$(q "select extract(epoch from run_after - created_at)::numeric(12,3)
                                    from agent_work_queue where id = $id")" "$want"
  done
  expect_exit 0 "$LEASH" enqueue --run-after 2031-02-03T04:05:06Z '{}'
  assert_eq "--run-after (UTC)" \
    "$(q "select run_after = '2031-02-03 04:05:06+00' from agent_work_queue where id = $(<"$T_OUT")")" t
  expect_exit 0 "$LEASH" enqueue --run-after '2031-02-03 05:05:06.25+01' '{}'
  assert_eq "--run-after (an offset)" \
    "$(q "select run_after = '2031-02-03 04:05:06.25+00' from agent_work_queue where id = $(<"$T_OUT")")" t

  cat >"$T_TMP/later.jsonl" <<'EOF'
{"payload": {"k": "delay90"}, "delay": 90}
{"payload": {"k": "delay0.25"}, "delay": 0.25}
{"payload": {"k": "at"}, "run_after": "2031-02-03T04:05:06Z"}
{"payload": {"k": "at+02"}, "run_after": "2031-02-03T06:05:06+02:00"}
EOF
  expect_exit 0 "$LEASH" enqueue --file "$T_TMP/later.jsonl"
  assert_eq "file: delays" \
    "$(q "select payload->>'k', extract(epoch from run_after - created_at)::numeric(12,3) from agent_work_queue
           where payload ? 'k' and payload->>'k' like 'delay%' order by id")" \
    $'delay90|90.000\ndelay0.25|0.250'
  assert_eq "file: run_after" \
    "$(q "select count(*) from agent_work_queue where payload->>'k' in ('at', 'at+02')
            and run_after = '2031-02-03 04:05:06+00'")" 2

  assert_eq "every row is scheduled later" \
    "$(q "select count(*) from agent_work_queue where run_after <= created_at")" 0

  # status counts them as scheduled, not runnable (long delays only: no race with the clock).
  t_newdb status
  expect_exit 0 "$LEASH" migrate
  expect_exit 0 "$LEASH" enqueue --delay 1h '{}'
  expect_exit 0 "$LEASH" enqueue --delay 2d '{}'
  expect_exit 0 "$LEASH" enqueue --run-after 2031-02-03T04:05:06Z '{}'
  expect_exit 0 "$LEASH" enqueue --delay 0 '{}'
  printf '%s\n' '{"payload": 1, "delay": 90}' '{"payload": 2}' >"$T_TMP/mixed.jsonl"
  expect_exit 0 "$LEASH" enqueue --file "$T_TMP/mixed.jsonl"
  expect_exit 0 "$LEASH" status --json
  assert_contains "status sees the schedule" "$(<"$T_OUT")" \
    '"counts":{"pending":6,"leased":0,"done":0,"dead":0},"runnable":2,"scheduled":4,'
}

case_stdin_dash_reads_jsonl() {
  need_pg
  migrated_db
  printf '%s\n' '{"payload": {"n": 1}}' '' '{"payload": {"n": 2}, "tenant_id": "acme"}' \
    >"$T_TMP/in.jsonl"
  printf '{"payload": {"n": 3}}\r\n   \n{"payload": {"n": 4}}' >>"$T_TMP/in.jsonl"   # CRLF, no final newline
  expect_exit 0 "$LEASH" enqueue --file - <"$T_TMP/in.jsonl"
  assert_eq "count" "$(<"$T_OUT")" 4
  assert_eq "rows" "$(q "select payload->>'n', tenant_id from agent_work_queue order by id")" \
    $'1|default\n2|acme\n3|default\n4|default'

  # Through a pipe, with flags, and 10,000 lines.
  seq 1 10000 | awk '{ printf "{\"payload\":{\"i\":%d}}\n", $1 }' >"$T_TMP/10k.jsonl"
  # shellcheck disable=SC2016 # $1, $2 are for the inner bash
  expect_exit 0 bash -c 'cat "$1" | "$2" enqueue --tenant piped --file -' _ "$T_TMP/10k.jsonl" "$LEASH"
  assert_eq "piped count" "$(<"$T_OUT")" 10000
  assert_eq "piped rows" "$(q "select count(*), min((payload->>'i')::int), max((payload->>'i')::int)
                                 from agent_work_queue where tenant_id = 'piped'")" "10000|1|10000"

  # Empty input: nothing to do.
  expect_exit 0 "$LEASH" enqueue --file - </dev/null
  assert_eq "empty stdin" "$(<"$T_OUT")" 0
  printf '\n  \n\n' >"$T_TMP/blank.jsonl"
  expect_exit 0 "$LEASH" enqueue --file - <"$T_TMP/blank.jsonl"
  assert_eq "blank stdin" "$(<"$T_OUT")" 0

  # A bad line on stdin is named as such.
  printf '%s\n' '{"payload": 1}' '{"payload": 2, "oops": 1}' >"$T_TMP/bad.jsonl"
  expect_exit 2 "$LEASH" enqueue --file - <"$T_TMP/bad.jsonl"
  assert_contains "bad stdin line" "$(head -n1 "$T_ERR")" "stdin line 2:"
  assert_contains "names the field" "$(head -n1 "$T_ERR")" "oops"
  assert_eq "rows at the end" "$(rows)" 10004
}

# What the claim could not lease (an 8,000-byte shard key overflowed the one-lease-per-shard
# index and stopped every cycle), or what would never run or never die (max_attempts in the
# millions, run_after at infinity) is refused at enqueue, by flag and by line: one error
# naming the flag or the line and field, nothing enqueued.
case_out_of_bounds_values_are_refused_and_insert_nothing() {
  need_pg
  migrated_db
  local k512 k513 args
  k512=$(printf 'k%.0s' {1..512})
  k513=${k512}k
  # At the bounds: accepted.
  expect_exit 0 "$LEASH" enqueue --tenant "$k512" --shard "$k512" --batch "$k512" --max-attempts 1000 '{}'
  printf '{"payload":1,"tenant_id":"%s","shard_key":"%s","batch":"%s","max_attempts":1}\n' \
    "$k512" "$k512" "$k512" >"$T_TMP/ok.jsonl"
  expect_exit 0 "$LEASH" enqueue --file "$T_TMP/ok.jsonl"
  assert_eq "rows at the bounds" "$(rows)" 2
  # Flags past the bounds.
  local flags=(
    "--tenant $k513" "--shard $k513" "--batch $k513" "--batch ''" "--max-attempts 1001"
    "--max-attempts 2147483647" "--run-after infinity" "--run-after -infinity"
    "--run-after Infinity" "--run-after +INFINITY"
  )
  for args in "${flags[@]}"; do
    # shellcheck disable=SC2086 # word splitting wanted
    eval "expect_exit 2 \"\$LEASH\" enqueue $args '{}'"
    assert_eq "${args:0:40}: one error line and the hint" "$(wc -l <"$T_ERR")" 2
    assert_contains "${args:0:40}: names the flag" "$(head -n1 "$T_ERR")" "${args%% *}"
  done
  # Lines past the bounds, each after a good line: the file inserts nothing.
  local lines=(
    "{\"payload\":1,\"tenant_id\":\"$k513\"}|tenant_id"
    "{\"payload\":1,\"shard_key\":\"$k513\"}|shard_key"
    "{\"payload\":1,\"shard_key\":\"$(printf 'x%.0s' {1..8000})\"}|shard_key"
    "{\"payload\":1,\"batch\":\"$k513\"}|batch"
    '{"payload":1,"tenant_id":""}|tenant_id'
    '{"payload":1,"max_attempts":1001}|max_attempts'
    '{"payload":1,"max_attempts":2147483647}|max_attempts'
    '{"payload":1,"max_attempts":0}|max_attempts'
    '{"payload":1,"delay":1e20}|delay'
    '{"payload":1,"delay":-1}|delay'
    '{"payload":1,"run_after":"infinity"}|run_after'
    '{"payload":1,"run_after":" -Infinity "}|run_after'
  )
  local entry line field
  for entry in "${lines[@]}"; do
    line=${entry%|*}
    field=${entry##*|}
    printf '%s\n' '{"payload":0}' "$line" >"$T_TMP/bad.jsonl"
    expect_exit 2 "$LEASH" enqueue --file "$T_TMP/bad.jsonl"
    assert_eq "$field: one error line, no hint (a data error)" "$(wc -l <"$T_ERR")" 1
    assert_contains "$field: names the line" "$(head -n1 "$T_ERR")" "bad.jsonl line 2: "
    assert_contains "$field: names the field" "$(head -n1 "$T_ERR")" "\"$field\""
    assert_contains "$field: nothing" "$(head -n1 "$T_ERR")" "nothing was enqueued"
  done
  assert_eq "rows at the end" "$(rows)" 2
}

# A line longer than --max-line-bytes (default 4M) is refused with its number, and nothing
# is enqueued; the limit takes k/M/G units and bad sizes are usage errors.
case_long_line_is_refused_and_inserts_nothing() {
  need_pg
  migrated_db
  {
    echo '{"payload":1}'
    python3 -c 'import sys; sys.stdout.write("{\"payload\":\"" + "x" * (5 << 20) + "\"}\n")'
    echo '{"payload":3}'
  } >"$T_TMP/long.jsonl"
  expect_exit 2 "$LEASH" enqueue --file "$T_TMP/long.jsonl"
  assert_eq "error" "$(head -n1 "$T_ERR")" \
    "leash enqueue: $T_TMP/long.jsonl line 2: longer than 4194304 bytes (--max-line-bytes); nothing was enqueued"
  assert_eq "rows" "$(rows)" 0
  expect_exit 2 "$LEASH" enqueue --max-line-bytes 1k --file - <"$T_TMP/long.jsonl"
  assert_contains "stdin, 1k" "$(head -n1 "$T_ERR")" "stdin line 2: longer than 1024 bytes"
  # The limit counts the line without its newline: 14 bytes fit in 14.
  printf '%s\n' '{"payload":12}' '{"payload":1}' >"$T_TMP/exact.jsonl"
  expect_exit 0 "$LEASH" enqueue --max-line-bytes 14 --file "$T_TMP/exact.jsonl"
  expect_exit 2 "$LEASH" enqueue --max-line-bytes 13 --file "$T_TMP/exact.jsonl"
  assert_contains "one over" "$(head -n1 "$T_ERR")" "line 1: longer than 13 bytes"
  expect_exit 0 "$LEASH" enqueue --max-line-bytes 6M --file "$T_TMP/long.jsonl"
  assert_eq "with 6M" "$(<"$T_OUT")" 3
  local bad
  for bad in 0 1 x 4X -1 2G 99999999999999999999 1.5M ''; do
    expect_exit 2 "$LEASH" enqueue --max-line-bytes "$bad" --file "$T_TMP/exact.jsonl"
    assert_contains "size $bad" "$(head -n1 "$T_ERR")" "--max-line-bytes must be a size"
  done
  assert_eq "rows at the end" "$(rows)" 5
}

# A read error is an error, never a short file: exit 1 and nothing enqueued, whether the
# source is a directory (EISDIR), or a line too big for the memory left (ENOMEM, under
# ulimit -v; it printed a prefix count before).
case_read_error_is_an_error_and_inserts_nothing() {
  need_pg
  migrated_db
  mkdir "$T_TMP/dir"
  expect_exit 1 "$LEASH" enqueue --file "$T_TMP/dir"
  assert_eq "directory" "$(<"$T_ERR")" \
    "leash enqueue: cannot read $T_TMP/dir at line 1: Is a directory; nothing was enqueued"
  assert_eq "stdout" "$(<"$T_OUT")" ""
  if grep -qaE "__(a|t)san_init" "$LEASH" || [[ ${LEASH_VALGRIND:-0} == 1 ]]; then
    echo "# skipping the ulimit -v part under a sanitizer" >&2
  else
    # 400 MB in one line through a pipe, with 300 MB of address space: the line cannot be
    # held, and the good lines before and after it must not be enqueued either.
    expect_exit 1 bash -c 'ulimit -v 300000
      { echo "{\"payload\":1}"; head -c 400000000 /dev/zero | tr "\0" x; echo; echo "{\"payload\":3}"; } |
        "$0" enqueue --max-line-bytes 1G --file -' "$LEASH"
    assert_eq "out of memory" "$(head -n1 "$T_ERR")" \
      "leash enqueue: cannot read stdin at line 2: Cannot allocate memory; nothing was enqueued"
    assert_eq "stdout" "$(<"$T_OUT")" ""
  fi
  assert_eq "rows" "$(rows)" 0
}

# Bad data (a line of the file, the payload, a file that cannot be opened, a value the server
# refuses) is one stderr line with exit 2 and nothing enqueued: no "Try 'leash enqueue
# --help'." (--help would not fix the data). A bad flag keeps the hint (the usage cases).
case_data_errors_print_one_line_and_no_hint() {
  need_pg
  migrated_db
  printf '%s\n' '{"payload":0}' 'not json' >"$T_TMP/notjson.jsonl"
  printf '%s\n' '{"payload":0}' '{"payload":1,"colour":"red"}' >"$T_TMP/unknown.jsonl"
  printf '%s\n' '{"payload":0}' '{"tenant_id":"t"}' >"$T_TMP/nopayload.jsonl"
  printf '%s\n' '{"payload":0}' '{"payload":1,"run_after":"not a time"}' >"$T_TMP/badtime.jsonl"
  printf '%s\n' '{"payload":0}' '{"payload":1,"run_after":"2026-13-45"}' >"$T_TMP/badday.jsonl"
  printf '%s\n' '{"payload":1}' '{"payload":2}' >"$T_TMP/long.jsonl"
  local -a cases=(
    "--file $T_TMP/notjson.jsonl|notjson.jsonl line 2: "
    "--file $T_TMP/unknown.jsonl|unknown.jsonl line 2: "
    "--file $T_TMP/nopayload.jsonl|nopayload.jsonl line 2: "
    "--file $T_TMP/badtime.jsonl|badtime.jsonl line 2: "
    "--file $T_TMP/badday.jsonl|badday.jsonl line 2: "
    "--max-line-bytes 10 --file $T_TMP/long.jsonl|long.jsonl line 1: longer than 10 bytes"
    "--file $T_TMP/missing.jsonl|cannot open $T_TMP/missing.jsonl"
    "{not-json|PAYLOAD_JSON is not valid JSON"
    "null|PAYLOAD_JSON must not be null"
  )
  local entry args want
  for entry in "${cases[@]}"; do
    args=${entry%%|*}
    want=${entry#*|}
    # shellcheck disable=SC2086 # word splitting wanted
    expect_exit 2 "$LEASH" enqueue $args
    assert_eq "$args: one line" "$(wc -l <"$T_ERR" | tr -d ' ')" 1
    assert_contains "$args: names it" "$(<"$T_ERR")" "$want"
    assert_not_contains "$args: no hint" "$(<"$T_ERR")" "Try 'leash"
    assert_eq "$args: stdout" "$(<"$T_OUT")" ""
  done
  # A bad line on stdin too.
  expect_exit 2 "$LEASH" enqueue --file - <"$T_TMP/notjson.jsonl"
  assert_eq "stdin: one line" "$(wc -l <"$T_ERR" | tr -d ' ')" 1
  assert_eq "rows" "$(rows)" 0
}

t_run "$@"
