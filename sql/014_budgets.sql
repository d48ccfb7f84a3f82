-- Provider budgets (issue #15; README "Budgets"): limits on the calls scripts make to the
-- providers behind them, shared by every process and pod through this table.
--
-- A budget is a name (e.g. 'openai:gpt-4o-mini') with any of: requests per minute (rpm),
-- tokens per minute (tpm), calls in flight at once (concurrency). A name no one has set is
-- created on first use with no limits, so a 429 can still pause it.
--
-- The minute (window_s: 60 unless set, so rpm and tpm can also be per second or per day)
-- is a sliding window, kept as a log: one row per call granted, with its tokens
-- (the estimate at grant, the real usage once the answer reports it). Granting asks "would
-- this call make the last 60 seconds exceed rpm or tpm", the way providers count, so a fleet
-- that keeps to the budget keeps to a provider limit of the same size whatever its bursts;
-- a token bucket of that rate would let a window hold up to rpm plus the bucket's size.
-- Counting the window costs a scan of at most rpm rows of one budget, under the budget's row
-- lock: grants of one budget are serial, which at provider rates (hundreds to a few thousand
-- calls a minute) is far from a bottleneck, and it makes the check and the grant one atomic
-- step for the whole fleet.
--
-- Concurrency is counted from the same rows: a call in flight is a row not yet released,
-- whose hold has not run out and whose task still holds the lease that made the call. A
-- process that dies mid-call leaves its rows behind; they stop counting when its lease runs
-- out or is given back (`leash release`), or at the latest when the hold (the call's
-- timeout and a margin) does, so a lost pod cannot eat the budget.
--
-- A full window. When the window has no room for 5 s or more (a burst used it up), the
-- tasks that carry the budget are held until it has ('window', 013), as a pause holds them:
-- claims do not take tasks that could only wait in a slot. Tasks already claimed wait for
-- their grant (or yield past --budget-wait).
--
-- Pauses. A 429 or 503 on a budgeted call (or leash.budget.pause, or `leash budget pause`)
-- sets paused_until for every process: no call of the budget is granted before it, and
-- tasks that carry the budget (their `budget` column) are held (013): claims skip them until
-- then, so they wait without a slot. The
-- first refusal of a pause also halves the budget's effective concurrency (aimd: what was
-- in flight, halved, at least 1); every success after it adds 1/aimd, so concurrency grows
-- back by about one per round of calls and the limit is dropped again once it reaches the
-- configured concurrency (or 1000 with none): additive increase, multiplicative decrease.

-- Spend. Prices per model (<table>_prices, per million input and output tokens) turn a
-- call's usage into cost when its answer (or leash.usage) names the model and splits input
-- from output. Every settled call's usage is a row of <table>_usage (task, attempt, tenant,
-- batch, budget, model, tokens, cost), and its cost is added to its tenant's and its batch's
-- row of <table>_spend. A scope whose spend reaches its cap is held (013, source 'spend'):
-- claims stop taking its tasks; raising or dropping the cap (`leash spend cap`) lifts it.
-- Tasks already running finish, so a cap can be passed by what they spend.

