-- The dashboard's reads, cheap on millions of rows (issue 18; README "Dashboard",
-- src/dashboard_data.c). Measured before this migration (bench/dashboard.sh: 2,000,000 rows
-- over 20 batches of 100,000, 19 finished): a batch's numbers were a pass over its rows (its
-- report, `leash report --batch`, 190 to 390 ms per 100,000 rows; its counts by status 25 to
-- 85 ms), for every batch listed and every look, so the list named only the batches among
-- the newest 10,000 rows (counting the 10 newest batches took 300 to 840 ms). After: a
-- finished batch's page 66 ms (318 before), the 10 newest listed for a few probes each.
--
-- Two tables, neither touched by the claim or the settle:
--
-- <table>_batch_totals: how many rows each batch has, its first and last id and when it
-- was first enqueued, kept by statement-level triggers on INSERT and DELETE (one upsert per
-- inserting statement and batch, from the statement's transition table; enqueue and prune
-- are not the hot path). Spread over 8 rows per batch by the inserting backend (pid % 8):
-- leash.enqueue's children are one statement each, written by every slot of every pod
-- into the parent's batch, and one row per batch would queue them all on its lock until
-- each commit. The readers sum a batch's rows. A TRUNCATE empties it. What it does not see:
-- a row's batch changed by hand (UPDATE ... SET batch; leash never does), which would need
-- an UPDATE trigger, and every settle is an UPDATE. The rows already there are counted by
-- this migration (one pass, once). Like the heads' triggers (011), two transactions that
-- insert into the same two batches in opposite orders, in separate statements, can deadlock
-- here (PostgreSQL aborts one); within a statement the batches are taken in order. The
-- totals only choose which batches are listed and tell whether a kept report still holds:
-- the numbers shown are always counted (a kept report, or a pass), so a total that is off
-- (a hand-made UPDATE of batch, a prune emptying a batch while rows are added to it) costs
-- a recomputation on every look, never a wrong figure.
--
-- <table>_batch_reports: a finished batch's report (report.c's JSON, no pending or leased
-- row), computed once by the dashboard and kept with the batch's total and when it was last
-- checked. The dashboard uses it while the batch is still finished, its total unchanged
-- (prune), and no attempt of an id in the batch's range ended after checked_at (a requeue
-- and a new settle since: the attempt history, sql/016, by its finished_at index, so the
-- check reads the attempts since the last look, not the batch); each successful check moves
-- checked_at to 5 s before now (a settle's attempt carries its transaction's start, and may
-- commit just after a look). Older than 6 hours unchecked it is computed again (the attempts since
-- could be many). Rows settled by hand without an attempt are not seen (delete the batch's
-- row here). Only the dashboard writes it; deleting its rows is always safe.

CREATE TABLE IF NOT EXISTS {{obj:batch_totals}} (
  batch     text NOT NULL,
  slot      int NOT NULL,
  total     bigint NOT NULL,
  first_id  bigint NOT NULL,
  last_id   bigint NOT NULL,
  first_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (batch, slot)
);
CREATE INDEX IF NOT EXISTS {{name:batch_totals_last}} ON {{obj:batch_totals}} (last_id);

CREATE TABLE IF NOT EXISTS {{obj:batch_reports}} (
  batch       text PRIMARY KEY,
  total       bigint NOT NULL,
  report      jsonb NOT NULL,
  computed_at timestamptz NOT NULL DEFAULT now(),
  checked_at  timestamptz NOT NULL DEFAULT now()
);

-- Rows in batch order, so two statements that insert into the same batches lock their
-- total rows in the same order.
CREATE OR REPLACE FUNCTION {{obj:batch_totals_add}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {{obj:batch_totals}} AS t (batch, slot, total, first_id, last_id)
  SELECT batch, pg_backend_pid() % 8, count(*), min(id), max(id)
    FROM new_rows WHERE batch IS NOT NULL GROUP BY batch ORDER BY batch
  ON CONFLICT (batch, slot) DO UPDATE
    SET total = t.total + excluded.total, first_id = least(t.first_id, excluded.first_id),
        last_id = greatest(t.last_id, excluded.last_id);
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER {{name:batch_totals_insert}} AFTER INSERT ON {{table}}
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
  EXECUTE FUNCTION {{obj:batch_totals_add}}();

-- A delete takes its rows off one of the batch's total rows (the sum is what counts; a row
-- may go below zero while another slot holds the rows). A batch with no row left goes.
CREATE OR REPLACE FUNCTION {{obj:batch_totals_sub}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  WITH d AS (SELECT batch, count(*) AS n FROM old_rows WHERE batch IS NOT NULL GROUP BY batch),
       one AS (SELECT DISTINCT ON (t.batch) t.batch, t.slot, d.n
                 FROM {{obj:batch_totals}} t JOIN d USING (batch)
                ORDER BY t.batch, t.slot)
  UPDATE {{obj:batch_totals}} t SET total = t.total - one.n
    FROM one WHERE t.batch = one.batch AND t.slot = one.slot;
  DELETE FROM {{obj:batch_totals}} t
   WHERE t.batch IN (SELECT DISTINCT batch FROM old_rows WHERE batch IS NOT NULL)
     AND (SELECT sum(total) FROM {{obj:batch_totals}} s WHERE s.batch = t.batch) <= 0;
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER {{name:batch_totals_delete}} AFTER DELETE ON {{table}}
  REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT
  EXECUTE FUNCTION {{obj:batch_totals_sub}}();

CREATE OR REPLACE FUNCTION {{obj:batch_totals_clear}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM {{obj:batch_totals}};
  DELETE FROM {{obj:batch_reports}};
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER {{name:batch_totals_truncate}} AFTER TRUNCATE ON {{table}}
  FOR EACH STATEMENT EXECUTE FUNCTION {{obj:batch_totals_clear}}();

-- The rows already there (slot 0).
INSERT INTO {{obj:batch_totals}} (batch, slot, total, first_id, last_id, first_at)
SELECT batch, 0, count(*), min(id), max(id), min(created_at)
  FROM {{table}} WHERE batch IS NOT NULL GROUP BY batch
ON CONFLICT (batch, slot) DO NOTHING;
