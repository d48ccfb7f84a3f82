-- A claim short of its want ends when its tenant is the only one with heads (issue #14).
--
-- An idle worker asks for as many rows as it has free slots and room in its ready buffer,
-- and a pickup brings one. The ring (011, as 025 states it) picked the one row from the only
-- tenant with heads, found its turn short (every priority level picked: no more of its due
-- heads can be locked by this claim), wrapped, came back to the same tenant as "the only
-- one with heads", gave it the rest of the want and picked again, for nothing, before a
-- third visit saw the pass had taken nothing. The pick's own statement already tells who
-- comes next (nx: the next tenant with heads after cur, wrapping to the first); when that
-- is cur, wrapped, cur is the only tenant with heads and the claim leaves the ring there.
-- One statement fewer in every short claim of a single tenant: measured inside one backend
-- (2,000 rounds, a claim of up to 10 rows finding 1), p50 see docs/PERFORMANCE.md.
--
-- Nothing else changes: the ring's place returned is the same (cur, with none of its turn
-- left, as the second look left it), a claim scoped to tenants (p_tenants, whose picks do
-- not look ahead) goes round as before, and a turn cut by the tenant's share (k = lft, not
-- short) still passes the rest on or, for the only tenant, takes it at once.

CREATE OR REPLACE FUNCTION {{obj:claim}}(p_owner text, p_n int, p_visibility_s float8, p_tenants text[],
                              p_batch text, p_ring text, p_ring_left int,
                              p_only bigint DEFAULT NULL)
RETURNS TABLE (id bigint, attempts int, max_attempts int, tenant_id text, shard_key text,
               batch text, payload text, waited float8, token bigint, ring text,
               ring_left int)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  rel bigint := {{table_literal}}::regclass::oid::bigint;
  need int := p_n;
  cur text := p_ring;
  lft int := coalesce(p_ring_left, 0);
  w int := 1;
  quantum constant int := 16;
  nxt text;
  wrapped boolean;
  lvl int;
  lowest int;
  ahead boolean := false;   -- the last pick found the tenant after cur (pnxt, pwrapped, pw)
  pnxt text;
  pwrapped boolean;
  pw int;
  k int;
  got int := 0;
  visits int := 0;
  wraps int := 0;
  fresh boolean := p_ring IS NULL;
  pass_took int := 0;
  ids bigint[] := '{}';
  keys text[] := '{}';      -- the shards of ids, in step (NULL: not collected)
  due float8;
  held_any boolean;
