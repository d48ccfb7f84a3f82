-- The sample script, under plain busted with leash.testing (no host, no database).
local testing = require "leash.testing"

describe("summarize_chunk.lua", function()
  local h
  before_each(function()
    h = testing.load("scripts/summarize_chunk.lua")
    h.db:on("INSERT INTO chunk_summaries", function() return {}, 1 end)
  end)

  it("stores an eight-word summary and succeeds", function()
    local out = h:run({ payload = { doc = "d1", chunk = 101, text = "one two three four five six seven eight nine" } })
    assert.equal("done", out.status)
    assert.equal(1, #h.db.calls)
    assert.equal("one two three four five six seven eight …", h.db.calls[1].params[3])
  end)

  it("retries the flaky chunk on its first attempt only", function()
    local first = h:run({ payload = { doc = "d1", chunk = 103, text = "x" }, attempt = 1 })
    assert.equal("retry", first.status)
    assert.equal(1, first.delay)
    local second = h:run({ payload = { doc = "d1", chunk = 103, text = "x" }, attempt = 2 })
    assert.equal("done", second.status)
  end)

  it("is fatal when the payload has no text", function()
    local out = h:run({ payload = { doc = "d1", chunk = 1 } })
    assert.equal("dead", out.status)
    assert.equal(0, #h.db.calls)
  end)
end)

describe("leash.testing", function()
  it("maps a raised error to a retry and exhausted attempts to dead", function()
    local h = testing.load("tests/fixtures/lua/outcomes.lua")
    local out = h:run({ payload = { kind = "error" }, attempt = 1, max_attempts = 3 })
    assert.equal("retry", out.status)
    assert.truthy(out.error:find("exploded", 1, true))
    out = h:run({ payload = { kind = "error" }, attempt = 3, max_attempts = 3 })
    assert.equal("dead", out.status)
  end)
end)

describe("leash.testing fakes", function()
  it("answers http from registered handlers and keeps steps across runs", function()
    local dir = os.tmpname()
    os.remove(dir)
    local path = dir .. ".lua"
    local f = assert(io.open(path, "w"))
    f:write([[
      local leash = require "leash"
      return function(task)
        local r = leash.step("ask", function()
          local resp = leash.http.request{ url = "http://llm.local/v1", body = "q" }
          return { status = resp.status, body = resp.body }
        end)
        if task.attempt == 1 then return leash.retry("try again") end
        leash.enqueue{ payload = { from = task.id } }
        return leash.ok(r)
      end]])
    f:close()
    local h = testing.load(path)
    h.http:on("llm.local", function() return { status = 200, body = "answer" } end)
    assert.equal("retry", h:run({ payload = {}, attempt = 1 }).status)
    local out = h:run({ payload = {}, attempt = 2 })
    os.remove(path)
    assert.equal("done", out.status)
    assert.equal("answer", out.result.body)
    assert.equal(1, #h.http.calls)        -- the step ran once across two attempts
    assert.equal(1, #h.enqueued)
  end)
end)
