-- A settle leases its shards' next rows to its own worker (issue #14: serial orderings).
--
-- A shard's tasks run one at a time. Until now a settle handed its shard over by making the
-- next row the head (is_head: a write of the whole row, 5 index entries), and a claim then
-- leased that head (a second write). In a drain every task is its own shard and pays two
-- writes (lease, settle); in a serial ordering it paid three, and the next row could be
-- leased no sooner than the turn after its predecessor's settle, because a claim beside a
-- settle (the settle connection) does not see what that settle hands over. Measured on 100
-- shards with 10 slots, one process: the shards fell into two halves that took turns, about
-- 50 tasks a turn, each shard running one task every two turns.
--
-- Now the hand-over can lease the next row itself, to the worker that settles its
-- predecessor (lane_pass): one write instead of two, and the shard runs its next task on the
-- very next turn. The worker says how many it may take (p_chain). A row is leased here only
-- when a claim by this worker would have taken it first:
--
-- * it is due, pending, in the worker's tenants (p_scope), and no hold covers it (013);
-- * no other tenant this worker serves has a head waiting (not parked). Fair shares are the
--   claim's ring (011, 020): while any other tenant has a head, every shard goes back to the
--   ring as before. A tenant alone with runnable work has no share to keep;
-- * its tenant has no head that the ring would take before it: one of higher priority, or
--   of the same priority and older by (run_after, id). A head scheduled for later with a
--   higher priority also stops it, which costs speed, never order;
-- * its row lock and its shard's claim gate (the one-key advisory lock, 007) are free
--   (try-only: nothing here waits). Any claim that could pick the row (the ring's, if it is a
--   head already; one scoped to a batch or to a task, which pick rows that are not heads)
--   needs both;
-- * its shard holds no lease, checked again in the lease's own statement (fresh snapshot), as
--   the claim's statement 2 does; one_lease_per_shard stays the safety net under both.
--
-- The settle took its shard's hand-over lock (try-only, 011) before it came here, so a
-- producer's row for the shard waits for this commit and then sees the lease, as it sees a
-- head today. A worker scoped to a batch (`leash run --batch`) claims by batch, not through
-- heads, and leases none here. Rows not leased here are handed over as before (027's
-- statement: made heads when their shard has no head and no lease).
--
-- The cycle passes p_chain on to the settle and claims only what the settle did not lease.
-- Leased rows come back from the settle as rows with a token, and from the cycle as claimed
-- rows with status 'leased' (a claimed row's status is NULL). cycle_rows (the row-by-row
-- fallback) and every other caller lease nothing here (p_chain 0). How the dispatcher sizes
-- p_chain and shares a turn between its two connections: src/dispatch.c, cycle().

-- ---------------------------------------------------------------- hand-over
CREATE FUNCTION {{obj:lane_pass}}(p_tenants text[], p_shards text[], p_owner text, p_chain int,
                                  p_visibility_s float8, p_scope text[])
