--[[ backfill_embeddings.lua — fills a table's missing embeddings, one batch per task, as a
chain of tasks: each task that filled a full batch enqueues the next one.

Payload: { "batch_size": 50, "llm_url": "http://127.0.0.1:8089/v1/embeddings",
           "table": "documents", "model": "embed-1" }   -- all optional (defaults shown,
                                                         -- batch_size default 100)
Table:   documents (id bigint PRIMARY KEY, body text, embedding float8[])   -- or payload.table,
         with the same columns; NULL embedding = still to do

    leash enqueue --shard backfill '{"batch_size": 50}'
    leash run scripts/backfill_embeddings.lua --until-empty

One task: selects up to batch_size rows without an embedding (lowest ids first), asks the
embeddings endpoint once for the whole batch, writes every vector with one UPDATE … FROM
unnest(ids, vectors), and — when the batch was full — enqueues the same payload again with
the same shard key (so the next link runs only after this one has finished). The chain ends
with the first task that finds less than a full batch. Result: {embedded = rows written}.

Paying once: the endpoint call runs in a step named after the batch (its first and last id
and size). If the UPDATE fails, the next attempt selects the same rows, finds the step and
reuses the stored vectors; if the rows changed meanwhile, it is another batch and another
step. The follow-up enqueue is a step too, so a retry never forks the chain.

Outcomes: retry on endpoint failures (429 after Retry-After, 5xx, a malformed answer) and
database errors; dead for a bad payload or a 4xx refusal.
]]
local leash = require "leash"
local llm = require "lib.llm"

local DEFAULT_URL = "http://127.0.0.1:8089/v1/embeddings"
local DEFAULT_TABLE = "documents"
local DEFAULT_BATCH = 100
local MAX_BATCH = 2048

-- "name" or "schema.name" of plain identifier characters, quoted; nil when not that shape.
-- (SQL cannot take a table name as a $n parameter, so this is the only text pasted in.)
local function quoted_table(name)
  local parts = {}
  for part in (name .. "."):gmatch("([^.]*)%.") do
    if not part:match("^[%a_][%w_]*$") or #part > 63 then return nil end
    parts[#parts + 1] = '"' .. part .. '"'
  end
  if #parts < 1 or #parts > 2 then return nil end
  return table.concat(parts, ".")
end

-- A PostgreSQL array literal of float8[] from a list of numbers (17 significant digits).
local function float_array(vec)
  local out = {}
  for i, x in ipairs(vec) do out[i] = string.format("%.17g", x) end
  return "{" .. table.concat(out, ",") .. "}"
end

local function handle(task)
  local p = task.payload
  if type(p) ~= "table" then return leash.fatal("payload must be an object") end
  local n = p.batch_size == nil and DEFAULT_BATCH or p.batch_size
  if math.type(n) ~= "integer" or n < 1 or n > MAX_BATCH then
    return leash.fatal("payload.batch_size must be an integer 1.." .. MAX_BATCH)
  end
  local url = p.llm_url == nil and DEFAULT_URL or p.llm_url
  if type(url) ~= "string" then return leash.fatal("payload.llm_url must be a string") end
  local tbl = quoted_table(p.table == nil and DEFAULT_TABLE or tostring(p.table))
  if not tbl then return leash.fatal("payload.table must be a table name (name or schema.name)") end

  local rows = leash.db.query("SELECT id, body FROM " .. tbl
                              .. " WHERE embedding IS NULL ORDER BY id LIMIT $1", n)
  if #rows == 0 then return leash.ok({ embedded = 0 }) end

  local ids, texts = {}, {}
  for i, r in ipairs(rows) do
    ids[i] = r.id
    texts[i] = r.body ~= leash.null and r.body or ""
  end
  local step = ("embed:%s-%s:%d"):format(ids[1], ids[#ids], #ids)
  local ok, vectors = llm.call(function()
    return leash.step(step, function()
      return llm.embed(url, texts, { model = p.model })
    end)
  end)
  if not ok then return llm.outcome(vectors) end

  -- One statement for the batch: ids and vectors travel as two array literals, the
  -- vectors as text[] of float8[] literals (unnest of a 2-D array would flatten it).
  local lits = {}
  for i, v in ipairs(vectors) do lits[i] = '"' .. float_array(v) .. '"' end
  local _, written = leash.db.query("UPDATE " .. tbl .. [[ AS t SET embedding = v.embedding::float8[]
       FROM unnest($1::bigint[], $2::text[]) AS v(id, embedding)
      WHERE t.id = v.id AND t.embedding IS NULL]],
    "{" .. table.concat(ids, ",") .. "}", "{" .. table.concat(lits, ",") .. "}")

  local result = { embedded = written }
  if #rows == n then
    -- A full batch: there may be more. Same payload, same shard: the next link waits for
    -- this task to finish, and a retry of this task finds the step and enqueues nothing.
    result.next_task = leash.step("follow-up", function()
      return leash.enqueue{ payload = p, shard_key = task.shard_key }
    end)
  end
  return leash.ok(result)
end

return { handle = handle }
