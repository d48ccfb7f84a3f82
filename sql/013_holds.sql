-- Holds (issues #15 and #17; docs/ARCHITECTURE.md, "Holds and budgets"): scopes claims skip.
-- A hold is (kind, scope, source): a tenant, a batch or a budget (the task's `budget`
-- column), held by `leash pause` ('pause'), a provider's refusal ('provider'), a spend cap
-- ('spend') or a budget's full window ('window', 014), until a time or until lifted. Each source lifts only its own hold: raising a cap
-- does not end an operator's pause, nor `leash resume` a cap. Held tasks stay pending;
-- nothing about them changes but whether claims look at them.
--
-- Parking. A claim must not pay for what it may not take (011's heads keep busy shards'
-- backlogs out of its index), and a held scope can be a whole night's batch. So a head
-- whose scope is held is parked: `parked` true takes it out of heads_ready_idx, the only
-- index claims read heads from, and a tenant whose heads are all parked drops out of the
-- claims' ring by the same index. A parked head is still its lane's head (is_head stays):
-- the lane keeps its order and nothing behind it overtakes.
--   * <table>_hold parks the scope's heads (one UPDATE, as long as the scope is wide);
--     <table>_unhold lifts the hold and unparks the heads no other hold covers, then wakes
--     the idle workers. A hold with an end is lifted by the first claim after it ends
--     (<table>_holds_expire, one claimer at a time).
--   * A row that becomes a head is parked by trigger when its scope is held (insert, a
--     hand-over, a head moved by hand), so later heads of a held scope stay out of sight.
--   * The claim's lease statement checks the holds again (a hand-over that raced the hold's
--     parking, or a batch-scoped claim, which reads rows rather than heads): no task of a
--     held scope is ever leased; a head it finds that way is parked then.
-- `parked` means something only while is_head: a row that stops being a head keeps whatever
-- it had, and is decided again when it becomes one.

ALTER TABLE {{table}}
  ADD COLUMN IF NOT EXISTS budget text,      -- the budget the task's calls use (claims skip it
                                             -- while the budget is paused)
  ADD COLUMN IF NOT EXISTS parked boolean NOT NULL DEFAULT false;

-- Dropped first: a schema whose history was rolled back by hand keeps it (badinput.sh).
ALTER TABLE {{table}} DROP CONSTRAINT IF EXISTS leash_budget_bounds;
ALTER TABLE {{table}}
  ADD CONSTRAINT leash_budget_bounds CHECK (octet_length(budget) BETWEEN 1 AND 200);

CREATE TABLE IF NOT EXISTS {{obj:holds}} (
  kind       text NOT NULL CHECK (kind IN ('tenant', 'batch', 'budget')),
  scope      text NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 512),
  source     text NOT NULL CHECK (source IN ('pause', 'provider', 'spend', 'window')),
  until      timestamptz,                  -- NULL: until lifted
  reason     text CHECK (octet_length(reason) <= 500),
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (kind, scope, source)
);

-- What claims read: pending heads that are not parked, by tenant, priority, age (011's
-- heads_idx with parked heads left out).
CREATE INDEX IF NOT EXISTS {{name:heads_ready_idx}}
  ON {{table}} (tenant_id, priority DESC, run_after, id) WHERE is_head AND NOT parked;
DROP INDEX IF EXISTS {{obj:heads_idx}};
-- Unparking: the parked rows.
CREATE INDEX IF NOT EXISTS {{name:parked_idx}} ON {{table}} (tenant_id) WHERE parked;
-- Parking a budget's heads.
CREATE INDEX IF NOT EXISTS {{name:heads_by_budget}} ON {{table}} (budget)
  WHERE is_head AND budget IS NOT NULL;

-- Is a task of (tenant, batch, budget) held now?
CREATE FUNCTION {{obj:held}}(p_tenant text, p_batch text, p_budget text) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM {{obj:holds}} x
                  WHERE ((x.kind = 'tenant' AND x.scope = p_tenant)
                         OR (x.kind = 'batch' AND x.scope = p_batch)
                         OR (x.kind = 'budget' AND x.scope = p_budget))
                    AND (x.until IS NULL OR x.until > now()))
