-- The chaos soak's invariant checks (tests/chaos/soak.sh runs this once every worker is gone).
-- psql variables: tasks (planned), sql_every (every n with n % sql_every = 0 went in by plain
-- SQL INSERT, the others by `leash enqueue --file`), visibility (the lease, seconds).
-- Prints one line per figure; a figure with a bound ends in "ok" or "FAIL". The last line is
-- "invariants failed: N".
--
-- Sources: the queue table; execs and step_runs (written by task.lua); lease_log and
-- step_store_log (audit triggers of setup.sql: every claim/settle/reap/release of a lease and
-- every stored step, on the server's clock); produced, events and incarnations (soak.sh's
-- own records of what it enqueued, what the chaos driver did, and every worker process);
-- wlog_raw (every worker's JSON log lines).
\set ON_ERROR_STOP 1
\if :{?visibility}
\else
\set visibility 3
\endif
\pset footer off
SET client_min_messages = warning;
\o /dev/null

CREATE TEMP TABLE fig (ord serial, name text, value text, ok boolean);
CREATE FUNCTION pg_temp.fig(p_name text, p_value anyelement, p_ok boolean DEFAULT NULL)
RETURNS void LANGUAGE sql AS $$ INSERT INTO fig (name, value, ok) VALUES (p_name, p_value::text, p_ok) $$;
CREATE FUNCTION pg_temp.head(p_name text) RETURNS void LANGUAGE sql
  AS $$ INSERT INTO fig (name, value, ok) VALUES ('', NULL, NULL), ('== ' || p_name, NULL, NULL) $$;
CREATE FUNCTION pg_temp.try_jsonb(t text) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN t::jsonb;
EXCEPTION WHEN others THEN
  RETURN NULL;
END $$;

-- ------------------------------------------------------------------ inputs
CREATE TEMP TABLE wlog AS
SELECT worker, j->>'level' AS level, j->>'msg' AS msg, (j->>'task_id')::bigint AS task_id,
       (j->>'attempt')::int AS attempt, (j->>'ts')::timestamptz AS ts, line
  FROM (SELECT worker, line, pg_temp.try_jsonb(line) AS j FROM wlog_raw) s;
CREATE INDEX ON wlog (worker, task_id, attempt);

CREATE TEMP TABLE expected AS
SELECT DISTINCT n, p.via FROM produced p, generate_series(p.lo, p.hi) n
 WHERE (p.via = 'sql') = (n % :sql_every = 0);

CREATE TEMP TABLE q AS
SELECT id, (payload->>'n')::int AS n, payload->>'via' AS via, status, attempts, max_attempts,
       lease_owner, result, last_error, tenant_id, shard_key, (payload->>'fatal')::boolean AS fatal,
       payload->>'hostile' AS hostile, last_cause, crashes, max_crashes,
       payload->>'wait' AS wait, coalesce((payload->>'via_batch')::boolean, false) AS via_batch,
       -- dead with every attempt spent, the last on a fault the mock injected in the llm step
       (status = 'dead' AND NOT coalesce((payload->>'fatal')::boolean, false)
        AND attempts >= max_attempts AND last_cause = 'returned'
        AND last_error LIKE 'llm %') AS exhausted_by_mock,
       -- a waiter's wait in its attempt history; a provider-batch task's "ask" step stored
       CASE WHEN payload->>'wait' IS NOT NULL THEN
         EXISTS (SELECT 1 FROM agent_work_queue_attempts a
                  WHERE a.task_id = agent_work_queue.id AND a.kind = 'wait') END AS waited,
       CASE WHEN coalesce((payload->>'via_batch')::boolean, false) THEN
         EXISTS (SELECT 1 FROM step_store_log s
                  WHERE s.task_id = agent_work_queue.id AND s.name = 'ask') END AS asked
  FROM agent_work_queue
 WHERE NOT payload ? 'child_of';   -- the waiters' children: their own section (waits)

-- Every lease: its claim and how it ended (settle, reap or release), from lease_log.
CREATE TEMP TABLE leases AS
SELECT c.task_id, c.attempt, c.owner, c.at AS claimed_at, e.kind AS end_kind,
       e.new_status AS end_status, e.at AS ended_at, q.tenant_id, q.shard_key
  FROM lease_log c
  JOIN q ON q.id = c.task_id
  LEFT JOIN LATERAL (SELECT kind, new_status, at FROM lease_log l
                      WHERE l.task_id = c.task_id AND l.attempt = c.attempt
                        AND l.owner = c.owner AND l.seq > c.seq
                        AND l.kind IN ('settle', 'reap', 'release')
                      ORDER BY l.seq LIMIT 1) e ON true
 WHERE c.kind = 'claim';
CREATE INDEX ON leases (task_id, attempt, owner);

-- Stop intervals of worker incarnations (SIGSTOP until SIGCONT, or until killed).
CREATE TEMP TABLE stops AS
SELECT s.target AS worker, s.at AS stopped_at,
       coalesce((SELECT min(r.at) FROM events r
                  WHERE r.target = s.target AND r.kind IN ('resume', 'kill9') AND r.at >= s.at),
                'infinity') AS resumed_at
  FROM events s WHERE s.kind = 'stop';

-- Every execution with its lease, and why it was not the one that finished the task.
CREATE TEMP TABLE ex AS
SELECT e.*, l.claimed_at, l.end_kind, l.end_status, l.ended_at, NULL::text AS cause,
       (SELECT max(w.ts) FROM wlog w WHERE w.worker = e.worker AND w.task_id = e.task_id
                                        AND w.attempt = e.attempt) AS last_log_ts
  FROM execs e
  LEFT JOIN leases l ON l.task_id = e.task_id AND l.attempt = e.attempt AND l.owner = e.worker;

UPDATE ex SET cause = CASE
  WHEN claimed_at IS NULL THEN 'UNEXPLAINED: no claim of this attempt by this worker'
  WHEN end_kind IS NULL THEN 'UNEXPLAINED: its lease never ended'
  WHEN end_kind = 'settle' AND end_status IN ('done', 'dead') THEN 'final outcome: ' || end_status
  WHEN end_kind = 'settle' THEN 'retry applied (returned leash.retry)'
  WHEN end_kind = 'release' THEN 'lease released at drain (SIGTERM)'
  WHEN EXISTS (SELECT 1 FROM events v WHERE v.kind = 'kill9' AND v.target = ex.worker
                AND v.at BETWEEN ex.claimed_at AND ex.ended_at)
    THEN 'reaped: its process was killed -9'
  WHEN EXISTS (SELECT 1 FROM stops s WHERE s.worker = ex.worker
                AND s.stopped_at <= ex.ended_at AND s.resumed_at >= ex.claimed_at)
    THEN 'reaped: its process was SIGSTOPped'
  WHEN EXISTS (SELECT 1 FROM events v WHERE v.kind = 'pg_freeze'
                AND v.at BETWEEN ex.claimed_at - make_interval(secs => :visibility) AND ex.ended_at)
    THEN 'reaped: the database was frozen past the lease'
  WHEN EXISTS (SELECT 1 FROM wlog w WHERE w.worker = ex.worker AND w.task_id = ex.task_id
                AND w.attempt = ex.attempt AND w.msg LIKE 'lease lost%')
    THEN 'reaped: its worker logged "lease lost"'
  WHEN EXISTS (SELECT 1 FROM events v WHERE v.kind = 'sigterm' AND v.target = ex.worker
                AND v.at BETWEEN ex.claimed_at AND ex.ended_at)
    THEN 'reaped: its worker was draining (SIGTERM)'
  -- The watchdog ends a process with a wedged slot; what it could not settle or give back
  -- (the database down at that moment) expires like any crashed worker's lease.
  WHEN EXISTS (SELECT 1 FROM incarnations i WHERE i.worker = ex.worker AND i.rc = 3
                AND i.ended BETWEEN ex.claimed_at AND ex.ended_at)
    THEN 'reaped: its worker was restarted by its watchdog'
  ELSE 'UNEXPLAINED: reaped, but its worker was not killed, stopped or told of the loss'
END;

CREATE INDEX ON ex (tenant, shard, started);
CREATE INDEX ON ex (task_id, attempt, worker);

-- The per-task view.
CREATE TEMP TABLE per_task AS
SELECT q.id, q.status, count(ex.id) AS execs,
       count(ex.id) FILTER (WHERE ex.cause LIKE 'UNEXPLAINED%') AS unexplained,
       count(ex.id) FILTER (WHERE ex.cause LIKE 'final outcome%') AS finals
  FROM q LEFT JOIN ex ON ex.task_id = q.id
 GROUP BY q.id, q.status;

-- ------------------------------------------------------------------ tasks
SELECT pg_temp.head('tasks');
SELECT pg_temp.fig('tasks planned', :tasks);
SELECT pg_temp.fig('tasks enqueued (confirmed by the producer)', count(*)) FROM expected;
SELECT pg_temp.fig('  of which by plain SQL INSERT', count(*)) FROM expected WHERE via = 'sql';
SELECT pg_temp.fig('tasks planned but never enqueued (producer gave up)',
                   :tasks - count(*), count(*) = :tasks) FROM expected;
SELECT pg_temp.fig('rows in the queue table', count(*)) FROM q;
SELECT pg_temp.fig('done', count(*) FILTER (WHERE status = 'done')) FROM q;
SELECT pg_temp.fig('dead', count(*) FILTER (WHERE status = 'dead')) FROM q;
SELECT pg_temp.fig('  dead on purpose (fatal payload)',
                   count(*) FILTER (WHERE status = 'dead' AND fatal)) FROM q;
SELECT pg_temp.fig('  dead quarantined (poison tasks, below)',
                   count(*) FILTER (WHERE status = 'dead' AND last_cause = 'quarantined')) FROM q;
SELECT pg_temp.fig('  dead with attempts exhausted',
                   count(*) FILTER (WHERE status = 'dead' AND NOT coalesce(fatal, false)
                                      AND last_cause IS DISTINCT FROM 'quarantined')) FROM q;
SELECT pg_temp.fig('  dead after a 429 or a budget wait (must be 0 with --budget)',
                   count(*) FILTER (WHERE status = 'dead'
                                      AND (last_cause = 'budget' OR last_error LIKE '%429%')),
                   NOT EXISTS (SELECT 1 FROM chaos_config WHERE key = 'budget')
                   OR count(*) FILTER (WHERE status = 'dead'
                                         AND (last_cause = 'budget' OR last_error LIKE '%429%')) = 0)
  FROM q;
SELECT pg_temp.fig('pending or leased left (must be 0)',
                   count(*) FILTER (WHERE status IN ('pending', 'leased')),
                   count(*) FILTER (WHERE status IN ('pending', 'leased')) = 0) FROM q;
SELECT pg_temp.fig('enqueued = done + dead', format('%s = %s + %s', e.n, d.done, d.dead),
                   e.n = d.done + d.dead)
  FROM (SELECT count(*) n FROM expected) e,
       (SELECT count(*) FILTER (WHERE status = 'done') done,
               count(*) FILTER (WHERE status = 'dead') dead FROM q) d;
SELECT pg_temp.fig('lost tasks: enqueued but missing from the table (must be 0)', count(*),
                   count(*) = 0)
  FROM expected x WHERE NOT EXISTS (SELECT 1 FROM q WHERE q.n = x.n AND q.via = x.via);
SELECT pg_temp.fig('lost tasks: enqueued, never done or dead (must be 0)', count(*), count(*) = 0)
  FROM expected x JOIN q ON q.n = x.n AND q.via = x.via WHERE q.status NOT IN ('done', 'dead');
SELECT pg_temp.fig('rows nobody enqueued, or enqueued twice (must be 0)', count(*), count(*) = 0)
  FROM (SELECT n, via FROM q GROUP BY n, via
         HAVING count(*) > 1 OR NOT EXISTS (SELECT 1 FROM expected x WHERE x.n = q.n AND x.via = q.via)) s;
SELECT pg_temp.fig('attempts per task (attempts: tasks)',
                   string_agg(a || ': ' || c, ', ' ORDER BY a))
  FROM (SELECT attempts a, count(*) c FROM q GROUP BY 1) s;

-- ------------------------------------------------------------------ executions
SELECT pg_temp.head('executions (execs: one row per run of handle, written by the script)');
SELECT pg_temp.fig('executions', count(*)) FROM ex;
SELECT pg_temp.fig('executions per task (executions: tasks)',
                   string_agg(e || ': ' || c, ', ' ORDER BY e))
  FROM (SELECT execs e, count(*) c FROM per_task GROUP BY 1) s;
SELECT pg_temp.fig('done tasks without an execution (must be 0)', count(*), count(*) = 0)
  FROM per_task WHERE status = 'done' AND execs = 0;
SELECT pg_temp.fig('tasks with more than one execution', count(*)) FROM per_task WHERE execs > 1;
SELECT pg_temp.fig('  every extra execution explained', count(*))
  FROM per_task WHERE execs > 1 AND unexplained = 0;
SELECT pg_temp.fig('  some execution unexplained (must be 0)', count(*), count(*) = 0)
  FROM per_task WHERE execs > 1 AND unexplained > 0;
SELECT pg_temp.fig('executions unexplained, tasks with one execution included (must be 0)',
                   count(*), count(*) = 0) FROM ex WHERE cause LIKE 'UNEXPLAINED%';
INSERT INTO fig (name, value)
SELECT '  execution ended by: ' || cause, count(*)::text FROM ex GROUP BY cause ORDER BY count(*) DESC;
SELECT pg_temp.fig('tasks settled by more than one final outcome (must be 0)', count(*),
                   count(*) = 0) FROM per_task WHERE finals > 1;
SELECT pg_temp.fig('leases (claims) that never started an execution', count(*))
  FROM leases l WHERE NOT EXISTS (SELECT 1 FROM execs e WHERE e.task_id = l.task_id
                                     AND e.attempt = l.attempt AND e.worker = l.owner);
SELECT pg_temp.fig('executions by script version', string_agg(version || ': ' || c, ', ' ORDER BY version))
  FROM (SELECT version, count(*) c FROM ex GROUP BY 1) s;

-- ------------------------------------------------------------------ shard exclusion
SELECT pg_temp.head('shard exclusion');
INSERT INTO fig (name, value) VALUES
  ('definition: an execution''s outcome was *applied* when the fenced settle of its lease',
   NULL),
  ('  (task, attempt, worker) changed the row. Its interval is [execs.started, the settle',
   NULL),
  ('  on the server clock] (which contains [started, finished]). Within one shard no two',
   NULL),
  ('  applied executions may overlap. Executions whose lease was reaped or released are',
   NULL),
  ('  left out: a frozen or partitioned zombie may still run Lua while the next holder',
   NULL),
  ('  works, which leash allows; it only stops their side effects and discards outcomes.',
   NULL);
SELECT pg_temp.fig('shards', count(DISTINCT (tenant, shard))) FROM ex;
CREATE TEMP TABLE applied AS
SELECT task_id, attempt, worker, tenant, shard, started, finished, ended_at
  FROM ex WHERE end_kind = 'settle';
SELECT pg_temp.fig('applied executions', count(*)) FROM applied;
SELECT pg_temp.fig('applied executions overlapping another of their shard (must be 0)',
                   count(*), count(*) = 0)
  FROM (SELECT started, max(ended_at) OVER (PARTITION BY tenant, shard ORDER BY started, task_id
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) prev_end
          FROM applied) s WHERE started < prev_end;
SELECT pg_temp.fig('  same, on the script''s own [started, finished] (must be 0)', count(*),
                   count(*) = 0)
  FROM (SELECT started, max(finished) OVER (PARTITION BY tenant, shard ORDER BY started, task_id
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) prev_end
          FROM applied WHERE finished IS NOT NULL) s WHERE started < prev_end;
SELECT pg_temp.fig('leases (claim to settle/reap/release) overlapping in a shard (must be 0)',
                   count(*), count(*) = 0)
  FROM (SELECT claimed_at, max(coalesce(ended_at, 'infinity'))
                 OVER (PARTITION BY tenant_id, shard_key ORDER BY claimed_at, task_id
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) prev_end
          FROM leases) s WHERE claimed_at < prev_end;
SELECT pg_temp.fig('zombies: reaped executions still running when the next holder of their shard started (allowed)',
                   count(*))
  FROM ex z WHERE z.end_kind = 'reap'
   AND EXISTS (SELECT 1 FROM ex b WHERE b.tenant = z.tenant AND b.shard = z.shard AND b.id <> z.id
                AND b.started > z.ended_at
                AND b.started < greatest(z.finished, z.last_log_ts,
                                         (SELECT max(at) FROM step_runs r WHERE r.task_id = z.task_id
                                             AND r.attempt = z.attempt AND r.worker = z.worker)));
SELECT pg_temp.fig('side effects written after the lease ended (execs.finished, step_runs; expect 0)',
                   count(*))
  FROM ex z WHERE z.end_kind IN ('reap', 'release')
   AND (z.finished > z.ended_at
        OR EXISTS (SELECT 1 FROM step_runs r WHERE r.task_id = z.task_id AND r.attempt = z.attempt
                      AND r.worker = z.worker AND r.at > z.ended_at));

-- ------------------------------------------------------------------ late outcomes
SELECT pg_temp.head('late outcomes');
SELECT pg_temp.fig('done rows whose result is not from the row''s last lease (must be 0)',
                   count(*), count(*) = 0)
  FROM q WHERE status = 'done'
   AND (result->>'attempt' IS DISTINCT FROM attempts::text OR result->>'worker' IS DISTINCT FROM lease_owner);
SELECT pg_temp.fig('done rows whose result is not from the task''s last execution (must be 0)',
                   count(*), count(*) = 0)
  FROM q WHERE status = 'done'
   AND NOT EXISTS (SELECT 1 FROM (SELECT attempt, worker, id FROM execs e WHERE e.task_id = q.id
                                   ORDER BY started DESC, id DESC LIMIT 1) l
                    WHERE l.attempt::text = q.result->>'attempt' AND l.worker = q.result->>'worker'
                      AND l.id::text = q.result->>'exec');
SELECT pg_temp.fig('dead rows whose reason is not from the row''s last lease (must be 0)',
                   count(*), count(*) = 0)
  FROM q WHERE status = 'dead'
   AND strpos(coalesce(last_error, ''), format('[attempt=%s worker=%s]', attempts, lease_owner)) = 0
   AND last_error IS DISTINCT FROM format('lease expired (worker %s)', lease_owner)
   -- 010: a reaped lease is a crash; the one that reaches max_crashes quarantines the task.
   AND strpos(coalesce(last_error, ''), format('the lease of worker %s expired', lease_owner)) = 0
   -- the watchdog's settle of a wedged slot (a crash too): its own words, no tag.
   AND NOT (last_cause IN ('wedged', 'quarantined') AND last_error LIKE '%wedged%');
SELECT pg_temp.fig('late outcomes rejected by the fence (worker logs)', count(*))
  FROM wlog WHERE msg LIKE 'late outcome rejected%';
SELECT pg_temp.fig('outcomes discarded after a lost lease (worker logs)', count(*))
  FROM wlog WHERE msg LIKE 'outcome discarded%';
SELECT pg_temp.fig('"lease lost" lines (worker logs)', count(*)) FROM wlog WHERE msg LIKE 'lease lost%';

-- ------------------------------------------------------------------ steps
SELECT pg_temp.head('steps (step_runs: one row per run of the step function)');
CREATE TEMP TABLE sr AS
SELECT r.*, e.started AS exec_started, e.cause AS exec_cause, st.at AS stored_at,
       coalesce(st.attempt = r.attempt AND st.owner = r.worker, false) AS stored
  FROM step_runs r
  LEFT JOIN LATERAL (SELECT started, cause FROM ex WHERE ex.task_id = r.task_id
                        AND ex.attempt = r.attempt AND ex.worker = r.worker
                      ORDER BY ex.id LIMIT 1) e ON true
  LEFT JOIN step_store_log st ON st.task_id = r.task_id AND st.name = r.name;
SELECT pg_temp.fig('step runs', count(*)) FROM sr;
SELECT pg_temp.fig('steps stored (fenced inserts that committed)', count(*)) FROM step_store_log;
SELECT pg_temp.fig('steps stored twice for one task (must be 0)', count(*), count(*) = 0)
  FROM (SELECT 1 FROM step_store_log GROUP BY task_id, name HAVING count(*) > 1) s;
SELECT pg_temp.fig('step runs per task (runs: tasks)', string_agg(k || ': ' || c, ', ' ORDER BY k))
  FROM (SELECT coalesce(r.c, 0) k, count(*) c FROM q
          LEFT JOIN (SELECT task_id, count(*) c FROM step_runs GROUP BY 1) r ON r.task_id = q.id
         GROUP BY 1) s;
SELECT pg_temp.fig('steps re-run after success: run by an execution that started after the step was stored (must be 0)',
                   count(*), count(*) = 0)
  FROM sr WHERE stored_at IS NOT NULL AND NOT stored AND exec_started > stored_at;
SELECT pg_temp.fig('  runs of the step function that began after it was stored (zombies included)',
                   count(*)) FROM sr WHERE stored_at IS NOT NULL AND NOT stored AND at > stored_at;
SELECT pg_temp.fig('re-runs (runs beyond the first per task)', count(*) - count(DISTINCT task_id)) FROM sr;
INSERT INTO fig (name, value)
SELECT '  run not stored: ' || why, count(*)::text FROM (
  SELECT CASE
           WHEN answer IN ('429', '500', '502', '503', 'timeout') OR answer LIKE 'status%'
             THEN 'the LLM call failed (' || answer || '), mapped to leash.retry'
           WHEN answer = '200' THEN 'answered, but the fenced store did not happen; execution: '
                                    || coalesce(exec_cause, '?')
           ELSE 'interrupted before the answer; execution: ' || coalesce(exec_cause, '?')
         END AS why
    FROM sr WHERE NOT stored) s
 GROUP BY why ORDER BY count(*) DESC;
SELECT pg_temp.fig('done tasks without a stored step (must be 0)', count(*), count(*) = 0)
  FROM q WHERE status = 'done'
   AND NOT EXISTS (SELECT 1 FROM step_store_log s WHERE s.task_id = q.id AND s.name = 'llm');
SELECT pg_temp.fig('done tasks whose step result is not the stored one (must be 0)', count(*),
                   count(*) = 0)
  FROM q JOIN step_store_log s ON s.task_id = q.id AND s.name = 'llm'
 WHERE q.status = 'done'
   AND (q.result->>'step_attempt' IS DISTINCT FROM s.attempt::text
        OR q.result->>'step_worker' IS DISTINCT FROM s.owner);

-- ------------------------------------------------------------------ chaos and workers
SELECT pg_temp.head('chaos driver and workers');
INSERT INTO fig (name, value)
SELECT 'event: ' || kind, count(*)::text FROM events GROUP BY kind ORDER BY kind;
SELECT pg_temp.fig('worker incarnations', count(*)) FROM incarnations;
INSERT INTO fig (name, value)
SELECT '  ended by: ' || coalesce(how, '?') || coalesce(' (exit ' || rc || ')', ''), count(*)::text
  FROM incarnations GROUP BY how, rc ORDER BY how, rc;
-- A worker whose watchdog found a slot wedged exits 3 by design, by itself or during the
-- drain a SIGTERM started (the wedged slot cannot stop); only a wedge poison task may wedge a
-- slot (below), so any other exit by itself, or non-zero exit after SIGTERM, is a failure.
-- A worker the driver SIGSTOPped while a task ran sees, once resumed, that task's handle
-- running for as long as it was stopped (the watchdog's clock ran on): a stop that ended
-- within the watchdog's limit (task timeout 5 s + grace 1 s) before the report explains it.
CREATE TEMP TABLE watchdog_exits AS
SELECT i.worker, i.how LIKE 'SIGTERM%' AS at_drain, w.task_id, q.hostile,
       EXISTS (SELECT 1 FROM stops s WHERE s.worker = i.worker AND s.stopped_at < w.ts
                  AND s.resumed_at > w.ts - interval '6 seconds') AS after_a_stop
  FROM incarnations i
  LEFT JOIN LATERAL (SELECT task_id, ts FROM wlog w WHERE w.worker = i.worker
                        AND w.msg LIKE 'watchdog: slot % is wedged%' ORDER BY ts LIMIT 1) w ON true
  LEFT JOIN q ON q.id = w.task_id
 WHERE (i.how = 'exited by itself' OR i.how LIKE 'SIGTERM%') AND i.rc = 3;
SELECT pg_temp.fig('workers restarted by their watchdog (exit 3; of them during a drain)',
                   format('%s; %s', count(*), count(*) FILTER (WHERE at_drain))) FROM watchdog_exits;
SELECT pg_temp.fig('  whose wedged task was not a wedge poison task, just after a SIGSTOP of the worker (allowed)',
                   count(*)) FROM watchdog_exits WHERE hostile IS DISTINCT FROM 'wedge' AND after_a_stop;
SELECT pg_temp.fig('  whose wedged task was not a wedge poison task otherwise (must be 0)', count(*),
                   count(*) = 0)
  FROM watchdog_exits WHERE hostile IS DISTINCT FROM 'wedge' AND NOT after_a_stop;
SELECT pg_temp.fig('workers that exited by themselves or not with 0 on SIGTERM (must be 0)',
                   count(*), count(*) = 0)
  FROM incarnations i
 WHERE ((how = 'exited by itself') OR (how LIKE 'SIGTERM%' AND rc IS DISTINCT FROM 0))
   AND NOT EXISTS (SELECT 1 FROM watchdog_exits x WHERE x.worker = i.worker);
SELECT pg_temp.fig('sanitizer reports or non-JSON lines in worker logs (must be 0)', count(*),
                   count(*) = 0) FROM wlog WHERE level IS NULL;
SELECT pg_temp.fig('hot swaps loaded (log lines, all workers)', count(*))
  FROM wlog WHERE msg LIKE 'hot swap (%): slots load version%';
SELECT pg_temp.fig('hot swaps refused (log lines, all workers)', count(*))
  FROM wlog WHERE msg LIKE 'hot swap (%) refused%';
SELECT pg_temp.fig('broken versions written / executions on a broken version (must be 0)',
                   format('%s / %s', (SELECT count(*) FROM events WHERE kind = 'swap_broken'), count(*)),
                   count(*) = 0)
  FROM ex WHERE version LIKE '%broken%'
     OR version NOT IN (SELECT detail FROM events WHERE kind = 'swap' UNION SELECT 'v1');
SELECT pg_temp.fig('broken versions refused by some worker before the fix',
                   format('%s of %s', count(*) FILTER (WHERE refused), count(*)))
  FROM (SELECT EXISTS (SELECT 1 FROM wlog w WHERE w.msg LIKE 'hot swap (%) refused%'
                         AND w.ts BETWEEN b.at AND coalesce((SELECT min(g.at) FROM events g
                                                              WHERE g.kind = 'swap' AND g.at > b.at),
                                                             'infinity')) AS refused
          FROM events b WHERE b.kind = 'swap_broken') s;
SELECT pg_temp.fig('good versions written / that ran',
                   format('%s / %s', (SELECT count(*) + 1 FROM events WHERE kind = 'swap'),
                          count(DISTINCT version))) FROM ex;
INSERT INTO fig (name, value)
SELECT '  log ' || level || ': ' || m, c::text FROM (
  SELECT level, regexp_replace(left(msg, 90), '[0-9]+', '#', 'g') m, count(*) c
    FROM wlog WHERE level IN ('warn', 'error')
   GROUP BY 1, 2 ORDER BY count(*) DESC LIMIT 15) s;

-- ------------------------------------------------------------------ hostile work
SELECT pg_temp.head('hostile work (payload.hostile, tests/chaos/task.lua)');
SELECT pg_temp.fig('poison tasks (kill / wedge)',
                   format('%s / %s', count(*) FILTER (WHERE hostile = 'kill'),
                          count(*) FILTER (WHERE hostile = 'wedge')))
  FROM q WHERE hostile IN ('kill', 'wedge');
SELECT pg_temp.fig('poison tasks not dead as quarantined (must be 0)', count(*), count(*) = 0)
  FROM q WHERE hostile IN ('kill', 'wedge')
   AND (status <> 'dead' OR last_cause IS DISTINCT FROM 'quarantined');
SELECT pg_temp.fig('poison tasks that took down more than max_crashes processes (must be 0)',
                   count(*), count(*) = 0)
  FROM (SELECT q.id, q.max_crashes,
               (SELECT count(*) FROM events e WHERE e.kind = 'kill9'
                   AND e.detail = 'poison task ' || q.id)
               + (SELECT count(*) FROM watchdog_exits x WHERE x.task_id = q.id
                     AND NOT x.at_drain) AS downs
          FROM q WHERE hostile IN ('kill', 'wedge')) s
 WHERE downs > max_crashes;
SELECT pg_temp.fig('processes taken down by poison tasks (kill -9 / watchdog)',
                   format('%s / %s', (SELECT count(*) FROM events WHERE kind = 'kill9'
                                         AND detail LIKE 'poison task %'),
                          (SELECT count(*) FROM watchdog_exits WHERE hostile = 'wedge')));
SELECT pg_temp.fig('tasks that misbehaved on their first attempt', count(*))
  FROM q WHERE hostile IS NOT NULL AND hostile NOT IN ('kill', 'wedge');
INSERT INTO fig (name, value)
SELECT '  ' || hostile || ': done / all', format('%s / %s', count(*) FILTER (WHERE status = 'done'), count(*))
  FROM q WHERE hostile IS NOT NULL AND hostile NOT IN ('kill', 'wedge') GROUP BY hostile ORDER BY hostile;
SELECT pg_temp.fig('  of which not done in the end (must be 0)', count(*), count(*) = 0)
  FROM q WHERE hostile IS NOT NULL AND hostile NOT IN ('kill', 'wedge') AND status <> 'done';
SELECT pg_temp.fig('tasks that saw state leaked from an earlier task (must be 0)', count(*),
                   count(*) = 0)
  FROM q WHERE last_error LIKE 'state leaked across tasks%';
SELECT pg_temp.fig('innocent tasks quarantined (must be 0)', count(*), count(*) = 0)
  FROM q WHERE last_cause = 'quarantined' AND hostile IS DISTINCT FROM 'kill'
   AND hostile IS DISTINCT FROM 'wedge';
SELECT pg_temp.fig('forged log lines: JSON lines with msg "forged line" (must be 0)', count(*),
                   count(*) = 0)
  FROM wlog WHERE msg = 'forged line';

-- ------------------------------------------------------------------ waits
SELECT pg_temp.head('waits (task.lua: 1 in 29 waits on the clock, 1 in 31 for two children)');
SELECT pg_temp.fig('waiters (clock / children)',
                   format('%s / %s', count(*) FILTER (WHERE wait = 'clock'),
                          count(*) FILTER (WHERE wait = 'children'))) FROM q;
SELECT pg_temp.fig('executions that ended in a wait (attempt history)', count(*))
  FROM agent_work_queue_attempts WHERE kind = 'wait';
SELECT pg_temp.fig('waiters done without a wait in their history (must be 0)', count(*), count(*) = 0)
  FROM q WHERE wait IS NOT NULL AND status = 'done'
   AND NOT waited;
-- A waiter, resumed, runs as any task (execs, the llm step), so the mock's faults can spend
-- its attempts after its wait as they spend anybody's: dead that way is not the wait's failure.
SELECT pg_temp.fig('waiters dead with attempts spent on the mock''s faults after their wait',
                   count(*))
  FROM q WHERE wait IS NOT NULL AND exhausted_by_mock AND waited;
SELECT pg_temp.fig('waiters not done, other than those (must be 0)', count(*), count(*) = 0)
  FROM q WHERE wait IS NOT NULL AND status <> 'done'
   AND NOT (exhausted_by_mock AND waited);
SELECT pg_temp.fig('waits past their deadline (must be 0)', count(*), count(*) = 0)
  FROM agent_work_queue_attempts WHERE cause = 'wait_deadline';
SELECT pg_temp.fig('children (rows, done)', format('%s, %s', count(*), count(*) FILTER (WHERE status = 'done')))
  FROM agent_work_queue WHERE payload ? 'child_of';
SELECT pg_temp.fig('children not done (must be 0)', count(*), count(*) = 0)
  FROM agent_work_queue WHERE payload ? 'child_of' AND status <> 'done';
SELECT pg_temp.fig('children waiters with fewer than two children (must be 0)', count(*), count(*) = 0)
  FROM q WHERE wait = 'children' AND status = 'done'
   AND (SELECT count(*) FROM agent_work_queue c WHERE c.parent_id = q.id) < 2;
SELECT pg_temp.fig('  with more (a fan-out run again after a lost lease: at least once)', count(*))
  FROM q WHERE wait = 'children'
   AND (SELECT count(*) FROM agent_work_queue c WHERE c.parent_id = q.id) > 2;

-- ------------------------------------------------------------------ provider batches
SELECT pg_temp.head('provider batches (task.lua: 1 in 23 asks through leash.llm.batch)');
SELECT pg_temp.fig('tasks through provider batches', count(*)) FROM q WHERE via_batch;
-- Answered, such a task runs as any task: the mock's faults may spend its attempts after its
-- "ask" step stored, which is not the provider batch's failure (CI saw one: 7 timeouts, a 500).
SELECT pg_temp.fig('  dead with attempts spent on the mock''s faults after their answer', count(*))
  FROM q WHERE via_batch AND exhausted_by_mock AND asked;
SELECT pg_temp.fig('  not done, other than those (must be 0)', count(*), count(*) = 0)
  FROM q WHERE via_batch AND status <> 'done'
   AND NOT (exhausted_by_mock AND asked);
SELECT pg_temp.fig('  done without their "ask" step stored (must be 0)', count(*), count(*) = 0)
  FROM q WHERE via_batch AND status = 'done' AND NOT asked;
SELECT pg_temp.fig('provider batches (ended / abandoned / all)',
                   format('%s / %s / %s', count(*) FILTER (WHERE state = 'ended'),
                          count(*) FILTER (WHERE state = 'abandoned'), count(*)))
  FROM agent_work_queue_llm_batches;
SELECT pg_temp.fig('provider batches left open or being made (must be 0)', count(*), count(*) = 0)
  FROM agent_work_queue_llm_batches WHERE state IN ('open', 'creating');
SELECT pg_temp.fig('items (by state)', string_agg(state || ' ' || c, ', ' ORDER BY state))
  FROM (SELECT state, count(*) c FROM agent_work_queue_llm_items GROUP BY 1) s;
SELECT pg_temp.fig('items of done tasks never answered (must be 0)', count(*), count(*) = 0)
  FROM agent_work_queue_llm_items i JOIN q ON q.id = i.task_id
 WHERE q.status = 'done' AND i.state IN ('pending', 'submitted');
SELECT pg_temp.fig('batchers elected (worker logs)', count(*))
  FROM wlog WHERE msg LIKE 'llm batch: worker % is the fleet''s batcher%';

-- ------------------------------------------------------------------ print
\o
SELECT CASE WHEN value IS NULL THEN name
            ELSE rpad(name, 100, ' ') || ' ' || value
                 || CASE WHEN ok IS NULL THEN '' WHEN ok THEN '   ok' ELSE '   FAIL' END END
  FROM fig ORDER BY ord;
SELECT 'invariants failed: ' || count(*) FILTER (WHERE NOT ok) FROM fig;
