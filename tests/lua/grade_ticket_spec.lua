-- scripts/grade_ticket.lua under leash.testing: no host, no database, no network.
local testing = require "leash.testing"
local json = testing.json

-- An OpenAI-like chat answer whose message content is `content` (a table is encoded).
local function chat(content, status, headers)
  if type(content) == "table" then content = json.encode(content) end
  return { status = status or 200, headers = headers,
           body = json.encode({ choices = { { message = { role = "assistant", content = content } } },
                                usage = { prompt_tokens = 30, completion_tokens = 12 } }) }
end

describe("grade_ticket.lua", function()
  local h, answers, graded
  before_each(function()
    h = testing.load("scripts/grade_ticket.lua")
    graded = {}
    h.db:on("FROM tickets WHERE id = $1", function(_, id)
      if id == 42 then return { { id = 42, subject = "Printer", body = "It prints only blank pages." } } end
      return {}
    end)
    h.db:on("INSERT INTO ticket_grades", function(_, id, grade, reason, by)
      graded[#graded + 1] = { id = id, grade = grade, reason = reason, by = by }
      return {}, 1
    end)
    -- answers: the responses the endpoint gives, one per request, in order
    answers = {}
    h.http:on("POST", "/v1/chat/completions", function()
      local a = table.remove(answers, 1)
      assert(a, "more requests than answers")
      if type(a) == "function" then return a() end
      return a
    end)
  end)

  local function run(attempt, payload)
    return h:run({ payload = payload or { ticket_id = 42 }, attempt = attempt or 1 })
  end

  it("grades the ticket, stores it with an upsert and returns the grade", function()
    answers = { chat({ grade = 4, reason = "clear enough" }) }
    local out = run()
    assert.equal("done", out.status)
    assert.same({ grade = 4 }, out.result)
    assert.same({ { id = 42, grade = 4, reason = "clear enough", by = "mock-grader" } }, graded)
    assert.truthy(h.db:find("ON CONFLICT (ticket_id) DO UPDATE")[1])
    local req = h.http.calls[1]
    assert.equal("http://127.0.0.1:8089/v1/chat/completions", req.url)
    assert.equal("application/json", req.headers["Content-Type"])
    local sent = json.decode(req.body)
    assert.equal("mock-grader", sent.model)
    assert.truthy(sent.messages[1].content:find("grade", 1, true))
    assert.truthy(sent.messages[2].content:find("It prints only blank pages.", 1, true))
    assert.truthy(sent.messages[2].content:find("Subject: Printer", 1, true))
  end)

  it("uses payload.llm_url and payload.model", function()
    h.http:on("POST", "http://llm.internal/chat", chat({ grade = 2, reason = "r" }))
    local out = run(1, { ticket_id = 42, llm_url = "http://llm.internal/chat", model = "g-2" })
    assert.equal("done", out.status)
    assert.equal("http://llm.internal/chat", h.http.calls[1].url)
    assert.equal("g-2", json.decode(h.http.calls[1].body).model)
    assert.equal("g-2", graded[1].by)
  end)

  it("accepts a grade sent as 3.0 and stores it as the integer 3", function()
    answers = { chat('{"grade": 3.0, "reason": "ok"}') }
    assert.equal("done", run().status)
    assert.equal("integer", math.type(graded[1].grade))
  end)

  it("is fatal for a missing ticket, without calling the model", function()
    local out = run(1, { ticket_id = 7 })
    assert.equal("dead", out.status)
    assert.equal("ticket 7 not found", out.error)
    assert.equal(0, #h.http.calls)
  end)

  it("is fatal for a payload without an integer ticket_id", function()
    for _, p in ipairs({ {}, { ticket_id = "42" }, { ticket_id = 4.5 } }) do
      local out = run(1, p)
      assert.equal("dead", out.status)
      assert.equal(0, #h.db.calls)
    end
  end)

  it("snoozes a 429 for the server's Retry-After, paying nothing and storing no step", function()
    answers = { chat("", 429, { ["Retry-After"] = "7" }) }
    local out = run()
    assert.equal("snooze", out.status)
    assert.equal(7, out.delay)
    assert.truthy(out.error:find("429", 1, true))
    assert.is_nil(h.steps.grade)
    assert.equal(0, #graded)
  end)

  it("snoozes a 429 without Retry-After for 5 s", function()
    answers = { { status = 429, body = "slow down" } }
    local out = run()
    assert.equal("snooze", out.status)
    assert.equal(5, out.delay)
  end)

  it("retries a 5xx", function()
    answers = { { status = 503, body = "overloaded" } }
    local out = run()
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("server error (503)", 1, true))
    assert.is_nil(h.steps.grade)
  end)

  it("retries a transport error (the request raises)", function()
    answers = { function() error("leash.http.request: Couldn't connect to server (POST http://127.0.0.1:8089)", 0) end }
    local out = run()
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("Couldn't connect", 1, true))
    assert.is_nil(h.steps.grade)
  end)

  it("is fatal when the endpoint refuses the request (4xx)", function()
    answers = { { status = 400, body = '{"error":"bad model"}' } }
    local out = run()
    assert.equal("dead", out.status)
    assert.truthy(out.error:find("request refused (400)", 1, true))
  end)

  it("retries an answer that is not JSON, and gives up on the 3rd attempt", function()
    answers = { chat("Sure! The grade is 4."), chat("Sure! The grade is 4."), chat("I think 4") }
    local first = run(1)
    assert.equal("retry", first.status)
    assert.truthy(first.error:find("not a JSON object", 1, true))
    assert.equal("retry", run(2).status)
    local third = run(3)
    assert.equal("dead", third.status)
    assert.truthy(third.error:find("model answer not JSON after 3 attempts", 1, true), third.error)
    assert.equal(0, #graded)
    assert.is_nil(h.steps.grade)
  end)

  it("retries a grade outside 1..5 and gives up on it on the 3rd attempt", function()
    answers = { chat({ grade = 9, reason = "x" }), chat({ grade = 0 }), chat({ reason = "no grade" }) }
    local out = run(1)
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("grade must be an integer 1..5, got 9", 1, true))
    assert.equal("retry", run(2).status)
    out = run(3)
    assert.equal("dead", out.status)
    assert.truthy(out.error:find("model answer unusable after 3 attempts", 1, true))
  end)

  it("retries a body that is not JSON at all", function()
    answers = { { status = 200, body = "<html>gateway</html>" } }
    local out = run(5)
    assert.equal("retry", out.status)   -- not the model's fault: no attempt limit of its own
    assert.truthy(out.error:find("response body is not a JSON object", 1, true))
  end)

  it("does not pay twice: an attempt after a failed INSERT reuses the stored grade", function()
    answers = { chat({ grade = 5, reason = "excellent" }) }
    local inserts = 0
    h.db.handlers = {}
    h.db:on("FROM tickets", { { id = 42, subject = "s", body = "b" } })
    h.db:on("INSERT INTO ticket_grades", function(_, _, grade)
      inserts = inserts + 1
      if inserts == 1 then error("leash.db.query: could not serialize access", 0) end
      graded[#graded + 1] = grade
      return {}, 1
    end)
    assert.equal("retry", run(1).status)
    assert.same({ grade = 5, reason = "excellent", model = "mock-grader",
                  prompt_tokens = 30, completion_tokens = 12 }, h.steps.grade.value)
    local out = run(2)
    assert.equal("done", out.status)
    assert.equal(1, #h.http.calls)        -- the model was asked once across two attempts
    assert.equal(1, h.step_runs.grade)
    assert.same({ 5 }, graded)
  end)

  it("pays again after a failed call (a failure is never stored)", function()
    answers = { { status = 500 }, chat("not json"), chat({ grade = 1, reason = "vague" }) }
    local out = h:settle({ payload = { ticket_id = 42 } })
    assert.equal("done", out.status)
    assert.equal(3, out.attempt)
    assert.equal(3, #h.http.calls)
    assert.same({ grade = 1 }, out.result)
  end)

  it("settles through a 429 and a 5xx, waiting the server's Retry-After", function()
    answers = { chat("", 429, { ["Retry-After"] = "1" }), { status = 502 }, chat({ grade = 2, reason = "r" }) }
    local t0 = h.clock
    local out = h:settle({ payload = { ticket_id = 42 } })
    assert.equal("done", out.status)
    assert.same({ "snooze", "retry", "done" },
                { out.history[1].status, out.history[2].status, out.history[3].status })
    assert.equal(2, out.attempt)          -- the 429 spent no attempt
    assert.equal(t0 + 1 + 2, h.clock)    -- Retry-After 1, then the backoff 2^1
  end)

  it("writes nothing when the lease is lost during the call", function()
    answers = { function() h.lease_lost = true return chat({ grade = 3, reason = "r" }) end }
    local out = run()
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("lease lost", 1, true))
    assert.is_nil(h.steps.grade)
    assert.equal(0, #graded)
  end)
end)