RETURNS TABLE (id bigint, attempts int, max_attempts int, tenant_id text, shard_key text,
               batch text, payload text, waited float8, token bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET leash.handover = 'on'
AS $$
#variable_conflict use_column
DECLARE
  rel bigint := {{table_literal}}::regclass::oid::bigint;
  nxt bigint[];       -- each shard's next pending row
  take bigint[];      -- those to lease here
  held_any boolean;
  n int := 0;
BEGIN
  -- 1. Each shard's next pending row (027's probe; most settled shards in a drain, a task's
  -- own `task:<id>`, have none).
  SELECT array_agg(p.id) INTO nxt
    FROM (SELECT DISTINCT u.tenant_id, u.shard_key
            FROM unnest(p_tenants, p_shards) AS u(tenant_id, shard_key)) k
    CROSS JOIN LATERAL (
      SELECT t.id FROM {{table}} t
       WHERE t.tenant_id = k.tenant_id AND t.shard_key = k.shard_key AND t.status = 'pending'
       ORDER BY t.run_after, t.id
       LIMIT 1) p;
  IF nxt IS NULL THEN
    RETURN;
  END IF;
  -- 2. Those a claim of this worker would take first (see the top), best first, locked and
  -- gated as the claim's statement 1 does.
  IF p_chain > 0 THEN
    held_any := EXISTS (SELECT 1 FROM {{obj:holds}});
    SELECT array_agg(c.id) INTO take FROM (
      SELECT x.id, x.tenant_id, x.shard_key FROM {{table}} x
       WHERE x.id = ANY (nxt) AND x.status = 'pending' AND x.run_after <= now()
         AND (p_scope IS NULL OR x.tenant_id = ANY (p_scope))
         AND NOT (held_any AND {{obj:held}}(x.tenant_id, x.batch, x.budget))
         AND NOT EXISTS (SELECT 1 FROM {{table}} h
                          WHERE h.is_head AND NOT h.parked AND h.tenant_id < x.tenant_id
                            AND (p_scope IS NULL OR h.tenant_id = ANY (p_scope)))
         AND NOT EXISTS (SELECT 1 FROM {{table}} h
                          WHERE h.is_head AND NOT h.parked AND h.tenant_id > x.tenant_id
                            AND (p_scope IS NULL OR h.tenant_id = ANY (p_scope)))
         AND NOT EXISTS (SELECT 1 FROM (SELECT b.id, b.priority, b.run_after FROM {{table}} b
                                         WHERE b.is_head AND NOT b.parked
                                           AND b.tenant_id = x.tenant_id
                                         ORDER BY b.tenant_id, b.priority DESC, b.run_after, b.id
                                         LIMIT 1) b
                          WHERE b.id <> x.id
                            AND (b.priority > x.priority
                                 OR (b.priority = x.priority
                                     AND (b.run_after, b.id) < (x.run_after, x.id))))
       ORDER BY x.priority DESC, x.run_after, x.id
       LIMIT p_chain
       FOR UPDATE OF x SKIP LOCKED) c
     WHERE pg_try_advisory_xact_lock(hashtextextended(c.tenant_id || chr(31) || c.shard_key, rel));
  END IF;
  -- 3. The lease (the claim's statement 2, to this worker), its shard checked again.
  IF take IS NOT NULL THEN
    RETURN QUERY
    UPDATE {{table}} q
       SET status = 'leased', lease_owner = p_owner,
           lease_token = nextval({{objlit:lease_token_seq}}::regclass),
           locked_until = now() + make_interval(secs => p_visibility_s),
           attempts = q.attempts + 1, started_at = clock_timestamp(), run_started_at = NULL,
           is_head = false, updated_at = now()
     WHERE q.id = ANY (take) AND q.status = 'pending'
       AND NOT EXISTS (SELECT 1 FROM {{table}} l
                        WHERE l.tenant_id = q.tenant_id AND l.shard_key = q.shard_key
                          AND l.status = 'leased' OFFSET 0)
       AND (NOT held_any OR NOT {{obj:held}}(q.tenant_id, q.batch, q.budget))
    RETURNING q.id, q.attempts, q.max_attempts, q.tenant_id, q.shard_key, q.batch,
              q.payload::text,
              extract(epoch FROM clock_timestamp() - greatest(q.run_after, q.created_at))::float8,
              q.lease_token;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = cardinality(nxt) THEN
      RETURN;
    END IF;
  END IF;
  -- 4. The rest are handed over: 027's lane_handover UPDATE, restated on the rows found in
  -- step 1 rather than called (it would probe every shard again); a row leased above is no
  -- longer pending. The hand-over's rule lives in both: a change to it changes both.
  UPDATE {{table}} q
     SET is_head = true,
         parked = (SELECT EXISTS (SELECT 1 FROM {{obj:holds}} x
                                   WHERE x.kind IN ('tenant', 'batch', 'budget')
                                     AND (x.until IS NULL OR x.until > now())))
                  AND {{obj:held}}(q.tenant_id, q.batch, q.budget)
   WHERE q.id = ANY (nxt) AND q.is_head IS NOT TRUE
     AND q.status = 'pending'
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = q.tenant_id AND o.shard_key = q.shard_key
                        AND o.is_head)
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = q.tenant_id AND o.shard_key = q.shard_key
                        AND o.status = 'leased');
