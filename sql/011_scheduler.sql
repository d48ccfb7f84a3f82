-- The scheduler (issue #14; docs/ARCHITECTURE.md, "The scheduler"): claims that cost what
-- they can take, never what is parked behind busy shards; fair shares between tenants by
-- weight; priorities; a fresh lease token per claim; when handle started.
--
-- Heads. is_head marks, per (tenant_id, shard_key), the pending row that is next: the
-- shard's oldest pending row by (run_after, id) while nothing else of the shard is pending
-- ahead of it. A shard is a lane: its other pending rows wait behind their head, out of every
-- index a claim reads (heads_idx holds pending heads only), so a busy shard's backlog is
-- never scanned and the claim's cost does not grow with it.
-- Exclusion is what it was (002, 007): one_lease_per_shard, a unique index the database
-- checks against the newest entries, never lets two leased rows of a shard commit; the
-- claim's try-only advisory gate plus a second statement with a fresh snapshot make claimers
-- skip busy shards instead of tripping over the index. Heads only choose what is looked at: a
-- shard with two heads (two producers racing into an empty shard, a requeue by hand) is
-- still leased once at a time, by the same gate.
--
-- Keeping heads right, with the table as the API:
--   * INSERT and COPY (plain SQL included): a row trigger makes a new row a head unless its
--     shard has a lease, or a head older than it by (run_after, id); a younger head gives
--     way (rows the same statement inserted before it count: a row trigger sees them). A row that is not, behind work committed before it, makes
--     its producer hold the shard's hand-over lock (shared, below) until it commits: the
--     statement trigger takes it, then looks again.
--   * The hand-over: a settle (done, dead, or retry) makes the shard's oldest pending row the
--     head when the shard has none. It takes the hand-over lock exclusively first, try-only,
--     and reads with a snapshot taken after it: every producer that un-headed a row behind
--     this lease has committed by then, so its row is seen. When a producer still holds the
--     lock, the settle is not written now: the host writes it again a moment later (status
--     'leased' in the answer). Nothing waits for a producer's transaction.
--   * A row made pending by hand (requeue, `UPDATE ... SET status = 'pending'`), or moved to
--     another shard, becomes a head when that shard has none; a head or a lease that leaves
--     by hand (status, tenant or shard changed, row deleted) hands over (row triggers; the
--     queue's own functions run with leash.internal = on, which they skip).
--   * <table>_repair_heads finds shards with pending rows but neither a head nor a lease (a
--     restore with triggers disabled, a hand-made change racing a producer): migrate runs it,
--     and the reaper every few minutes.
--
-- Fair shares. <table>_tenants holds weights (default 1; `leash tenant set`). A claim walks
-- the tenants that have heads in a ring (tenant_id order, wrapping) from the claiming
-- process's position (passed in and returned: no shared row is written per claim, claims
-- never wait for each other), taking a turn of up to weight x 16 heads from each: deficit
-- round robin. Every process divides its claims by weight, so the fleet does. Within a tenant:
-- higher priority first, then the oldest head.

ALTER TABLE {{table}}
  ADD COLUMN IF NOT EXISTS priority       int NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS is_head        boolean,      -- NULL on insert: the trigger decides
  ADD COLUMN IF NOT EXISTS lease_token    bigint,       -- the current or last lease's token
  ADD COLUMN IF NOT EXISTS run_started_at timestamptz;  -- when handle started (last attempt)

ALTER TABLE {{table}}
  ADD CONSTRAINT leash_priority_range CHECK (priority BETWEEN -1000 AND 1000);

CREATE SEQUENCE IF NOT EXISTS {{obj:lease_token_seq}};

CREATE TABLE IF NOT EXISTS {{obj:tenants}} (
  tenant_id  text PRIMARY KEY CHECK (octet_length(tenant_id) <= 512),
  weight     int NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- What claims read: pending heads, by tenant, priority, age.
CREATE INDEX IF NOT EXISTS {{name:heads_idx}}
  ON {{table}} (tenant_id, priority DESC, run_after, id) WHERE is_head;
-- "Has this shard a pending head?", one probe.
CREATE INDEX IF NOT EXISTS {{name:heads_by_shard}}
  ON {{table}} (tenant_id, shard_key) WHERE is_head;
-- A shard's pending rows in lane order: the hand-over's one probe.
CREATE INDEX IF NOT EXISTS {{name:pending_by_shard}}
  ON {{table}} (tenant_id, shard_key, run_after, id) WHERE status = 'pending';

-- The hand-over lock of a shard: the two-key advisory lock space (the claim's gate uses the
-- one-key space, so producers never block claims). Key: the table's oid, the shard's hash.
CREATE FUNCTION {{obj:lane_key}}(p_tenant text, p_shard text) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT hashtext(p_tenant || chr(31) || p_shard)
$$;

-- ---------------------------------------------------------------- keeping heads

-- Is pending row p_id, in (p_tenant, p_shard) and due at p_run_after, its shard's head? Not
-- while another row of the shard is leased (that lease's settle hands the shard to its oldest
-- row) or is a head older by (run_after, id). A younger head gives way when p_take (a row due
-- now does not wait behind one scheduled for later); only INSERT asks for that: an UPDATE's
-- trigger must not change rows its own statement may still update (PostgreSQL refuses it).
CREATE FUNCTION {{obj:head_decide}}(p_id bigint, p_tenant text, p_shard text,
                                    p_run_after timestamptz, p_take boolean) RETURNS boolean
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
  h_id bigint;
  h_run_after timestamptz;
BEGIN
  IF EXISTS (SELECT 1 FROM {{table}} o
              WHERE o.tenant_id = p_tenant AND o.shard_key = p_shard AND o.status = 'leased'
                AND o.id <> p_id) THEN
    RETURN false;
  END IF;
  SELECT o.id, o.run_after INTO h_id, h_run_after FROM {{table}} o
   WHERE o.tenant_id = p_tenant AND o.shard_key = p_shard AND o.is_head AND o.id <> p_id
   ORDER BY o.run_after, o.id
   LIMIT 1;
  IF h_id IS NULL THEN
    RETURN true;
  END IF;
  IF p_take AND (p_run_after, p_id) < (h_run_after, h_id) THEN
    UPDATE {{table}} SET is_head = false WHERE id = h_id AND is_head;
    RETURN true;
  END IF;
  RETURN false;
END $$;

-- Before INSERT (row): is the new row its shard's head? Rows inserted before it by the same
-- statement are visible here, so a block of one shard gets one head, its oldest.
CREATE FUNCTION {{obj:heads_new_row}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.is_head := {{obj:head_decide}}(NEW.id, NEW.tenant_id, NEW.shard_key, NEW.run_after, true);
  RETURN NEW;
END $$;
CREATE TRIGGER {{name:heads_new_row}} BEFORE INSERT ON {{table}}
  FOR EACH ROW WHEN (NEW.status = 'pending' AND NEW.is_head IS NULL)
  EXECUTE FUNCTION {{obj:heads_new_row}}();

-- After INSERT (statement): the shards where a new row waits behind work committed before
-- this statement (a lease, or a head this statement did not insert) are locked, shared, and
-- looked at again with a fresh snapshot. A hand-over of such a shard either committed before
-- the lock (and is seen now: the shard may need its head from us) or waits for this
-- producer's commit (and then sees our rows). More than 1,000 such shards in one statement:
-- the rows of the shards past that are made heads instead (a shard with two heads is
-- correct, only less tidy) rather than take a lock per shard without bound (PostgreSQL's lock
-- table is finite).
CREATE FUNCTION {{obj:heads_insert}}() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
  lt text[];
  ls text[];
BEGIN
  SELECT array_agg(b.tenant_id), array_agg(b.shard_key) INTO lt, ls
    FROM (SELECT DISTINCT n.tenant_id, n.shard_key FROM new_rows n
            WHERE n.status = 'pending' AND NOT n.is_head
              AND NOT EXISTS (SELECT 1 FROM new_rows h
                               WHERE h.tenant_id = n.tenant_id AND h.shard_key = n.shard_key
                                 AND h.is_head)) b;
  IF lt IS NULL THEN
    RETURN NULL;
  END IF;
  IF cardinality(lt) > 1000 THEN
    UPDATE {{table}} q SET is_head = true
      FROM unnest(lt[1001:], ls[1001:]) AS k(tenant_id, shard_key), new_rows n
     WHERE q.id = n.id AND n.tenant_id = k.tenant_id AND n.shard_key = k.shard_key
       AND q.is_head IS NOT TRUE;
    lt := lt[1:1000];
    ls := ls[1:1000];
  END IF;
  PERFORM pg_advisory_xact_lock_shared(TG_RELID::int, {{obj:lane_key}}(k.tenant_id, k.shard_key))
     FROM unnest(lt, ls) AS k(tenant_id, shard_key);
  -- Looked at again after the locks: a shard whose lease or head went meanwhile (and whose
  -- hand-over could not see our rows) gets its head from them.
  PERFORM {{obj:lane_handover}}(lt, ls);
  RETURN NULL;
END $$;
CREATE TRIGGER {{name:heads_insert}} AFTER INSERT ON {{table}}
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {{obj:heads_insert}}();

-- The hand-over of these shards: one with nothing leased and no pending head gets its oldest
-- pending row as head. Callers that must not miss a producer hold the shards' hand-over
-- locks, taken before this statement's snapshot.
CREATE FUNCTION {{obj:lane_handover}}(p_tenants text[], p_shards text[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  -- Each shard's next pending row first (one probe; most settled shards, a task's own
  -- `task:<id>`, have none), then the two checks for the shards that have one.
  WITH n AS MATERIALIZED (
    SELECT k.tenant_id, k.shard_key, p.id
      FROM (SELECT DISTINCT u.tenant_id, u.shard_key
              FROM unnest(p_tenants, p_shards) AS u(tenant_id, shard_key)) k
      CROSS JOIN LATERAL (
        SELECT t.id FROM {{table}} t
         WHERE t.tenant_id = k.tenant_id AND t.shard_key = k.shard_key AND t.status = 'pending'
         ORDER BY t.run_after, t.id
         LIMIT 1) p)
  UPDATE {{table}} q SET is_head = true
    FROM n
   WHERE q.id = n.id AND q.is_head IS NOT TRUE
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = n.tenant_id AND o.shard_key = n.shard_key
                        AND o.is_head)
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = n.tenant_id AND o.shard_key = n.shard_key
                        AND o.status = 'leased');
END $$;

-- Changes made by hand (the queue's own functions set leash.internal and are not seen here).
-- A row made pending, or a pending row moved to another tenant or shard, becomes a head when
-- its shard has neither a head nor a lease (rows an UPDATE processed before it are visible to
-- this trigger, so a bulk requeue of one shard makes one head); a head that leaves pending
-- stops being one (leash_head_is_pending). A head or a lease that leaves (status, tenant or
-- shard changed, row deleted) then hands its shard over. These take no hand-over lock: a
-- race with a producer is left to repair_heads.
CREATE FUNCTION {{obj:heads_by_hand}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.is_head := NEW.status = 'pending'
                 AND {{obj:head_decide}}(NEW.id, NEW.tenant_id, NEW.shard_key, NEW.run_after,
                                         false);
  RETURN NEW;
END $$;
CREATE TRIGGER {{name:heads_by_hand}} BEFORE UPDATE OF status, tenant_id, shard_key ON {{table}}
  FOR EACH ROW
  WHEN (((NEW.status = 'pending'
          AND (OLD.status <> 'pending' OR NEW.tenant_id <> OLD.tenant_id
               OR NEW.shard_key <> OLD.shard_key))
         OR (NEW.status <> 'pending' AND NEW.is_head))
        AND current_setting('leash.internal', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION {{obj:heads_by_hand}}();

CREATE FUNCTION {{obj:heads_left}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM {{obj:lane_handover}}(ARRAY[OLD.tenant_id], ARRAY[OLD.shard_key]);
  RETURN NULL;
END $$;
CREATE TRIGGER {{name:heads_left}} AFTER UPDATE OF status, tenant_id, shard_key ON {{table}}
  FOR EACH ROW
  WHEN ((OLD.status = 'leased' OR OLD.is_head)
        AND (NEW.status <> OLD.status OR NEW.tenant_id <> OLD.tenant_id
             OR NEW.shard_key <> OLD.shard_key)
        AND current_setting('leash.internal', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION {{obj:heads_left}}();
CREATE TRIGGER {{name:heads_deleted}} AFTER DELETE ON {{table}}
  FOR EACH ROW
  WHEN (OLD.status = 'leased' OR OLD.is_head)
  EXECUTE FUNCTION {{obj:heads_left}}();

-- ---------------------------------------------------------------- settle

-- The outcomes (p_ids with p_tokens; kinds, delays, errors, results, causes and crashed as
-- in 010; p_run_s: seconds from the claim to the start of handle, NULL when it never
-- started). Rows: one per outcome written (status = what the row became), or status 'leased'
-- for one not written because a producer holds its shard's hand-over lock (the host writes
-- it again shortly). An outcome missing from the answer was late (its token not leased).
CREATE FUNCTION {{obj:settle}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                               p_kinds text[], p_delays float8[], p_errors text[],
                               p_results jsonb[], p_causes text[], p_crashed boolean[],
                               p_run_s float8[])
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
  -- The hand-over locks of these leases' shards, try-only, in key order.
  SELECT array_agg(x.id) FILTER (WHERE NOT x.got),
         array_agg(x.tenant_id) FILTER (WHERE x.got), array_agg(x.shard_key) FILTER (WHERE x.got)
    INTO busy, kt, ks
    FROM (SELECT y.id, y.tenant_id, y.shard_key,
                 pg_try_advisory_xact_lock(rel, {{obj:lane_key}}(y.tenant_id, y.shard_key)) AS got
            FROM (SELECT q.id, q.tenant_id, q.shard_key FROM {{table}} q
                   WHERE q.id = ANY (p_ids)
                   ORDER BY q.tenant_id, q.shard_key
                  OFFSET 0) y) x;
  -- The rows are found by id (pkey), never through one_lease_per_shard: "status = 'leased'"
  -- is written as an expression no partial index's predicate follows from, because the
  -- generic plan, costed while few rows were leased, otherwise scanned every lease of the
  -- fleet once per outcome (a nested loop, measured 2.1 ms for 64 outcomes).
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
           run_started_at = CASE WHEN u.run_s IS NULL THEN NULL
                                 ELSE q.started_at + make_interval(secs => u.run_s) END,
           is_head = false,   -- a retry waits its turn: the hand-over below decides
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

-- ---------------------------------------------------------------- claim

-- Leases up to p_n tasks of the scope (p_tenants, p_batch). Rows: one per task leased (with
-- its fresh token), then one with id NULL: `waited` is the seconds until the scope's next
-- pending row comes due when the claim was short (NULL: none, or full), ring and ring_left
-- the process's new place in the tenants' ring (see the top of this file).
-- Unscoped and tenant-scoped claims read heads only (heads_idx). A batch-scoped claim (`run
-- --batch`) reads the batch's own due rows (batch_claim_idx), heads or not, as claims did
-- before heads: it still walks past rows of its batch in busy shards, and a lane whose older
-- rows belong to another batch does not hold it up.
-- p_only (the fallback of <table>_cycle_rows): that one task, if its shard is free.
-- Statement 1 (the loop, or the batch scan) picks candidates and locks them, skipping rows
-- locked by others and shards with a lease in its snapshot; the gate takes each candidate's
-- shard try-lock (one per shard); statement 2 leases with a fresh snapshot taken after the
-- gate, re-checking that the shard holds no lease: 007's proof, unchanged.
CREATE FUNCTION {{obj:claim}}(p_owner text, p_n int, p_visibility_s float8, p_tenants text[],
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
BEGIN
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
                          WHERE h.is_head AND h.tenant_id = x.t)
           ORDER BY x.t > coalesce(cur, '') DESC, x.t
           LIMIT 1;
        ELSIF cur IS NULL THEN
          SELECT h.tenant_id, false INTO nxt, wrapped FROM {{table}} h
           WHERE h.is_head
           ORDER BY h.tenant_id
           LIMIT 1;
        ELSE
          SELECT n.tenant_id, n.wrapped INTO nxt, wrapped FROM (
            (SELECT h.tenant_id, false AS wrapped FROM {{table}} h
              WHERE h.is_head AND h.tenant_id > cur
              ORDER BY h.tenant_id
              LIMIT 1)
            UNION ALL
            (SELECT h.tenant_id, true FROM {{table}} h
              WHERE h.is_head
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
           WHERE m.is_head AND m.tenant_id = cur
             AND (lvl IS NULL OR m.priority < lvl)
           ORDER BY m.tenant_id, m.priority DESC
           LIMIT 1)
        SELECT ids || coalesce(array_agg(c.id), '{}'), count(c.id), (SELECT m.priority FROM m)
          INTO ids, got, lvl
          FROM (SELECT h.id, h.tenant_id, h.shard_key FROM {{table}} h
                 WHERE h.is_head AND h.tenant_id = cur
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
    RETURNING q.id, q.attempts, q.max_attempts, q.tenant_id, q.shard_key, q.batch,
              q.payload::text,
              extract(epoch FROM clock_timestamp() - greatest(q.run_after, q.created_at))::float8,
              q.lease_token, NULL::text, NULL::int;
    GET DIAGNOSTICS got = ROW_COUNT;
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

-- ---------------------------------------------------------------- cycle

-- One round trip: settle, then claim (above), in one transaction. Rows: settled = true per outcome
-- (status: what it became, or 'leased' for "write it again"), settled = false per task
-- claimed, settled IS NULL once at the end of a claim (waited = next due, ring, ring_left).
DROP FUNCTION IF EXISTS {{obj:cycle_rows}}(text, bigint[], int[], text[], float8[], text[],
                                           jsonb[], text[], boolean[], int, float8, text[],
                                           text);
DROP FUNCTION IF EXISTS {{obj:cycle}}(text, bigint[], int[], text[], float8[], text[], jsonb[],
                                      text[], boolean[], int, float8, text[], text);
CREATE FUNCTION {{obj:cycle}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                              p_kinds text[], p_delays float8[], p_errors text[],
                              p_results jsonb[], p_causes text[], p_crashed boolean[],
                              p_run_s float8[], p_n int, p_visibility_s float8,
                              p_tenants text[], p_batch text, p_ring text, p_ring_left int)
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
                          p_causes, p_crashed, p_run_s) s;
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

-- ---------------------------------------------------------------- reap, release, repair

-- The reaper (010) with tokens: an expired lease goes back to pending (or dead) as a crash,
-- quarantined at max_crashes. A row going back to pending is its shard's head again (it was
-- the one running: nothing of its shard is ahead of it, or a batch-scoped claim took it out
-- of turn, and then two heads are merely untidy); a dead one hands its shard over, under the
-- hand-over lock like a settle.
DROP FUNCTION IF EXISTS {{obj:reap_rows}}();
DROP FUNCTION IF EXISTS {{obj:reap}}(bigint);
CREATE FUNCTION {{obj:reap}}(p_only bigint DEFAULT NULL)
RETURNS TABLE (id bigint, status text, tenant_id text, lease_owner text, cause text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  r_id bigint[];
  r_status text[];
  r_tenant text[];
  r_shard text[];
  r_owner text[];
  r_cause text[];
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtextextended('leash.reap',
                                                    {{table_literal}}::regclass::oid::bigint)) THEN
    RETURN;
  END IF;
  -- A lease that goes dead hands its shard over: it takes the shard's hand-over lock first
  -- (try-only; one a producer holds is reaped next time). One that goes back to pending is
  -- its shard's head again and needs none.
  WITH e AS (
    SELECT x.id, x.lease_owner AS owner, x.tenant_id, x.shard_key,
           x.crashes + 1 >= x.max_crashes OR x.attempts >= x.max_attempts AS dies
      FROM {{table}} x
     WHERE x.status = 'leased' AND (x.locked_until IS NULL OR x.locked_until < now())
       AND (p_only IS NULL OR x.id = p_only)
     ORDER BY x.id
     LIMIT 1000
     FOR UPDATE SKIP LOCKED
  ), r AS (
    SELECT e.id, e.owner FROM e
     WHERE NOT e.dies
        OR pg_try_advisory_xact_lock({{table_literal}}::regclass::oid::int,
                                     {{obj:lane_key}}(e.tenant_id, e.shard_key))
  ), u AS (
    UPDATE {{table}} q
       SET status = CASE WHEN q.crashes + 1 >= q.max_crashes THEN 'dead'
                         WHEN q.attempts >= q.max_attempts THEN 'dead'
                         ELSE 'pending' END,
           is_head = q.crashes + 1 < q.max_crashes AND q.attempts < q.max_attempts,
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
    RETURNING q.id, q.status, q.tenant_id, q.shard_key, r.owner, q.last_cause
  )
  SELECT array_agg(u.id), array_agg(u.status), array_agg(u.tenant_id), array_agg(u.shard_key),
         array_agg(u.owner), array_agg(u.last_cause)
    INTO r_id, r_status, r_tenant, r_shard, r_owner, r_cause
    FROM u;
  IF r_id IS NULL THEN
    RETURN;
  END IF;
  -- The shards of leases that went dead are handed over.
  PERFORM {{obj:lane_handover}}(array_agg(x.tenant_id), array_agg(x.shard_key))
     FROM unnest(r_status, r_tenant, r_shard) AS x(status, tenant_id, shard_key)
    WHERE x.status = 'dead'
   HAVING count(*) > 0;
  PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  RETURN QUERY SELECT * FROM unnest(r_id, r_status, r_tenant, r_owner, r_cause);
END $$;

-- The reaper's fallback (010): one expired lease at a time; one that cannot be reaped is
-- set aside (dead, bad_row) and its shard handed over.
CREATE FUNCTION {{obj:reap_rows}}()
RETURNS TABLE (id bigint, status text, tenant_id text, lease_owner text, cause text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
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
           SET status = 'dead', last_cause = 'bad_row', locked_until = NULL, is_head = false,
               last_error = 'bad row: its expired lease could not be reaped: ' || msg,
               finished_at = now(), updated_at = now()
         WHERE q.id = cand AND q.status = 'leased'
        RETURNING q.id, q.status, q.tenant_id, q.lease_owner, q.last_cause;
        PERFORM {{obj:lane_handover}}(array_agg(t.tenant_id), array_agg(t.shard_key))
           FROM {{table}} t WHERE t.id = cand;
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

-- Drain (002): leases given back to pending without charging the attempt, fenced by token.
-- They were running, so each is its shard's head again.
DROP FUNCTION IF EXISTS {{obj:release}}(text, bigint[], int[]);
CREATE FUNCTION {{obj:release}}(p_owner text, p_ids bigint[], p_tokens bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  UPDATE {{table}} q
     SET status = 'pending', locked_until = NULL, attempts = q.attempts - 1, is_head = true,
         run_after = now(), updated_at = now()
    FROM (SELECT * FROM unnest(p_ids, p_tokens) AS v(id, token) ORDER BY v.id) u
   WHERE q.id = ANY (p_ids) AND q.id = u.id AND q.lease_token = u.token
     AND q.lease_owner = p_owner AND (q.status || '') = 'leased'
  RETURNING q.id;
  IF FOUND THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
END $$;

-- Shards with pending rows but neither a head nor a lease get their oldest pending row as
-- head (see the top of this file). A scan of every pending row: migrate runs it, and the
-- reaper every few minutes (src/lease.c). Takes each shard's hand-over lock, try-only: a
-- shard a producer holds right now is looked at next time. Returns the heads it made.
CREATE FUNCTION {{obj:repair_heads}}() RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
DECLARE
  rel int := {{table_literal}}::regclass::oid::int;
  kt text[];
  ks text[];
BEGIN
  SELECT array_agg(x.tenant_id), array_agg(x.shard_key) INTO kt, ks
    FROM (SELECT DISTINCT p.tenant_id, p.shard_key FROM {{table}} p
           WHERE p.status = 'pending' AND p.is_head IS NOT TRUE
             AND NOT EXISTS (SELECT 1 FROM {{table}} o
                              WHERE o.tenant_id = p.tenant_id AND o.shard_key = p.shard_key
                                AND o.is_head)
             AND NOT EXISTS (SELECT 1 FROM {{table}} o
                              WHERE o.tenant_id = p.tenant_id AND o.shard_key = p.shard_key
                                AND o.status = 'leased')
           LIMIT 10000) x
   WHERE pg_try_advisory_xact_lock(rel, {{obj:lane_key}}(x.tenant_id, x.shard_key));
  IF kt IS NULL THEN
    RETURN 0;
  END IF;
  PERFORM {{obj:lane_handover}}(kt, ks);
  RETURN cardinality(kt);
END $$;

-- The cycle's fallback (010), called by src/queue.c only after <table>_cycle failed with a
-- row's error: the same arguments and answer, in subtransactions.
--   Settle: all at once; should that fail, one by one; an outcome that still fails sets its
--   row aside (dead, bad_row, the database's message), its head released like any settle.
--   Claim: all at once; should that fail, candidates one at a time (p_only), each leased
--   alone with 007's gate; a row whose lease fails is set aside (and named in a WARNING) and
--   its shard handed over. A unique violation is another claimer's lease of the shard, not
--   the row's fault: skipped, not set aside.
CREATE FUNCTION {{obj:cycle_rows}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                                   p_kinds text[], p_delays float8[], p_errors text[],
                                   p_results jsonb[], p_causes text[], p_crashed boolean[],
                                   p_run_s float8[], p_n int, p_visibility_s float8,
                                   p_tenants text[], p_batch text, p_ring text,
                                   p_ring_left int)
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
                                               p_ring, p_ring_left);
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
                                               p_batch, p_ring, p_ring_left);
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

-- A live table: every pending row was made a head by the column's default; keep one per
-- shard that has no lease (its oldest), none where a lease runs (its settle hands over). The
-- leases held now get tokens. (Workers of the previous version cannot settle after this
-- migration: their cycle is gone. Stop them first; what they held is reaped as usual.)
UPDATE {{table}} SET lease_token = nextval({{objlit:lease_token_seq}}::regclass)
 WHERE status = 'leased' AND lease_token IS NULL;
UPDATE {{table}} q SET is_head = NOT (EXISTS (SELECT 1 FROM {{table}} l
                 WHERE l.tenant_id = q.tenant_id AND l.shard_key = q.shard_key
                   AND l.status = 'leased')
        OR EXISTS (SELECT 1 FROM {{table}} o
                    WHERE o.tenant_id = q.tenant_id AND o.shard_key = q.shard_key
                      AND o.status = 'pending'
                      AND (o.run_after, o.id) < (q.run_after, q.id)))
 WHERE q.status = 'pending';

-- The old claim's indexes stay: claim_idx (001) serves the next-due lookup, depth and
-- cycle_rows; batch_claim_idx (008) the batch-scoped claim.
ALTER TABLE {{table}}
  ADD CONSTRAINT leash_head_is_pending CHECK (is_head IS NOT TRUE OR status = 'pending');
