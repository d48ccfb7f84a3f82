local testing = require "leash.testing"

local function chat(content)
  return { status = 200, body = testing.json.encode { choices = { { message = { content = content } } } } }
end

describe("retry_after.lua", function()
  local h
  before_each(function()
    h = testing.load("examples/patterns/retry_after.lua", { env = { LLM_URL = "http://llm.test" } })
  end)

  it("waits what Retry-After says, and stores nothing until the answer", function()
    local answers = { { status = 429, headers = { ["Retry-After"] = "17" } }, chat("hi") }
    h.http:on("POST", "/v1/chat/completions", function() return table.remove(answers, 1) end)
    local out = h:run { payload = { prompt = "hello" } }
    assert.equal("retry", out.status)
    assert.equal(17, out.delay)
    assert.is_nil(h.steps.ask)
    out = h:run { payload = { prompt = "hello" }, attempt = 2 }
    assert.equal("done", out.status)
    assert.equal("hi", out.result.answer)
  end)

  it("takes the backoff when a 503 names no delay", function()
    h.http:on("/v1/chat/completions", { status = 503 })
    local out = h:run { payload = { prompt = "hello" } }
    assert.equal("retry", out.status)
    assert.is_nil(out.delay)
    assert.equal(testing.backoff(1), out.backoff)
  end)

  it("gives up at once when the upstream refuses the request", function()
    h.http:on("/v1/chat/completions", { status = 400 })
    assert.equal("dead", h:run({ payload = { prompt = "hello" } }).status)
  end)

  it("lets a lost lease raise instead of turning it into a retry of its own", function()
    h.http:on("/v1/chat/completions", function() h.lease_lost = true; return chat("late") end)
    local out = h:run { payload = { prompt = "hello" } }
    assert.equal("script_error", out.cause)
    assert.truthy(out.error:find("lease lost", 1, true))
  end)
end)
