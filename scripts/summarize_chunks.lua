--[[ summarize_chunks.lua — map/reduce summaries of long documents, one chunk per task.

Map task payload:    { "doc": "doc-7", "chunk": 3, "text": "…", "chunks": 6,
                       "llm_url": "http://127.0.0.1:8089/v1/chat/completions" }
                     enqueued with shard_key = doc; chunks and llm_url are optional
Reduce task payload: { "doc": "doc-7", "reduce": true, "chunks": 6 }   (enqueued by a map task)
Document task payload: { "doc": "doc-7", "texts": ["…", "…"], "llm_url": "…" }   (llm_url optional)
Writes:  chunk_summaries (doc text, chunk int, summary text, worker text, PRIMARY KEY (doc, chunk))
         doc_summaries   (doc text PRIMARY KEY, summary text NOT NULL, chunks int NOT NULL,
                          updated_at timestamptz NOT NULL DEFAULT now())

    printf '{"payload":{"doc":"d1","chunk":%d,"text":"…","chunks":6},"shard_key":"d1"}\n' 1 2 3 4 5 6 \
      | leash enqueue --file -
    leash run scripts/summarize_chunks.lua --until-empty

Map: summarises its chunk — with the LLM endpoint inside leash.step("summary") when
payload.llm_url is set (so a retry does not pay twice), else with a deterministic local
stand-in (the first eight words; chunk numbers ending in 3 then fail their first attempt, a
simulated flaky upstream) — and upserts it into chunk_summaries. When payload.chunks is set,
it then counts the document's stored chunk summaries in one query; the map task that finds
all of them there enqueues the reduce task, inside leash.step("reduce"), so a retry of that
map task does not enqueue it twice.

Reduce: concatenates the chunk summaries in chunk order (one per line) into doc_summaries
(an upsert). It runs after the last map task has finished: it has the same shard key, and
tasks of one shard never run at the same time.

Document: the other way to fan in, with a durable wait (README "Waits"). The document's own
task enqueues one map task per text as its children (inside leash.step("fanout"): a retry
enqueues none twice), each on a shard of its own so they run side by side, then ends with
leash.wait{children = true}: it gives back its attempt and its slot and holds no lease while
the chunks run. When the last child has settled it runs again, skips the fan-out step, and
reduces the stored chunk summaries into doc_summaries. A child that died makes the document
fatal (naming how many); a wait past its deadline (an hour) retries once, then is fatal.

Outcomes: done (map: {words = n [, reduce_task = id]}, reduce and document: {chunks = n});
retry on
endpoint failures (429 with Retry-After, 5xx, non-JSON answers; lib/llm.lua) and the
simulated flaky chunk; dead for a bad payload, an endpoint that refuses the request (4xx)
or a model that still answers without a summary on the 3rd attempt.
]]
local leash = require "leash"
local llm = require "lib.llm"

local UNUSABLE_LIMIT = 3
local DOC_MAX_TEXTS = 10000     -- leash.wait's own bound on the tasks one wait may name
local DOC_WAIT_S = 3600

