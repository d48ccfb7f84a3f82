-- Durable waits (issue #19, item 1; README "Waits", docs/lua-api.md leash.wait,
-- docs/ARCHITECTURE.md "Waits").
--
-- `return leash.wait{...}` ends an execution with the outcome kind 'wait' (src/lifecycle.c):
-- the row goes back to pending with the claim's attempt given back (like a granted snooze,
-- but never counted in snoozes), last_cause 'waiting', its steps kept, and its lease and slot
-- freed by the settle like any other end. It is not claimable while it waits: run_after is
-- 'infinity' for a wait on tasks (children, ids) or an event, the wake time for the clock.
-- The status stays 'pending' (every status-reading query, index and trigger stays right);
-- "waiting" is: wait_reason set and run_after in the future. A waiting task is not its
-- shard's head once anything else of the shard is pending (its run_after sorts last, as a
-- retry in backoff does), so it never holds its shard back.
--
-- The wait's spec travels in the settle's results array (the kind 'wait' has no result):
--   {"reason": "children"|"ids"|"until", "ids": [..], "until": epoch s, "after": s,
--    "deadline": s, "on_deadline": "retry"|"dead"}
-- ({"reason": "event", "event": name, ...} for an event.)
-- children: the rows whose parent_id is this task (leash.enqueue writes it), resolved by the
-- settle into wait_ids; ids: the given ids. A task "has settled" when it is done or dead or
-- does not exist.
--
-- Waking, race-free. A waiter wakes (run_after = now()) when none of its wait_ids is pending
-- or leased. Two sides can see that moment: the waiter's own settle, and the settle (or reap)
-- of its last awaited task. Under READ COMMITTED each could look before the other commits and
-- both conclude "not yet". So both synchronise on an advisory lock per awaited id (bucketed:
-- at most 1,024 per transaction, a collision only serialises): a settling task takes its own
-- id's lock before it looks for waiters; a waiter takes the locks of the ids it still sees
-- unsettled before it looks again with a fresh snapshot. Whichever takes the lock second sees
-- the other's commit. Two siblings settling at once both see the committed waiter; each locks
-- the waiter's row before its check, so the second's check sees the first's commit.
--
-- Deadlines: a wait on tasks or an event has one (leash.wait's deadline, default 24 h, cut
-- to 7 days). The reaper (under its lock) expires waits past it: on_deadline 'retry' spends the attempt the
-- wait gave back and makes the row runnable (dead when attempts are exhausted), 'dead' ends
-- it; cause 'wait_deadline' either way. A wait on the clock always ends by itself.
--
-- Events: leash.wait{event = "name"} waits for `leash signal NAME` / <table>_signal(name,
-- payload, tenant, ttl_s). A signal is stored (<table>_signals, one row per scope and name,
-- the latest payload) until its TTL (default 24 h) ends: it wakes the current waiters and any
-- wait for that name that starts before it expires (a signal sent a moment before the wait
-- is not lost). A signal without a tenant reaches every tenant's waiters; with one, that
-- tenant's. The same two-sided locking as above, on an advisory lock per event name.
--
-- A cancelled awaited task counts as settled (016's cancel is restated to wake its waiters).
--
-- What is restated: 016's settle (same arguments, CREATE OR REPLACE: the cycle and its
-- fallback call it unchanged, so the settle stays in the cycle's one round trip), 016's reap
-- (the expiry, the wakes of leases reaped dead) and 016's cancel. Known limit: the two-sided
-- locks can, rarely, deadlock a settle with the reaper's expiry on colliding buckets;
-- PostgreSQL then aborts one: the host writes that cycle's outcomes again one by one
-- (dispatch.c, settle_one_by_one), the reaper tries again at its next round.

ALTER TABLE {{table}}
  ADD COLUMN IF NOT EXISTS parent_id        bigint,        -- leash.enqueue's parent
  ADD COLUMN IF NOT EXISTS wait_reason      text,          -- NULL: not waiting
  ADD COLUMN IF NOT EXISTS wait_ids         bigint[],
  ADD COLUMN IF NOT EXISTS wait_event       text,
  ADD COLUMN IF NOT EXISTS wait_deadline    timestamptz,
  ADD COLUMN IF NOT EXISTS wait_on_deadline text;

-- Dropped first, as 012 does: a schema rebuilt from an older record runs this again.
ALTER TABLE {{table}}
  DROP CONSTRAINT IF EXISTS leash_wait_reason,
  DROP CONSTRAINT IF EXISTS leash_wait_on_deadline,
  ADD CONSTRAINT leash_wait_reason CHECK (wait_reason IN ('children', 'ids', 'until', 'event')),
  ADD CONSTRAINT leash_wait_on_deadline CHECK (wait_on_deadline IN ('retry', 'dead'));

-- "Which waiters await this id?" (a settle's one probe) and "whose children are these?".
CREATE INDEX IF NOT EXISTS {{name:wait_ids_idx}} ON {{table}} USING gin (wait_ids)
  WHERE wait_ids IS NOT NULL;
CREATE INDEX IF NOT EXISTS {{name:parent_idx}} ON {{table}} (parent_id)
  WHERE parent_id IS NOT NULL;
-- A signal's one probe: the waiters of an event.
CREATE INDEX IF NOT EXISTS {{name:wait_event_idx}} ON {{table}} (wait_event)
  WHERE wait_event IS NOT NULL AND status = 'pending';
-- The reaper's expiry: waits on tasks or events, by deadline.
CREATE INDEX IF NOT EXISTS {{name:wait_deadline_idx}} ON {{table}} (wait_deadline)
  WHERE wait_deadline IS NOT NULL AND status = 'pending';

-- Signals, remembered until expires_at. scope: a tenant id, or '' for every tenant.
CREATE TABLE IF NOT EXISTS {{obj:signals}} (
  scope        text NOT NULL,
  name         text NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 200),
  payload      jsonb,
  signalled_at timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL,
  PRIMARY KEY (scope, name)
);

-- When a wait's row becomes claimable on its own: the clock's time, or never.
CREATE OR REPLACE FUNCTION {{obj:wait_wakes_at}}(p_spec jsonb) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
  SELECT CASE
           WHEN p_spec->>'reason' = 'until' AND p_spec ? 'after'
           THEN now() + make_interval(secs => least((p_spec->>'after')::float8, 604800))
           WHEN p_spec->>'reason' = 'until'
           THEN least(greatest(now(), to_timestamp((p_spec->>'until')::float8)),
                      now() + interval '7 days')
           ELSE 'infinity'::timestamptz END
$$;

-- The advisory lock of an awaited id (the two-key space; the claim's gate uses the one-key).
CREATE OR REPLACE FUNCTION {{obj:wait_lock_key}}(p_id bigint) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT (p_id % 1024)::int
$$;

-- Wakes what the settle or reap of p_ids may have made ready: waiters among p_ids whose
-- awaited tasks have all settled, and waiters awaiting any of p_ids. Returns how many woke.
-- Called after the statement that wrote p_ids (its row locks held); every statement here
-- takes a fresh snapshot (a volatile function under READ COMMITTED).
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

-- Waits on tasks past their deadline (the reaper, under its lock): retry spends the attempt
-- the wait gave back; dead, or no attempt left, ends the row. Returns how many.
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
                          ELSE NOT EXISTS (SELECT 1 FROM {{table}} o
                                            WHERE o.tenant_id = q.tenant_id
                                              AND o.shard_key = q.shard_key
                                              AND o.status = 'leased') END,
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

-- The lock of an event name (both sides: a signal, a waiter's settle).
CREATE OR REPLACE FUNCTION {{obj:wait_event_lock}}(p_name text) RETURNS void
LANGUAGE sql AS $$
  SELECT pg_advisory_xact_lock(hashtext({{table_literal}} || ':event'), hashtext(p_name))
$$;

-- Wakes the waiters for an event among p_ids (just settled, their row locks held) whose
-- event has a live signal: each name's lock first, then a fresh look.
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
           is_head = NOT EXISTS (SELECT 1 FROM {{table}} o
                                  WHERE o.tenant_id = q.tenant_id
                                    AND o.shard_key = q.shard_key AND o.status = 'leased')
     WHERE q.id = ANY (p_ids) AND q.wait_event IS NOT NULL AND q.status = 'pending'
       AND q.run_after = 'infinity'
       AND EXISTS (SELECT 1 FROM {{obj:signals}} g
                    WHERE g.name = q.wait_event AND g.scope IN ('', q.tenant_id)
                      AND g.expires_at > now())
    RETURNING q.id)
  SELECT count(*) INTO n FROM u;
  RETURN n;
END $$;

-- Signals event p_name (for tenant p_tenant, or every tenant when NULL) with p_payload,
-- remembered for p_ttl_s seconds (0: wakes the current waiters only); returns how many
-- waiting tasks woke.
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
           is_head = NOT EXISTS (SELECT 1 FROM {{table}} o
                                  WHERE o.tenant_id = q.tenant_id
                                    AND o.shard_key = q.shard_key AND o.status = 'leased')
     WHERE q.wait_event = p_name AND q.status = 'pending' AND q.run_after = 'infinity'
       AND (p_tenant IS NULL OR q.tenant_id = p_tenant)
    RETURNING q.id)
  SELECT count(*) INTO n FROM u;
  IF n > 0 THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
  RETURN n;
END $$;

-- ---------------------------------------------------------------- settle

-- 016's settle (same arguments: the cycle and its fallback call it unchanged, one round trip)
-- with the kind 'wait': pending, the attempt given back, the wait's columns written, its
-- attempt row of kind 'wait'; then the wakes.
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
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  rel int := {{table_literal}}::regclass::oid::int;
  busy bigint[];
  kt text[];
  ks text[];
BEGIN
  -- The hand-over locks of these leases' shards, try-only, in key order (011).
  SELECT array_agg(x.id) FILTER (WHERE NOT x.got),
         array_agg(x.tenant_id) FILTER (WHERE x.got), array_agg(x.shard_key) FILTER (WHERE x.got)
    INTO busy, kt, ks
    FROM (SELECT y.id, y.tenant_id, y.shard_key,
                 pg_try_advisory_xact_lock(rel, {{obj:lane_key}}(y.tenant_id, y.shard_key)) AS got
            FROM (SELECT q.id, q.tenant_id, q.shard_key FROM {{table}} q
                   WHERE q.id = ANY (p_ids)
                   ORDER BY q.tenant_id, q.shard_key
                  OFFSET 0) y) x;
  -- Found by id (pkey), never through one_lease_per_shard: see 011.
  RETURN QUERY
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
              u.version, u.label, u.waited
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
  SELECT s.id, s.attempts, s.status, s.last_cause FROM s
  UNION ALL
  SELECT b, NULL::int, 'leased'::text, NULL::text FROM unnest(busy) AS b;
  IF kt IS NOT NULL THEN
    PERFORM {{obj:lane_handover}}(kt, ks);
  END IF;
  -- Wakes, in statements of their own (fresh snapshots, after this one's row locks): the
  -- waiters settled here whose children already settled, and the waiting parents of rows
  -- settled here (see wait_wake).
  PERFORM {{obj:wait_wake}}(p_ids);
  PERFORM {{obj:wait_events}}(p_ids);
END $$;
-- ---------------------------------------------------------------- reap

-- 016's reaper with the deadline expiry first and the wakes of leases reaped to dead.
CREATE OR REPLACE FUNCTION {{obj:reap}}(p_only bigint DEFAULT NULL)
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
  -- Waits past their deadline, under the same lock (one expirer at a time).
  IF p_only IS NULL THEN
    PERFORM {{obj:wait_expire}}();
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
    RETURNING q.id, q.status, q.tenant_id, q.shard_key, r.owner, q.last_cause, q.attempts,
              q.lease_token, q.started_at, q.finished_at, q.last_error, q.run_after,
              q.created_at
  ), h AS (
    -- The lease's execution, lost: its worker never settled it. The claim left run_after
    -- as it was, so the wait is the claim's.
    INSERT INTO {{obj:attempts}} (task_id, lease_token, attempt, worker, queue_wait_s,
                                  claimed_at, finished_at, kind, cause, status, error, crashed)
    SELECT u.id, coalesce(u.lease_token, 0), u.attempts, u.owner,
           extract(epoch FROM u.started_at - greatest(u.run_after, u.created_at))::float8,
           u.started_at, u.finished_at, 'lost', u.last_cause, u.status, u.last_error, true
      FROM u
    ON CONFLICT DO NOTHING
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
  -- A lease reaped to dead may be the last awaited child of a waiting parent.
  PERFORM {{obj:wait_wake}}(array_agg(x.id))
     FROM unnest(r_id, r_status) AS x(id, status) WHERE x.status = 'dead' HAVING count(*) > 0;
  PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  RETURN QUERY SELECT * FROM unnest(r_id, r_status, r_tenant, r_owner, r_cause);
END $$;

-- ---------------------------------------------------------------- cancel

-- 016's cancel, waking the waiters of the tasks it ended.
CREATE OR REPLACE FUNCTION {{obj:cancel}}(p_ids bigint[], p_batch text, p_tenant text,
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
    RETURNING o.status AS was, q.id, q.attempts, q.lease_token, o.lease_owner, q.started_at,
              q.finished_at, q.last_error, q.run_after, q.created_at
  ), h AS (
    -- A lease cancelled under its worker ends its execution here: that worker's settle
    -- will match nothing.
    INSERT INTO {{obj:attempts}} (task_id, lease_token, attempt, worker, queue_wait_s,
                                  claimed_at, finished_at, kind, cause, status, error)
    SELECT u.id, coalesce(u.lease_token, 0), u.attempts, u.lease_owner,
           extract(epoch FROM u.started_at - greatest(u.run_after, u.created_at))::float8,
           u.started_at, u.finished_at, 'lost', 'cancelled', 'dead', u.last_error
      FROM u WHERE u.was = 'leased'
    ON CONFLICT DO NOTHING
  )
  SELECT count(*) FILTER (WHERE was = 'pending'), count(*) FILTER (WHERE was = 'leased')
    INTO pending, leased FROM u;
  -- A cancelled task may be the last one a waiter waits for (019).
  PERFORM {{obj:wait_wake}}(ids);
  -- A lane handed over has a new head: wake idle workers rather than wait for their poll.
  IF pending + leased > 0 THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
END $$;
