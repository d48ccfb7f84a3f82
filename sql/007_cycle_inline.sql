-- The cycle, written out whole: settle and claim inline, no nested function calls (the
-- separate functions of earlier versions are dropped below). Measured (pgbench, 10 clients,
-- one outcome + one claim per call, fsync on): the earlier cycle ran at 0.55-0.62x the two-transaction floor, this one at 1.0x. Where the
-- time went: `<table>_settle` is an SQL function, planned again on every call; plpgsql kept
-- custom plans for the claim (the generic plan's cost, estimated with LIMIT at 10 % of the
-- table, always looked worse), so every call was planned too; and that estimate crossed
-- jit_above_cost, so where the server has JIT, a generic plan was compiled on each call
-- (80 ms). Hence the two SET clauses: plans are made once per session and never compiled.
-- The generic plans walk the same indexes in the same order as the custom ones did (the
-- ORDER BY matches claim_idx and batch_claim_idx exactly); bench/run.sh's depth workload
-- watches that they stay so.
--
-- Settled rows now carry the status the settle wrote (a retry with no attempt left is
-- `dead`), so the host counts what the database did instead of recomputing it.
-- The old helpers go: nothing calls them any more (a single outcome is settled by a cycle
-- that claims nothing).
DROP FUNCTION IF EXISTS {{obj:cycle}}(text, bigint[], int[], text[], float8[], text[], jsonb[],
                                      int, float8, text[], text);
DROP FUNCTION IF EXISTS {{obj:claim}}(text, int, float8, text[], text);
DROP FUNCTION IF EXISTS {{obj:settle}}(text, bigint[], int[], text[], float8[], text[], jsonb[]);

-- Rows: settled = true, one per outcome written (id, attempt, and status = what it became;
-- an outcome missing from the answer was late); settled = false, one per task claimed; settled IS NULL, at most
-- one, when the claim came back short: `waited` is then the seconds until the scope's next
-- pending row becomes runnable (NULL: none).
CREATE FUNCTION {{obj:cycle}}(p_owner text, p_ids bigint[], p_attempts int[],
                              p_kinds text[], p_delays float8[], p_errors text[],
                              p_results jsonb[], p_n int, p_visibility_s float8,
                              p_tenants text[], p_batch text)
RETURNS TABLE (settled boolean, id bigint, attempts int, max_attempts int, tenant_id text,
               shard_key text, batch text, payload text, waited float8, status text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
  got int := 0;
  picked bigint[];
  due float8;
BEGIN
  -- Settle: each outcome fenced by (id, owner, attempt, leased); a worker whose lease was
  -- lost and taken over matches nothing. Kinds: done (result stored), retry (backoff
  -- least(3600, 2^attempts) s unless a delay is given; dead once attempts are exhausted),
  -- dead. Rows are visited in id order so two cycles cannot deadlock. Steps of tasks that
  -- are done are dropped (003).
  IF cardinality(p_ids) > 0 THEN
    RETURN QUERY
    WITH s AS (
      UPDATE {{table}} q
         SET status = CASE
                        WHEN u.kind = 'done' THEN 'done'
                        WHEN u.kind = 'retry' AND q.attempts < q.max_attempts THEN 'pending'
                        ELSE 'dead' END,
             run_after = CASE
                           WHEN u.kind = 'retry' AND q.attempts < q.max_attempts
                           THEN now() + make_interval(secs => coalesce(u.delay,
                                                                       least(3600, 2 ^ q.attempts)))
                           ELSE q.run_after END,
             last_error = CASE WHEN u.kind = 'done' THEN q.last_error ELSE u.err END,
             result = CASE WHEN u.kind = 'done' THEN u.result ELSE q.result END,
             locked_until = NULL, finished_at = now(), updated_at = now()
        FROM (SELECT * FROM unnest(p_ids, p_attempts, p_kinds, p_delays, p_errors, p_results)
                            AS v(id, attempt, kind, delay, err, result)
               ORDER BY v.id) u
       WHERE q.id = u.id AND q.attempts = u.attempt AND q.lease_owner = p_owner
         AND q.status = 'leased'
      RETURNING q.id, q.attempts, q.status
    ), gone AS (
      DELETE FROM {{obj:steps}} st USING s WHERE st.task_id = s.id AND s.status = 'done'
    )
    SELECT true, s.id, s.attempts, NULL::int, NULL::text, NULL::text, NULL::text, NULL::text,
           NULL::float8, s.status
      FROM s;
  END IF;
  IF p_n <= 0 THEN
    RETURN;
  END IF;

  -- Claim, statement 1: candidates are runnable rows whose shard shows no lease in this
  -- snapshot (a cheap pre-filter; the snapshot may be stale), row-locked SKIP LOCKED so
  -- claimers scan past each other, one per shard (a batch holding two rows of one shard would
  -- break exclusion by itself), then gated by a try-only advisory lock per shard. The window
  -- equals the batch size; OFFSET 0 keeps the NOT EXISTS a per-row index probe and stops the
  -- gate from being pushed below DISTINCT ON. One branch per scope, so each walks its own
  -- index in (run_after, id) order.
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

  -- Claim, statement 2. Why two claimers can never lease one shard: statement 1 took, per
  -- candidate shard, a transaction-level advisory lock (try-only); this statement runs with a
  -- fresh snapshot taken after those locks are held. Whoever held a shard's lock before us has
  -- committed (a commit is visible before the transaction's locks are released), so its lease
  -- is visible to the NOT EXISTS; whoever comes after us fails the try-lock until we commit.
  -- Should anything bypass the gate, the unique index one_lease_per_shard (002) raises instead
  -- of leasing twice. No lock here or in statement 1 is ever waited for (SKIP LOCKED, try-only),
  -- so claimers cannot deadlock or queue behind each other.
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
              q.status;
    GET DIAGNOSTICS got = ROW_COUNT;
  END IF;
  IF got >= p_n THEN
    RETURN;
  END IF;

  -- Short: when is the next pending row of the scope due? One step of the claim index.
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
         NULL::text, NULL::text, due, NULL::text;
END $$;
