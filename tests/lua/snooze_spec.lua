-- leash.testing's snooze and backoff (issue #15, item 1): a script author's 429 path under
-- busted. The kit must say what the host does (sql/012_snooze.sql); lifecycle.sh compares
-- the two on real rows.
local testing = require "leash.testing"

local function script(body, opts)
  return testing.load_string("local leash = require 'leash'\nreturn function(task)\n"
                             .. body .. "\nend", opts)
end

describe("leash.testing snooze", function()
  it("reports a snooze with its delay and reason, the attempt not spent", function()
    local out = script("return leash.snooze(12.5, 'provider busy')"):run({ attempt = 3 })
    assert.equal("snooze", out.status)
    assert.equal("snoozed", out.cause)
    assert.equal(12.5, out.delay)
    assert.equal("provider busy", out.error)
    assert.equal(3, out.attempt)
    assert.is_nil(out.backoff)
  end)

  it("gives a snooze without a reason the reason 'snoozed'", function()
    assert.equal("snoozed", script("return leash.snooze(1)"):run().error)
  end)

  it("takes the table form of retry: spend = false is a snooze, otherwise a retry", function()
    local s = script("return leash.retry{ message = 'busy', after = 9, spend = false }"):run()
    assert.same({ "snooze", "snoozed", 9, "busy" }, { s.status, s.cause, s.delay, s.error })
    local r = script("return leash.retry{ message = 'later', after = 4 }"):run()
    assert.same({ "retry", "returned", 4, "later" }, { r.status, r.cause, r.delay, r.error })
    local b = script("return leash.retry{ message = 'later' }"):run({ attempt = 2 })
    assert.same({ "retry", 4 }, { b.status, b.backoff })
  end)

  it("raises at the call for a bad snooze delay, of every class", function()
    for _, d in ipairs({ "0/0", "math.huge", "-math.huge", "-1", "'5'", "nil", "{}" }) do
      local out = script("local o = leash.snooze(" .. d .. ", 'x') return o"):run()
      assert.equal("retry", out.status, d)
      assert.equal("script_error", out.cause, d)
      assert.truthy(out.error:find("bad argument #1 to 'snooze'", 1, true), d)
    end
  end)

  it("refuses bad table forms at the call", function()
    for body, msg in pairs({
      ["leash.retry{ spend = false }"] = "needs after = seconds",
      ["leash.retry{ after = 0/0, spend = false }"] = "after must be a finite number",
      ["leash.retry{ after = '5', spend = false }"] = "after must be a number of seconds",
      ["leash.retry{ aftr = 5, spend = false }"] = "unknown field aftr",
      ["leash.retry{ after = 5, spend = 'no' }"] = "spend must be a boolean",
    }) do
      local out = script("local o = " .. body .. " return o"):run()
      assert.equal("script_error", out.cause, body)
      assert.truthy(out.error:find(msg, 1, true), body .. ": " .. out.error)
    end
  end)

  it("makes a delay changed by hand a contract error, like the host", function()
    for d, got in pairs({ ["0/0"] = "NaN", ["-2"] = "-2", ["'x'"] = "a string", ["nil"] = "a nil" }) do
      local out = script("local o = leash.snooze(5, 'r') o.delay = " .. d .. " return o"):run()
      assert.equal("contract", out.cause, d)
      assert.equal("snooze delay must be a finite number of seconds >= 0, not " .. got
                   .. " (message: r)", out.error)
    end
  end)

  it("cuts a snooze past an hour to an hour", function()
    assert.equal(testing.MAX_DELAY, script("return leash.snooze(1e9)"):run().delay)
    assert.equal(3600, testing.MAX_DELAY)
  end)

  it("turns the snooze past max_snoozes into a retry with cause snooze_limit", function()
    local h = script("return leash.snooze(5, 'busy')")
    assert.equal("snooze", h:run({ snoozes = 2, max_snoozes = 3 }).status)
    local out = h:run({ snoozes = 3, max_snoozes = 3 })
    assert.equal("retry", out.status)
    assert.equal("snooze_limit", out.cause)
    assert.equal(5, out.delay)
    assert.equal("snooze_limit: snoozed 3 times (max_snoozes 3), so this snooze spent an attempt: busy",
                 out.error)
    local last = h:run({ snoozes = 3, max_snoozes = 3, attempt = 8 })
    assert.same({ "dead", true, "snooze_limit" }, { last.status, last.exhausted, last.cause })
    assert.equal(100, testing.DEFAULT_MAX_SNOOZES)
    assert.equal("retry", h:run({ snoozes = 100 }).status)
  end)

  it("settles through snoozes without spending attempts, moving the clock by each delay", function()
    -- two 429s with Retry-After 30, then success: attempt 1 throughout
    local h = testing.load_string([[
      local leash = require "leash"
      local calls = 0
      return function(task)
        calls = calls + 1
        if calls <= 2 then return leash.snooze(30, "429") end
        return leash.ok({ attempt = task.attempt, calls = calls })
      end]])
    local t0 = h.clock
    local out = h:settle({})
    assert.equal("done", out.status)
    assert.same({ attempt = 1, calls = 3 }, out.result)
    assert.equal(2, out.snoozes)
    assert.equal(t0 + 60, h.clock)
    -- forever snoozing: max_snoozes, then retries until dead
    local f = script("return leash.snooze(1, 'busy')"):settle({ max_snoozes = 2, max_attempts = 3 })
    assert.same({ "dead", 3, 2, "snooze_limit" }, { f.status, f.attempt, f.snoozes, f.cause })
    assert.equal(2 + 3, #f.history)
  end)
end)

describe("leash.testing backoff", function()
  it("keeps least(3600, 2^attempt) by default, with jitter bounds", function()
    assert.equal(32, testing.backoff(5))
    assert.equal(16, testing.backoff(5, { u = 1 }))            -- equal jitter: [d/2, d]
    assert.equal(0, testing.backoff(5, { jitter = 1, u = 1 }))  -- full jitter: [0, d]
    assert.equal(3600, testing.backoff(1000))                   -- no overflow past the cap
    assert.equal(0.5, testing.BACKOFF_JITTER)
    assert.equal(2, testing.BACKOFF_BASE)
    local out = script("return leash.retry('x')"):run({ attempt = 5 })
    assert.equal(32, out.backoff)
    assert.equal(16, out.backoff_min)
  end)

  it("takes the worker's base and cap from opts.backoff, the task's beating them", function()
    local h = script("return leash.retry('x')", { backoff = { base = 10, cap = 50, jitter = 0 } })
    assert.same({ 10, 10 }, { h:run({ attempt = 1 }).backoff, h:run({ attempt = 1 }).backoff_min })
    assert.equal(50, h:run({ attempt = 2 }).backoff)
    assert.equal(9, h:run({ attempt = 2, backoff_base = 3 }).backoff)
    assert.equal(7, h:run({ attempt = 2, backoff_cap = 7 }).backoff)
  end)

  it("settles with the longest wait, or the jittered one with opts.random", function()
    local body = "if task.attempt < 3 then return false, 'no' end"
    local h = script(body)
    local t0 = h.clock
    h:settle({})
    assert.equal(t0 + 2 + 4, h.clock)
    local j = script(body, { random = function() return 0.5 end })
    t0 = j.clock
    j:settle({})
    assert.equal(t0 + 1.5 + 3, j.clock)   -- d x (1 - 0.5 x 0.5)
  end)
end)
