-- What the host adds to the seed table: batch and result columns, timestamps of the last
-- claim and settle, shard exclusion, the wake-up trigger, and the protocol's functions.

ALTER TABLE {{table}}
  ADD COLUMN IF NOT EXISTS batch       text,         -- a run's name, e.g. nightly-2026-11-29
  ADD COLUMN IF NOT EXISTS result      jsonb,        -- what leash.ok(result) returned
  ADD COLUMN IF NOT EXISTS started_at  timestamptz,  -- last claim
  ADD COLUMN IF NOT EXISTS finished_at timestamptz;  -- last settle (done, retry or dead)

-- A live table may hold leases that expired while no worker was left to reap them; they
-- would make the unique index below fail for no good reason.
UPDATE {{table}}
   SET status = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
       locked_until = NULL, last_error = 'lease expired', updated_at = now()
 WHERE status = 'leased' AND (locked_until IS NULL OR locked_until < now());

-- Shard exclusion, enforced by the database: a unique index is checked against the newest
-- index entries (waiting for in-progress inserters), never against a snapshot, so no
-- interleaving of READ COMMITTED claimers can commit two leased rows of one shard. It also
-- keeps the set of leased rows small and indexed, for the heartbeat and the reaper.
CREATE UNIQUE INDEX IF NOT EXISTS {{name:one_lease_per_shard}}
  ON {{table}} (tenant_id, shard_key) WHERE status = 'leased';

-- --until-empty and status --batch look for unsettled rows of one batch. "batch IS NOT NULL"
-- keeps the planner from ever using this index for the claim's lease probe (which has no
-- batch condition): with stale statistics it once chose a full scan of it per candidate row.
CREATE INDEX IF NOT EXISTS {{name:batch_open_idx}}
  ON {{table}} (batch) WHERE status IN ('pending', 'leased') AND batch IS NOT NULL;

-- Wake-up: one notification per inserting statement that made a row runnable now, on the
-- channel leash_<table oid> (LISTENers compute the same name). Statement-level, so a COPY of
-- 100,000 rows sends one, not 100,000.
CREATE OR REPLACE FUNCTION {{obj:notify}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM new_rows WHERE status = 'pending' AND run_after <= now()) THEN
    PERFORM pg_notify('leash_' || TG_RELID::text, '');
  END IF;
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER {{name:notify}} AFTER INSERT ON {{table}}
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {{obj:notify}}();

-- Claim up to p_n runnable rows, at most one per shard, oldest (run_after, id) first.
-- One call is one short transaction and one round trip. It never waits on a lock (every lock
-- is SKIP LOCKED or try-only), so claimers cannot deadlock or queue behind each other.
--
-- Why two claimers can never lease one shard: statement 1 takes, per candidate shard, a
-- transaction-level advisory lock (try-only). Statement 2 runs with a fresh snapshot taken
-- after those locks are held: whoever held a shard's lock before us has committed (a commit is
-- visible before the transaction's locks are released), so its lease is visible to the
-- NOT EXISTS; whoever comes after us fails the try-lock until we commit. And should anything
-- bypass the gate, the unique index above raises instead of leasing twice.
CREATE OR REPLACE FUNCTION {{obj:claim}}(p_owner text, p_n int, p_visibility_s float8,
                                         p_tenants text[], p_batch text)
RETURNS SETOF {{table}} LANGUAGE plpgsql AS $$
DECLARE
  picked bigint[];
BEGIN
  -- Statement 1. Candidates are runnable rows whose shard shows no lease in this snapshot (a
  -- cheap pre-filter; the snapshot may be stale), row-locked SKIP LOCKED so claimers scan past
  -- each other, one per shard (a batch holding two rows of one shard would break exclusion by
  -- itself), then gated. The window equals the batch size; OFFSET 0 keeps the NOT EXISTS a
  -- per-row index probe and stops the gate from being pushed below DISTINCT ON.
  SELECT array_agg(k.id) INTO picked FROM (
    SELECT d.id FROM (
      SELECT x.* FROM (
        SELECT DISTINCT ON (c.tenant_id, c.shard_key) c.* FROM (
          SELECT t.id, t.tenant_id, t.shard_key, t.run_after
            FROM {{table}} t
           WHERE t.status = 'pending' AND t.run_after <= now()
             AND (p_tenants IS NULL OR t.tenant_id = ANY (p_tenants))
             AND (p_batch IS NULL OR t.batch = p_batch)
             AND NOT EXISTS (SELECT 1 FROM {{table}} l
                              WHERE l.tenant_id = t.tenant_id AND l.shard_key = t.shard_key
                                AND l.status = 'leased' OFFSET 0)
           ORDER BY t.run_after, t.id
           LIMIT p_n
           FOR UPDATE SKIP LOCKED) c
         ORDER BY c.tenant_id, c.shard_key, c.run_after, c.id) x
       ORDER BY x.run_after, x.id
      OFFSET 0) d
     WHERE pg_try_advisory_xact_lock(hashtextextended(d.tenant_id || chr(31) || d.shard_key,
                                                      {{table_literal}}::regclass::oid::bigint))
     LIMIT p_n) k;
  IF picked IS NULL THEN
    RETURN;
  END IF;
  -- Statement 2: a fresh snapshot, exact for every shard whose gate we hold.
  RETURN QUERY
  UPDATE {{table}} q
     SET status = 'leased', lease_owner = p_owner,
         locked_until = now() + make_interval(secs => p_visibility_s),
         attempts = q.attempts + 1, started_at = now(), updated_at = now()
   WHERE q.id = ANY (picked) AND q.status = 'pending'
     AND NOT EXISTS (SELECT 1 FROM {{table}} l
                      WHERE l.tenant_id = q.tenant_id AND l.shard_key = q.shard_key
                        AND l.status = 'leased' OFFSET 0)
  RETURNING q.*;
