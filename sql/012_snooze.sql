-- Snooze, and backoff with jitter and configurable (issue #15, item 1; README "Snooze and
-- backoff", docs/ARCHITECTURE.md).
--
-- A snooze (kind 'snooze' in the settle's kinds[], leash.snooze(delay [, reason])) puts the
-- task back to pending after its delay WITHOUT spending an attempt: the claim counted one
-- (attempts + 1), the settle gives it back (attempts - 1), as the drain's release does. It is
-- bounded by a count per task, max_snoozes (default 100, 0..10000; 0: every snooze is a
-- retry): snoozes counts the snoozes granted, snoozed_s their seconds (for people, not a
-- bound). The snooze that finds snoozes = max_snoozes is an ordinary retry with the snooze's
-- delay: it spends the attempt (dead when none is left), with last_cause 'snooze_limit' and a
-- last_error that says so. A snoozed row is pending and waits its turn like a retry: is_head
-- false, the hand-over of 011 decides (the lane's next row by (run_after, id) goes first).
-- A requeue starts the count again (src/queue.c).
--
-- Backoff, for a retry that names no delay: d = least(cap, base ^ attempts) seconds, then
-- jitter: d x (1 - jitter x u), u uniform in [0, 1). jitter 0.5 (the default) is "equal
-- jitter" (a wait in [d/2, d]: a retry never comes back sooner than half the policy, and a
-- burst's retries spread over the other half); 1 is "full jitter" ([0, d]); 0 none. base and
-- cap are the run's (`leash run --backoff-base S --backoff-cap S --backoff-jitter F`, passed
-- to the settle as scalars) unless the row names its own (backoff_base, backoff_cap: set at
-- enqueue; NULL = the run's). A delay the script names (retry or snooze) is used as given,
-- cut to 3600 s by the host (src/script.c), never jittered: an upstream's Retry-After means
-- that time.
--
-- The settle stays one statement in one round trip with 011's plan care (rows by pkey,
-- "(q.status || '')", the generic plan): only the SET expressions and three scalars are new.
-- The cycle and its row-by-row fallback pass the scalars through; the claim is 011's,
-- unchanged. The scalars have defaults (lifecycle.h's), so a caller of 011's sixteen
-- arguments still works.

ALTER TABLE {{table}}
  ADD COLUMN IF NOT EXISTS snoozes      int NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS snoozed_s    float8 NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS max_snoozes  int NOT NULL DEFAULT 100,
  ADD COLUMN IF NOT EXISTS backoff_base float8,   -- NULL: the run's --backoff-base
  ADD COLUMN IF NOT EXISTS backoff_cap  float8;   -- NULL: the run's --backoff-cap

-- Bounds (src/lifecycle.h LIFECYCLE_MAX_*): a base below 1 would shrink, a cap past a day
-- parks a task out of sight. New columns: nothing to set aside. Dropped first so that the
-- migration can run again over a table whose history was rolled back by hand (the columns
-- are kept, IF NOT EXISTS, like 010's).
ALTER TABLE {{table}}
  DROP CONSTRAINT IF EXISTS leash_max_snoozes_range,
  DROP CONSTRAINT IF EXISTS leash_snoozes_range,
  DROP CONSTRAINT IF EXISTS leash_backoff_base_range,
  DROP CONSTRAINT IF EXISTS leash_backoff_cap_range,
  ADD CONSTRAINT leash_max_snoozes_range CHECK (max_snoozes BETWEEN 0 AND 10000),
  ADD CONSTRAINT leash_snoozes_range CHECK (snoozes >= 0),
  ADD CONSTRAINT leash_backoff_base_range CHECK (backoff_base BETWEEN 1 AND 1000),
  ADD CONSTRAINT leash_backoff_cap_range CHECK (backoff_cap BETWEEN 0 AND 86400);

-- The backoff in seconds after `attempts` attempts: least(cap, base ^ attempts) x (1 -
-- jitter x u). Compared in logarithms first: base ^ attempts overflows float8 (an error in
-- PostgreSQL) long before attempts reaches max_attempts' bound for a large base. The one
-- definition the settle uses; tests/integration/lifecycle.sh checks it against lifecycle.c's
-- and leash.testing's.
CREATE OR REPLACE FUNCTION {{obj:backoff}}(p_base float8, p_cap float8, p_attempts int, p_jitter float8,
                                p_u float8) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN p_cap <= 0 THEN 0::float8
              WHEN p_attempts * ln(p_base) >= ln(p_cap) THEN p_cap
              ELSE p_base ^ p_attempts END * (1 - p_jitter * p_u)
$$;

-- ---------------------------------------------------------------- settle

-- 011's settle with snoozes and the run's backoff. "Granted" below is a snooze with a snooze
-- left: u.kind = 'snooze' AND NOT u.crashed AND q.snoozes < q.max_snoozes.
DROP FUNCTION IF EXISTS {{obj:settle}}(text, bigint[], bigint[], text[], float8[], text[],
                                       jsonb[], text[], boolean[], float8[]);
CREATE FUNCTION {{obj:settle}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                               p_kinds text[], p_delays float8[], p_errors text[],
                               p_results jsonb[], p_causes text[], p_crashed boolean[],
                               p_run_s float8[], p_backoff_base float8 DEFAULT 2,
                               p_backoff_cap float8 DEFAULT 3600,
                               p_backoff_jitter float8 DEFAULT 0.5)
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
                                   p_causes, p_crashed, p_run_s)
                             AS v(id, token, kind, delay, err, result, cause, crashed, run_s)
             WHERE busy IS NULL OR v.id <> ALL (busy)
             ORDER BY v.id) u
     WHERE q.id = ANY (p_ids) AND q.id = u.id AND q.lease_token = u.token
       AND q.lease_owner = p_owner AND (q.status || '') = 'leased'
    RETURNING q.id, q.attempts, q.status, q.last_cause
  ), gone AS (
    DELETE FROM {{obj:steps}} st USING s WHERE st.task_id = s.id AND s.status = 'done'
  )
  SELECT s.id, s.attempts, s.status, s.last_cause FROM s
  UNION ALL
  SELECT b, NULL::int, 'leased'::text, NULL::text FROM unnest(busy) AS b;
  IF kt IS NOT NULL THEN
    PERFORM {{obj:lane_handover}}(kt, ks);
  END IF;
END $$;

-- ---------------------------------------------------------------- cycle

-- 011's cycle with the run's backoff passed to the settle.
DROP FUNCTION IF EXISTS {{obj:cycle}}(text, bigint[], bigint[], text[], float8[], text[],
                                      jsonb[], text[], boolean[], float8[], int, float8,
                                      text[], text, text, int);
CREATE FUNCTION {{obj:cycle}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                              p_kinds text[], p_delays float8[], p_errors text[],
                              p_results jsonb[], p_causes text[], p_crashed boolean[],
                              p_run_s float8[], p_n int, p_visibility_s float8,
                              p_tenants text[], p_batch text, p_ring text, p_ring_left int,
                              p_backoff_base float8 DEFAULT 2,
                              p_backoff_cap float8 DEFAULT 3600,
                              p_backoff_jitter float8 DEFAULT 0.5)
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
                          p_backoff_jitter) s;
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

-- 011's row-by-row fallback with the run's backoff passed through (the set-aside settle is
-- a 'dead' outcome: no backoff).
DROP FUNCTION IF EXISTS {{obj:cycle_rows}}(text, bigint[], bigint[], text[], float8[], text[],
                                           jsonb[], text[], boolean[], float8[], int, float8,
                                           text[], text, text, int);
CREATE FUNCTION {{obj:cycle_rows}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                                   p_kinds text[], p_delays float8[], p_errors text[],
                                   p_results jsonb[], p_causes text[], p_crashed boolean[],
                                   p_run_s float8[], p_n int, p_visibility_s float8,
                                   p_tenants text[], p_batch text, p_ring text,
                                   p_ring_left int, p_backoff_base float8 DEFAULT 2,
                                   p_backoff_cap float8 DEFAULT 3600,
                                   p_backoff_jitter float8 DEFAULT 0.5)
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
                                               p_backoff_cap, p_backoff_jitter);
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
                                               p_backoff_cap, p_backoff_jitter);
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
                              '{NULL}', '{bad_row}', '{f}', '{NULL}') s;
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
