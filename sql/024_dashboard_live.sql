-- A running batch's dead tasks, found without reading its other rows (issue 18; README
-- "Dashboard", src/dashboard_data.c's live_fmt). A running batch's page counts its rows by
-- status exactly without a pass over them: its total from <table>_batch_totals (sql/021),
-- its open rows from batch_open_idx (sql/002, index entries only), its leased rows from
-- one_lease_per_shard (every leased row of the table: as many as the fleet's slots), its
-- dead rows from this index, and done as the rest. All four in one statement, so in one
-- snapshot with the totals (their triggers write in the inserting transaction).
--
-- What it costs the settle: no trigger; a row that becomes dead gets one more index entry
-- (a batch's dead are few; a settle to done, retry or pending only evaluates the predicate:
-- status changes are never HOT updates, sql/008, so every index's predicate is checked on
-- every status change already). The claim never makes a row dead. Unbatched rows are not in
-- it.
CREATE INDEX IF NOT EXISTS {{name:batch_dead_idx}}
  ON {{table}} (batch) WHERE status = 'dead' AND batch IS NOT NULL;
