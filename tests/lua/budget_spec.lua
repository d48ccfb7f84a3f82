-- leash.testing's budget fakes: a script author tests a 429 path and a paused budget under
-- plain busted, and gets the outcome the host would give (out.cause "budget", the delay the
-- provider asked for), no attempt's worth of retry logic of their own needed.
local testing = require "leash.testing"

local function script(body, opts)
  return testing.load_string("local leash = require 'leash'\nreturn function(task)\n"
                             .. body .. "\nend", opts)
end

local CALL = [[
  local r = leash.http.request{url = "https://llm.test/v1/chat", body = "{}", budget = "openai", tokens = 10}
  return leash.ok{status = r.status}
]]

describe("leash.testing budgets", function()
  it("a 429 on a budgeted call pauses the budget and is sent again after Retry-After", function()
    local h = script(CALL)
    local n = 0
    h.http:on("POST", "/v1/chat", function()
      n = n + 1
      if n == 1 then return { status = 429, headers = { ["Retry-After"] = "2" } } end
      return { status = 200, body = "{}" }
    end)
    local t0 = h.clock
    local out = h:run({})
    assert.equal("done", out.status)
    assert.same({ status = 200 }, out.result)
    assert.equal(2, #h.http.calls)
    assert.equal(t0 + 2, h.clock)
    assert.equal(1, h.budgets.openai.refused)
  end)

  it("four refusals in a row yield the task with the provider's delay", function()
    local h = script(CALL)
    h.http:on("POST", "/v1/chat", { status = 429, headers = { ["retry-after"] = "1" } })
    local out = h:run({})
    assert.equal("snooze", out.status)
    assert.equal("budget", out.cause)
    assert.equal(1, out.delay)
    assert.equal(4, #h.http.calls)
    assert.truthy(out.error:find("budget 'openai' paused", 1, true))
  end)

  it("a refusal asking for longer than budget_wait yields at once", function()
    local h = script(CALL, { budget_wait = 10 })
    h.http:on("POST", "/v1/chat", { status = 503, headers = { ["retry-after"] = "60" } })
    local out = h:run({})
    assert.equal("budget", out.cause)
    assert.equal(60, out.delay)
    assert.equal(1, #h.http.calls)
  end)

  it("a script's pcall cannot swallow the yield", function()
    local h = script([[
      local ok = pcall(leash.http.request, {url = "https://llm.test/v1/chat", budget = "openai"})
      return leash.ok{swallowed = not ok}
    ]])
    h.http:on("/v1/chat", { status = 429, headers = { ["retry-after"] = "120" } })
    local out = h:run({})
    assert.equal("snooze", out.status)
    assert.equal("budget", out.cause)
  end)

  it("a paused budget waits in the slot when the pause ends soon, else yields", function()
    local h = script(CALL)
    h.http:on("/v1/chat", { status = 200, body = "{}" })
    h.budgets.openai = { paused_until = h.clock + 5 }
    local t0 = h.clock
    assert.equal("done", h:run({}).status)
    assert.equal(t0 + 5, h.clock)
    h.budgets.openai = { paused_until = h.clock + 300, pause_reason = "outage" }
    local out = h:run({})
    assert.equal("budget", out.cause)
    assert.equal(300, out.delay)
  end)

  it("hold, pause and usage behave as the host's", function()
    local h = script([[
      local r = leash.budget.hold("anthropic", {tokens = 500}, function(x)
        local a = leash.http.request{url = "https://llm.test/v1/messages", budget = "anthropic"}
        leash.usage{input_tokens = 120, output_tokens = 30}
        return a.status + x
      end, 1)
      leash.budget.pause("anthropic", 30, "quota")
      return leash.ok{r = r}
    ]])
    h.http:on("/v1/messages", { status = 200, body = "{}" })
    local out = h:run({})
    assert.equal("done", out.status)
    assert.same({ r = 201 }, out.result)
    assert.equal(150, h.budgets.anthropic.tokens)
    assert.equal(h.clock + 30, h.budgets.anthropic.paused_until)
  end)

  it("bad budget arguments raise like the host's", function()
    for _, body in ipairs({
      [[leash.http.request{url = "https://x", budget = ""}]],
      [[leash.http.request{url = "https://x", budget = "a\nb"}]],
      [[leash.http.request{url = "https://x", budget = "b", tokens = -1}]],
      [[leash.budget.pause("b", 0/0)]],
      [[leash.budget.hold("b", {}, 5)]],
      [[leash.usage{tokens = 1}]],
    }) do
      local out = script(body .. "\nreturn leash.ok()"):run({})
      assert.equal("script_error", out.cause, body)
    end
  end)
end)
