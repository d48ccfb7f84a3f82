-- Durable steps (leash.step): a step's result is stored once it succeeded, so a retried or
-- re-leased task skips it (an LLM call is not paid twice). Written fenced, like every write.
-- Retention: a task's steps are removed when it reaches done; they are kept while it is
-- pending or dead, so `leash requeue` of a dead task resumes after its paid steps. Deleting
-- a task (prune) deletes its steps.
CREATE TABLE IF NOT EXISTS {{obj:steps}} (
  task_id     bigint NOT NULL REFERENCES {{table}} (id) ON DELETE CASCADE,
  name        text NOT NULL,
  result      jsonb,                    -- NULL: the step returned nothing
  attempt     int NOT NULL,             -- the attempt that ran it
  created_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (task_id, name)
);

-- The settle drops the steps of tasks that are done: see <table>_cycle (007).
