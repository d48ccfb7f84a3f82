#!/usr/bin/env bash
# Throwaway PostgreSQL 15 cluster for tests, the demo and benchmarks.
#
#   eval "$(scripts/pg.sh start [--fsync] [DIR])"   # exports PGHOST PGPORT PGUSER LEASH_PG_DIR
#   scripts/pg.sh newdb NAME                         # (re)creates NAME, prints its conninfo
#   scripts/pg.sh restart [DIR]                      # same port, same socket
#   scripts/pg.sh halt [DIR] / resume [DIR]          # stop the server, keep the cluster / start it again
#   scripts/pg.sh env [DIR]                          # prints the export lines again
#   scripts/pg.sh stop [DIR]                         # stops and deletes DIR; idempotent
#
# Layout of DIR: data/ (the cluster, mode 0700), server.log, the unix socket
# (.s.PGSQL.<port>) and leash-pg.env, the marker that makes DIR ours to delete.
# Loopback TCP only, trust authentication: never point this at anything real.
# When run as root the server runs as the `postgres` system user (initdb refuses root).
# LEASH_PG_FSYNC=on (or --fsync) keeps fsync and synchronous_commit on, for benchmarks.
set -euo pipefail

PG_BIN=${LEASH_PG_BIN:-/usr/lib/postgresql/15/bin}
PORT_FIRST=${LEASH_PG_PORT_FIRST:-55433}
PORT_LAST=$((PORT_FIRST + 500))
MARKER=leash-pg.env

die() { echo "pg.sh: $*" >&2; exit 1; }

# Run a command as the server's owner: `postgres` when we are root, else ourselves.
as_owner() {
  if [[ $EUID -eq 0 ]]; then
    (cd / && runuser -u postgres -- "$@")
  else
    (cd / && "$@")
  fi
}

