-- Canary roll-out (issue #16, item 2; README "Nightly workflow", docs/ARCHITECTURE.md
-- "Canary").
--
-- <table>_canaries holds every canary of the table, at most one 'running' (a partial unique
-- index: a second `leash canary start` fails on it). The candidate's TEXT is stored, with
-- the version its load computed (src/script.h), so every process and pod runs the same
-- bytes: each `leash run` polls <table>_canary_poll, loads the text (its modules from its
-- own --lua-path and script folder) and refuses it, logged, if that load's version differs
-- from the recorded one, so outcomes counted under the version are the candidate's alone.
-- Which tasks run it is decided in each process by the task id (src/canary.c), not here.
--
-- The verdict is taken here, by whichever process's poll first takes the running row's lock
-- (FOR UPDATE SKIP LOCKED: the others read the decided row on their next poll), so the whole
-- fleet has one verdict, stored with its numbers in `decision`. One look a second at most
-- (looked_at), since a look counts every attempt since the canary started.
--
-- The test, over the attempt history (sql/016) since the canary started: candidate = attempts
-- whose version is the candidate's; current = the other attempts that ran a script; snoozes
-- are not executions that ended and are left out. Two rates each: failed (fatal, crashed or
-- lost: kind dead, crashed, or kind lost) and retried (kind retry, not crashed). Each is
-- compared with a one-sided two-proportion z-test (pooled variance). Evidence is looked at
-- every second, so a group-sequential boundary keeps repeated looks from inflating false
-- rollbacks (the Haybittle-Peto rule): before min_tasks, a rollback needs z > 3.09 (p < 0.001)
-- on at least 20 candidate and 20 current executions; from min_tasks on, z > 2.326 (p < 0.01).
-- Either way the rate difference must also exceed its threshold (max_fail_delta,
-- max_retry_delta), so a significant but tiny difference does not roll back. The two taken
-- together (failed or retried, against the larger threshold) are tested as well: a candidate
-- that fails a third of its tasks, some fatal and some retried, is caught sooner. A candidate
-- with min_tasks executions that is not rolled back passes: promoted when auto_promote, else
-- it stays running with decision.verdict = 'passed' until `leash canary promote`. A
-- 30%-failing candidate against a healthy current version crosses the early boundary at about
-- 40 executions with an even share, and at 20 with a 10% share (the current side is larger).
--
-- The give-back (<table>_canary_give_back): for a rolled-back canary, every task whose LAST
-- attempt ran the candidate and ended retry, dead or lost, and that is now pending or dead
-- (not leased: it runs again already), gets that attempt back: attempts - 1 (and crashes - 1
-- when it crashed), pending, runnable now, last_cause cleared. Each attempt is given back
-- once (<table>_canary_givebacks). Processes call it on every poll for 10 minutes after the
-- rollback, since executions that were in flight on other pods settle after the verdict.
-- A done task keeps its result; an aborted canary gives nothing back.

