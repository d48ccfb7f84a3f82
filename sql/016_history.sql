-- The attempt history (issue #16, item 1; README "Attempt history", docs/ARCHITECTURE.md).
--
-- <table>_attempts keeps one row per execution: every settle, every reaped lease and every
-- lease cancelled under its worker writes one, in the same statement as the change to the
-- task row, so the history costs no round trip and can never disagree with the task (both
-- commit or neither does). A lease is one execution: its token (drawn fresh by each claim)
-- is the row's key with the task id, so a snooze that gives its attempt back, a requeue that
-- starts the count again, or a lease the reaper took away each stay their own rows.
--
-- What a row says: the claim's attempt number; the lease (token, worker); the script's
-- version (src/script.h: SHA-256 over the script and its modules) and the label it declares
-- (the module's `label` field, docs/lua-api.md), both NULL for an execution that never ran a
-- script; the queue wait (runnable to claimed, the claim's own `waited`: clock at the claim
-- minus greatest(run_after, created_at)); claimed_at, run_started_at (when handle started;
-- NULL when it never did) and finished_at; kind, the settle's word for the outcome (done,
-- retry, dead for fatal, snooze) or 'lost' for a lease that ended without the worker's
-- settle (reaped, cancelled); cause and status as the change wrote them to the task
-- (last_cause, so 'quarantined' and 'snooze_limit' show where the settle decided them);
-- error, the run's own error for done and the last_error written otherwise; crashed, the
-- run's cause was a crash (it counted in crashes). Tokens and cost are not copied here: the
-- budgeted calls' usage (sql/014, <table>_usage) names task and attempt, and readers join it
-- (leash inspect, leash report --by version), so the settle pays nothing for them.
--
-- Retention: a task's attempts go with it (ON DELETE CASCADE: leash prune, or a DELETE by
-- hand); a requeue keeps them. A release (drain, leash release) gives the attempt back
-- without an execution's end and writes none; a row set aside by the claim (bad_row) was
-- never leased and has none.
--
-- The settle, the cycle and its row-by-row fallback are 012's with three arrays more (the
-- version, label and queue wait of each outcome, from the dispatcher), defaulted so a caller
-- of 012's arguments still works (its rows then have no version). The reaper and its
-- fallback are 011's, the cancel 015's, each with its INSERT.

