-- Why each outcome happened, crash accounting and quarantine, and rows that cannot stall the
-- queue (docs/SECURITY.md, "Crashes and quarantine" and "A row cannot stall the queue").
--
-- last_cause: the cause of the last outcome (src/lifecycle.c names them: script_error,
-- timeout, wedged, crash, quarantined, bad_row, ...). crashes: executions that ended because
-- the worker, not the script, failed (the reaper found the lease expired, or the watchdog
-- reported the slot wedged). Once crashes reach max_crashes the task is quarantined: dead,
-- never claimed again unless `leash requeue` resets it.
ALTER TABLE {{table}}
  ADD COLUMN IF NOT EXISTS last_cause  text,
  ADD COLUMN IF NOT EXISTS crashes     int NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS max_crashes int NOT NULL DEFAULT 3;

-- Bounds, so that plain SQL cannot insert what the claim cannot lease or settle (src/
-- lifecycle.h has the same numbers as LIFECYCLE_MAX_*): a shard key of 8,000 bytes fails
-- one_lease_per_shard's btree entry at lease time (an index entry is at most ~2,700 bytes;
-- 512 + 512 leaves room), attempts at INT_MAX fails attempts + 1. A pending row must have an
-- attempt left (every writer keeps that: reap, settle and release only make a row pending
-- below max_attempts, requeue and enqueue start at 0), so the claim's attempts + 1 stays
-- within max_attempts. The status set is 001's CHECK already.
--
-- Rows of a live table that break them and could still be claimed (pending, leased) are set
-- aside first, dead with last_cause 'bad_row' and the bound they break, so this migration does
-- not fail. Finished rows (done, dead) are left as they are: the constraints are added NOT
-- VALID (checked on every insert and update from now on), then validated when no old row
-- breaks them, which is always the case on a new table.
UPDATE {{table}}
   SET status = 'dead', locked_until = NULL, last_cause = 'bad_row', finished_at = now(),
       updated_at = now(),
       last_error = 'bad row, set aside by migration 010: ' || concat_ws('; ',
         CASE WHEN octet_length(tenant_id) > 512
              THEN 'tenant_id is longer than 512 bytes (constraint leash_tenant_id_bytes)' END,
         CASE WHEN octet_length(shard_key) > 512
              THEN 'shard_key is longer than 512 bytes (constraint leash_shard_key_bytes)' END,
         CASE WHEN octet_length(batch) > 512
              THEN 'batch is longer than 512 bytes (constraint leash_batch_bytes)' END,
         CASE WHEN max_attempts NOT BETWEEN 1 AND 1000
              THEN 'max_attempts is not within 1..1000 (constraint leash_max_attempts_range)' END,
         CASE WHEN attempts < 0 OR attempts > max_attempts
                   OR (status = 'pending' AND attempts >= max_attempts)
              THEN 'attempts is not within 0..max_attempts with one left while pending '
                   '(constraint leash_attempts_range)' END)
 WHERE status IN ('pending', 'leased')
   AND (octet_length(tenant_id) > 512 OR octet_length(shard_key) > 512
        OR octet_length(batch) > 512 OR max_attempts NOT BETWEEN 1 AND 1000
        OR attempts < 0 OR attempts > max_attempts
        OR (status = 'pending' AND attempts >= max_attempts));

ALTER TABLE {{table}}
  ADD CONSTRAINT leash_tenant_id_bytes CHECK (octet_length(tenant_id) <= 512) NOT VALID,
  ADD CONSTRAINT leash_shard_key_bytes CHECK (octet_length(shard_key) <= 512) NOT VALID,
  ADD CONSTRAINT leash_batch_bytes CHECK (octet_length(batch) <= 512) NOT VALID,
  ADD CONSTRAINT leash_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000) NOT VALID,
  ADD CONSTRAINT leash_attempts_range
    CHECK (attempts >= 0 AND attempts <= max_attempts
           AND (status <> 'pending' OR attempts < max_attempts)) NOT VALID,
  ADD CONSTRAINT leash_max_crashes_range CHECK (max_crashes BETWEEN 1 AND 1000) NOT VALID,
  ADD CONSTRAINT leash_crashes_range CHECK (crashes >= 0 AND crashes <= max_crashes) NOT VALID;

DO $$
DECLARE
  c text;
BEGIN
  FOREACH c IN ARRAY ARRAY['leash_tenant_id_bytes', 'leash_shard_key_bytes', 'leash_batch_bytes',
                           'leash_max_attempts_range', 'leash_attempts_range',
                           'leash_max_crashes_range', 'leash_crashes_range'] LOOP
    BEGIN
      EXECUTE format('ALTER TABLE %s VALIDATE CONSTRAINT %I', {{table_literal}}::regclass, c);
    EXCEPTION WHEN check_violation THEN
      RAISE NOTICE 'constraint % stays NOT VALID: finished rows from before it break it', c;
    END;
  END LOOP;
