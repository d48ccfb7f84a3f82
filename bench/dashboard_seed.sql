-- bench/dashboard.sh's table: 2,000,000 rows over 20 nightly batches of 100,000. The 19
-- earlier nights are finished (98% done, 2% dead); tonight's is running: 60% done, 1% dead,
-- 200 leased, the rest pending. Plain INSERT ... SELECT (the triggers keep heads as for any
-- insert); every row its own shard. :rows_per_batch rows per batch (psql variable).
INSERT INTO agent_work_queue (tenant_id, shard_key, payload, batch, status, attempts,
                              created_at, run_after, started_at, run_started_at, finished_at,
                              last_error, last_cause)
SELECT 't', 's' || g, '{}', 'night-2026-11-' || lpad((12 + b)::text, 2, '0'),
       CASE WHEN i % 50 = 0 THEN 'dead' ELSE 'done' END,
       CASE WHEN i % 50 = 0 THEN 3 ELSE 1 END,
       n, n, n + interval '1 second' * (i / 50.0), n + interval '1 second' * (i / 50.0),
       n + interval '1 second' * (i / 50.0 + 0.5 + (i % 7) / 10.0),
       CASE WHEN i % 50 = 0 THEN 'quota exceeded' END,
       CASE WHEN i % 50 = 0 THEN 'returned' END
  FROM generate_series(0, 18) b,
       LATERAL (SELECT timestamptz '2026-11-12 01:00 UTC' + b * interval '1 day' AS n) t,
       generate_series(1, :rows_per_batch) i,
       LATERAL (SELECT b * :rows_per_batch + i AS g) gg;
INSERT INTO agent_work_queue (tenant_id, shard_key, payload, batch, status, attempts,
                              created_at, run_after, started_at, run_started_at, finished_at,
                              last_error, last_cause)
SELECT 't', 'tonight-' || i, '{}', 'night-2026-12-01',
       CASE WHEN i % 100 = 0 THEN 'dead' WHEN i <= :rows_per_batch * 6 / 10 THEN 'done'
            ELSE 'pending' END,
       CASE WHEN i % 100 = 0 THEN 3 WHEN i <= :rows_per_batch * 6 / 10 THEN 1 ELSE 0 END,
       now() - interval '40 minutes', now() - interval '40 minutes',
       CASE WHEN i <= :rows_per_batch * 6 / 10 OR i % 100 = 0
            THEN now() - interval '40 minutes' + interval '2 seconds' * (i * 1200.0 / :rows_per_batch) END,
       CASE WHEN i <= :rows_per_batch * 6 / 10 OR i % 100 = 0
            THEN now() - interval '40 minutes' + interval '2 seconds' * (i * 1200.0 / :rows_per_batch) END,
       CASE WHEN i <= :rows_per_batch * 6 / 10 OR i % 100 = 0
            THEN now() - interval '40 minutes' + interval '2 seconds' * (i * 1200.0 / :rows_per_batch + 0.5) END,
       CASE WHEN i % 100 = 0 THEN 'quota exceeded' END,
       CASE WHEN i % 100 = 0 THEN 'returned' END
  FROM generate_series(1, :rows_per_batch) i;
-- 200 of tonight's pending rows leased now.
UPDATE agent_work_queue SET status = 'leased', lease_owner = 'pod-' || (id % 4),
       lease_token = id, locked_until = now() + interval '5 minutes', started_at = now(),
       attempts = 1
 WHERE id IN (SELECT id FROM agent_work_queue WHERE batch = 'night-2026-12-01'
                 AND status = 'pending' ORDER BY id LIMIT 200);
VACUUM ANALYZE agent_work_queue;