END $$;

-- Settle a batch of outcomes in one statement, each fenced by (id, owner, attempt, leased):
-- a worker whose lease was lost and taken over matches nothing and changes nothing. Kinds:
-- done (result stored), retry (backoff least(3600, 2^attempts) s unless a delay is given;
-- dead once attempts are exhausted), dead. Returns the rows it changed; an id missing from
-- the answer was a late outcome. Rows are visited in id order so two batches cannot deadlock.
CREATE OR REPLACE FUNCTION {{obj:settle}}(p_owner text, p_ids bigint[], p_attempts int[],
                                          p_kinds text[], p_delays float8[], p_errors text[],
                                          p_results jsonb[])
RETURNS TABLE (id bigint, status text) LANGUAGE sql AS $$
  UPDATE {{table}} q
     SET status = CASE
                    WHEN u.kind = 'done' THEN 'done'
                    WHEN u.kind = 'retry' AND q.attempts < q.max_attempts THEN 'pending'
                    ELSE 'dead' END,
         run_after = CASE
                       WHEN u.kind = 'retry' AND q.attempts < q.max_attempts
                       THEN now() + make_interval(secs => coalesce(u.delay,
                                                                   least(3600, 2 ^ q.attempts)))
                       ELSE q.run_after END,
         last_error = CASE WHEN u.kind = 'done' THEN q.last_error ELSE u.err END,
         result = CASE WHEN u.kind = 'done' THEN u.result ELSE q.result END,
         locked_until = NULL, finished_at = now(), updated_at = now()
    FROM (SELECT * FROM unnest(p_ids, p_attempts, p_kinds, p_delays, p_errors, p_results)
                        AS v(id, attempt, kind, delay, err, result)
           ORDER BY v.id) u
   WHERE q.id = u.id AND q.attempts = u.attempt AND q.lease_owner = p_owner
     AND q.status = 'leased'
  RETURNING q.id, q.status;
$$;

-- Expired leases back to pending (dead when attempts are exhausted). Any process may call
-- it; the try-lock makes sure at most one runs it at a time, and a renewal that commits first
-- wins (the row lock's recheck sees the newer locked_until). Wakes idle workers when it
-- made rows runnable.
CREATE OR REPLACE FUNCTION {{obj:reap}}()
RETURNS TABLE (id bigint, status text, tenant_id text, lease_owner text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtextextended('leash.reap',
                                                    {{table_literal}}::regclass::oid::bigint)) THEN
    RETURN;
  END IF;
  RETURN QUERY
  WITH r AS (
    SELECT e.id, e.lease_owner AS owner FROM {{table}} e
     WHERE e.status = 'leased' AND (e.locked_until IS NULL OR e.locked_until < now())
     ORDER BY e.id
     LIMIT 1000
     FOR UPDATE SKIP LOCKED)
  UPDATE {{table}} q
     SET status = CASE WHEN q.attempts >= q.max_attempts THEN 'dead' ELSE 'pending' END,
         locked_until = NULL, last_error = 'lease expired (worker ' || coalesce(r.owner, '?') || ')',
         finished_at = now(), updated_at = now()
    FROM r WHERE q.id = r.id
  RETURNING q.id, q.status, q.tenant_id, r.owner;
  IF FOUND THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
END $$;

-- Drain: leases a stopping worker still holds go back to pending at once, without charging
-- the attempt (the task did not fail; the worker left). Fenced like every write.
CREATE OR REPLACE FUNCTION {{obj:release}}(p_owner text, p_ids bigint[], p_attempts int[])
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  UPDATE {{table}} q
     SET status = 'pending', locked_until = NULL, attempts = q.attempts - 1,
         run_after = now(), updated_at = now()
    FROM (SELECT * FROM unnest(p_ids, p_attempts) AS v(id, attempt) ORDER BY v.id) u
   WHERE q.id = u.id AND q.attempts = u.attempt AND q.lease_owner = p_owner
     AND q.status = 'leased'
  RETURNING q.id;
  IF FOUND THEN
    PERFORM pg_notify('leash_' || {{table_literal}}::regclass::oid::text, '');
  END IF;
END $$;
