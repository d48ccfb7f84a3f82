-- scripts/summarize_chunks.lua under leash.testing (no host, no database): the map step,
-- the fan-in that enqueues one reduce, and the reduce.
local testing = require "leash.testing"
local json = testing.json

local SCRIPT = "scripts/summarize_chunks.lua"

-- A fake of the two tables, shared by several harnesses (one harness = one task, since
-- steps belong to a task).
local function new_store()
  local store = { chunks = {}, docs = {} }
  function store.attach(h)
    h.db:on("INSERT INTO chunk_summaries", function(_, doc, chunk, summary, worker)
      store.chunks[doc] = store.chunks[doc] or {}
      store.chunks[doc][chunk] = { summary = summary, worker = worker }
      return {}, 1
    end)
    h.db:on("SELECT count(*) AS stored FROM chunk_summaries", function(_, doc)
      local n = 0
      for _ in pairs(store.chunks[doc] or {}) do n = n + 1 end
      return { { stored = n } }
    end)
    h.db:on("SELECT chunk, summary FROM chunk_summaries", function(_, doc)
      local rows = {}
      for chunk, r in pairs(store.chunks[doc] or {}) do rows[#rows + 1] = { chunk = chunk, summary = r.summary } end
      table.sort(rows, function(a, b) return a.chunk < b.chunk end)
      return rows
    end)
    h.db:on("INSERT INTO doc_summaries", function(_, doc, summary, n)
      store.docs[doc] = { summary = summary, chunks = n, writes = (store.docs[doc] and store.docs[doc].writes or 0) + 1 }
      return {}, 1
    end)
    return h
  end
  return store
end

local function map_task(doc, chunk, chunks, extra)
  local p = { doc = doc, chunk = chunk, chunks = chunks, text = ("chunk %d of %s: alpha beta gamma delta epsilon zeta eta theta iota"):format(chunk, doc) }
  for k, v in pairs(extra or {}) do p[k] = v end
  return { payload = p, shard_key = doc, tenant_id = "acme", batch = "nightly", attempt = 2 }
end

describe("summarize_chunks.lua map", function()
  local store, h
  before_each(function()
    store = new_store()
    h = store.attach(testing.load(SCRIPT))
  end)

  it("stores an eight-word summary and succeeds", function()
    local out = h:run({ payload = { doc = "d1", chunk = 101, text = "one two three four five six seven eight nine" } })
    assert.equal("done", out.status)
    assert.same({ words = 9 }, out.result)   -- eight words and the ellipsis
    assert.equal("one two three four five six seven eight …", store.chunks.d1[101].summary)
    assert.equal(1, #h.db.calls)              -- no chunks in the payload: no fan-in check
    assert.equal(0, #h.enqueued)
  end)

  it("keeps a short text whole", function()
    h:run({ payload = { doc = "d1", chunk = 1, text = "just three words" } })
    assert.equal("just three words", store.chunks.d1[1].summary)
  end)

  it("retries the simulated flaky chunk on its first attempt only", function()
    local first = h:run({ payload = { doc = "d1", chunk = 103, text = "x" }, attempt = 1 })
    assert.equal("retry", first.status)
    assert.equal(1, first.delay)
    assert.equal(0, #h.db.calls)
    local second = h:run({ payload = { doc = "d1", chunk = 103, text = "x" }, attempt = 2 })
    assert.equal("done", second.status)
  end)

  it("is fatal for a bad payload", function()
    for _, p in ipairs({ { doc = "d1", chunk = 1 }, { chunk = 1, text = "t" }, { doc = "d1", chunk = "1", text = "t" },
                         { doc = "d1", chunk = 1, text = "t", chunks = 0 }, { doc = "", chunk = 1, text = "t" } }) do
      assert.equal("dead", h:run({ payload = p }).status)
    end
    assert.equal(0, #h.db.calls)
  end)

  it("does not enqueue the reduce while chunks are missing", function()
    local out = h:run(map_task("d1", 1, 3))
    assert.equal("done", out.status)
    assert.is_nil(out.result.reduce_task)
    assert.equal(0, #h.enqueued)
    assert.equal(1, #h.db:find("SELECT count(*)"))
  end)

  it("enqueues one reduce on the document's shard once every chunk is stored", function()
    store.chunks.d1 = { [1] = { summary = "a" }, [2] = { summary = "b" } }
    local out = h:run(map_task("d1", 3, 3))
    assert.equal("done", out.status)
    assert.equal(1, #h.enqueued)
    local child = h.enqueued[1]
    assert.same({ doc = "d1", reduce = true, chunks = 3 }, child.payload)
    assert.equal("d1", child.shard_key)
    assert.equal("acme", child.tenant_id)
    assert.equal("nightly", child.batch)
    assert.equal(child.id, out.result.reduce_task)
  end)

  it("does not enqueue a second reduce when the last map task is retried", function()
    store.chunks.d1 = { [1] = { summary = "a" } }
    local n = 0
    -- the first attempt enqueues, then its lease is lost before the step is stored
    local real = h.leash.enqueue
    h.leash.enqueue = function(c) n = n + 1 local id = real(c) h.lease_lost = (n == 1) return id end
    local first = h:run(map_task("d1", 2, 2))
    assert.equal("retry", first.status)      -- lease lost: the step result was not stored…
    assert.is_nil(h.steps.reduce)
    h.lease_lost = false
    local second = h:run(map_task("d1", 2, 2))
    assert.equal("done", second.status)
    -- …so the next holder enqueues again (at-least-once), and a third run does not:
    local third = h:run(map_task("d1", 2, 2))
    assert.equal("done", third.status)
    assert.equal(2, n)
    assert.equal(second.result.reduce_task, third.result.reduce_task)
  end)

  it("warns when map tasks do not share the document's shard key", function()
    local t = map_task("d1", 1, 2)
    t.shard_key = "task:9"
    h:run(t)
    assert.equal("warn", h.logs[1].level)
  end)
end)

describe("summarize_chunks.lua fan-out and reduce", function()
  it("whatever order the chunks run in, exactly the last one enqueues the reduce", function()
    for _, order in ipairs({ { 1, 2, 3, 4, 5, 6 }, { 6, 5, 4, 3, 2, 1 }, { 3, 1, 6, 2, 5, 4 } }) do
      local store = new_store()
      local reduces = {}
      for i, chunk in ipairs(order) do
        local h = store.attach(testing.load(SCRIPT))
        local out = h:settle(map_task("doc", chunk, 6))
        assert.equal("done", out.status)
        for _, c in ipairs(h.enqueued) do reduces[#reduces + 1] = { after = i, task = c } end
      end
      assert.equal(1, #reduces)
      assert.equal(6, reduces[1].after)

      -- the reduce task concatenates the summaries in chunk order
      local r = store.attach(testing.load(SCRIPT))
      local task = reduces[1].task
      local out = r:run({ payload = task.payload, shard_key = task.shard_key })
      assert.equal("done", out.status)
      assert.same({ chunks = 6 }, out.result)
      local lines = {}
      for line in store.docs.doc.summary:gmatch("[^\n]+") do lines[#lines + 1] = line end
      assert.equal(6, #lines)
      for i, line in ipairs(lines) do
        assert.equal(("chunk %d of doc: alpha beta gamma delta …"):format(i), line)
      end
      assert.equal(6, store.docs.doc.chunks)
      -- a second delivery of the reduce rewrites the same row
      assert.equal("done", r:run({ payload = task.payload }).status)
      assert.equal(2, store.docs.doc.writes)
    end
  end)

  it("the reduce waits when chunk summaries are missing, and is fatal when there are none", function()
    local store = new_store()
    local h = store.attach(testing.load(SCRIPT))
    store.chunks.d = { [1] = { summary = "a" } }
    local out = h:run({ payload = { doc = "d", reduce = true, chunks = 2 } })
    assert.equal("retry", out.status)
    assert.equal(5, out.delay)
    assert.is_nil(store.docs.d)
    out = h:run({ payload = { doc = "empty", reduce = true, chunks = 2 } })
    assert.equal("dead", out.status)
  end)
end)

describe("summarize_chunks.lua document: a wait for its chunks", function()
  local texts = { "one two three", "four five six", "seven eight nine" }

  it("enqueues one child per text on shards of their own, then waits for them", function()
    local h = new_store().attach(testing.load(SCRIPT))
    local out = h:run({ payload = { doc = "d", texts = texts }, shard_key = "d" })
    assert.same({ "wait", "waiting" }, { out.status, out.cause })
    assert.same({ reason = "children", deadline = 3600, on_deadline = "retry" }, out.wait)
    assert.equal(3, #h.enqueued)
    for i, c in ipairs(h.enqueued) do
      assert.same({ doc = "d", chunk = i, text = texts[i] }, c.payload)
      assert.equal("d#" .. i, c.shard_key)
    end
  end)

  it("resumed, reduces what its children stored and enqueues nothing again", function()
    local store = new_store()
    local h = store.attach(testing.load(SCRIPT))
    local task = { payload = { doc = "d", texts = texts }, shard_key = "d" }
    h:run(task)
    for i, c in ipairs(h.enqueued) do
      -- attempt 2: the stand-in fails chunk 3's first attempt (a simulated flaky upstream)
      assert.equal("done", store.attach(testing.load(SCRIPT)):run({ payload = c.payload, attempt = 2 }).status, i)
    end
    h.waited = { reason = "children", expired = false,
                 tasks = { { id = 2, status = "done" }, { id = 3, status = "done" },
                           { id = 4, status = "done" } } }
    local out = h:run(task)
    assert.equal("done", out.status)
    assert.same({ chunks = 3 }, out.result)
    assert.equal("one two three\nfour five six\nseven eight nine", store.docs.d.summary)
    assert.equal(3, #h.enqueued)   -- the fan-out step was given back, not run again
  end)

  it("is fatal when a child died, and waits once more past its deadline", function()
    local h = new_store().attach(testing.load(SCRIPT))
    local task = { payload = { doc = "d", texts = texts }, attempt = 1 }
    h:run(task)
    h.waited = { reason = "children", expired = false,
                 tasks = { { id = 2, status = "done" }, { id = 3, status = "dead" } } }
    local out = h:run(task)
    assert.equal("dead", out.status)
    assert.truthy(out.error:find("1 of 2 chunks failed", 1, true), out.error)
    h.waited = { reason = "children", expired = true, tasks = { { id = 2, status = "pending" } } }
    assert.equal("wait", h:run(task).status)
    task.attempt = 2
    out = h:run(task)
    assert.equal("dead", out.status)
    assert.truthy(out.error:find("within the wait's deadline twice", 1, true), out.error)
  end)

  it("refuses a bad texts list by class", function()
    local h = new_store().attach(testing.load(SCRIPT))
    for _, bad in ipairs({ {}, "text", { 1, 2 }, { "a", false } }) do
      local out = h:run({ payload = { doc = "d", texts = bad } })
      assert.equal("dead", out.status)
      assert.truthy(out.error:find("payload.texts", 1, true), out.error)
    end
  end)
end)

describe("summarize_chunks.lua with an LLM endpoint", function()
  local URL = "http://127.0.0.1:9999/v1/chat/completions"
  local store, h, answers
  local function chat(content, status, headers)
    if type(content) == "table" then content = json.encode(content) end
    return { status = status or 200, headers = headers,
             body = json.encode({ choices = { { message = { content = content } } } }) }
  end
  before_each(function()
    store = new_store()
    h = store.attach(testing.load(SCRIPT))
    answers = {}
    h.http:on("POST", URL, function() return assert(table.remove(answers, 1), "unexpected request") end)
  end)

  it("stores the model's summary (no simulated flakiness)", function()
    answers = { chat({ summary = "A short summary." }) }
    local out = h:run(map_task("d", 3, nil, { llm_url = URL }))
    assert.equal("done", out.status)
    assert.equal("A short summary.", store.chunks.d[3].summary)
    local sent = json.decode(h.http.calls[1].body)
    assert.equal("chunk 3 of d: alpha beta gamma delta epsilon zeta eta theta iota", sent.messages[2].content)
  end)

  it("snoozes a 429 for the server's delay and retries a 5xx with the backoff", function()
    answers = { chat("", 429, { ["Retry-After"] = "2" }), { status = 500 } }
    local out = h:run(map_task("d", 1, nil, { llm_url = URL }))
    assert.equal("snooze", out.status)
    assert.equal(2, out.delay)
    out = h:run(map_task("d", 1, nil, { llm_url = URL }))
    assert.equal("retry", out.status)
    assert.is_nil(out.delay)
    assert.is_nil(store.chunks.d)
  end)

  it("retries an answer without a summary, and gives up on the 3rd attempt", function()
    answers = { chat("no json"), chat({ text = "wrong field" }) }
    local t = map_task("d", 1, nil, { llm_url = URL })
    t.attempt = 1
    assert.equal("retry", h:run(t).status)
    t.attempt = 3
    local out = h:run(t)
    assert.equal("dead", out.status)
    assert.truthy(out.error:find("no summary", 1, true))
  end)

  it("does not pay twice when the INSERT fails after the call", function()
    answers = { chat({ summary = "paid once" }) }
    local fail = true
    h.db.handlers = {}
    h.db:on("INSERT INTO chunk_summaries", function(_, _, _, summary)
      if fail then fail = false error("leash.db.query: deadlock detected", 0) end
      store.chunks.d = { [1] = { summary = summary } }
      return {}, 1
    end)
    assert.equal("retry", h:run(map_task("d", 1, nil, { llm_url = URL })).status)
    assert.equal("done", h:run(map_task("d", 1, nil, { llm_url = URL })).status)
    assert.equal(1, #h.http.calls)
    assert.equal("paid once", store.chunks.d[1].summary)
  end)
end)
