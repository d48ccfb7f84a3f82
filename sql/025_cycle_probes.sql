-- What a cycle reads again (issue #14: a drain's rate is the claim's and the settle's cost
-- per row, and the backend is the bottleneck). Measured with callgrind on a single-user
-- backend (instructions are not disturbed by a loaded machine, where CPU time varied by 20 %
-- from run to run): a SQL-only drain of 3,000 tasks in cycles of 72 cost 424,000
-- instructions per task on 024. Much of it was rows read again that the cycle had just
-- read or written: the settle's wakes found the settled rows by id twice more, the claim
-- read its picks again to keep one per shard, and the hand-over's UPDATE was planned as a
-- walk of the whole table by primary key (every row not a head: in a drain, every row done
-- so far) joined to the shards that had a next row, a cost that grew with the table. Five
-- changes, none to what a claim or a settle decides:
--
-- 1. The settle keeps its answer, and what its wakes need, in arrays: the rows that ended
--    done or dead (what waiters may await), the rows that went to a wait on tasks or on an
--    event. wait_wake_settled takes them: no row is found again by id, and a settle with no
--    waiter among its rows reads none of the waiters' rows (the GIN probe for waiters of
--    its finished rows stays; it is one probe per row of an index that only waiters are
--    in). wait_events is called only when a row went to a wait on an event. 019's
--    wait_wake(ids) stays for the reaper's expiry and cancel, which have no such answer.
-- 2. The hand-over's UPDATE takes its rows from the probe as an array (one InitPlan), so it
--    finds them by primary key: no plan can walk the table for it any more. Still one
--    statement, probe and update in one snapshot, as 011 wrote it.
-- 3. The hand-over locks are taken in no order: they are try-only and never wait, so the
--    sort of the settled rows by shard (text) bought nothing. The steps are deleted through
--    their primary key by plain index scans (a bitmap scan per settled row was chosen).
-- 4. The claim's picks carry their shards; a shard has one head, so they are distinct save
--    for a shard with two (011 allows it in a race), and only then are the picked rows read
--    again to keep one per shard.
-- 5. A settled row's wake lock is shared (below).
-- 6. A lease's started_at is the moment of its UPDATE (clock_timestamp()), not the claim
--    transaction's start (now()): a claim's statements each take a fresh snapshot, so a row
--    handed over by a settle that committed while the claim ran could be leased with a
--    start earlier than its predecessor's (the claims of one shard then looked out of
--    order, and its queue wait and run time were off by the claim's length). With the
--    settle connection (src/settler.c) a process's claim and settle always overlap.
--
-- Same protocol for the wakes (019): a settled row's lock is taken before its waiters are
-- looked for, a waiter takes the locks of the tasks it still sees unsettled before it looks
-- again; where the ids come from changed, and a settled row's lock is now shared (a waiter's
-- stays exclusive): settles whose ids fell in one of the 1,024 buckets used to queue on each
-- other until commit, across processes. Signatures unchanged: cycle, cycle_rows,
-- reap and cancel call these as they did.

-- ---------------------------------------------------------------- hand-over
-- 011's statement, one snapshot as before, with the rows to update named by an array taken
-- from the CTE (an InitPlan, evaluated once): the UPDATE then finds them by primary key.
CREATE OR REPLACE FUNCTION {{obj:lane_handover}}(p_tenants text[], p_shards text[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
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
  UPDATE {{table}} q SET is_head = true
   WHERE q.id = ANY (ARRAY(SELECT n.id FROM n)) AND q.is_head IS NOT TRUE
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = q.tenant_id AND o.shard_key = q.shard_key
                        AND o.is_head)
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = q.tenant_id AND o.shard_key = q.shard_key
                        AND o.status = 'leased');
END $$;