CREATE TABLE IF NOT EXISTS {{obj:budgets}} (
  name          text PRIMARY KEY
                CHECK (octet_length(name) BETWEEN 1 AND 200 AND name !~ '[[:cntrl:]]'),
  rpm           int CHECK (rpm > 0),
  tpm           bigint CHECK (tpm > 0),
  concurrency   int CHECK (concurrency > 0),
  window_s      float8 NOT NULL DEFAULT 60 CHECK (window_s BETWEEN 0.1 AND 86400),
  paused_until  timestamptz,
  pause_reason  text CHECK (octet_length(pause_reason) <= 500),
  aimd          float8 CHECK (aimd >= 1),  -- effective concurrency after a refusal; NULL: none
  requests      bigint NOT NULL DEFAULT 0, -- calls granted, ever
  tokens        bigint NOT NULL DEFAULT 0, -- tokens settled, ever
  refused       bigint NOT NULL DEFAULT 0, -- calls answered 429/503, ever
  created_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS {{obj:budget_calls}} (
  id          bigserial PRIMARY KEY,
  budget      text NOT NULL REFERENCES {{obj:budgets}} (name) ON DELETE CASCADE,
  at          timestamptz NOT NULL DEFAULT now(),
  tokens      bigint NOT NULL DEFAULT 0 CHECK (tokens >= 0),
  hold_until  timestamptz NOT NULL,      -- in flight until released or this passes
  released    boolean NOT NULL DEFAULT false,
  task_id     bigint,                    -- the lease that made the call (NULL: none)
  lease_token bigint
);

CREATE INDEX IF NOT EXISTS {{name:budget_calls_window}} ON {{obj:budget_calls}} (budget, at);

CREATE TABLE IF NOT EXISTS {{obj:prices}} (
  model           text PRIMARY KEY CHECK (octet_length(model) BETWEEN 1 AND 127),
  input_per_mtok  numeric NOT NULL CHECK (input_per_mtok >= 0),
  output_per_mtok numeric NOT NULL CHECK (output_per_mtok >= 0),
  updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS {{obj:usage}} (
  id            bigserial PRIMARY KEY,
  at            timestamptz NOT NULL DEFAULT now(),
  task_id       bigint,
  attempt       int,
  tenant_id     text,
  batch         text,
  budget        text NOT NULL,
  model         text,
  input_tokens  bigint,
  output_tokens bigint,
  tokens        bigint NOT NULL,
  cost          numeric            -- NULL: the model has no price, or input/output unknown
);
CREATE INDEX IF NOT EXISTS {{name:usage_task}} ON {{obj:usage}} (task_id);
CREATE INDEX IF NOT EXISTS {{name:usage_batch}} ON {{obj:usage}} (batch, at);

CREATE TABLE IF NOT EXISTS {{obj:spend}} (
  kind       text NOT NULL CHECK (kind IN ('tenant', 'batch')),
  scope      text NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 512),
  spent      numeric NOT NULL DEFAULT 0,
  cap        numeric CHECK (cap >= 0),    -- NULL: none
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (kind, scope)
);

-- Adds p_cost to a scope's spend; holds the scope when that reaches its cap.
CREATE FUNCTION {{obj:spend_add}}(p_kind text, p_scope text, p_cost numeric) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  s {{obj:spend}};
BEGIN
  INSERT INTO {{obj:spend}} AS x (kind, scope, spent) VALUES (p_kind, p_scope, p_cost)
  ON CONFLICT (kind, scope) DO UPDATE SET spent = x.spent + EXCLUDED.spent, updated_at = now()
  RETURNING x.* INTO s;
  IF s.cap IS NOT NULL AND s.spent >= s.cap AND s.spent - p_cost < s.cap THEN
    PERFORM {{obj:hold}}(p_kind, p_scope, 'spend', NULL,
                         format('spend cap: spent %s of %s', round(s.spent, 4), s.cap));
  END IF;
END $$;

-- `leash spend cap`: sets (p_cap NULL: drops) a scope's cap, and holds or lifts the scope as
-- its spend now stands. Returns the spend so far.
CREATE FUNCTION {{obj:spend_cap}}(p_kind text, p_scope text, p_cap numeric) RETURNS numeric
LANGUAGE plpgsql
AS $$
DECLARE
  s {{obj:spend}};
BEGIN
  INSERT INTO {{obj:spend}} AS x (kind, scope, cap) VALUES (p_kind, p_scope, p_cap)
  ON CONFLICT (kind, scope) DO UPDATE SET cap = EXCLUDED.cap, updated_at = now()
  RETURNING x.* INTO s;
  IF s.cap IS NOT NULL AND s.spent >= s.cap THEN
    PERFORM {{obj:hold}}(p_kind, p_scope, 'spend', NULL,
                         format('spend cap: spent %s of %s', round(s.spent, 4), s.cap));
  ELSE
    PERFORM {{obj:unhold}}(p_kind, p_scope, 'spend');
  END IF;
  RETURN s.spent;
END $$;

-- Grants one call of p_tokens (an estimate; 0 when unknown) to budget p_name, held in flight
-- for at most p_hold_s seconds and while the lease (p_task, p_token) holds, or says how long
-- to wait. Rows: granted, the call's id (to
-- settle), wait_s (when not granted: seconds until a grant could succeed; a guess for
-- concurrency, exact for a pause or the window), and why not ('paused: <reason>', 'rpm',
-- 'tpm', 'concurrency').
CREATE FUNCTION {{obj:budget_grant}}(p_name text, p_tokens bigint, p_hold_s float8,
                                     p_task bigint, p_token bigint)
RETURNS TABLE (granted boolean, call_id bigint, wait_s float8, why text)
LANGUAGE plpgsql
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
  b {{obj:budgets}};
  n_req int;
  n_tok bigint;
  n_active int;
  lim int;
  win interval;
  w float8 := 0;
  reason text;
  cid bigint;
