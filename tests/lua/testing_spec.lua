-- leash.testing itself: the fake host must map outcomes and side effects the way the real
-- host does (SPEC.md "The Lua contract"), or script specs would prove nothing.
local testing = require "leash.testing"

-- A harness for a handle written inline: body is the function's body, `leash` in scope.
local function script(body, opts)
  return testing.load_string("local leash = require 'leash'\nreturn function(task)\n"
                             .. body .. "\nend", opts)
end

describe("leash.testing outcomes", function()
  local cases = {
    { "returns nothing", "return", "done" },
    { "returns true", "return true", "done" },
    { "returns leash.ok()", "return leash.ok()", "done" },
    { "returns false, msg", "return false, 'upstream said no'", "retry", "upstream said no" },
    { "returns false alone", "return false", "retry", "handle returned false" },
    { "returns nil, msg", "return nil, 'upstream failed: 503'", "retry", "upstream failed: 503" },
    { "returns nil alone", "return nil", "done" },
    { "returns nil, nil", "return nil, nil", "done" },
    { "returns leash.retry(msg)", "return leash.retry('later')", "retry", "later" },
    { "returns leash.retry()", "return leash.retry()", "retry", "retry requested" },
    { "returns leash.fatal(msg)", "return leash.fatal('never')", "dead", "never" },
    { "returns a string (contract error)", "return 'what'", "retry", "handle returned a string" },
    { "returns a plain table (contract error)", "return { ok = true }", "retry", "handle returned a table" },
    { "raises an error", "error('exploded')", "retry", "exploded" },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. " -> " .. c[3], function()
      local out = script(c[2]):run({ payload = {} })
      assert.equal(c[3], out.status)
      if c[4] then assert.truthy(out.error:find(c[4], 1, true), out.error) end
    end)
  end

  it("keeps the result of leash.ok and the delay of leash.retry", function()
    assert.same({ n = 1 }, script("return leash.ok({ n = 1 })"):run({}).result)
    assert.equal(7.5, script("return leash.retry('x', 7.5)"):run({}).delay)
    assert.is_nil(script("return leash.retry('x')"):run({}).delay)
  end)

  it("gives a raised string a traceback and flags it as raised", function()
    local out = script("error('exploded')"):run({})
    assert.is_true(out.raised)
    assert.truthy(out.error:find("stack traceback", 1, true))
  end)

  it("names a raised table by its __tostring, like the host's message handler", function()
    local out = script("error(setmetatable({}, { __tostring = function() return 'custom' end }))"):run({})
    assert.equal("retry", out.status)
    assert.equal("custom", out.error)
    out = script("error({})"):run({})
    assert.truthy(out.error:find("(error object is a table value)", 1, true))
  end)

  it("survives error values and messages whose __tostring raises, as the host does", function()
    local out = script("error(setmetatable({}, { __tostring = function() error('boom') end }))"):run({})
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("__tostring failed", 1, true), out.error)
    out = script("return false, setmetatable({}, { __tostring = function() error('boom') end })"):run({})
    assert.equal("retry", out.status)
    assert.is_true(out.contract)
    assert.truthy(out.error:find("handle's answer could not be read", 1, true), out.error)
    out = script("return nil, setmetatable({}, { __tostring = function() return {} end })"):run({})
    assert.is_true(out.contract)
  end)

  it("turns a result that cannot be stored as JSON into a retry", function()
    local out = script("return leash.ok({ f = function() end })"):run({})
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("leash.ok: result cannot be stored as JSON", 1, true))
    out = script("return leash.ok({ 1, 2, x = 3 })"):run({})
    assert.equal("retry", out.status)
  end)

  it("refuses a negative retry delay, as the host raises", function()
    local out = script("return leash.retry('x', -1)"):run({})
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("delay must be", 1, true))
  end)

  it("refuses NaN, infinite and string delays at the call, as the host raises", function()
    for _, d in ipairs({ "0/0", "math.huge", "-math.huge", "'5'" }) do
      local out = script("return leash.retry('x', " .. d .. ")"):run({})
      assert.equal("retry", out.status)
      assert.is_true(out.raised, d)
      assert.truthy(out.error:find("bad argument #2 to 'retry'", 1, true), out.error)
    end
  end)

  it("makes a delay set by hand that is not a finite number >= 0 a contract error", function()
    for d, shown in pairs({ ["math.huge"] = "inf", ["-5"] = "-5", ["'1e400'"] = "a string",
                            ["0/0"] = "NaN", ["{}"] = "a table" }) do
      local out = script("local o = leash.retry('x'); o.delay = " .. d .. "; return o"):run({})
      assert.equal("retry", out.status)
      assert.is_true(out.contract, d)
      assert.is_nil(out.delay)
      assert.equal("retry delay must be a finite number of seconds >= 0, not " .. shown
                   .. " (message: x)", out.error)
    end
  end)

  it("cuts a delay above the backoff cap to the cap", function()
    assert.equal(3600, script("return leash.retry('x', 1e20)"):run({}).delay)
    assert.equal(3600, script("local o = leash.retry('x'); o.delay = 7200; return o"):run({}).delay)
    assert.equal(0, script("return leash.retry('x', 0)"):run({}).delay)
  end)

  it("refuses a result larger than max_result_bytes", function()
    local h = script("return leash.ok({ s = string.rep('x', 100) })", { max_result_bytes = 50 })
    local out = h:run({})
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("--max-result-bytes", 1, true))
    assert.equal("done", script("return leash.ok({ s = string.rep('x', 100) })"):run({}).status)
  end)

  it("makes a retry on the last attempt dead (attempts exhausted)", function()
    local h = script("return false, 'flaky'")
    assert.equal("retry", h:run({ attempt = 2, max_attempts = 3 }).status)
    local out = h:run({ attempt = 3, max_attempts = 3 })
    assert.equal("dead", out.status)
    assert.equal("flaky", out.error)
    assert.equal("dead", script("error('boom')"):run({ attempt = 8 }).status)
    -- fatal is dead on the first attempt
    assert.equal("dead", script("return leash.fatal('x')"):run({ attempt = 1, max_attempts = 8 }).status)
  end)

  it("settle runs attempts with the backoff until done or dead", function()
    local h = script("if task.attempt < 3 then return false, 'not yet' end return leash.ok({ a = task.attempt })")
    local t0 = h.clock
    local out = h:settle({ payload = {} })
    assert.equal("done", out.status)
    assert.equal(3, out.result.a)
    assert.equal(3, #out.history)
    assert.equal(t0 + 2 + 4, h.clock)   -- 2^1 + 2^2
    local dead = script("return leash.retry('x', 1)"):settle({ max_attempts = 4 })
    assert.equal("dead", dead.status)
    assert.equal(4, dead.attempt)
  end)

  it("fills the task's fields and task:lease_lost()", function()
    local h = script("return leash.ok({ id = task.id, tenant = task.tenant_id, shard = task.shard_key, "
                     .. "attempt = task.attempt, max = task.max_attempts, worker = task.worker_id, "
                     .. "lost = task:lease_lost() })")
    assert.same({ id = 9, tenant = "default", shard = "task:9", attempt = 1, max = 8, worker = "test", lost = false },
                h:run({ id = 9 }).result)
  end)
end)

