-- bench/run.sh handler (budget, outage): one call to the mock LLM under the task's budget,
-- recorded in `calls` (server clock at the answer, the answer's status, the budget), then
-- done. payload: url (the mock's chat or embeddings URL), budget, tokens (the estimate),
-- prompt (the text sent).
local leash = require "leash"

return function(task)
  local p = task.payload
  local body
  if p.url:find("/v1/embeddings", 1, true) then
    body = leash.json.encode { model = "e", input = p.prompt }
  else
    body = leash.json.encode { model = "m", messages = { { role = "user", content = p.prompt } } }
  end
  local r = leash.http.request {
    url = p.url, method = "POST", headers = { ["content-type"] = "application/json" },
    body = body, budget = p.budget, tokens = p.tokens,
  }
  leash.db.query("insert into calls (task_id, attempt, status, budget) values ($1, $2, $3, $4)",
    task.id, task.attempt, r.status, p.budget)
  if r.status ~= 200 then
    return leash.retry("mock answered " .. r.status)
  end
  return true
end
