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

-- Settle as in 002, and drop the steps of tasks that are done.
CREATE OR REPLACE FUNCTION {{obj:settle}}(p_owner text, p_ids bigint[], p_attempts int[],
                                          p_kinds text[], p_delays float8[], p_errors text[],
                                          p_results jsonb[])
RETURNS TABLE (id bigint, status text) LANGUAGE sql AS $$
  WITH s AS (
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
    RETURNING q.id, q.status
  ), gone AS (
    DELETE FROM {{obj:steps}} st USING s WHERE st.task_id = s.id AND s.status = 'done'
  )
  SELECT s.id, s.status FROM s;
$$;
