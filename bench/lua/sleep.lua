-- bench/run.sh handler: waits payload.s seconds (default 1) in leash.sleep, like a task
-- waiting on an LLM call, then succeeds.
local leash = require "leash"

return function(task)
  leash.sleep(task.payload.s or 1)
  return true
end
