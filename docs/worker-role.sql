-- The least a `leash run` / `leash enqueue` / `leash status` role needs, for the default
-- table names (agent_work_queue in schema public). `leash migrate`, `requeue` and `prune`
-- run as the table's owner (or a role with these plus UPDATE/DELETE as noted).
-- Apply as the owner after `leash migrate`:  psql -f docs/worker-role.sql
GRANT USAGE ON SCHEMA public TO leash_worker;
GRANT SELECT, INSERT, UPDATE ON agent_work_queue TO leash_worker;        -- enqueue, claim, settle
GRANT USAGE ON SEQUENCE agent_work_queue_id_seq TO leash_worker;         -- ids for enqueue
GRANT SELECT, INSERT, DELETE ON agent_work_queue_steps TO leash_worker;  -- leash.step; settle drops
GRANT SELECT ON agent_work_queue_migrations TO leash_worker;             -- schema version check
GRANT SELECT ON agent_work_queue_tenants TO leash_worker;                -- the claim's weights
GRANT USAGE ON SEQUENCE agent_work_queue_lease_token_seq TO leash_worker; -- a token per claim
-- Holds (013): claims read them, park held heads and lift expired holds; pause/resume write.
GRANT SELECT, INSERT, UPDATE, DELETE ON agent_work_queue_holds TO leash_worker;
-- Budgets and spend (014): grants and settlements of budgeted calls, usage rows, spend.
GRANT SELECT, INSERT, UPDATE ON agent_work_queue_budgets TO leash_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON agent_work_queue_budget_calls TO leash_worker;
GRANT USAGE ON SEQUENCE agent_work_queue_budget_calls_id_seq TO leash_worker;
GRANT SELECT, INSERT ON agent_work_queue_usage TO leash_worker;
GRANT USAGE ON SEQUENCE agent_work_queue_usage_id_seq TO leash_worker;
GRANT SELECT, INSERT, UPDATE ON agent_work_queue_spend TO leash_worker;
GRANT SELECT ON agent_work_queue_prices TO leash_worker;
-- The attempt history (016): settle, reap and cancel write a row per execution.
GRANT SELECT, INSERT ON agent_work_queue_attempts TO leash_worker;
-- Waits (019): the settle and leash.waited read the signals; `leash signal` writes them.
GRANT SELECT, INSERT, UPDATE, DELETE ON agent_work_queue_signals TO leash_worker;
-- The canary (018): every worker and `status` read it; the poll that takes the fleet's
-- verdict writes it and the attempts it gives back.
GRANT SELECT, UPDATE ON agent_work_queue_canaries TO leash_worker;
GRANT SELECT, INSERT ON agent_work_queue_canary_givebacks TO leash_worker;
-- Provider batches (022): leash.llm.batch writes items; the fleet's batcher (any worker)
-- writes batches, answers items and adds their usage and spend (granted above).
GRANT SELECT, INSERT, UPDATE ON agent_work_queue_llm_items TO leash_worker;
GRANT USAGE ON SEQUENCE agent_work_queue_llm_items_id_seq TO leash_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON agent_work_queue_llm_batches TO leash_worker;
GRANT USAGE ON SEQUENCE agent_work_queue_llm_batches_id_seq TO leash_worker;
-- An application role that only enqueues (docs/enqueue-from-apps.md) needs SELECT, INSERT on
-- the table and USAGE on its id sequence; <table>_enqueue and _enqueue_many run as it.
-- `leash cancel` and `leash release` need UPDATE (granted above) and run as any of these.
-- Functions (<table>_cycle, _cycle_rows, _claim, _settle, _reap, _reap_rows, _release,
-- _repair_heads, _lane_handover, _lane_key, _row_error, the heads triggers, and 015's
-- _enqueue, _enqueue_many, _enqueue_check, _enqueue_row, _dedup_lock, _defaults, _cancel,
-- _release_worker, _worker_here, _worker_sessions, _worker_key, 012's _backoff, 013's _held,
-- _hold, _unhold, _holds_expire, _heads_park, 014's _budget_grant, _budget_settle,
-- _budget_pause, _budget_resume, _spend_add, _spend_cap, 018's _canary_poll, _canary_numbers,
-- _canary_give_back, _canary_z, 019's _wait_wakes_at, _wait_lock_key, _wait_wake, _wait_expire,
-- _wait_event_lock, _wait_events, _signal, 022's _llm_jsonb, _llm_item, _llm_batch_open,
-- _llm_batch_submitted, _llm_batch_abandon, _llm_batch_recover, _llm_batch_status,
-- _llm_batch_end) are SECURITY INVOKER and
-- executable by PUBLIC by default; with REVOKE EXECUTE … FROM PUBLIC, grant EXECUTE on them.
-- Whatever the scripts' own leash.db.query statements touch is granted separately.