BEGIN
  INSERT INTO {{obj:budgets}} AS x (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
  SELECT * INTO b FROM {{obj:budgets}} x WHERE x.name = p_name FOR UPDATE;
  IF b.paused_until > now() THEN
    RETURN QUERY SELECT false, NULL::bigint, extract(epoch FROM b.paused_until - now())::float8,
                        'paused: ' || coalesce(b.pause_reason, 'by hand');
    RETURN;
  END IF;
  win := make_interval(secs => b.window_s);
  -- The window's old rows go as grants pass; a row still in flight stays (it counts).
  DELETE FROM {{obj:budget_calls}} c
   WHERE c.budget = p_name AND c.at < now() - win
     AND (c.released OR c.hold_until < now());
  SELECT count(*) FILTER (WHERE c.at >= now() - win),
         coalesce(sum(c.tokens) FILTER (WHERE c.at >= now() - win), 0),
         count(*) FILTER (WHERE NOT c.released AND c.hold_until > now()
                            AND (c.task_id IS NULL OR EXISTS (
                                   SELECT 1 FROM {{table}} q
                                    WHERE q.id = c.task_id AND q.lease_token = c.lease_token
                                      AND q.status = 'leased' AND q.locked_until > now())))
    INTO n_req, n_tok, n_active
    FROM {{obj:budget_calls}} c WHERE c.budget = p_name;
  lim := least(b.concurrency, floor(b.aimd)::int);
  IF b.rpm IS NOT NULL AND n_req >= b.rpm THEN
    -- Until the (n_req - rpm + 1)th oldest call of the window leaves it.
    SELECT extract(epoch FROM c.at + win - now())::float8 INTO w
      FROM {{obj:budget_calls}} c
     WHERE c.budget = p_name AND c.at >= now() - win
     ORDER BY c.at OFFSET n_req - b.rpm LIMIT 1;
    reason := 'rpm';
  END IF;
  -- A call larger than the whole tpm runs alone in an empty window rather than never.
  IF b.tpm IS NOT NULL AND n_tok > 0 AND n_tok + p_tokens > b.tpm THEN
    -- Until enough of the window's oldest tokens leave it.
    SELECT greatest(w, extract(epoch FROM o.at + win - now())::float8) INTO w
      FROM (SELECT c.at, sum(c.tokens) OVER (ORDER BY c.at, c.id) AS upto
              FROM {{obj:budget_calls}} c
             WHERE c.budget = p_name AND c.at >= now() - win) o
     WHERE o.upto >= n_tok + p_tokens - b.tpm
     ORDER BY o.at LIMIT 1;
    reason := coalesce(reason, 'tpm');
  END IF;
  IF lim IS NOT NULL AND n_active >= lim THEN
    w := greatest(w, 0.05);   -- a call ends when it ends: look again soon
    reason := coalesce(reason, 'concurrency');
  END IF;
  IF reason IS NOT NULL THEN
    -- A window full for a while (after a burst used it up): the tasks that carry the budget
    -- are held until it has room, so claims stop taking them only to wait in a slot. Once
    -- per episode: a hold that already lasts that long is left alone (parking is an UPDATE
    -- of the budget's heads). Short waits, the steady state of a busy budget, hold nothing.
    IF reason IN ('rpm', 'tpm') AND w >= 5
       AND NOT EXISTS (SELECT 1 FROM {{obj:holds}} h
                        WHERE h.kind = 'budget' AND h.scope = p_name AND h.source = 'window'
                          AND h.until >= now() + make_interval(secs => w - 1)) THEN
      PERFORM {{obj:hold}}('budget', p_name, 'window', now() + make_interval(secs => w),
                           'window full (' || reason || ')');
    END IF;
    RETURN QUERY SELECT false, NULL::bigint, greatest(w, 0.01), reason;
    RETURN;
  END IF;
  INSERT INTO {{obj:budget_calls}} AS c (budget, tokens, hold_until, task_id, lease_token)
  VALUES (p_name, greatest(p_tokens, 0), now() + make_interval(secs => p_hold_s), p_task,
          p_token)
  RETURNING c.id INTO cid;
  UPDATE {{obj:budgets}} x SET requests = x.requests + 1 WHERE x.name = p_name;
  RETURN QUERY SELECT true, cid, 0::float8, NULL::text;
END $$;

-- A granted call is over: p_tokens its real usage (NULL: the estimate stands). p_pause_s
-- (NULL: none) when the provider refused it: the budget pauses that long for the fleet
-- (extended, never shortened, by later refusals), with p_reason; the first refusal of a
-- pause halves the effective concurrency. A success grows it back (see the top).
-- p_call NULL: a pause that no grant preceded (leash.budget.pause, `leash budget pause`).
-- With a usage (p_tokens; p_model, p_input, p_output when the answer said), the call is a
-- <table>_usage row and its cost is spend (see the top).
CREATE FUNCTION {{obj:budget_settle}}(p_name text, p_call bigint, p_tokens bigint,
                                      p_pause_s float8, p_reason text, p_model text,
                                      p_input bigint, p_output bigint)
RETURNS void
LANGUAGE plpgsql
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
  active int;
  delta bigint := 0;
  until timestamptz;
  tid bigint;
  t record;
  cost numeric;
BEGIN
  INSERT INTO {{obj:budgets}} AS x (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
  IF p_call IS NOT NULL THEN
    UPDATE {{obj:budget_calls}} c
       SET released = true, tokens = coalesce(greatest(p_tokens, 0), c.tokens)
     WHERE c.id = p_call AND c.budget = p_name
    RETURNING c.tokens, c.task_id INTO delta, tid;
  END IF;
  IF p_tokens IS NOT NULL THEN
    SELECT q.tenant_id, q.batch, q.attempts INTO t FROM {{table}} q WHERE q.id = tid;
    SELECT p_input * p.input_per_mtok / 1000000 + p_output * p.output_per_mtok / 1000000
      INTO cost FROM {{obj:prices}} p WHERE p.model = p_model;
    INSERT INTO {{obj:usage}} (task_id, attempt, tenant_id, batch, budget, model, input_tokens,
                               output_tokens, tokens, cost)
    VALUES (tid, t.attempts, t.tenant_id, t.batch, p_name, p_model, p_input, p_output,
            greatest(p_tokens, 0), cost);
    IF cost > 0 AND t.tenant_id IS NOT NULL THEN
      PERFORM {{obj:spend_add}}('tenant', t.tenant_id, cost);
      IF t.batch IS NOT NULL THEN
        PERFORM {{obj:spend_add}}('batch', t.batch, cost);
      END IF;
    END IF;
  END IF;
  IF p_pause_s IS NOT NULL THEN
    SELECT count(*) INTO active FROM {{obj:budget_calls}} c
     WHERE c.budget = p_name AND NOT c.released AND c.hold_until > now();
    UPDATE {{obj:budgets}} x
       SET aimd = CASE WHEN p_call IS NULL THEN x.aimd
                       WHEN x.paused_until IS NULL OR x.paused_until <= now()
                       THEN greatest(1, (active + 1) / 2.0)
                       ELSE x.aimd END,
           paused_until = greatest(x.paused_until, now() + make_interval(secs => p_pause_s)),
           pause_reason = left(coalesce(p_reason, 'paused'), 500),
           refused = x.refused + CASE WHEN p_call IS NULL THEN 0 ELSE 1 END,
           tokens = x.tokens + coalesce(delta, 0),
           updated_at = now()
     WHERE x.name = p_name
    RETURNING x.paused_until INTO until;
    -- Claims skip the tasks that carry the budget until then (013).
    PERFORM {{obj:hold}}('budget', p_name, 'provider', until,
                         left(coalesce(p_reason, 'paused'), 500));
  ELSE
    UPDATE {{obj:budgets}} x
       SET aimd = CASE WHEN x.aimd IS NULL
                         OR x.aimd + 1 / x.aimd >= coalesce(x.concurrency, 1000) THEN NULL
                       ELSE x.aimd + 1 / x.aimd END,
           tokens = x.tokens + coalesce(delta, 0)
     WHERE x.name = p_name AND (x.aimd IS NOT NULL OR coalesce(delta, 0) <> 0);
  END IF;
END $$;

-- `leash budget pause` and `resume`: the same pause as a refusal's (no effect on aimd), and
-- its end. Returns the seconds the pause now lasts / whether there was one.
CREATE FUNCTION {{obj:budget_pause}}(p_name text, p_secs float8, p_reason text)
RETURNS float8
LANGUAGE plpgsql
AS $$
BEGIN
  PERFORM {{obj:budget_settle}}(p_name, NULL, NULL, p_secs, p_reason, NULL, NULL, NULL);
  RETURN (SELECT extract(epoch FROM x.paused_until - now())::float8
            FROM {{obj:budgets}} x WHERE x.name = p_name);
END $$;

CREATE FUNCTION {{obj:budget_resume}}(p_name text) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
  UPDATE {{obj:budgets}} x SET paused_until = NULL, pause_reason = NULL, updated_at = now()
   WHERE x.name = p_name;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM {{obj:unhold}}('budget', p_name, 'provider');
  RETURN true;
END $$;
