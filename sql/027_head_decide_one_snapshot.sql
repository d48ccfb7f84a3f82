-- A new row's headship decided in one snapshot (issue #14; the flake of
-- scheduler.lane_order_holds_for_rows_inserted_while_running, seen twice in CI's sanitizer
-- stages: a producer's rows of one shard ran out of the order it committed them).
--
-- 011's head_decide asked its two questions in two statements, and a function's statements
-- each take their own snapshot: "is a row of the shard leased?" (no: its head is pending),
-- then "which is its head?". A claim that leased the head between the two turned it into a
-- lease that the first statement had not seen and took it out of the second's answer, so the
-- new row found neither, became the head, and its shard then held a lease and a head younger
-- than the rows waiting behind it: the lease's hand-over saw a head and handed nothing over,
-- and the new row ran before every row that had been waiting. Reproduced by putting a 3 ms
-- sleep between the two statements (1 failure in 10 runs of that test; 0 in 40 without it).
--
-- Now both are one statement. In one snapshot a lease of a head is either not yet committed
-- (the head is seen) or committed (the lease is seen): the row becomes a head only when its
-- shard has neither, or when it is older than the shard's head and takes its place. That
-- taking can still miss: the head may be leased, or taken by another producer's older row,
-- after the snapshot, and its UPDATE then changes no row. The new row is then not a head:
-- the statement trigger (heads_insert) sees a row that is not, takes the shard's hand-over
-- lock and looks again with a fresh snapshot, which is the path every row behind a lease
-- already takes.
--
-- The hand-over (026) gains one condition, `q.status = 'pending'` on the row it updates.
-- Its candidate comes from the statement's snapshot; a row locked and leased meanwhile (a
-- claim scoped to a batch, `leash run --batch`, leases rows that are not heads; so does the
-- claim of one given row, p_only) is re-read by the UPDATE in its new version, where the
-- snapshot's "pending" no longer held, and was made a head: the CHECK leash_head_is_pending
-- refused it, failing the settle or the producer's INSERT that ran the hand-over. Now such a
-- row is passed over; its lease's settle hands over.

CREATE OR REPLACE FUNCTION {{obj:head_decide}}(p_id bigint, p_tenant text, p_shard text,
                                               p_run_after timestamptz, p_take boolean)
RETURNS boolean
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
  busy boolean;
  h_id bigint;
  h_run_after timestamptz;
BEGIN
  SELECT EXISTS (SELECT 1 FROM {{table}} o
                  WHERE o.tenant_id = p_tenant AND o.shard_key = p_shard
                    AND o.status = 'leased' AND o.id <> p_id),
         h.id, h.run_after
    INTO busy, h_id, h_run_after
    FROM (SELECT) one
    LEFT JOIN LATERAL (
      SELECT o.id, o.run_after FROM {{table}} o
       WHERE o.tenant_id = p_tenant AND o.shard_key = p_shard AND o.is_head AND o.id <> p_id
       ORDER BY o.run_after, o.id
       LIMIT 1) h ON true;
  IF busy THEN
    RETURN false;
  END IF;
  IF h_id IS NULL THEN
    RETURN true;
  END IF;
  IF NOT p_take OR (p_run_after, p_id) >= (h_run_after, h_id) THEN
    RETURN false;
  END IF;
  UPDATE {{table}} SET is_head = false WHERE id = h_id AND is_head;
  RETURN FOUND;
END $$;

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
     AND q.status = 'pending'
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = q.tenant_id AND o.shard_key = q.shard_key
                        AND o.is_head)
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = q.tenant_id AND o.shard_key = q.shard_key
                        AND o.status = 'leased');
END $$;
