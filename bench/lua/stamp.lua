-- bench/run.sh handler for the latency workload: its first statement stamps the task with the
-- server's clock (bench_stamp, created by the workload), as compare.sh's latency handler
-- does, so pickup to the handler = at - created_at on one clock. Then it succeeds.
local leash = require "leash"

return function(task)
  leash.db.query("INSERT INTO bench_stamp (id, at) VALUES ($1, clock_timestamp())", task.id)
  return true
end