BEGIN
  -- Holds (013): expired ones are lifted first, by one claimer at a time (try-only).
  held_any := EXISTS (SELECT 1 FROM {{obj:holds}});
  IF held_any AND EXISTS (SELECT 1 FROM {{obj:holds}} x WHERE x.until <= now())
     AND pg_try_advisory_xact_lock(rel::int, 0) THEN
    PERFORM {{obj:holds_expire}}();
    held_any := EXISTS (SELECT 1 FROM {{obj:holds}});
  END IF;
  -- Statement 1 picks candidates, locks them (skipping rows others hold and shards with a
  -- lease in its snapshot) and takes each one's shard gate, try-only; statement 2 leases
  -- with a fresh snapshot and checks again that the shard holds no lease: 007's proof.
  IF p_only IS NOT NULL OR p_batch IS NOT NULL THEN
    keys := NULL;
  END IF;
  IF p_only IS NOT NULL THEN
    SELECT coalesce(array_agg(c.id), '{}') INTO ids FROM (
      SELECT t.id, t.tenant_id, t.shard_key FROM {{table}} t
       WHERE t.id = p_only AND t.status = 'pending'
       FOR UPDATE SKIP LOCKED) c
     WHERE pg_try_advisory_xact_lock(hashtextextended(c.tenant_id || chr(31) || c.shard_key, rel));
  ELSIF p_batch IS NOT NULL THEN
    SELECT coalesce(array_agg(c.id), '{}') INTO ids FROM (
      SELECT t.id, t.tenant_id, t.shard_key FROM {{table}} t
       WHERE t.status = 'pending' AND t.batch = p_batch AND t.run_after <= now()
         AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
         AND NOT EXISTS (SELECT 1 FROM {{table}} l
                          WHERE l.tenant_id = t.tenant_id AND l.shard_key = t.shard_key
                            AND l.status = 'leased' OFFSET 0)
       ORDER BY t.batch, t.run_after, t.id
       LIMIT p_n
       FOR UPDATE SKIP LOCKED) c
     WHERE pg_try_advisory_xact_lock(hashtextextended(c.tenant_id || chr(31) || c.shard_key, rel));
  ELSE
    -- The ring: tenants with heads in tenant_id order from the process's place, a turn of up
    -- to weight x 16 heads each (deficit round robin). What a tenant did not use of its turn
    -- carries to the process's next claim, so shares hold over successive claims whatever
    -- their sizes; a tenant with fewer heads than its turn passes the rest on. Back at the
    -- same tenant after a wrap, it is the only one with heads: it takes the rest at once.
    WHILE need > 0 AND visits < p_n + 16 LOOP
      IF cur IS NULL OR lft <= 0 THEN
        -- The next tenant with heads after cur, wrapping to the first: one statement, each
        -- branch with its range start in the index condition.
        IF ahead THEN
          nxt := pnxt;
          wrapped := pwrapped;
          w := pw;
          ahead := false;
        ELSIF p_tenants IS NOT NULL THEN
          SELECT x.t, x.t <= cur, coalesce((SELECT t.weight FROM {{obj:tenants}} t
                                             WHERE t.tenant_id = x.t), 1)
            INTO nxt, wrapped, w FROM unnest(p_tenants) AS x(t)
           WHERE EXISTS (SELECT 1 FROM {{table}} h
                          WHERE h.is_head AND NOT h.parked AND h.tenant_id = x.t)
           ORDER BY x.t > coalesce(cur, '') DESC, x.t
           LIMIT 1;
        ELSIF cur IS NULL THEN
          SELECT h.tenant_id, false, coalesce((SELECT t.weight FROM {{obj:tenants}} t
                                               WHERE t.tenant_id = h.tenant_id), 1)
            INTO nxt, wrapped, w FROM {{table}} h
           WHERE h.is_head AND NOT h.parked
           ORDER BY h.tenant_id
           LIMIT 1;
        ELSE
          SELECT n.tenant_id, n.wrapped, coalesce((SELECT t.weight FROM {{obj:tenants}} t
                                                  WHERE t.tenant_id = n.tenant_id), 1)
            INTO nxt, wrapped, w FROM (
            (SELECT h.tenant_id, false AS wrapped FROM {{table}} h
              WHERE h.is_head AND NOT h.parked AND h.tenant_id > cur
              ORDER BY h.tenant_id
              LIMIT 1)
            UNION ALL
            (SELECT h.tenant_id, true FROM {{table}} h
              WHERE h.is_head AND NOT h.parked
              ORDER BY h.tenant_id
              LIMIT 1)) n
           LIMIT 1;
        END IF;
        EXIT WHEN nxt IS NULL;                   -- no heads anywhere
        IF wrapped THEN
          EXIT WHEN fresh AND pass_took = 0;     -- a whole pass found nothing to take
          wraps := wraps + 1;
          EXIT WHEN wraps > 2;
          fresh := true;
          pass_took := 0;
        END IF;
        IF wrapped AND nxt = cur THEN
          lft := need;                           -- the only tenant with heads
          CONTINUE;
        END IF;
        cur := nxt;
        visits := visits + 1;
        lft := w * quantum;
      END IF;
      -- This tenant's due heads, its highest priority first. Each level is one range of
      -- heads_idx, so heads scheduled later cost nothing. Rows this claim locked already are
      -- its own, which SKIP LOCKED does not skip: ids does.
      k := 0;
      lvl := NULL;
      lowest := NULL;
      LOOP
        WITH m AS (
          SELECT m.priority FROM {{table}} m
           WHERE m.is_head AND NOT m.parked AND m.tenant_id = cur
             AND (lvl IS NULL OR m.priority < lvl)
           ORDER BY m.tenant_id, m.priority DESC
           LIMIT 1),
        nx AS (   -- the next tenant with heads after cur, as the ring's own statement finds it
          SELECT n.tenant_id, n.wrapped, coalesce((SELECT t.weight FROM {{obj:tenants}} t
                                                  WHERE t.tenant_id = n.tenant_id), 1) AS w
            FROM ((SELECT a.tenant_id, false AS wrapped FROM {{table}} a
                    WHERE a.is_head AND NOT a.parked AND a.tenant_id > cur AND p_tenants IS NULL
                    ORDER BY a.tenant_id
                    LIMIT 1)
                  UNION ALL
                  (SELECT a.tenant_id, true FROM {{table}} a
                    WHERE a.is_head AND NOT a.parked AND p_tenants IS NULL
                    ORDER BY a.tenant_id
                    LIMIT 1)) n
           LIMIT 1)
        SELECT ids || coalesce(array_agg(c.id), '{}'),
               keys || coalesce(array_agg(c.tenant_id || chr(31) || c.shard_key), '{}'),
               count(c.id), (SELECT m.priority FROM m),
               coalesce(lowest, (SELECT b.priority FROM {{table}} b
                                  WHERE b.is_head AND NOT b.parked AND b.tenant_id = cur
                                  ORDER BY b.tenant_id, b.priority
                                  LIMIT 1)),
               (SELECT nx.tenant_id FROM nx), (SELECT nx.wrapped FROM nx), (SELECT nx.w FROM nx)
          INTO ids, keys, got, lvl, lowest, pnxt, pwrapped, pw
          FROM (SELECT h.id, h.tenant_id, h.shard_key FROM {{table}} h
                 WHERE h.is_head AND NOT h.parked AND h.tenant_id = cur
                   AND h.priority = (SELECT m.priority FROM m)
                   AND h.run_after <= now() AND h.id <> ALL (ids)
                   AND NOT EXISTS (SELECT 1 FROM {{table}} l
                                    WHERE l.tenant_id = h.tenant_id
                                      AND l.shard_key = h.shard_key
                                      AND l.status = 'leased' OFFSET 0)
                 ORDER BY h.tenant_id, h.priority DESC, h.run_after, h.id
                 LIMIT least(lft, need) - k
                 FOR UPDATE SKIP LOCKED) c
         WHERE pg_try_advisory_xact_lock(hashtextextended(c.tenant_id || chr(31) || c.shard_key,
                                                          rel));
        k := k + got;
        ahead := p_tenants IS NULL;
        EXIT WHEN k >= least(lft, need) OR lvl IS NULL OR lvl <= lowest;
      END LOOP;
      got := 0;
      IF k = 0 OR k < least(lft, need) THEN
        -- Less than it could take: every level was picked, so this claim can lock no more of
        -- its due heads (another pick would find none); its turn ends here.
        lft := 0;
        need := need - k;
        pass_took := pass_took + k;
        -- 029: and when the next tenant with heads after it is itself, wrapped, it is the only
        -- one: the claim ends (the ring would come back to it and look again for nothing).
        EXIT WHEN ahead AND pwrapped AND pnxt = cur;
      ELSE
        lft := lft - k;
        need := need - k;
        pass_took := pass_took + k;
      END IF;
    END LOOP;
  END IF;

  -- Statement 2: the lease, one per shard (two heads of one shard in one claim would trip
  -- one_lease_per_shard). The one is chosen first, in a statement of its own: joined into
  -- the UPDATE, the generic plan (one row expected) re-ran the DISTINCT ON for every row.
  -- The ring's picks carry their shards: a shard has one head, so they are distinct but
  -- for a shard with two (a race the heads allow, 011), and only then are rows read again.
  IF cardinality(ids) > 1
     AND (keys IS NULL OR (SELECT count(DISTINCT sk.key) FROM unnest(keys) AS sk(key)) < cardinality(ids)) THEN
    SELECT array_agg(c.id) INTO ids
      FROM (SELECT DISTINCT ON (d.tenant_id, d.shard_key) d.id FROM {{table}} d
             WHERE d.id = ANY (ids)
             ORDER BY d.tenant_id, d.shard_key, d.run_after, d.id) c;
  END IF;
  IF cardinality(ids) > 0 THEN
    RETURN QUERY
    UPDATE {{table}} q
       SET status = 'leased', lease_owner = p_owner,
           lease_token = nextval({{objlit:lease_token_seq}}::regclass),
           locked_until = now() + make_interval(secs => p_visibility_s),
           attempts = q.attempts + 1, started_at = clock_timestamp(), run_started_at = NULL,
           is_head = false, updated_at = now()
     WHERE q.id = ANY (ids) AND q.status = 'pending' AND q.run_after <= now()
       AND NOT EXISTS (SELECT 1 FROM {{table}} l
                        WHERE l.tenant_id = q.tenant_id AND l.shard_key = q.shard_key
                          AND l.status = 'leased' OFFSET 0)
       AND (NOT held_any OR NOT {{obj:held}}(q.tenant_id, q.batch, q.budget))
    RETURNING q.id, q.attempts, q.max_attempts, q.tenant_id, q.shard_key, q.batch,
              q.payload::text,
              extract(epoch FROM clock_timestamp() - greatest(q.run_after, q.created_at))::float8,
              q.lease_token, NULL::text, NULL::int;
    GET DIAGNOSTICS got = ROW_COUNT;
    -- A head that became one while its scope was being held (a hand-over racing the
    -- hold's parking) is parked now, so claims stop looking at it.
    IF held_any AND got < cardinality(ids) THEN
      UPDATE {{table}} q SET parked = true
       WHERE q.id = ANY (ids) AND q.status = 'pending' AND q.is_head AND NOT q.parked
         AND {{obj:held}}(q.tenant_id, q.batch, q.budget);
    END IF;
  END IF;

  IF got < p_n AND p_only IS NULL AND p_batch IS NULL THEN
    SELECT extract(epoch FROM t.run_after - now())::float8 INTO due
      FROM {{table}} t
     WHERE t.status = 'pending' AND t.run_after > now() AND t.run_after < 'infinity'
       AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
     ORDER BY t.run_after, t.id
     LIMIT 1;
  ELSIF got < p_n AND p_only IS NULL THEN
    SELECT extract(epoch FROM t.run_after - now())::float8 INTO due
      FROM {{table}} t
     WHERE t.status = 'pending' AND t.batch = p_batch AND t.run_after > now()
       AND t.run_after < 'infinity'
       AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
     ORDER BY t.batch, t.run_after, t.id
     LIMIT 1;
  END IF;
  RETURN QUERY SELECT NULL::bigint, NULL::int, NULL::int, NULL::text, NULL::text, NULL::text,
                      NULL::text, due, NULL::bigint, cur, greatest(lft, 0);
END $$;
