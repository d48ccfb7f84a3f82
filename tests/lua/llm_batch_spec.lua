-- leash.testing's leash.llm.batch (issue #19, item 2): the host's checks, the wait that ends
-- the first execution, the answer handed out once, and grade_ticket.lua's --batch-api mode.
-- tests/integration/llm_batch.sh runs the same against the real host and the mock.
local testing = require "leash.testing"
local json = testing.json

local function script(body)
  return testing.load_string("local leash = require 'leash'\nreturn function(task)\n"
                             .. body .. "\nend")
end

local ASK = [[
  local a = leash.step("ask", function()
    return leash.llm.batch{ provider = "openai", request = { model = "m", messages = {} } }
  end)
  return leash.ok{ content = a.choices[1].message.content }]]

local function answer(content)
  return { choices = { { message = { role = "assistant", content = content } } },
           usage = { prompt_tokens = 3, completion_tokens = 4 } }
end

describe("leash.testing llm.batch", function()
  it("ends the first execution waiting on the item's event, the attempt not spent", function()
    local h = script(ASK)
    local out = h:run({ attempt = 1 })
    assert.same({ "wait", "waiting", "waiting for openai batch item 1" },
                { out.status, out.cause, out.error })
    assert.same({ reason = "event", event = "llm:1", deadline = testing.WAIT_DEADLINE,
                  on_deadline = "retry" }, out.wait)
    assert.same({ model = "m", messages = json.array({}) }, h.llm_requests[1].request)
    assert.equal("ask", h.llm_requests[1].step)
  end)

  it("returns the answer on the next execution, and the step keeps it", function()
    local h = script(ASK)
    h:run()
    h.llm_batch = function(provider, request, step)
      assert.same({ "openai", "m", "ask" }, { provider, request.model, step })
      return answer("hi")
    end
    local out = h:run()
    assert.same({ "done", "hi" }, { out.status, out.result.content })
    h.llm_batch = nil
    assert.equal("done", h:run().status)   -- the stored step, not asked again
    assert.equal(2, #h.llm_requests)
  end)

  it("cannot be kept running by a pcall around it", function()
    local out = script([[
      local ok = pcall(leash.step, "ask", function()
        return leash.llm.batch{ provider = "anthropic", request = { model = "m" } }
      end)
      return leash.ok{ caught = ok }]]):run()
    assert.equal("wait", out.status)
  end)

  it("raises the host's errors for bad calls, by class", function()
    local bad = {
      { "{ provider = 'gemini', request = {} }", 'provider must be "openai" or "anthropic"' },
      { "{ provider = 'openai' }", "request must be a table" },
      { "{ provider = 'openai', request = { 1, 2 } }", "request must be a JSON object, not a list" },
      { "{ provider = 'openai', request = {}, tries = 0 }", "tries must be an integer from 1 to 100" },
      { "{ provider = 'openai', request = {}, deadline = 0 }", "deadline must be a number of seconds from 1" },
      { "{ provider = 'openai', request = {}, fallback = 'x' }", "fallback must be a function" },
      { "{ provider = 'openai', request = {}, model = 'x' }", "unknown field model" },
    }
    for _, b in ipairs(bad) do
      local out = script("return leash.step('s', function() return leash.llm.batch" .. b[1] .. " end)"):run()
      assert.equal("retry", out.status, b[1])
      assert.truthy(out.error:find(b[2], 1, true), b[1] .. " -> " .. out.error)
    end
    local out = script("return leash.ok(leash.llm.batch{ provider = 'openai', request = {} })"):run()
    assert.truthy(out.error:find("only inside leash.step", 1, true), out.error)
    local h = script([[return leash.step("two", function()
      local a = leash.llm.batch{ provider = "openai", request = { model = "a" } }
      return { a, leash.llm.batch{ provider = "openai", request = { model = "b" } } }
    end)]])
    h.llm_batch = function() return { ok = true } end
    out = h:run()
    assert.truthy(out.error:find("one call per leash.step run", 1, true), out.error)
  end)
end)

describe("grade_ticket.lua --batch-api", function()
  it("waits for the batch, then grades from its answer without an HTTP call", function()
    local h = testing.load("scripts/grade_ticket.lua")
    local graded = {}
    h.db:on("FROM tickets WHERE id = $1", function()
      return { { id = 42, subject = "Printer", body = "Blank pages." } }
    end)
    h.db:on("INSERT INTO ticket_grades", function(_, id, grade)
      graded[#graded + 1] = { id, grade }
      return {}, 1
    end)
    local t = { payload = { ticket_id = 42, batch_api = true } }
    assert.equal("wait", h:run(t).status)
    local sent = h.llm_requests[1].request
    assert.same({ "mock-grader", 0 }, { sent.model, sent.temperature })
    assert.truthy(sent.messages[2].content:find("Blank pages.", 1, true))
    h.llm_batch = function() return answer(json.encode({ grade = 3, reason = "ok" })) end
    local out = h:run(t)
    assert.same({ "done", 3 }, { out.status, out.result.grade })
    assert.same({ { 42, 3 } }, graded)
    assert.equal(0, #h.http.calls)
  end)

  it("asks afresh after a malformed batch answer (a retry)", function()
    local h = testing.load("scripts/grade_ticket.lua")
    h.db:on("FROM tickets WHERE id = $1", function() return { { id = 42, subject = "s", body = "b" } } end)
    h.db:on("INSERT INTO ticket_grades", function() return {}, 1 end)
    h.llm_batch = function() return answer("not json") end
    local out = h:run({ payload = { ticket_id = 42, batch_api = true } })
    assert.equal("retry", out.status)
    h.llm_batch = nil
    assert.equal("wait", h:run({ payload = { ticket_id = 42, batch_api = true }, attempt = 2 }).status)
  end)
end)