CREATE TABLE IF NOT EXISTS {{obj:canaries}} (
  id              bigserial PRIMARY KEY,
  script          text NOT NULL,
  script_name     text NOT NULL,               -- the file it was started from, for people
  version         text NOT NULL CHECK (version ~ '^[0-9a-f]{64}$'),
  label           text,
  share           int NOT NULL CHECK (share BETWEEN 1 AND 100),
  min_tasks       int NOT NULL CHECK (min_tasks >= 1),
  max_fail_delta  float8 NOT NULL CHECK (max_fail_delta >= 0 AND max_fail_delta <= 1),
  max_retry_delta float8 NOT NULL CHECK (max_retry_delta >= 0 AND max_retry_delta <= 1),
  auto_promote    boolean NOT NULL,
  state           text NOT NULL DEFAULT 'running'
                  CHECK (state IN ('running', 'promoted', 'rolled_back', 'aborted')),
  started_at      timestamptz NOT NULL DEFAULT now(),
  started_by      text,
  decided_at      timestamptz,
  decided_by      text,                        -- 'auto' or who ran the command
  decision        jsonb,                       -- the numbers (latest look while running)
  looked_at       timestamptz,                 -- the latest look (at most one a second)
  given_back      bigint NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS {{name:canaries_one_running}}
  ON {{obj:canaries}} ((true)) WHERE state = 'running';

CREATE TABLE IF NOT EXISTS {{obj:canary_givebacks}} (
  canary_id   bigint NOT NULL REFERENCES {{obj:canaries}} (id) ON DELETE CASCADE,
  task_id     bigint NOT NULL REFERENCES {{table}} (id) ON DELETE CASCADE,
  lease_token bigint NOT NULL,
  PRIMARY KEY (task_id, lease_token)
);

-- The give-back reads a version's attempts since a time, the verdict all attempts since one.
CREATE INDEX IF NOT EXISTS {{name:attempts_version_idx}}
  ON {{obj:attempts}} (version, finished_at);
CREATE INDEX IF NOT EXISTS {{name:attempts_finished_idx}}
  ON {{obj:attempts}} (finished_at);

-- The numbers of the test above, for canary c (a jsonb object; verdict 'rollback',
-- 'passed' or 'undecided', reason in words).
CREATE OR REPLACE FUNCTION {{obj:canary_numbers}}(p_id bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
  c {{obj:canaries}};
  n1 bigint; f1 bigint; r1 bigint; n0 bigint; f0 bigint; r0 bigint;
  zf float8; zr float8; zb float8; crit float8; pf1 float8; pf0 float8; pr1 float8; pr0 float8;
  verdict text := 'undecided'; reason text;
BEGIN
  SELECT * INTO c FROM {{obj:canaries}} WHERE id = p_id;
  SELECT count(*) FILTER (WHERE a.version = c.version),
         count(*) FILTER (WHERE a.version = c.version
                          AND (a.kind IN ('dead', 'lost') OR a.crashed)),
         count(*) FILTER (WHERE a.version = c.version AND a.kind = 'retry' AND NOT a.crashed),
         count(*) FILTER (WHERE a.version <> c.version),
         count(*) FILTER (WHERE a.version <> c.version
                          AND (a.kind IN ('dead', 'lost') OR a.crashed)),
         count(*) FILTER (WHERE a.version <> c.version AND a.kind = 'retry' AND NOT a.crashed)
    INTO n1, f1, r1, n0, f0, r0
    FROM {{obj:attempts}} a
   WHERE a.finished_at >= c.started_at AND a.version IS NOT NULL AND a.kind <> 'snooze';
  pf1 := CASE WHEN n1 > 0 THEN f1::float8 / n1 ELSE 0 END;
  pf0 := CASE WHEN n0 > 0 THEN f0::float8 / n0 ELSE 0 END;
  pr1 := CASE WHEN n1 > 0 THEN r1::float8 / n1 ELSE 0 END;
  pr0 := CASE WHEN n0 > 0 THEN r0::float8 / n0 ELSE 0 END;
  zf := {{obj:canary_z}}(f1, n1, f0, n0);
  zr := {{obj:canary_z}}(r1, n1, r0, n0);
  zb := {{obj:canary_z}}(f1 + r1, n1, f0 + r0, n0);
  crit := CASE WHEN n1 >= c.min_tasks THEN 2.326 ELSE 3.09 END;
  IF n1 >= 20 AND n0 >= 20 AND zf > crit AND pf1 - pf0 > c.max_fail_delta THEN
    verdict := 'rollback';
    reason := format('failure rate %s%% vs %s%% (z %s > %s)', round((pf1 * 100)::numeric, 1),
                     round((pf0 * 100)::numeric, 1), round(zf::numeric, 2), crit);
  ELSIF n1 >= 20 AND n0 >= 20 AND zr > crit AND pr1 - pr0 > c.max_retry_delta THEN
    verdict := 'rollback';
    reason := format('retry rate %s%% vs %s%% (z %s > %s)', round((pr1 * 100)::numeric, 1),
                     round((pr0 * 100)::numeric, 1), round(zr::numeric, 2), crit);
  ELSIF n1 >= 20 AND n0 >= 20 AND zb > crit
        AND pf1 + pr1 - pf0 - pr0 > greatest(c.max_fail_delta, c.max_retry_delta) THEN
    verdict := 'rollback';
    reason := format('failure or retry rate %s%% vs %s%% (z %s > %s)',
                     round(((pf1 + pr1) * 100)::numeric, 1), round(((pf0 + pr0) * 100)::numeric, 1),
                     round(zb::numeric, 2), crit);
  ELSIF n1 >= c.min_tasks AND n0 >= 20 THEN
    verdict := 'passed';
    reason := format('%s executions, not worse: failure %s%% vs %s%%, retry %s%% vs %s%%', n1,
                     round((pf1 * 100)::numeric, 1), round((pf0 * 100)::numeric, 1),
                     round((pr1 * 100)::numeric, 1), round((pr0 * 100)::numeric, 1));
  ELSE
    reason := format('%s of %s candidate executions (and %s of 20 current)', n1, c.min_tasks,
                     n0);
  END IF;
  RETURN jsonb_build_object(
    'verdict', verdict, 'reason', reason, 'candidate_executions', n1,
    'candidate_failed', f1, 'candidate_retried', r1, 'current_executions', n0,
    'current_failed', f0, 'current_retried', r0, 'z_failed', round(zf::numeric, 3),
    'z_retried', round(zr::numeric, 3), 'z_failed_or_retried', round(zb::numeric, 3),
    'critical_z', crit, 'test',
    'one-sided two-proportion z-test, Haybittle-Peto: z > 3.09 before min_tasks, 2.326 from it');
END $$;

-- One-sided z of x1/n1 above x0/n0, pooled; 0 when either side is empty or the pooled rate is
-- 0 or 1 (no variance: the rates are equal).
CREATE OR REPLACE FUNCTION {{obj:canary_z}}(x1 bigint, n1 bigint, x0 bigint, n0 bigint)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN n1 = 0 OR n0 = 0 OR x1 + x0 = 0 OR x1 + x0 = n1 + n0 THEN 0
              ELSE (x1::float8 / n1 - x0::float8 / n0)
                   / sqrt(((x1 + x0)::float8 / (n1 + n0)) * (1 - (x1 + x0)::float8 / (n1 + n0))
                          * (1.0 / n1 + 1.0 / n0)) END
$$;

-- See the header. Returns how many tasks got an attempt back in this call.
CREATE OR REPLACE FUNCTION {{obj:canary_give_back}}(p_id bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  c {{obj:canaries}};
  n bigint;
BEGIN
  SELECT * INTO c FROM {{obj:canaries}} WHERE id = p_id AND state = 'rolled_back';
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  WITH touched AS (
    SELECT DISTINCT a.task_id FROM {{obj:attempts}} a
     WHERE a.version = c.version AND a.finished_at >= c.started_at
  ), last AS (
    SELECT DISTINCT ON (a.task_id) a.task_id, a.lease_token, a.version, a.kind, a.crashed
      FROM {{obj:attempts}} a JOIN touched t ON t.task_id = a.task_id
     ORDER BY a.task_id, a.finished_at DESC, a.lease_token DESC
  ), g AS (
    SELECT l.* FROM last l JOIN {{table}} q ON q.id = l.task_id
     WHERE l.version = c.version AND l.kind IN ('retry', 'dead', 'lost')
       AND q.status IN ('pending', 'dead')
       AND NOT EXISTS (SELECT 1 FROM {{obj:canary_givebacks}} b
                        WHERE b.task_id = l.task_id AND b.lease_token = l.lease_token)
       FOR UPDATE OF q SKIP LOCKED
  ), marked AS (
    INSERT INTO {{obj:canary_givebacks}} (canary_id, task_id, lease_token)
    SELECT c.id, g.task_id, g.lease_token FROM g
    RETURNING task_id
  ), upd AS (
    UPDATE {{table}} q
       SET status = 'pending', attempts = greatest(q.attempts - 1, 0),
           crashes = greatest(q.crashes - CASE WHEN g.crashed THEN 1 ELSE 0 END, 0),
           last_cause = NULL, run_after = now(), locked_until = NULL, updated_at = now()
      FROM g JOIN marked m ON m.task_id = g.task_id
     WHERE q.id = g.task_id AND q.status IN ('pending', 'dead')
    RETURNING q.id
  )
  SELECT count(*) INTO n FROM upd;
  IF n > 0 THEN
    UPDATE {{obj:canaries}} SET given_back = given_back + n WHERE id = c.id;
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
  RETURN n;
END $$;

-- Called by every `leash run` at each poll (p_decide: this process may decide; only the
-- first to lock the running row does). Decides, keeps giving back for recent rollbacks,
-- and returns the canary a process should act on: the running one, else the latest one.
CREATE OR REPLACE FUNCTION {{obj:canary_poll}}(p_decide boolean)
RETURNS SETOF {{obj:canaries}} LANGUAGE plpgsql AS $$
DECLARE
  c {{obj:canaries}};
  d jsonb;
  r record;
BEGIN
  IF p_decide THEN
    -- One look a second for the whole fleet: the count reads every attempt since the start.
    SELECT * INTO c FROM {{obj:canaries}}
     WHERE state = 'running' AND coalesce(looked_at, '-infinity') < now() - interval '1 second'
       FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
      d := {{obj:canary_numbers}}(c.id);
      IF d->>'verdict' = 'rollback' THEN
        UPDATE {{obj:canaries}} SET state = 'rolled_back', decided_at = now(),
               decided_by = 'auto', decision = d WHERE id = c.id;
      ELSIF d->>'verdict' = 'passed' AND c.auto_promote THEN
        UPDATE {{obj:canaries}} SET state = 'promoted', decided_at = now(),
               decided_by = 'auto', decision = d WHERE id = c.id;
      ELSE
        UPDATE {{obj:canaries}} SET decision = d WHERE id = c.id;
      END IF;
      UPDATE {{obj:canaries}} SET looked_at = now() WHERE id = c.id;
    END IF;
  END IF;
  FOR r IN SELECT id FROM {{obj:canaries}}
            WHERE state = 'rolled_back' AND decided_at > now() - interval '10 minutes' LOOP
    PERFORM {{obj:canary_give_back}}(r.id);
  END LOOP;
  RETURN QUERY SELECT * FROM {{obj:canaries}} ORDER BY (state = 'running') DESC, id DESC LIMIT 1;
END $$;