END $$;

-- ---------------------------------------------------------------- settle
-- 025's, with three more arguments for lane_pass (the most rows to lease, the lease's length,
-- the worker's tenants) and the leased rows in its answer (token set). Its old form goes:
-- callers that name 16 arguments or fewer get p_chain 0 (cycle_rows, 016).
DROP FUNCTION IF EXISTS {{obj:settle}}(text, bigint[], bigint[], text[], float8[], text[],
                                       jsonb[], text[], boolean[], float8[], float8, float8,
                                       float8, text[], text[], float8[]);
CREATE FUNCTION {{obj:settle}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                               p_kinds text[], p_delays float8[], p_errors text[],
                               p_results jsonb[], p_causes text[], p_crashed boolean[],
                               p_run_s float8[], p_backoff_base float8 DEFAULT 2,
                               p_backoff_cap float8 DEFAULT 3600,
                               p_backoff_jitter float8 DEFAULT 0.5,
                               p_versions text[] DEFAULT NULL, p_labels text[] DEFAULT NULL,
                               p_waited float8[] DEFAULT NULL, p_chain int DEFAULT 0,
                               p_visibility_s float8 DEFAULT 600, p_scope text[] DEFAULT NULL)
RETURNS TABLE (id bigint, attempts int, status text, cause text, max_attempts int,
               tenant_id text, shard_key text, batch text, payload text, waited float8,
               token bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  rel int := {{table_literal}}::regclass::oid::int;
  busy bigint[];
  kt text[];
  ks text[];
  r_ids bigint[];
  r_attempts int[];
  r_status text[];
  r_cause text[];
  fin bigint[];       -- settled here to done or dead: what waiters may await
  waiting bigint[];   -- went to a wait on tasks here
  evented bigint[];   -- went to a wait on an event here
BEGIN
  -- The hand-over locks of these leases' shards, try-only (011); in no particular order, as
  -- a try never waits.
  SELECT array_agg(x.id) FILTER (WHERE NOT x.got),
         array_agg(x.tenant_id) FILTER (WHERE x.got), array_agg(x.shard_key) FILTER (WHERE x.got)
    INTO busy, kt, ks
    FROM (SELECT y.id, y.tenant_id, y.shard_key,
                 pg_try_advisory_xact_lock(rel, {{obj:lane_key}}(y.tenant_id, y.shard_key)) AS got
            FROM (SELECT q.id, q.tenant_id, q.shard_key FROM {{table}} q
                   WHERE q.id = ANY (p_ids)
                  OFFSET 0) y) x;
  -- Found by id (pkey), never through one_lease_per_shard: see 011. The answer is kept in
  -- arrays, with what the wakes below need, so they probe no row this statement wrote.
  WITH s AS (
    UPDATE {{table}} q
       SET status = CASE
                      WHEN u.crashed AND q.crashes + 1 >= q.max_crashes THEN 'dead'
                      WHEN u.kind = 'done' THEN 'done'
                      WHEN u.kind = 'wait' AND NOT u.crashed THEN 'pending'
                      WHEN u.kind = 'snooze' AND NOT u.crashed AND q.snoozes < q.max_snoozes
                      THEN 'pending'
                      WHEN u.kind IN ('retry', 'snooze') AND q.attempts < q.max_attempts
                      THEN 'pending'
                      ELSE 'dead' END,
           attempts = CASE
                        WHEN u.kind = 'wait' AND NOT u.crashed THEN q.attempts - 1   -- a wait spends none
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
                         WHEN u.kind = 'wait' AND NOT u.crashed THEN {{obj:wait_wakes_at}}(u.result)
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
                          WHEN u.kind = 'wait' AND NOT u.crashed THEN 'waiting'
                          ELSE u.cause END,
           crashes = q.crashes + CASE WHEN u.crashed THEN 1 ELSE 0 END,
           result = CASE WHEN u.kind = 'done' THEN u.result ELSE q.result END,
           -- The wait's columns: set by a wait, cleared by any other end (a woken task keeps
           -- them through its next execution, which reads them: leash.waited).
           wait_reason = CASE WHEN u.kind = 'wait' AND NOT u.crashed THEN u.result->>'reason' END,
           wait_ids = CASE
                        WHEN u.kind = 'wait' AND NOT u.crashed AND u.result->>'reason' = 'children'
                        THEN coalesce((SELECT array_agg(c.id ORDER BY c.id) FROM {{table}} c
                                        WHERE c.parent_id = q.id), '{}')
                        WHEN u.kind = 'wait' AND NOT u.crashed AND u.result->>'reason' = 'ids'
                        THEN ARRAY(SELECT jsonb_array_elements_text(u.result->'ids')::bigint)
                        END,
           wait_event = CASE
                          WHEN u.kind = 'wait' AND NOT u.crashed AND u.result->>'reason' = 'event'
                          THEN u.result->>'event' END,
           wait_deadline = CASE
                             WHEN u.kind = 'wait' AND NOT u.crashed
                                  AND u.result->>'reason' IN ('children', 'ids', 'event')
                             THEN now() + make_interval(secs => least((u.result->>'deadline')::float8,
                                                                    604800))
                             END,
           wait_on_deadline = CASE WHEN u.kind = 'wait' AND NOT u.crashed THEN u.result->>'on_deadline' END,
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
              u.version, u.label, u.waited, q.run_after = 'infinity' AS untimed,
              q.wait_ids IS NOT NULL AS awaits, q.wait_event IS NOT NULL AS evented
  ), gone AS (
    DELETE FROM {{obj:steps}} st USING s WHERE st.task_id = s.id AND s.status = 'done'
  ), h AS (
    INSERT INTO {{obj:attempts}} AS a (task_id, lease_token, attempt, worker, version, label,
                                       queue_wait_s, claimed_at, run_started_at, finished_at,
                                       kind, cause, status, error, crashed)
    SELECT s.id, s.lease_token,
           s.attempts + CASE WHEN s.kind IN ('snooze', 'wait') AND NOT s.crashed
                                  AND s.status = 'pending'
                                  AND s.last_cause IS DISTINCT FROM 'snooze_limit'
                             THEN 1 ELSE 0 END,
           p_owner, s.version, s.label, s.waited, s.started_at, s.run_started_at,
           s.finished_at, s.kind, s.last_cause, s.status,
           CASE WHEN s.status = 'done' THEN s.err ELSE s.last_error END, s.crashed
      FROM s
    ON CONFLICT DO NOTHING   -- one lease, one row; this table has no triggers (see 015)
  )
  SELECT array_agg(s.id), array_agg(s.attempts), array_agg(s.status), array_agg(s.last_cause),
         array_agg(s.id) FILTER (WHERE s.status IN ('done', 'dead')),
         array_agg(s.id) FILTER (WHERE s.status = 'pending' AND s.untimed AND s.awaits),
         array_agg(s.id) FILTER (WHERE s.status = 'pending' AND s.untimed AND s.evented)
    INTO r_ids, r_attempts, r_status, r_cause, fin, waiting, evented
    FROM s;
  RETURN QUERY
  SELECT x.id, x.attempts, x.status, x.cause, NULL::int, NULL::text, NULL::text, NULL::text,
         NULL::text, NULL::float8, NULL::bigint
    FROM unnest(r_ids, r_attempts, r_status, r_cause) AS x(id, attempts, status, cause)
  UNION ALL
  SELECT b, NULL::int, 'leased'::text, NULL::text, NULL::int, NULL::text, NULL::text,
         NULL::text, NULL::text, NULL::float8, NULL::bigint FROM unnest(busy) AS b;
  -- The hand-over, which leases up to p_chain of the next rows to this worker (lane_pass).
  IF kt IS NOT NULL THEN
    RETURN QUERY
    SELECT c.id, c.attempts, 'leased'::text, NULL::text, c.max_attempts, c.tenant_id,
           c.shard_key, c.batch, c.payload, c.waited, c.token
      FROM {{obj:lane_pass}}(kt, ks, p_owner, p_chain, p_visibility_s, p_scope) c;
  END IF;
  -- Wakes, in statements of their own (fresh snapshots, after this one's row locks): the
  -- waiters settled here whose awaited tasks already settled, and the waiters of rows
  -- settled here (see wait_wake_settled); waiters of an event whose signal is live.
  IF fin IS NOT NULL OR waiting IS NOT NULL THEN
    PERFORM {{obj:wait_wake_settled}}(fin, waiting);
  END IF;
  IF evented IS NOT NULL THEN
    PERFORM {{obj:wait_events}}(evented);
  END IF;
END $$;
-- ---------------------------------------------------------------- cycle
-- 016's, with p_chain: the settle leases up to that many next rows of its shards to this
-- worker, and the claim asks only for what it did not (p_n less the rows leased there). The
-- settle's leased rows come back as claimed rows (settled false) with status 'leased'.
DROP FUNCTION IF EXISTS {{obj:cycle}}(text, bigint[], bigint[], text[], float8[], text[], jsonb[],
                                      text[], boolean[], float8[], int, float8, text[], text,
                                      text, int, float8, float8, float8, text[], text[],
                                      float8[]);
CREATE FUNCTION {{obj:cycle}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                              p_kinds text[], p_delays float8[], p_errors text[],
                              p_results jsonb[], p_causes text[], p_crashed boolean[],
                              p_run_s float8[], p_n int, p_visibility_s float8,
                              p_tenants text[], p_batch text, p_ring text, p_ring_left int,
                              p_backoff_base float8 DEFAULT 2,
                              p_backoff_cap float8 DEFAULT 3600,
                              p_backoff_jitter float8 DEFAULT 0.5,
                              p_versions text[] DEFAULT NULL, p_labels text[] DEFAULT NULL,
                              p_waited float8[] DEFAULT NULL, p_chain int DEFAULT 0)
RETURNS TABLE (settled boolean, id bigint, attempts int, max_attempts int, tenant_id text,
               shard_key text, batch text, payload text, waited float8, status text,
               cause text, token bigint, ring text, ring_left int)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
  s record;
  chained int := 0;
BEGIN
  IF cardinality(p_ids) > 0 THEN
    FOR s IN SELECT * FROM {{obj:settle}}(p_owner, p_ids, p_tokens, p_kinds, p_delays, p_errors,
                                          p_results, p_causes, p_crashed, p_run_s,
                                          p_backoff_base, p_backoff_cap, p_backoff_jitter,
                                          p_versions, p_labels, p_waited,
                                          CASE WHEN p_batch IS NULL
                                               THEN greatest(coalesce(p_chain, 0), 0) ELSE 0 END,
                                          p_visibility_s, p_tenants) LOOP
      settled := s.token IS NULL;
      id := s.id;
      attempts := s.attempts;
      max_attempts := s.max_attempts;
      tenant_id := s.tenant_id;
      shard_key := s.shard_key;
      batch := s.batch;
      payload := s.payload;
      waited := s.waited;
      status := s.status;   -- 'leased' for a row leased here (a claimed row's is NULL)
      cause := s.cause;
      token := s.token;
      ring := NULL;
      ring_left := NULL;
      IF s.token IS NOT NULL THEN
        chained := chained + 1;
      END IF;
      RETURN NEXT;
    END LOOP;
  END IF;
  IF p_n - chained > 0 THEN
    RETURN QUERY
    SELECT CASE WHEN c.id IS NULL THEN NULL ELSE false END, c.id, c.attempts, c.max_attempts,
           c.tenant_id, c.shard_key, c.batch, c.payload, c.waited, NULL::text, NULL::text,
           c.token, c.ring, c.ring_left
      FROM {{obj:claim}}(p_owner, p_n - chained, p_visibility_s, p_tenants, p_batch, p_ring,
                         p_ring_left) c;
  END IF;
END $$;
