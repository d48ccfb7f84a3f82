-- One script for several kinds of task: a dispatch table on payload.kind. Each kind's
-- handler is an ordinary handle; an unknown kind is dead at once (retrying cannot fix it).
local leash = require "leash"

local kinds = {}

function kinds.grade(task)
  return leash.ok { grade = #task.payload.text % 5 + 1 }
end

function kinds.translate(task)
  if type(task.payload.to) ~= "string" then return leash.fatal("translate needs payload.to") end
  return leash.ok { text = "[" .. task.payload.to .. "] " .. task.payload.text }
end

function kinds.cleanup(task)
  local _, n = leash.db.query("DELETE FROM drafts WHERE ticket = $1", task.payload.ticket)
  return leash.ok { deleted = n }
end

return function(task)
  local kind = type(task.payload) == "table" and task.payload.kind
  local handler = type(kind) == "string" and kinds[kind]
  if not handler then return leash.fatal("unknown payload.kind: " .. tostring(kind)) end
  return handler(task)
end
