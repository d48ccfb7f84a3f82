-- A child enqueue as leash.enqueue writes it: one row, one statement, the parent's batch.
INSERT INTO agent_work_queue (tenant_id, shard_key, payload, batch)
VALUES ('t', 'c' || (random() * 1e9)::bigint, '{}', 'children');
