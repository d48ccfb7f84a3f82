-- Recordings (issue #16, items 3 and 4; README "Record and fixture"): what one execution of a
-- task did, kept so a dead task can be turned into a busted spec (`leash fixture ID`).
--
-- One row per recorded execution, written by the worker that ran it, after its settle is
-- known (`leash run --record`: dead, the default, keeps only executions whose settle made the
-- row dead; all keeps every settled one; none, nothing). The row is its own statement on the
-- claim connection, only for recorded executions: the settle itself stays one round trip and
-- is not touched (the attempt history of item 1 owns that path).
--
-- The body (jsonb) is built in C (src/record.c): the task (payload, attempt, max_attempts),
-- every leash.http.request exchange, leash.db.query statement with its parameters and rows,
-- step and child enqueue in the order they happened, and the outcome. Everything in it was
-- redacted before it left the process: the credential headers, every value of leash.env and
-- the operator's --record-redact patterns. truncated: the body reached --record-max and
-- later events were dropped (the outcome is always kept). bytes: the body's size as sent.
--
-- No foreign reference to an attempt-history row: the execution is named by what the worker
-- holds itself (task id, attempt, lease token, script version). A task's recordings go with
-- it (ON DELETE CASCADE, like its steps), so `leash prune` needs no statement of its own.
CREATE TABLE IF NOT EXISTS {{obj:recordings}} (
  task_id      bigint NOT NULL REFERENCES {{table}} (id) ON DELETE CASCADE,
  attempt      int NOT NULL,
  lease_token  bigint NOT NULL,
  version      text NOT NULL,            -- SHA-256 over the script and its modules (script.h)
  recorded_at  timestamptz NOT NULL DEFAULT now(),
  truncated    boolean NOT NULL DEFAULT false,
  bytes        int NOT NULL,
  body         jsonb NOT NULL,
  PRIMARY KEY (task_id, lease_token)     -- a snooze keeps the attempt; a lease is one execution
);