CREATE TABLE IF NOT EXISTS {{obj:attempts}} (
  task_id        bigint NOT NULL REFERENCES {{table}} (id) ON DELETE CASCADE,
  lease_token    bigint NOT NULL,
  attempt        int NOT NULL,
  worker         text,
  version        text,                 -- 64 hex digits; NULL: no script ran
  label          text,                 -- the script's own label; NULL: none
  queue_wait_s   float8,
  claimed_at     timestamptz,
  run_started_at timestamptz,
  finished_at    timestamptz NOT NULL DEFAULT now(),
  kind           text NOT NULL,        -- done, retry, dead, snooze, lost
  cause          text,
  status         text NOT NULL,        -- the task's status after this execution
  error          text,
  crashed        boolean NOT NULL DEFAULT false,
  PRIMARY KEY (task_id, lease_token)
);
-- report --by version reads every row of a scope: no index beyond the key (a batch is found
-- through the queue table's rows).

-- ---------------------------------------------------------------- settle

DROP FUNCTION IF EXISTS {{obj:cycle_rows}}(text, bigint[], bigint[], text[], float8[], text[],
                                           jsonb[], text[], boolean[], float8[], int, float8,
                                           text[], text, text, int, float8, float8, float8);
DROP FUNCTION IF EXISTS {{obj:cycle}}(text, bigint[], bigint[], text[], float8[], text[],
                                      jsonb[], text[], boolean[], float8[], int, float8,
                                      text[], text, text, int, float8, float8, float8);
DROP FUNCTION IF EXISTS {{obj:settle}}(text, bigint[], bigint[], text[], float8[], text[],
                                       jsonb[], text[], boolean[], float8[], float8, float8,
                                       float8);
-- 012's settle; the rows it wrote are also the attempts' rows (the CTE `h`). A granted
-- snooze gave the claim's attempt back: its attempt number is the written one plus one.
CREATE FUNCTION {{obj:settle}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                               p_kinds text[], p_delays float8[], p_errors text[],
                               p_results jsonb[], p_causes text[], p_crashed boolean[],
                               p_run_s float8[], p_backoff_base float8 DEFAULT 2,
                               p_backoff_cap float8 DEFAULT 3600,
                               p_backoff_jitter float8 DEFAULT 0.5,
                               p_versions text[] DEFAULT NULL, p_labels text[] DEFAULT NULL,
                               p_waited float8[] DEFAULT NULL)
RETURNS TABLE (id bigint, attempts int, status text, cause text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  rel int := {{table_literal}}::regclass::oid::int;
  busy bigint[];
  kt text[];
  ks text[];
BEGIN
  -- The hand-over locks of these leases' shards, try-only, in key order (011).
  SELECT array_agg(x.id) FILTER (WHERE NOT x.got),
         array_agg(x.tenant_id) FILTER (WHERE x.got), array_agg(x.shard_key) FILTER (WHERE x.got)
    INTO busy, kt, ks
    FROM (SELECT y.id, y.tenant_id, y.shard_key,
                 pg_try_advisory_xact_lock(rel, {{obj:lane_key}}(y.tenant_id, y.shard_key)) AS got
            FROM (SELECT q.id, q.tenant_id, q.shard_key FROM {{table}} q
                   WHERE q.id = ANY (p_ids)
                   ORDER BY q.tenant_id, q.shard_key
                  OFFSET 0) y) x;
  -- Found by id (pkey), never through one_lease_per_shard: see 011.
  RETURN QUERY
  WITH s AS (
    UPDATE {{table}} q
       SET status = CASE
                      WHEN u.crashed AND q.crashes + 1 >= q.max_crashes THEN 'dead'
                      WHEN u.kind = 'done' THEN 'done'
                      WHEN u.kind = 'snooze' AND NOT u.crashed AND q.snoozes < q.max_snoozes
                      THEN 'pending'
                      WHEN u.kind IN ('retry', 'snooze') AND q.attempts < q.max_attempts
                      THEN 'pending'
                      ELSE 'dead' END,
           attempts = CASE
                        WHEN u.kind = 'snooze' AND NOT u.crashed AND q.snoozes < q.max_snoozes
                        THEN q.attempts - 1   -- the claim's attempt, given back
                        ELSE q.attempts END,
           snoozes = q.snoozes + CASE
                                   WHEN u.kind = 'snooze' AND NOT u.crashed
                                        AND q.snoozes < q.max_snoozes THEN 1 ELSE 0 END,
           snoozed_s = q.snoozed_s + CASE
                                       WHEN u.kind = 'snooze' AND NOT u.crashed
                                            AND q.snoozes < q.max_snoozes
                                       THEN coalesce(u.delay, 0) ELSE 0 END,
           run_after = CASE
                         WHEN u.crashed AND q.crashes + 1 >= q.max_crashes THEN q.run_after
                         WHEN u.kind = 'snooze' AND NOT u.crashed AND q.snoozes < q.max_snoozes
                         THEN now() + make_interval(secs => coalesce(u.delay, 0))
                         WHEN u.kind IN ('retry', 'snooze') AND q.attempts < q.max_attempts
                         THEN now() + make_interval(secs => coalesce(u.delay,
                                {{obj:backoff}}(coalesce(q.backoff_base, p_backoff_base),
                                                coalesce(q.backoff_cap, p_backoff_cap),
                                                q.attempts, p_backoff_jitter, random())))
                         ELSE q.run_after END,
           last_error = CASE
                          WHEN u.crashed AND q.crashes + 1 >= q.max_crashes
                          THEN format('quarantined: its executions crashed %s times '
                                      '(max_crashes %s); the last: %s; requeue it to run '
                                      'it again', q.crashes + 1, q.max_crashes,
                                      coalesce(u.err, u.cause))
                          WHEN u.kind = 'done' THEN q.last_error
                          WHEN u.kind = 'snooze' AND q.snoozes >= q.max_snoozes
                          THEN format('snooze_limit: snoozed %s times (max_snoozes %s), so '
                                      'this snooze spent an attempt: %s', q.snoozes,
                                      q.max_snoozes, u.err)
                          ELSE u.err END,
           last_cause = CASE
                          WHEN u.crashed AND q.crashes + 1 >= q.max_crashes THEN 'quarantined'
                          WHEN u.kind = 'snooze' AND q.snoozes >= q.max_snoozes
                          THEN 'snooze_limit'
                          ELSE u.cause END,
           crashes = q.crashes + CASE WHEN u.crashed THEN 1 ELSE 0 END,
           result = CASE WHEN u.kind = 'done' THEN u.result ELSE q.result END,
           run_started_at = CASE WHEN u.run_s IS NULL THEN NULL
                                 ELSE q.started_at + make_interval(secs => u.run_s) END,
           is_head = false,   -- a retry or a snooze waits its turn: the hand-over decides
           locked_until = NULL, finished_at = now(), updated_at = now()
      FROM (SELECT v.* FROM unnest(p_ids, p_tokens, p_kinds, p_delays, p_errors, p_results,
                                   p_causes, p_crashed, p_run_s, p_versions, p_labels,
                                   p_waited)
                             AS v(id, token, kind, delay, err, result, cause, crashed, run_s,
                                  version, label, waited)
             WHERE busy IS NULL OR v.id <> ALL (busy)
             ORDER BY v.id) u
     WHERE q.id = ANY (p_ids) AND q.id = u.id AND q.lease_token = u.token
       AND q.lease_owner = p_owner AND (q.status || '') = 'leased'
    RETURNING q.id, q.attempts, q.status, q.last_cause, q.lease_token, q.started_at,
              q.run_started_at, q.finished_at, q.last_error, u.kind, u.err, u.crashed,
              u.version, u.label, u.waited
  ), gone AS (
    DELETE FROM {{obj:steps}} st USING s WHERE st.task_id = s.id AND s.status = 'done'
  ), h AS (
    INSERT INTO {{obj:attempts}} AS a (task_id, lease_token, attempt, worker, version, label,
                                       queue_wait_s, claimed_at, run_started_at, finished_at,
                                       kind, cause, status, error, crashed)
    SELECT s.id, s.lease_token,
           s.attempts + CASE WHEN s.kind = 'snooze' AND NOT s.crashed AND s.status = 'pending'
                                  AND s.last_cause IS DISTINCT FROM 'snooze_limit'
                             THEN 1 ELSE 0 END,
           p_owner, s.version, s.label, s.waited, s.started_at, s.run_started_at,
           s.finished_at, s.kind, s.last_cause, s.status,
           CASE WHEN s.status = 'done' THEN s.err ELSE s.last_error END, s.crashed
      FROM s
    ON CONFLICT DO NOTHING   -- one lease, one row; this table has no triggers (see 015)
  )
  SELECT s.id, s.attempts, s.status, s.last_cause FROM s
  UNION ALL
  SELECT b, NULL::int, 'leased'::text, NULL::text FROM unnest(busy) AS b;
  IF kt IS NOT NULL THEN
    PERFORM {{obj:lane_handover}}(kt, ks);
  END IF;
END $$;

-- ---------------------------------------------------------------- cycle

-- 012's cycle with the version, label and wait arrays passed to the settle.
CREATE FUNCTION {{obj:cycle}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                              p_kinds text[], p_delays float8[], p_errors text[],
                              p_results jsonb[], p_causes text[], p_crashed boolean[],
                              p_run_s float8[], p_n int, p_visibility_s float8,
                              p_tenants text[], p_batch text, p_ring text, p_ring_left int,
                              p_backoff_base float8 DEFAULT 2,
                              p_backoff_cap float8 DEFAULT 3600,
                              p_backoff_jitter float8 DEFAULT 0.5,
                              p_versions text[] DEFAULT NULL, p_labels text[] DEFAULT NULL,
                              p_waited float8[] DEFAULT NULL)
RETURNS TABLE (settled boolean, id bigint, attempts int, max_attempts int, tenant_id text,
               shard_key text, batch text, payload text, waited float8, status text,
               cause text, token bigint, ring text, ring_left int)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(p_ids) > 0 THEN
    RETURN QUERY
    SELECT true, s.id, s.attempts, NULL::int, NULL::text, NULL::text, NULL::text, NULL::text,
           NULL::float8, s.status, s.cause, NULL::bigint, NULL::text, NULL::int
      FROM {{obj:settle}}(p_owner, p_ids, p_tokens, p_kinds, p_delays, p_errors, p_results,
                          p_causes, p_crashed, p_run_s, p_backoff_base, p_backoff_cap,
                          p_backoff_jitter, p_versions, p_labels, p_waited) s;
  END IF;
  IF p_n > 0 THEN
    RETURN QUERY
    SELECT CASE WHEN c.id IS NULL THEN NULL ELSE false END, c.id, c.attempts, c.max_attempts,
           c.tenant_id, c.shard_key, c.batch, c.payload, c.waited, NULL::text, NULL::text,
           c.token, c.ring, c.ring_left
      FROM {{obj:claim}}(p_owner, p_n, p_visibility_s, p_tenants, p_batch, p_ring,
                         p_ring_left) c;
  END IF;
END $$;

-- 012's row-by-row fallback with the arrays passed through; the set-aside settle keeps the
-- row's version, label and wait (its execution ran; only its outcome could not be written).
CREATE FUNCTION {{obj:cycle_rows}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                                   p_kinds text[], p_delays float8[], p_errors text[],
                                   p_results jsonb[], p_causes text[], p_crashed boolean[],
                                   p_run_s float8[], p_n int, p_visibility_s float8,
                                   p_tenants text[], p_batch text, p_ring text,
                                   p_ring_left int, p_backoff_base float8 DEFAULT 2,
                                   p_backoff_cap float8 DEFAULT 3600,
                                   p_backoff_jitter float8 DEFAULT 0.5,
                                   p_versions text[] DEFAULT NULL,
                                   p_labels text[] DEFAULT NULL,
                                   p_waited float8[] DEFAULT NULL)
RETURNS TABLE (settled boolean, id bigint, attempts int, max_attempts int, tenant_id text,
               shard_key text, batch text, payload text, waited float8, status text,
               cause text, token bigint, ring text, ring_left int)
LANGUAGE plpgsql
SET jit = off
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  st text;
  msg text;
  n int := coalesce(cardinality(p_ids), 0);
  got int := 0;
  cands bigint[];
  cand bigint;
  c_tenant text;
  c_shard text;
BEGIN
  IF n > 0 THEN
    BEGIN
      RETURN QUERY SELECT * FROM {{obj:cycle}}(p_owner, p_ids, p_tokens, p_kinds, p_delays,
                                               p_errors, p_results, p_causes, p_crashed,
                                               p_run_s, 0, p_visibility_s, p_tenants, p_batch,
                                               p_ring, p_ring_left, p_backoff_base,
                                               p_backoff_cap, p_backoff_jitter, p_versions,
                                               p_labels, p_waited);
      n := 0;
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE;
      IF NOT {{obj:row_error}}(st) THEN
        RAISE;
      END IF;
    END;
  END IF;
  FOR i IN 1..n LOOP
    BEGIN
      RETURN QUERY SELECT * FROM {{obj:cycle}}(p_owner, p_ids[i:i], p_tokens[i:i],
                                               p_kinds[i:i], p_delays[i:i], p_errors[i:i],
                                               p_results[i:i], p_causes[i:i], p_crashed[i:i],
                                               p_run_s[i:i], 0, p_visibility_s, p_tenants,
                                               p_batch, p_ring, p_ring_left, p_backoff_base,
                                               p_backoff_cap, p_backoff_jitter,
                                               p_versions[i:i], p_labels[i:i], p_waited[i:i]);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
      IF NOT {{obj:row_error}}(st) THEN
        RAISE;
      END IF;
      BEGIN
        RETURN QUERY
        SELECT true, s.id, s.attempts, NULL::int, NULL::text, NULL::text, NULL::text,
               NULL::text, NULL::float8, s.status, s.cause, NULL::bigint, NULL::text, NULL::int
          FROM {{obj:settle}}(p_owner, p_ids[i:i], p_tokens[i:i], '{dead}', '{NULL}',
                              ARRAY['bad row: its outcome could not be written: ' || msg],
                              '{NULL}', '{bad_row}', '{f}', '{NULL}', p_backoff_base,
                              p_backoff_cap, p_backoff_jitter, p_versions[i:i], p_labels[i:i],
                              p_waited[i:i]) s;
      EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        IF NOT {{obj:row_error}}(st) THEN
          RAISE;
        END IF;
        RAISE WARNING 'task % cannot be settled nor set aside: %', p_ids[i], msg;
      END;
    END;
  END LOOP;
  IF p_n <= 0 THEN
    RETURN;
  END IF;

  BEGIN
    RETURN QUERY SELECT * FROM {{obj:cycle}}(p_owner, '{}', '{}', '{}', '{}', '{}', '{}', '{}',
                                             '{}', '{}', p_n, p_visibility_s, p_tenants,
                                             p_batch, p_ring, p_ring_left);
    RETURN;
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE;
    IF NOT {{obj:row_error}}(st) THEN
      RAISE;
    END IF;
  END;

  IF p_batch IS NULL THEN
    SELECT array_agg(k.id) INTO cands FROM (
      SELECT h.id FROM {{table}} h
       WHERE h.is_head AND h.run_after <= now()
         AND (p_tenants IS NULL OR h.tenant_id = ANY (p_tenants))
       ORDER BY h.tenant_id, h.priority DESC, h.run_after, h.id
       LIMIT p_n * 4) k;
  ELSE
    SELECT array_agg(k.id) INTO cands FROM (
      SELECT t.id FROM {{table}} t
       WHERE t.status = 'pending' AND t.batch = p_batch AND t.run_after <= now()
         AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
       ORDER BY t.batch, t.run_after, t.id
       LIMIT p_n * 4) k;
  END IF;
  FOREACH cand IN ARRAY coalesce(cands, '{}') LOOP
    EXIT WHEN got >= p_n;
    BEGIN
      RETURN QUERY
      SELECT false, c.id, c.attempts, c.max_attempts, c.tenant_id, c.shard_key, c.batch,
             c.payload, c.waited, NULL::text, NULL::text, c.token, NULL::text, NULL::int
        FROM {{obj:claim}}(p_owner, 1, p_visibility_s, p_tenants, p_batch, NULL, 0, cand) c
       WHERE c.id IS NOT NULL;
      IF FOUND THEN
        got := got + 1;
      END IF;
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
      IF NOT {{obj:row_error}}(st) THEN
        RAISE;
      END IF;
      IF st <> '23505' THEN
        BEGIN
          UPDATE {{table}} q
             SET status = 'dead', last_cause = 'bad_row', locked_until = NULL, is_head = false,
                 last_error = 'bad row: it cannot be leased: ' || msg,
                 finished_at = now(), updated_at = now()
           WHERE q.id = cand AND q.status = 'pending'
          RETURNING q.tenant_id, q.shard_key INTO c_tenant, c_shard;
          IF FOUND THEN
            PERFORM {{obj:lane_handover}}(ARRAY[c_tenant], ARRAY[c_shard]);
          END IF;
          RAISE WARNING 'task % set aside (dead, bad_row): it cannot be leased: %', cand, msg;
        EXCEPTION WHEN OTHERS THEN
          GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE;
          IF NOT {{obj:row_error}}(st) THEN
            RAISE;
          END IF;
          RAISE WARNING 'task % cannot be leased nor set aside: %', cand, msg;
        END;
      END IF;
    END;
  END LOOP;
  -- When the next row is due is not looked up here: NULL makes an idle worker poll. The
  -- ring stays where it was.
  RETURN QUERY SELECT NULL::boolean, NULL::bigint, NULL::int, NULL::int, NULL::text,
                      NULL::text, NULL::text, NULL::text, NULL::float8, NULL::text, NULL::text,
                      NULL::bigint, p_ring, p_ring_left;
END $$;

-- ---------------------------------------------------------------- reap

-- 011's reaper: each expired lease it writes is an attempt, kind 'lost' (crashed: it counted
-- in crashes), its cause and error as written ('crash', or 'quarantined' at max_crashes).
-- The fallback's set-aside (bad_row) is one too, not a crash.
DROP FUNCTION IF EXISTS {{obj:reap_rows}}();
DROP FUNCTION IF EXISTS {{obj:reap}}(bigint);
CREATE FUNCTION {{obj:reap}}(p_only bigint DEFAULT NULL)
RETURNS TABLE (id bigint, status text, tenant_id text, lease_owner text, cause text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  r_id bigint[];
  r_status text[];
  r_tenant text[];
  r_shard text[];
  r_owner text[];
  r_cause text[];
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtextextended('leash.reap',
                                                    {{table_literal}}::regclass::oid::bigint)) THEN
    RETURN;
  END IF;
  -- A lease that goes dead hands its shard over: it takes the shard's hand-over lock first
  -- (try-only; one a producer holds is reaped next time). One that goes back to pending is
  -- its shard's head again and needs none.
  WITH e AS (
    SELECT x.id, x.lease_owner AS owner, x.tenant_id, x.shard_key,
           x.crashes + 1 >= x.max_crashes OR x.attempts >= x.max_attempts AS dies
      FROM {{table}} x
     WHERE x.status = 'leased' AND (x.locked_until IS NULL OR x.locked_until < now())
       AND (p_only IS NULL OR x.id = p_only)
     ORDER BY x.id
     LIMIT 1000
     FOR UPDATE SKIP LOCKED
  ), r AS (
    SELECT e.id, e.owner FROM e
     WHERE NOT e.dies
        OR pg_try_advisory_xact_lock({{table_literal}}::regclass::oid::int,
                                     {{obj:lane_key}}(e.tenant_id, e.shard_key))
  ), u AS (
    UPDATE {{table}} q
       SET status = CASE WHEN q.crashes + 1 >= q.max_crashes THEN 'dead'
                         WHEN q.attempts >= q.max_attempts THEN 'dead'
                         ELSE 'pending' END,
           is_head = q.crashes + 1 < q.max_crashes AND q.attempts < q.max_attempts,
           crashes = q.crashes + 1,
           last_cause = CASE WHEN q.crashes + 1 >= q.max_crashes THEN 'quarantined'
                             ELSE 'crash' END,
           last_error = CASE
                          WHEN q.crashes + 1 >= q.max_crashes
                          THEN format('quarantined: its executions crashed %s times (max_crashes '
                                      '%s); the last: the lease of worker %s expired (it died, '
                                      'froze or was wedged); requeue it to run it again',
                                      q.crashes + 1, q.max_crashes, coalesce(r.owner, '?'))
                          ELSE 'crash: the lease of worker ' || coalesce(r.owner, '?')
                               || ' expired (it died, froze or was wedged)' END,
           locked_until = NULL, finished_at = now(), updated_at = now()
      FROM r WHERE q.id = r.id
    RETURNING q.id, q.status, q.tenant_id, q.shard_key, r.owner, q.last_cause, q.attempts,
              q.lease_token, q.started_at, q.finished_at, q.last_error, q.run_after,
              q.created_at
  ), h AS (
    -- The lease's execution, lost: its worker never settled it. The claim left run_after
    -- as it was, so the wait is the claim's.
    INSERT INTO {{obj:attempts}} (task_id, lease_token, attempt, worker, queue_wait_s,
                                  claimed_at, finished_at, kind, cause, status, error, crashed)
    SELECT u.id, coalesce(u.lease_token, 0), u.attempts, u.owner,
           extract(epoch FROM u.started_at - greatest(u.run_after, u.created_at))::float8,
           u.started_at, u.finished_at, 'lost', u.last_cause, u.status, u.last_error, true
      FROM u
    ON CONFLICT DO NOTHING
  )
  SELECT array_agg(u.id), array_agg(u.status), array_agg(u.tenant_id), array_agg(u.shard_key),
         array_agg(u.owner), array_agg(u.last_cause)
    INTO r_id, r_status, r_tenant, r_shard, r_owner, r_cause
    FROM u;
  IF r_id IS NULL THEN
    RETURN;
  END IF;
  -- The shards of leases that went dead are handed over.
  PERFORM {{obj:lane_handover}}(array_agg(x.tenant_id), array_agg(x.shard_key))
     FROM unnest(r_status, r_tenant, r_shard) AS x(status, tenant_id, shard_key)
    WHERE x.status = 'dead'
   HAVING count(*) > 0;
  PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  RETURN QUERY SELECT * FROM unnest(r_id, r_status, r_tenant, r_owner, r_cause);
END $$;

-- The reaper's fallback (010): one expired lease at a time; one that cannot be reaped is
-- set aside (dead, bad_row) and its shard handed over.
CREATE FUNCTION {{obj:reap_rows}}()
RETURNS TABLE (id bigint, status text, tenant_id text, lease_owner text, cause text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  st text;
  msg text;
  cand bigint;
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtextextended('leash.reap',
                                                    {{table_literal}}::regclass::oid::bigint)) THEN
    RETURN;
  END IF;
  FOR cand IN SELECT e.id FROM {{table}} e
               WHERE e.status = 'leased' AND (e.locked_until IS NULL OR e.locked_until < now())
               ORDER BY e.id LIMIT 1000 LOOP
    BEGIN
      RETURN QUERY SELECT * FROM {{obj:reap}}(cand);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
      IF NOT {{obj:row_error}}(st) THEN
        RAISE;
      END IF;
      BEGIN
        RETURN QUERY
        WITH u AS (
          UPDATE {{table}} q
             SET status = 'dead', last_cause = 'bad_row', locked_until = NULL, is_head = false,
                 last_error = 'bad row: its expired lease could not be reaped: ' || msg,
                 finished_at = now(), updated_at = now()
           WHERE q.id = cand AND q.status = 'leased'
          RETURNING q.id, q.status, q.tenant_id, q.lease_owner, q.last_cause, q.attempts,
                    q.lease_token, q.started_at, q.finished_at, q.last_error
        ), h AS (
          INSERT INTO {{obj:attempts}} (task_id, lease_token, attempt, worker, claimed_at,
                                        finished_at, kind, cause, status, error)
          SELECT u.id, coalesce(u.lease_token, 0), u.attempts, u.lease_owner, u.started_at,
                 u.finished_at, 'lost', u.last_cause, u.status, u.last_error
            FROM u
          ON CONFLICT DO NOTHING
        )
        SELECT u.id, u.status, u.tenant_id, u.lease_owner, u.last_cause FROM u;
        PERFORM {{obj:lane_handover}}(array_agg(t.tenant_id), array_agg(t.shard_key))
           FROM {{table}} t WHERE t.id = cand;
      EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE;
        IF NOT {{obj:row_error}}(st) THEN
          RAISE;
        END IF;
        RAISE WARNING 'task % cannot be reaped nor set aside: %', cand, msg;
      END;
    END;
  END LOOP;
END $$;


-- ---------------------------------------------------------------- cancel

-- 015's cancel: a leased task it ends writes its lease's attempt, kind 'lost', cause
-- 'cancelled'. A pending one had no execution running and writes none.
CREATE OR REPLACE FUNCTION {{obj:cancel}}(p_ids bigint[], p_batch text, p_tenant text,
                               OUT pending bigint, OUT leased bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  ids bigint[];
BEGIN
  IF (p_ids IS NOT NULL)::int + (p_batch IS NOT NULL)::int + (p_tenant IS NOT NULL)::int <> 1 THEN
    RAISE EXCEPTION 'cancel: give exactly one of ids, batch, tenant'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT array_agg(c.id) INTO ids FROM (
    SELECT q.id FROM {{table}} q
     WHERE q.status IN ('pending', 'leased')
       AND (p_ids IS NULL OR q.id = ANY (p_ids))
       AND (p_batch IS NULL OR q.batch = p_batch)
       AND (p_tenant IS NULL OR q.tenant_id = p_tenant)
     ORDER BY q.id
       FOR UPDATE) c;
  WITH u AS (
    UPDATE {{table}} q
       SET status = 'dead', last_cause = 'cancelled', locked_until = NULL,
           last_error = CASE WHEN q.status = 'leased'
                             THEN 'cancelled while leased by worker ' || coalesce(q.lease_owner, '?')
                             ELSE 'cancelled' END,
           finished_at = now(), updated_at = now()
      FROM {{table}} o
     WHERE q.id = ANY (coalesce(ids, '{}')) AND o.id = q.id AND q.status IN ('pending', 'leased')
    RETURNING o.status AS was, q.id, q.attempts, q.lease_token, o.lease_owner, q.started_at,
              q.finished_at, q.last_error, q.run_after, q.created_at
  ), h AS (
    -- A lease cancelled under its worker ends its execution here: that worker's settle
    -- will match nothing.
    INSERT INTO {{obj:attempts}} (task_id, lease_token, attempt, worker, queue_wait_s,
                                  claimed_at, finished_at, kind, cause, status, error)
    SELECT u.id, coalesce(u.lease_token, 0), u.attempts, u.lease_owner,
           extract(epoch FROM u.started_at - greatest(u.run_after, u.created_at))::float8,
           u.started_at, u.finished_at, 'lost', 'cancelled', 'dead', u.last_error
      FROM u WHERE u.was = 'leased'
    ON CONFLICT DO NOTHING
  )
  SELECT count(*) FILTER (WHERE was = 'pending'), count(*) FILTER (WHERE was = 'leased')
    INTO pending, leased FROM u;
  -- A lane handed over has a new head: wake idle workers rather than wait for their poll.
  IF pending + leased > 0 THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
END $$;

