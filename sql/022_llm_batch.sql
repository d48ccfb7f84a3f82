-- Provider batch offload (issue #19, item 2; README "Provider batches", docs/lua-api.md
-- leash.llm.batch, docs/ARCHITECTURE.md "Provider batches").
--
-- An item is one request a task asked for through a provider's batch interface, inside one
-- of its steps: <table>_llm_items, at most one live (state <> 'spent') per (task, step).
-- Its life:
--   pending    written by the task's execution (<table>_llm_item, fenced by its lease);
--              the execution then ends in a durable wait (sql/019) on the event
--              'llm:<item id>': pending, attempt given back, no slot, no lease.
--   submitted  taken into a provider batch by the fleet's one batcher (src/llm_batch.c,
--              <table>_llm_batch_open), which uploads it and keeps the provider's batch id
--              in <table>_llm_batches.
--   done       the batch ended with an answer for it (<table>_llm_batch_end); the event is
--              signalled in the same transaction, so the task wakes; its next execution
--              re-enters the step and leash.llm.batch returns the answer, once: the item
--              becomes 'spent' (handed_at set) and the step stores the answer. A step that
--              rejects the answer (raises: a malformed grade) asks afresh on its next
--              attempt instead of reading the same answer for ever; a step whose store is
--              lost with its lease asks again too (paid twice, as a synchronous call would).
--   pending    again, when the batch gave no answer for it (an errored line, a line
--              missing, an expiry without fallback) and it has tries left: a later batch.
--   failed     no tries left: signalled; the next execution's leash.llm.batch raises the
--              error (a retry that spends an attempt) and the item becomes 'spent', so the
--              attempt after asks afresh.
--   fallback   the batch expired (or was cancelled) before answering it and the call gave a
--              fallback: signalled; the next execution calls the fallback (a synchronous
--              call, the script's own) instead.
--   spent      handed to its task once (done or failed), or its task ended before a batch
--              took it.
-- Every try that gave no answer is recorded in causes (e.g. 'item_failed: <message>',
-- 'batch_expired', 'no_result'), the last one in last_cause.
--
-- The provider's files are made and read here, not in C: the batcher only moves bytes over
-- HTTP. custom_id is 'leash-<item id>'. A line that is not JSON or names no item of the
-- batch is skipped (its item counts as 'no_result'): a provider's (or a hostile upstream's)
-- output cannot touch another batch's items or abort the transaction.
--
-- Spend: a done item's usage is a row of <table>_usage (budget 'llm-batch:<provider>') at
-- batch prices: <table>_prices.batch_factor (default 0.5) times the synchronous price; the
-- synchronous price is kept beside it in usage.sync_cost, so `leash report` can show both.
-- The cost is added to the tenant's and the batch's spend (014's spend_add, caps included).

CREATE TABLE IF NOT EXISTS {{obj:llm_batches}} (
  id                bigserial PRIMARY KEY,
  provider          text NOT NULL CHECK (provider IN ('openai', 'anthropic')),
  state             text NOT NULL DEFAULT 'creating'
                    CHECK (state IN ('creating', 'open', 'ended', 'abandoned')),
  provider_batch_id text,
  provider_status   text,
  items             int NOT NULL DEFAULT 0,
  answered          int,
  submitted_by      text,                 -- the batcher's worker id
  created_at        timestamptz NOT NULL DEFAULT now(),
  submitted_at      timestamptz,
  polled_at         timestamptz,
  ended_at          timestamptz,
  error             text
);
CREATE INDEX IF NOT EXISTS {{name:llm_batches_open}} ON {{obj:llm_batches}} (id)
  WHERE state IN ('creating', 'open');

CREATE TABLE IF NOT EXISTS {{obj:llm_items}} (
  id            bigserial PRIMARY KEY,
  task_id       bigint NOT NULL,
  step          text NOT NULL,
  provider      text NOT NULL CHECK (provider IN ('openai', 'anthropic')),
  model         text,
  tenant_id     text,
  batch         text,                     -- the task's batch (spend)
  request       jsonb NOT NULL,
  fallback      boolean NOT NULL DEFAULT false,
  state         text NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'submitted', 'done', 'failed', 'fallback', 'spent')),
  batch_id      bigint,
  tries         int NOT NULL DEFAULT 0,   -- batches that gave it no answer
  max_tries     int NOT NULL DEFAULT 3 CHECK (max_tries BETWEEN 1 AND 100),
  answer        jsonb,
  error         text,
  last_cause    text,
  causes        text[] NOT NULL DEFAULT '{}',
  input_tokens  bigint,
  output_tokens bigint,
  created_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now(),
  answered_at   timestamptz,
  handed_at     timestamptz               -- given to its task (then spent)
);
CREATE UNIQUE INDEX IF NOT EXISTS {{name:llm_items_live}} ON {{obj:llm_items}} (task_id, step)
  WHERE state <> 'spent';
