#!/usr/bin/env bash
# Configuration: every option of every command also from LEASH_<NAME> (the command line
# wins), one-line refusals of bad values by class, units, and the bash completion, which
# must offer exactly what --help documents. The lists of commands and options are read
# from the binary's --help, never written down here, so a new option is covered the day it
# is added (and one missing from its command's help text fails a case).
# SC2016: '$' in single quotes is a table name meant literally; SC2119: t_newdb's SUFFIX is
# optional; SC1010: "done" is a prune status here, not the keyword.
# shellcheck disable=SC2016,SC2119,SC1010
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"

NOOP=$LEASH_SRC/tests/fixtures/run/noop.lua
COMPLETION=$LEASH_SRC/scripts/completion/leash.bash

# No variable of the caller's may leak into a case, and a command that gets as far as
# connecting must fail at once rather than find a server: unless a case sets up its own.
for _v in $(compgen -e LEASH_); do
  case $_v in LEASH_SRC | LEASH_BIN | LEASH_VALGRIND*) ;; *) unset "$_v" ;; esac
done
unset _v

commands() { "$LEASH" --help | awk '!done && /^commands:/ { on = 1; next } on && /^$/ { on = 0; done = 1 }
                                    on && /^  [a-z]/ { print $1 }'; }

# env_list CMD: "VARIABLE OPTION KIND" per option of CMD's table (KIND switch or value),
# from the "environment:" part of its --help.
env_list() {
  "$LEASH" "$1" --help | awk '/^environment:/ { on = 1; next }
    on && /^  LEASH_/ { print $1, $2, ($3 == "(switch)" ? "switch" : "value") }'
}

# help_options CMD: the options the hand-written help text describes ("  --name ..." and
# "  -h, --help"), sorted.
help_options() {
  "$LEASH" "$1" --help | awk '/^environment:/ { done = 1 }
    !done && /^  --[a-z0-9-]+/ { print $1 } !done && /^  -h, --help/ { print "--help" }' | sort -u
}

# refused_by_var CMD VAR VALUE [ARGS...]: CMD with VAR=VALUE exits 2 with exactly one line
# on stderr, naming VAR, and nothing on stdout.
refused_by_var() {
  local cmd=$1 var=$2 value=$3
  shift 3
  expect_exit 2 env "$var=$value" PGHOST=/nonexistent PGCONNECT_TIMEOUT=1 DATABASE_URL= \
    "$LEASH" "$cmd" "$@"
  local err
  err=$(<"$T_ERR")
  assert_eq "$cmd with $var=$(printf %q "$value"): one line" "$(wc -l <"$T_ERR")" 1
  [[ $err == "leash $cmd: $var: "* ]] || fail "$cmd with $var=$(printf %q "$value"): line does not name $var: $err"
  assert_eq "$cmd with $var: stdout" "$(<"$T_OUT")" ""
}

# refused_flag CMD ARGS...: exits 2 with the error line and the --help hint, nothing else,
# before any connection is tried.
refused_flag() {
  local cmd=$1
  shift
  expect_exit 2 env PGHOST=/nonexistent PGCONNECT_TIMEOUT=1 DATABASE_URL= "$LEASH" "$cmd" "$@"
  local what
  what="$cmd $(printf '%q ' "$@")"
  assert_eq "$what: two lines (error, hint)" "$(wc -l <"$T_ERR")" 2
  [[ $(head -n1 "$T_ERR") == "leash $cmd: "* ]] || fail "$what: first line: $(head -n1 "$T_ERR")"
  assert_eq "$what: hint" "$(tail -n1 "$T_ERR")" "Try 'leash $cmd --help'."
  assert_eq "$what: stdout" "$(<"$T_OUT")" ""
}

# ---------------------------------------------------------------- the variables

case_every_option_of_every_command_is_listed_with_its_variable_and_described() {
  local cmd n=0 total=0
  for cmd in $(commands); do
    local listed described
    listed=$( (env_list "$cmd" | awk '{ print $2 }'; printf '%s\n' --help --version) | sort -u)
    described=$( (help_options "$cmd"; printf '%s\n' --help --version) | sort -u)
    assert_eq "$cmd: options in the table (environment list) = options in the help text" \
      "$listed" "$described"
    while read -r var opt _; do
      local want=LEASH_${opt#--}
      want=${want//-/_}
      assert_eq "$cmd $opt: variable name" "$var" "${want^^}"
      ((++total))
    done < <(env_list "$cmd")
    ((++n))
  done
  ((n >= 10)) || fail "only $n commands in leash --help"
  ((total >= 60)) || fail "only $total options over every command"
}

case_every_variable_is_read_and_an_invalid_value_is_refused_naming_it() {
  # An empty value is invalid for every option that takes one, and "maybe" for every
  # switch: so each variable, whatever it means, shows it is read.
  local cmd var opt kind count=0
  for cmd in $(commands); do
    while read -r var opt kind; do
      if [[ $kind == switch ]]; then
        refused_by_var "$cmd" "$var" maybe
        refused_by_var "$cmd" "$var" 2
        refused_by_var "$cmd" "$var" ""
      else
        refused_by_var "$cmd" "$var" ""
      fi
      ((++count))
    done < <(env_list "$cmd")
  done
  ((count >= 60)) || fail "only $count variables checked"

  # Typed values go through the option's own check: a sample of each kind.
  refused_by_var run LEASH_CONCURRENCY 0 "$NOOP"
  refused_by_var run LEASH_CONCURRENCY abc "$NOOP"
  refused_by_var run LEASH_VISIBILITY 5x "$NOOP"
  refused_by_var run LEASH_POLL 200-500 "$NOOP"
  refused_by_var run LEASH_POLL_MS 5-3 "$NOOP"
  refused_by_var run LEASH_LUA_MEMORY 512k "$NOOP"
  refused_by_var run LEASH_MAX_RESULT_BYTES 1TB "$NOOP"
  refused_by_var run LEASH_METRICS 127.0.0.1:99999 "$NOOP"
  refused_by_var check LEASH_LOG_LEVEL loud "$NOOP"
  refused_by_var status LEASH_TABLE 'a$b'
  refused_by_var status LEASH_INTERVAL 10ms --watch
  refused_by_var enqueue LEASH_RUN_AFTER infinity '{}'
  refused_by_var enqueue LEASH_MAX_LINE_BYTES 1TB '{}'
  refused_by_var requeue LEASH_ID abc
  refused_by_var tenant LEASH_WEIGHT 1001 set acme
  refused_by_var prune LEASH_CHUNK 0
  refused_by_var prune LEASH_STATUS leased
  # A control character in a value stays inside the one line.
  refused_by_var run LEASH_METRICS $'h\n:80' "$NOOP"
  assert_contains "escaped newline" "$(<"$T_ERR")" 'h\x0a:80'
}

case_a_valid_variable_takes_effect_for_each_kind() {
  need_pg
  t_newdb
  expect_exit 0 "$LEASH" migrate
  # Values: a tenant, a batch, a number, a duration on enqueue.
  expect_exit 0 env LEASH_TENANT=acme LEASH_BATCH=b1 LEASH_PRIORITY=7 LEASH_DELAY=1h \
    LEASH_MAX_ATTEMPTS=3 "$LEASH" enqueue '{"n":1}'
  assert_eq "row from the variables" \
    "$(q "select tenant_id, batch, priority, max_attempts, run_after > now() + interval '50 minutes'
            from agent_work_queue")" "acme|b1|7|3|t"
  # LEASH_DB is used (the connection fails: nothing listens on port 1) and, like --db,
  # never printed: it may hold a password.
  expect_exit 1 env LEASH_DB='postgresql://u:s3cret-pw@127.0.0.1:1/x?connect_timeout=2' "$LEASH" status
  assert_contains "LEASH_DB was tried" "$(<"$T_ERR")" "127.0.0.1"
  assert_not_contains "password from LEASH_DB" "$(<"$T_ERR")" "s3cret-pw"
  # A global: the connection from LEASH_DB beats DATABASE_URL; the table from LEASH_TABLE.
  q "create schema other" >/dev/null
  expect_exit 0 env LEASH_DB="$DATABASE_URL" DATABASE_URL=postgresql:///nonexistent_db \
    LEASH_TABLE=other.q "$LEASH" migrate
  assert_eq "migrated other.q" "$(q "select to_regclass('other.q') is not null")" t
  expect_exit 0 env LEASH_TABLE=other.q "$LEASH" enqueue '{"n":2}'
  assert_eq "row in other.q" "$(q "select count(*) from other.q")" 1
  # A switch on and off.
  expect_exit 0 env LEASH_JSON=true "$LEASH" status
  [[ $(<"$T_OUT") == '{"table":"agent_work_queue"'* ]] || fail "LEASH_JSON=true: not JSON: $(<"$T_OUT")"
  expect_exit 0 env LEASH_JSON=No "$LEASH" status
  [[ $(<"$T_OUT") == 'table '* ]] || fail "LEASH_JSON=No: not text: $(<"$T_OUT")"
  # A run configured from variables only (sizes, the new --poll, a switch, the log
  # format): it runs acme's task (made due) and leaves the other tenant's alone.
  q "update agent_work_queue set run_after = now();
     insert into agent_work_queue (tenant_id, shard_key, payload) values ('zzz', 'z', '{}')" >/dev/null
  expect_exit 0 env LEASH_UNTIL_EMPTY=yes LEASH_POLL=10ms-50ms LEASH_LUA_MEMORY=64MB \
    LEASH_MAX_RESULT_BYTES=1MB LEASH_CONCURRENCY=2 LEASH_WORKER_ID=envw LEASH_TENANT=acme \
    LEASH_LOG_FORMAT=json LEASH_DRAIN_TIMEOUT=5s LEASH_METRICS="127.0.0.1:$(free_port)" \
    "$LEASH" run "$NOOP"
  assert_eq "acme's task ran, zzz's did not" \
    "$(q "select string_agg(tenant_id || '=' || status, ',' order by tenant_id) from agent_work_queue")" \
    "acme=done,zzz=pending"
  [[ -s $T_ERR && $(head -n1 "$T_ERR") == '{'* ]] || fail "LEASH_LOG_FORMAT=json: $(head -n1 "$T_ERR")"
  grep -q envw "$T_ERR" || fail "LEASH_WORKER_ID not in the log: $(head -n3 "$T_ERR")"
  q "delete from agent_work_queue where tenant_id = 'zzz'" >/dev/null
  # Repeatable --id from the variable: one id.
  q "update agent_work_queue set status = 'dead', finished_at = now()" >/dev/null
  expect_exit 0 env LEASH_ID="$(q 'select id from agent_work_queue')" "$LEASH" requeue
  assert_eq "requeued by LEASH_ID" "$(<"$T_OUT")" 1
  # A positional command still takes its arguments with the variables set.
  expect_exit 0 env LEASH_WEIGHT=4 "$LEASH" tenant set acme
  assert_eq "weight from LEASH_WEIGHT" "$(q 'select weight from agent_work_queue_tenants')" 4
  # A duration with a unit on prune (nothing that old).
  expect_exit 0 env LEASH_OLDER_THAN=7d "$LEASH" prune
  assert_eq "prune count" "$(<"$T_OUT")" 0
}

case_the_command_line_beats_the_environment() {
  need_pg
  t_newdb
  expect_exit 0 "$LEASH" migrate
  expect_exit 0 env LEASH_TENANT=from_env "$LEASH" enqueue --tenant from_flag '{}'
  expect_exit 0 env LEASH_TENANT=from_env "$LEASH" enqueue --ten=abbrev '{}'   # abbreviated
  assert_eq "tenants" "$(q "select string_agg(tenant_id, ',' order by id) from agent_work_queue")" \
    "from_flag,abbrev"
  # The flag's variable is not even checked: a bad one under a good flag is fine.
  expect_exit 0 env LEASH_PRIORITY=99999 "$LEASH" enqueue --priority 1 '{}'
  expect_exit 0 env LEASH_PRIORITY=99999 "$LEASH" enqueue --priority=2 '{}'
  # A global before the command (main's part of argv) and after it.
  expect_exit 0 env LEASH_TABLE='bad$name' "$LEASH" --table agent_work_queue status
  expect_exit 0 env LEASH_TABLE='bad$name' "$LEASH" status --table agent_work_queue
  expect_exit 0 env LEASH_LOG_LEVEL=loud "$LEASH" --log-level warn status
  # A repeatable option: any --tenant on the command line replaces LEASH_TENANT.
  q "insert into agent_work_queue (tenant_id, shard_key, payload) values ('a', 'x', '{}'), ('b', 'y', '{}')" >/dev/null
  expect_exit 0 env LEASH_TENANT=a LEASH_POLL=10ms "$LEASH" run "$NOOP" --tenant b --until-empty \
    --worker-id w
  assert_eq "only b ran" "$(q "select string_agg(tenant_id || '=' || status, ',' order by tenant_id)
                                  from agent_work_queue where tenant_id in ('a', 'b')")" "a=pending,b=done"
  # A switch off in the environment, on on the command line.
  expect_exit 0 env LEASH_JSON=0 "$LEASH" status --json
  [[ $(<"$T_OUT") == '{'* ]] || fail "--json with LEASH_JSON=0: $(<"$T_OUT")"
  # --help and --version answer whatever the environment holds.
  local cmd
  for cmd in $(commands); do
    expect_exit 0 env LEASH_TABLE='bad$' LEASH_JSON=maybe LEASH_CONCURRENCY=0 "$LEASH" "$cmd" --help
    assert_contains "$cmd --help" "$(<"$T_OUT")" "environment:"
    expect_exit 0 env LEASH_TABLE='bad$' "$LEASH" "$cmd" --version
  done
}

# ---------------------------------------------------------------- bad values by class

case_bad_addresses_and_ports_are_refused_with_one_line() {
  local a
  for a in 127.0.0.1:99999 127.0.0.1:65536 127.0.0.1:0 :0 127.0.0.1: 127.0.0.1:http 127.0.0.1:-1 \
      '127.0.0.1: 80' 127.0.0.1 ::1:9100 '[::1:9100' '[zz::1]:9100' 1.2.3.999:80 127.1:80 \
      'host name:9100' -h:9100 $'h\n:80'; do
    refused_flag run "$NOOP" --metrics "$a"
    assert_contains "--metrics $(printf %q "$a")" "$(head -n1 "$T_ERR")" "--metrics"
  done
  # The forms that are fine get as far as loading the script (exit 1: no such file).
  for a in 127.0.0.1:9100 :9100 '[::1]:9100' localhost:65535; do
    expect_exit 1 env PGHOST=/nonexistent "$LEASH" run "$T_TMP/missing.lua" --metrics "$a"
    assert_not_contains "--metrics $a accepted" "$(<"$T_ERR")" "--metrics"
  done
}

case_empty_scopes_and_names_are_refused_with_one_line() {
  local cmd opt
  for opt in --tenant --batch --worker-id; do
    refused_flag run "$NOOP" "$opt" ""
    refused_flag run "$NOOP" "$opt="
    assert_eq "run $opt=" "$(head -n1 "$T_ERR")" "leash run: $opt must not be empty"
  done
  for cmd in status report prune requeue enqueue; do
    for opt in --tenant --batch; do
      refused_flag "$cmd" "$opt" "" --dead '{}'
      # The command's own message when it has one (enqueue's), else the generic one.
      [[ $(head -n1 "$T_ERR") == "leash $cmd: $opt"*"must not be empty" ]] \
        || fail "$cmd $opt '': $(head -n1 "$T_ERR")"
    done
  done
  refused_flag enqueue --shard "" '{}'
  refused_flag enqueue --file ""
  refused_flag status --db ""
  refused_flag status --table ""
  refused_flag check --lua-path "" "$NOOP"
  refused_flag tenant set acme --weight ""
}

case_infinite_timestamps_are_refused_and_finite_specials_are_taken() {
  local ts
  for ts in infinity -infinity +infinity Infinity ' INFINITY ' $'\tinfinity'; do
    refused_flag enqueue --run-after "$ts" '{}'
    assert_contains "--run-after $(printf %q "$ts")" "$(head -n1 "$T_ERR")" "finite timestamp"
  done
  need_pg
  t_newdb
  expect_exit 0 "$LEASH" migrate
  # epoch, now, today are finite: taken (a run_after in the past is simply runnable now).
  for ts in epoch now today; do
    expect_exit 0 "$LEASH" enqueue --run-after "$ts" '{}'
  done
  assert_eq "three finite rows" "$(q "select count(*) from agent_work_queue where isfinite(run_after)")" 3
  for ts in infinity -infinity ' +Infinity'; do
    printf '{"payload":{},"run_after":"%s"}\n' "$ts" >"$T_TMP/inf.jsonl"
    expect_exit 2 "$LEASH" enqueue --file "$T_TMP/inf.jsonl"
    assert_eq "JSONL $ts: one line" "$(wc -l <"$T_ERR")" 1
    assert_contains "JSONL $ts" "$(<"$T_ERR")" "finite timestamp"
  done
  # Not a timestamp at all (NaN is a float's, not a timestamp's): PostgreSQL's judgement.
  for ts in NaN nan allballs ''; do
    expect_exit 2 "$LEASH" enqueue --run-after "$ts" '{}'
    [[ $(head -n1 "$T_ERR") == "leash enqueue: "* ]] || fail "--run-after $ts: $(<"$T_ERR")"
  done
  assert_eq "nothing more written" "$(q "select count(*) from agent_work_queue")" 3
}

case_out_of_range_numbers_are_refused_with_one_line() {
  local v
  for v in 0 10001 -1 1e3 1.5 ' 5' 99999999999999999999; do
    refused_flag run "$NOOP" --concurrency "$v"
  done
  refused_flag run "$NOOP" --claim-batch 1001
  refused_flag run "$NOOP" --db-pool 0
  refused_flag run "$NOOP" --db-pool 101
  refused_flag run "$NOOP" --visibility 0
  refused_flag run "$NOOP" --heartbeat 36501d
  refused_flag prune --older-than 1d --chunk 0
  refused_flag prune --older-than 1d --chunk 100001
  refused_flag tenant set acme --weight 0
  refused_flag tenant set acme --weight 1001
  refused_flag enqueue --max-attempts 0 '{}'
  refused_flag enqueue --priority 1001 '{}'
  refused_flag enqueue --priority -1001 '{}'
  refused_flag status --watch --interval 10ms
  refused_flag status --watch --interval 2d
  refused_flag requeue --id 0
  refused_flag requeue --id 9223372036854775808
  for v in 1-99999999999 0-5 5-3 200 -5 a-b 1-60001; do
    refused_flag run "$NOOP" --poll-ms "$v"
  done
}

case_sizes_and_durations_take_units_and_plain_numbers_keep_their_meaning() {
  local v
  # Refused: sizes without a known unit or out of range, durations that are not.
  for v in 512k 512KB 1TB 1.5GB 1mb 2048GB -1; do
    refused_flag run "$NOOP" --lua-memory "$v"
  done
  for v in 0 1x 2TB 0KB; do
    refused_flag run "$NOOP" --max-result-bytes "$v"
  done
  for v in 200-500 0-1s 10ms- -1s 1s-61s 2s-1s 1h 10ms-1s-2s; do
    refused_flag run "$NOOP" --poll "$v"
  done
  refused_flag enqueue --max-line-bytes 1B '{}'
  refused_flag enqueue --max-line-bytes 2GB '{}'
  # Taken: they get as far as loading the (missing) script.
  local ok
  for ok in "--lua-memory 256" "--lua-memory 0" "--lua-memory 1GB" "--lua-memory 64MB" \
      "--max-result-bytes 65536" "--max-result-bytes 64KB" "--max-result-bytes 16MB" \
      "--poll 10ms-1s" "--poll 1s" "--poll 200ms-500ms" "--poll-ms 200-500" \
      "--visibility 10m" "--task-timeout 500ms" "--drain-timeout 1m"; do
    # shellcheck disable=SC2086 # the option and its value
    expect_exit 1 env PGHOST=/nonexistent "$LEASH" run "$T_TMP/missing.lua" $ok
    assert_contains "$ok accepted" "$(<"$T_ERR")" "missing.lua"
  done
}

# ---------------------------------------------------------------- bash completion

# complete_words [bc] WORD...: what the completion offers for the last WORD (COMPREPLY,
# sorted, one a line), with bash-completion's helpers loaded (bc) or without them.
complete_words() {
  local bc=0
  [[ $1 == bc ]] && { bc=1; shift; }
  PATH=$(dirname "$LEASH"):$PATH bash -c '
    bc=$1; shift
    if ((bc)); then source /usr/share/bash-completion/bash_completion || exit 3; fi
    source "$COMPLETION" || exit 3
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
    COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
    COMPREPLY=()
    _leash "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    if ((${#COMPREPLY[@]})); then printf "%s\n" "${COMPREPLY[@]}" | sort; fi' _ "$bc" "$@"
}

# the modes this machine has: always the plain one, and with bash-completion when installed.
completion_modes() {
  echo plain
  [[ -r /usr/share/bash-completion/bash_completion ]] && echo bc
  return 0
}

case_completion_offers_every_command_and_each_commands_documented_options() {
  export COMPLETION
  [[ $LEASH == */leash ]] || { echo "skip: completion needs the binary named leash" >&2; exit 77; }
  local mode cmd want got m
  for mode in $(completion_modes); do
    m=; [[ $mode == bc ]] && m="bc"
    assert_eq "$mode: commands" "$(complete_words $m leash "")" "$(commands | sort)"
    assert_eq "$mode: commands starting with r" "$(complete_words $m leash r)" \
      "$(commands | grep '^r' | sort)"
    for cmd in $(commands); do
      # From the hand-written help text, not from the list the completion itself reads.
      want=$( (help_options "$cmd"; echo --version) | sort -u)
      got=$(complete_words $m leash "$cmd" --)
      assert_eq "$mode: leash $cmd --<TAB>" "$got" "$want"
      # Options after a global option and its value, and after an argument.
      got=$(complete_words $m leash --table t "$cmd" x --)
      assert_eq "$mode: leash --table t $cmd x --<TAB>" "$got" "$want"
    done
    assert_eq "$mode: global options" "$(complete_words $m leash --)" \
      "$(printf '%s\n' --db --help --log-format --log-level --table --version)"
  done
}

case_completion_completes_values_scripts_and_actions() {
  export COMPLETION
  [[ $LEASH == */leash ]] || { echo "skip: completion needs the binary named leash" >&2; exit 77; }
  mkdir -p "$T_TMP/c/libs" "$T_TMP/c/more"
  : >"$T_TMP/c/task.lua"
  : >"$T_TMP/c/notes.txt"
  : >"$T_TMP/c/tasks.jsonl"
  local mode m
  for mode in $(completion_modes); do
    m=; [[ $mode == bc ]] && m="bc"
    assert_eq "$mode: log levels" "$(complete_words $m leash --log-level "")" \
      "$(printf '%s\n' debug error info warn)"
    assert_eq "$mode: log format after a command" "$(complete_words $m leash status --log-format j)" json
    assert_eq "$mode: --opt=value" "$(complete_words $m leash status --log-format=j)" json
    assert_eq "$mode: prune statuses" "$(complete_words $m leash prune --status d)" \
      "$(printf '%s\n' dead done done,dead)"
    assert_eq "$mode: tenant actions" "$(complete_words $m leash tenant "")" \
      "$(printf '%s\n' list reset set)"
    assert_eq "$mode: tenant actions after an option" \
      "$(complete_words $m leash tenant --weight 3 "")" "$(printf '%s\n' list reset set)"
    assert_eq "$mode: no value for --concurrency" "$(complete_words $m leash run --concurrency "")" ""
    (
      cd "$T_TMP/c"
      assert_eq "$mode: run's script: .lua files and folders" "$(complete_words $m leash run "")" \
        "$(printf '%s\n' libs more task.lua)"
      assert_eq "$mode: --lua-path: folders" "$(complete_words $m leash run --lua-path "")" \
        "$(printf '%s\n' libs more)"
      assert_eq "$mode: --file: files" "$(complete_words $m leash enqueue --file t)" \
        "$(printf '%s\n' task.lua tasks.jsonl)"
      assert_eq "$mode: nothing after run's script" "$(complete_words $m leash run task.lua "")" ""
      # A switch takes no value: the word after it is the script again.
      assert_eq "$mode: script after a switch" "$(complete_words $m leash run --until-empty "")" \
        "$(printf '%s\n' libs more task.lua)"
      assert_eq "$mode: script after an option's value" \
        "$(complete_words $m leash run --concurrency 4 "")" "$(printf '%s\n' libs more task.lua)"
    )
  done
}

case_the_installed_completion_is_found_by_bash_completions_loader() {
  local build
  build=$(dirname "$LEASH")
  [[ -f $build/CMakeCache.txt ]] || { echo "skip: $LEASH is not in a CMake build tree" >&2; exit 77; }
  [[ -r /usr/share/bash-completion/bash_completion ]] \
    || { echo "skip: bash-completion is not installed" >&2; exit 77; }
  cmake --install "$build" --prefix "$T_TMP/prefix" >/dev/null
  local f=$T_TMP/prefix/share/bash-completion/completions/leash
  [[ -f $f ]] || fail "not installed at $f"
  cmp -s "$f" "$COMPLETION" || fail "installed file differs from $COMPLETION"
  # bash-completion loads completions/<command> from XDG_DATA_DIRS on first use.
  local got
  got=$(XDG_DATA_DIRS=$T_TMP/prefix/share bash -c '
    source /usr/share/bash-completion/bash_completion
    __load_completion leash && complete -p leash')
  assert_eq "complete -p after loading" "$got" "complete -F _leash leash"
}

t_run "$@"
