-- What a shard's hand-over costs (issue #14: serial orderings, where every settle hands its
-- shard to the next row). Measured on a 100-shard queue (pgbench, 50 shards handed over per
-- transaction, fsync on): the hand-over took 3.6-3.9 ms for 50 rows, 70-77 us a row, about
-- half of a settle's statement in a serial drain (pg_stat_statements). Two causes:
--
-- 1. Probes that visit every version a shard has had. heads_by_shard and
--    one_lease_per_shard have one key per shard, (tenant_id, shard_key), and every task of
--    the shard adds an entry under that key (its head version, its leased version). Btree
--    deduplication folds equal keys into one posting list, and a posting list can be
--    marked dead only when all of its row versions are: the live head's entry shares the
--    list with its shard's dead ones, so every probe ("has this shard a head?", "a lease?"),
--    the hand-over's two, the producers' one, the lease's recheck, fetched every dead
--    version from the heap, as many as the shard had run since the last vacuum (200 in a
--    benchmark, a night's backlog in a real shard). Without deduplication each version
--    is its own entry: a scan that finds it dead marks it so, and later probes step over it
--    without a heap fetch. The settings apply to entries inserted from now on; posting
--    lists already there go when vacuum removes their versions.
-- 2. The parking trigger (013) ran a PL/pgSQL function per handed-over row to look up the
--    holds. The hand-over now sets `parked` itself in its UPDATE, checking the holds only
--    when any hold is in force (one probe per statement; usually none is), and the trigger
--    skips rows it updates (leash.handover, set for the function's duration only). Holds are
--    read in the statement's snapshot, where the trigger read them in its own: a hold that
--    commits while the hand-over runs is met, as before, by the lease statement's own check
--    of the holds (013: no task of a held scope is ever leased; a head found that way is
--    parked then).
--
-- Same hand-over otherwise (025's statement, one snapshot; same checks that the shard has
-- no head and no lease), same callers. JIT is off for it, as for the cycle's functions
-- (007): with enable_seqscan off its estimated cost passes jit_above_cost, and a caller
-- that had JIT on (a change by hand, through heads_left) compiled it on every call, 0.4 s.

ALTER INDEX {{obj:heads_by_shard}} SET (deduplicate_items = off);
ALTER INDEX {{obj:one_lease_per_shard}} SET (deduplicate_items = off);

CREATE OR REPLACE FUNCTION {{obj:lane_handover}}(p_tenants text[], p_shards text[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET leash.handover = 'on'
AS $$
BEGIN
  -- Each shard's next pending row first (one probe; most settled shards, a task's own
  -- `task:<id>`, have none), then the two checks for the shards that have one.
  WITH n AS MATERIALIZED (
    SELECT p.id
      FROM (SELECT DISTINCT u.tenant_id, u.shard_key
              FROM unnest(p_tenants, p_shards) AS u(tenant_id, shard_key)) k
      CROSS JOIN LATERAL (
        SELECT t.id FROM {{table}} t
         WHERE t.tenant_id = k.tenant_id AND t.shard_key = k.shard_key AND t.status = 'pending'
         ORDER BY t.run_after, t.id
         LIMIT 1) p)
  UPDATE {{table}} q
     SET is_head = true,
         parked = (SELECT EXISTS (SELECT 1 FROM {{obj:holds}} x
                                   WHERE x.kind IN ('tenant', 'batch', 'budget')
                                     AND (x.until IS NULL OR x.until > now())))
                  AND {{obj:held}}(q.tenant_id, q.batch, q.budget)
   WHERE q.id = ANY (ARRAY(SELECT n.id FROM n)) AND q.is_head IS NOT TRUE
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = q.tenant_id AND o.shard_key = q.shard_key
                        AND o.is_head)
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = q.tenant_id AND o.shard_key = q.shard_key
                        AND o.status = 'leased');
END $$;

-- 013's trigger, now skipping the hand-over's rows (it sets `parked` itself).
DROP TRIGGER IF EXISTS {{name:heads_park}} ON {{table}};
CREATE TRIGGER {{name:heads_park}} BEFORE UPDATE ON {{table}}
  FOR EACH ROW
  WHEN (NEW.is_head AND (OLD.is_head IS NOT TRUE OR NEW.tenant_id <> OLD.tenant_id
                         OR NEW.batch IS DISTINCT FROM OLD.batch
                         OR NEW.budget IS DISTINCT FROM OLD.budget)
        AND current_setting('leash.handover', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION {{obj:heads_park}}();
