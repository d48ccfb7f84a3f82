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
-- The mock's URL comes from the table chaos_config (key mock_url), read once per Lua state,
-- and so does the budget its calls use (key budget, with soak.sh --budget; none otherwise).
--
-- The hostile mix (payload.hostile; soak.sh --poison and --hostile) is worked off before any
-- of that, outside the script's own pcall, so the host sees each misbehaviour as it is:
--   kill     sleeps; the soak's driver kill -9s whichever worker holds it, every time: a
--            poison task, which must be quarantined after max_crashes (3) crashes
--   wedge    wedges its slot inside one C call (a sort of a million references to one 1 MB
--            string: strcoll over the whole string per comparison), where no hook fires: the
--            watchdog settles it as wedged and restarts the worker; quarantined after 3
--   others   misbehave on the first attempt only (tostring_err, oom, loop, pattern, nilmsg,
--            crlf, yield, gc, bigresult, leak), then run normally: each must end as a retry
--            of that one task, the process alive, and the task done in the end
-- Every task first checks that nothing a "leak" task did is visible to it.
--
-- Waits (payload.wait; issue #19): "clock" tasks first wait a moment (leash.wait{after}),
-- "children" tasks first enqueue two children (payload.child_of, each on a shard of its own,
-- inside a step) and wait for them; resumed, a waiter checks what it waited for and then runs
-- as any task (execs, the llm step), so every invariant holds for it too. A child only
-- answers ok. checks.sql counts the waits and proves none was left or passed its deadline.
--
-- Provider batches (payload.via_batch; issue #19): before anything else the task asks in a
-- step "ask" through leash.llm.batch, so its first execution ends waiting (no slot, no lease)
-- until the fleet's batcher has the mock's batch answer; the chaos kills batchers, restarts
-- the server and terminates backends meanwhile. Answered, it runs as any task (execs, the
-- llm step), so every invariant holds for it too; checks.sql proves its "ask" step stored.
local leash = require "leash"

local ORIGINAL_UPPER = string.upper

local VERSION = "v1"

local mock_url, budget

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
    method = "POST", url = mock_url, timeout = 0.1, budget = budget,
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
    local b = leash.db.query("SELECT value FROM chaos_config WHERE key = 'budget'")[1]
    budget = b and b.value
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

local function wedge()
  local big = ("x"):rep(1024 * 1024)
  local t = {}
  for i = 1, 1000000 do
    t[i] = big
  end
  table.sort(t)
end

-- One misbehaviour per kind, each of a class docs/SECURITY.md says is closed.
local misbehave = {
  tostring_err = function()
    error(setmetatable({}, { __tostring = function() error("__tostring raised") end }))
  end,
  oom = function()
    local t = {}
    for i = 1, 1e9 do
      t[i] = ("x"):rep(1024) .. i
    end
  end,
  loop = function()
    while true do end
  end,
  pattern = function()
    return ("a"):rep(200000):find(("a*"):rep(30) .. "b")
  end,
  nilmsg = function()
    return nil, "upstream failed: 503 (hostile nilmsg)"
  end,
  crlf = function()
    leash.log.info("forged\n{\"level\":\"error\",\"msg\":\"forged line\"}", { k = "a\r\nb" })
    return false, "crlf logged"
  end,
  yield = function()
    coroutine.yield("out of handle")
  end,
  gc = function()
    setmetatable({}, { __gc = function() while true do end end })
    return false, "gc metatable accepted"
  end,
  bigresult = function()
    local s, t = ("y"):rep(1024 * 1024), {}
    for i = 1, 600 do
      t[i] = s
    end
    return leash.ok(t)
  end,
  leak = function()
    leaked_global = "from a hostile task"   -- luacheck: ignore
    pcall(function() string.upper = function() return "patched" end end)
    pcall(setmetatable, _G, { __index = function() return "patched" end })
    return nil, "leak attempted"
  end,
}

-- A waiter's first execution ends in its wait; resumed, nil (run on) or a fatal outcome.
local function wait_first(task, kind)
  local w = leash.waited()
  if w then
    if kind == "children" then
      local done = 0
      for _, c in ipairs(w.tasks) do done = done + (c.status == "done" and 1 or 0) end
      -- Two or more: the fan-out's enqueues commit on their own, so an execution that lost
      -- its lease before the step was stored leaves children the next one adds to.
      if done ~= #w.tasks or #w.tasks < 2 or w.expired then
        return leash.fatal(("children: %d of %d done, expired %s %s"):format(
          done, #w.tasks, tostring(w.expired), tag(task)))
      end
    end
    return nil
  end
  if kind == "children" then
    leash.step("fanout", function()
      for i = 1, 2 do
        leash.enqueue{ payload = { child_of = task.id, i = i },
                       shard_key = task.shard_key .. "/" .. task.id .. "/" .. i }
      end
      return 2
    end)
    return leash.wait{ children = true, deadline = 600 }
  end
  return leash.wait{ after = 0.2 + math.random() * 0.8 }
end

return {
  handle = function(task)
    if rawget(_G, "leaked_global") ~= nil or string.upper ~= ORIGINAL_UPPER
       or getmetatable(_G) ~= nil then
      return leash.fatal("state leaked across tasks " .. tag(task))
    end
    if type(task.payload) == "table" and task.payload.child_of then
      return leash.ok({ child_of = task.payload.child_of, i = task.payload.i })
    end
    local wait = type(task.payload) == "table" and task.payload.wait
    if wait then
      local ok, out = pcall(wait_first, task, wait)
      if not ok then   -- the database went away, or the lease: as below
        if task:lease_lost() then error(out, 0) end
        return leash.retry("raised before the wait: " .. tostring(out) .. " " .. tag(task), 0.5)
      end
      if out then return out end
    end
    local hostile = type(task.payload) == "table" and task.payload.hostile
    if hostile == "kill" then
      leash.sleep(60)
      return leash.retry("poison task outlived its driver " .. tag(task), 0.2)
    elseif hostile == "wedge" then
      wedge()
      return leash.retry("wedge returned " .. tag(task), 0.2)
    elseif hostile and task.attempt == 1 then
      return misbehave[hostile]()
    end
    if task.payload.via_batch then
      -- The first run ends in this step's wait; the run after the batch gets the answer.
      local ok, err = pcall(leash.step, "ask", function()
        local v = leash.llm.batch{ provider = "openai", request = { model = "mock",
          messages = { { role = "user", content = "chaos batch task " .. task.id } } } }
        local c = type(v) == "table" and v.choices and v.choices[1] and v.choices[1].message
                  and v.choices[1].message.content
        if type(c) ~= "string" then error("malformed batch answer") end
        return c
      end)
      if not ok then
        if task:lease_lost() then error(err, 0) end
        return leash.retry("batch ask: " .. tostring(err) .. " " .. tag(task), 0.5)
      end
    end
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
