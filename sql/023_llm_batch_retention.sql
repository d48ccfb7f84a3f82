-- Provider batches' rows go with their tasks (issue #19; README "Provider batches"). 022 keeps
-- an item per leash.llm.batch call and a row per provider batch, and nothing removed them:
-- `leash prune` deleted the tasks and left their items and batches for ever. As with the
-- attempt history (020): a statement trigger on the queue's DELETE takes the deleted tasks'
-- items, then every ended or abandoned batch none of whose items is left; a TRUNCATE of the
-- queue empties both. Items are found by task through an index of their own (022's only
-- index by task is partial: live items).
CREATE INDEX IF NOT EXISTS {{name:llm_items_task}} ON {{obj:llm_items}} (task_id);

CREATE OR REPLACE FUNCTION {{obj:llm_batch_gone}}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  touched bigint[];
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    TRUNCATE {{obj:llm_items}}, {{obj:llm_batches}};
    RETURN NULL;
  END IF;
  WITH d AS (DELETE FROM {{obj:llm_items}} i USING gone g WHERE i.task_id = g.id
             RETURNING i.batch_id)
  SELECT array_agg(DISTINCT d.batch_id) INTO touched FROM d WHERE d.batch_id IS NOT NULL;
  IF touched IS NULL THEN
    RETURN NULL;
  END IF;
  -- A statement of its own, so it sees the items just deleted as gone.
  DELETE FROM {{obj:llm_batches}} b
   WHERE b.id = ANY (touched) AND b.state IN ('ended', 'abandoned')
     AND NOT EXISTS (SELECT 1 FROM {{obj:llm_items}} i WHERE i.batch_id = b.id);
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS {{name:llm_batch_gone}} ON {{table}};
CREATE TRIGGER {{name:llm_batch_gone}} AFTER DELETE ON {{table}}
  REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {{obj:llm_batch_gone}}();
DROP TRIGGER IF EXISTS {{name:llm_batch_truncated}} ON {{table}};
CREATE TRIGGER {{name:llm_batch_truncated}} AFTER TRUNCATE ON {{table}}
  FOR EACH STATEMENT EXECUTE FUNCTION {{obj:llm_batch_gone}}();

-- As 020's: run as the owner, the search path pinned to the queue's schema (pg_temp last).
DO $$
BEGIN
  EXECUTE format('ALTER FUNCTION %s() SECURITY DEFINER SET search_path = %I, pg_temp',
                 {{objlit:llm_batch_gone}},
                 (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE c.oid = {{table_literal}}::regclass));
END $$;
