-- scripts/backfill_embeddings.lua under leash.testing (no host, no database): one batch per
-- task, one endpoint call per batch, one UPDATE, and the chain of follow-up tasks.
local testing = require "leash.testing"
local json = testing.json

local SCRIPT = "scripts/backfill_embeddings.lua"
local URL = "http://127.0.0.1:8089/v1/embeddings"

-- Parses the UPDATE's parameters: '{1,2}' and '{"{0.1,0.2}","{…}"}'.
local function parse_ids(lit)
  local ids = {}
  for n in lit:gmatch("%-?%d+") do ids[#ids + 1] = math.tointeger(tonumber(n)) end
  return ids
end
local function parse_vectors(lit)
  local out = {}
  for inner in lit:gmatch('"{([^}]*)}"') do
    local v = {}
    for x in inner:gmatch("[^,]+") do v[#v + 1] = tonumber(x) end
    out[#out + 1] = v
  end
  return out
end

-- A fake documents table of n rows (ids 1..n) shared by every task of a chain.
local function new_table(n)
  local t = { rows = {}, updates = 0 }
  for i = 1, n do t.rows[i] = { id = i, body = "document number " .. i } end
  function t.attach(h)
    h.db:on("WHERE embedding IS NULL ORDER BY id LIMIT $1", function(_, limit)
      local out = {}
      for _, r in ipairs(t.rows) do
        if r.embedding == nil and #out < limit then out[#out + 1] = { id = r.id, body = r.body } end
      end
      return out
    end)
    h.db:on("SET embedding = v.embedding::float8[]", function(_, ids, vecs)
      t.updates = t.updates + 1
      ids, vecs = parse_ids(ids), parse_vectors(vecs)
      assert(#ids == #vecs, "ids and vectors differ in length")
      local n = 0
      for i, id in ipairs(ids) do
        local r = t.rows[id]
        if r and r.embedding == nil then r.embedding = vecs[i] n = n + 1 end
      end
      return {}, n
    end)
    return h
  end
  return t
end

-- The endpoint: vector i of a text is {#text, i/10, …}; answers can be queued to fail.
local function vector(text) return { #text + 0.0, 0.125, -0.5, 1 / 3 } end
local function endpoint(h, failures)
  failures = failures or {}
  h.http:on("POST", "/v1/embeddings", function(req)
    local f = table.remove(failures, 1)
    if f then return f end
    local body = json.decode(req.body)
    local data = {}
    for i, s in ipairs(body.input) do data[i] = { index = i - 1, embedding = vector(s) } end
    return { status = 200, body = json.encode({ data = data }) }
  end)
end

describe("backfill_embeddings.lua", function()
  it("embeds a partial batch with one call and one UPDATE, and ends the chain", function()
    local tbl = new_table(5)
    local h = tbl.attach(testing.load(SCRIPT))
    endpoint(h)
    local out = h:run({ payload = { batch_size = 50, llm_url = URL } })
    assert.equal("done", out.status)
    assert.same({ embedded = 5 }, out.result)
    assert.equal(1, #h.http.calls)
    assert.equal(5, #json.decode(h.http.calls[1].body).input)
    assert.equal(1, tbl.updates)
    assert.equal(0, #h.enqueued)
    assert.same(vector("document number 3"), tbl.rows[3].embedding)   -- every digit survives
    assert.equal(50, h.db.calls[1].params[1])
    assert.truthy(h.db.calls[1].sql:find('FROM "documents"', 1, true))
    assert.truthy(h.db.calls[2].sql:find("unnest($1::bigint[], $2::text[])", 1, true))
  end)

  it("enqueues the same payload on the same shard after a full batch", function()
    local tbl = new_table(10)
    local h = tbl.attach(testing.load(SCRIPT))
    endpoint(h)
    local payload = { batch_size = 4, llm_url = URL }
    local out = h:run({ payload = payload, shard_key = "backfill", tenant_id = "acme" })
    assert.equal("done", out.status)
    assert.equal(4, out.result.embedded)
    assert.equal(1, #h.enqueued)
    assert.same(payload, h.enqueued[1].payload)
    assert.equal("backfill", h.enqueued[1].shard_key)
    assert.equal("acme", h.enqueued[1].tenant_id)
    assert.equal(h.enqueued[1].id, out.result.next_task)
  end)

  it("drains the table as a chain: 120 rows, batches of 50 → 50, 50, 20", function()
    local tbl = new_table(120)
    local task = { payload = { batch_size = 50, llm_url = URL }, shard_key = "bf" }
    local embedded, calls, links = {}, 0, 0
    while task do
      links = links + 1
      local h = tbl.attach(testing.load(SCRIPT))
      endpoint(h)
      local out = h:settle(task)
      assert.equal("done", out.status)
      embedded[#embedded + 1] = out.result.embedded
      calls = calls + #h.http.calls
      task = h.enqueued[1]
      assert.is_true(#h.enqueued <= 1)
    end
    assert.same({ 50, 50, 20 }, embedded)
    assert.equal(3, calls)
    for _, r in ipairs(tbl.rows) do assert.is_not_nil(r.embedding) end
  end)

  it("with a total that is a multiple of the batch, the last link finds nothing and pays nothing", function()
    local tbl = new_table(4)
    local h = tbl.attach(testing.load(SCRIPT))
    endpoint(h)
    h:run({ payload = { batch_size = 4, llm_url = URL } })
    local last = tbl.attach(testing.load(SCRIPT))
    local out = last:run({ payload = h.enqueued[1].payload })
    assert.same({ embedded = 0 }, out.result)
    assert.equal(0, #last.http.calls)
    assert.equal(0, #last.enqueued)
  end)

  it("does not pay twice: a retry after a failed UPDATE reuses the stored vectors", function()
    local tbl = new_table(3)
    local h = tbl.attach(testing.load(SCRIPT))
    endpoint(h)
    local failed = false
    local update = h.db.handlers[2].fn   -- the UPDATE handler: fail it once
    h.db.handlers[2].fn = function(...)
      if not failed then failed = true error("leash.db.query: canceling statement due to statement timeout", 0) end
      return update(...)
    end
    local out = h:settle({ payload = { batch_size = 10, llm_url = URL } })
    assert.equal("done", out.status)
    assert.equal(2, out.attempt)
    assert.equal(1, #h.http.calls)
    assert.equal(3, out.result.embedded)
    assert.equal(1, h.step_runs["embed:1-3:3"])
  end)

  it("does not fork the chain when retried after the follow-up was enqueued", function()
    local tbl = new_table(4)
    local h = tbl.attach(testing.load(SCRIPT))
    endpoint(h)
    local payload = { batch_size = 2, llm_url = URL }
    h:run({ payload = payload })
    for _, r in ipairs(tbl.rows) do if r.id <= 2 then r.embedding = nil end end   -- as if rolled back
    h:run({ payload = payload, attempt = 2 })
    assert.equal(1, #h.enqueued)
  end)

  it("snoozes a 429 for Retry-After, retries 5xx and malformed answers; a 4xx is fatal", function()
    local cases = {
      { { status = 429, headers = { ["Retry-After"] = "1" }, body = "" }, "snooze", 1 },
      { { status = 502, body = "bad gateway" }, "retry" },
      { { status = 200, body = '{"data":[{"index":0,"embedding":[0.1]}]}' }, "retry" },  -- 1 of 2
      { { status = 200, body = '{"data":[{"index":0,"embedding":[]},{"index":1,"embedding":[1]}]}' }, "retry" },
      { { status = 200, body = "not json" }, "retry" },
      { { status = 401, body = "no key" }, "dead" },
    }
    for _, c in ipairs(cases) do
      local tbl = new_table(2)
      local h = tbl.attach(testing.load(SCRIPT))
      endpoint(h, { c[1] })
      local out = h:run({ payload = { batch_size = 5, llm_url = URL } })
      assert.equal(c[2], out.status, c[1].body)
      assert.equal(c[3], out.delay)
      assert.equal(0, tbl.updates)
      assert.same({}, h.steps)
    end
  end)

  it("uses the defaults, a schema-qualified payload.table, and refuses anything else", function()
    local tbl = new_table(1)
    local h = tbl.attach(testing.load(SCRIPT))
    endpoint(h)
    assert.equal("done", h:run({ payload = {} }).status)
    assert.equal(URL, h.http.calls[1].url)
    assert.equal(100, h.db.calls[1].params[1])
    h:run({ payload = { table = "app.docs_2" } })
    assert.truthy(h.db.calls[3].sql:find('FROM "app"."docs_2" WHERE', 1, true))
    for _, p in ipairs({ { table = 'docs"; DROP TABLE x; --' }, { table = "a.b.c" }, { table = "" },
                         { batch_size = 0 }, { batch_size = 2.5 }, { batch_size = "10" }, { llm_url = 5 } }) do
      local bad = tbl.attach(testing.load(SCRIPT))
      assert.equal("dead", bad:run({ payload = p }).status)
      assert.equal(0, #bad.db.calls)
    end
  end)
end)
