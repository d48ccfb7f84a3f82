-- The SQL API (issue #17; docs/enqueue-from-apps.md): what an application needs to enqueue
-- from its own transaction the way `leash enqueue` does, dedup keys, and the two hand-made
-- lifecycle changes `leash cancel` and `leash release` make.
--
-- Defaults for plain SQL. `INSERT INTO <table>(payload) VALUES (...)` gets the CLI's
-- defaults: tenant 'default' (a column default) and shard 'task:<id>' (a BEFORE INSERT row
-- trigger, since a column default cannot name the row's id). PostgreSQL fires triggers of
-- the same timing and event in name order, and the head decision of 011 (<table>_heads_new_row)
-- needs the final shard: this trigger is <table>_defaults, and "defaults" sorts before
-- "heads_new_row" in every table's names (they share the "<table>_" prefix). NOT NULL is
-- checked after BEFORE triggers, so a row that names no shard is accepted.
--
-- Dedup keys. dedup_key (optional, 1..512 bytes) is unique per tenant among the rows that
-- are pending or leased: a unique partial index is the safety net (a plain INSERT of a
-- duplicate fails with that index's error), and <table>_enqueue returns the existing task's
-- id instead of inserting. Once the task is done or dead its key is free again: a re-run of a
-- finished business key is a new task (the choice written down in docs/enqueue-from-apps.md;
-- River's default states, without a window). A requeue of a dead task whose key a live task
-- holds fails with the index's error.
-- Why not INSERT ... ON CONFLICT DO NOTHING: 011's BEFORE INSERT trigger may un-head another
-- row of the shard before the conflict is found, and that change stays when the row is then
-- skipped. Instead enqueuers of one (table, tenant, key) serialise on a transaction-level
-- advisory lock (<table>_dedup_lock), then look, then insert. Correct under READ COMMITTED
-- (the default, and every statement here): the look is a statement that starts after the
-- lock was granted, so its snapshot sees every earlier holder's row (the lock is held until
-- that holder committed or rolled back). Under REPEATABLE READ or SERIALIZABLE the snapshot
-- may predate the lock: the look can miss a row committed meanwhile and the insert then fails
-- on the unique index (retry the transaction, as for any serialisation failure). A plain
-- INSERT racing the function is caught by the index the same way.
--
-- Cancel (<table>_cancel): pending and leased rows of a scope end dead with cause
-- 'cancelled' (src/lifecycle.c). It is a change made by hand as far as heads go: it runs
-- without leash.internal, so 011's by-hand triggers un-head a cancelled head and hand its
-- shard (and a cancelled lease's shard) to the next row. A cancelled lease keeps its owner
-- and token but is no longer 'leased': the worker's next heartbeat finds it lost, and every
-- later step, child enqueue and settle is refused by the token fence.
--
-- Release of a gone worker (<table>_release_worker): its leases are written as 011's
-- <table>_release writes a drained lease (pending, its shard's head, the attempt given
-- back, runnable now). Whether the worker is gone: every `leash run` holds, on its lease
-- connection (the one that heartbeats, always open while it runs), a session-level shared
-- advisory lock on its worker id (<table>_worker_here); <table>_worker_sessions names the
-- sessions holding it (pg_locks, readable by any role, unlike other roles' rows of
-- pg_stat_activity). No session: the worker is gone, or cut off from the database for
-- longer than its connection lasts, which is when its leases cannot be renewed either. The
-- check and the release are one: the release takes the lock exclusively (try-only) for its
-- transaction, so a worker that reconnects meanwhile waits until its leases are given back,
-- and one that holds it makes the release refuse (SQLSTATE 55P03) unless forced.

ALTER TABLE {{table}} ALTER COLUMN tenant_id SET DEFAULT 'default';
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS dedup_key text;
-- Guarded (ADD CONSTRAINT has no IF NOT EXISTS): a schema taken back by hand to before 010
-- (tests/integration/badinput.sh) keeps this column and its constraint.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint
                  WHERE conrelid = {{table_literal}}::regclass
                    AND conname = 'leash_dedup_key_bytes') THEN
    ALTER TABLE {{table}}
      ADD CONSTRAINT leash_dedup_key_bytes
      CHECK (dedup_key IS NULL OR octet_length(dedup_key) BETWEEN 1 AND 512);
  END IF;
END $$;
CREATE UNIQUE INDEX IF NOT EXISTS {{name:dedup_idx}}
  ON {{table}} (tenant_id, dedup_key)
  WHERE dedup_key IS NOT NULL AND status IN ('pending', 'leased');

CREATE FUNCTION {{obj:defaults}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.shard_key := 'task:' || NEW.id;
  RETURN NEW;
END $$;
CREATE TRIGGER {{name:defaults}} BEFORE INSERT ON {{table}}
  FOR EACH ROW WHEN (NEW.shard_key IS NULL)
  EXECUTE FUNCTION {{obj:defaults}}();

-- The dedup lock of (tenant, key): one-key advisory space, seeded by the table's oid and
-- tagged so it shares no key with the claim's gate (a collision there would only make a
-- claim skip a shard once: the gate is try-only).
CREATE FUNCTION {{obj:dedup_lock}}(p_tenant text, p_key text) RETURNS void
LANGUAGE sql AS $$
  SELECT pg_advisory_xact_lock(hashtextextended('leash.dedup' || chr(31) || p_tenant
                                                || chr(31) || p_key,
                                                {{table_literal}}::regclass::oid::bigint))
$$;

-- ---------------------------------------------------------------- enqueue

-- What is wrong with one task's values (the CLI's checks: src/enqueue.c, src/lifecycle.h),
-- as one message, or NULL. A function, not a raise, so the bulk form can name the element
-- without a subtransaction per element.
CREATE FUNCTION {{obj:enqueue_check}}(p_payload jsonb, p_tenant text, p_shard text,
                                      p_run_after timestamptz, p_delay_s float8,
                                      p_max_attempts int, p_batch text, p_priority int,
                                      p_dedup_key text, p_max_crashes int, p_budget text,
                                      p_max_snoozes int, p_backoff_base float8,
                                      p_backoff_cap float8) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN p_payload IS NULL OR jsonb_typeof(p_payload) = 'null' THEN 'payload must not be null'
    WHEN p_tenant = '' OR octet_length(p_tenant) > 512 THEN 'tenant must be 1 to 512 bytes'
    WHEN p_shard = '' OR octet_length(p_shard) > 512 THEN 'shard must be 1 to 512 bytes'
    WHEN p_batch = '' OR octet_length(p_batch) > 512 THEN 'batch must be 1 to 512 bytes'
    WHEN p_dedup_key = '' OR octet_length(p_dedup_key) > 512 THEN 'dedup_key must be 1 to 512 bytes'
    WHEN p_run_after IS NOT NULL AND p_delay_s IS NOT NULL
    THEN 'give either run_after or delay, not both'
    WHEN p_run_after IN ('infinity', '-infinity')
    THEN 'run_after must be a finite timestamp, not ' || p_run_after
    -- NaN fails both comparisons.
    WHEN p_delay_s IS NOT NULL AND NOT (p_delay_s >= 0 AND p_delay_s <= 3153600000)
    THEN 'delay must be a number of seconds from 0 to 3153600000, not ' || p_delay_s
    WHEN p_max_attempts NOT BETWEEN 1 AND 1000
    THEN 'max_attempts must be from 1 to 1000, not ' || p_max_attempts
    WHEN p_max_crashes NOT BETWEEN 1 AND 1000
    THEN 'max_crashes must be from 1 to 1000, not ' || p_max_crashes
    WHEN p_priority NOT BETWEEN -1000 AND 1000
    THEN 'priority must be from -1000 to 1000, not ' || p_priority
    WHEN p_budget = '' OR octet_length(p_budget) > 200 THEN 'budget must be 1 to 200 bytes'
    WHEN p_max_snoozes NOT BETWEEN 0 AND 10000
    THEN 'max_snoozes must be from 0 to 10000, not ' || p_max_snoozes
    WHEN p_backoff_base IS NOT NULL AND NOT (p_backoff_base >= 1 AND p_backoff_base <= 1000)
    THEN 'backoff_base must be from 1 to 1000, not ' || p_backoff_base
    WHEN p_backoff_cap IS NOT NULL AND NOT (p_backoff_cap >= 0 AND p_backoff_cap <= 86400)
    THEN 'backoff_cap must be a number of seconds from 0 to 86400, not ' || p_backoff_cap
  END
$$;

-- One task; what is NULL gets the CLI's default. Refused with one message, SQLSTATE 22023.
-- Returns (id, inserted): the new row's id, or on a dedup hit the pending or leased task's
-- id and false.
CREATE FUNCTION {{obj:enqueue_row}}(p_payload jsonb, p_tenant text, p_shard text,
                                    p_run_after timestamptz, p_delay_s float8,
                                    p_max_attempts int, p_batch text, p_priority int,
                                    p_dedup_key text, p_max_crashes int, p_budget text,
                                    p_max_snoozes int, p_backoff_base float8,
                                    p_backoff_cap float8,
                                    OUT id bigint, OUT inserted boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
  v_tenant text := coalesce(p_tenant, 'default');
  v_id bigint;
  bad text := {{obj:enqueue_check}}(p_payload, v_tenant, p_shard, p_run_after, p_delay_s,
                                    p_max_attempts, p_batch, p_priority, p_dedup_key,
                                    p_max_crashes, p_budget, p_max_snoozes, p_backoff_base,
                                    p_backoff_cap);
BEGIN
  IF bad IS NOT NULL THEN
    RAISE EXCEPTION 'enqueue: %', bad USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_dedup_key IS NOT NULL THEN
    -- Lock, then look (a new statement, so a new snapshot under READ COMMITTED): see the top.
    PERFORM {{obj:dedup_lock}}(v_tenant, p_dedup_key);
    SELECT q.id INTO v_id FROM {{table}} q
     WHERE q.tenant_id = v_tenant AND q.dedup_key = p_dedup_key
       AND q.status IN ('pending', 'leased');
    IF v_id IS NOT NULL THEN
      id := v_id;
      inserted := false;
      RETURN;
    END IF;
  END IF;
  INSERT INTO {{table}} (tenant_id, shard_key, payload, run_after, max_attempts, batch,
                         max_crashes, priority, dedup_key, budget, max_snoozes, backoff_base,
                         backoff_cap)
  VALUES (v_tenant, p_shard, p_payload,
          coalesce(p_run_after, now() + make_interval(secs => coalesce(p_delay_s, 0))),
          coalesce(p_max_attempts, 8), p_batch, coalesce(p_max_crashes, 3),
          coalesce(p_priority, 0), p_dedup_key, p_budget, coalesce(p_max_snoozes, 100),
          p_backoff_base, p_backoff_cap)
  RETURNING {{table}}.id INTO id;
  inserted := true;
END $$;

-- The application's call: SELECT <table>_enqueue('{"ticket": 1}', batch => 'nightly').
CREATE FUNCTION {{obj:enqueue}}(payload jsonb, tenant text DEFAULT NULL,
                                shard text DEFAULT NULL, run_after timestamptz DEFAULT NULL,
                                delay_s float8 DEFAULT NULL, max_attempts int DEFAULT NULL,
                                batch text DEFAULT NULL, priority int DEFAULT NULL,
                                dedup_key text DEFAULT NULL, max_crashes int DEFAULT NULL,
                                budget text DEFAULT NULL, max_snoozes int DEFAULT NULL,
                                backoff_base float8 DEFAULT NULL,
                                backoff_cap float8 DEFAULT NULL)
RETURNS bigint
LANGUAGE sql AS $$
  SELECT e.id FROM {{obj:enqueue_row}}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                                       $14) e
$$;

-- Many tasks: a JSON array of objects with the fields of a `leash enqueue --file` line
-- (payload, tenant_id, shard_key, batch, run_after, delay, max_attempts, max_crashes,
-- priority, dedup_key, budget, max_snoozes, backoff_base, backoff_cap). Rows: (ordinal from 1, id, inserted). A key repeated within the
-- array is one task (the first element's; the later ones answer its id, inserted false).
-- Every element is checked before anything is written; the dedup locks are then taken in
-- key order, so two bulk calls cannot deadlock.
CREATE FUNCTION {{obj:enqueue_many}}(tasks jsonb)
RETURNS TABLE (ordinal int, id bigint, inserted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  e jsonb;
  n int := 0;
  bad text;
BEGIN
  IF tasks IS NULL OR jsonb_typeof(tasks) <> 'array' THEN
    RAISE EXCEPTION 'enqueue_many: tasks must be a JSON array of objects'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  FOR e IN SELECT x FROM jsonb_array_elements(tasks) AS x LOOP
    n := n + 1;
    IF jsonb_typeof(e) <> 'object' THEN
      bad := 'not a JSON object';
    ELSE
      SELECT CASE WHEN k <> ALL ('{payload,tenant_id,shard_key,batch,run_after,delay,'
                                 'max_attempts,max_crashes,priority,dedup_key,budget,'
                                 'max_snoozes,backoff_base,backoff_cap}'::text[])
                  THEN format('unknown field "%s"', k)
                  WHEN k IN ('tenant_id', 'shard_key', 'run_after', 'dedup_key')
                       AND jsonb_typeof(e->k) <> 'string'
                  THEN format('"%s" must be a string', k)
                  WHEN k IN ('batch', 'budget') AND jsonb_typeof(e->k) NOT IN ('string', 'null')
                  THEN format('"%s" must be a string or null', k)
                  WHEN k IN ('delay', 'max_attempts', 'max_crashes', 'priority', 'max_snoozes',
                             'backoff_base', 'backoff_cap')
                       AND jsonb_typeof(e->k) <> 'number'
                  THEN format('"%s" must be a number', k)
                  WHEN k IN ('max_attempts', 'max_crashes', 'priority', 'max_snoozes')
                       AND (e->>k)::numeric <> trunc((e->>k)::numeric)
                  THEN format('"%s" must be a whole number', k)
                  WHEN k IN ('max_attempts', 'max_crashes', 'priority', 'max_snoozes')
                       AND abs((e->>k)::numeric) > 1000000
                  THEN format('"%s" is out of range', k) END
        INTO bad FROM jsonb_object_keys(e) AS k
       ORDER BY 1 NULLS LAST LIMIT 1;
    END IF;
    IF bad IS NULL THEN
      -- Only the timestamp's text can fail its cast here: one subtransaction per element that
      -- names a run_after, none for the others.
      IF e ? 'run_after' THEN
        BEGIN
          PERFORM (e->>'run_after')::timestamptz;
        EXCEPTION WHEN data_exception THEN
          bad := SQLERRM;
        END;
      END IF;
    END IF;
    IF bad IS NULL THEN
      bad := {{obj:enqueue_check}}(e->'payload', coalesce(e->>'tenant_id', 'default'),
                                   e->>'shard_key', (e->>'run_after')::timestamptz,
                                   (e->>'delay')::float8, (e->>'max_attempts')::numeric::int,
                                   e->>'batch', (e->>'priority')::numeric::int,
                                   e->>'dedup_key', (e->>'max_crashes')::numeric::int,
                                   e->>'budget', (e->>'max_snoozes')::numeric::int,
                                   (e->>'backoff_base')::float8, (e->>'backoff_cap')::float8);
    END IF;
    IF bad IS NOT NULL THEN
      RAISE EXCEPTION 'enqueue_many: element %: %; nothing was enqueued', n, bad
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
  END LOOP;
  PERFORM {{obj:dedup_lock}}(k.tenant, k.dedup_key)
     FROM (SELECT DISTINCT coalesce(x->>'tenant_id', 'default') AS tenant,
                  x->>'dedup_key' AS dedup_key
             FROM jsonb_array_elements(tasks) AS x
            WHERE x->>'dedup_key' IS NOT NULL
            ORDER BY 1, 2 OFFSET 0) k;
  -- One statement for the lot: ids drawn first, in element order (each element knows its id,
  -- and a default shard can name it); one INSERT skipping keys that are live (in this
  -- snapshot, taken after the locks) or repeated; a skipped element answers its key's first
  -- element's new row, or the live task.
  RETURN QUERY
  WITH drawn AS MATERIALIZED (
    SELECT x.o::int AS ordinal, x.e, coalesce(x.e->>'tenant_id', 'default') AS tenant,
           x.e->>'dedup_key' AS dkey,
           nextval(pg_get_serial_sequence({{table_literal}}, 'id')) AS nid
      FROM jsonb_array_elements(tasks) WITH ORDINALITY AS x(e, o)
     ORDER BY x.o
  ), src AS MATERIALIZED (
    SELECT d.*, row_number() OVER (PARTITION BY d.tenant, d.dkey ORDER BY d.ordinal) AS dn
      FROM drawn d
  ), ins AS (
    INSERT INTO {{table}} (id, tenant_id, shard_key, payload, run_after, max_attempts, batch,
                           max_crashes, priority, dedup_key, budget, max_snoozes,
                           backoff_base, backoff_cap)
    SELECT s.nid, s.tenant, coalesce(s.e->>'shard_key', 'task:' || s.nid), s.e->'payload',
           coalesce((s.e->>'run_after')::timestamptz,
                    now() + make_interval(secs => coalesce((s.e->>'delay')::float8, 0))),
           coalesce((s.e->>'max_attempts')::numeric::int, 8), s.e->>'batch',
           coalesce((s.e->>'max_crashes')::numeric::int, 3),
           coalesce((s.e->>'priority')::numeric::int, 0), s.dkey, s.e->>'budget',
           coalesce((s.e->>'max_snoozes')::numeric::int, 100), (s.e->>'backoff_base')::float8,
           (s.e->>'backoff_cap')::float8
      FROM src s
     WHERE s.dkey IS NULL
        OR (s.dn = 1 AND NOT EXISTS (SELECT 1 FROM {{table}} o
                                      WHERE o.tenant_id = s.tenant AND o.dedup_key = s.dkey
                                        AND o.status IN ('pending', 'leased')))
     ORDER BY s.ordinal
    RETURNING {{table}}.id
  )
  SELECT s.ordinal, coalesce(i.id, f.id,
                             (SELECT o.id FROM {{table}} o
                               WHERE o.tenant_id = s.tenant AND o.dedup_key = s.dkey
                                 AND o.status IN ('pending', 'leased'))),
         i.id IS NOT NULL
    FROM src s
    LEFT JOIN ins i ON i.id = s.nid
    LEFT JOIN (SELECT s1.tenant, s1.dkey, i1.id FROM src s1 JOIN ins i1 ON i1.id = s1.nid
                WHERE s1.dkey IS NOT NULL) f
           ON i.id IS NULL AND f.tenant = s.tenant AND f.dkey = s.dkey
   ORDER BY s.ordinal;
END $$;

-- ---------------------------------------------------------------- cancel, release

-- Ends the pending and leased tasks of one scope dead, cause 'cancelled': the ids p_ids, or
-- the batch p_batch, or the tenant p_tenant (exactly one). Rows are locked in id order first
-- (a settle writes in id order too). Returns how many were pending and how many leased.
CREATE FUNCTION {{obj:cancel}}(p_ids bigint[], p_batch text, p_tenant text,
                               OUT pending bigint, OUT leased bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  ids bigint[];
BEGIN
  IF (p_ids IS NOT NULL)::int + (p_batch IS NOT NULL)::int + (p_tenant IS NOT NULL)::int <> 1 THEN
    RAISE EXCEPTION 'cancel: give exactly one of ids, batch, tenant'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT array_agg(c.id) INTO ids FROM (
    SELECT q.id FROM {{table}} q
     WHERE q.status IN ('pending', 'leased')
       AND (p_ids IS NULL OR q.id = ANY (p_ids))
       AND (p_batch IS NULL OR q.batch = p_batch)
       AND (p_tenant IS NULL OR q.tenant_id = p_tenant)
     ORDER BY q.id
       FOR UPDATE) c;
  WITH u AS (
    UPDATE {{table}} q
       SET status = 'dead', last_cause = 'cancelled', locked_until = NULL,
           last_error = CASE WHEN q.status = 'leased'
                             THEN 'cancelled while leased by worker ' || coalesce(q.lease_owner, '?')
                             ELSE 'cancelled' END,
           finished_at = now(), updated_at = now()
      FROM {{table}} o
     WHERE q.id = ANY (coalesce(ids, '{}')) AND o.id = q.id AND q.status IN ('pending', 'leased')
    RETURNING o.status AS was
  )
  SELECT count(*) FILTER (WHERE was = 'pending'), count(*) FILTER (WHERE was = 'leased')
    INTO pending, leased FROM u;
  -- A lane handed over has a new head: wake idle workers rather than wait for their poll.
  IF pending + leased > 0 THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
END $$;

-- The worker-presence lock of worker p_worker: one-key advisory space, tagged.
CREATE FUNCTION {{obj:worker_key}}(p_worker text) RETURNS bigint
LANGUAGE sql STABLE AS $$
  SELECT hashtextextended('leash.worker' || chr(31) || p_worker,
                          {{table_literal}}::regclass::oid::bigint)
$$;

-- Called by the worker on its lease connection after each connect (src/queue.c,
-- queue_announce): held until that session ends.
CREATE FUNCTION {{obj:worker_here}}(p_worker text) RETURNS void
LANGUAGE sql AS $$
  SELECT pg_advisory_lock_shared({{obj:worker_key}}(p_worker))
$$;

-- The sessions (backend pids) of worker p_worker that are alive now: the holders of its
-- presence lock (a bigint key shows in pg_locks as classid = high half, objid = low half,
-- objsubid 1).
CREATE FUNCTION {{obj:worker_sessions}}(p_worker text) RETURNS SETOF int
LANGUAGE sql STABLE AS $$
  SELECT l.pid FROM pg_locks l, (SELECT {{obj:worker_key}}(p_worker) AS k) w
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND l.classid = ((w.k >> 32) & 4294967295)::oid AND l.objid = (w.k & 4294967295)::oid
   ORDER BY l.pid
$$;

-- Gives back the leases of worker p_owner as a drain does, refused while the worker has a
-- live session unless p_force (see the top). Returns the ids released. The leases are found
-- through one_lease_per_shard (leased rows only), never by scanning the table.
CREATE FUNCTION {{obj:release_worker}}(p_owner text, p_force boolean DEFAULT false)
RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
BEGIN
  IF NOT pg_try_advisory_xact_lock({{obj:worker_key}}(p_owner)) AND NOT p_force THEN
    RAISE EXCEPTION 'release: worker % has a live session', p_owner
      USING ERRCODE = 'lock_not_available';
  END IF;
  RETURN QUERY
  UPDATE {{table}} q
     SET status = 'pending', locked_until = NULL, attempts = greatest(q.attempts - 1, 0),
         is_head = true, run_after = now(), updated_at = now()
    FROM (SELECT l.id FROM {{table}} l
           WHERE l.lease_owner = p_owner AND l.status = 'leased'
           ORDER BY l.id FOR UPDATE) u
   WHERE q.id = u.id AND q.status = 'leased'
  RETURNING q.id;
  IF FOUND THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
END $$;
