-- The plans of the queue's functions must not depend on how big the table was when a session
-- first called them. PL/pgSQL keeps a statement's plan for the session; 007 makes the cycle's
-- plans generic, and reap's statement has no parameters, so its plan is generic too. A
-- generic plan is costed from the table's size at that moment. A worker that started on an
-- empty table (a fresh deploy, a nightly batch not yet enqueued) planned the claim as a
-- sequential scan with a sequential-scan NOT EXISTS per row, O(rows^2), and kept it until
-- autovacuum happened to refresh the table's statistics. Measured (bench/run.sh latency: 500
-- rows inserted one by one into a fresh table): each cycle took 4 ms by the 200th row and
-- rising, pickup p99 16-20 ms; in the runs where autovacuum came early, 1.5 ms.
--
-- Every statement in these functions has an index made for it (claim_idx, batch_claim_idx,
-- one_lease_per_shard, the primary key, the steps' primary key), so sequential scans are
-- ruled out inside them: the plans are then the same whatever the statistics say.
-- run.cycle_plans_do_not_depend_on_the_first_statistics holds the cycle to it.
ALTER FUNCTION {{obj:cycle}}(text, bigint[], int[], text[], float8[], text[], jsonb[], int,
                             float8, text[], text)
  SET enable_seqscan = off;
ALTER FUNCTION {{obj:reap}}() SET enable_seqscan = off;
ALTER FUNCTION {{obj:release}}(text, bigint[], int[]) SET enable_seqscan = off;