describe("leash.testing loading", function()
  it("refuses scripts that break the contract, as leash check does", function()
    assert.has_error(function() testing.load_string("return 42") end,
                     "=(script): the script must return handle(task) or { handle = ..., setup = ... }, not a number")
    assert.has_error(function() testing.load_string("return { setup = function() end }") end)
    assert.has_error(function() testing.load_string("return function(") end)
  end)

  it("runs setup once at load time", function()
    local h = testing.load_string([[
      local n = 0
      return { setup = function() n = n + 1 end, handle = function() return require("leash").ok({ n = n }) end }]])
    assert.equal(1, h:run({}).result.n)
    assert.equal(1, h:run({}).result.n)
  end)

  it("loads a script file and its sibling modules through require", function()
    local h = testing.load("tests/fixtures/lua/outcomes.lua")
    local out = h:run({ payload = { kind = "ok", n = 3 } })
    assert.equal("done", out.status)
    assert.same({ n = 3, id = 1, sib = 4 }, out.result)
  end)

  it("requires a module once per harness, and refuses odd names", function()
    local h = testing.load_string([[
      local a, b = require "lib.helper", require "lib.helper"
      assert(a == b)
      return function() require "../etc/passwd" end]], { dir = "tests/fixtures/lua" })
    local out = h:run({})
    assert.truthy(out.error:find("bad module name", 1, true))
    assert.has_error(function() testing.load_string("require 'nope.missing' return function() end") end)
  end)

  it("shows the script only what the host's sandbox allows", function()
    local h = script([[
      local seen = {}
      for _, n in ipairs({ "io", "debug", "package", "load", "loadstring", "dofile", "loadfile",
                           "rawset", "collectgarbage" }) do
        if _G[n] ~= nil then seen[#seen + 1] = n end
      end
      for _, n in ipairs({ "exit", "execute", "getenv", "remove", "rename", "tmpname" }) do
        if os[n] ~= nil then seen[#seen + 1] = "os." .. n end
      end
      if string.dump then seen[#seen + 1] = "string.dump" end
      return leash.ok({ seen = leash.json.array(seen), time = type(os.time()) })]])
    assert.same({ seen = {}, time = "number" }, h:run({}).result)
  end)

  it("starts each run with fresh globals and read-only libraries, as the host's tasks", function()
    local h = testing.load_string([[
      local leash = require "leash"
      CONFIG = 1
      local kept = 0
      return function()
        local seen = { secret = SECRET, config = CONFIG, kept = kept }
        SECRET, CONFIG, kept = "set", nil, kept + 1
        seen.upper = select(2, pcall(function() string.upper = nil end))
        seen.leash = select(2, pcall(function() leash.x = 1 end))
        return leash.ok(seen)
      end]])
    local first, second = h:run({}).result, h:run({}).result
    assert.same({ nil, 1, 0 }, { first.secret, first.config, first.kept })
    assert.same({ nil, 1, 1 }, { second.secret, second.config, second.kept })
    assert.truthy(second.upper:find("string is read-only", 1, true))
    assert.truthy(second.leash:find("leash is read-only", 1, true))
  end)

  it("sends print to the log", function()
    local h = script("print('hello', 42)")
    h:run({})
    assert.same({ level = "info", msg = "hello\t42" }, h.logs[1])
  end)
end)

describe("leash.testing fake db", function()
  it("raises on a query nobody answers, naming the SQL", function()
    local h = script("leash.db.query('SELECT secret FROM nowhere')")
    local out = h:run({})
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("no fake answer registered for: SELECT secret FROM nowhere", 1, true))
  end)

  it("answers from the first handler whose pattern is a substring, and records calls", function()
    local h = script([[
      local rows, n = leash.db.query("SELECT id FROM t WHERE a = $1 AND b = $2", 1, nil)
      local _, affected = leash.db.query("UPDATE t SET x = 1")
      return leash.ok({ id = rows[1].id, n = n, affected = affected })]])
    h.db:on("SELECT id FROM t", { { id = 5 } })
    h.db:on("SELECT", function() error("second handler must not run") end)
    h.db:on("UPDATE t", function(sql) return {}, 3 end)
    local out = h:run({})
    assert.same({ id = 5, n = 1, affected = 3 }, out.result)
    assert.equal(2, #h.db.calls)
    assert.equal(2, h.db.calls[1].params.n)      -- a nil parameter is kept in place
    assert.equal(1, h.db.calls[1].params[1])
    assert.equal(1, #h.db:find("UPDATE"))
  end)
end)

describe("leash.testing fake http", function()
  local body = [[
    local r = leash.http.request{ method = task.payload.method, url = task.payload.url,
                                  body = task.payload.body, headers = { ["X-A"] = "1" } }
    return leash.ok({ status = r.status, body = r.body, retry_after = r.headers["retry-after"] or "none" })]]

  it("matches by method and url pattern (3 arguments) or url pattern alone (2 arguments)", function()
    local h = script(body)
    h.http:on("GET", "/v1/chat", { status = 405, body = "get" })
    h.http:on("POST", "/v1/chat", function(req) return { status = 200, body = "post:" .. req.body } end)
    h.http:on("example.org", function(req) return { status = 201, body = req.method } end)
    assert.same({ status = 200, body = "post:q", retry_after = "none" },
                h:run({ payload = { url = "http://llm/v1/chat/completions", body = "q" } }).result)
    assert.same({ status = 405, body = "get", retry_after = "none" },
                h:run({ payload = { url = "http://llm/v1/chat/completions" } }).result)
    assert.same({ status = 201, body = "PUT", retry_after = "none" },
                h:run({ payload = { url = "https://example.org/x", method = "put", body = "" } }).result)
    assert.equal(3, #h.http.calls)
    assert.equal("POST", h.http.calls[1].method)   -- the default with a body
    assert.equal("GET", h.http.calls[2].method)    -- the default without
    assert.same({ ["X-A"] = "1" }, h.http.calls[1].headers)
    assert.equal(1, #h.http:find("/v1/chat", "POST"))
  end)

  it("lower-cases response header names, as the host does", function()
    local h = script(body)
    h.http:on("llm", { status = 429, headers = { ["Retry-After"] = 3 } })
    assert.equal("3", h:run({ payload = { url = "http://llm/" } }).result.retry_after)
  end)

  it("raises when no handler matches, and passes a handler's raise on (a transport error)", function()
    local h = script(body)
    h.http:on("POST", "llm", function() error("Couldn't connect to server", 0) end)
    local out = h:run({ payload = { url = "http://llm/" } })   -- a GET: no handler
    assert.truthy(out.error:find("no fake answer registered for GET http://llm/", 1, true))
    out = h:run({ payload = { url = "http://llm/", body = "x" } })
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("Couldn't connect", 1, true))
  end)
end)

describe("leash.testing steps", function()
  local body = [[
    local v = leash.step("ask", function()
      return leash.http.request{ url = "http://llm/", body = "q" }.body
    end)
    if task.attempt == 1 then return leash.retry("try again") end
    return leash.ok({ v = v })]]

  it("persist across runs (attempts): the second attempt does not call fn", function()
    local h = script(body)
    h.http:on("llm", { status = 200, body = "answer" })
    assert.equal("retry", h:run({ attempt = 1 }).status)
    local out = h:run({ attempt = 2 })
    assert.equal("answer", out.result.v)
    assert.equal(1, #h.http.calls)
    assert.equal(1, h.step_runs.ask)
    assert.same({ value = "answer" }, h.steps.ask)
  end)

  it("store nothing when fn raises", function()
    local h = script(body)
    local n = 0
    h.http:on("llm", function()
      n = n + 1
      if n == 1 then error("timeout", 0) end
      return { status = 200, body = "late" }
    end)
    assert.equal("retry", h:run({ attempt = 1 }).status)
    assert.is_nil(h.steps.ask)
    assert.equal("late", h:run({ attempt = 2 }).result.v)
    assert.equal(2, #h.http.calls)
  end)

  it("give back the JSON round trip of the stored value, and refuse what JSON cannot hold", function()
    local h = script([[return leash.ok({ v = leash.step("s", function() return { a = { 1, 2 }, e = {} } end) })]])
    h:run({})
    local out = h:run({})
    assert.same({ a = { 1, 2 }, e = {} }, out.result.v)
    local bad = script([[leash.step("s", function() return { f = print } end)]]):run({})
    assert.truthy(bad.error:find("result of 's' cannot be stored as JSON", 1, true))
  end)
end)

describe("leash.testing lease loss", function()
  it("makes every side effect raise and task:lease_lost() true", function()
    for _, call in ipairs({
      "leash.db.query('SELECT 1')",
      "leash.http.request{ url = 'http://x/' }",
      "leash.step('s', function() return 1 end)",
      "leash.enqueue{ payload = {} }",
      "leash.sleep(1)",
    }) do
      local h = script("local lost = task:lease_lost()\n" .. call .. "\nreturn leash.ok({ lost = lost })")
      h.db:on("SELECT", {})
      h.http:on("x", {})
      h.lease_lost = true
      local out = h:run({})
      assert.equal("retry", out.status, call)
      assert.truthy(out.error:find("lease lost", 1, true), out.error)
      assert.equal(0, #h.enqueued)
    end
  end)

  it("stops a request whose lease is lost while it runs, and then stores no step", function()
    local h = script([[
      return leash.ok({ v = leash.step("ask", function()
        return leash.http.request{ url = "http://llm/", body = "q" }.body
      end) })]])
    h.http:on("llm", function() h.lease_lost = true return { status = 200, body = "paid" } end)
    local out = h:run({})
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("lease lost: request aborted", 1, true))
    assert.is_nil(h.steps.ask)
  end)
end)

describe("leash.testing clock, enqueue, json", function()
  it("leash.now reads the settable clock; leash.sleep advances it", function()
    local h = script("local t0 = leash.now() leash.sleep(1.5) leash.sleep(2) return leash.ok({ d = leash.now() - t0 })")
    h.clock = 100
    assert.equal(3.5, h:run({}).result.d)
    assert.equal(103.5, h.clock)
    assert.equal(3.5, h.slept)
    assert.equal("retry", script("leash.sleep(-1)"):run({}).status)
  end)

  it("records child tasks with the parent's tenant and batch as defaults", function()
    local h = script([[
      local a = leash.enqueue{ payload = { n = 1 } }
      local b = leash.enqueue{ payload = { n = 2 }, tenant_id = "other", shard_key = "s", delay = 5 }
      return leash.ok({ a = a, b = b })]])
    local out = h:run({ id = 7, tenant_id = "acme", batch = "nightly" })
    assert.equal(2, #h.enqueued)
    assert.equal(out.result.a, h.enqueued[1].id)
    assert.same({ id = out.result.a, payload = { n = 1 }, tenant_id = "acme", batch = "nightly",
                  shard_key = "task:" .. out.result.a }, h.enqueued[1])
    assert.equal("other", h.enqueued[2].tenant_id)
    assert.equal("s", h.enqueued[2].shard_key)
    assert.equal("retry", script("leash.enqueue{ shard_key = 'x' }"):run({}).status)   -- no payload
  end)

  it("encodes JSON by the host's rules", function()
    local j = testing.json
    assert.equal('{"a":1,"b":[true,null],"c":{},"d":[],"e":0.5,"f":2.0}',
                 j.encode({ f = 2.0, e = 0.5, d = j.array(), c = {}, b = { true, testing.null }, a = 1 }))
    assert.has_error(function() j.encode({ 1, 2, x = 3 }) end)
    assert.has_error(function() j.encode({ [1] = 1, [3] = 3 }) end)
    assert.has_error(function() j.encode({ x = 0 / 0 }) end)
    local cyc = {}
    cyc.self = cyc
    assert.has_error(function() j.encode(cyc) end)
    local v = j.decode('{"a":null,"b":[],"n":3,"f":3.0}')
    assert.equal(testing.null, v.a)
    assert.equal("[]", j.encode(v.b))
    assert.equal("integer", math.type(v.n))
    assert.equal("float", math.type(v.f))
    local bad, err = j.decode("{nope")
    assert.is_nil(bad)
    assert.truthy(err:find("json.decode", 1, true))
  end)
end)

-- The cause is the host's last_cause (src/lifecycle.c's names), so a spec can tell a script's
-- own retry from a raised error or a broken answer; tests/integration/lifecycle.sh checks the
-- same scripts against the rows the host writes.
describe("leash.testing causes and the lifecycle policy", function()
  local cases = {
    { "returns nothing", "return", "done", "none" },
    { "returns leash.ok(result)", "return leash.ok({ n = 1 })", "done", "none" },
    { "returns false, msg", "return false, 'no'", "retry", "returned" },
    { "returns false alone", "return false", "retry", "returned" },
    { "returns nil, msg", "return nil, 'no'", "retry", "returned" },
    { "returns leash.retry(msg)", "return leash.retry('later')", "retry", "returned" },
    { "returns leash.retry(msg, delay)", "return leash.retry('later', 5)", "retry", "returned" },
    { "returns leash.fatal(msg)", "return leash.fatal('never')", "dead", "returned" },
    { "raises a string", "error('boom')", "retry", "script_error" },
    { "raises a table", "error({})", "retry", "script_error" },
    { "calls leash.retry with a NaN delay", "local r = leash.retry('x', 0/0) return r", "retry",
      "script_error" },
    { "sets a negative delay by hand", "local r = leash.retry('x') r.delay = -1 return r", "retry",
      "contract" },
    { "returns a wrong type", "return 42", "retry", "contract" },
    { "returns a result JSON cannot hold", "return leash.ok({ f = print })", "retry", "contract" },
    { "returns an answer whose message cannot be read",
      "return nil, setmetatable({}, { __tostring = function() return {} end })", "retry", "contract" },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. " -> " .. c[3] .. ", cause " .. c[4], function()
      local out = script(c[2]):run({ attempt = 1, max_attempts = 8 })
      assert.equal(c[3], out.status)
      assert.equal(c[4], out.cause)
    end)
  end

  it("names a result over max_result_bytes a memory cause", function()
    local out = script("return leash.ok({ s = string.rep('x', 100) })", { max_result_bytes = 50 })
      :run({})
    assert.equal("retry", out.status)
    assert.equal("memory", out.cause)
  end)

  it("computes the backoff least(3600, 2^attempt) for a retry without a delay", function()
    assert.equal(2, testing.backoff(1))
    assert.equal(2048, testing.backoff(11))
    assert.equal(3600, testing.backoff(12))
    assert.equal(3600, testing.BACKOFF_CAP)
    local h = script("return leash.retry('x')")
    assert.equal(32, h:run({ attempt = 5 }).backoff)
    local delayed = script("return leash.retry('x', 7)"):run({ attempt = 5 })
    assert.equal(7, delayed.delay)
    assert.is_nil(delayed.backoff)
  end)

  it("makes a retry on the last attempt dead, exhausted, keeping its cause", function()
    assert.equal(8, testing.DEFAULT_MAX_ATTEMPTS)
    local h = script("error('boom')")
    local before = h:run({ attempt = testing.DEFAULT_MAX_ATTEMPTS - 1 })
    assert.equal("retry", before.status)
    assert.is_nil(before.exhausted)
    local last = h:run({ attempt = testing.DEFAULT_MAX_ATTEMPTS })
    assert.equal("dead", last.status)
    assert.is_true(last.exhausted)
    assert.equal("script_error", last.cause)
    local fatal = script("return leash.fatal('x')"):run({ attempt = 1 })
    assert.is_nil(fatal.exhausted)
  end)

  it("settles through the backoff: the clock moves by 2 + 4 + ... until exhausted", function()
    local h = script("return leash.retry('x')")
    local start = h.clock
    local out = h:settle({ max_attempts = 4 })
    assert.equal("dead", out.status)
    assert.equal(4, #out.history)
    assert.equal(start + 2 + 4 + 8, h.clock)
  end)

  it("words JSON errors as the host does: what, then the path", function()
    local ok, err = pcall(testing.json.encode, { a = { 1, { f = print } } })
    assert.is_false(ok)
    assert.equal("cannot encode a function at $.a[2].f", err)
    ok, err = pcall(testing.json.encode, { ["two words"] = { 1, x = 2 } })
    assert.equal('cannot encode table key "x" at $["two words"]: the table mixes integer and string keys', err)
    ok, err = pcall(testing.json.encode, { [1] = 1, [3] = 3 })
    assert.equal("cannot encode table key 3 at $: keys must be exactly 1..n, but only 2 of 1..3 are present", err)
  end)
end)

describe("leash.testing results the database refuses", function()
  it("makes a result holding NUL a contract retry, as jsonb refuses \\u0000", function()
    local out = script("return leash.ok({ s = 'a\\0b' })"):run({})
    assert.equal("retry", out.status)
    assert.equal("contract", out.cause)
    assert.truthy(out.error:find("result cannot be stored", 1, true), out.error)
    assert.equal("done", script("return leash.ok({ s = 'a\\\\u0000b' })"):run({}).status)
  end)
end)
