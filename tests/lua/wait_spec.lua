-- leash.testing's waits (issue #19, item 1): leash.wait's checks and outcome and
-- leash.waited under busted. The kit must say what the host does (sql/019_waits.sql);
-- lifecycle.sh compares the two on real rows.
local testing = require "leash.testing"

local function script(body)
  return testing.load_string("local leash = require 'leash'\nreturn function(task)\n"
                             .. body .. "\nend")
end

describe("leash.testing wait", function()
  it("reports a wait on children with the default deadline, the attempt not spent", function()
    local out = script("return leash.wait{ children = true }"):run({ attempt = 2 })
    assert.same({ "wait", "waiting", "waiting", 2 }, { out.status, out.cause, out.error, out.attempt })
    assert.same({ reason = "children", deadline = testing.WAIT_DEADLINE, on_deadline = "retry" },
                out.wait)
  end)

  it("carries ids, clock and event waits as the host stores them", function()
    assert.same({ 4, 5 }, script("return leash.wait{ ids = { 4, 5 } }"):run().wait.ids)
    local c = script("return leash.wait{ after = 1e9 }"):run().wait
    assert.same({ "until", testing.MAX_WAIT }, { c.reason, c.after })
    local e = script("return leash.wait{ event = 'batch-7', deadline = 60, on_deadline = 'dead' }")
              :run().wait
    assert.same({ "event", "batch-7", 60, "dead" }, { e.reason, e.event, e.deadline, e.on_deadline })
  end)

  it("raises at the script's line for bad input, by class", function()
    local bad = {
      { "{ children = 'yes' }", "children must be true" },
      { "{ ids = { 1.5 } }", "ids%[1%] must be a task id" },
      { "{ ids = {} }", "ids must list 1 to 10000 task ids" },
      { "{ after = -1 }", "after must be a finite number of seconds >= 0, not %-1" },
      { "{ children = true, deadline = 0 }", "deadline must be a finite number of seconds > 0" },
      { "{ children = true, on_deadline = 'never' }", 'on_deadline must be "retry" or "dead"' },
      { "{ event = 'no spaces' }", "event must be a name of 1 to 200" },
      { "{ childs = true }", "unknown field childs" },
      { "{ children = true, after = 1 }", "give exactly one of" },
    }
    for _, b in ipairs(bad) do
      local out = script("local w = leash.wait" .. b[1] .. "\nreturn w"):run()
      assert.equal("script_error", out.cause, b[1])
      assert.truthy(out.error:find(b[2]), b[1] .. ": " .. out.error)
    end
  end)

  it("answers leash.waited from h.waited, nil by default", function()
    local h = script("local w = leash.waited()\nif not w then return leash.wait{ ids = { 9 } } end\n"
                     .. "return leash.ok({ n = #w.tasks, s = w.tasks[1].status })")
    assert.equal("wait", h:run().status)
    h.waited = { reason = "ids", expired = false, tasks = { { id = 9, status = "dead" } } }
    assert.same({ n = 1, s = "dead" }, h:run().result)
  end)
end)
