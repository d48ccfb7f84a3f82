#!/usr/bin/env bash
# The scheduler (issue #14, sql/011_scheduler.sql): heads per (tenant_id, shard_key), the
# hand-over lock, the tenants' ring, priorities and lease tokens, proven with several real
# processes against the throwaway cluster. The fixture (tests/fixtures/scheduler/record.lua)
# records every execution in `execs` on the server's clock (clock_timestamp() when handle
# starts and ends): exclusion is checked there. The rows' started_at and finished_at are not
# usable for it: they are now() of the claim's and the settle's transactions, which start
# before they wait, so a claim that committed after the previous settle can still show a
# started_at a few ms before that settle's finished_at.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
FIX=$LEASH_SRC/tests/fixtures/scheduler
QT=agent_work_queue

# A fresh migrated database with `execs` (one row per execution) and `marks` (moments a case
# notes down, on the server's clock).
sched_setup() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
  q "create table execs (
       id bigserial primary key, task_id bigint not null, attempt int not null,
       worker text not null, tenant text, shard text,
       started timestamptz not null default clock_timestamp(), finished timestamptz);
     create table marks (what text primary key, at timestamptz not null default clock_timestamp(),
                         note text)" >/dev/null
}

# Executions of one shard that overlap in time (execs, server clock): one line each.
exec_overlaps() {
  q "select string_agg(format('%s/%s: task %s [%s, %s] (%s) and task %s [%s, %s] (%s)',
            a.tenant, a.shard, a.task_id, a.started, a.finished, a.worker,
            b.task_id, b.started, b.finished, b.worker), E'\n')
       from execs a join execs b
         on a.tenant = b.tenant and a.shard = b.shard and a.id < b.id
        and a.started < coalesce(b.finished, 'infinity')
        and b.started < coalesce(a.finished, 'infinity')
      ${1:+where $1}"
}

# The heads' invariant, one line per shard that breaks it (empty when it holds): never a head
# on a row that is not pending, at most MAX (default 1) pending heads per shard, and a shard
# with pending rows has a head or a lease (else nothing would ever claim it).
heads_violations() {
  local max=${1:-1}
  q "select string_agg(format('%s/%s: heads %s (on non-pending rows %s), leased %s, pending %s',
            tenant_id, shard_key, heads, bad, leased, pending), E'\n')
       from (select tenant_id, shard_key,
                    count(*) filter (where is_head) heads,
                    count(*) filter (where is_head and status <> 'pending') bad,
                    count(*) filter (where status = 'leased') leased,
                    count(*) filter (where status = 'pending') pending
               from $QT group by 1, 2) s
      where bad > 0 or heads > $max or (pending > 0 and heads = 0 and leased = 0)"
}

assert_heads_invariant() {
  assert_eq "shards breaking the heads' invariant ($1)" "$(heads_violations "${2:-1}")" ""
}

# drain_checking DESC TIMEOUT WANT_COUNTS [MAX_HEADS]: waits until the queue's counts are
# WANT_COUNTS (status_counts), checking the heads' invariant on every look.
drain_checking() {
  local desc=$1 timeout=$2 want=$3 max=${4:-1} deadline v
  deadline=$(($(_t_now_us) + timeout * 1000000))
  while :; do
    v=$(heads_violations "$max")
    [[ -z $v ]] || fail "heads' invariant broken while draining ($desc):"$'\n'"$v"$'\n'"queue: $(status_counts)"
    [[ $(status_counts) != "$want" ]] || return 0
    (($(_t_now_us) < deadline)) || fail "timeout (${timeout}s) waiting for $desc: queue $(status_counts), want $want"$'\n'"$(q "select tenant_id || '/' || shard_key || ' ' || status || ' head=' || coalesce(is_head::text, 'NULL') || ' n=' || count(*) from $QT where status in ('pending', 'leased') group by tenant_id, shard_key, status, is_head order by 1 limit 20")"
    sleep 0.05
  done
}

# True while a producer holds a hand-over lock (shared, the two-key advisory space).
PRODUCER_HOLDS="select exists (select 1 from pg_locks where locktype = 'advisory' and mode = 'ShareLock'
                                and granted and objsubid = 2)"

_cont() { kill -CONT "$1" 2>/dev/null || true; }

stop_workers() {
  local w
  for w in "$@"; do kill -TERM "${W_PID[$w]}" 2>/dev/null || true; done
  for w in "$@"; do assert_worker_exit "$w" 30 0; done
}

# ------------------------------------------------------------------ 1. exclusion with heads

# 3 processes x 4 slots drain 2,000 tasks in 20 shards enqueued shard by shard (each shard one
# block of 100): every task runs exactly once and no two executions (nor leases) of a shard
# overlap, while different shards run at once across the processes.
case_exclusion_holds_with_shards_enqueued_in_blocks() {
  sched_setup
  seq 0 1999 | awk '{ printf "{\"tenant_id\":\"t\",\"shard_key\":\"s%d\",\"payload\":{\"min\":0.002,\"max\":0.005}}\n", int($1 / 100) }' \
    >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 2000
  assert_eq "heads after the enqueue (one per shard)" \
    "$(q "select count(*) || '/' || count(distinct shard_key) from $QT where is_head")" "20/20"
  local w
  for w in A B C; do
    start_worker "$w" "$FIX/record.lua" --concurrency 4 --until-empty --poll-ms 10-50
  done
  for w in A B C; do assert_worker_exit "$w" 120 0; done
  assert_eq "queue after the batch" "$(status_counts)" "done=2000"
  assert_eq "executions / distinct tasks executed" \
    "$(q 'select count(*) || $$/$$ || count(distinct task_id) from execs')" "2000/2000"
  assert_eq "rows with attempts <> 1" "$(q "select count(*) from $QT where attempts <> 1")" 0
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
  assert_eq "workers that executed tasks" "$(q 'select count(distinct worker) from execs')" 3
  assert_eq "executions of other shards that overlapped across processes" \
    "$(q "select exists (select 1 from execs a join execs b on a.shard <> b.shard
                          and a.started < b.finished and b.started < a.finished
                          and a.worker <> b.worker)")" t
  assert_heads_invariant "after the drain"
  assert_no_sanitizer_reports
}

# Two psql producers insert into the same 10 shards while 3 workers drain them: one commits a
# row at a time, the other blocks of 20 rows over the 10 shards per transaction. Heads are
# made by the triggers only; nothing is lost, nothing runs twice, no shard overlaps.
case_plain_sql_producers_racing_the_workers_keep_exclusion() {
  sched_setup
  q "insert into $QT (tenant_id, shard_key, payload)
     select 't', 'p' || (g % 10), '{\"min\":0.002,\"max\":0.005}' from generate_series(1, 50) g" >/dev/null
  local w
  for w in A B C; do
    start_worker "$w" "$FIX/record.lua" --concurrency 4 --poll-ms 10-50
  done
  local ins="insert into $QT (tenant_id, shard_key, payload) values"
  # shellcheck disable=SC2016
  {
    for i in $(seq 1 600); do
      echo "$ins ('t', 'p$((i % 10))', '{\"min\":0.002,\"max\":0.005,\"by\":1}');"
    done
  } | psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$T_TMP/p1.out" 2>&1 &
  local p1=$!
  {
    for _ in $(seq 1 30); do
      echo "begin;"
      echo "insert into $QT (tenant_id, shard_key, payload)
            select 't', 'p' || (g % 10), '{\"min\":0.002,\"max\":0.005,\"by\":2}'
              from generate_series(1, 20) g;"
      echo "select pg_sleep(0.01);"
      echo "commit;"
    done
  } | psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$T_TMP/p2.out" 2>&1 &
  local p2=$!
  wait "$p1" || fail "producer 1 failed: $(cat "$T_TMP/p1.out")"
  wait "$p2" || fail "producer 2 failed: $(cat "$T_TMP/p2.out")"
  drain_checking "1,250 tasks done" 60 "done=1250"
  stop_workers A B C
  assert_eq "executions / distinct tasks executed" \
    "$(q 'select count(*) || $$/$$ || count(distinct task_id) from execs')" "1250/1250"
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
  assert_no_sanitizer_reports
}

