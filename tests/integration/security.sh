#!/usr/bin/env bash
# Security properties that docs/SECURITY.md promises, each proven against a real server.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/run_common.sh"

SEC=$LEASH_SRC/tests/fixtures/security

# A second cluster of our own with TLS: a CA and a server certificate for "localhost" made
# here; verify-full must work end to end, and fail for a wrong CA or a wrong host name.
case_tls_verify_full_end_to_end() {
  need_pg
  command -v openssl >/dev/null || fail "openssl is needed"
  local d=$T_TMP/tls env dir port
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=leash test CA" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$d/server.key" \
    -out "$d/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost\n' >"$d/san.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 2 -extfile "$d/san.ext" -out "$d/server.crt" 2>/dev/null
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=other CA" \
    -keyout "$d/other.key" -out "$d/other.crt" 2>/dev/null

  env=$(env -u PGHOST -u PGPORT "$LEASH_SRC/scripts/pg.sh" start) || fail "second cluster"
  dir=$(sed -n 's/^export LEASH_PG_DIR=//p' <<<"$env")
  port=$(sed -n 's/^export PGPORT=//p' <<<"$env")
  dir=${dir//\'/}
  port=${port//\'/}
  t_on_exit "$LEASH_SRC/scripts/pg.sh" stop "$dir"
  install -m 600 "$d/server.key" "$dir/data/server.key"
  install -m 644 "$d/server.crt" "$dir/data/server.crt"
  [[ $EUID -ne 0 ]] || chown postgres "$dir/data/server.key" "$dir/data/server.crt"
  printf "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n" \
    >>"$dir/data/postgresql.conf"
  "$LEASH_SRC/scripts/pg.sh" restart "$dir" >/dev/null || fail "restart with TLS"

  local base="host=localhost port=$port user=postgres dbname=postgres"
  local good="$base sslmode=verify-full sslrootcert=$d/ca.crt"
  expect_exit 0 "$LEASH" --db "$good" migrate
  expect_exit 0 "$LEASH" --db "$good" enqueue '{"n":1}'
  expect_exit 0 "$LEASH" --db "$good" run "$SEC/worker.lua" --until-empty --concurrency 2
  assert_eq "done over TLS" "$(psql -X -A -t -d "$good" -c "select count(*) from agent_work_queue where status = 'done'")" 1
  assert_eq "the session really is TLS" \
    "$(psql -X -A -t -d "$good" -c "select ssl from pg_stat_ssl where pid = pg_backend_pid()")" t
  expect_exit 1 "$LEASH" --db "$base sslmode=verify-full sslrootcert=$d/other.crt" status
  assert_contains "wrong CA refused" "$(<"$T_ERR")" "certificate verify failed"
  expect_exit 1 "$LEASH" --db "host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=verify-full sslrootcert=$d/ca.crt" status
  assert_contains "wrong host name refused" "$(<"$T_ERR")" "does not match host name"
}

# The grants docs/SECURITY.md lists for the worker role are enough to enqueue, run, use
# steps and child tasks, and report status; nothing more is granted.
case_least_privilege_role_runs_the_worker() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  q "drop role if exists leash_worker_t; create role leash_worker_t login" >/dev/null
  t_on_exit q "drop owned by leash_worker_t; drop role if exists leash_worker_t"
  sed -e 's/leash_worker/leash_worker_t/g' "$LEASH_SRC/docs/worker-role.sql" >"$T_TMP/grants.sql"
  psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -f "$T_TMP/grants.sql" >/dev/null
  local url="$DATABASE_URL user=leash_worker_t"
  expect_exit 0 "$LEASH" --db "$url" enqueue '{"n":1,"spawn":true}'
  expect_exit 0 "$LEASH" --db "$url" enqueue '{"n":2}'
  expect_exit 0 "$LEASH" --db "$url" run "$SEC/worker.lua" --until-empty --concurrency 2
  assert_eq "all done as the worker role" "$(q "select string_agg(status, ',' order by id) from agent_work_queue")" "done,done,done"
  expect_exit 0 "$LEASH" --db "$url" status --json
  # And it is no owner: DDL on the queue table is refused.
  expect_exit 1 psql -X -q -v ON_ERROR_STOP=1 -d "$url" -c "alter table agent_work_queue add column x int"
  assert_contains "DDL refused" "$(<"$T_ERR")" "must be owner"
}

# A worker started with --tenant A never claims, renews, settles or creates B's rows.
case_tenant_scoped_worker_never_touches_other_tenants() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  for i in 1 2 3 4 5; do
    printf '{"payload":{"i":%d},"tenant_id":"A","shard_key":"s%d"}\n' "$i" "$i"
    printf '{"payload":{"i":%d},"tenant_id":"B","shard_key":"s%d"}\n' "$i" "$i"
  done >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 10
  local before
  before=$(q "select string_agg(concat_ws('|', id, status, attempts, updated_at, lease_owner), ',' order by id) from agent_work_queue where tenant_id = 'B'")
  expect_exit 0 "$LEASH" run "$SEC/scoped.lua" --tenant A --until-empty --concurrency 3
  assert_eq "B's rows untouched" "$(q "select string_agg(concat_ws('|', id, status, attempts, updated_at, lease_owner), ',' order by id) from agent_work_queue where tenant_id = 'B'")" "$before"
  assert_eq "A's tasks and their children done" "$(q "select count(*) from agent_work_queue where tenant_id = 'A' and status = 'done'")" 10
  assert_eq "enqueue for B refused in every task" \
    "$(q "select count(*) from agent_work_queue where result->>'refused' = 'true' and result->>'err' like '%outside this worker''s --tenant scope%'")" 5
  assert_eq "no B task created" "$(q "select count(*) from agent_work_queue where payload ? 'evil'")" 0
}

# Passwords in the conninfo, Authorization headers, URL credentials and query keys, and
# log fields named authorization/password never reach the log or last_error.
case_secrets_never_logged() {
  t_newdb
  local url="$DATABASE_URL password=PG-LEAKED-PASSWORD"
  expect_exit 0 "$LEASH" --db "$url" migrate
  expect_exit 0 "$LEASH" --db "$url" enqueue --max-attempts 1 '{}'
  expect_exit 0 "$LEASH" --db "$url" --log-level debug run "$SEC/secrets.lua" --until-empty \
    --concurrency 1
  local everything
  everything="$(<"$T_OUT")$(<"$T_ERR")$(q "select last_error from agent_work_queue")"
  assert_contains "the task did fail with the transport error" "$everything" "Couldn't connect"
  assert_contains "the log line was written" "$everything" "calling the model"
  assert_not_contains "log and errors" "$everything" "LEAKED"
  expect_exit 1 "$LEASH" --db "postgresql://u:PG-LEAKED-PASSWORD@127.0.0.1:1/x" status
  assert_not_contains "connection error" "$(<"$T_OUT")$(<"$T_ERR")" "LEAKED"
}

t_run "$@"