END $$;

-- Which SQLSTATEs are a row's fault (its data, a constraint, an index entry it cannot make,
-- a user trigger's RAISE): data_exception (22), integrity_constraint_violation (23),
-- program_limit_exceeded (54), plpgsql errors (P0). Everything else (the connection,
-- query_canceled, serialization and deadlocks, resources, permissions, read-only, a missing
-- object) is not the row's and propagates: setting rows aside for it would empty the queue
-- into dead. src/queue.c applies the same rule to decide whether to call the row-by-row
-- fallback.
CREATE FUNCTION {{obj:row_error}}(p_sqlstate text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT left(p_sqlstate, 2) IN ('22', '23', '54', 'P0')
$$;

-- The cycle of 007 with the outcome's cause: p_causes (cause names) is written to
-- last_cause, p_crashed (the host's lifecycle_cause_is_crash) adds one to crashes, and a crash
-- that reaches max_crashes quarantines the row. (A result jsonb refuses fails in the
-- parameters, before any of this runs; the host settles that outcome again as the script's
-- contract error, src/host.c settle_one_by_one, so it is not a bad row.)
-- The claim is 007's, word for word (its comments hold the proofs of exclusion and of why no
-- lock is waited for; they are not repeated here). A settled row also returns last_cause.
DROP FUNCTION IF EXISTS {{obj:cycle}}(text, bigint[], int[], text[], float8[], text[], jsonb[],
                                      int, float8, text[], text);

CREATE FUNCTION {{obj:cycle}}(p_owner text, p_ids bigint[], p_attempts int[],
                              p_kinds text[], p_delays float8[], p_errors text[],
                              p_results jsonb[], p_causes text[], p_crashed boolean[],
                              p_n int, p_visibility_s float8, p_tenants text[], p_batch text)
RETURNS TABLE (settled boolean, id bigint, attempts int, max_attempts int, tenant_id text,
               shard_key text, batch text, payload text, waited float8, status text,
               cause text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
  got int := 0;
  picked bigint[];
  due float8;
BEGIN
  -- Settle (007), plus: a crash outcome counts, and the one that reaches max_crashes
  -- quarantines the task whatever its kind asked.
  IF cardinality(p_ids) > 0 THEN
    RETURN QUERY
    WITH s AS (
      UPDATE {{table}} q
         SET status = CASE
                        WHEN u.crashed AND q.crashes + 1 >= q.max_crashes THEN 'dead'
                        WHEN u.kind = 'done' THEN 'done'
                        WHEN u.kind = 'retry' AND q.attempts < q.max_attempts THEN 'pending'
                        ELSE 'dead' END,
             run_after = CASE
                           WHEN u.crashed AND q.crashes + 1 >= q.max_crashes THEN q.run_after
                           WHEN u.kind = 'retry' AND q.attempts < q.max_attempts
                           THEN now() + make_interval(secs => coalesce(u.delay,
                                                                       least(3600, 2 ^ q.attempts)))
                           ELSE q.run_after END,
             last_error = CASE
                            WHEN u.crashed AND q.crashes + 1 >= q.max_crashes
                            THEN format('quarantined: its executions crashed %s times '
                                        '(max_crashes %s); the last: %s; requeue it to run '
                                        'it again', q.crashes + 1, q.max_crashes,
                                        coalesce(u.err, u.cause))
                            WHEN u.kind = 'done' THEN q.last_error ELSE u.err END,
             last_cause = CASE
                            WHEN u.crashed AND q.crashes + 1 >= q.max_crashes THEN 'quarantined'
                            ELSE u.cause END,
             crashes = q.crashes + CASE WHEN u.crashed THEN 1 ELSE 0 END,
             result = CASE WHEN u.kind = 'done' THEN u.result ELSE q.result END,
             locked_until = NULL, finished_at = now(), updated_at = now()
        FROM (SELECT v.id, v.attempt, v.kind, v.delay, v.err, v.result, v.cause,
                     coalesce(v.crashed, false) AS crashed
                FROM unnest(p_ids, p_attempts, p_kinds, p_delays, p_errors, p_results,
                            p_causes, p_crashed)
                       AS v(id, attempt, kind, delay, err, result, cause, crashed)
               ORDER BY v.id) u
       WHERE q.id = u.id AND q.attempts = u.attempt AND q.lease_owner = p_owner
         AND q.status = 'leased'
      RETURNING q.id, q.attempts, q.status, q.last_cause
    ), gone AS (
      DELETE FROM {{obj:steps}} st USING s WHERE st.task_id = s.id AND s.status = 'done'
    )
    SELECT true, s.id, s.attempts, NULL::int, NULL::text, NULL::text, NULL::text, NULL::text,
           NULL::float8, s.status, s.last_cause
      FROM s;
  END IF;
  IF p_n <= 0 THEN
    RETURN;
  END IF;

  -- Claim, statement 1 (007).
  IF p_batch IS NULL THEN
    SELECT array_agg(k.id) INTO picked FROM (
      SELECT d.id FROM (
        SELECT x.* FROM (
          SELECT DISTINCT ON (c.tenant_id, c.shard_key) c.* FROM (
            SELECT t.id, t.tenant_id, t.shard_key, t.run_after
              FROM {{table}} t
             WHERE t.status = 'pending' AND t.run_after <= now()
               AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
               AND NOT EXISTS (SELECT 1 FROM {{table}} l
                                WHERE l.tenant_id = t.tenant_id AND l.shard_key = t.shard_key
                                  AND l.status = 'leased' OFFSET 0)
             ORDER BY t.run_after, t.id
             LIMIT p_n
             FOR UPDATE SKIP LOCKED) c
           ORDER BY c.tenant_id, c.shard_key, c.run_after, c.id) x
         ORDER BY x.run_after, x.id
        OFFSET 0) d
       WHERE pg_try_advisory_xact_lock(hashtextextended(d.tenant_id || chr(31) || d.shard_key,
                                                        {{table_literal}}::regclass::oid::bigint))
       LIMIT p_n) k;
  ELSE
    SELECT array_agg(k.id) INTO picked FROM (
      SELECT d.id FROM (
        SELECT x.* FROM (
          SELECT DISTINCT ON (c.tenant_id, c.shard_key) c.* FROM (
            SELECT t.id, t.tenant_id, t.shard_key, t.run_after
              FROM {{table}} t
             WHERE t.status = 'pending' AND t.batch = p_batch AND t.run_after <= now()
               AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
               AND NOT EXISTS (SELECT 1 FROM {{table}} l
                                WHERE l.tenant_id = t.tenant_id AND l.shard_key = t.shard_key
                                  AND l.status = 'leased' OFFSET 0)
             ORDER BY t.batch, t.run_after, t.id
             LIMIT p_n
             FOR UPDATE SKIP LOCKED) c
           ORDER BY c.tenant_id, c.shard_key, c.run_after, c.id) x
         ORDER BY x.run_after, x.id
        OFFSET 0) d
       WHERE pg_try_advisory_xact_lock(hashtextextended(d.tenant_id || chr(31) || d.shard_key,
                                                        {{table_literal}}::regclass::oid::bigint))
       LIMIT p_n) k;
  END IF;

  -- Claim, statement 2 (007).
  IF picked IS NOT NULL THEN
    RETURN QUERY
    UPDATE {{table}} q
       SET status = 'leased', lease_owner = p_owner,
           locked_until = now() + make_interval(secs => p_visibility_s),
           attempts = q.attempts + 1, started_at = now(), updated_at = now()
     WHERE q.id = ANY (picked) AND q.status = 'pending'
       AND NOT EXISTS (SELECT 1 FROM {{table}} l
                        WHERE l.tenant_id = q.tenant_id AND l.shard_key = q.shard_key
                          AND l.status = 'leased' OFFSET 0)
    RETURNING false, q.id, q.attempts, q.max_attempts, q.tenant_id, q.shard_key, q.batch,
              q.payload::text,
              extract(epoch FROM clock_timestamp() - greatest(q.run_after, q.created_at))::float8,
              q.status, NULL::text;
    GET DIAGNOSTICS got = ROW_COUNT;
  END IF;
  IF got >= p_n THEN
    RETURN;
  END IF;

  -- Short (007).
  IF p_batch IS NULL THEN
    SELECT extract(epoch FROM t.run_after - now())::float8 INTO due
      FROM {{table}} t
     WHERE t.status = 'pending' AND t.run_after > now()
       AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
     ORDER BY t.run_after, t.id
     LIMIT 1;
  ELSE
    SELECT extract(epoch FROM t.run_after - now())::float8 INTO due
      FROM {{table}} t
     WHERE t.status = 'pending' AND t.batch = p_batch AND t.run_after > now()
       AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
     ORDER BY t.batch, t.run_after, t.id
     LIMIT 1;
  END IF;
  RETURN QUERY
  SELECT NULL::boolean, NULL::bigint, NULL::int, NULL::int, NULL::text, NULL::text,
         NULL::text, NULL::text, due, NULL::text, NULL::text;
END $$;

-- The fallback, called by the host (src/queue.c) only after <table>_cycle failed with a row's
-- error (<table>_row_error): the same arguments, the same answer, in subtransactions. A
-- BEGIN ... EXCEPTION block opens a subtransaction each time it is entered, so the cycle
-- itself has none: its fast path pays nothing for this.
--   Settle: all outcomes at once first; should that fail, one by one, and an outcome that
--   still fails sets its row aside (fenced like every write): dead, last_cause 'bad_row',
--   last_error the database's message. It comes back as settled with status dead.
--   Claim: all at once first (the cycle's claim); should that fail, candidates one at a time
--   in claim order: the same try-lock gate, then a one-row statement 2 with a fresh snapshot
--   taken after the lock is held, so 007's exclusion argument holds row by row; a row whose
--   lease fails is set aside the same way (and named in a WARNING). A unique violation there
--   is another claimer's lease of the shard, not the row's fault: skipped, not set aside.
-- A row that even the set-aside cannot write (a user trigger refusing every update of it)
-- is skipped with a WARNING: it costs this fallback on each cycle that meets it, the rest of
-- the queue still flows.
CREATE FUNCTION {{obj:cycle_rows}}(p_owner text, p_ids bigint[], p_attempts int[],
                                   p_kinds text[], p_delays float8[], p_errors text[],
                                   p_results jsonb[], p_causes text[], p_crashed boolean[],
                                   p_n int, p_visibility_s float8, p_tenants text[],
                                   p_batch text)
RETURNS TABLE (settled boolean, id bigint, attempts int, max_attempts int, tenant_id text,
               shard_key text, batch text, payload text, waited float8, status text,
               cause text)
LANGUAGE plpgsql
SET jit = off
SET enable_seqscan = off
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
  ok boolean;
BEGIN
  IF n > 0 THEN
    BEGIN
      RETURN QUERY SELECT * FROM {{obj:cycle}}(p_owner, p_ids, p_attempts, p_kinds, p_delays,
                                               p_errors, p_results, p_causes, p_crashed, 0,
                                               p_visibility_s, p_tenants, p_batch);
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
      RETURN QUERY SELECT * FROM {{obj:cycle}}(p_owner, p_ids[i:i], p_attempts[i:i],
                                               p_kinds[i:i], p_delays[i:i], p_errors[i:i],
                                               p_results[i:i], p_causes[i:i], p_crashed[i:i],
                                               0, p_visibility_s, p_tenants, p_batch);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
      IF NOT {{obj:row_error}}(st) THEN
        RAISE;
      END IF;
      ok := false;
      BEGIN
        UPDATE {{table}} q
           SET status = 'dead', last_cause = 'bad_row', locked_until = NULL,
               last_error = 'bad row: its outcome could not be written: ' || msg,
               finished_at = now(), updated_at = now()
         WHERE q.id = p_ids[i] AND q.attempts = p_attempts[i] AND q.lease_owner = p_owner
           AND q.status = 'leased'
        RETURNING true, q.id, q.attempts, q.status, q.last_cause
             INTO settled, id, attempts, status, cause;
        ok := FOUND;
      EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        IF NOT {{obj:row_error}}(st) THEN
          RAISE;
        END IF;
        RAISE WARNING 'task % cannot be settled nor set aside: %', p_ids[i], msg;
      END;
      IF ok THEN
        max_attempts := NULL; tenant_id := NULL; shard_key := NULL; batch := NULL;
        payload := NULL; waited := NULL;
        RETURN NEXT;
      END IF;
    END;
  END LOOP;
  IF p_n <= 0 THEN
    RETURN;
  END IF;

  BEGIN
    RETURN QUERY SELECT * FROM {{obj:cycle}}(p_owner, '{}', '{}', '{}', '{}', '{}', '{}', '{}',
                                             '{}', p_n, p_visibility_s, p_tenants, p_batch);
    RETURN;
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE;
    IF NOT {{obj:row_error}}(st) THEN
      RAISE;
    END IF;
  END;

  SELECT array_agg(k.id) INTO cands FROM (
    SELECT t.id FROM {{table}} t
     WHERE t.status = 'pending' AND t.run_after <= now()
       AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
       AND (p_batch IS NULL OR t.batch = p_batch)
     ORDER BY t.run_after, t.id
     LIMIT p_n
     FOR UPDATE SKIP LOCKED) k;
  FOREACH cand IN ARRAY coalesce(cands, '{}') LOOP
    EXIT WHEN got >= p_n;
    SELECT t.tenant_id, t.shard_key INTO c_tenant, c_shard FROM {{table}} t WHERE t.id = cand;
    CONTINUE WHEN NOT pg_try_advisory_xact_lock(
      hashtextextended(c_tenant || chr(31) || c_shard, {{table_literal}}::regclass::oid::bigint));
    ok := false;
    BEGIN
      UPDATE {{table}} q
         SET status = 'leased', lease_owner = p_owner,
             locked_until = now() + make_interval(secs => p_visibility_s),
             attempts = q.attempts + 1, started_at = now(), updated_at = now()
       WHERE q.id = cand AND q.status = 'pending'
         AND NOT EXISTS (SELECT 1 FROM {{table}} l
                          WHERE l.tenant_id = q.tenant_id AND l.shard_key = q.shard_key
                            AND l.status = 'leased' OFFSET 0)
      RETURNING false, q.id, q.attempts, q.max_attempts, q.tenant_id, q.shard_key, q.batch,
                q.payload::text,
                extract(epoch FROM clock_timestamp() - greatest(q.run_after, q.created_at))::float8,
                q.status, NULL::text
           INTO settled, id, attempts, max_attempts, tenant_id, shard_key, batch, payload,
                waited, status, cause;
      ok := FOUND;
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
      IF NOT {{obj:row_error}}(st) THEN
        RAISE;
      END IF;
      IF st <> '23505' THEN
        BEGIN
          UPDATE {{table}} q
             SET status = 'dead', last_cause = 'bad_row', locked_until = NULL,
                 last_error = 'bad row: it cannot be leased: ' || msg,
                 finished_at = now(), updated_at = now()
           WHERE q.id = cand AND q.status = 'pending';
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
    IF ok THEN
      got := got + 1;
      RETURN NEXT;
    END IF;
  END LOOP;
  IF got < p_n THEN
    -- When the next row is due is not looked up here: NULL makes an idle worker poll.
    RETURN QUERY SELECT NULL::boolean, NULL::bigint, NULL::int, NULL::int, NULL::text,
                        NULL::text, NULL::text, NULL::text, NULL::float8, NULL::text, NULL::text;
  END IF;
END $$;

-- The reaper (002), now counting each expired lease as a crash: the worker died, froze or
-- was wedged under it. The crash that reaches max_crashes quarantines the task; otherwise it
-- goes back to pending (or dead when attempts are exhausted) as before. p_only limits it to
-- one row, for the fallback below. Returns what it did, as 002's did, plus the cause written
-- (crash or quarantined), which the host counts.
DROP FUNCTION IF EXISTS {{obj:reap}}();
CREATE FUNCTION {{obj:reap}}(p_only bigint DEFAULT NULL)
RETURNS TABLE (id bigint, status text, tenant_id text, lease_owner text, cause text)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtextextended('leash.reap',
                                                    {{table_literal}}::regclass::oid::bigint)) THEN
    RETURN;
  END IF;
  RETURN QUERY
  WITH r AS (
    SELECT e.id, e.lease_owner AS owner FROM {{table}} e
     WHERE e.status = 'leased' AND (e.locked_until IS NULL OR e.locked_until < now())
       AND (p_only IS NULL OR e.id = p_only)
     ORDER BY e.id
     LIMIT 1000
     FOR UPDATE SKIP LOCKED)
  UPDATE {{table}} q
     SET status = CASE WHEN q.crashes + 1 >= q.max_crashes THEN 'dead'
                       WHEN q.attempts >= q.max_attempts THEN 'dead'
                       ELSE 'pending' END,
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
  RETURNING q.id, q.status, q.tenant_id, r.owner, q.last_cause;
  IF FOUND THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
END $$;

-- The reaper's fallback, called by src/queue.c only after <table>_reap failed with a row's
-- error: one expired lease at a time, and one that cannot be reaped is set aside (dead,
-- bad_row), so one row cannot stop reaping for all.
CREATE FUNCTION {{obj:reap_rows}}()
RETURNS TABLE (id bigint, status text, tenant_id text, lease_owner text, cause text)
LANGUAGE plpgsql
SET enable_seqscan = off
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
        UPDATE {{table}} q
           SET status = 'dead', last_cause = 'bad_row', locked_until = NULL,
               last_error = 'bad row: its expired lease could not be reaped: ' || msg,
               finished_at = now(), updated_at = now()
         WHERE q.id = cand AND q.status = 'leased'
        RETURNING q.id, q.status, q.tenant_id, q.lease_owner, q.last_cause;
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