$$;

-- A row becoming a head is parked when its scope is held (named after 011's heads_new_row
-- and heads_by_hand, so it runs after them and sees the is_head they decided).
CREATE FUNCTION {{obj:heads_park}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.parked := {{obj:held}}(NEW.tenant_id, NEW.batch, NEW.budget);
  RETURN NEW;
END $$;
CREATE TRIGGER {{name:heads_park_new}} BEFORE INSERT ON {{table}}
  FOR EACH ROW WHEN (NEW.is_head)
  EXECUTE FUNCTION {{obj:heads_park}}();
CREATE TRIGGER {{name:heads_park}} BEFORE UPDATE ON {{table}}
  FOR EACH ROW
  WHEN (NEW.is_head AND (OLD.is_head IS NOT TRUE OR NEW.tenant_id <> OLD.tenant_id
                         OR NEW.batch IS DISTINCT FROM OLD.batch
                         OR NEW.budget IS DISTINCT FROM OLD.budget))
  EXECUTE FUNCTION {{obj:heads_park}}();

-- Holds scope (p_kind, p_scope) for p_source until p_until (NULL: until lifted; a hold until
-- lifted is not shortened by one with an end, and ends only extend), and parks its heads.
CREATE FUNCTION {{obj:hold}}(p_kind text, p_scope text, p_source text, p_until timestamptz,
                             p_reason text)
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  INSERT INTO {{obj:holds}} AS x (kind, scope, source, until, reason)
  VALUES (p_kind, p_scope, p_source, p_until, left(p_reason, 500))
  ON CONFLICT (kind, scope, source) DO UPDATE
     SET until = CASE WHEN x.until IS NULL OR EXCLUDED.until IS NULL THEN NULL
                      ELSE greatest(x.until, EXCLUDED.until) END,
         reason = EXCLUDED.reason, updated_at = now();
  IF p_kind = 'tenant' THEN
    UPDATE {{table}} q SET parked = true
     WHERE q.tenant_id = p_scope AND q.is_head AND NOT q.parked;
  ELSIF p_kind = 'batch' THEN
    UPDATE {{table}} q SET parked = true
     WHERE q.batch = p_scope AND q.status = 'pending' AND q.is_head AND NOT q.parked;
  ELSE
    UPDATE {{table}} q SET parked = true
     WHERE q.budget = p_scope AND q.is_head AND NOT q.parked;
  END IF;
END $$;

-- Lifts p_source's hold (true when there was one) and unparks the heads no other hold covers;
-- idle workers are woken (LISTEN leash_<table oid>, as the insert trigger does).
CREATE FUNCTION {{obj:unhold}}(p_kind text, p_scope text, p_source text) RETURNS boolean
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
  there boolean;
  n int;
BEGIN
  DELETE FROM {{obj:holds}} x
   WHERE x.kind = p_kind AND x.scope = p_scope AND x.source = p_source;
  there := FOUND;
  UPDATE {{table}} q SET parked = false
   WHERE q.parked
     AND CASE p_kind WHEN 'tenant' THEN q.tenant_id WHEN 'batch' THEN q.batch
                     ELSE q.budget END = p_scope
     AND NOT {{obj:held}}(q.tenant_id, q.batch, q.budget);
  GET DIAGNOSTICS n = ROW_COUNT;
  IF n > 0 THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
  RETURN there;
END $$;

-- Lifts every hold whose end has passed. Returns how many.
CREATE FUNCTION {{obj:holds_expire}}() RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
  h record;
  n int := 0;
BEGIN
  FOR h IN SELECT x.kind, x.scope, x.source FROM {{obj:holds}} x WHERE x.until <= now() LOOP
    PERFORM {{obj:unhold}}(h.kind, h.scope, h.source);
    n := n + 1;
  END LOOP;
  RETURN n;
END $$;

-- ---------------------------------------------------------------- claim
-- 011's claim, reading heads_ready_idx (parked heads are out of sight), lifting expired
-- holds first, and checking holds again in the lease statement.
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
  k int;
  got int := 0;
  visits int := 0;
  wraps int := 0;
  fresh boolean := p_ring IS NULL;
  pass_took int := 0;
  ids bigint[] := '{}';
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
        IF p_tenants IS NOT NULL THEN
          SELECT x.t, x.t <= cur INTO nxt, wrapped FROM unnest(p_tenants) AS x(t)
           WHERE EXISTS (SELECT 1 FROM {{table}} h
                          WHERE h.is_head AND NOT h.parked AND h.tenant_id = x.t)
           ORDER BY x.t > coalesce(cur, '') DESC, x.t
           LIMIT 1;
        ELSIF cur IS NULL THEN
          SELECT h.tenant_id, false INTO nxt, wrapped FROM {{table}} h
           WHERE h.is_head AND NOT h.parked
           ORDER BY h.tenant_id
           LIMIT 1;
        ELSE
          SELECT n.tenant_id, n.wrapped INTO nxt, wrapped FROM (
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
        SELECT t.weight INTO w FROM {{obj:tenants}} t WHERE t.tenant_id = cur;
        IF NOT FOUND THEN
          w := 1;
        END IF;
        lft := w * quantum;
      END IF;
      -- This tenant's due heads, its highest priority first. Each level is one range of
      -- heads_idx, so heads scheduled later cost nothing. Rows this claim locked already are
      -- its own, which SKIP LOCKED does not skip: ids does.
      k := 0;
      lvl := NULL;
      LOOP
        WITH m AS (
          SELECT m.priority FROM {{table}} m
           WHERE m.is_head AND NOT m.parked AND m.tenant_id = cur
             AND (lvl IS NULL OR m.priority < lvl)
           ORDER BY m.tenant_id, m.priority DESC
           LIMIT 1)
        SELECT ids || coalesce(array_agg(c.id), '{}'), count(c.id), (SELECT m.priority FROM m)
          INTO ids, got, lvl
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
        EXIT WHEN k >= least(lft, need) OR lvl IS NULL;
      END LOOP;
      got := 0;
      IF k = 0 THEN
        lft := 0;
      ELSE
        need := need - k;
        lft := lft - k;
        pass_took := pass_took + k;
      END IF;
    END LOOP;
  END IF;

  -- Statement 2: the lease, one per shard (two heads of one shard in one claim would trip
  -- one_lease_per_shard).
  IF cardinality(ids) > 0 THEN
    RETURN QUERY
    UPDATE {{table}} q
       SET status = 'leased', lease_owner = p_owner,
           lease_token = nextval({{objlit:lease_token_seq}}::regclass),
           locked_until = now() + make_interval(secs => p_visibility_s),
           attempts = q.attempts + 1, started_at = now(), run_started_at = NULL,
           is_head = false, updated_at = now()
      FROM (SELECT DISTINCT ON (d.tenant_id, d.shard_key) d.id FROM {{table}} d
             WHERE d.id = ANY (ids)
             ORDER BY d.tenant_id, d.shard_key, d.run_after, d.id) c
     WHERE q.id = ANY (ids) AND q.id = c.id AND q.status = 'pending' AND q.run_after <= now()
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
     WHERE t.status = 'pending' AND t.run_after > now()
       AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
     ORDER BY t.run_after, t.id
     LIMIT 1;
  ELSIF got < p_n AND p_only IS NULL THEN
    SELECT extract(epoch FROM t.run_after - now())::float8 INTO due
      FROM {{table}} t
     WHERE t.status = 'pending' AND t.batch = p_batch AND t.run_after > now()
       AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
     ORDER BY t.batch, t.run_after, t.id
     LIMIT 1;
  END IF;
  RETURN QUERY SELECT NULL::bigint, NULL::int, NULL::int, NULL::text, NULL::text, NULL::text,
                      NULL::text, due, NULL::bigint, cur, greatest(lft, 0);
END $$;
