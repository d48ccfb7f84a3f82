-- All rows of a batch, whatever their status: `leash report --batch`, `status --batch` (the
-- done and dead counts) and the report `run --until-empty --batch` prints at exit read the
-- batch's own rows instead of the whole table. Measured: with 1,000,000 other rows in the
-- table, that report took 98 ms (a sequential scan) at the end of a 20,000-task batch that
-- drained in 0.6 s. Unbatched rows (batch IS NULL) are not in it and cost nothing; a batched
-- row pays one more index entry per non-HOT update (status changes are never HOT: status is
-- in the partial indexes' predicates).
CREATE INDEX IF NOT EXISTS {{name:batch_idx}} ON {{table}} (batch) WHERE batch IS NOT NULL;
