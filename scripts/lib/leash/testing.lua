--- leash.testing: run a task script's handle under plain busted, with no host and no
--- PostgreSQL. The script gets a fake `leash` module whose db, log, sleep and clock are
--- recorded and scriptable; the outcome comes back mapped exactly as the host maps it.
---
---   local testing = require "leash.testing"
---   local h = testing.load("scripts/summarize_chunk.lua")
---   h.db:on("INSERT INTO chunk_summaries", function(sql, ...) return {}, 1 end)
---   local out = h:run({ payload = { doc = "d", chunk = 1, text = "a b c" } })
---   assert.equal("done", out.status)
---   assert.equal(1, #h.db.calls)
local json = require "dkjson"

local testing = {}

local NULL = setmetatable({}, { __tostring = function() return "leash.null" end })
local OUTCOME = {}   -- metatable marking leash.ok/retry/fatal values

-- A fake database: answers come from handlers registered with db:on(pattern, fn); a query
-- nobody answers raises, like an unexpected statement would fail a real test.
local function new_db()
  local db = { calls = {}, handlers = {} }
  function db:on(pattern, fn)
    self.handlers[#self.handlers + 1] = { pattern = pattern, fn = fn }
    return self
  end
  return db
end

local function new_fake(h)
  local leash = { null = NULL }
  function leash.ok(result) return setmetatable({ kind = "ok", result = result }, OUTCOME) end
  function leash.retry(msg, delay)
    return setmetatable({ kind = "retry", message = msg or "retry requested", delay = delay }, OUTCOME)
  end
  function leash.fatal(msg) return setmetatable({ kind = "fatal", message = msg or "fatal" }, OUTCOME) end
  function leash.now() return h.clock end
  function leash.sleep(s)
    assert(type(s) == "number" and s >= 0, "bad argument #1 to 'sleep' (seconds must be >= 0)")
    h.clock = h.clock + s
    h.slept = h.slept + s
    if h.lease_lost then error("leash.sleep: lease lost: the task's side effects are stopped", 2) end
  end
  leash.json = {
    null = NULL,
    encode = function(v)
      local s, err = json.encode(v, { exception = function(reason) error("json.encode: " .. reason, 0) end })
      if not s then error("json.encode: " .. tostring(err), 2) end
      return s
    end,
    decode = function(s)
      local v, _, err = json.decode(s, 1, NULL)
      if err then return nil, "json.decode: " .. err end
      return v
    end,
    array = function(t) return setmetatable(t or {}, json.array_mt or { __jsontype = "array" }) end,
  }
  leash.db = {
    query = function(sql, ...)
      if h.lease_lost then error("leash.db.query: lease lost: the task's side effects are stopped", 2) end
      local call = { sql = sql, params = table.pack(...) }
      h.db.calls[#h.db.calls + 1] = call
      for _, handler in ipairs(h.db.handlers) do
        if sql:find(handler.pattern, 1, true) then
          local rows, affected = handler.fn(sql, ...)
          rows = rows or {}
          return rows, affected or #rows
        end
      end
      error("leash.db.query: no fake answer registered for: " .. sql, 2)
    end,
  }
  leash.http = {
    request = function(req)
      assert(type(req) == "table" and type(req.url) == "string", "bad argument #1 to 'request' (url is required)")
      if h.lease_lost then error("leash.http.request: lease lost: request aborted", 2) end
      h.http.calls[#h.http.calls + 1] = req
      for _, handler in ipairs(h.http.handlers) do
        if req.url:find(handler.pattern, 1, true) then
          local resp = handler.fn(req)
          resp.headers = resp.headers or {}
          resp.body = resp.body or ""
          return resp
        end
      end
      error("leash.http.request: no fake answer registered for " .. req.url, 2)
    end,
  }
  -- Steps persist in h.steps across h:run calls, as they do across attempts.
  function leash.step(name, fn)
    if h.steps[name] ~= nil then return h.steps[name].value end
    local v = fn()
    h.steps[name] = { value = v }
    return v
  end
  function leash.enqueue(child)
    assert(type(child) == "table" and child.payload ~= nil, "bad argument #1 to 'enqueue' (payload is required)")
    h.enqueued[#h.enqueued + 1] = child
    return 1000 + #h.enqueued
  end
  leash.log = {}
  for _, level in ipairs({ "debug", "info", "warn", "error" }) do
    leash.log[level] = function(msg, fields)
      h.logs[#h.logs + 1] = { level = level, msg = msg, fields = fields }
    end
  end
  return leash
end

-- The host's mapping of what handle gave back (SPEC.md, "The Lua contract").
local function outcome(ok, a, b)
  if not ok then return { status = "retry", error = tostring(a) } end
  if a == nil or a == true then return { status = "done" } end
  if a == false then return { status = "retry", error = b ~= nil and tostring(b) or "handle returned false" } end
  if getmetatable(a) == OUTCOME then
    if a.kind == "ok" then return { status = "done", result = a.result } end
    if a.kind == "retry" then return { status = "retry", error = a.message, delay = a.delay } end
    return { status = "dead", error = a.message }
  end
  return { status = "retry", error = "handle returned a " .. type(a) .. "; return nothing, true, "
    .. "leash.ok(result), false, msg, leash.retry(msg) or leash.fatal(msg)" }
end

--- Loads a task script with the fake leash module. Returns a harness h with
--- h.db and h.http (calls, on(pattern, fn)), h.steps (stored step results, kept across
--- runs like attempts), h.enqueued (child tasks), h.logs, h.clock (settable), h.slept,
--- h.lease_lost (set it to make side effects raise), and h:run(task).
function testing.load(path)
  local h = { logs = {}, clock = 1700000000, slept = 0, lease_lost = false, steps = {}, enqueued = {} }
  h.db = new_db()
  h.http = new_db()   -- same shape: calls, on(pattern, fn); fn(req) returns {status, headers, body}
  h.leash = new_fake(h)
  local dir = path:match("^(.*)/[^/]*$") or "."
  local env = setmetatable({}, { __index = _G })
  env.require = function(name)
    if name == "leash" then return h.leash end
    local file = dir .. "/" .. name:gsub("%.", "/") .. ".lua"
    local chunk = assert(loadfile(file, "t", env))
    return chunk(name)
  end
  local chunk = assert(loadfile(path, "t", env))
  local mod = chunk()
  if type(mod) == "function" then
    h.handle = mod
  else
    assert(type(mod) == "table" and type(mod.handle) == "function",
           path .. ": the script must return handle(task) or { handle = ..., setup = ... }")
    if mod.setup then mod.setup() end
    h.handle = mod.handle
  end

  --- Runs handle on a task built from t (defaults fill id, tenant, shard, attempt…) and
  --- returns { status = "done"|"retry"|"dead", result, error, delay }.
  function h:run(t)
    local task = {
      id = t.id or 1, tenant_id = t.tenant_id or "default", shard_key = t.shard_key or "task:1",
      payload = t.payload, attempt = t.attempt or 1, max_attempts = t.max_attempts or 8,
      worker_id = t.worker_id or "test", batch = t.batch,
    }
    function task.lease_lost() return h.lease_lost end
    local out = outcome(pcall(self.handle, task))
    if out.status == "retry" and task.attempt >= task.max_attempts then out.status = "dead" end
    return out
  end
  return h
end

testing.null = NULL
return testing
