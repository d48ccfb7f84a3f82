-- The chaos soak's task script (tests/chaos/soak.sh). soak.sh copies it into its work folder
-- and hot-swaps that copy by rewriting the VERSION line (temp file + mv), now and then with a
-- deliberately broken version that leash must refuse.
--
-- Every execution leaves evidence that the soak's invariant checks read afterwards:
--   execs       one row per execution: inserted first thing (server clock `started`), then
--               `finished` and `outcome` (ok | retry | fatal) written last, when it gets there
--   step_runs   one row per run of the "llm" step's function (inserted inside the step, before
--               the HTTP call), with what the mock answered (`answer`: 200, 429, 500, timeout)
-- and the outcome names its attempt: leash.ok{attempt, worker, ...}, and the message of a
-- retry or fatal ends with "[attempt=A worker=W]", so a late outcome would show.
--
-- The mock's URL comes from the table chaos_config (key mock_url), read once per Lua state.
local leash = require "leash"

local VERSION = "v1"

local mock_url

local function tag(task)
  return string.format("[attempt=%d worker=%s]", task.attempt, task.worker_id)
end

local function finish(exec_id, outcome)
  leash.db.query("UPDATE execs SET finished = clock_timestamp(), outcome = $2 WHERE id = $1",
                 exec_id, outcome)
end

-- The step's function: one LLM call. 429, 5xx and timeouts raise a table { fault = ... }, so
-- the step stores nothing and handle() maps the fault to leash.retry outside the step.
local function llm(task)
  local run = leash.db.query(
    "INSERT INTO step_runs (task_id, name, attempt, worker) VALUES ($1, 'llm', $2, $3) RETURNING id",
    task.id, task.attempt, task.worker_id)[1].id
  local ok, resp = pcall(leash.http.request, {
    method = "POST", url = mock_url, timeout = 0.1,
    headers = { ["Content-Type"] = "application/json" },
    body = leash.json.encode({ model = "mock",
                               messages = { { role = "user", content = "chaos task " .. task.id } } }),
  })
  if not ok then
    if task:lease_lost() then
      error(resp, 0)
    end
    leash.db.query("UPDATE step_runs SET answer = 'timeout' WHERE id = $1", run)
    error({ fault = "timeout" })
  end
  leash.db.query("UPDATE step_runs SET answer = $2 WHERE id = $1", run, tostring(resp.status))
  if resp.status == 429 or resp.status >= 500 then
    error({ fault = tostring(resp.status), delay = tonumber(resp.headers["retry-after"]) })
  end
  if resp.status ~= 200 then
    error({ fault = "status " .. resp.status })
  end
  local v = leash.json.decode(resp.body)
  local content = type(v) == "table" and v.choices and v.choices[1] and v.choices[1].message
                  and v.choices[1].message.content
  if type(content) ~= "string" then
    error({ fault = "malformed" })
  end
  return { answer = content, run = run, attempt = task.attempt, worker = task.worker_id }
end

local function handle(task)
  if not mock_url then
    mock_url = leash.db.query("SELECT value FROM chaos_config WHERE key = 'mock_url'")[1].value
  end
  local exec_id = leash.db.query(
    "INSERT INTO execs (task_id, attempt, worker, version, tenant, shard) "
      .. "VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    task.id, task.attempt, task.worker_id, VERSION, task.tenant_id, task.shard_key)[1].id

  leash.sleep(math.random() * 0.05)

  local ok, step = pcall(leash.step, "llm", function() return llm(task) end)
  if not ok then
    if type(step) == "table" and step.fault then
      finish(exec_id, "retry")
      return leash.retry("llm " .. step.fault .. " " .. tag(task), step.delay or 0.5)
    end
    error(step, 0)
  end

  if task.payload.fatal then
    finish(exec_id, "fatal")
    return leash.fatal("fatal on purpose " .. tag(task))
  end
  finish(exec_id, "ok")
  return leash.ok({ attempt = task.attempt, worker = task.worker_id, version = VERSION,
                    exec = exec_id, step_attempt = step.attempt, step_worker = step.worker })
end

return {
  handle = function(task)
    local ok, a, b = pcall(handle, task)
    if ok then
      return a, b
    end
    -- Raised: the database went away (backend terminated, server restart) or the lease was
    -- lost. A lost lease's outcome is discarded whatever we return; anything else is retried
    -- soon rather than after leash's exponential backoff, so the soak settles in bounded time.
    if task:lease_lost() then
      error(a, 0)
    end
    return leash.retry("raised: " .. tostring(a) .. " " .. tag(task), 0.2 + math.random() * 0.8)
  end,
}
