-- History only: this first cycle called <table>_claim and <table>_settle, which no migration
-- creates any more (002 once did). It is never called: 007 drops it (and the two helpers,
-- where an old database still has them) and writes the cycle out whole, and 010 replaces
-- that one; a fresh database goes through all three in one migrate transaction, so after
-- migrate no function of this file is left (cli.sh, migrate_leaves_only_the_current_functions).
-- What it introduced stays: one round trip per dispatcher cycle, settle then claim in one
-- transaction, the claim in statements of its own (fresh snapshots) so a shard this very
-- cycle released can be claimed again at once.
-- When the claim comes back short, one more row (settled IS NULL) tells in `waited` how many
-- seconds until the next pending row of the scope becomes runnable (NULL: none), so an idle
-- worker can sleep until then instead of polling; the lookup is one step of the claim index.
CREATE OR REPLACE FUNCTION {{obj:cycle}}(p_owner text, p_ids bigint[], p_attempts int[],
                                         p_kinds text[], p_delays float8[], p_errors text[],
                                         p_results jsonb[], p_n int, p_visibility_s float8,
                                         p_tenants text[], p_batch text)
RETURNS TABLE (settled boolean, id bigint, attempts int, max_attempts int, tenant_id text,
               shard_key text, batch text, payload text, waited float8)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  got int := 0;
BEGIN
  IF cardinality(p_ids) > 0 THEN
    RETURN QUERY
    SELECT true, s.id, NULL::int, NULL::int, NULL::text, NULL::text, NULL::text, NULL::text,
           NULL::float8
      FROM {{obj:settle}}(p_owner, p_ids, p_attempts, p_kinds, p_delays, p_errors, p_results) s;
  END IF;
  IF p_n > 0 THEN
    RETURN QUERY
    SELECT false, c.id, c.attempts, c.max_attempts, c.tenant_id, c.shard_key, c.batch,
           c.payload::text,
           -- pickup latency: from runnable (created, or run_after if later) to this claim
           extract(epoch FROM clock_timestamp() - greatest(c.run_after, c.created_at))::float8
      FROM {{obj:claim}}(p_owner, p_n, p_visibility_s, p_tenants, p_batch) c;
    GET DIAGNOSTICS got = ROW_COUNT;
    IF got < p_n THEN
      RETURN QUERY
      SELECT NULL::boolean, NULL::bigint, NULL::int, NULL::int, NULL::text, NULL::text,
             NULL::text, NULL::text,
             (SELECT extract(epoch FROM t.run_after - now())::float8
                FROM {{table}} t
               WHERE t.status = 'pending' AND t.run_after > now()
                 AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
                 AND (p_batch IS NULL OR t.batch = p_batch)
               ORDER BY t.run_after, t.id
               LIMIT 1);
    END IF;
  END IF;
END $$;
