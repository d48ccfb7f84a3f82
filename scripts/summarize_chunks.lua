-- Sample task script: "summarises" one chunk of a document and stores the summary.
-- A stand-in for an LLM call (the Kubernetes-night version with a mock LLM endpoint is
-- scripts/grade_ticket.lua's job); it shows the contract: payload in, side effects through
-- leash.db.query, an outcome out. Chunks of one document share a shard_key, so they are
-- summarised one at a time, in order.
local leash = require "leash"

local function summarise(text, words)
  local out = {}
  for w in text:gmatch("%S+") do
    out[#out + 1] = w
    if #out == words then break end
  end
  return table.concat(out, " ") .. (#out == words and " …" or "")
end

return {
  setup = function()
    -- Runs once per slot when the script loads (or reloads): a place for constants.
  end,

  handle = function(task)
    local p = task.payload
    if type(p.text) ~= "string" then
      return leash.fatal("payload.text must be a string")   -- retrying cannot fix this
    end
    -- A flaky dependency: the first attempt of each document's third chunk fails and is
    -- retried a second later.
    if p.chunk % 10 == 3 and task.attempt == 1 then
      return leash.retry("upstream busy (simulated)", 1)
    end
    local summary = summarise(p.text, 8)
    leash.db.query([[INSERT INTO chunk_summaries (doc, chunk, summary, worker)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (doc, chunk) DO UPDATE SET summary = excluded.summary]],
                   p.doc, p.chunk, summary, task.worker_id)
    return leash.ok({ words = select(2, summary:gsub("%S+", "")) })
  end,
}
