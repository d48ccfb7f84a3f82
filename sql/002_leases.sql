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

-- The claim and the settle: see <table>_cycle in 007_cycle_inline.sql (one body, one round
-- trip). Before the first release their earlier versions were folded away from here.

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
