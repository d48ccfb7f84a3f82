-- Your first task: ask an LLM to grade a support ticket. LLM_URL comes from the worker's
-- environment (leash run --env-allow LLM_URL); the ticket comes from the task's payload.
local leash = require "leash"

return function(task)
  local ticket = task.payload.ticket
  if type(ticket) ~= "string" then return leash.fatal("payload.ticket must be text") end
  -- A step runs once per task: a retry reuses its stored result instead of paying again.
  local grade = leash.step("grade", function()
    local resp = leash.http.request {
      method = "POST", url = leash.env("LLM_URL") .. "/v1/chat/completions",
      headers = { ["content-type"] = "application/json" },
      body = leash.json.encode { model = "any", messages = { { role = "user", content = "grade: " .. ticket } } },
    }
    if resp.status ~= 200 then error("the LLM answered " .. resp.status) end -- a retry
    local answer = leash.json.decode(resp.body)
    return assert(leash.json.decode(answer.choices[1].message.content), "not JSON")
  end)
  leash.log.info("graded", { task = task.id, grade = grade.grade })
  return leash.ok { grade = grade.grade, reason = grade.reason }
end