CREATE INDEX IF NOT EXISTS {{name:llm_items_pending}} ON {{obj:llm_items}} (provider, id)
  WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS {{name:llm_items_batch}} ON {{obj:llm_items}} (batch_id)
  WHERE batch_id IS NOT NULL;

ALTER TABLE {{obj:prices}}
  ADD COLUMN IF NOT EXISTS batch_factor numeric NOT NULL DEFAULT 0.5
    CHECK (batch_factor >= 0 AND batch_factor <= 1);
ALTER TABLE {{obj:usage}}
  ADD COLUMN IF NOT EXISTS sync_cost numeric;   -- what the call would have cost synchronously

-- Text as jsonb, or NULL when it is not JSON (PostgreSQL 15 has no pg_input_is_valid).
CREATE OR REPLACE FUNCTION {{obj:llm_jsonb}}(p_text text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN p_text::jsonb;
EXCEPTION WHEN others THEN
  RETURN NULL;
END $$;

-- The running task's item for its step: the live one, else a new pending one. Fenced by the
-- lease (no row when it is not this execution's). A done or failed item is handed back
-- once and becomes spent.
CREATE OR REPLACE FUNCTION {{obj:llm_item}}(p_task bigint, p_token bigint, p_owner text,
                                            p_step text, p_provider text, p_request jsonb,
                                            p_fallback boolean, p_max_tries int)
RETURNS TABLE (item_id bigint, state text, answer text, error text, tries int)
LANGUAGE plpgsql
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  q record;
  it {{obj:llm_items}};
BEGIN
  SELECT t.tenant_id, t.batch INTO q FROM {{table}} t
   WHERE t.id = p_task AND t.lease_token = p_token AND t.lease_owner = p_owner
     AND t.status = 'leased' AND t.locked_until > now()
     FOR SHARE OF t;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT * INTO it FROM {{obj:llm_items}} i
   WHERE i.task_id = p_task AND i.step = p_step AND i.state <> 'spent' FOR UPDATE;
  IF FOUND THEN
    IF it.state IN ('done', 'failed') THEN
      UPDATE {{obj:llm_items}} i SET state = 'spent', handed_at = now(), updated_at = now()
       WHERE i.id = it.id;
    END IF;
    RETURN QUERY SELECT it.id, it.state, it.answer::text, it.error, it.tries;
    RETURN;
  END IF;
  INSERT INTO {{obj:llm_items}} (task_id, step, provider, model, tenant_id, batch, request,
                                 fallback, max_tries)
  VALUES (p_task, p_step, p_provider, p_request->>'model', q.tenant_id, q.batch, p_request,
          p_fallback, p_max_tries)
  RETURNING * INTO it;
  RETURN QUERY SELECT it.id, it.state, NULL::text, NULL::text, 0;
END $$;

-- The batcher's turn for one provider: the oldest pending item's model is this batch's (a
-- provider batch holds one model: OpenAI fails a file that mixes them); when p_max items of
-- it are pending, or the oldest has waited p_age_s, a new batch (state 'creating') takes up
-- to p_max of them, oldest first, and its upload is returned: JSONL for OpenAI's Files API,
-- the request body of Anthropic's Message Batches. No row: nothing to send yet (the batcher
-- calls again after a row, so the next model's batch goes in the same turn). Items of tasks
-- that ended meanwhile (cancelled, pruned) are spent instead of sent.
CREATE OR REPLACE FUNCTION {{obj:llm_batch_open}}(p_provider text, p_max int, p_age_s float8,
                                                  p_worker text)
RETURNS TABLE (batch_id bigint, items int, upload text)
LANGUAGE plpgsql
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  b bigint;
  n int;
  oldest timestamptz;
  m text;
BEGIN
  UPDATE {{obj:llm_items}} i
     SET state = 'spent', last_cause = 'task_ended', updated_at = now()
   WHERE i.provider = p_provider AND i.state = 'pending'
     AND NOT EXISTS (SELECT 1 FROM {{table}} t
                      WHERE t.id = i.task_id AND t.status IN ('pending', 'leased'));
  SELECT i.model, i.created_at INTO m, oldest FROM {{obj:llm_items}} i
   WHERE i.provider = p_provider AND i.state = 'pending'
   ORDER BY i.id LIMIT 1;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT count(*) INTO n
    FROM (SELECT 1 FROM {{obj:llm_items}} i
           WHERE i.provider = p_provider AND i.state = 'pending'
             AND i.model IS NOT DISTINCT FROM m
           LIMIT p_max) x;
  IF n < p_max AND oldest > now() - make_interval(secs => p_age_s) THEN
    RETURN;
  END IF;
  INSERT INTO {{obj:llm_batches}} (provider, submitted_by) VALUES (p_provider, p_worker)
  RETURNING id INTO b;
  UPDATE {{obj:llm_items}} i
     SET state = 'submitted', batch_id = b, updated_at = now()
    FROM (SELECT p.id FROM {{obj:llm_items}} p
           WHERE p.provider = p_provider AND p.state = 'pending'
             AND p.model IS NOT DISTINCT FROM m
           ORDER BY p.id LIMIT p_max FOR UPDATE SKIP LOCKED) pick
   WHERE i.id = pick.id;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF n = 0 THEN
    DELETE FROM {{obj:llm_batches}} x WHERE x.id = b;
    RETURN;
  END IF;
  UPDATE {{obj:llm_batches}} x SET items = n WHERE x.id = b;
  IF p_provider = 'openai' THEN
    RETURN QUERY
      SELECT b, n, string_agg(jsonb_build_object('custom_id', 'leash-' || i.id,
                                                 'method', 'POST',
                                                 'url', '/v1/chat/completions',
                                                 'body', i.request)::text, E'\n' ORDER BY i.id)
        FROM {{obj:llm_items}} i WHERE i.batch_id = b AND i.state = 'submitted';
  ELSE
    RETURN QUERY
      SELECT b, n, jsonb_build_object('requests',
                     jsonb_agg(jsonb_build_object('custom_id', 'leash-' || i.id,
                                                  'params', i.request) ORDER BY i.id))::text
        FROM {{obj:llm_items}} i WHERE i.batch_id = b AND i.state = 'submitted';
  END IF;
END $$;

-- The provider accepted batch p_batch as p_provider_id. False: it is no longer 'creating'
-- (another batcher's recovery abandoned it): its results will be ignored.
CREATE OR REPLACE FUNCTION {{obj:llm_batch_submitted}}(p_batch bigint, p_provider_id text)
RETURNS boolean
LANGUAGE sql
AS $$
  UPDATE {{obj:llm_batches}} x
     SET state = 'open', provider_batch_id = left(p_provider_id, 200), submitted_at = now()
   WHERE x.id = p_batch AND x.state = 'creating'
  RETURNING true
$$;

-- A batch that never reached the provider (its upload failed; its batcher died before the
-- provider's id was stored): its items go back to pending. p_count: the provider refused
-- the upload itself (a 4xx), so each item spends a try (a request the provider refuses
-- must not be sent for ever); those out of tries fail and are signalled.
CREATE OR REPLACE FUNCTION {{obj:llm_batch_abandon}}(p_batch bigint, p_error text,
                                                     p_count boolean)
RETURNS int
LANGUAGE plpgsql
SET leash.internal = 'on'
AS $$
DECLARE
  r record;
  n int := 0;
  wake text[] := '{}';
  w text;
BEGIN
  UPDATE {{obj:llm_batches}} x SET state = 'abandoned', error = left(p_error, 500),
         ended_at = now()
   WHERE x.id = p_batch AND x.state IN ('creating', 'open');
  FOR r IN
    UPDATE {{obj:llm_items}} i
       SET tries = i.tries + CASE WHEN p_count THEN 1 ELSE 0 END,
           state = CASE WHEN p_count AND i.tries + 1 >= i.max_tries THEN 'failed'
                        ELSE 'pending' END,
           batch_id = CASE WHEN p_count AND i.tries + 1 >= i.max_tries THEN i.batch_id END,
           error = CASE WHEN p_count THEN left(p_error, 500) ELSE i.error END,
           last_cause = CASE WHEN p_count THEN 'upload_refused' ELSE i.last_cause END,
           causes = CASE WHEN p_count THEN i.causes || 'upload_refused'::text ELSE i.causes END,
           updated_at = now()
     WHERE i.batch_id = p_batch AND i.state = 'submitted'
    RETURNING i.id, i.state
  LOOP
    n := n + 1;
    IF r.state = 'failed' THEN
      wake := wake || ('llm:' || r.id);
    END IF;
  END LOOP;
  FOR w IN SELECT x.name FROM unnest(wake) AS x(name) ORDER BY 1 LOOP   -- as llm_batch_end
    PERFORM {{obj:signal}}(w, NULL, NULL, 86400);
  END LOOP;
  RETURN n;
END $$;

-- A new batcher's first act: batches left 'creating' by a batcher that died before the
-- provider's id was stored are abandoned (at worst the provider runs one of them unread).
CREATE OR REPLACE FUNCTION {{obj:llm_batch_recover}}() RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
  b bigint;
  n int := 0;
BEGIN
  FOR b IN SELECT x.id FROM {{obj:llm_batches}} x WHERE x.state = 'creating' ORDER BY x.id LOOP
    PERFORM {{obj:llm_batch_abandon}}(b, 'the batcher stopped before the provider took it',
                                      false);
    n := n + 1;
  END LOOP;
  RETURN n;
END $$;

-- What a provider's batch object says: ended, its status, and where its results are (OpenAI:
-- the output and error file ids; Anthropic: the results URL). Not JSON: nothing ended.
CREATE OR REPLACE FUNCTION {{obj:llm_batch_status}}(p_provider text, p_body text)
RETURNS TABLE (ended boolean, status text, output text, errors text)
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN p_provider = 'openai'
              THEN coalesce(j->>'status' IN ('completed', 'expired', 'failed', 'cancelled'), false)
              ELSE coalesce(j->>'processing_status' = 'ended', false) END,
         coalesce(CASE WHEN p_provider = 'openai' THEN j->>'status'
                       ELSE j->>'processing_status' END, 'unreadable'),
         CASE WHEN p_provider = 'openai' THEN j->>'output_file_id' ELSE j->>'results_url' END,
         CASE WHEN p_provider = 'openai' THEN j->>'error_file_id' END
    FROM (SELECT {{obj:llm_jsonb}}(p_body) AS j) x
$$;

-- A provider batch ended (p_status) with p_results: its result lines (OpenAI: the output
-- file and the error file; Anthropic: the results), JSONL. In one transaction every item of
-- the batch gets its answer or another try, and the tasks of those settled here are woken.
-- Returns the counts.
CREATE OR REPLACE FUNCTION {{obj:llm_batch_end}}(p_batch bigint, p_status text,
                                                 p_results text)
RETURNS TABLE (done int, retried int, failed int, fallback int)
LANGUAGE plpgsql
SET leash.internal = 'on'
AS $$
#variable_conflict use_column
DECLARE
  b {{obj:llm_batches}};
  r record;
  cause text;
  n_done int := 0;
  n_retry int := 0;
  n_failed int := 0;
  n_fallback int := 0;
  price record;
  cost numeric;
  sync numeric;
  wake text[] := '{}';
  w text;
BEGIN
  SELECT * INTO b FROM {{obj:llm_batches}} x WHERE x.id = p_batch AND x.state = 'open'
     FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 0, 0, 0, 0;
    RETURN;
  END IF;
  FOR r IN
    WITH lines AS (
      SELECT {{obj:llm_jsonb}}(l) AS j
        FROM regexp_split_to_table(coalesce(p_results, ''), E'\n') l
       WHERE btrim(l) <> ''),
    parsed AS (
      SELECT DISTINCT ON (item) * FROM (
        SELECT substr(j->>'custom_id', 7)::bigint AS item,
               CASE WHEN b.provider = 'openai' THEN
                      CASE WHEN j->'response'->>'status_code' = '200'
                                AND jsonb_typeof(j->'response'->'body') = 'object' THEN 'ok'
                           WHEN j->'error'->>'code' IN ('batch_expired', 'batch_cancelled')
                           THEN 'expired'
                           ELSE 'error' END
                    ELSE
                      CASE WHEN j->'result'->>'type' = 'succeeded'
                                AND jsonb_typeof(j->'result'->'message') = 'object' THEN 'ok'
                           WHEN j->'result'->>'type' IN ('expired', 'canceled') THEN 'expired'
                           ELSE 'error' END
               END AS kind,
               CASE WHEN b.provider = 'openai' THEN j->'response'->'body'
                    ELSE j->'result'->'message' END AS answer,
               left(coalesce(j->'response'->'body'->'error'->>'message',
                             j->'error'->>'message',
                             j->'result'->'error'->'error'->>'message',
                             j->'result'->'error'->>'message', 'no message'), 500) AS message
          FROM lines
         WHERE jsonb_typeof(j) = 'object' AND j->>'custom_id' ~ '^leash-[0-9]{1,18}$') p
       ORDER BY item, (kind = 'ok') DESC)
    SELECT i.id, i.task_id, i.tenant_id, i.batch, i.model, i.fallback, i.tries, i.max_tries,
           p.kind, p.answer, p.message
      FROM {{obj:llm_items}} i LEFT JOIN parsed p ON p.item = i.id
     WHERE i.batch_id = p_batch AND i.state = 'submitted'
     ORDER BY i.id
     FOR UPDATE OF i
  LOOP
    IF r.kind = 'ok' THEN
      UPDATE {{obj:llm_items}} i
         SET state = 'done', answer = r.answer, error = NULL, answered_at = now(),
             updated_at = now(),
             input_tokens = coalesce((r.answer->'usage'->>'prompt_tokens')::bigint,
                                     (r.answer->'usage'->>'input_tokens')::bigint),
             output_tokens = coalesce((r.answer->'usage'->>'completion_tokens')::bigint,
                                      (r.answer->'usage'->>'output_tokens')::bigint)
       WHERE i.id = r.id
      RETURNING i.input_tokens, i.output_tokens, coalesce(i.model, r.answer->>'model') AS model
        INTO price;
      SELECT (price.input_tokens * p.input_per_mtok + price.output_tokens * p.output_per_mtok)
               / 1000000, p.batch_factor
        INTO sync, cost FROM {{obj:prices}} p WHERE p.model = price.model;
      cost := sync * cost;
      INSERT INTO {{obj:usage}} (task_id, tenant_id, batch, budget, model, input_tokens,
                                 output_tokens, tokens, cost, sync_cost)
      VALUES (r.task_id, r.tenant_id, r.batch, 'llm-batch:' || b.provider, price.model,
              price.input_tokens, price.output_tokens,
              coalesce(price.input_tokens, 0) + coalesce(price.output_tokens, 0), cost, sync);
      IF cost > 0 AND r.tenant_id IS NOT NULL THEN
        PERFORM {{obj:spend_add}}('tenant', r.tenant_id, cost);
        IF r.batch IS NOT NULL THEN
          PERFORM {{obj:spend_add}}('batch', r.batch, cost);
        END IF;
      END IF;
      n_done := n_done + 1;
      wake := wake || ('llm:' || r.id);
      CONTINUE;
    END IF;
    cause := CASE WHEN r.kind IS NULL THEN 'no_result'
                  WHEN r.kind = 'expired' THEN 'batch_expired'
                  ELSE 'item_failed: ' || r.message END;
    IF r.kind = 'expired' AND r.fallback THEN
      UPDATE {{obj:llm_items}} i
         SET state = 'fallback', last_cause = cause, causes = i.causes || cause,
             error = 'batch ' || p_status || ': the fallback answers', updated_at = now()
       WHERE i.id = r.id;
      n_fallback := n_fallback + 1;
      wake := wake || ('llm:' || r.id);
    ELSIF r.tries + 1 >= r.max_tries THEN
      UPDATE {{obj:llm_items}} i
         SET state = 'failed', tries = i.tries + 1, last_cause = cause,
             causes = i.causes || cause, error = cause, updated_at = now()
       WHERE i.id = r.id;
      n_failed := n_failed + 1;
      wake := wake || ('llm:' || r.id);
    ELSE
      UPDATE {{obj:llm_items}} i
         SET state = 'pending', batch_id = NULL, tries = i.tries + 1, last_cause = cause,
             causes = i.causes || cause, error = cause, updated_at = now()
       WHERE i.id = r.id;
      n_retry := n_retry + 1;
    END IF;
  END LOOP;
  -- The wakes last, in name order: a cycle's settle takes the locks of its events in that
  -- order too (019's wait_events), so the two cannot deadlock on them.
  FOR w IN SELECT x.name FROM unnest(wake) AS x(name) ORDER BY 1 LOOP
    PERFORM {{obj:signal}}(w, NULL, NULL, 86400);
  END LOOP;
  UPDATE {{obj:llm_batches}} x
     SET state = 'ended', provider_status = left(p_status, 100), ended_at = now(),
         polled_at = now(), answered = n_done
   WHERE x.id = p_batch;
  RETURN QUERY SELECT n_done, n_retry, n_failed, n_fallback;
END $$;

