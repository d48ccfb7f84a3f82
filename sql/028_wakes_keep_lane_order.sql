-- A woken waiter takes its place in its lane (issue #14; 019's wakes).
--
-- A task woken from a wait (its awaited tasks settled, its event signalled, or its wait's
-- deadline passed with a retry) gets run_after = now() and became its shard's head whenever
-- the shard held no lease, whatever head the shard already had. With a pending head there,
-- the shard then had two: the woken task ran as soon as the head's run ended, ahead of every
-- row queued behind that head, although by (run_after, id), the lane's order (011), those
-- rows come first. Now it becomes a head only when the shard has no lease and no head that
-- comes before it by (run_after, id) (wake_is_head, one snapshot: the statement's). A head
-- that comes after it (a retry waiting out its backoff, a task scheduled for later) still
-- does not hold it back: it runs beside that head, as a due row enqueued then would take
-- that head's place (011's head_decide; an UPDATE cannot un-head the other row here: the
-- statement may be updating it too).
--
-- Not made a head, the woken row waits behind the shard's lease or head like any row, and
-- nothing strands it: that head is leased and its settle hands the shard to the oldest
-- pending row; a lease's settle that is handing over meanwhile either saw the row pending
-- (its run_after still 'infinity', so it sorts last: picked only when it is the shard's only
-- pending row, and then that UPDATE waits for this row's lock, re-reads it and makes it the
-- head) or picked an older row, which is then the head the woken row waits behind.
-- Several waiters of one shard woken by the same statement still become heads together (each
-- decides in the statement's snapshot, before the others' updates): a shard with several
-- heads is leased once at a time (011), in (run_after, id) order.
--
-- Same functions otherwise (019's wait_wake, wait_expire, wait_events and signal, 025's
-- wait_wake_settled), restated whole with only their is_head changed.

CREATE OR REPLACE FUNCTION {{obj:wake_is_head}}(p_id bigint, p_tenant text, p_shard text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = p_tenant AND o.shard_key = p_shard
                        AND o.status = 'leased')
     AND NOT EXISTS (SELECT 1 FROM {{table}} o
                      WHERE o.tenant_id = p_tenant AND o.shard_key = p_shard AND o.is_head
                        AND o.id <> p_id AND (o.run_after, o.id) < (now(), p_id))
$$;

-- 019's, the head decided by wake_is_head.
CREATE OR REPLACE FUNCTION {{obj:wait_wake}}(p_ids bigint[]) RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
DECLARE
  k1 int := hashtext({{table_literal}} || ':wait');
  cands bigint[];
  n int;
BEGIN
  IF p_ids IS NULL OR cardinality(p_ids) = 0 THEN
    RETURN 0;
  END IF;
  -- 1. Our own settled ids' locks (the rows that went done or dead), and the locks of the ids
  -- our own waiters still see unsettled: then every settle that could finish one of them has
  -- committed, or waits for our commit and will look after it.
  PERFORM pg_advisory_xact_lock(k1, b.key)
     FROM (SELECT DISTINCT {{obj:wait_lock_key}}(x.id) AS key
             FROM (SELECT q.id FROM {{table}} q
                    WHERE q.id = ANY (p_ids) AND q.status IN ('done', 'dead')
                   UNION
                   SELECT a.id FROM {{table}} w
                    CROSS JOIN LATERAL unnest(w.wait_ids) AS a(id)
                     JOIN {{table}} c ON c.id = a.id
                    WHERE w.id = ANY (p_ids) AND w.status = 'pending'
                      AND w.run_after = 'infinity' AND w.wait_ids IS NOT NULL
                      AND c.status IN ('pending', 'leased')) x
            ORDER BY 1) b;
  -- 2. The candidates, locked in id order: our waiters, and the committed waiters of ids
  -- settled here.
  SELECT array_agg(w.id ORDER BY w.id) INTO cands FROM (
    SELECT q.id FROM {{table}} q
     WHERE q.id = ANY (p_ids) AND q.status = 'pending' AND q.run_after = 'infinity'
       AND q.wait_ids IS NOT NULL
    UNION
    SELECT q.id FROM {{table}} q
     WHERE q.wait_ids && p_ids AND q.wait_ids IS NOT NULL AND q.status = 'pending'
       AND q.run_after = 'infinity') w;
  IF cands IS NULL THEN
    RETURN 0;
  END IF;
  PERFORM 1 FROM {{table}} q WHERE q.id = ANY (cands) ORDER BY q.id FOR UPDATE;
  -- 3. A fresh look: wake those with nothing left pending or leased.
  WITH u AS (
    UPDATE {{table}} q
       SET run_after = now(), updated_at = now(),
           is_head = {{obj:wake_is_head}}(q.id, q.tenant_id, q.shard_key)
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

-- 019's, the head decided by wake_is_head.
CREATE OR REPLACE FUNCTION {{obj:wait_expire}}() RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
DECLARE
  ids bigint[];
  dt text[];
  ds text[];
BEGIN
  WITH e AS (
    SELECT x.id FROM {{table}} x
     WHERE x.wait_deadline < now() AND x.status = 'pending' AND x.run_after = 'infinity'
     ORDER BY x.wait_deadline, x.id
     LIMIT 1000
     FOR UPDATE SKIP LOCKED
  ), u AS (
    UPDATE {{table}} q
       SET attempts = q.attempts + 1,
           status = CASE WHEN q.wait_on_deadline = 'dead' OR q.attempts + 1 >= q.max_attempts
                         THEN 'dead' ELSE 'pending' END,
           run_after = now(),
           is_head = CASE WHEN q.wait_on_deadline = 'dead' OR q.attempts + 1 >= q.max_attempts
                          THEN false
                          ELSE {{obj:wake_is_head}}(q.id, q.tenant_id, q.shard_key) END,
           last_cause = 'wait_deadline',
           last_error = format('wait_deadline: waited for %s past its deadline (%s); %s',
                               q.wait_reason, q.wait_deadline,
                               CASE WHEN q.wait_on_deadline = 'dead' THEN 'on_deadline = dead'
                                    WHEN q.attempts + 1 >= q.max_attempts
                                    THEN 'no attempt left'
                                    ELSE 'retried, the attempt spent' END),
           wait_deadline = NULL,
           finished_at = CASE WHEN q.wait_on_deadline = 'dead' OR q.attempts + 1 >= q.max_attempts
                              THEN now() ELSE q.finished_at END,
           updated_at = now()
      FROM e WHERE q.id = e.id
    RETURNING q.id, q.status, q.tenant_id, q.shard_key)
  SELECT array_agg(u.id), array_agg(u.tenant_id) FILTER (WHERE u.status = 'dead'),
         array_agg(u.shard_key) FILTER (WHERE u.status = 'dead')
    INTO ids, dt, ds FROM u;
  IF ids IS NULL THEN
    RETURN 0;
  END IF;
  IF dt IS NOT NULL THEN
    PERFORM {{obj:lane_handover}}(dt, ds);
  END IF;
  PERFORM {{obj:wait_wake}}(ids);
  PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  RETURN cardinality(ids);
END $$;

-- 019's, the head decided by wake_is_head.
CREATE OR REPLACE FUNCTION {{obj:wait_events}}(p_ids bigint[]) RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
DECLARE
  n int;
BEGIN
  -- Most settles have no such waiter: then the signals are not read at all (nor planned, so
  -- a worker role without a grant on them still settles everything else).
  IF NOT EXISTS (SELECT 1 FROM {{table}} q
                  WHERE q.id = ANY (p_ids) AND q.wait_event IS NOT NULL
                    AND q.status = 'pending' AND q.run_after = 'infinity') THEN
    RETURN 0;
  END IF;
  PERFORM {{obj:wait_event_lock}}(e.name)
     FROM (SELECT DISTINCT q.wait_event AS name FROM {{table}} q
            WHERE q.id = ANY (p_ids) AND q.wait_event IS NOT NULL AND q.status = 'pending'
              AND q.run_after = 'infinity'
            ORDER BY 1) e;
  WITH u AS (
    UPDATE {{table}} q
       SET run_after = now(), updated_at = now(),
           is_head = {{obj:wake_is_head}}(q.id, q.tenant_id, q.shard_key)
     WHERE q.id = ANY (p_ids) AND q.wait_event IS NOT NULL AND q.status = 'pending'
       AND q.run_after = 'infinity'
       AND EXISTS (SELECT 1 FROM {{obj:signals}} g
                    WHERE g.name = q.wait_event AND g.scope IN ('', q.tenant_id)
                      AND g.expires_at > now())
    RETURNING q.id)
  SELECT count(*) INTO n FROM u;
  RETURN n;
END $$;

-- 019's, the head decided by wake_is_head.
CREATE OR REPLACE FUNCTION {{obj:signal}}(p_name text, p_payload jsonb DEFAULT NULL,
                               p_tenant text DEFAULT NULL, p_ttl_s float8 DEFAULT 86400)
RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
DECLARE
  n int;
BEGIN
  IF p_name IS NULL OR octet_length(p_name) NOT BETWEEN 1 AND 200 THEN
    RAISE EXCEPTION 'signal: the event name must be 1 to 200 bytes'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_ttl_s IS NULL OR NOT (p_ttl_s BETWEEN 0 AND 604800) THEN
    RAISE EXCEPTION 'signal: ttl must be 0 to 604800 seconds, not %', p_ttl_s
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM {{obj:wait_event_lock}}(p_name);
  -- A signal's row is written even with ttl 0 (expired at once): the woken tasks read its
  -- payload (leash.waited) until it is replaced.
  INSERT INTO {{obj:signals}} AS g (scope, name, payload, signalled_at, expires_at)
  VALUES (coalesce(p_tenant, ''), p_name, p_payload, now(),
          now() + make_interval(secs => p_ttl_s))
  ON CONFLICT (scope, name) DO UPDATE
    SET payload = EXCLUDED.payload, signalled_at = EXCLUDED.signalled_at,
        expires_at = EXCLUDED.expires_at;
  DELETE FROM {{obj:signals}} g WHERE g.expires_at < now() - interval '7 days';
  WITH u AS (
    UPDATE {{table}} q
       SET run_after = now(), updated_at = now(),
           is_head = {{obj:wake_is_head}}(q.id, q.tenant_id, q.shard_key)
     WHERE q.wait_event = p_name AND q.status = 'pending' AND q.run_after = 'infinity'
       AND (p_tenant IS NULL OR q.tenant_id = p_tenant)
    RETURNING q.id)
  SELECT count(*) INTO n FROM u;
  IF n > 0 THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
  RETURN n;
END $$;

-- 025's, the head decided by wake_is_head.
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
           is_head = {{obj:wake_is_head}}(q.id, q.tenant_id, q.shard_key)
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
