-- The chaos soak's own tables, created after `leash migrate` (tests/chaos/soak.sh).
-- What the task script writes (execs, step_runs), and two audit triggers that keep the history
-- leash does not keep (a queue row holds only its last attempt):
--   lease_log       every change of a row's lease: claim, settle, reap, release (renewals,
--                   which change only locked_until, are left out), with the server's clock
--   step_store_log  every step result leash stored (the fenced insert into <table>_steps),
--                   kept after leash deletes a done task's steps
-- The triggers only read and append; they change nothing leash reads.

CREATE TABLE chaos_config (key text PRIMARY KEY, value text NOT NULL);

CREATE TABLE execs (
  id        bigserial PRIMARY KEY,
  task_id   bigint NOT NULL,
  attempt   int NOT NULL,
  worker    text NOT NULL,
  version   text NOT NULL,
  tenant    text NOT NULL,
  shard     text NOT NULL,
  started   timestamptz NOT NULL DEFAULT clock_timestamp(),
  finished  timestamptz,
  outcome   text
);
CREATE INDEX ON execs (task_id);

CREATE TABLE step_runs (
  id       bigserial PRIMARY KEY,
  task_id  bigint NOT NULL,
  name     text NOT NULL,
  attempt  int NOT NULL,
  worker   text NOT NULL,
  at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  answer   text
);
CREATE INDEX ON step_runs (task_id);

CREATE TABLE lease_log (
  seq       bigserial PRIMARY KEY,
  task_id   bigint NOT NULL,
  kind      text NOT NULL,        -- claim | settle | reap | release | other
  old_status text NOT NULL,
  new_status text NOT NULL,
  attempt   int NOT NULL,         -- the attempt the lease was for
  owner     text,                 -- its owner
  at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON lease_log (task_id, attempt);

CREATE FUNCTION chaos_lease_log() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  k text;
BEGIN
  IF OLD.status <> 'leased' AND NEW.status = 'leased' THEN
    k := 'claim';
  ELSIF OLD.status = 'leased' AND NEW.status = 'pending' AND NEW.attempts = OLD.attempts - 1 THEN
    k := 'release';
  ELSIF OLD.status = 'leased' AND current_query() ~ '_reap"?\(' THEN
    k := 'reap';
  ELSIF OLD.status = 'leased' AND NEW.status <> 'leased' THEN
    k := 'settle';
  ELSE
    k := 'other';
  END IF;
  INSERT INTO lease_log (task_id, kind, old_status, new_status, attempt, owner)
  VALUES (NEW.id, k, OLD.status, NEW.status,
          CASE WHEN k = 'claim' THEN NEW.attempts ELSE OLD.attempts END,
          CASE WHEN k = 'claim' THEN NEW.lease_owner ELSE OLD.lease_owner END);
  RETURN NULL;
END $$;

CREATE TRIGGER chaos_lease_log AFTER UPDATE ON agent_work_queue FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.attempts IS DISTINCT FROM NEW.attempts
        OR OLD.lease_owner IS DISTINCT FROM NEW.lease_owner)
  EXECUTE FUNCTION chaos_lease_log();

CREATE TABLE step_store_log (
  task_id  bigint NOT NULL,
  name     text NOT NULL,
  attempt  int NOT NULL,
  owner    text,
  at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON step_store_log (task_id);

CREATE FUNCTION chaos_step_store_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO step_store_log (task_id, name, attempt, owner)
  SELECT NEW.task_id, NEW.name, NEW.attempt, q.lease_owner
    FROM agent_work_queue q WHERE q.id = NEW.task_id;
  RETURN NULL;
END $$;

CREATE TRIGGER chaos_step_store_log AFTER INSERT ON agent_work_queue_steps FOR EACH ROW
  EXECUTE FUNCTION chaos_step_store_log();

-- Filled by soak.sh at the end, from its own files.
CREATE TABLE produced (lo int NOT NULL, hi int NOT NULL, via text NOT NULL);
CREATE TABLE events (at timestamptz NOT NULL, kind text NOT NULL, target text, detail text);
CREATE TABLE incarnations (worker text PRIMARY KEY, slot int, pid int, started timestamptz,
                           ended timestamptz, how text, rc int);
CREATE TABLE wlog_raw (worker text, line text);
