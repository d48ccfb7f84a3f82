--- leash.testing: run a task script's handle under plain busted, with no host and no
--- PostgreSQL. The script gets a fake `leash` module whose db, http, steps, enqueue, log,
--- sleep and clock are recorded and scriptable; the outcome comes back mapped exactly as
--- the host maps it (SPEC.md, "The Lua contract").
---
---   local testing = require "leash.testing"
---   local h = testing.load("scripts/summarize_chunks.lua")
---   h.db:on("INSERT INTO chunk_summaries", function(sql, ...) return {}, 1 end)
---   h.http:on("POST", "/v1/chat", function(req) return { status = 200, body = "{}" } end)
---   local out = h:run({ payload = { doc = "d", chunk = 1, text = "a b c" } })
---   assert.equal("done", out.status)
---   assert.equal(1, #h.db.calls)
---
--- What the harness mirrors from the host:
---   * the sandbox: the script and what it requires see only the globals the host allows
---     (no io, debug, package, load, dofile, rawset, collectgarbage, os.exit…); print logs;
---     libraries and the leash module are read-only to the script (a spec may still change
---     h.leash); setmetatable refuses __gc; each h:run starts with fresh globals, a copy
---     of those loading left (chunk-level locals are what persists);
---   * require "x.y" loads x/y.lua from the script's folder, then each opts.lua_path folder,
---     once per harness (like once per slot);
---   * every outcome carries the host's cause (out.cause, the row's last_cause), and a retry
---     without a delay the backoff the host would wait (out.backoff);
---   * outcomes: nothing/nil/true/leash.ok → done (the result must encode as JSON, within
---     opts.max_result_bytes, default 16 MB); nil, msg / false, msg / leash.retry / a raised
---     error / any other return value → retry; leash.fatal → dead; a retry delay must be a
---     finite number >= 0 (else a contract error) and is cut to 3600 s; leash.snooze(s
---     [, reason]) and leash.retry{after = s, spend = false} → snooze (status "snooze": the
---     attempt given back, bounded by max_snoozes, then a retry with cause snooze_limit);
---     a retry on the last attempt (attempt >= max_attempts) → dead; leash.wait{...} →
---     wait (status "wait", cause "waiting", the attempt given back, out.wait the wait as
---     the host stores it: reason, ids, until/after, deadline, on_deadline); leash.waited()
---     answers h.waited (set it to play a resumed execution);
---   * the backoff: least(cap, base^attempt) (opts.backoff = { base, cap, jitter } as the
---     worker's --backoff-* flags, a task's backoff_base/backoff_cap beat them), jittered
---     to [backoff_min, backoff]: h:settle waits the longest unless opts.random is given;
---   * leash.json encodes by the host's rules (sorted keys, {} for an empty table,
---     json.array for [], errors on mixed keys, holes, NaN, functions, cycles);
---   * leash.step stores its result as JSON, fenced: a later h:run (the next attempt) gets
---     the stored value back without calling fn; a raising fn stores nothing;
---   * once h.lease_lost is true, db.query, http.request, step, enqueue and sleep raise.
---   * leash.llm.batch{...} (only inside a step, the host's checks): h.llm_batch(provider,
---     request, step) answers it (a table, handed out once; nil: not yet, the run ends as a
---     wait on event "llm:<item>", out.status "wait"; a raise: the failed item's error);
---     h.llm_requests records every call.
---   * leash.env(name) answers only the names the spec allowed, as --env-allow does:
---     opts.env = { NAME = "value" } allows and sets them, opts.env_allow = { "NAME" }
---     allows names left unset (nil); any other name raises the host's error. Like the host,
---     the kit redacts every allowed value of 8 bytes or more (its JSON form too) from
---     out.error and from h.logs (messages, field names and values) as "[redacted]"; results and steps
---     are kept as made. h.environ (name → value) and h.env_allowed (name → true) may be
---     changed between runs.
---
--- Not mirrored: real SQL (a query is answered by the first handler whose pattern is a
--- plain substring of the SQL; none → the query raises), parameter conversion (handlers get
--- the Lua values), time limits and memory caps, PostgreSQL's wording when it refuses a
--- result (the kit refuses what jsonb does, a "\u0000", in its own words), and the
--- position in an argument error of a fake leash function called as a tail call (`return
--- leash.retry("x", 0/0)`: the fakes are Lua, so the tail call drops the caller's line,
--- which the host's C functions keep).
local dkjson = require "dkjson"

local testing = {}

local NULL = setmetatable({}, { __tostring = function() return "leash.null" end,
                                __name = "leash.null" })
local ARRAY_MT = { __name = "leash.array", __jsontype = "array" }
local OUTCOME = { __name = "leash.outcome" }   -- marks leash.ok/retry/fatal values
local MAX_DEPTH = 128

-- ------------------------------------------------------------------ JSON (host rules)
local function utf8_ok(s)
  return utf8.len(s) ~= nil
end

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local named = { ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f',
                    ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }
    return named[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

-- Error texts as the host's (src/json_lua.c): "what at PATH", the path $.name, $[2] or
-- $["two words"]; a key shown as "name", 3, 1.5, true or (a table).
local function is_identifier(k)
  return #k <= 64 and k:find("^[%a_][%w_]*$") ~= nil
end

local function quote_key(k)
  local shown = #k > 64 and k:sub(1, 64) or k
  local ascii_only = not utf8_ok(shown)
  shown = shown:gsub('["\\]', "\\%0"):gsub("[%c\127]", "?")
  if ascii_only then shown = shown:gsub("[\128-\255]", "?") end
  return '"' .. shown .. (#k > 64 and "..." or "") .. '"'
end

local function describe_key(k)
  if type(k) == "string" then return quote_key(k) end
  if math.type(k) == "integer" then return string.format("%d", k) end
  if type(k) == "number" then return string.format("%.14g", k) end
  if type(k) == "boolean" then return tostring(k) end
  return "(a " .. type(k) .. ")"
end

local function child_path(path, k)
  if type(k) ~= "string" then return path .. "[" .. k .. "]" end
  if is_identifier(k) then return path .. "." .. k end
  return path .. "[" .. quote_key(k) .. "]"
end

local function fail_at(path, what) error(what .. " at " .. path, 0) end

local function key_error(path, k, why)
  error("cannot encode table key " .. describe_key(k) .. " at " .. path .. ": " .. why, 0)
end

local function encode_value(v, path, depth, out)
  local t = type(v)
  if v == nil or v == NULL then
    out[#out + 1] = "null"
  elseif t == "boolean" then
    out[#out + 1] = tostring(v)
  elseif t == "number" then
    if math.type(v) == "integer" then
      out[#out + 1] = string.format("%d", v)
    else
      if v ~= v then fail_at(path, "cannot encode NaN") end
      if v == math.huge then fail_at(path, "cannot encode inf") end
      if v == -math.huge then fail_at(path, "cannot encode -inf") end
      local s = string.format("%.17g", v)
      if not s:find("[%.eEn]") then s = s .. ".0" end
      out[#out + 1] = s
    end
  elseif t == "string" then
    local _, bad = utf8.len(v)
    if bad then fail_at(path, "invalid UTF-8 in string (byte " .. bad .. ")") end
    out[#out + 1] = encode_string(v)
  elseif t == "table" then
    if depth >= MAX_DEPTH then
      fail_at(path, "cannot encode tables nested deeper than " .. MAX_DEPTH .. " levels (a cycle?)")
    end
    local marked = getmetatable(v) == ARRAY_MT
    local nint, nstr, maxkey = 0, 0, 0
    local keys, first_int = {}, nil
    for k in next, v do
      if type(k) == "string" then
        nstr = nstr + 1
        keys[#keys + 1] = k
      elseif math.type(k) == "integer" and k >= 1 then
        nint = nint + 1
        first_int = first_int or k
        if k > maxkey then maxkey = k end
      else
        key_error(path, k, "keys must be all strings or exactly 1..n")
      end
    end
    if marked and nstr > 0 then
      key_error(path, keys[1], "a json.array table holds only keys 1..n")
    end
    if nint > 0 and nstr > 0 then
      -- the rarer kind is the likelier mistake: {1, 2, 3, x = 1} names "x"
      key_error(path, nstr <= nint and keys[1] or first_int, "the table mixes integer and string keys")
    end
    if nint > 0 and maxkey ~= nint then
      key_error(path, maxkey, "keys must be exactly 1..n, but only " .. nint .. " of 1.."
                .. maxkey .. " are present")
    end
    if marked or nint > 0 then
      out[#out + 1] = "["
      for i = 1, nint do
        if i > 1 then out[#out + 1] = "," end
        encode_value(rawget(v, i), child_path(path, i), depth + 1, out)
      end
      out[#out + 1] = "]"
    else
      table.sort(keys)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        local kpath = child_path(path, k)
        local _, bad = utf8.len(k)
        if bad then fail_at(kpath, "invalid UTF-8 in table key (byte " .. bad .. ")") end
        if k:find("\0", 1, true) then
          fail_at(kpath, "NUL in table key (byte " .. k:find("\0", 1, true) .. ")")
        end
        out[#out + 1] = encode_string(k)
        out[#out + 1] = ":"
        encode_value(rawget(v, k), kpath, depth + 1, out)
      end
      out[#out + 1] = "}"
    end
  else
    fail_at(path, "cannot encode a " .. t)
  end
end

local function json_encode(v)
  local out = {}
  encode_value(v, "$", 0, out)
  return table.concat(out)
end

local function json_decode(s)
  if type(s) ~= "string" then error("bad argument #1 to 'decode' (string expected, got "
                                    .. type(s) .. ")", 2) end
  local v, pos, err = dkjson.decode(s, 1, NULL, nil, ARRAY_MT)
  if err then return nil, "json.decode: " .. err end
  if s:find("%S", pos) then return nil, "json.decode: end of file expected at " .. pos end
  return v
end

-- dkjson marks decoded objects with a metatable of its own; the host does not. Arrays get
-- the array metatable (so they re-encode as [] even when empty), objects none.
local function strip_meta(v, depth)
  if type(v) ~= "table" or depth > MAX_DEPTH then return v end
  if getmetatable(v) ~= ARRAY_MT then setmetatable(v, nil) end
  for _, x in pairs(v) do strip_meta(x, depth + 1) end
  return v
end

testing.json = {
  encode = json_encode,
  decode = function(s)
    local v, err = json_decode(s)
    if err then return nil, err end
    return strip_meta(v, 0)
  end,
  array = function(t) return setmetatable(t or {}, ARRAY_MT) end,
}

-- ------------------------------------------------------------------ fakes
local function lost(h, what)
  if h.lease_lost then error(what .. ": lease lost: the task's side effects are stopped", 3) end
end

-- A fake database: answers come from handlers registered with db:on(pattern, fn); fn may
-- also be a table of rows (a fixed answer). A query nobody answers raises, like an
-- unexpected statement would fail a real test.
local function new_db()
  local db = { calls = {}, handlers = {} }
  function db:on(pattern, fn)
    assert(type(pattern) == "string", "db:on(pattern, fn): pattern must be a string")
    assert(type(fn) == "function" or type(fn) == "table", "db:on(pattern, fn): fn must be a function or rows")
    self.handlers[#self.handlers + 1] = { pattern = pattern, fn = fn }
    return self
  end
  --- calls whose SQL holds pattern (plain substring)
  function db:find(pattern)
    local found = {}
    for _, c in ipairs(self.calls) do
      if c.sql:find(pattern, 1, true) then found[#found + 1] = c end
    end
    return found
  end
  return db
end

-- A fake HTTP client: http:on([method,] pattern, fn). pattern is a plain substring of the
-- URL; method (case-insensitive) is optional. fn(req) returns {status, headers, body}
-- (header names are lower-cased, as the host does) or raises (a transport error).
local function new_http()
  local http = { calls = {}, handlers = {} }
  function http:on(a, b, c)
    local method, pattern, fn
    if c ~= nil then method, pattern, fn = a, b, c else pattern, fn = a, b end
    assert(method == nil or type(method) == "string", "http:on(method, pattern, fn): method must be a string")
    assert(type(pattern) == "string", "http:on([method,] pattern, fn): pattern must be a string")
    assert(type(fn) == "function" or type(fn) == "table",
           "http:on([method,] pattern, fn): fn must be a function or a response table")
    self.handlers[#self.handlers + 1] = { method = method and method:upper(), pattern = pattern, fn = fn }
    return self
  end
  --- calls whose URL holds pattern (plain substring), optionally of one method
  function http:find(pattern, method)
    local found = {}
    for _, r in ipairs(self.calls) do
      if r.url:find(pattern, 1, true) and (method == nil or r.method == method:upper()) then
        found[#found + 1] = r
      end
    end
    return found
  end
  return http
end

-- ------------------------------------------------------------------ budgets
-- The host's budgets are the database's (sql/014_budgets.sql); the kit keeps one table per
-- name in h.budgets: { paused_until = clock, pause_reason, requests, tokens, refused }. A
-- spec pauses one with h.budgets.openai = { paused_until = h.clock + 60 } or through
-- h.leash.budget.pause. What the kit mirrors: a paused budget makes the call wait in the
-- slot (the clock moves) when the pause ends within h.budget_wait (opts.budget_wait,
-- default 30 like --budget-wait), else the task yields: out.cause "budget", out.delay the
-- wait; a 429 or 503 on a budgeted call pauses its budget for Retry-After (seconds, or
-- retry-after-ms; 5 s when the answer names none) and is sent again after it, three times at
-- most, or yields. Not mirrored: rpm, tpm and concurrency limits, HTTP-date and rate-limit
-- reset headers, the jitter on the delay.
local BUDGET_DEFAULT_PAUSE = 5     -- BUDGET_DEFAULT_PAUSE_S (api_http.c)
local BUDGET_MAX_WAIT = 3600       -- PROVIDER_MAX_WAIT_S (provider.h)
local BUDGET_RESENDS = 3           -- BUDGET_RESENDS (api_http.c)

local function check_budget_name(name, fname)
  if type(name) ~= "string" or #name == 0 or #name > 200 then
    error("bad argument to '" .. fname .. "' (a budget name must be a string of 1 to 200 bytes)", 3)
  end
  if name:find("[%c]") then
    error("bad argument to '" .. fname .. "' (a budget name may not hold control characters)", 3)
  end
end

local function budget_of(h, name)
  local b = h.budgets[name]
  if not b then
    b = {}
    h.budgets[name] = b
  end
  b.requests, b.tokens, b.refused = b.requests or 0, b.tokens or 0, b.refused or 0
  return b
end

-- The run ends now by the host's choice, whatever handle does next (h:run reads h.yielded).
local function yield(h, msg, delay)
  h.yielded = { error = msg .. "; the task gave its slot back and runs again then", delay = delay }
  error(h.yielded.error, 0)
end

local function wait_budget(h, name)
  local b = budget_of(h, name)
  local wait = (b.paused_until or 0) - h.clock
  if wait <= 0 then return end
  if wait > h.budget_wait then
    yield(h, "budget '" .. name .. "' (paused: " .. (b.pause_reason or "by hand")
          .. "): the next grant is " .. wait .. " s away, longer than --budget-wait", wait)
  end
  h.clock = h.clock + wait
  h.slept = h.slept + wait
end

local function new_fake(h)
  local leash = { null = NULL }
  function leash.ok(result) return setmetatable({ kind = "ok", result = result }, OUTCOME) end
  local function check_delay(delay, what)
    if type(delay) ~= "number" then
      error(what .. " (number of seconds expected, got " .. (delay == nil and "no value" or type(delay)) .. ")", 3)
    end
    if not (delay >= 0) or delay == math.huge then
      error(what .. " (delay must be a finite number of seconds >= 0)", 3)
    end
  end
  -- the table form: leash.retry{message = m, after = s, spend = false}
  local function retry_table(t)
    for k in pairs(t) do
      if k ~= "message" and k ~= "after" and k ~= "spend" then
        error("leash.retry{...}: unknown field " .. tostring(k) .. " (expected message, after, spend)", 3)
      end
    end
    local msg, after, spend = t.message, t.after, t.spend
    if msg ~= nil and type(msg) ~= "string" and type(msg) ~= "number" then
      error("leash.retry{...}: message must be a string, not a " .. type(msg), 3)
    end
    if after ~= nil then
      if type(after) ~= "number" then
        error("leash.retry{...}: after must be a number of seconds, not a " .. type(after), 3)
      end
      if not (after >= 0) or after == math.huge then
        error("leash.retry{...}: after must be a finite number of seconds >= 0", 3)
      end
    end
    if spend ~= nil and type(spend) ~= "boolean" then
      error("leash.retry{...}: spend must be a boolean, not a " .. type(spend), 3)
    end
    if spend == false and after == nil then
      error("leash.retry{...}: spend = false (a snooze) needs after = seconds", 3)
    end
    return setmetatable({ kind = spend == false and "snooze" or "retry",
                          message = msg ~= nil and tostring(msg) or "retry requested",
                          delay = after }, OUTCOME)
  end
  function leash.retry(...)
    local msg, delay = ...
    if type(msg) == "table" and select("#", ...) == 1 then return retry_table(msg) end
    if delay ~= nil and type(delay) ~= "number" then
      error("bad argument #2 to 'retry' (number of seconds expected, got " .. type(delay) .. ")", 2)
    end
    if delay ~= nil and (not (delay >= 0) or delay == math.huge) then
      error("bad argument #2 to 'retry' (delay must be a finite number of seconds >= 0)", 2)
    end
    return setmetatable({ kind = "retry", message = msg ~= nil and tostring(msg) or "retry requested",
                          delay = delay }, OUTCOME)
  end
  function leash.snooze(delay, reason)
    check_delay(delay, "bad argument #1 to 'snooze'")
    if reason ~= nil and type(reason) ~= "string" and type(reason) ~= "number" then
      error("bad argument #2 to 'snooze' (string expected, got " .. type(reason) .. ")", 2)
    end
    return setmetatable({ kind = "snooze", message = reason ~= nil and tostring(reason) or "snoozed",
                          delay = delay }, OUTCOME)
  end
  -- leash.wait{...}: the host's checks and messages (src/api_leash.c, l_wait); the outcome
  -- carries the wait as a table (out.wait) where the host carries JSON.
  local WAIT_KEYS = { children = true, ids = true, ["until"] = true, after = true,
                      event = true, deadline = true, on_deadline = true, message = true }
  local function wait_seconds(v, key, positive, hi)
    if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge or v < 0
       or (positive and v <= 0) then
      local got = type(v) == "number" and string.format("%g", v) or type(v)
      error("leash.wait{...}: " .. key .. " must be a finite number of seconds "
            .. (positive and ">" or ">=") .. " 0, not " .. got, 3)
    end
    return math.min(v, hi)
  end
  function leash.wait(spec)
    if type(spec) ~= "table" then
      error("bad argument #1 to 'wait' (table expected, got " .. type(spec) .. ")", 2)
    end
    for k in pairs(spec) do
      if type(k) ~= "string" or not WAIT_KEYS[k] then
        error("leash.wait{...}: unknown field " .. tostring(k) .. " (expected children, ids, "
              .. "until, after, event, deadline, on_deadline, message)", 2)
      end
    end
    local n = 0
    for _, k in ipairs({ "children", "ids", "until", "after", "event" }) do
      if spec[k] ~= nil then n = n + 1 end
    end
    if n ~= 1 then
      error("leash.wait{...}: give exactly one of children = true, ids = {...}, until = epoch "
            .. "seconds, after = seconds, event = name", 2)
    end
    local w = {}
    if spec.children ~= nil then
      if spec.children ~= true then
        error("leash.wait{...}: children must be true, not "
              .. (spec.children == false and "false" or type(spec.children)), 2)
      end
      w.reason = "children"
    elseif spec.ids ~= nil then
      if type(spec.ids) ~= "table" then
        error("leash.wait{...}: ids must be a list of task ids, not a " .. type(spec.ids), 2)
      end
      if #spec.ids < 1 or #spec.ids > testing.WAIT_MAX_IDS then
        error("leash.wait{...}: ids must list 1 to " .. testing.WAIT_MAX_IDS .. " task ids", 2)
      end
      w.reason, w.ids = "ids", {}
      for i, id in ipairs(spec.ids) do
        if math.type(id) ~= "integer" and not (type(id) == "number" and id == math.floor(id)) or id < 1 then
          error("leash.wait{...}: ids[" .. i .. "] must be a task id (an integer >= 1)", 2)
        end
        w.ids[i] = math.tointeger(id)
      end
    elseif spec.event ~= nil then
      if type(spec.event) ~= "string" or #spec.event < 1 or #spec.event > 200
         or spec.event:find("[^%w_.:/%-]") then
        error("leash.wait{...}: event must be a name of 1 to 200 letters, digits and _ . : / -", 2)
      end
      w.reason, w.event = "event", spec.event
    elseif spec["until"] ~= nil then
      w.reason, w["until"] = "until", wait_seconds(spec["until"], "until", false, 1e12)
    else
      w.reason, w.after = "until", wait_seconds(spec.after, "after", false, testing.MAX_WAIT)
    end
    w.deadline = spec.deadline == nil and testing.WAIT_DEADLINE
                 or wait_seconds(spec.deadline, "deadline", true, testing.MAX_WAIT)
    if spec.on_deadline ~= nil and spec.on_deadline ~= "retry" and spec.on_deadline ~= "dead" then
      error('leash.wait{...}: on_deadline must be "retry" or "dead"', 2)
    end
    w.on_deadline = spec.on_deadline or "retry"
    if spec.message ~= nil and type(spec.message) ~= "string" then
      error("leash.wait{...}: message must be a string, not a " .. type(spec.message), 2)
    end
    return setmetatable({ kind = "wait", message = spec.message or "waiting", wait = w }, OUTCOME)
  end
  -- leash.waited(): what the spec set in h.waited ({reason, expired, tasks = {{id, status,
  -- result}...}}), nil by default: the host reads it from the row (sql/019_waits.sql).
  function leash.waited()
    lost(h, "leash.waited")
    return h.waited
  end
  function leash.fatal(msg)
    return setmetatable({ kind = "fatal", message = msg ~= nil and tostring(msg) or "fatal" }, OUTCOME)
  end
  function leash.now() return h.clock end
  function leash.sleep(s)
    if type(s) ~= "number" or s < 0 or s ~= s or s == math.huge then
      error("bad argument #1 to 'sleep' (seconds must be >= 0)", 2)
    end
    lost(h, "leash.sleep")
    h.clock = h.clock + s
    h.slept = h.slept + s
  end
  leash.json = {
    null = NULL,
    encode = function(v)
      local ok, s = pcall(json_encode, v)
      if not ok then error("json.encode: " .. s, 2) end
      return s
    end,
    decode = testing.json.decode,
    array = testing.json.array,
  }
  leash.db = {
    query = function(sql, ...)
      if type(sql) ~= "string" then error("bad argument #1 to 'query' (string expected)", 2) end
      lost(h, "leash.db.query")
      local call = { sql = sql, params = table.pack(...) }
      h.db.calls[#h.db.calls + 1] = call
      for _, handler in ipairs(h.db.handlers) do
        if sql:find(handler.pattern, 1, true) then
          local rows, affected
          if type(handler.fn) == "table" then rows = handler.fn else rows, affected = handler.fn(sql, ...) end
          rows = testing.json.array(rows or {})
          return rows, affected or #rows
        end
      end
      error("leash.db.query: no fake answer registered for: " .. sql, 2)
    end,
  }
  -- leash.llm.batch{...}: the host's checks and messages (src/api_llm.c). The answer comes
  -- from h.llm_batch(provider, request, step) (a table: the answer, returned once, as the host
  -- hands an item out once; nil: not answered yet, so the run ends waiting, out.status "wait"
  -- and out.wait the event wait the host writes; a raise: the failed item's error).
  local function llm_spec_error(msg) error("leash.llm.batch{...}: " .. msg, 3) end
  local LLM_KEYS = { provider = true, request = true, deadline = true, tries = true, fallback = true }
  leash.llm = {
    batch = function(spec)
      if type(spec) ~= "table" then
        error("bad argument #1 to 'batch' (table expected, got " .. type(spec) .. ")", 2)
      end
      for k in pairs(spec) do
        if not LLM_KEYS[k] then
          llm_spec_error("unknown field " .. tostring(k)
                         .. " (expected provider, request, deadline, tries, fallback)")
        end
      end
      if spec.provider ~= "openai" and spec.provider ~= "anthropic" then
        llm_spec_error('provider must be "openai" or "anthropic"')
      end
      if type(spec.request) ~= "table" then
        llm_spec_error("request must be a table (the body of the synchronous call), not "
                       .. type(spec.request))
      end
      local d = spec.deadline
      if d ~= nil and not (type(d) == "number" and d >= 1 and d <= testing.MAX_WAIT) then
        llm_spec_error("deadline must be a number of seconds from 1 to " .. math.floor(testing.MAX_WAIT))
      end
      local n = spec.tries
      if n ~= nil and not (math.type(n) == "integer" and n >= 1 and n <= 100) then
        llm_spec_error("tries must be an integer from 1 to 100")
      end
      if spec.fallback ~= nil and type(spec.fallback) ~= "function" then
        llm_spec_error("fallback must be a function (the synchronous call), not " .. type(spec.fallback))
      end
      local run = h.step_stack[#h.step_stack]
      if not run then
        error("leash.llm.batch: only inside leash.step (the step keeps the answer)", 2)
      end
      lost(h, "leash.llm.batch")
      if run.llm then
        error("leash.llm.batch: one call per leash.step run (give each request a step of its own)", 2)
      end
      run.llm = true
      local step = run.name
      local ok, text = pcall(json_encode, spec.request)
      if not ok then error("leash.llm.batch{...}: request cannot be sent as JSON: " .. text, 2) end
      if text:sub(1, 1) ~= "{" then llm_spec_error("request must be a JSON object, not a list") end
      local key = tostring(h.task and h.task.id) .. ":" .. step
      h.llm_items[key] = h.llm_items[key] or { id = #h.llm_requests + 1 }
      local item = h.llm_items[key]
      h.llm_requests[#h.llm_requests + 1] = { provider = spec.provider, step = step,
                                              request = testing.json.decode(text), item = item.id }
      local answer = h.llm_batch and h.llm_batch(spec.provider, testing.json.decode(text), step)
      if answer ~= nil then
        h.llm_items[key] = nil   -- handed out once: a step that rejects it asks afresh
        return answer
      end
      h.waited_llm = { reason = "event", event = "llm:" .. item.id,
                       deadline = d or testing.WAIT_DEADLINE, on_deadline = "retry" }
      h.yielded_wait = "waiting for " .. spec.provider .. " batch item " .. item.id
      error(h.yielded_wait, 0)
    end,
  }
  leash.http = {
    request = function(req, again)
      if type(req) ~= "table" or type(req.url) ~= "string" then
        error("bad argument #1 to 'request' (url is required)", 2)
      end
      if req.body ~= nil and type(req.body) ~= "string" then
        error("bad argument #1 to 'request' (body must be a string)", 2)
      end
      if req.headers ~= nil and type(req.headers) ~= "table" then
        error("bad argument #1 to 'request' (headers must map names to strings)", 2)
      end
      if req.budget ~= nil then check_budget_name(req.budget, "request") end
      if req.tokens ~= nil and (math.type(req.tokens) ~= "integer" or req.tokens < 0) then
        error("bad argument #1 to 'request' (tokens must be an integer >= 0 (the call's estimate))", 2)
      end
      lost(h, "leash.http.request")
      local r = {}
      for k, v in pairs(req) do r[k] = v end
      r.method = (req.method or (req.body and "POST" or "GET")):upper()
      r.resends = again and again.resends or 0
      if req.budget ~= nil then
        r.in_hold = h.holds[req.budget] ~= nil
        if not r.in_hold then wait_budget(h, req.budget) end
      end
      h.http.calls[#h.http.calls + 1] = r
      for _, handler in ipairs(h.http.handlers) do
        if (handler.method == nil or handler.method == r.method)
           and r.url:find(handler.pattern, 1, true) then
          local resp = handler.fn
          if type(resp) == "function" then resp = resp(r) end
          assert(type(resp) == "table", "fake http handler for " .. r.url .. " returned no response table")
          local headers = {}
          for k, v in pairs(resp.headers or {}) do headers[k:lower()] = tostring(v) end
          if h.lease_lost then error("leash.http.request: lease lost: request aborted", 2) end
          local answer = { status = resp.status or 200, headers = headers, body = resp.body or "" }
          if req.budget ~= nil and (answer.status == 429 or answer.status == 503) then
            -- The host pauses the budget for the fleet and sends the call again after the
            -- pause when that fits --budget-wait (three times at most), else the task yields.
            local wait = tonumber(headers["retry-after-ms"]) and tonumber(headers["retry-after-ms"]) / 1000
                         or tonumber(headers["retry-after"]) or BUDGET_DEFAULT_PAUSE
            wait = math.max(0.1, math.min(wait, BUDGET_MAX_WAIT))
            local b = budget_of(h, req.budget)
            b.refused = b.refused + 1
            b.paused_until = math.max(b.paused_until or 0, h.clock + wait)
            r.resends = (r.resends or 0) + 1
            if r.in_hold or r.resends > BUDGET_RESENDS or wait > h.budget_wait then
              yield(h, "budget '" .. req.budget .. "' paused for " .. wait .. " s: refused by "
                    .. r.url, wait)
            end
            return leash.http.request(req, r)
          end
          if req.budget ~= nil then
            budget_of(h, req.budget).requests = budget_of(h, req.budget).requests + 1
          end
          return answer
        end
      end
      error("leash.http.request: no fake answer registered for " .. r.method .. " " .. r.url, 2)
    end,
  }
  -- Steps persist in h.steps across h:run calls, as they do across attempts. The stored
  -- value is the JSON round trip of what fn returned (what the host gives back later).
  function leash.step(name, fn)
    if type(name) ~= "string" then error("bad argument #1 to 'step' (string expected)", 2) end
    if type(fn) ~= "function" then error("bad argument #2 to 'step' (function expected)", 2) end
    lost(h, "leash.step")
    local stored = h.steps[name]
    if stored ~= nil then return stored.value end
    h.step_runs[name] = (h.step_runs[name] or 0) + 1
    h.step_stack[#h.step_stack + 1] = { name = name }   -- leash.llm.batch: which step run
    local ok, v = pcall(fn)
    h.step_stack[#h.step_stack] = nil
    if not ok then error(v, 0) end
    local copy = nil
    if v ~= nil then
      local ok, text = pcall(json_encode, v)
      if not ok then
        error("leash.step: result of '" .. name .. "' cannot be stored as JSON: " .. text, 2)
      end
      copy = testing.json.decode(text)
    end
    lost(h, "leash.step")
    h.steps[name] = { value = copy }
    return v
  end
  function leash.enqueue(child)
    if type(child) ~= "table" or child.payload == nil then
      error("bad argument #1 to 'enqueue' (payload is required)", 2)
    end
    if child.delay ~= nil and (type(child.delay) ~= "number" or child.delay < 0) then
      error("bad argument #1 to 'enqueue' (delay must be a number of seconds >= 0)", 2)
    end
    if child.max_attempts ~= nil and (math.type(child.max_attempts) ~= "integer" or child.max_attempts < 1) then
      error("bad argument #1 to 'enqueue' (max_attempts must be an integer >= 1)", 2)
    end
    local ok, err = pcall(json_encode, child.payload)
    if not ok then error("bad argument #1 to 'enqueue' (" .. err .. ")", 2) end
    lost(h, "leash.enqueue")
    local parent = h.task or {}
    local id = 1000 + #h.enqueued + 1
    local rec = {}
    for k, v in pairs(child) do rec[k] = v end
    rec.id = id
    if rec.tenant_id == nil then rec.tenant_id = parent.tenant_id end
    if rec.batch == nil then rec.batch = parent.batch end
    if rec.shard_key == nil then rec.shard_key = "task:" .. id end
    h.enqueued[#h.enqueued + 1] = rec
    return id
  end
  leash.budget = {
    hold = function(name, o, fn, ...)
      check_budget_name(name, "hold")
      if o ~= nil and type(o) ~= "table" then error("bad argument #2 to 'hold' (table expected)", 2) end
      if o and o.tokens ~= nil and (math.type(o.tokens) ~= "integer" or o.tokens < 0) then
        error("bad argument #2 to 'hold' (tokens must be an integer >= 0)", 2)
      end
      if type(fn) ~= "function" then error("bad argument #3 to 'hold' (function expected)", 2) end
      lost(h, "leash.budget.hold")
      wait_budget(h, name)
      local b = budget_of(h, name)
      b.requests = b.requests + 1
      local outer = h.holds[name]
      local hold = { tokens = o and o.tokens or 0 }
      h.holds[name] = hold
      h.hold_stack[#h.hold_stack + 1] = hold
      local res = table.pack(pcall(fn, ...))
      h.hold_stack[#h.hold_stack] = nil
      h.holds[name] = outer
      b.tokens = b.tokens + (hold.used or hold.tokens)
      if not res[1] then error(res[2], 0) end
      return table.unpack(res, 2, res.n)
    end,
    pause = function(name, secs, reason)
      check_budget_name(name, "pause")
      if type(secs) ~= "number" or not (secs > 0) or secs == math.huge then
        error("bad argument #2 to 'pause' (seconds must be a number > 0)", 2)
      end
      if reason ~= nil and type(reason) ~= "string" then error("bad argument #3 to 'pause' (string expected)", 2) end
      lost(h, "leash.budget.pause")
      local b = budget_of(h, name)
      b.paused_until = math.max(b.paused_until or 0, h.clock + math.min(secs, BUDGET_MAX_WAIT))
      b.pause_reason = reason or "leash.budget.pause"
    end,
  }
  function leash.usage(u)
    if type(u) ~= "table" then error("bad argument #1 to 'usage' (table expected)", 2) end
    local hold = h.hold_stack[#h.hold_stack]
    if not hold then
      error("leash.usage: only inside leash.budget.hold (calls made with budget = read their usage from the answer)", 2)
    end
    local total
    for _, k in ipairs({ "tokens", "input_tokens", "output_tokens" }) do
      local n = u[k]
      if n ~= nil then
        if math.type(n) ~= "integer" or n < 0 then error("leash.usage: " .. k .. " must be an integer >= 0", 2) end
        if k == "tokens" and total then error("leash.usage: give tokens or input_tokens/output_tokens", 2) end
        total = (total or 0) + n
      end
    end
    if not total then error("leash.usage: give tokens or input_tokens/output_tokens", 2) end
    hold.used = total
  end
  function leash.env(name)
    if type(name) ~= "string" and type(name) ~= "number" then
      error("bad argument #1 to 'env' (string expected, got " .. type(name) .. ")", 2)
    end
    name = tostring(name)
    if not h.env_allowed[name] then
      error("leash.env: '" .. name:sub(1, 64) .. (#name > 64 and "..." or "")
            .. "' is not allowed (the worker allows only the names given with --env-allow)", 2)
    end
    return h.environ[name]
  end
  leash.log = {}
  for _, level in ipairs({ "debug", "info", "warn", "error" }) do
    leash.log[level] = function(msg, fields)
      if type(msg) ~= "string" and type(msg) ~= "number" then
        error("bad argument #1 to '" .. level .. "' (string expected)", 2)
      end
      local shown = fields
      if type(fields) == "table" and next(h.env_allowed) ~= nil then
        -- a copy with the allowed values redacted from string values, as the host writes
        shown = {}
        for k, v in pairs(fields) do shown[testing.redact(h, k)] = testing.redact(h, v) end
      end
      h.logs[#h.logs + 1] = { level = level, msg = testing.redact(h, tostring(msg)), fields = shown }
    end
  end
  return leash
end

-- ------------------------------------------------------------------ sandbox
local BASE = { "assert", "error", "ipairs", "next", "pairs", "pcall", "rawequal", "rawget",
               "rawlen", "select", "setmetatable", "getmetatable", "tonumber", "tostring",
               "type", "xpcall", "_VERSION" }
local LIBS = { "string", "table", "math", "utf8", "coroutine" }

-- A read-only view of t (the host serves libraries and the leash module this way): reads go
-- through to t, so a spec may still change h.leash; the script's assignments raise.
local function readonly(t, name)
  return setmetatable({}, {
    __index = t,
    __newindex = function(_, k)
      error("cannot set " .. name .. "." .. tostring(k) .. ": " .. name .. " is read-only in the sandbox", 2)
    end,
    __pairs = function() return function(_, k) return next(t, k) end, nil, nil end,
    __metatable = "read-only",
  })
end

local function new_env(h)
  local env = {}
  for _, n in ipairs(BASE) do env[n] = _G[n] end
  for _, lib in ipairs(LIBS) do
    local copy = {}
    for k, v in pairs(_G[lib]) do copy[k] = v end
    if lib == "string" then copy.dump = nil end
    if lib == "math" then copy.randomseed = nil end
    env[lib] = readonly(copy, lib)
  end
  env.os = readonly({ time = os.time, clock = os.clock, date = os.date, difftime = os.difftime }, "os")
  env.setmetatable = function(t, mt)
    if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
      error("setmetatable: __gc is not allowed in the sandbox (a finalizer would run outside "
            .. "the task's time limit)", 2)
    end
    return setmetatable(t, mt)
  end
  env.print = function(...)
    local parts = table.pack(...)
    for i = 1, parts.n do parts[i] = tostring(parts[i]) end
    h.logs[#h.logs + 1] = { level = "info", msg = testing.redact(h, table.concat(parts, "\t", 1, parts.n)) }
  end
  env._G = env
  local modules = {}
  h.chunks = {}              -- main chunks loaded at load time: each run gets fresh globals
  env.require = function(name)
    if type(name) ~= "string" then error("bad argument #1 to 'require' (string expected)", 2) end
    if name == "leash" then
      modules[name] = modules[name] or readonly(h.leash, "leash")
      return modules[name]
    end
    -- A module first required during a run lives for that run only, as in the host.
    local cache = h.task and h.task_modules or modules
    if modules[name] ~= nil then return modules[name] end
    if cache[name] ~= nil then return cache[name] end
    if name:find("..", 1, true) or name:find("^[/.]") then
      error("require: bad module name '" .. name .. "'", 2)
    end
    local rel = name:gsub("%.", "/") .. ".lua"
    for _, dir in ipairs(h.search) do
      local file = dir .. "/" .. rel
      local f = io.open(file, "r")
      if f then
        f:close()
        local chunk = assert(loadfile(file, "t", h.task and h.task_env or env))
        if not h.task then h.chunks[#h.chunks + 1] = chunk end
        local m = chunk(name)
        if m == nil then m = true end
        cache[name] = m
        return m
      end
    end
    error("require: module '" .. name .. "' not found in the script's folder"
          .. (#h.search > 1 and " or --lua-path" or ""), 2)
  end
  return env
end

-- Fresh globals for a run, as the host gives each task: a shallow copy of the globals as
-- loading left them (_G names the copy), installed as _ENV of every load-time chunk.
local function task_env(h)
  local t = {}
  for k, v in pairs(h.template) do t[k] = rawequal(v, h.env) and t or v end
  setmetatable(t, h.env_mt)
  for _, chunk in ipairs(h.chunks) do debug.setupvalue(chunk, 1, t) end
  return t
end

-- ------------------------------------------------------------------ secrets
-- As src/secrets.c: values shorter than this are returned but never redacted.
testing.ENV_MIN_REDACT = 8
local REDACTED = "[redacted]"

--- s with every allowed value of h (testing.ENV_MIN_REDACT bytes or more, and its JSON
--- form) replaced by "[redacted]", longest first, as the host writes errors and log lines.
function testing.redact(h, s)
  if type(s) ~= "string" then return s end
  local needles = {}
  for name in pairs(h.env_allowed or {}) do
    local v = h.environ[name]
    if type(v) == "string" and #v >= testing.ENV_MIN_REDACT then
      needles[#needles + 1] = v
      local j = encode_string(v):sub(2, -2)
      if j ~= v then needles[#needles + 1] = j end
    end
  end
  if #needles == 0 then return s end
  table.sort(needles, function(a, b) return #a > #b end)
  local out, i = {}, 1
  while i <= #s do
    local hit = nil
    for _, n in ipairs(needles) do
      if s:sub(i, i + #n - 1) == n then hit = n break end
    end
    if hit then
      out[#out + 1] = REDACTED
      i = i + #hit
    else
      out[#out + 1] = s:sub(i, i)
      i = i + 1
    end
  end
  return table.concat(out)
end

-- ------------------------------------------------------------------ outcomes
-- src/lifecycle.h's policy; tests/integration/lifecycle.sh checks these against the header,
-- the table's column default and the rows the host writes.
local BACKOFF_BASE = 2            -- LIFECYCLE_BACKOFF_BASE
local BACKOFF_CAP = 3600          -- LIFECYCLE_BACKOFF_CAP_S
local BACKOFF_JITTER = 0.5        -- LIFECYCLE_BACKOFF_JITTER
local MAX_DELAY = 3600            -- LIFECYCLE_MAX_DELAY_S
local DEFAULT_MAX_ATTEMPTS = 8    -- LIFECYCLE_DEFAULT_MAX_ATTEMPTS
local DEFAULT_MAX_SNOOZES = 100   -- LIFECYCLE_DEFAULT_MAX_SNOOZES
testing.BACKOFF_BASE = BACKOFF_BASE
testing.BACKOFF_CAP = BACKOFF_CAP
testing.BACKOFF_JITTER = BACKOFF_JITTER
testing.MAX_DELAY = MAX_DELAY
testing.DEFAULT_MAX_ATTEMPTS = DEFAULT_MAX_ATTEMPTS
testing.DEFAULT_MAX_SNOOZES = DEFAULT_MAX_SNOOZES
-- Every cause a row's last_cause can hold, in src/lifecycle.c's order (tests/integration/
-- sqlapi.sh checks the two agree). "cancelled" is written by `leash cancel`, never by a run;
-- "snooze_limit" by the settle; "wait_deadline" by the reaper.
testing.CAUSES = { "none", "returned", "script_error", "contract", "timeout", "memory",
                   "lease_lost", "stopping", "wedged", "crash", "quarantined", "bad_row",
                   "budget", "cancelled", "snoozed", "snooze_limit", "waiting",
                   "wait_deadline" }
-- leash.wait's bounds (LIFECYCLE_WAIT_DEADLINE_S, LIFECYCLE_MAX_WAIT_S, LIFECYCLE_WAIT_MAX_IDS).
testing.WAIT_DEADLINE = 86400
testing.MAX_WAIT = 604800
testing.WAIT_MAX_IDS = 10000

--- The wait in seconds before the next attempt after a retry without a delay on attempt
--- `attempts` (the row's attempts counts the one that just ran): least(cap, base^attempts)
--- x (1 - jitter x u). opts (all optional): base (2), cap (3600), jitter and u; without u
--- there is no jitter: the longest wait, least(3600, 2^attempts) by default.
function testing.backoff(attempts, opts)
  opts = opts or {}
  local base, cap = opts.base or BACKOFF_BASE, opts.cap or BACKOFF_CAP
  local d = cap <= 0 and 0 or math.min(cap, base ^ attempts)
  return d * (1 - (opts.jitter or BACKOFF_JITTER) * (opts.u or 0))
end
local MAX_RESULT_BYTES = 16 * 1024 * 1024

-- As the host's: a string (or number) gets a traceback; a value with __tostring is shown by
-- it, called protected, so one that raises ends as a message.
local function message_handler(e)
  if type(e) == "string" or type(e) == "number" then return debug.traceback(tostring(e), 2) end
  local mt = getmetatable(e)
  if type(mt) == "table" and rawget(mt, "__tostring") ~= nil then
    local ok, text = pcall(tostring, e)
    if ok and (type(text) == "string" or type(text) == "number") then return text end
    return debug.traceback("(error object is a " .. type(e) .. " value whose __tostring failed: "
                           .. (type(text) == "string" and text or "no message") .. ")", 2)
  end
  return debug.traceback("(error object is a " .. type(e) .. " value)", 2)
end

local CONTRACT = "; return nothing, true, leash.ok(result), nil or false with a message, leash.retry(msg), leash.snooze(s) or leash.fatal(msg)"

local function number_text(d)
  if d ~= d then return "NaN" end
  if d == math.huge then return "inf" end
  if d == -math.huge then return "-inf" end
  return string.format("%g", d)
end

-- True when JSON text holds the escape \u0000 (a NUL), not an escaped backslash before
-- "u0000": the backslashes before the "u" must be odd in number.
local function holds_nul_escape(text)
  local from = 1
  while true do
    local i = text:find("u0000", from, true)
    if not i then return false end
    local j = i - 1
    while j >= 1 and text:byte(j) == 92 do j = j - 1 end
    if (i - 1 - j) % 2 == 1 then return true end
    from = i + 1
  end
end

-- The host's mapping of what handle gave back (SPEC.md, "The Lua contract"); res is the
-- packed results of xpcall.
local function outcome(res, max_result_bytes)
  local ok, a, b = res[1], res[2], res[3]
  if not ok then return { status = "retry", cause = "script_error", error = a, raised = true } end
  -- nil, msg is a failure with msg (the Lua idiom); false, msg the same
  local failed = a == false or (a == nil and res.n >= 3 and b ~= nil)
  if not failed and (res.n == 1 or a == nil or a == true) then
    return { status = "done", cause = "none" }
  end
  if failed then
    if res.n >= 3 and b ~= nil then
      local t_ok, text = pcall(tostring, b)
      if not t_ok or (type(text) ~= "string" and type(text) ~= "number") then
        return { status = "retry", cause = "contract", contract = true,
                 error = "handle's answer could not be read: "
                 .. (t_ok and "'__tostring' must return a string" or tostring(text)) }
      end
      return { status = "retry", cause = "returned", error = tostring(text) }
    end
    return { status = "retry", cause = "returned", error = "handle returned false" }
  end
  if type(a) == "table" and getmetatable(a) == OUTCOME then
    local kind = rawget(a, "kind")
    if kind == "ok" then
      local result = rawget(a, "result")
      if result ~= nil then
        local enc_ok, err = pcall(json_encode, result)
        if not enc_ok then
          return { status = "retry", cause = "contract", contract = true,
                   error = "leash.ok: result cannot be stored as JSON: " .. err }
        end
        -- JSON can say NUL but jsonb cannot hold it: the host's settle fails and the
        -- attempt is a contract retry (host.c, settle_one_by_one); the rest of the host's
        -- message is PostgreSQL's.
        if holds_nul_escape(err) then
          return { status = "retry", cause = "contract", contract = true,
                   error = "result cannot be stored: jsonb cannot hold \\u0000 (a NUL in a string)" }
        end
        local max = max_result_bytes or MAX_RESULT_BYTES
        if #err > max then
          return { status = "retry", cause = "memory",
                   error = "leash.ok: result too large to store (--max-result-bytes): "
                   .. "the JSON text is larger than the limit of " .. max .. " bytes" }
        end
      end
      return { status = "done", cause = "none", result = result }
    end
    local message = rawget(a, "message")
    if type(message) ~= "string" then message = kind end
    if kind == "retry" or kind == "snooze" then
      local delay = rawget(a, "delay")
      -- a snooze must name its delay; a retry may (else the backoff)
      if delay ~= nil or kind == "snooze" then
        if type(delay) ~= "number" or not (delay >= 0) or delay == math.huge then
          local got = type(delay) == "number" and number_text(delay) or "a " .. type(delay)
          return { status = "retry", cause = "contract", contract = true,
                   error = kind .. " delay must be a finite number of seconds >= 0, not " .. got
                           .. " (message: " .. message .. ")" }
        end
        -- past LIFECYCLE_MAX_DELAY_S it is cut to it, as the host does
        delay = math.min(delay, MAX_DELAY)
      end
      if kind == "snooze" then
        return { status = "snooze", cause = "snoozed", error = message, delay = delay }
      end
      return { status = "retry", cause = "returned", error = message, delay = delay }
    end
    if kind == "fatal" then return { status = "dead", cause = "returned", error = message, fatal = true } end
    -- a wait: pending, the attempt given back, not claimable until its condition holds
    if kind == "wait" and type(rawget(a, "wait")) == "table" then
      return { status = "wait", cause = "waiting", error = message, wait = rawget(a, "wait") }
    end
  end
  return { status = "retry", cause = "contract", error = "handle returned a " .. type(a) .. CONTRACT,
           contract = true }
end

local function install(h, mod, path)
  if type(mod) == "function" then
    h.handle = mod
    return
  end
  if type(mod) ~= "table" then
    error(path .. ": the script must return handle(task) or { handle = ..., setup = ... }, not a "
          .. type(mod), 0)
  end
  if mod.setup ~= nil then
    if type(mod.setup) ~= "function" then error(path .. ": setup must be a function", 0) end
    mod.setup()
  end
  if type(mod.handle) ~= "function" then
    error(path .. ": the returned table has no handle function", 0)
  end
  h.handle = mod.handle
end

-- Loading is over: what it left in the globals is the template of every run's globals.
local function freeze(h)
  h.template = {}
  for k, v in pairs(h.env) do h.template[k] = v end
  h.env_mt = getmetatable(h.env)
end

local function new_harness(dir, opts)
  opts = opts or {}
  local h = { logs = {}, clock = opts.clock or 1700000000, slept = 0, lease_lost = false,
              steps = {}, step_runs = {}, enqueued = {}, runs = 0, budgets = {}, holds = {},
              hold_stack = {}, budget_wait = opts.budget_wait or 30, step_stack = {},
              llm_items = {}, llm_requests = {} }
  h.environ, h.env_allowed = {}, {}
  for k, v in pairs(opts.env or {}) do
    assert(type(k) == "string" and type(v) == "string", "opts.env maps names to string values")
    h.environ[k], h.env_allowed[k] = v, true
  end
  for _, k in ipairs(opts.env_allow or {}) do
    assert(type(k) == "string", "opts.env_allow lists names")
    h.env_allowed[k] = true
  end
  h.search = { dir }
  for _, d in ipairs(opts.lua_path or {}) do h.search[#h.search + 1] = d end
  h.db = new_db()
  h.http = new_http()
  h.leash = new_fake(h)
  h.env = new_env(h)

  -- The harness's backoff: opts.backoff = { base, cap, jitter } (the worker's --backoff-*)
  -- beaten by the task's backoff_base and backoff_cap, as the settle does.
  local function backoff_of(task, attempt)
    local b = opts.backoff or {}
    local o = { base = task.backoff_base or b.base, cap = task.backoff_cap or b.cap,
                jitter = b.jitter }
    local longest = testing.backoff(attempt, o)
    o.u = 1
    return longest, testing.backoff(attempt, o)
  end

  --- Runs handle on a task built from t (defaults fill id, tenant, shard, attempt…) and
  --- returns { status = "done"|"retry"|"snooze"|"dead", cause, result, error, delay,
  --- backoff, backoff_min, attempt, exhausted }. cause is the host's name for why (the
  --- row's last_cause): "none" (done), "returned" (false/nil with a message, leash.retry,
  --- leash.fatal), "snoozed" (leash.snooze, leash.retry{spend = false}), "snooze_limit" (a
  --- snooze past max_snoozes: a retry), "script_error" (raised), "contract" (a wrong answer,
  --- a bad delay, a result JSON cannot hold), "memory" (a result over max_result_bytes).
  --- A retry without a delay has backoff = the longest wait (least(cap, base^attempt)) and
  --- backoff_min = the shortest the jitter may make it; a retry on the last attempt is
  --- dead, exhausted. A snooze (status "snooze", its delay and reason in delay and error)
  --- gives its attempt back: t.snoozes (default 0) counts those already taken; once they
  --- reach t.max_snoozes (default 100) the snooze is a retry with cause "snooze_limit".
  function h:run(t)
    t = t or {}
    local task = {
      id = t.id or 1, tenant_id = t.tenant_id or "default", shard_key = t.shard_key or "task:" .. (t.id or 1),
      payload = t.payload == nil and {} or t.payload, attempt = t.attempt or 1,
      max_attempts = t.max_attempts or DEFAULT_MAX_ATTEMPTS, worker_id = t.worker_id or "test", batch = t.batch,
    }
    function task.lease_lost() return h.lease_lost == true end
    self.task_env = task_env(self)
    self.task_modules = {}
    self.task = task
    self.runs = self.runs + 1
    self.yielded, self.holds, self.hold_stack = nil, {}, {}
    self.yielded_wait, self.waited_llm, self.step_stack = nil, nil, {}
    local out = outcome(table.pack(xpcall(self.handle, message_handler, task)), opts.max_result_bytes)
    if self.yielded_wait then   -- leash.llm.batch ended the run waiting, whatever handle did
      out = { status = "wait", cause = "waiting", error = self.yielded_wait, wait = self.waited_llm }
    elseif self.yielded then   -- the host's stop wins over whatever handle made of it
      out = { status = "snooze", cause = "budget", error = self.yielded.error,
              delay = math.min(self.yielded.delay, BACKOFF_CAP) }
    end
    self.task = nil
    out.error = testing.redact(self, out.error)
    out.attempt = task.attempt
    local snoozes, max_snoozes = t.snoozes or 0, t.max_snoozes or DEFAULT_MAX_SNOOZES
    if out.status == "snooze" and snoozes >= max_snoozes then
      out.status, out.cause = "retry", "snooze_limit"
      out.error = "snooze_limit: snoozed " .. snoozes .. " times (max_snoozes " .. max_snoozes
                  .. "), so this snooze spent an attempt: " .. out.error
    end
    if out.status == "retry" and out.delay == nil then
      out.backoff, out.backoff_min = backoff_of(t, task.attempt)
    end
    if out.status == "retry" and task.attempt >= task.max_attempts then
      out.status, out.exhausted = "dead", true
    end
    return out
  end

  --- Runs attempt after attempt, as the host would, until the task is done or dead:
  --- between attempts the clock moves by the script's delay or the backoff (the longest
  --- wait, least(cap, base^attempt); with opts.random = function() return u end, the
  --- jittered one). A snooze moves the clock by its delay and runs the same attempt again.
  --- Returns the last outcome, with out.history (every outcome) and out.snoozes.
  function h:settle(t)
    t = t or {}
    local history = {}
    local attempt = t.attempt or 1
    local snoozes = t.snoozes or 0
    while true do
      local copy = {}
      for k, v in pairs(t) do copy[k] = v end
      copy.attempt, copy.snoozes = attempt, snoozes
      local out = self:run(copy)
      history[#history + 1] = out
      if out.status == "snooze" then
        self.clock = self.clock + out.delay
        snoozes = snoozes + 1
      elseif out.status ~= "retry" then
        out.history, out.snoozes = history, snoozes
        return out
      else
        local wait = out.delay or out.backoff
        if out.delay == nil and opts.random then
          wait = out.backoff - (out.backoff - out.backoff_min) * opts.random()
        end
        self.clock = self.clock + wait
        attempt = attempt + 1
      end
    end
  end
  return h
end

--- Loads a task script with the fake leash module. opts: { lua_path = {dirs}, clock = n,
--- env = { NAME = "value" }, env_allow = { "NAME" },
---   max_result_bytes = n, backoff = { base, cap, jitter }, random = function }.
--- Returns a harness h with h.db and h.http (calls, on(...), find(...)), h.steps (stored
--- step results, kept across runs like attempts), h.step_runs (name → times fn ran),
--- h.enqueued (child tasks, defaults filled), h.logs, h.clock (settable), h.slept,
--- h.lease_lost (set it to make side effects raise), h:run(task) and h:settle(task).
--- A script that fails to load or breaks the contract raises, as `leash check` would fail.
function testing.load(path, opts)
  local h = new_harness(path:match("^(.*)/[^/]*$") or ".", opts)
  local chunk, err = loadfile(path, "t", h.env)
  if not chunk then error(err, 0) end
  table.insert(h.chunks, 1, chunk)
  install(h, chunk(), path)
  freeze(h)
  return h
end

--- Like load, from source text (handy for small scripts inside a spec). opts.dir is the
--- folder require searches first (default ".").
function testing.load_string(src, opts)
  opts = opts or {}
  local h = new_harness(opts.dir or ".", opts)
  local name = opts.name or "=(script)"
  local chunk, err = load(src, name, "t", h.env)
  if not chunk then error(err, 0) end
  table.insert(h.chunks, 1, chunk)
  install(h, chunk(), name)
  freeze(h)
  return h
end

testing.null = NULL
return testing
