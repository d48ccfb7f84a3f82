-- Autovacuum and autoanalyze per queue table (README.md, "Retention and autovacuum";
-- bench/autovacuum.sh measures it). The server's defaults wait until 10% of a table changed
-- (analyze) or 20% is dead tuples (vacuum). A queue table keeps its done rows until
-- `leash prune`, so a nightly batch is often a small share of it, and by day, when
-- autoanalyze last looked, nothing was pending: the planner then takes the pending-only
-- indexes for empty and may claim with a plan whose cost grows with the square of the batch
-- (measured: a 50,000-task batch on 1,000,000 done rows made no progress in 240 s, each claim
-- cancelled by the claim's statement timeout, and autoanalyze never came). At 1% plus a small
-- fixed threshold, such a batch is analysed within one autovacuum round (autovacuum_naptime,
-- 1 min by default), and the dead index entries a drained batch leaves in the claim index are
-- vacuumed away instead of being read by every idle claim.
ALTER TABLE {{table}} SET (
  autovacuum_analyze_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.01,
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_insert_scale_factor = 0.01
);
