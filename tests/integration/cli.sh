#!/usr/bin/env bash
# The command line as a whole: options, exit codes, error lines, the connection, migrate,
# --table quoting and status --json. Enqueue's own behaviour is in enqueue.sh.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"

# An address where nothing listens, with a password that must never be printed.
SECRET=s3cretPass
DEAD_URL="postgresql://leash:$SECRET@127.0.0.1:1/x"

# The seed DDL of SPEC.md, verbatim.
SEED_DDL="CREATE TABLE agent_work_queue (
  id            bigserial PRIMARY KEY,
  tenant_id     text NOT NULL,
  shard_key     text NOT NULL,
  payload       jsonb NOT NULL,
  status        text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending','leased','done','dead')),
  run_after     timestamptz NOT NULL DEFAULT now(),
  locked_until  timestamptz,
  lease_owner   text,
  attempts      int NOT NULL DEFAULT 0,
  max_attempts  int NOT NULL DEFAULT 8,
  last_error    text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX agent_work_queue_claim_idx
  ON agent_work_queue (run_after, id) WHERE status = 'pending';"

# qv NAME=VALUE... SQL: like q, with psql variables (:'NAME' a literal, :"NAME" an identifier).
qv() {
  local args=()
  while (($# > 1)); do args+=(-v "$1"); shift; done
  printf '%s\n' "$1" | psql -X -A -t -q -v ON_ERROR_STOP=1 "${args[@]}" -d "$DATABASE_URL" -f -
}

# The migrations leash carries: one per sql/NNN_*.sql file.
n_migrations() {
  compgen -G "$LEASH_SRC/sql/[0-9]*.sql" | wc -l | tr -d ' '
}

# pg_dump's schema, less the \restrict/\unrestrict lines newer pg_dump versions add with a
# random key in every dump.
schema_dump() {
  pg_dump --schema-only --no-owner --no-privileges -d "$DATABASE_URL" \
    | grep -v -E '^\\(un)?restrict '
}

# lines_of FILE: the number of lines in FILE.
lines_of() { wc -l <"$1" | tr -d ' '; }

# ---------------------------------------------------------------- usage errors

case_unknown_option_exits_2_with_usage() {
  # An unreachable database: a command that got past its option parsing would exit 1.
  export DATABASE_URL=$DEAD_URL
  expect_exit 2 "$LEASH" --bogus migrate
  assert_eq "stdout of a usage error" "$(<"$T_OUT")" ""
  assert_eq "stderr lines" "$(lines_of "$T_ERR")" 2
  assert_contains "names the option" "$(head -n1 "$T_ERR")" "--bogus"
  assert_eq "hint" "$(sed -n 2p "$T_ERR")" "Try 'leash --help'."

  local cmd
  for cmd in migrate enqueue status; do
    expect_exit 2 "$LEASH" "$cmd" --bogus
    assert_eq "$cmd: stdout" "$(<"$T_OUT")" ""
    assert_eq "$cmd: stderr lines" "$(lines_of "$T_ERR")" 2
    assert_contains "$cmd: first line" "$(head -n1 "$T_ERR")" "leash $cmd: "
    assert_contains "$cmd: names the option" "$(head -n1 "$T_ERR")" "--bogus"
    assert_eq "$cmd: hint" "$(sed -n 2p "$T_ERR")" "Try 'leash $cmd --help'."
  done

  # A known option without its value, a bad value, an unexpected argument.
  expect_exit 2 "$LEASH" enqueue '{}' --tenant
  assert_contains "missing value" "$(<"$T_ERR")" "Try 'leash enqueue --help'."
  expect_exit 2 "$LEASH" --log-format xml status
  assert_contains "bad --log-format" "$(<"$T_ERR")" "xml"
  expect_exit 2 "$LEASH" --log-level loud status
  assert_contains "bad --log-level" "$(<"$T_ERR")" "loud"
  expect_exit 2 "$LEASH" status extra
  assert_contains "unexpected argument" "$(<"$T_ERR")" "extra"
  expect_exit 2 "$LEASH" migrate extra
  assert_contains "unexpected argument" "$(<"$T_ERR")" "extra"
  expect_exit 2 "$LEASH" enqueue
  assert_contains "missing payload" "$(<"$T_ERR")" "PAYLOAD_JSON"
  expect_exit 2 "$LEASH" enqueue '{}' '{}'
  assert_contains "two payloads" "$(<"$T_ERR")" "Try 'leash enqueue --help'."
  # Global options are accepted after the command too.
  expect_exit 2 "$LEASH" status --log-format xml
  assert_contains "global option after the command" "$(<"$T_ERR")" "xml"
}

case_unknown_command_exits_2() {
  export DATABASE_URL=$DEAD_URL
  expect_exit 2 "$LEASH" frobnicate
  assert_eq "stdout" "$(<"$T_OUT")" ""
  assert_eq "stderr" "$(<"$T_ERR")" "leash: unknown command 'frobnicate'"$'\n'"Try 'leash --help'."
  # Global options before it change nothing.
  expect_exit 2 "$LEASH" --table x --log-level debug frobnicate --help
  assert_contains "after global options" "$(<"$T_ERR")" "unknown command 'frobnicate'"
  # Commands are matched exactly.
  expect_exit 2 "$LEASH" Migrate
  assert_contains "case matters" "$(<"$T_ERR")" "unknown command 'Migrate'"
  expect_exit 2 "$LEASH" migr
  assert_contains "no prefixes" "$(<"$T_ERR")" "unknown command 'migr'"
  # No command at all is a usage error too.
  expect_exit 2 "$LEASH"
  expect_exit 2 "$LEASH" --table x
}

case_help_and_version_on_every_command() {
  # Neither needs a database: with an unreachable one they still succeed.
  export DATABASE_URL=$DEAD_URL
  local cmd flag version
  expect_exit 0 "$LEASH" --version
  version=$(<"$T_OUT")
  # First line: the version; second: the libraries linked, as they report themselves.
  [[ $(head -n 1 <<<"$version") =~ ^leash\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "version line: $version"
  [[ $(sed -n 2p <<<"$version") =~ ^libpq\ [0-9.]+,\ Lua\ 5\.4\.[0-9]+,\ jansson\ [0-9.]+,\ libcurl\ [0-9.]+,\ libmicrohttpd\ [0-9.]+$ ]] \
    || fail "libraries line: $version"
  (($(wc -l <<<"$version") == 2)) || fail "two lines: $version"

  for flag in --help -h; do
    expect_exit 0 "$LEASH" "$flag"
    assert_contains "leash $flag" "$(<"$T_OUT")" "usage: leash"
    assert_eq "leash $flag: stderr" "$(<"$T_ERR")" ""
    for cmd in migrate enqueue status; do
      assert_contains "leash $flag lists $cmd" "$(<"$T_OUT")" "  $cmd "
    done
  done

  declare -A own=([migrate]="usage: leash migrate" [enqueue]="--max-attempts" [status]="--json")
  for cmd in migrate enqueue status; do
    for flag in --help -h; do
      expect_exit 0 "$LEASH" "$cmd" "$flag"
      assert_contains "leash $cmd $flag" "$(<"$T_OUT")" "usage: leash $cmd"
      assert_contains "leash $cmd $flag: own options" "$(<"$T_OUT")" "${own[$cmd]}"
      assert_contains "leash $cmd $flag: global options" "$(<"$T_OUT")" "--table NAME"
      assert_eq "leash $cmd $flag: stderr" "$(<"$T_ERR")" ""
    done
    expect_exit 0 "$LEASH" "$cmd" --version
    assert_eq "leash $cmd --version" "$(<"$T_OUT")" "$version"
    assert_eq "leash $cmd --version: stderr" "$(<"$T_ERR")" ""
    # With other options around, and before arguments that would otherwise be wrong.
    expect_exit 0 "$LEASH" --table x "$cmd" --log-level debug --help
    assert_contains "leash $cmd --help after options" "$(<"$T_OUT")" "usage: leash $cmd"
  done
  expect_exit 0 "$LEASH" enqueue --tenant t --help
  assert_contains "enqueue --help without a payload" "$(<"$T_OUT")" "usage: leash enqueue"
}

# ---------------------------------------------------------------- the connection

# check_unreachable CMD...: exit 1, one line "leash CMD: cannot connect to PostgreSQL: ...",
# and no trace of the password anywhere.
check_unreachable() {
  local cmd=$1
  expect_exit 1 "$LEASH" "$@"
  local out err
  out=$(<"$T_OUT") err=$(<"$T_ERR")
  assert_not_contains "$* stdout: password" "$out" "$SECRET"
  assert_not_contains "$* stderr: password" "$err" "$SECRET"
  assert_not_contains "$* stderr: password (prefix)" "$err" "s3cret"
  assert_eq "$* stdout" "$out" ""
  assert_eq "$* stderr lines" "$(lines_of "$T_ERR")" 1
  [[ $err == "leash $cmd: cannot connect to PostgreSQL: "?* ]] || fail "$* stderr: $err"
}

case_unreachable_database_exits_1_without_password() {
  need_pg
  t_newdb
  local good=$DATABASE_URL cmd
  local -A cmd_args=([migrate]="" [enqueue]='{"a":1}' [status]="--json")

  for cmd in migrate enqueue status; do
    # --db, even while $DATABASE_URL points at a working database: --db wins.
    DATABASE_URL=$good check_unreachable "$cmd" --db "$DEAD_URL" ${cmd_args[$cmd]:+"${cmd_args[$cmd]}"}
    DATABASE_URL=$good check_unreachable "$cmd" --log-format json --db "$DEAD_URL" \
      ${cmd_args[$cmd]:+"${cmd_args[$cmd]}"}
    # $DATABASE_URL, even while PG* points at the working server: it wins over PG*.
    DATABASE_URL=$DEAD_URL check_unreachable "$cmd" ${cmd_args[$cmd]:+"${cmd_args[$cmd]}"}
    # key=value form.
    DATABASE_URL="host=127.0.0.1 port=1 user=leash password=$SECRET dbname=x" \
      check_unreachable "$cmd" ${cmd_args[$cmd]:+"${cmd_args[$cmd]}"}
  done

  # Strings libpq cannot even parse: its message quotes the URI, or the token it could not
  # decode, and that text holds the password.
  local bad
  for bad in "postgresql://leash:$SECRET@[::1/x" \
             "postgresql://leash:$SECRET@[]/x" \
             "postgres://leash:${SECRET}%zz@127.0.0.1:1/x" \
             "postgresql://127.0.0.1:1/x?password=${SECRET}%zz" \
             "postgresql://leash:$SECRET@127.0.0.1:99999/x" \
             "host=127.0.0.1 port=1 password='$SECRET"; do
    check_unreachable status --db "$bad"
    DATABASE_URL=$bad check_unreachable migrate
  done

  # The working database through each route: --db, $DATABASE_URL, and PG* alone.
  DATABASE_URL=$DEAD_URL expect_exit 0 "$LEASH" --db "$good" migrate
  expect_exit 0 "$LEASH" status
  (
    unset DATABASE_URL
    export PGDATABASE=$TDB
    expect_exit 0 "$LEASH" enqueue '{"via":"PG*"}'
  )
  assert_eq "row enqueued through PG* settings" "$(q "select payload->>'via' from agent_work_queue")" "PG*"
}

# ---------------------------------------------------------------- migrate

case_migrate_twice_is_a_no_op() {
  need_pg
  t_newdb
  local n
  n=$(n_migrations)
  expect_exit 0 "$LEASH" migrate
  assert_eq "first run" "$(<"$T_OUT")" "agent_work_queue: $n migrations applied"
  local before history
  before=$(schema_dump)
  history=$(q 'select version, name, applied_at from agent_work_queue_migrations order by version')
  assert_eq "history rows" "$(q 'select count(*) from agent_work_queue_migrations')" "$n"
  [[ $before == *"CREATE TABLE public.agent_work_queue "* ]] || fail "no queue table in the dump"

  # A row must survive too.
  expect_exit 0 "$LEASH" enqueue '{"keep":1}'
  expect_exit 0 "$LEASH" migrate
  assert_eq "second run" "$(<"$T_OUT")" "agent_work_queue: 0 migrations applied"
  expect_exit 0 "$LEASH" --table agent_work_queue migrate
  assert_eq "third run" "$(<"$T_OUT")" "agent_work_queue: 0 migrations applied"
  assert_eq "schema after the second run" "$(schema_dump)" "$before"
  assert_eq "history after the second run" \
    "$(q 'select version, name, applied_at from agent_work_queue_migrations order by version')" \
    "$history"
  assert_eq "row kept" "$(q "select payload::text from agent_work_queue")" '{"keep": 1}'
}

# After migrate, the table's functions are the current protocol's and nothing else: 004's
# first cycle (it called <table>_claim and <table>_settle, which no migration creates) and
# every superseded signature are gone, so no function is left that fails when called.
case_migrate_leaves_only_the_current_functions() {
  need_pg
  t_newdb
  expect_exit 0 "$LEASH" migrate
  local fns
  fns=$(q "select p.proname || '/' || count(*) over (partition by p.proname)
             from pg_proc p join pg_namespace n on n.oid = p.pronamespace
            where n.nspname = 'public' and p.proname like 'agent_work_queue%'
            order by 1")
  # 011 brought the claim and the settle back as functions the cycle calls (plpgsql keeps
  # their plans per session, unlike 004's SQL functions): one of each, no older overloads.
  assert_contains "one claim" "$fns" $'agent_work_queue_claim/1\n'
  assert_contains "one settle" "$fns" $'\nagent_work_queue_settle/1'
  assert_contains "one cycle" "$fns" $'agent_work_queue_cycle/1\n'
  assert_contains "one reap" "$fns" $'agent_work_queue_reap/1\n'
  assert_contains "one release" "$fns" $'agent_work_queue_release/1\n'
  # The cycle left is the one queue.c calls (it runs, settling nothing and claiming nothing).
  assert_eq "cycle runs" "$(q "select count(*) from agent_work_queue_cycle('o', '{}', '{}', '{}',
      '{}', '{}', '{}', '{}', '{}', '{}', 0, 30, NULL, NULL, NULL, 0)")" 0
}

case_migrate_from_three_processes_at_once() {
  need_pg
  local n round i rc sum single
  n=$(n_migrations)
  # The schema of one plain run, to compare with.
  t_newdb single
  expect_exit 0 "$LEASH" migrate
  single=$(schema_dump)

  for round in 1 2 3; do
    t_newdb "r$round"
    # Three processes start together: each says it is ready, then blocks opening a FIFO
    # until the gate opens.
    local gate=$T_TMP/gate.$round pids=()
    mkfifo "$gate"
    for i in 1 2 3; do
      (
        : >"$T_TMP/ready.$round.$i"
        exec <"$gate"
        exec "$LEASH" migrate
      ) >"$T_TMP/m.$round.$i.out" 2>"$T_TMP/m.$round.$i.err" &
      pids+=($!)
    done
    t_on_exit t_kill "${pids[@]}"
    wait_for "three migrates at the gate" 10 \
      test -e "$T_TMP/ready.$round.1" -a -e "$T_TMP/ready.$round.2" -a -e "$T_TMP/ready.$round.3"
    local gatefd
    exec {gatefd}<>"$gate"   # read-write: never blocks, and lets every reader through
    sum=0
    for i in 1 2 3; do
      rc=0
      wait "${pids[i - 1]}" || rc=$?
      ((rc == 0)) || fail "round $round: migrate $i exited $rc: $(cat "$T_TMP/m.$round.$i.err")"
      local out
      out=$(<"$T_TMP/m.$round.$i.out")
      [[ $out =~ ^agent_work_queue:\ ([0-9]+)\ migrations?\ applied$ ]] \
        || fail "round $round: migrate $i printed: $out"
      sum=$((sum + BASH_REMATCH[1]))
    done
    exec {gatefd}>&-
    assert_eq "round $round: migrations applied by the three together" "$sum" "$n"
    assert_eq "round $round: schema equals a single run's" "$(schema_dump)" "$single"
    assert_eq "round $round: history versions" \
      "$(q 'select string_agg(version::text, $$,$$ order by version) from agent_work_queue_migrations')" \
      "$(seq -s, 1 "$n")"
    assert_eq "round $round: versions recorded twice" \
      "$(q 'select count(*) from (select version from agent_work_queue_migrations
                                 group by version having count(*) > 1) d')" 0
  done
}

# A snapshot of every seed column, in id order.
seed_rows() {
  q "select id, tenant_id, shard_key, payload::text, status, run_after, locked_until,
            lease_owner, attempts, max_attempts, last_error, created_at, updated_at
       from agent_work_queue order by id"
}

case_seed_table_is_adopted_with_rows_and_ids() {
  need_pg
  t_newdb
  q "$SEED_DDL"
  # Rows by plain SQL: generated ids with a gap, explicit ids, every status, a live lease.
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values
       ('acme', 's1', '{\"a\": 1}'),
       ('acme', 's2', '{\"gone\": true}'),
       ('beta', 's1', '{\"big\": 123456789012345678901234567890, \"s\": \"中文 🚀\", \"f\": 1.50}');
     delete from agent_work_queue where id = 2;
     insert into agent_work_queue (id, tenant_id, shard_key, payload, status, run_after,
                                   attempts, max_attempts, last_error)
       values (10, 'acme', 's3', '[1, null, \"x\"]', 'done', '2020-01-01 00:00:00+00', 1, 8, null),
              (42, 'beta', 's9', '\"just a string\"', 'dead', '2021-06-01 12:00:00+00', 3, 3, 'boom');
     insert into agent_work_queue (id, tenant_id, shard_key, payload, status, locked_until,
                                   lease_owner, attempts)
       values (1000, 'acme', 's4', '{}', 'leased', now() + interval '1 hour', 'w1', 1);
     select setval(pg_get_serial_sequence('agent_work_queue', 'id'), 1000);" >/dev/null
  local before
  before=$(seed_rows)
  assert_eq "ids before" "$(q 'select string_agg(id::text, $$,$$ order by id) from agent_work_queue')" \
    "1,3,10,42,1000"

  # Not migrated yet: refused.
  expect_exit 1 "$LEASH" enqueue '{}'
  assert_contains "refused before migrate" "$(<"$T_ERR")" "run 'leash migrate' first"

  expect_exit 0 "$LEASH" migrate
  assert_eq "migrate" "$(<"$T_OUT")" "agent_work_queue: $(n_migrations) migrations applied"
  assert_eq "rows, ids and payloads after migrate" "$(seed_rows)" "$before"
  assert_eq "big number" "$(q "select payload->>'big' from agent_work_queue where id = 3")" \
    123456789012345678901234567890
  assert_eq "claim index not duplicated" \
    "$(q "select count(*) from pg_indexes where tablename = 'agent_work_queue'
            and indexdef like '%(run_after, id) WHERE%'")" 1

  # The adopted table works: the next id follows the sequence, status sees every row.
  expect_exit 0 "$LEASH" enqueue '{"new": 1}'
  assert_eq "next id" "$(<"$T_OUT")" 1001
  expect_exit 0 "$LEASH" migrate
  assert_eq "second migrate" "$(<"$T_OUT")" "agent_work_queue: 0 migrations applied"
  assert_eq "old rows after enqueue and a second migrate" \
    "$(seed_rows | grep -v '^1001|')" "$before"
  expect_exit 0 "$LEASH" status --json
  assert_contains "status counts" "$(<"$T_OUT")" \
    '"counts":{"pending":3,"leased":1,"done":1,"dead":1}'
  assert_contains "status lease" "$(<"$T_OUT")" '"leases_by_worker":{"w1":1}'
}

# ---------------------------------------------------------------- --table

case_schema_qualified_table_works() {
  need_pg
  t_newdb
  # The schema must exist: migrate says so instead of creating the table elsewhere.
  expect_exit 1 "$LEASH" --table myschema.q migrate
  assert_eq "stderr lines" "$(lines_of "$T_ERR")" 1
  assert_contains "missing schema" "$(<"$T_ERR")" "myschema"
  assert_eq "nothing created" "$(q "select count(*) from pg_class where relnamespace = 'public'::regnamespace")" 0

  q 'create schema myschema'
  expect_exit 0 "$LEASH" --table myschema.q migrate
  assert_eq "migrate" "$(<"$T_OUT")" "myschema.q: $(n_migrations) migrations applied"
  assert_eq "table in myschema" "$(q "select to_regclass('myschema.q') is not null")" t
  assert_eq "history in myschema" "$(q "select to_regclass('myschema.q_migrations') is not null")" t
  assert_eq "nothing in public" \
    "$(q "select count(*) from pg_class where relnamespace = 'public'::regnamespace")" 0

  expect_exit 0 "$LEASH" --table myschema.q enqueue --tenant acme '{"in":"myschema"}'
  local id
  id=$(<"$T_OUT")
  assert_eq "row in myschema.q" "$(q "select tenant_id, shard_key, payload->>'in' from myschema.q")" \
    "acme|task:$id|myschema"
  # --table after the command works the same.
  expect_exit 0 "$LEASH" enqueue --table myschema.q '{"n":2}'
  expect_exit 0 "$LEASH" status --table myschema.q --json
  assert_contains "status table" "$(<"$T_OUT")" '"table":"myschema.q"'
  assert_contains "status counts" "$(<"$T_OUT")" '"counts":{"pending":2,"leased":0,"done":0,"dead":0}'
  expect_exit 0 "$LEASH" --table myschema.q status
  assert_contains "text status" "$(<"$T_OUT")" "pending  2"

  # The unqualified name is another, unmigrated table.
  expect_exit 1 "$LEASH" --table q status
  assert_contains "public.q refused" "$(<"$T_ERR")" "run 'leash migrate' first"
  expect_exit 2 "$LEASH" --table myschema. status
  expect_exit 2 "$LEASH" --table .q status
}

case_hostile_table_name_drops_nothing() {
  need_pg
  t_newdb
  q 'create table t (x int); insert into t values (7)'
  local name
  for name in 'q; DROP TABLE t' 'x"; DROP TABLE t; --' "t' ; DROP TABLE t; --"; do
    expect_exit 0 "$LEASH" --table "$name" migrate
    assert_eq "migrate $name" "$(<"$T_OUT")" "$name: $(n_migrations) migrations applied"
    assert_eq "t after migrate of $name" "$(q 'select x from t')" 7
    assert_eq "the oddly named table exists" \
      "$(qv "n=$name" "select to_regclass(quote_ident(:'n')) is not null")" t
    assert_eq "its history exists" \
      "$(qv "n=${name}_migrations" "select to_regclass(quote_ident(:'n')) is not null")" t

    expect_exit 0 "$LEASH" --table "$name" enqueue --tenant "$name" '{"a":1}'
    assert_eq "row in the oddly named table" \
      "$(qv "n=$name" "select tenant_id from :\"n\"")" "$name"
    printf '%s\n' '{"payload":2}' '{"payload":3}' >"$T_TMP/lines.jsonl"
    expect_exit 0 "$LEASH" --table "$name" enqueue --file "$T_TMP/lines.jsonl"
    assert_eq "bulk enqueue" "$(<"$T_OUT")" 2
    expect_exit 0 "$LEASH" --table "$name" status --json
    assert_contains "status" "$(<"$T_OUT")" '"counts":{"pending":3,'
    expect_exit 0 "$LEASH" --table "$name" status
    expect_exit 0 "$LEASH" --table "$name" migrate
    assert_eq "t after everything on $name" "$(q 'select x from t')" 7
  done
  assert_eq "tables in public" \
    "$(q "select count(*) from pg_tables where schemaname = 'public' and tablename in ('t', 'q')")" 1
}

# Names that could leave their token in the migrations' SQL (a newline ends a "--" comment,
# '$' a dollar-quoted body, '*/' a block comment) are refused by every command at option
# parsing, before any connection: one error line (plus the usage hint), exit 2, nothing run.
case_hostile_table_names_are_refused_by_every_command() {
  need_pg
  t_newdb
  q 'create table victim (x int); insert into victim values (7)'
  local long schema41 names=() name cmd
  long=$(printf 'a%.0s' {1..64})
  schema41=$(printf 's%.0s' {1..64}).q
  names=(
    $'x\nDROP TABLE IF EXISTS victim;--'
    $'x\rDROP TABLE IF EXISTS victim;--'
    $'x\tDROP TABLE IF EXISTS victim'
    $'x\x01y' $'x\x1fy' $'x\x7fy' $'x\x1b[31mred'
    'x*/ DROP TABLE IF EXISTS victim; /*'
    'x/* y'
    'x$$; DROP TABLE IF EXISTS victim; $$'
    'x$body$ y'
    '$1'
    $'public.x\nDROP TABLE IF EXISTS victim;--'
    $'pub\nlic.x'
    'public.x$$y'
    'a.b.c'
    "$long"
    "$schema41"
    ''
    '.x'
    'x.'
  )
  for name in "${names[@]}"; do
    for cmd in migrate "enqueue {}" status "inspect 1" "requeue --dead" report "prune --older-than 1d" \
               "run $LEASH_SRC/tests/fixtures/api/check_good.lua --until-empty"; do
      # shellcheck disable=SC2086
      expect_exit 2 "$LEASH" --table "$name" $cmd
      assert_eq "stderr lines for $cmd on $(printf %q "$name")" "$(lines_of "$T_ERR")" 2
      assert_contains "says --table" "$(head -n1 "$T_ERR")" "leash: --table: "
      assert_not_contains "no raw name echoed" "$(<"$T_ERR")" "DROP TABLE"
    done
    assert_eq "victim after $(printf %q "$name")" "$(q 'select x from victim')" 7
  done
  # The option after the command is checked the same way, before it connects.
  for cmd in migrate status report; do
    expect_exit 2 "$LEASH" $cmd --table $'x\nDROP TABLE IF EXISTS victim;--'
    assert_contains "after $cmd" "$(head -n1 "$T_ERR")" "leash $cmd: --table: the name has a control"
  done
  assert_eq "tables in public" "$(q "select string_agg(tablename, ',') from pg_tables where schemaname = 'public'")" victim
}

case_unmigrated_table_is_refused() {
  need_pg
  t_newdb
  local cmd
  for cmd in "enqueue {}" "status" "status --json"; do
    # shellcheck disable=SC2086 # word splitting wanted
    expect_exit 1 "$LEASH" $cmd
    assert_eq "$cmd: stdout" "$(<"$T_OUT")" ""
    assert_eq "$cmd: stderr lines" "$(lines_of "$T_ERR")" 1
    assert_contains "$cmd: the fix" "$(<"$T_ERR")" "run 'leash migrate' first"
    assert_contains "$cmd: the table" "$(<"$T_ERR")" "agent_work_queue"
  done
  printf '%s\n' '{"payload":1}' >"$T_TMP/one.jsonl"
  expect_exit 1 "$LEASH" enqueue --file "$T_TMP/one.jsonl"
  assert_contains "enqueue --file" "$(<"$T_ERR")" "run 'leash migrate' first"
  assert_eq "nothing created" "$(q "select count(*) from pg_class where relnamespace = 'public'::regnamespace")" 0

  # A table made with the seed DDL but never migrated is refused too, and left alone.
  q "$SEED_DDL"
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('a', 'b', '{}')"
  expect_exit 1 "$LEASH" enqueue '{}'
  assert_contains "seed table, enqueue" "$(<"$T_ERR")" "run 'leash migrate' first"
  expect_exit 1 "$LEASH" status
  assert_contains "seed table, status" "$(<"$T_ERR")" "run 'leash migrate' first"
  assert_eq "rows of the seed table" "$(q 'select count(*) from agent_work_queue')" 1
  assert_eq "no history table made" "$(q "select to_regclass('agent_work_queue_migrations') is null")" t

  # Another table than the migrated one is refused.
  expect_exit 0 "$LEASH" migrate
  expect_exit 0 "$LEASH" enqueue '{}'
  expect_exit 1 "$LEASH" --table other enqueue '{}'
  assert_contains "other table" "$(<"$T_ERR")" "run 'leash migrate' first"
}

# ---------------------------------------------------------------- status

# status_json ARGS...: prints leash status --json ARGS with the age replaced by AGE, and
# checks the age is in [lo, hi) when lo/hi are set, or null when AGE_NULL=1.
status_json() {
  expect_exit 0 "$LEASH" status --json "$@"
  assert_eq "status --json $*: stderr" "$(<"$T_ERR")" ""
  assert_eq "status --json $*: one line" "$(lines_of "$T_OUT")" 1
  local out age
  out=$(<"$T_OUT")
  [[ $out =~ \"oldest_runnable_age_s\":([^,}]+) ]] || fail "no oldest_runnable_age_s in: $out"
  age=${BASH_REMATCH[1]}
  if [[ $age != null ]]; then
    awk -v a="$age" 'BEGIN { exit !(a + 0 >= 100 && a + 0 < 200) }' \
      || fail "status --json $*: oldest_runnable_age_s $age, want 100 <= age < 200"
    age=AGE
  fi
  printf '%s\n' "${out/\"oldest_runnable_age_s\":${BASH_REMATCH[1]}/\"oldest_runnable_age_s\":$age}"
}

# check_status DESC WANT ARGS...: status_json ARGS must print WANT.
check_status() {
  local desc=$1 want=$2 got
  shift 2
  got=$(status_json "$@")
  assert_eq "$desc" "$got" "$want"
}

case_status_json_is_stable() {
  need_pg
  t_newdb
  expect_exit 0 "$LEASH" migrate
  expect_exit 0 "$LEASH" status --json
  assert_eq "empty queue" "$(<"$T_OUT")" \
    '{"table":"agent_work_queue","tenant":null,"batch":null,"counts":{"pending":0,"leased":0,"done":0,"dead":0},"runnable":0,"scheduled":0,"oldest_runnable_age_s":null,"leases_by_worker":{},"throughput_per_s_1m":0.0,"eta_s":null,"paused":[],"budgets":[],"canary":null}'

  local i
  for i in 1 2 3 4; do expect_exit 0 "$LEASH" enqueue --tenant acme --batch nightly "{\"i\":$i}"; done
  for i in 5 6; do expect_exit 0 "$LEASH" enqueue --tenant acme --batch nightly --delay 1h "{\"i\":$i}"; done
  for i in 7 8; do expect_exit 0 "$LEASH" enqueue --tenant other "{\"i\":$i}"; done
  expect_exit 0 "$LEASH" enqueue --tenant acme --batch nightly '{"i":9}'
  # Every count differs from the others, so no two fields can be swapped unnoticed.
  q "update agent_work_queue set status = 'done' where id = 3;
     update agent_work_queue set status = 'dead', attempts = 8 where id in (4, 9);
     update agent_work_queue set status = 'leased', lease_owner = 'w1', attempts = 1,
            locked_until = now() + interval '10 minutes' where id in (2, 7);
     update agent_work_queue set status = 'leased', lease_owner = 'w2', attempts = 1,
            locked_until = now() + interval '10 minutes' where id = 8;
     update agent_work_queue set run_after = now() - interval '100 seconds' where id = 1;"

  local all
  all=$(status_json)
  assert_eq "whole queue" "$all" \
    '{"table":"agent_work_queue","tenant":null,"batch":null,"counts":{"pending":3,"leased":3,"done":1,"dead":2},"runnable":1,"scheduled":2,"oldest_runnable_age_s":AGE,"leases_by_worker":{"w1":2,"w2":1},"throughput_per_s_1m":0.0,"eta_s":null,"paused":[],"budgets":[],"canary":null}'
  check_status "whole queue, again" "$all"
  check_status "--tenant acme" \
    '{"table":"agent_work_queue","tenant":"acme","batch":null,"counts":{"pending":3,"leased":1,"done":1,"dead":2},"runnable":1,"scheduled":2,"oldest_runnable_age_s":AGE,"leases_by_worker":{"w1":1},"throughput_per_s_1m":0.0,"eta_s":null,"paused":[],"budgets":[],"canary":null}' --tenant acme
  check_status "--batch nightly" \
    '{"table":"agent_work_queue","tenant":null,"batch":"nightly","counts":{"pending":3,"leased":1,"done":1,"dead":2},"runnable":1,"scheduled":2,"oldest_runnable_age_s":AGE,"leases_by_worker":{"w1":1},"throughput_per_s_1m":0.0,"eta_s":null,"paused":[],"budgets":[],"canary":null}' --batch nightly
  check_status "--tenant other" \
    '{"table":"agent_work_queue","tenant":"other","batch":null,"counts":{"pending":0,"leased":2,"done":0,"dead":0},"runnable":0,"scheduled":0,"oldest_runnable_age_s":null,"leases_by_worker":{"w1":1,"w2":1},"throughput_per_s_1m":0.0,"eta_s":null,"paused":[],"budgets":[],"canary":null}' --tenant other
  check_status "--tenant other --batch nightly" \
    '{"table":"agent_work_queue","tenant":"other","batch":"nightly","counts":{"pending":0,"leased":0,"done":0,"dead":0},"runnable":0,"scheduled":0,"oldest_runnable_age_s":null,"leases_by_worker":{},"throughput_per_s_1m":0.0,"eta_s":null,"paused":[],"budgets":[],"canary":null}' --tenant other --batch nightly
  check_status "--tenant with quotes" \
    '{"table":"agent_work_queue","tenant":"a\"b\\c","batch":null,"counts":{"pending":0,"leased":0,"done":0,"dead":0},"runnable":0,"scheduled":0,"oldest_runnable_age_s":null,"leases_by_worker":{},"throughput_per_s_1m":0.0,"eta_s":null,"paused":[],"budgets":[],"canary":null}' --tenant 'a"b\c'

  # A row a plain SQL client inserts is counted at once.
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('acme', 'x', '{}')"
  local acme
  acme=$(status_json --tenant acme)
  assert_contains "plain SQL row" "$acme" \
    '"counts":{"pending":4,"leased":1,"done":1,"dead":2},"runnable":2,"scheduled":2,'

  # The text form says the same.
  expect_exit 0 "$LEASH" status
  assert_contains "text: pending" "$(<"$T_OUT")" "pending  4 (runnable 2, scheduled 2)"
  assert_contains "text: leased" "$(<"$T_OUT")" "leased   3"
  assert_contains "text: done" "$(<"$T_OUT")" "done     1"
  assert_contains "text: dead" "$(<"$T_OUT")" "dead     2"
  assert_contains "text: worker" "$(<"$T_OUT")" "worker   w1 holds 2 leases"
}

t_run "$@"
