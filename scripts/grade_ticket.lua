--[[ grade_ticket.lua — nightly ticket grading: one task grades one support ticket with an LLM.

Payload:  { "ticket_id": 42, "llm_url": "http://127.0.0.1:8089/v1/chat/completions",
            "model": "grader-1" }          -- llm_url and model are optional
          "batch_api": true                 -- the --batch-api mode (below)
Reads:    tickets (id bigint PRIMARY KEY, subject text, body text)
Writes:   ticket_grades (ticket_id bigint PRIMARY KEY, grade int NOT NULL, reason text,
                         graded_by text, graded_at timestamptz NOT NULL DEFAULT now())

    leash enqueue --batch nightly-$(date +%F) '{"ticket_id": 42}'
    leash run scripts/grade_ticket.lua --concurrency 8 --until-empty

Outcomes:
  done   the grade is stored (an upsert: a re-delivered task writes the same row again);
         result {grade = n}
  retry  429 (after the server's Retry-After), 5xx, a body that is not JSON, a transport
         error, or a model answer that is not a JSON object with an integer grade 1..5;
  dead   the ticket does not exist, the payload is wrong, the endpoint refuses the request
         (4xx), or the model's answer is still unusable on the 3rd attempt.

The --batch-api mode (payload "batch_api": true): the grade is asked through the provider's
batch interface at about half the price (leash.llm.batch, README "Provider batches"). The
task's first execution stores the request and ends waiting, holding no slot and no lease;
the fleet's batcher (any `leash run`, with --llm-batch-url openai=BASE when not the public
API) sends the requests of all tasks in provider batches, and the task's next execution
gets its answer and writes the grade. llm_url and budget are not used in this mode.

    leash enqueue --batch nightly-$(date +%F) '{"ticket_id": 42, "batch_api": true}'
    leash run scripts/grade_ticket.lua --concurrency 4 --until-empty \
      --llm-batch-url openai=http://127.0.0.1:8089

Paying once: the LLM call runs inside leash.step("grade"). A step stores what its function
returns, so the function returns only a good, validated answer and raises otherwise (see
lib/llm.lua): a failed call stores nothing and the next attempt asks again, while an attempt
that got its answer but failed later (the INSERT, a lost lease) is retried without paying for
a second call.
]]
local leash = require "leash"
local llm = require "lib.llm"

local DEFAULT_URL = "http://127.0.0.1:8089/v1/chat/completions"
local DEFAULT_MODEL = "mock-grader"
local UNUSABLE_LIMIT = 3   -- attempts after which a model that cannot answer is given up on

local SYSTEM = [[You grade customer support tickets by how well the request is stated, from
1 (unusable) to 5 (perfectly clear). Answer with a JSON object only:
{"grade": <integer 1-5>, "reason": "<one sentence>"}]]

-- The answer's grade as an integer 1..5, or nil and why not.
local function check_answer(answer)
  local g = answer.grade
  if math.type(g) == "float" and g == math.floor(g) then g = math.tointeger(g) end
  if math.type(g) ~= "integer" or g < 1 or g > 5 then
    return nil, "grade must be an integer 1..5, got " .. tostring(answer.grade)
  end
  if answer.reason ~= nil and type(answer.reason) ~= "string" then
    return nil, "reason must be a string"
  end
  return g
end

local function handle(task)
  local p = task.payload
  local id = type(p) == "table" and p.ticket_id or nil
  if math.type(id) ~= "integer" then
    return leash.fatal("payload.ticket_id must be an integer")
  end
  local url = p.llm_url or DEFAULT_URL
  local model = p.model or DEFAULT_MODEL
  if type(url) ~= "string" or type(model) ~= "string" then
    return leash.fatal("payload.llm_url and payload.model must be strings")
  end
  if p.budget ~= nil and type(p.budget) ~= "string" then
    return leash.fatal("payload.budget must be a budget's name (a string)")
  end

  local rows = leash.db.query("SELECT id, subject, body FROM tickets WHERE id = $1", id)
  local ticket = rows[1]
  if not ticket then
    return leash.fatal("ticket " .. id .. " not found")
  end
  local subject = ticket.subject ~= leash.null and ticket.subject or ""
  local body = ticket.body ~= leash.null and ticket.body or ""

  -- The paid call. Inside the step: only a validated answer is returned (and stored);
  -- everything else raises an llm.failure, which llm.call hands back as (false, failure).
  if p.batch_api ~= nil and type(p.batch_api) ~= "boolean" then
    return leash.fatal("payload.batch_api must be true or false")
  end
  local ok, answer = llm.call(function()
    return leash.step("grade", function()
      local messages = {
        { role = "system", content = SYSTEM },
        { role = "user", content = "Ticket #" .. id .. "\nSubject: " .. subject .. "\n\n" .. body },
      }
      local v, usage
      if p.batch_api then
        v, usage = llm.batch_chat_json(messages, { model = model })
      else
        v, usage = llm.chat_json(url, messages,
                                 { model = model, budget = p.budget, tokens = p.budget and 600 })
      end
      local grade, why = check_answer(v)
      if not grade then error(llm.failure("malformed", "model answer unusable: " .. why)) end
      return { grade = grade, reason = v.reason or "", model = model,
               prompt_tokens = usage.prompt_tokens, completion_tokens = usage.completion_tokens }
    end)
  end)
  if not ok then
    local f = answer
    if f.kind == "malformed" and task.attempt >= UNUSABLE_LIMIT then
      if f.message:find("not a JSON object", 1, true) then
        return leash.fatal("model answer not JSON after " .. task.attempt .. " attempts: " .. f.message)
      end
      return leash.fatal("model answer unusable after " .. task.attempt .. " attempts: " .. f.message)
    end
    return llm.outcome(f)
  end

  -- Idempotent: a second delivery of this task (at-least-once) rewrites the same row.
  leash.db.query([[INSERT INTO ticket_grades (ticket_id, grade, reason, graded_by)
                   VALUES ($1, $2, $3, $4)
                   ON CONFLICT (ticket_id) DO UPDATE
                     SET grade = excluded.grade, reason = excluded.reason,
                         graded_by = excluded.graded_by, graded_at = now()]],
                 id, answer.grade, answer.reason, answer.model)
  leash.log.debug("graded", { ticket = id, grade = answer.grade })
  return leash.ok({ grade = answer.grade })
end

return { handle = handle }
