-- Retry with the provider's Retry-After from inside a step. A step stores what its function
-- returns, so an outcome returned there would be stored as the step's result; instead the
-- function raises a table, which stores nothing, and handle maps it to leash.retry outside.
local leash = require "leash"

local function ask(url, prompt)
  local resp = leash.http.request {
    method = "POST", url = url, headers = { ["content-type"] = "application/json" },
    body = leash.json.encode { model = "any", messages = { { role = "user", content = prompt } } },
  }
  if resp.status == 429 or resp.status >= 500 then
    -- tonumber(nil) is nil: no header means the backoff; a delay over 3600 s is cut to 3600
    error({ retry = "upstream " .. resp.status, delay = tonumber(resp.headers["retry-after"]) })
  end
  if resp.status ~= 200 then error({ fatal = "upstream refused: " .. resp.status }) end
  return leash.json.decode(resp.body).choices[1].message.content
end

return function(task)
  local ok, answer = pcall(leash.step, "ask", function()
    return ask(leash.env("LLM_URL") .. "/v1/chat/completions", task.payload.prompt)
  end)
  if not ok then
    if type(answer) ~= "table" then error(answer, 0) end   -- a lost lease, a bug: raise on
    if answer.fatal then return leash.fatal(answer.fatal) end
    return leash.retry(answer.retry, answer.delay)
  end
  return leash.ok { answer = answer }
end