port_in_use() {
  local port=$1
  if command -v ss >/dev/null 2>&1; then
    [[ -n $(ss -Hltn "sport = :$port" 2>/dev/null) ]] && return 0
  fi
  # Fallback (and belt and braces): does anything answer on loopback?
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

# libpq conninfo value quoting: bare if safe, else '...' with \ and ' escaped.
cq() {
  local v=$1
  if [[ -n $v && $v =~ ^[A-Za-z0-9_./:@-]+$ ]]; then
    printf '%s' "$v"
  else
    v=${v//\\/\\\\}
    v=${v//\'/\\\'}
    printf "'%s'" "$v"
  fi
}

exports_for() {
  local dir=$1 port=$2
  printf 'export PGHOST=%q\n' "$dir"
  printf 'export PGPORT=%q\n' "$port"
  printf 'export PGUSER=postgres\n'
  printf 'export LEASH_PG_DIR=%q\n' "$dir"
}

read_port() {
  local dir=$1 line
  [[ -f $dir/$MARKER ]] || die "$dir is not a cluster made by pg.sh (no $MARKER)"
  while IFS= read -r line; do
    [[ $line == port=* ]] && { echo "${line#port=}"; return 0; }
  done <"$dir/$MARKER"
  die "$dir/$MARKER has no port"
}

log_tail() {
  local log=$1
  if [[ -s $log ]]; then
    echo "pg.sh: last lines of $log:" >&2
    tail -n 25 "$log" | sed 's/^/    /' >&2
  fi
}

# ---------------------------------------------------------------- start
cmd_start() {
  local dir="" fsync=${LEASH_PG_FSYNC:-off} made_dir=0
  while (($#)); do
    case $1 in
      --fsync) fsync=on ;;
      -*) echo false; die "start: unknown option $1" ;;
      *) [[ -z $dir ]] || { echo false; die "start: too many arguments"; }; dir=$1 ;;
    esac
    shift
  done
  case $fsync in on|1|true|yes) fsync=on ;; *) fsync=off ;; esac

  # Any failure from here on prints `false` on stdout, so that `eval "$(pg.sh start)"`
  # fails in the caller instead of silently exporting nothing, and removes what we made.
  START_DIR="" START_MADE=0
  trap 'start_failed' EXIT

  [[ -x $PG_BIN/initdb && -x $PG_BIN/pg_ctl ]] \
    || die "PostgreSQL 15 server binaries not found in $PG_BIN (apt-get install postgresql-15)"
  if [[ $EUID -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || die "running as root but there is no 'postgres' user (install postgresql-15)"
    command -v runuser >/dev/null 2>&1 || die "running as root but runuser is missing (install util-linux)"
  fi

  if [[ -z $dir ]]; then
    dir=$(mktemp -d /tmp/leash-pg.XXXXXX) || die "mktemp failed"
    made_dir=1
  else
    mkdir -p "$dir" || die "cannot create $dir"
    dir=$(cd "$dir" && pwd -P)
    [[ -e $dir/data || -e $dir/$MARKER ]] && die "$dir already holds a cluster (stop it first)"
  fi
  # The unix socket path must fit in sun_path (107 bytes) with "/.s.PGSQL.NNNNN".
  ((${#dir} <= 90)) || die "directory path too long for a unix socket: $dir"

  START_DIR=$dir START_MADE=$made_dir

  chmod 0755 "$dir"
  mkdir -p "$dir/data"
  chmod 0700 "$dir/data"
  if [[ $EUID -eq 0 ]]; then
    chown postgres: "$dir" "$dir/data"
    as_owner test -w "$dir/data" \
      || die "user postgres cannot write $dir/data (a parent folder is closed to it); use a folder under /tmp"
  fi

  local locale=C
  if locale -a 2>/dev/null | grep -qixE 'c\.utf-?8'; then locale=C.UTF-8; fi
  if ! as_owner "$PG_BIN/initdb" -D "$dir/data" -A trust -U postgres --no-sync \
         -E UTF8 --locale="$locale" >"$dir/initdb.log" 2>&1; then
    log_tail "$dir/initdb.log"
    die "initdb failed in $dir/data"
  fi

  local sync=off
  [[ $fsync == on ]] && sync=on
  as_owner tee -a "$dir/data/postgresql.conf" >/dev/null <<EOF

# ---- leash scripts/pg.sh: throwaway test cluster ----
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
fsync = $sync
synchronous_commit = $sync
full_page_writes = $sync
max_connections = 300
shared_buffers = 128MB
log_min_messages = warning
log_checkpoints = off
log_line_prefix = '%m [%p] %q%u@%d '
include_if_exists = 'port.conf'
EOF

  # Port choice and start under one lock, so that two concurrent starts never pick
  # the same free port. Also retry if the port was taken in between (bind failure).
  local lockfd="" port=$PORT_FIRST started=0
  if command -v flock >/dev/null 2>&1 && { exec {lockfd}>>/tmp/.leash-pg-port.lock; } 2>/dev/null; then
    chmod 0666 /tmp/.leash-pg-port.lock 2>/dev/null || true
    flock -w 300 "$lockfd" || die "timed out waiting for /tmp/.leash-pg-port.lock"
  fi
  # The server must not inherit the lock's descriptor, or it would hold the lock for life.
  without_lock() { if [[ -n $lockfd ]]; then "$@" {lockfd}>&-; else "$@"; fi; }
  while ((port <= PORT_LAST)); do
    if port_in_use "$port"; then port=$((port + 1)); continue; fi
    echo "port = $port" | as_owner tee "$dir/data/port.conf" >/dev/null
    as_owner rm -f "$dir/server.log"
    if without_lock as_owner "$PG_BIN/pg_ctl" start -D "$dir/data" -l "$dir/server.log" -w -t 60 \
         >"$dir/pg_ctl.log" 2>&1; then
      started=1
      break
    fi
    if grep -qE 'could not (bind|create listen|create any TCP)|Address already in use' \
         "$dir/server.log" 2>/dev/null; then
      port=$((port + 1))
      continue
    fi
    cat "$dir/pg_ctl.log" >&2
    log_tail "$dir/server.log"
    die "server failed to start in $dir (port $port)"
  done
  [[ -n $lockfd ]] && exec {lockfd}>&-
  ((started)) || die "no free TCP port in $PORT_FIRST..$PORT_LAST"

  printf 'port=%s\nfsync=%s\n' "$port" "$fsync" >"$dir/$MARKER"
  trap - EXIT
  exports_for "$dir" "$port"
}

start_failed() {
  local rc=$?
  echo false   # for `eval "$(pg.sh start)"`
  if [[ -n ${START_DIR:-} ]]; then
    stop_server "$START_DIR" >/dev/null 2>&1 || true
    if ((START_MADE)); then rm -rf "$START_DIR"; else rm -rf "${START_DIR:?}/data"; fi
  fi
  exit "$rc"
}

# ---------------------------------------------------------------- stop
# Stops the server of DIR (if any) and makes sure no process of it is left.
stop_server() {
  local dir=$1 data=$1/data pid=""
  [[ -f $data/postmaster.pid ]] || return 0
  read -r pid <"$data/postmaster.pid" || true
  if [[ -x $PG_BIN/pg_ctl ]]; then
    as_owner "$PG_BIN/pg_ctl" stop -D "$data" -m fast -w -t 60 >/dev/null 2>&1 \
      || as_owner "$PG_BIN/pg_ctl" stop -D "$data" -m immediate -w -t 30 >/dev/null 2>&1 \
      || true
  fi
  # Last resort: the postmaster (by the pid it wrote) and its children.
  if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
     && [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$data" ]]; then
    echo "pg.sh: postmaster $pid did not stop; killing it" >&2
    pkill -KILL -P "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

cmd_stop() {
  local dir=${1:-${LEASH_PG_DIR:-}}
  if [[ -z $dir ]]; then
    echo "pg.sh: stop: no DIR given and LEASH_PG_DIR is not set; nothing to stop" >&2
    return 0
  fi
  [[ -e $dir ]] || return 0
  dir=$(cd "$dir" && pwd -P)
  # Only ever delete a folder this script made (marker or an initdb'd data/ inside).
  if [[ ! -e $dir/$MARKER && ! -e $dir/data/PG_VERSION && -n $(ls -A "$dir") ]]; then
    die "stop: $dir does not look like a pg.sh cluster; not deleting it"
  fi
  stop_server "$dir"
  rm -rf "$dir"
}

# ---------------------------------------------------------------- restart
cmd_restart() {
  local dir=${1:-${LEASH_PG_DIR:-}}
  [[ -n $dir ]] || die "restart: no DIR given and LEASH_PG_DIR is not set"
  [[ -d $dir/data ]] || die "restart: no cluster in $dir"
  dir=$(cd "$dir" && pwd -P)
  read_port "$dir" >/dev/null
  if ! as_owner "$PG_BIN/pg_ctl" restart -D "$dir/data" -l "$dir/server.log" -m fast -w -t 60 \
       >"$dir/pg_ctl.log" 2>&1; then
    cat "$dir/pg_ctl.log" >&2
    log_tail "$dir/server.log"
    die "restart failed in $dir"
  fi
}

# ---------------------------------------------------------------- halt, resume
# The server away for a while (tests of a worker that starts before its database).
cmd_halt() {
  local dir=${1:-${LEASH_PG_DIR:-}}
  [[ -n $dir && -d $dir/data ]] || die "halt: no cluster in '${dir}'"
  stop_server "$(cd "$dir" && pwd -P)"
}

cmd_resume() {
  local dir=${1:-${LEASH_PG_DIR:-}}
  [[ -n $dir && -d $dir/data ]] || die "resume: no cluster in '${dir}'"
  dir=$(cd "$dir" && pwd -P)
  read_port "$dir" >/dev/null
  if ! as_owner "$PG_BIN/pg_ctl" start -D "$dir/data" -l "$dir/server.log" -w -t 60 \
       >"$dir/pg_ctl.log" 2>&1; then
    cat "$dir/pg_ctl.log" >&2
    log_tail "$dir/server.log"
    die "resume failed in $dir"
  fi
}

cmd_env() {
  local dir=${1:-${LEASH_PG_DIR:-}}
  [[ -n $dir ]] || die "env: no DIR given and LEASH_PG_DIR is not set"
  dir=$(cd "$dir" && pwd -P) || die "env: no such directory"
  exports_for "$dir" "$(read_port "$dir")"
}

# ---------------------------------------------------------------- newdb
cmd_newdb() {
  if (($# != 1)) || [[ -z $1 ]]; then die "usage: pg.sh newdb NAME"; fi
  local name=$1
  [[ -n ${PGHOST:-} && -n ${PGPORT:-} ]] \
    || die "newdb: PGHOST/PGPORT not set (eval \"\$(scripts/pg.sh start)\" first)"
  ((${#name} <= 63)) || die "newdb: database name longer than 63 bytes: $name"
  local user=${PGUSER:-postgres} err
  # psql variables quote NAME as an identifier (:"name"); that needs stdin, not -c.
  if ! err=$(psql -X -q -v ON_ERROR_STOP=1 -v "name=$name" \
               -h "$PGHOST" -p "$PGPORT" -U "$user" -d postgres 2>&1 >/dev/null <<'SQL'
DROP DATABASE IF EXISTS :"name" WITH (FORCE);
CREATE DATABASE :"name" TEMPLATE template0 ENCODING 'UTF8';
SQL
  ); then
    die "newdb $name: $(echo "$err" | tr '\n' ' ')"
  fi
  printf 'host=%s port=%s user=%s dbname=%s\n' \
    "$(cq "$PGHOST")" "$(cq "$PGPORT")" "$(cq "$user")" "$(cq "$name")"
}

usage() {
  sed -n '2,14s/^# \{0,1\}//p' "$0"
}

main() {
  local cmd=${1:-}
  (($#)) && shift
  case $cmd in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    restart) cmd_restart "$@" ;;
    halt) cmd_halt "$@" ;;
    resume) cmd_resume "$@" ;;
    env) cmd_env "$@" ;;
    newdb) cmd_newdb "$@" ;;
    -h|--help|help) usage ;;
    *) echo "pg.sh: unknown command: ${cmd:-(none)}" >&2; usage >&2; exit 2 ;;
  esac
}

main "$@"