local function first_words(text, words)
  local out = {}
  for w in text:gmatch("%S+") do
    out[#out + 1] = w
    if #out == words then break end
  end
  return table.concat(out, " ") .. (#out == words and " …" or "")
end

local function is_count(n) return math.type(n) == "integer" and n >= 1 end

-- The chunk's summary, or nil and the outcome to return.
local function summarise(task, p)
  if not p.llm_url then
    if p.chunk % 10 == 3 and task.attempt == 1 then
      return nil, leash.retry("upstream busy (simulated)", 1)
    end
    return first_words(p.text, 8)
  end
  local ok, v = llm.call(function()
    return leash.step("summary", function()
      local answer = llm.chat_json(p.llm_url, {
        { role = "system", content = "Summarize the user's text in one sentence. "
                                     .. 'Answer with a JSON object only: {"summary": "..."}' },
        { role = "user", content = p.text },
      }, { model = p.model })
      if type(answer.summary) ~= "string" or answer.summary == "" then
        error(llm.failure("malformed", "model answer has no summary"))
      end
      return answer.summary
    end)
  end)
  if ok then return v end
  if v.kind == "malformed" and task.attempt >= UNUSABLE_LIMIT then
    return nil, leash.fatal("model answer unusable after " .. task.attempt .. " attempts: " .. v.message)
  end
  return nil, llm.outcome(v)
end

local function map(task, p)
  if type(p.text) ~= "string" then
    return leash.fatal("payload.text must be a string")   -- retrying cannot fix this
  end
  if math.type(p.chunk) ~= "integer" then return leash.fatal("payload.chunk must be an integer") end
  if p.chunks ~= nil and not is_count(p.chunks) then
    return leash.fatal("payload.chunks must be an integer >= 1")
  end
  if p.llm_url ~= nil and type(p.llm_url) ~= "string" then
    return leash.fatal("payload.llm_url must be a string")
  end
  local summary, outcome = summarise(task, p)
  if not summary then return outcome end

  leash.db.query([[INSERT INTO chunk_summaries (doc, chunk, summary, worker)
                   VALUES ($1, $2, $3, $4)
                   ON CONFLICT (doc, chunk) DO UPDATE
                     SET summary = excluded.summary, worker = excluded.worker]],
                 p.doc, p.chunk, summary, task.worker_id)
  local result = { words = select(2, summary:gsub("%S+", "")) }
  if p.chunks == nil then return leash.ok(result) end

  -- Fan-in without a coordinator. Tasks of one (tenant, shard_key) never run at the same
  -- time, and every map task of this document has shard_key = doc, so this count and the
  -- INSERT above cannot interleave with another map task of the document: the task that
  -- stores the last missing chunk is the one that sees them all, whatever order the chunks
  -- ran in. A later re-delivery of a map task (at-least-once) may see them all again and
  -- enqueue a second reduce; the reduce is an upsert, so that costs a little work, not
  -- correctness. (Without the shared shard key, two map tasks could both see the full count
  -- and both enqueue — still never none, since each counts after its own committed INSERT.)
  if task.shard_key ~= p.doc then
    leash.log.warn("map task's shard_key is not its doc: reduce may be enqueued twice",
                   { doc = p.doc, shard_key = task.shard_key })
  end
  local rows = leash.db.query("SELECT count(*) AS stored FROM chunk_summaries WHERE doc = $1", p.doc)
  if rows[1].stored >= p.chunks then
    result.reduce_task = leash.step("reduce", function()
      return leash.enqueue{ payload = { doc = p.doc, reduce = true, chunks = p.chunks },
                            shard_key = task.shard_key }
    end)
  end
  return leash.ok(result)
end

-- The document's summary from its stored chunk summaries, in chunk order (an upsert).
local function store_summary(doc, rows)
  local parts = {}
  for i, r in ipairs(rows) do parts[i] = r.summary end
  leash.db.query([[INSERT INTO doc_summaries (doc, summary, chunks) VALUES ($1, $2, $3)
                   ON CONFLICT (doc) DO UPDATE
                     SET summary = excluded.summary, chunks = excluded.chunks, updated_at = now()]],
                 doc, table.concat(parts, "\n"), #rows)
  return leash.ok({ chunks = #rows })
end

local function chunk_rows(doc)
  return leash.db.query(
    "SELECT chunk, summary FROM chunk_summaries WHERE doc = $1 ORDER BY chunk", doc)
end

local function reduce(p)
  if p.chunks ~= nil and not is_count(p.chunks) then
    return leash.fatal("payload.chunks must be an integer >= 1")
  end
  local rows = chunk_rows(p.doc)
  if #rows == 0 then return leash.fatal("no chunk summaries stored for " .. p.doc) end
  if p.chunks and #rows < p.chunks then
    -- Cannot happen when the map tasks share the doc's shard key; wait for the rest.
    return leash.retry(("%d of %d chunk summaries stored"):format(#rows, p.chunks), 5)
  end
  return store_summary(p.doc, rows)
end

-- The document's task: its chunks as children, a wait for them, then the reduce.
local function document(task, p)
  if type(p.texts) ~= "table" or #p.texts == 0 or #p.texts > DOC_MAX_TEXTS then
    return leash.fatal("payload.texts must be a list of 1 to " .. DOC_MAX_TEXTS .. " strings")
  end
  for i, t in ipairs(p.texts) do
    if type(t) ~= "string" then return leash.fatal("payload.texts[" .. i .. "] must be a string") end
  end
  if p.llm_url ~= nil and type(p.llm_url) ~= "string" then
    return leash.fatal("payload.llm_url must be a string")
  end
  local w = leash.waited()
  if not w then
    leash.step("fanout", function()
      for i, text in ipairs(p.texts) do
        leash.enqueue{ payload = { doc = p.doc, chunk = i, text = text, llm_url = p.llm_url,
                                   model = p.model },
                       shard_key = p.doc .. "#" .. i }
      end
      return #p.texts
    end)
    return leash.wait{ children = true, deadline = DOC_WAIT_S,
                       message = ("waiting for %d chunk summaries"):format(#p.texts) }
  end
  local done, dead = 0, 0
  for _, c in ipairs(w.tasks) do
    if c.status == "done" then done = done + 1 elseif c.status == "dead" then dead = dead + 1 end
  end
  if dead > 0 then
    return leash.fatal(("%d of %d chunks failed; see the document's children"):format(dead, #w.tasks))
  end
  if w.expired then
    -- The hour passed with chunks still running (a retry of the wait): one more look.
    if task.attempt >= 2 then
      return leash.fatal(("%d of %d chunks summarised within the wait's deadline twice")
                         :format(done, #w.tasks))
    end
    return leash.wait{ children = true, deadline = DOC_WAIT_S,
                       message = ("still waiting: %d of %d chunks done"):format(done, #w.tasks) }
  end
  local rows = chunk_rows(p.doc)
  if #rows < #p.texts then
    return leash.fatal(("%d of %d chunk summaries stored after every chunk settled")
                       :format(#rows, #p.texts))
  end
  return store_summary(p.doc, rows)
end

return {
  handle = function(task)
    local p = task.payload
    if type(p) ~= "table" or type(p.doc) ~= "string" or p.doc == "" then
      return leash.fatal("payload.doc must be a non-empty string")
    end
    if p.reduce == true then return reduce(p) end
    if p.texts ~= nil then return document(task, p) end
    return map(task, p)
  end,
}