# A producer inserts into a busy shard (its task runs 3 s, so the insert lands while it runs
# even on a loaded machine) and keeps its transaction open for ~1 s past the end
# of the running task: that task's settle cannot take the shard's hand-over lock, so the host
# writes it again later ('settle again', src/dispatch.c). It completes once the producer
# commits; the producer's row then runs, after it; other shards ran on meanwhile.
case_producer_holding_a_busy_shard_open_delays_the_settle_and_loses_nothing() {
  sched_setup
  local held
  held=$(q "insert into $QT (tenant_id, shard_key, payload)
            values ('t', 'held', '{\"min\":3,\"max\":3}') returning id")
  # 8 filler lanes of 200 tasks of 20-30 ms: about 5 s each, so they still run while the
  # producer holds the shard (from the held task's end, at 3 s, for 1 s).
  seq 0 1599 | awk '{ printf "{\"tenant_id\":\"t\",\"shard_key\":\"f%d\",\"payload\":{\"min\":0.02,\"max\":0.03}}\n", $1 % 8 }' \
    >"$T_TMP/filler.jsonl"
  enqueue_file "$T_TMP/filler.jsonl" 1600
  local w
  for w in A B; do
    start_worker "$w" "$FIX/record.lua" --concurrency 4 --poll-ms 10-50
  done
  wait_for "the held shard's task to start" 20 q_true \
    "select count(*) = 1 from execs where task_id = $held"
  psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$T_TMP/producer.out" 2>&1 <<SQL &
begin;
insert into $QT (tenant_id, shard_key, payload) values ('t', 'held', '{"min":0.01,"max":0.01}');
insert into marks (what) values ('inserted');
-- Each statement reads with a new snapshot: wait (10 s at most) for the task's end.
do \$\$ begin
  for i in 1..200 loop
    exit when exists (select 1 from execs where task_id = $held and finished is not null);
    perform pg_sleep(0.05);
  end loop;
end \$\$;
select pg_sleep(1);
insert into marks (what, note) select 'commit', status from $QT where id = $held;
commit;
SQL
  local prod=$!
  wait "$prod" || fail "the producer failed: $(cat "$T_TMP/producer.out")"
  drain_checking "1,602 tasks done" 60 "done=1602"
  stop_workers A B
  assert_eq "the held task's row just before the producer's commit (settle not written)" \
    "$(q "select note from marks where what = 'commit'")" leased
  assert_eq "the held task's handler ended >= 0.9 s before the commit" \
    "$(q "select e.finished < m.at - interval '0.9 s' from execs e, marks m
           where e.task_id = $held and m.what = 'commit'")" t
  assert_eq "the held task settled after the producer's commit" \
    "$(q "select q.finished_at > m.at from $QT q, marks m where q.id = $held and m.what = 'commit'")" t
  assert_eq "the producer's row ran after the held task settled" \
    "$(q "select e.started > h.finished_at from execs e join $QT p on p.id = e.task_id, $QT h
           where p.shard_key = 'held' and p.id <> $held and h.id = $held")" t
  assert_eq "other shards' tasks finished while the producer held the shard" \
    "$(q "select count(*) > 0 from execs e, marks m, execs h
           where m.what = 'commit' and h.task_id = $held and e.shard <> 'held'
             and e.finished > h.finished and e.finished < m.at")" t
  assert_eq "executions / distinct tasks executed" \
    "$(q 'select count(*) || $$/$$ || count(distinct task_id) from execs')" "1602/1602"
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
  assert_no_sanitizer_reports
}

# SIGTERM while a task's settle waits for a producer that holds its shard (4 s, longer than
# --drain-timeout 1): the drain still ends within --drain-timeout + 2 s (run --help), and
# nothing is lost: once the producer commits, both of the shard's tasks end up done (the
# held one written by the drain, or reaped after its 3 s lease and run again).
case_a_drain_ends_on_time_while_a_producer_holds_a_settling_shard() {
  sched_setup
  local held
  held=$(q "insert into $QT (tenant_id, shard_key, payload)
            values ('t', 'held', '{\"min\":0.3,\"max\":0.3,\"await_producer\":true}')
            returning id")
  start_worker A "$FIX/record.lua" --concurrency 2 --visibility 3s --heartbeat 500ms \
    --drain-timeout 1 --poll-ms 10-50
  wait_for "the held shard's task to start" 20 q_true \
    "select count(*) = 1 from execs where task_id = $held"
  psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$T_TMP/producer.out" 2>&1 <<SQL &
begin;
insert into $QT (tenant_id, shard_key, payload) values ('t', 'held', '{"min":0.01,"max":0.01}');
insert into marks (what) values ('inserted');
do \$\$ begin
  for i in 1..200 loop
    exit when exists (select 1 from execs where task_id = $held and finished is not null);
    perform pg_sleep(0.05);
  end loop;
end \$\$;
select pg_sleep(4);
insert into marks (what, note) select 'commit', status from $QT where id = $held;
commit;
SQL
  local prod=$!
  t_on_exit t_kill "$prod"
  wait_for "the held task's handler to end inside the producer's transaction" 10 q_true \
    "select exists (select 1 from execs where task_id = $held and finished is not null)
        and ($PRODUCER_HOLDS)"
  local t0
  t0=$(_t_now_us)
  kill -TERM "${W_PID[A]}"
  assert_worker_exit A 10 0
  local ms=$((($(_t_now_us) - t0) / 1000))
  echo "# drain took $ms ms (the producer still held the shard: $(q "select count(*) = 0 from marks where what = 'commit'"))" >&2
  ((ms <= 3000)) || fail "the drain took $ms ms with --drain-timeout 1 (want <= 3,000)"
  wait "$prod" || fail "the producer failed: $(cat "$T_TMP/producer.out")"
  start_worker B "$FIX/record.lua" --concurrency 2 --poll-ms 10-50 --until-empty
  assert_worker_exit B 20 0
  assert_eq "the shard's tasks" "$(q "select string_agg(status, ',') from $QT where shard_key = 'held'")" "done,done"
  echo "# executions of the held task: $(q "select count(*) from execs where task_id = $held")" >&2
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
}

# A lease reaped to dead (its worker was killed, max_attempts 1) while a producer holds the
# shard with a row inserted behind it: once the producer commits, its row must run (the
# reap's hand-over must not miss it and leave the shard without a head for the 5 minutes
# until the next repair_heads).
case_a_lease_reaped_to_dead_while_a_producer_holds_its_shard_hands_over() {
  sched_setup
  local held
  held=$(q "insert into $QT (tenant_id, shard_key, payload, max_attempts)
            values ('t', 'r', '{\"min\":30,\"max\":30}', 1) returning id")
  start_worker A "$FIX/record.lua" --concurrency 1 --visibility 2s --heartbeat 500ms --poll-ms 10-50
  wait_for "the task to start" 20 q_true "select count(*) = 1 from execs where task_id = $held"
  kill -KILL "${W_PID[A]}"
  wait_worker A 10
  psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$T_TMP/producer.out" 2>&1 <<SQL &
begin;
insert into $QT (tenant_id, shard_key, payload) values ('t', 'r', '{"min":0.01,"max":0.01}');
insert into marks (what) values ('inserted');
do \$\$ begin
  for i in 1..60 loop
    exit when exists (select 1 from $QT where id = $held and status <> 'leased');
    perform pg_sleep(0.05);
  end loop;
end \$\$;
insert into marks (what, note) select 'commit', status from $QT where id = $held;
commit;
SQL
  local prod=$!
  t_on_exit t_kill "$prod"
  wait_for "the producer to hold the shard's hand-over lock" 10 q_true "$PRODUCER_HOLDS"
  start_worker B "$FIX/record.lua" --concurrency 1 --visibility 2s --heartbeat 500ms --poll-ms 10-50
  wait "$prod" || fail "the producer failed: $(cat "$T_TMP/producer.out")"
  # The reaper either reaped it before the producer took the lock (then the producer's row is
  # behind a dead task, and the recheck after its lock made it the head) or leaves it for
  # its next pass while the producer holds the shard (then the reap hands over, after the
  # commit): both end with the producer's row run.
  local note
  note=$(q "select note from marks where what = 'commit'")
  [[ $note == dead || $note == leased ]] || fail "the reaped task when the producer committed: $note"
  drain_checking "the producer's row to run" 15 "dead=1 done=1"
  stop_workers B
}

# ------------------------------------------------------------------ 2. lane order

# Within a shard tasks run in (run_after, id) order. The rows are inserted in one statement
# per shard in random order, with past run_after values that tie often (whole seconds), so
# id order and run_after order disagree: the claims (started_at, and the executions) of each
# shard must follow (run_after, id).
case_lane_runs_in_run_after_then_id_order() {
  sched_setup
  q "insert into $QT (tenant_id, shard_key, payload, run_after)
     select 't', 'l' || s, '{\"min\":0.001,\"max\":0.003}',
            now() - make_interval(secs => floor(random() * 20))
       from generate_series(0, 9) s, generate_series(1, 40) g
      order by random()" >/dev/null
  local w
  for w in A B; do
    start_worker "$w" "$FIX/record.lua" --concurrency 4 --until-empty --poll-ms 10-50
  done
  for w in A B; do assert_worker_exit "$w" 60 0; done
  assert_eq "queue after the batch" "$(status_counts)" "done=400"
  # Per shard: the rank by claim must be the rank by (run_after, id).
  assert_eq "tasks claimed out of (run_after, id) order, per shard" \
    "$(q "select coalesce(string_agg(format('%s: task %s (run_after %s) claimed #%s, lane position #%s',
                   shard_key, id, run_after, by_claim, by_lane), E'\n' order by shard_key, by_lane), '')
            from (select shard_key, id, run_after,
                         rank() over (partition by shard_key order by started_at) by_claim,
                         rank() over (partition by shard_key order by run_after, id) by_lane
                    from $QT) x
           where by_claim <> by_lane")" ""
  assert_eq "executions out of (run_after, id) order, per shard" \
    "$(q "select count(*) from (select e.shard, rank() over (partition by e.shard order by e.started) a,
                                     rank() over (partition by e.shard order by q.run_after, q.id) b
                                from execs e join $QT q on q.id = e.task_id) x where a <> b")" 0
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
  assert_no_sanitizer_reports
}

# Rows enqueued while the workers run, by two producers into the same 5 shards, one row per
# transaction: each producer's rows run in the order it committed them (among rows of
# different producers only commit order is defined: a row's run_after is its transaction's
# start, its id is drawn later, and either may commit first).
case_lane_order_holds_for_rows_inserted_while_running() {
  sched_setup
  local w
  for w in A B; do
    start_worker "$w" "$FIX/record.lua" --concurrency 4 --poll-ms 10-50
  done
  local p pids=()
  for p in 1 2; do
    { for i in $(seq 1 200); do
        echo "insert into $QT (tenant_id, shard_key, payload) values ('t', 'o$((i % 5))', '{\"min\":0.001,\"max\":0.004,\"by\":$p}');"
      done; } | psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail "a producer failed"; done
  drain_checking "400 tasks done" 30 "done=400"
  stop_workers A B
  assert_eq "tasks of one producer started out of its commit order, per shard" \
    "$(q "select count(*) from (select rank() over (partition by q.shard_key, q.payload->>'by' order by e.started) a,
                                     rank() over (partition by q.shard_key, q.payload->>'by' order by q.id) b
                                from $QT q join execs e on e.task_id = q.id) x where a <> b")" 0
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
}

# One INSERT of several rows of a shard whose run_after values are not in id order: the head
# is the oldest by (run_after, id), as the header of sql/011 defines it, whichever row the
# statement inserted first.
case_the_oldest_row_of_a_multi_row_insert_is_its_shards_head() {
  sched_setup
  q "insert into $QT (tenant_id, shard_key, payload, run_after)
     values ('t', 'm', '{\"n\":1}', now()), ('t', 'm', '{\"n\":2}', now() - interval '1 minute')" >/dev/null
  assert_eq "the head of the shard (payload n)" \
    "$(q "select string_agg(payload->>'n', ',') from $QT where is_head")" 2
}

# A shard's row that is due does not wait behind a row of its shard scheduled an hour later
# (SPEC: a claim takes runnable rows, oldest (run_after, id) first; a shard only excludes
# concurrent runs). Both orders of insertion, by `leash enqueue` (its own statements).
case_a_delayed_row_does_not_hold_back_a_due_row_of_its_shard() {
  sched_setup
  expect_exit 0 "$LEASH" enqueue --tenant t --shard later --delay 3600 '{"min":0.001,"max":0.001}'
  expect_exit 0 "$LEASH" enqueue --tenant t --shard later '{"min":0.001,"max":0.001}'
  local due
  due=$(<"$T_OUT")
  start_worker A "$FIX/record.lua" --concurrency 2 --poll-ms 10-50
  wait_for "the due row (task $due) to run though a row of its shard is scheduled in an hour" 10 \
    q_true "select status = 'done' from $QT where id = $due"
  assert_eq "the delayed row" "$(q "select status from $QT where shard_key = 'later' and id <> $due")" pending
  stop_workers A
}

# The same with a retry: a task that failed and waits out its backoff (an hour here) does not
# hold back a row enqueued into its shard afterwards.
case_a_retry_waiting_its_backoff_does_not_hold_back_its_shard() {
  sched_setup
  local first
  first=$(q "insert into $QT (tenant_id, shard_key, payload) values ('t', 'flaky', '{\"retry\":3600}') returning id")
  start_worker A "$FIX/record.lua" --concurrency 2 --poll-ms 10-50
  wait_for "the first task to fail and wait for its retry" 10 q_true \
    "select status = 'pending' and attempts = 1 from $QT where id = $first"
  local next
  next=$(q "insert into $QT (tenant_id, shard_key, payload) values ('t', 'flaky', '{}') returning id")
  wait_for "the shard's new row (task $next) to run while the retry waits" 10 q_true \
    "select status = 'done' from $QT where id = $next"
  stop_workers A
}

# The JSONL field priority reaches the row (enqueue --file), and the default is 0.
case_jsonl_priority_reaches_the_row() {
  sched_setup
  printf '{"payload":{},"priority":10}\n{"payload":{}}\n{"payload":{},"priority":-3}\n' >"$T_TMP/p.jsonl"
  enqueue_file "$T_TMP/p.jsonl" 3
  assert_eq "priorities in id order" "$(q "select string_agg(priority::text, ',' order by id) from $QT")" "10,0,-3"
}

# ------------------------------------------------------------------ 3. fairness

# fair_run WEIGHT_A [LANES]: tenant A's 3,000 tasks are enqueued first, B's 300 after (ids
# behind all of A's); 2 processes x 4 slots of 5 ms tasks. A's tasks are on shards of their
# own, or on LANES shards enqueued lane by lane (task i on shard i / (3000 / LANES)). Prints
# B's share (percent) of the claims made until B's last claim, while both tenants had work,
# in SHARE.
fair_run() {
  if (($1 != 1)); then
    q "insert into ${QT}_tenants (tenant_id, weight) values ('A', $1)" >/dev/null
  fi
  seq 0 2999 | awk -v lanes="${2:-0}" '{ printf "{\"tenant_id\":\"A\",\"shard_key\":\"a%d\",\"payload\":{\"min\":0.005,\"max\":0.005}}\n", (lanes > 0 ? int($1 / (3000 / lanes)) : $1) }' \
    >"$T_TMP/a.jsonl"
  seq 0 299 | awk '{ printf "{\"tenant_id\":\"B\",\"shard_key\":\"b%d\",\"payload\":{\"min\":0.005,\"max\":0.005}}\n", $1 }' \
    >"$T_TMP/b.jsonl"
  enqueue_file "$T_TMP/a.jsonl" 3000
  enqueue_file "$T_TMP/b.jsonl" 300
  local w
  for w in A B; do
    start_worker "$w" "$FIX/record.lua" --concurrency 4 --poll-ms 10-50
  done
  wait_for "B's 300 tasks to be done" 60 q_true \
    "select count(*) = 300 from $QT where tenant_id = 'B' and status = 'done'"
  stop_workers A B
  SHARE=$(q "select round(100.0 * count(*) filter (where tenant_id = 'B') / count(*))
       from $QT where started_at <= (select max(started_at) from $QT where tenant_id = 'B')")
  echo "# claims in the window: $(q "select string_agg(tenant_id || '=' || n, ' ') from (select tenant_id, count(*) n from $QT where started_at <= (select max(started_at) from $QT where tenant_id = 'B') group by 1 order by 1) x")" >&2
}

case_equal_weights_give_the_later_tenant_half_the_claims() {
  sched_setup
  local share
  fair_run 1
  share=$SHARE
  echo "# B's share of the claims while both had work: $share%" >&2
  ((share >= 40 && share <= 60)) || fail "B's share of the claims while both had work: $share% (want 50% +- 10)"
  assert_no_sanitizer_reports
}

case_weights_3_to_1_give_the_heavier_tenant_three_quarters() {
  sched_setup
  local share
  fair_run 3
  share=$SHARE
  echo "# B's share of the claims while both had work (A weight 3): $share%" >&2
  ((share >= 15 && share <= 35)) || fail "B's share with weights A=3 B=1: $share% (want 25% +- 10, A 75%)"
  assert_no_sanitizer_reports
}

# The same with A's tasks in 16 lanes enqueued lane by lane (more lanes than slots), each
# running one task at a time. A settle could lease its lane's next row to its worker (sql/029),
# and a lane's next row is older than the other lanes' heads, so without the gate on other
# tenants' heads A's first lanes went on from settle to settle and B got 27-30% of the
# claims; with it, the ring divides them as before.
case_equal_weights_hold_while_lanes_could_lease_their_next_rows() {
  sched_setup
  local share
  fair_run 1 16
  share=$SHARE
  echo "# B's share of the claims while both had work (A in 16 lanes): $share%" >&2
  ((share >= 40 && share <= 60)) || fail "B's share of the claims while both had work: $share% (want 50% +- 10)"
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
  assert_no_sanitizer_reports
}

# The ring divides claims by weight whatever the claims' sizes: one process's successive
# claims (the queue's own <table>_claim, carrying its ring position) of 4, 3, 2, 1, 4, ...
# rows, as a worker makes them when its slots free up unevenly, with A at weight 3 and 2,000
# own-shard heads in each of A and B: A gets 75% +- 5 of them. (Claims of one size do give
# 75%; the deficit is counted in units of the current claim's size, so a small claim after a
# large one cuts the heavier tenant's turn.)
case_weights_hold_over_claims_of_varying_sizes() {
  sched_setup
  q "insert into $QT (tenant_id, shard_key, payload)
       select t, t || g, '{}' from generate_series(1, 2000) g, (values ('A'), ('B')) v(t);
     insert into ${QT}_tenants (tenant_id, weight) values ('A', 3)" >/dev/null
  local got
  got=$(psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$DATABASE_URL" <<SQL
create temp table tally (tenant text);
do \$\$
declare ring text; lft int := 0; r record;
begin
  for i in 1..300 loop
    for r in select * from ${QT}_claim('w', 1 + (i * 7) % 4, 60, NULL, NULL, ring, lft) loop
      if r.id is null then ring := r.ring; lft := r.ring_left;
      else insert into tally values (r.tenant_id); end if;
    end loop;
  end loop;
end \$\$;
select count(*) filter (where tenant = 'A') || ' ' || count(*) from tally;
SQL
  )
  local a=${got% *} n=${got#* }
  echo "# A's share over claims of 4, 3, 2, 1 rows: $a of $n" >&2
  ((a * 100 >= 70 * n && a * 100 <= 80 * n)) || fail "A (weight 3) got $a of $n claimed rows ($((a * 100 / n))%; want 75% +- 5)"
}

# ------------------------------------------------------------------ 4. priority

# 2,000 priority-0 tasks of one tenant are queued and one worker runs them (4 slots, claims of
# at most 16); a priority-10 task inserted meanwhile is in the first claim made after its
# commit, and at most claim batch + slots tasks start between its commit and its start.
case_a_priority_task_overtakes_the_queued_backlog() {
  sched_setup
  q "insert into $QT (tenant_id, shard_key, payload)
     select 't', 'k' || g, '{\"min\":0.005,\"max\":0.005}' from generate_series(1, 2000) g" >/dev/null
  start_worker A "$FIX/record.lua" --concurrency 4 --claim-batch 16 --poll-ms 10-50
  wait_for "200 tasks to be done" 30 q_true "select count(*) >= 200 from $QT where status = 'done'"
  local hot
  hot=$(q "insert into $QT (tenant_id, shard_key, payload, priority)
           values ('t', 'hot', '{\"min\":0.005,\"max\":0.005}', 10) returning id")
  q "insert into marks (what) values ('committed')" >/dev/null
  wait_for "the priority-10 task to be done" 20 q_true "select status = 'done' from $QT where id = $hot"
  stop_workers A
  local claims starts
  claims=$(q "select count(distinct q.started_at) from $QT q, marks m, $QT h
               where m.what = 'committed' and h.id = $hot and q.id <> $hot
                 and q.started_at > m.at and q.started_at < h.started_at")
  starts=$(q "select count(*) from $QT q, marks m, $QT h
               where m.what = 'committed' and h.id = $hot and q.id <> $hot
                 and q.run_started_at > m.at and q.run_started_at < h.run_started_at")
  echo "# after the priority-10 commit: $claims claims, $starts starts before it" >&2
  assert_eq "claims made after the priority-10 task's commit that did not take it" "$claims" 0
  ((starts <= 16 + 4)) || fail "tasks started between the priority-10 commit and its start: $starts (want <= 20)"
  assert_no_sanitizer_reports
}

# The same with the backlog in 16 lanes enqueued lane by lane, so that settles could lease
# their lanes' next rows to the worker (sql/029; a lane's next row is older than the other
# lanes' heads) and cover all it wants, with no claim made: the priority-10 head stops that
# (a head of its tenant that a claim would take first), and it runs at the next claim.
# (Without that gate 44-56 tasks started before it.)
case_a_priority_task_overtakes_lanes_that_could_lease_their_next_rows() {
  sched_setup
  q "insert into $QT (tenant_id, shard_key, payload)
     select 't', 'lane' || (g / 125), '{\"min\":0.005,\"max\":0.005}' from generate_series(0, 1999) g" >/dev/null
  start_worker A "$FIX/record.lua" --concurrency 4 --claim-batch 16 --poll-ms 10-50
  wait_for "200 tasks to be done" 30 q_true "select count(*) >= 200 from $QT where status = 'done'"
  local hot
  hot=$(q "insert into $QT (tenant_id, shard_key, payload, priority)
           values ('t', 'hot', '{\"min\":0.005,\"max\":0.005}', 10) returning id")
  q "insert into marks (what) values ('committed')" >/dev/null
  wait_for "the priority-10 task to be done" 20 q_true "select status = 'done' from $QT where id = $hot"
  stop_workers A
  local starts
  starts=$(q "select count(*) from $QT q, marks m, $QT h
               where m.what = 'committed' and h.id = $hot and q.id <> $hot
                 and q.run_started_at > m.at and q.run_started_at < h.run_started_at")
  echo "# after the priority-10 commit: $starts starts before it" >&2
  ((starts <= 16 + 4)) || fail "tasks started between the priority-10 commit and its start: $starts (want <= 20)"
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
  assert_no_sanitizer_reports
}

# No hoarding with lanes (issue #14's leases target, which bench/run.sh measures on shards of
# their own): one process of 2 slots running 8 lanes of 2 ms and (1 in 4) 150 ms tasks, whose
# settles lease their lanes' next rows (sql/029), holds at most 2 x its slots, sampled every
# 20 ms while it drains (3 here). What bounds it is that a settle leases at most one next row
# per task it settles; the cap on those leases (the worker's want) did not change the figure
# when lifted.
case_a_worker_running_lanes_holds_at_most_twice_its_slots() {
  sched_setup
  q "insert into $QT (tenant_id, shard_key, payload)
     select 't', 'lane' || (g / 50),
            case when g % 4 = 0 then '{\"min\":0.15,\"max\":0.15}'
                 else '{\"min\":0.002,\"max\":0.002}' end::jsonb
       from generate_series(0, 399) g" >/dev/null
  start_worker A "$FIX/record.lua" --concurrency 2 --poll-ms 10-50
  local most=0 n deadline=$(($(_t_now_us) + 60000000))
  while :; do
    n=$(q "select count(*) from $QT where status = 'leased'")
    ((n > most)) && most=$n
    [[ $(q "select count(*) from $QT where status = 'done'") != 400 ]] || break
    (($(_t_now_us) < deadline)) || fail "timeout (60s) draining 400 tasks in 8 lanes: $(status_counts)"
    sleep 0.02
  done
  stop_workers A
  echo "# most leases held at once: $most" >&2
  ((most <= 4)) || fail "leases held at once by a process of 2 slots: $most (want <= 4)"
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
  assert_no_sanitizer_reports
}

# A row whose lease a user trigger refuses sends the cycle to its row-by-row fallback
# (<table>_cycle_rows): that row is set aside (dead, bad_row) and the others still run.
case_a_row_whose_lease_is_refused_does_not_stop_the_claims() {
  sched_setup
  q "create function refuse() returns trigger language plpgsql as \$\$
     begin
       if NEW.shard_key = 'bad' and NEW.status = 'leased' then
         raise exception 'refused by a user trigger';
       end if;
       return NEW;
     end \$\$;
     create trigger refuse before update on $QT for each row execute function refuse();
     insert into $QT (tenant_id, shard_key, payload) values ('t', 'bad', '{}');
     insert into $QT (tenant_id, shard_key, payload)
       select 't', 'k' || g, '{\"min\":0.001,\"max\":0.002}' from generate_series(1, 20) g" >/dev/null
  start_worker A "$FIX/record.lua" --concurrency 4 --claim-batch 8 --until-empty --poll-ms 10-50
  assert_worker_exit A 20 0
  assert_eq "queue after the run" "$(status_counts)" "dead=1 done=20"
  assert_eq "the refused row" "$(q "select status || '|' || last_cause from $QT where shard_key = 'bad'")" "dead|bad_row"
}

# ------------------------------------------------------------------ 5. lease tokens

# A lease taken, set dead by hand and requeued (attempts back to 0), then leased again by the
# same worker id: the first lease's settle and release match nothing, though its owner and
# attempt number are those of the live lease. The live lease then settles.
case_an_old_token_matches_nothing_after_requeue() {
  sched_setup
  local id
  id=$(q "insert into $QT (tenant_id, shard_key, payload) values ('t', 'z', '{}') returning id")
  local first tok1 att1
  first=$(q "$(cycle_sql w1 '{}' '{}' '{}' 1)")
  IFS='|' read -r _ _ att1 _ tok1 <<<"$first"
  [[ -n $tok1 ]] || fail "the first claim took nothing: $first"
  q "update $QT set status = 'dead', last_error = 'by hand' where id = $id" >/dev/null
  expect_exit 0 "$LEASH" requeue --id "$id"
  local second tok2 att2
  second=$(q "$(cycle_sql w1 '{}' '{}' '{}' 1)")
  IFS='|' read -r _ _ att2 _ tok2 <<<"$second"
  [[ -n $tok2 ]] || fail "the second claim took nothing: $second"
  assert_eq "attempt numbers of both leases (the old fence could not tell them apart)" "$att2" "$att1"
  [[ $tok1 != "$tok2" ]] || fail "both leases have token $tok1"
  assert_eq "the first lease's settle (done)" "$(q "$(cycle_sql w1 "{$id}" "{$tok1}" '{done}' 0)")" ""
  assert_eq "the first lease's settle (retry)" "$(q "$(cycle_sql w1 "{$id}" "{$tok1}" '{retry}' 0)")" ""
  assert_eq "the first lease's release" \
    "$(q "select count(*) from ${QT}_release('w1', '{$id}', '{$tok1}')")" 0
  assert_eq "the row after the zombie's writes" \
    "$(q "select status || '|' || lease_owner || '|' || lease_token || '|' || attempts from $QT where id = $id")" \
    "leased|w1|$tok2|1"
  assert_eq "the live lease's settle" "$(q "$(cycle_sql w1 "{$id}" "{$tok2}" '{done}' 0)")" "t|$id|1|done|"
}

# The same through the host: worker Z (id W) runs the task and freezes (SIGSTOP); the row is
# set dead by hand and requeued, and worker Y, also with id W, leases it again and runs it
# (6 s). Z resumes while Y's lease holds: its step, child enqueue and settle all carry the old
# token and write nothing. Y's execution settles the row.
case_a_zombie_with_the_same_worker_id_writes_nothing_after_requeue() {
  sched_setup
  local id
  id=$(q "insert into $QT (tenant_id, shard_key, payload)
          values ('t', 'z', '{\"first\":2,\"again\":6,\"step\":\"s\"}') returning id")
  # Z's heartbeat is rare, so that on resuming its step and child reach the database (with
  # the old token) before a heartbeat tells the host that the lease is gone.
  start_worker Z "$FIX/record.lua" --worker-id W --concurrency 1 --visibility 60s --heartbeat 20s \
    --poll-ms 10-50
  wait_for "Z to start the task" 20 q_true "select count(*) = 1 from execs where task_id = $id"
  kill -STOP "${W_PID[Z]}"
  t_on_exit _cont "${W_PID[Z]}"
  local tok1
  tok1=$(q "select lease_token from $QT where id = $id")
  q "update $QT set status = 'dead', last_error = 'by hand' where id = $id" >/dev/null
  expect_exit 0 "$LEASH" requeue --id "$id"
  start_worker Y "$FIX/record.lua" --worker-id W --concurrency 1 --visibility 60s --heartbeat 500ms \
    --poll-ms 10-50 --until-empty
  wait_for "Y to start the task again" 20 q_true "select count(*) = 2 from execs where task_id = $id"
  local row
  row=$(q "select lease_owner || '|' || attempts || '|' || (lease_token <> $tok1)::text::char from $QT where id = $id")
  assert_eq "the live lease (owner|attempts|new token)" "$row" "W|1|t"
  local tok2
  tok2=$(q "select lease_token from $QT where id = $id")
  wait_for "Z's 2 s of work to be over" 10 q_true \
    "select clock_timestamp() > min(started) + interval '2.3 s' from execs where task_id = $id"
  kill -CONT "${W_PID[Z]}"
  wait_for "Z to notice that its lease is gone" 10 \
    eval "log_has Z 'lease lost' || log_has Z 'late outcome rejected'"
  kill -TERM "${W_PID[Z]}"
  assert_worker_exit Z 20 0
  # Y still runs (its 6 s): nothing of Z's may be in the database.
  assert_eq "Y still holds the task, with its own token, when Z is gone" \
    "$(q "select status || '|' || lease_token from $QT where id = $id")" "leased|$tok2"
  assert_eq "steps stored while Y runs (Z's would be the only one)" \
    "$(q "select count(*) from ${QT}_steps where task_id = $id")" 0
  assert_eq "children enqueued while Y runs" "$(q "select count(*) from $QT where id <> $id")" 0
  assert_worker_exit Y 30 0
  assert_eq "the row after Y (settled by Y's execution)" \
    "$(q "select q.status || '|' || (q.result->>'exec' = e.id::text)::text::char from $QT q
           join execs e on e.task_id = q.id and e.worker = 'W'
          where q.id = $id order by e.id desc limit 1")" "done|t"
  assert_eq "children: one, Y's" \
    "$(q "select count(*) || '|' || bool_and((payload->>'child_of')::bigint = (select max(id) from execs where task_id = $id))::text::char
            from $QT where id <> $id")" "1|t"
  assert_no_sanitizer_reports
}

# ------------------------------------------------------------------ 6. heads and hand-made changes

# hand_setup: 20 shards x 9 tasks of 20-40 ms (s0..s19), 2 workers x 3 slots with claims of
# at most 4 running (what they can lease, slots plus ready buffers, is fewer than the shards:
# some shards wait with a pending head at any moment); returns once the workers are under way. Each case then changes rows by hand while they run.
hand_setup() {
  sched_setup
  # HAND_SLOW=sN: that shard's tasks take 1 s each, from the start (a case that needs one of
  # them running must not race the lane's draining on a loaded machine).
  seq 0 179 | awk -v slow="${HAND_SLOW:-}" '{ k = "s" int($1 / 9); d = (k == slow) ? "1,\"max\":1" : "0.02,\"max\":0.04"
      printf "{\"tenant_id\":\"t\",\"shard_key\":\"%s\",\"payload\":{\"min\":%s}}\n", k, d }' \
    >"$T_TMP/tasks.jsonl"
  enqueue_file "$T_TMP/tasks.jsonl" 180
  local w
  for w in A B; do
    start_worker "$w" "$FIX/record.lua" --concurrency 3 --claim-batch 4 --poll-ms 10-50
  done
  wait_for "the workers to be under way" 20 q_true "select count(*) >= 10 from $QT where status = 'done'"
}

# s2_running_slow: hand_setup with 1 s tasks in s2, returning once one of them has just
# started (a case can then change that lease by hand while it runs).
s2_running_slow() {
  HAND_SLOW=s2 hand_setup
  wait_for "a 1 s task of s2 to be running" 20 q_true \
    "select count(*) = 1 from $QT q join execs e on e.task_id = q.id
      where q.shard_key = 's2' and q.status = 'leased' and e.finished is null
        and e.started > clock_timestamp() - interval '0.5 s'"
}

# by_hand DESC SQL: runs SQL (an UPDATE/DELETE ... RETURNING 1 of the row `where $HEAD`, a
# pending head of some shard, which a claim may take first) until it changed one row.
HEAD="is_head and id = (select id from $QT where is_head and shard_key like 's%' order by id limit 1)"
by_hand() {
  wait_for "$1" 10 q_true "with x as ($2) select count(*) = 1 from x"
}

case_a_pending_head_set_dead_by_hand_hands_its_shard_over() {
  hand_setup
  by_hand "a head set dead" "update $QT set status = 'dead' where $HEAD returning 1"
  assert_heads_invariant "right after"
  drain_checking "the rest to be done" 30 "dead=1 done=179"
  stop_workers A B
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
}

# The worker runs on; its settle finds the row no longer leased and writes nothing. The shard
# is handed over at once, so its next task may run beside the one still running: exclusion
# is only checked for the others.
case_a_leased_row_set_done_by_hand_while_its_worker_runs_hands_over() {
  s2_running_slow
  local id
  id=$(q "update $QT set status = 'done', last_error = 'by hand' where shard_key = 's2' and status = 'leased' returning id")
  [[ -n $id ]] || fail "no leased row of s2 to set done"
  assert_heads_invariant "right after"
  drain_checking "the rest to be done" 40 "done=180"
  stop_workers A B
  assert_eq "the row set done by hand (its worker's late settle wrote nothing)" \
    "$(q "select status || '|' || coalesce(last_error, '') || '|' || (result is null)::text::char from $QT where id = $id")" \
    "done|by hand|t"
  assert_eq "overlapping executions of one shard (but the one set done)" \
    "$(exec_overlaps "a.task_id <> $id and b.task_id <> $id")" ""
}

case_a_pending_head_deleted_hands_its_shard_over() {
  hand_setup
  by_hand "a head deleted" "delete from $QT where $HEAD returning 1"
  assert_heads_invariant "right after"
  drain_checking "the rest to be done" 30 "done=179"
  stop_workers A B
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
}

# A hand-over whose next row is leased while it waits for that row's lock (a claim scoped to a
# batch, `leash run --batch`, leases rows that are not heads; here the claim of one given row,
# p_only, does it at a chosen moment): the hand-over read the row as
# pending in its snapshot, and must not make the leased row a head (the CHECK
# leash_head_is_pending refused that, failing the statement that handed over: here, a head
# deleted by hand). The claim's session locks the row first and leases it once the DELETE
# waits for it.
case_a_row_leased_while_its_shard_is_handed_over_is_passed_over() {
  sched_setup
  local head next
  head=$(q "insert into $QT (tenant_id, shard_key, payload) values ('t', 'e', '{}') returning id")
  next=$(q "insert into $QT (tenant_id, shard_key, payload) values ('t', 'e', '{}') returning id")
  assert_eq "heads of the shard" "$(q "select string_agg(id::text, ',') from $QT where is_head")" "$head"
  PGAPPNAME=claimer psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$T_TMP/claimer.out" 2>&1 <<SQL &
begin;
select 1 from $QT where id = $next for update;
do \$\$ begin
  for i in 1..400 loop
    exit when exists (select 1 from pg_stat_activity
                       where application_name = 'by-hand' and wait_event_type = 'Lock');
    perform pg_sleep(0.025);
  end loop;
end \$\$;
select count(*) from ${QT}_claim('claimer', 1, 60, null, null, null, null, $next);
commit;
SQL
  local claimer=$!
  t_on_exit t_kill "$claimer"
  wait_for "the claimer to hold the next row's lock" 10 q_true \
    "select exists (select 1 from pg_stat_activity where application_name = 'claimer'
                     and query like '%pg_sleep%' and state = 'active')"
  expect_exit 0 env PGAPPNAME=by-hand psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
    -c "delete from $QT where id = $head"
  wait "$claimer" || fail "the claimer failed: $(cat "$T_TMP/claimer.out")"
  assert_eq "the next row" "$(q "select status || ' head=' || is_head from $QT where id = $next")" \
    "leased head=false"
  assert_heads_invariant "after the hand-over"
}

case_a_head_moved_to_another_shard_or_tenant_hands_over() {
  hand_setup
  by_hand "a head moved to a new shard" "update $QT set shard_key = 'moved' where $HEAD returning 1"
  assert_heads_invariant "after a head moved to a new shard"
  by_hand "a head moved to another tenant" "update $QT set tenant_id = 'other' where $HEAD returning 1"
  assert_heads_invariant "after a head moved to another tenant"
  drain_checking "every task to be done" 30 "done=180"
  stop_workers A B
  assert_eq "the moved rows ran" \
    "$(q "select count(*) from $QT where (shard_key = 'moved' or tenant_id = 'other') and status = 'done'")" 2
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
}

# A head moved into a shard that has a pending head of its own: two heads there (a shard's
# claims still take one lease at a time); both run, and so does the rest.
case_a_head_moved_into_a_shard_with_a_head_runs_with_it() {
  hand_setup
  # The two youngest heads: the claims take the oldest first, so these are the least likely
  # to be leased while the UPDATE waits for the row (the oldest head lost that race at every
  # try for 10 s under TSan).
  wait_for "a head moved into another shard's lane" 20 q_true \
    "with h as (select id, shard_key from $QT where is_head and shard_key like 's%'
                 order by id desc limit 2),
          t as (select shard_key from h order by id desc limit 1),
          x as (update $QT set shard_key = (select shard_key from t)
                 where is_head and id = (select min(id) from h)
                   and shard_key <> (select shard_key from t) returning 1)
     select count(*) = 1 from x"
  assert_heads_invariant "right after" 2
  drain_checking "every task to be done" 30 "done=180" 2
  stop_workers A B
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
}

# A lease given back by hand (UPDATE status = 'pending' on a leased row, as an operator frees
# a stuck task) makes the row its shard's head: it runs again; the first run's settle finds
# the row re-leased or done by then and writes nothing over it.
case_a_leased_row_made_pending_by_hand_runs_again() {
  s2_running_slow
  local id
  id=$(q "update $QT set status = 'pending', attempts = 0 where shard_key = 's2' and status = 'leased' returning id")
  [[ -n $id ]] || fail "no leased row of s2 to give back"
  assert_heads_invariant "right after"
  drain_checking "every task to be done" 40 "done=180"
  stop_workers A B
  assert_eq "executions of the row given back" "$(q "select count(*) from execs where task_id = $id")" 2
  assert_eq "overlapping executions of one shard (but the row given back)" \
    "$(exec_overlaps "a.task_id <> $id and b.task_id <> $id")" ""
}

# A pending row that is not a head moved by hand into a shard of its own has neither a head
# nor a lease there: it must still run (no trigger may leave it stranded).
case_a_waiting_row_moved_to_an_empty_shard_still_runs() {
  hand_setup
  local id
  id=$(q "update $QT set shard_key = 'alone' where id = (select max(id) from $QT where shard_key like 's%'
            and status = 'pending' and not is_head) returning id")
  [[ -n $id ]] || fail "no waiting row to move"
  assert_heads_invariant "right after"
  drain_checking "every task to be done" 30 "done=180"
  stop_workers A B
}

# Dead rows of one shard made pending by hand, in one UPDATE: one head, and they all run.
case_dead_rows_made_pending_by_hand_get_one_head_and_all_run() {
  hand_setup
  q "insert into $QT (tenant_id, shard_key, payload, status, attempts, finished_at)
     select 't', 'revived', '{\"min\":0.005,\"max\":0.01}', 'dead', 1, now() from generate_series(1, 20)" >/dev/null
  assert_eq "heads of the dead rows' shard" "$(q "select count(*) from $QT where shard_key = 'revived' and is_head")" 0
  q "update $QT set status = 'pending', attempts = 0 where shard_key = 'revived'" >/dev/null
  assert_eq "heads of the revived shard (pending or already leased)" \
    "$(q "select count(*) from $QT where shard_key = 'revived' and (is_head or status = 'leased')")" 1
  assert_heads_invariant "right after"
  drain_checking "every task to be done" 30 "done=200"
  stop_workers A B
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
}

# A plain INSERT that says is_head = false itself: the queue must still run those rows; where
# the triggers did not give the shard a head, <table>_repair_heads does.
case_rows_inserted_with_is_head_false_run_after_repair_heads() {
  hand_setup
  q "insert into $QT (tenant_id, shard_key, payload, is_head)
     select 't', 'nohead', '{\"min\":0.005,\"max\":0.01}', false from generate_series(1, 10)" >/dev/null
  local before
  before=$(q "select count(*) from $QT where shard_key = 'nohead' and (is_head or status = 'leased')")
  echo "# heads or leases of the is_head=false shard right after the insert: $before" >&2
  q "select ${QT}_repair_heads()" >/dev/null
  assert_heads_invariant "after repair_heads"
  drain_checking "every task to be done" 30 "done=190"
  stop_workers A B
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
}

# Rows restored with triggers off (session_replication_role = replica: is_head stays NULL)
# are stranded until <table>_repair_heads, which gives each shard its head; then they run.
case_rows_inserted_with_triggers_off_run_after_repair_heads() {
  hand_setup
  psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >/dev/null <<SQL
set session_replication_role = replica;
insert into $QT (tenant_id, shard_key, payload)
select 't', 'restored' || (g % 3), '{"min":0.005,"max":0.01}' from generate_series(1, 12) g;
SQL
  local made
  made=$(q "select ${QT}_repair_heads()")
  assert_eq "heads made by repair_heads (3 restored shards)" "$made" 3
  assert_heads_invariant "after repair_heads"
  drain_checking "every task to be done" 30 "done=192"
  stop_workers A B
  assert_eq "overlapping executions of one shard" "$(exec_overlaps)" ""
}

# ------------------------------------------------------------------ 6. a settle leases the next row

# lane: a shard SHARD of tenant TENANT with N pending rows (priority PRIO, due now); prints
# their ids, oldest first.
lane() {
  q "insert into $QT (tenant_id, shard_key, payload, priority)
       select '$1', '$2', '{}', ${4:-0} from generate_series(1, $3)
     returning id" | tr '\n' ' '
}

# settle_next ID [CHAIN] [TENANTS] [BATCH]: leases row ID to worker w (the claim of one given
# row, unless w holds it already), settles it done through the cycle with p_chain CHAIN
# (default 1) and the worker's scope (TENANTS a text[] literal or NULL, BATCH or NULL); prints
# the rows the settle leased to w.
settle_next() {
  q "select lease_token from $QT where id = $1 and status = 'leased' and lease_owner = 'w'
     union all
     select token from ${QT}_claim('w', 1, 60, NULL, NULL, NULL, 0, $1)
      where id = $1 and not exists (select from $QT where id = $1 and status = 'leased')" \
    >"$T_TMP/tok"
  [[ -s $T_TMP/tok ]] || fail "row $1 could not be leased"
  q "select coalesce(string_agg(c.id::text, ' ' order by c.id), '')
       from ${QT}_cycle('w', ARRAY[$1]::bigint[], ARRAY[$(cat "$T_TMP/tok")]::bigint[], '{done}',
                        '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{f}', '{NULL}', 0, 60,
                        ${3:-NULL}, ${4:-NULL}, NULL, 0, p_chain => ${2:-1}) c
      where c.settled = false and c.status = 'leased'"
}

# row_state ID: status|owner|is_head|parked (booleans as 0 or 1)
row_state() {
  q "select status || '|' || coalesce(lease_owner, '-') || '|' || is_head::int || '|' || parked::int
       from $QT where id = $1"
}

# The hand-over leases a shard's next row to the worker that settled its predecessor only
# where a claim of that worker would have taken it first (sql/029); everywhere else it makes
# the row its shard's head, as before. Each gate on its own lane, in one database.
case_a_settle_leases_the_next_row_only_where_the_claim_would_take_it_first() {
  sched_setup
  local r
  # Alone, due, unheld: leased to w, not a head; the row after it waits.
  read -ra r <<<"$(lane t a 3)"
  assert_eq "alone: leased by the settle" "$(settle_next "${r[0]}")" "${r[1]}"
  assert_eq "alone: the next row" "$(row_state "${r[1]}")" "leased|w|0|0"
  assert_eq "alone: the row after it" "$(row_state "${r[2]}")" "pending|-|0|0"
  assert_eq "alone: a row leased by the settle settles as any" "$(settle_next "${r[1]}" 0)" ""
  assert_eq "p_chain 0: handed over" "$(row_state "${r[2]}")" "pending|-|1|0"
  q "delete from $QT" >/dev/null

  # Another tenant has a head: fair shares are the ring's, so the row is handed over.
  read -ra r <<<"$(lane t a 2)"
  lane u x 1 >/dev/null
  assert_eq "another tenant's head: nothing leased" "$(settle_next "${r[0]}")" ""
  assert_eq "another tenant's head: the next row is the head" "$(row_state "${r[1]}")" "pending|-|1|0"
  # ... unless the worker does not serve that tenant.
  q "delete from $QT where tenant_id = 't'" >/dev/null
  read -ra r <<<"$(lane t a 2)"
  assert_eq "a tenant the worker does not serve: leased" \
    "$(settle_next "${r[0]}" 1 "'{t}'::text[]")" "${r[1]}"
  q "delete from $QT" >/dev/null

  # Its own tenant has a head of higher priority, or an older one of the same priority.
  read -ra r <<<"$(lane t a 2)"
  lane t hot 1 5 >/dev/null
  assert_eq "a head of higher priority: nothing leased" "$(settle_next "${r[0]}")" ""
  q "delete from $QT" >/dev/null
  lane t old 1 >/dev/null
  read -ra r <<<"$(lane t a 2)"
  assert_eq "an older head of its priority: nothing leased" "$(settle_next "${r[0]}")" ""
  q "delete from $QT" >/dev/null
  lane t old 1 >/dev/null
  read -ra r <<<"$(lane t a 2 1)"
  assert_eq "an older head of lower priority: leased" "$(settle_next "${r[0]}")" "${r[1]}"
  q "delete from $QT" >/dev/null
  # A younger head of the tenant does not stop it.
  read -ra r <<<"$(lane t a 2)"
  lane t young 1 >/dev/null
  assert_eq "a younger head: leased" "$(settle_next "${r[0]}")" "${r[1]}"
  q "delete from $QT" >/dev/null

  # A hold on the tenant that begins while its row runs: handed over and parked.
  read -ra r <<<"$(lane t a 2)"
  local tok
  tok=$(q "select token from ${QT}_claim('w', 1, 60, NULL, NULL, NULL, 0, ${r[0]}) where id = ${r[0]}")
  expect_exit 0 "$LEASH" pause --tenant t
  assert_eq "held: nothing leased" \
    "$(q "select count(*) from ${QT}_cycle('w', ARRAY[${r[0]}]::bigint[], ARRAY[$tok]::bigint[],
                '{done}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{f}', '{NULL}', 0, 60, NULL,
                NULL, NULL, 0, p_chain => 1) c where c.settled = false")" 0
  assert_eq "held: the next row is a parked head" "$(row_state "${r[1]}")" "pending|-|1|1"
  expect_exit 0 "$LEASH" resume --tenant t
  q "delete from $QT" >/dev/null

  # Not due yet: handed over (a head that waits for its time).
  read -ra r <<<"$(lane t a 2)"
  q "update $QT set run_after = now() + interval '1 hour' where id = ${r[1]}" >/dev/null
  assert_eq "not due: nothing leased" "$(settle_next "${r[0]}")" ""
  assert_eq "not due: the next row is the head" "$(row_state "${r[1]}")" "pending|-|1|0"
  q "delete from $QT" >/dev/null

  # A worker scoped to a batch claims by batch, not through heads: it leases none here.
  read -ra r <<<"$(q "insert into $QT (tenant_id, shard_key, payload, batch)
                         select 't', 'a', '{}', 'b1' from generate_series(1, 2) returning id" | tr '\n' ' ')"
  assert_eq "a batch-scoped worker: nothing leased" "$(settle_next "${r[0]}" 1 NULL "'b1'")" ""
  q "delete from $QT" >/dev/null

  # The most it may lease: two lanes settled at once with p_chain 1 lease one row.
  local a b
  read -ra a <<<"$(lane t a 2)"
  read -ra b <<<"$(lane t b 2)"
  local ta tb
  ta=$(q "select token from ${QT}_claim('w', 1, 60, NULL, NULL, NULL, 0, ${a[0]}) where id = ${a[0]}")
  tb=$(q "select token from ${QT}_claim('w', 1, 60, NULL, NULL, NULL, 0, ${b[0]}) where id = ${b[0]}")
  assert_eq "p_chain 1 over two lanes: one leased" \
    "$(q "select count(*) from ${QT}_cycle('w', ARRAY[${a[0]}, ${b[0]}]::bigint[],
                ARRAY[$ta, $tb]::bigint[], '{done,done}', '{NULL,NULL}', '{NULL,NULL}',
                '{NULL,NULL}', '{NULL,NULL}', '{f,f}', '{NULL,NULL}', 0, 60, NULL, NULL, NULL, 0,
                p_chain => 1) c where c.settled = false")" 1
  assert_eq "p_chain 1 over two lanes: the other handed over" \
    "$(q "select count(*) filter (where status = 'leased') || ' ' || count(*) filter (where is_head)
            from $QT where id in (${a[1]}, ${b[1]})")" "1 1"
  assert_heads_invariant "after the gates"
}

t_run "$@"
