-- busted --lua=lua5.4 --lpath='./scripts/lib/?.lua' examples/first-task/grade_spec.lua
local testing = require "leash.testing"

-- What the mock LLM (or OpenAI) answers: the grade is JSON text inside the message.
local function answer(grade)
  local content = testing.json.encode { grade = grade, reason = "clear steps to reproduce" }
  return { status = 200, body = testing.json.encode { choices = { { message = { content = content } } } } }
end

describe("grade.lua", function()
  local h
  before_each(function()
    h = testing.load("examples/first-task/grade.lua", { env = { LLM_URL = "http://llm.test" } })
  end)

  it("stores the LLM's grade as the task's result", function()
    h.http:on("POST", "http://llm.test/v1/chat/completions", answer(4))
    local out = h:run { payload = { ticket = "The app crashes when I log in" } }
    assert.equal("done", out.status)
    assert.equal(4, out.result.grade)
    assert.truthy(h.http.calls[1].body:find("The app crashes", 1, true))
  end)

  it("retries a 500 and calls the LLM again only until it answers", function()
    local answers = { { status = 500 }, answer(2) }
    h.http:on("POST", "/v1/chat/completions", function() return table.remove(answers, 1) end)
    local out = h:settle { payload = { ticket = "Where is my invoice?" } }
    assert.equal("done", out.status)
    assert.equal(2, #out.history)               -- attempt 1 retried, attempt 2 done
    assert.equal("script_error", out.history[1].cause)
    assert.equal(2, #h.http.calls)
  end)

  it("gives up at once on a ticket without text", function()
    local out = h:run { payload = { ticket = 42 } }
    assert.equal("dead", out.status)
    assert.equal(0, #h.http.calls)
  end)
end)
