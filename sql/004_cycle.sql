-- History: this first cycle called <table>_claim and <table>_settle, which are not created
-- any more; a fresh database replaces it with 007's in the same migrate transaction.
-- One round trip per dispatcher cycle: settle the outcomes that finished and claim the next
-- rows in the same transaction, so a busy worker pays one commit per cycle instead of two.
-- The claim runs after the settle, in statements of its own (fresh snapshots), so a shard
-- this very cycle released can be claimed again at once; the claim keeps every property it
-- has alone (see <table>_claim in 002).
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