-- ---------------------------------------------------------------- wakes of a settle
-- 019's wait_wake, for a settle that knows what it wrote: p_final the rows it settled done
-- or dead, p_waiting the rows it sent to a wait on tasks (pending, run_after 'infinity',
-- wait_ids set; their row locks are this transaction's, so nothing changed them since).
CREATE OR REPLACE FUNCTION {{obj:wait_wake_settled}}(p_final bigint[], p_waiting bigint[])
RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
DECLARE
  k1 int := hashtext({{table_literal}} || ':wait');
  cands bigint[];
  n int;
BEGIN
  -- 1. The settled rows' locks, and the locks of the tasks our waiters still see unsettled
  -- (019: then every settle that could finish one of them has committed, or waits for our
  -- commit and looks after it). A settled row's lock is shared: it only has to meet a
  -- waiter's, never another settle's (two settles meet on the waiter's row lock, step 2),
  -- so settles of ids in one bucket do not queue on each other until commit as they did.
  -- A waiter's is exclusive. Blocking locks, so in key order (a key both a settled row's and
  -- an awaited task's is taken once, exclusive).
  IF p_waiting IS NULL THEN
    PERFORM pg_advisory_xact_lock_shared(k1, b.key)
       FROM (SELECT DISTINCT {{obj:wait_lock_key}}(x.id) AS key
               FROM unnest(p_final) AS x(id)
              ORDER BY 1) b;
  ELSE
    PERFORM CASE WHEN b.excl THEN pg_advisory_xact_lock(k1, b.key)
                 ELSE pg_advisory_xact_lock_shared(k1, b.key) END
       FROM (SELECT x.key, bool_or(x.excl) AS excl
               FROM (SELECT {{obj:wait_lock_key}}(f.id) AS key, false AS excl
                       FROM unnest(p_final) AS f(id)
                     UNION ALL
                     SELECT {{obj:wait_lock_key}}(a.id), true FROM {{table}} w
                      CROSS JOIN LATERAL unnest(w.wait_ids) AS a(id)
                       JOIN {{table}} c ON c.id = a.id
                      WHERE w.id = ANY (p_waiting) AND c.status IN ('pending', 'leased')) x
              GROUP BY x.key
              ORDER BY x.key) b;
  END IF;
  -- 2. The candidates, locked in id order: our waiters, and the committed waiters of the
  -- rows settled here.
  SELECT array_agg(w.id ORDER BY w.id) INTO cands FROM (
    SELECT x.id FROM unnest(p_waiting) AS x(id)
    UNION
    SELECT q.id FROM {{table}} q
     WHERE p_final IS NOT NULL AND q.wait_ids && p_final AND q.wait_ids IS NOT NULL
       AND q.status = 'pending' AND q.run_after = 'infinity') w;
  IF cands IS NULL THEN
    RETURN 0;
  END IF;
  PERFORM 1 FROM {{table}} q WHERE q.id = ANY (cands) ORDER BY q.id FOR UPDATE;
  -- 3. A fresh look: wake those with nothing left pending or leased.
  WITH u AS (
    UPDATE {{table}} q
       SET run_after = now(), updated_at = now(),
           is_head = NOT EXISTS (SELECT 1 FROM {{table}} o
                                  WHERE o.tenant_id = q.tenant_id
                                    AND o.shard_key = q.shard_key AND o.status = 'leased')
     WHERE q.id = ANY (cands) AND q.status = 'pending' AND q.run_after = 'infinity'
       AND q.wait_ids IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM {{table}} c
                        WHERE c.id = ANY (q.wait_ids) AND c.status IN ('pending', 'leased'))
    RETURNING q.id)
  SELECT count(*) INTO n FROM u;
  IF n > 0 THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
  RETURN n;
END $$;

-- ---------------------------------------------------------------- settle
-- 019's, with its answer in arrays for the wakes (1), the locks unsorted and the steps by
-- index scan (3).
CREATE OR REPLACE FUNCTION {{obj:settle}}(p_owner text, p_ids bigint[], p_tokens bigint[],
                               p_kinds text[], p_delays float8[], p_errors text[],
                               p_results jsonb[], p_causes text[], p_crashed boolean[],
                               p_run_s float8[], p_backoff_base float8 DEFAULT 2,
                               p_backoff_cap float8 DEFAULT 3600,
                               p_backoff_jitter float8 DEFAULT 0.5,
                               p_versions text[] DEFAULT NULL, p_labels text[] DEFAULT NULL,
                               p_waited float8[] DEFAULT NULL)
RETURNS TABLE (id bigint, attempts int, status text, cause text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  rel int := {{table_literal}}::regclass::oid::int;
  busy bigint[];
  kt text[];
  ks text[];
  r_ids bigint[];
  r_attempts int[];
  r_status text[];
  r_cause text[];
  fin bigint[];       -- settled here to done or dead: what waiters may await
  waiting bigint[];   -- went to a wait on tasks here
  evented bigint[];   -- went to a wait on an event here
BEGIN
  -- The hand-over locks of these leases' shards, try-only (011); in no particular order, as
  -- a try never waits.
  SELECT array_agg(x.id) FILTER (WHERE NOT x.got),
         array_agg(x.tenant_id) FILTER (WHERE x.got), array_agg(x.shard_key) FILTER (WHERE x.got)
    INTO busy, kt, ks
    FROM (SELECT y.id, y.tenant_id, y.shard_key,
                 pg_try_advisory_xact_lock(rel, {{obj:lane_key}}(y.tenant_id, y.shard_key)) AS got
            FROM (SELECT q.id, q.tenant_id, q.shard_key FROM {{table}} q
                   WHERE q.id = ANY (p_ids)
                  OFFSET 0) y) x;
  -- Found by id (pkey), never through one_lease_per_shard: see 011. The answer is kept in
  -- arrays, with what the wakes below need, so they probe no row this statement wrote.
  WITH s AS (
    UPDATE {{table}} q
       SET status = CASE
                      WHEN u.crashed AND q.crashes + 1 >= q.max_crashes THEN 'dead'
                      WHEN u.kind = 'done' THEN 'done'
                      WHEN u.kind = 'wait' AND NOT u.crashed THEN 'pending'
                      WHEN u.kind = 'snooze' AND NOT u.crashed AND q.snoozes < q.max_snoozes
                      THEN 'pending'
                      WHEN u.kind IN ('retry', 'snooze') AND q.attempts < q.max_attempts
                      THEN 'pending'
                      ELSE 'dead' END,
           attempts = CASE
                        WHEN u.kind = 'wait' AND NOT u.crashed THEN q.attempts - 1   -- a wait spends none
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
                         WHEN u.kind = 'wait' AND NOT u.crashed THEN {{obj:wait_wakes_at}}(u.result)
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
                          WHEN u.kind = 'wait' AND NOT u.crashed THEN 'waiting'
                          ELSE u.cause END,
           crashes = q.crashes + CASE WHEN u.crashed THEN 1 ELSE 0 END,
           result = CASE WHEN u.kind = 'done' THEN u.result ELSE q.result END,
           -- The wait's columns: set by a wait, cleared by any other end (a woken task keeps
           -- them through its next execution, which reads them: leash.waited).
           wait_reason = CASE WHEN u.kind = 'wait' AND NOT u.crashed THEN u.result->>'reason' END,
           wait_ids = CASE
                        WHEN u.kind = 'wait' AND NOT u.crashed AND u.result->>'reason' = 'children'
                        THEN coalesce((SELECT array_agg(c.id ORDER BY c.id) FROM {{table}} c
                                        WHERE c.parent_id = q.id), '{}')
                        WHEN u.kind = 'wait' AND NOT u.crashed AND u.result->>'reason' = 'ids'
                        THEN ARRAY(SELECT jsonb_array_elements_text(u.result->'ids')::bigint)
                        END,
           wait_event = CASE
                          WHEN u.kind = 'wait' AND NOT u.crashed AND u.result->>'reason' = 'event'
                          THEN u.result->>'event' END,
           wait_deadline = CASE
                             WHEN u.kind = 'wait' AND NOT u.crashed
                                  AND u.result->>'reason' IN ('children', 'ids', 'event')
                             THEN now() + make_interval(secs => least((u.result->>'deadline')::float8,
                                                                    604800))
                             END,
           wait_on_deadline = CASE WHEN u.kind = 'wait' AND NOT u.crashed THEN u.result->>'on_deadline' END,
           run_started_at = CASE WHEN u.run_s IS NULL THEN NULL
                                 ELSE q.started_at + make_interval(secs => u.run_s) END,
           is_head = false,   -- a retry or a snooze waits its turn: the hand-over decides
           locked_until = NULL, finished_at = now(), updated_at = now()
      FROM (SELECT v.* FROM unnest(p_ids, p_tokens, p_kinds, p_delays, p_errors, p_results,
                                   p_causes, p_crashed, p_run_s, p_versions, p_labels,
                                   p_waited)
                             AS v(id, token, kind, delay, err, result, cause, crashed, run_s,
                                  version, label, waited)
             WHERE busy IS NULL OR v.id <> ALL (busy)
             ORDER BY v.id) u
     WHERE q.id = ANY (p_ids) AND q.id = u.id AND q.lease_token = u.token
       AND q.lease_owner = p_owner AND (q.status || '') = 'leased'
    RETURNING q.id, q.attempts, q.status, q.last_cause, q.lease_token, q.started_at,
              q.run_started_at, q.finished_at, q.last_error, u.kind, u.err, u.crashed,
              u.version, u.label, u.waited, q.run_after = 'infinity' AS untimed,
              q.wait_ids IS NOT NULL AS awaits, q.wait_event IS NOT NULL AS evented
  ), gone AS (
    DELETE FROM {{obj:steps}} st USING s WHERE st.task_id = s.id AND s.status = 'done'
  ), h AS (
    INSERT INTO {{obj:attempts}} AS a (task_id, lease_token, attempt, worker, version, label,
                                       queue_wait_s, claimed_at, run_started_at, finished_at,
                                       kind, cause, status, error, crashed)
    SELECT s.id, s.lease_token,
           s.attempts + CASE WHEN s.kind IN ('snooze', 'wait') AND NOT s.crashed
                                  AND s.status = 'pending'
                                  AND s.last_cause IS DISTINCT FROM 'snooze_limit'
                             THEN 1 ELSE 0 END,
           p_owner, s.version, s.label, s.waited, s.started_at, s.run_started_at,
           s.finished_at, s.kind, s.last_cause, s.status,
           CASE WHEN s.status = 'done' THEN s.err ELSE s.last_error END, s.crashed
      FROM s
    ON CONFLICT DO NOTHING   -- one lease, one row; this table has no triggers (see 015)
  )
  SELECT array_agg(s.id), array_agg(s.attempts), array_agg(s.status), array_agg(s.last_cause),
         array_agg(s.id) FILTER (WHERE s.status IN ('done', 'dead')),
         array_agg(s.id) FILTER (WHERE s.status = 'pending' AND s.untimed AND s.awaits),
         array_agg(s.id) FILTER (WHERE s.status = 'pending' AND s.untimed AND s.evented)
    INTO r_ids, r_attempts, r_status, r_cause, fin, waiting, evented
    FROM s;
  RETURN QUERY
  SELECT x.id, x.attempts, x.status, x.cause
    FROM unnest(r_ids, r_attempts, r_status, r_cause) AS x(id, attempts, status, cause)
  UNION ALL
  SELECT b, NULL::int, 'leased'::text, NULL::text FROM unnest(busy) AS b;
  IF kt IS NOT NULL THEN
    PERFORM {{obj:lane_handover}}(kt, ks);
  END IF;
  -- Wakes, in statements of their own (fresh snapshots, after this one's row locks): the
  -- waiters settled here whose awaited tasks already settled, and the waiters of rows
  -- settled here (see wait_wake_settled); waiters of an event whose signal is live.
  IF fin IS NOT NULL OR waiting IS NOT NULL THEN
    PERFORM {{obj:wait_wake_settled}}(fin, waiting);
  END IF;
  IF evented IS NOT NULL THEN
    PERFORM {{obj:wait_events}}(evented);
  END IF;
END $$;

-- ---------------------------------------------------------------- claim
-- 020's, with the picks' shards kept (4).
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
      ELSE
        lft := lft - k;
      END IF;
      need := need - k;
      pass_took := pass_took + k;
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
