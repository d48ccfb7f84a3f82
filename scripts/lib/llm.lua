--- lib/llm.lua — a small client for OpenAI-like chat and embedding endpoints, shared by the
--- example scripts (`local llm = require "lib.llm"`: the host loads it from the script's
--- folder, leash.testing does the same).
---
--- Every call either returns the answer or raises. A raise that the endpoint caused is an
--- llm.failure { kind, message, delay }:
---   kind "snooze"     429 (delay = Retry-After seconds, 5 when not given): the provider is
---                     busy, not the task wrong: come back without spending an attempt
---                     (a call made with opts.budget never sees a 429: the host pauses the
---                     budget for the fleet and sends the call again, or snoozes the task);
---   kind "retry"      5xx, 408/409/425, a body that is not JSON: worth another attempt;
---   kind "malformed"  the model answered, but not what was asked (content not JSON, a field
---                     missing or out of range): worth another attempt, up to a limit;
---   kind "fatal"      any other 4xx (the request itself is wrong): retrying cannot help.
--- Anything else raised (transport errors, a lost lease) is not a failure object and should
--- propagate: the host turns it into a retry with a traceback.
---
--- Why raise instead of returning an error: the paid call belongs inside leash.step, and a
--- step stores whatever its function returns. Raising keeps a failure out of the step
--- store, so the next attempt pays again only when there was nothing worth keeping:
---
---   local ok, answer = llm.call(function()
---     return leash.step("grade", function() return llm.chat_json(url, messages) end)
---   end)
---   if not ok then return llm.outcome(answer) end   -- answer is the llm.failure
local leash = require "leash"

local llm = {}

local Failure = { __name = "llm.failure" }
Failure.__index = Failure
Failure.__tostring = function(f) return f.message end

--- An endpoint failure (see above); raise it with error(llm.failure(...)).
function llm.failure(kind, message, delay)
  return setmetatable({ kind = kind, message = message, delay = delay }, Failure)
end

function llm.is_failure(v) return getmetatable(v) == Failure end

--- Runs fn; returns true, results… or false, failure for an llm.failure. Other errors are
--- raised again unchanged.
function llm.call(fn, ...)
  local res = table.pack(pcall(fn, ...))
  if res[1] then return table.unpack(res, 1, res.n) end
  if llm.is_failure(res[2]) then return false, res[2] end
  error(res[2], 0)
end

--- The outcome for a failure: fatal for kind "fatal", a snooze for "snooze" (the attempt
--- given back), else a retry (with the server's delay when it named one).
function llm.outcome(f)
  if f.kind == "fatal" then return leash.fatal(f.message) end
  if f.kind == "snooze" then return leash.snooze(f.delay or 5, f.message) end
  return leash.retry(f.message, f.delay)
end

local function snippet(s)
  s = tostring(s or ""):gsub("%s+", " ")
  if #s > 120 then s = s:sub(1, 117) .. "..." end
  return s
end

--- POSTs body (a table, sent as JSON) to url; returns the decoded JSON answer of a 2xx.
--- opts: api_key, timeout, budget and tokens (leash.http.request's: the call is granted by
--- that budget, shared by the fleet; README "Budgets").
function llm.post_json(url, body, opts)
  opts = opts or {}
  local headers = { ["Content-Type"] = "application/json", Accept = "application/json" }
  if opts.api_key then headers.Authorization = "Bearer " .. opts.api_key end
  local resp = leash.http.request{
    method = "POST", url = url, headers = headers,
    body = leash.json.encode(body), timeout = opts.timeout or 60,
    budget = opts.budget, tokens = opts.tokens,
  }
  local s = resp.status
  if s == 429 then
    error(llm.failure("snooze", "rate limited (429)", tonumber(resp.headers["retry-after"])))
  end
  if s >= 500 or s == 408 or s == 409 or s == 425 then
    error(llm.failure("retry", ("server error (%d): %s"):format(s, snippet(resp.body))))
  end
  if s < 200 or s > 299 then
    error(llm.failure("fatal", ("request refused (%d): %s"):format(s, snippet(resp.body))))
  end
  local v, err = leash.json.decode(resp.body)
  if type(v) ~= "table" then
    error(llm.failure("retry", "response body is not a JSON object: " .. (err or snippet(resp.body))))
  end
  return v
end

--- Chat completion: messages = { {role=…, content=…}, … }. Returns the answer's content
--- (a string) and the usage table ({} when absent).
function llm.chat(url, messages, opts)
  opts = opts or {}
  local v = llm.post_json(url, { model = opts.model or "mock", messages = messages,
                                 temperature = opts.temperature or 0 }, opts)
  local choice = type(v.choices) == "table" and v.choices[1]
  local content = type(choice) == "table" and type(choice.message) == "table" and choice.message.content
  if type(content) ~= "string" then
    error(llm.failure("malformed", "answer has no choices[1].message.content"))
  end
  return content, type(v.usage) == "table" and v.usage or {}
end

--- Chat completion whose content must be a JSON object: returns it decoded, and the usage.
function llm.chat_json(url, messages, opts)
  local content, usage = llm.chat(url, messages, opts)
  return llm.decode_object(content), usage
end

--- The same answer through the provider's batch interface (leash.llm.batch, README
--- "Provider batches"): only inside leash.step. The first execution ends here, waiting
--- without a slot until the fleet's batcher has the answer; the next one returns it, as
--- chat_json does. opts: model, temperature, provider ("openai", the default).
function llm.batch_chat_json(messages, opts)
  opts = opts or {}
  local v = leash.llm.batch{ provider = opts.provider or "openai",
                             request = { model = opts.model or "mock", messages = messages,
                                         temperature = opts.temperature or 0 } }
  local choice = type(v.choices) == "table" and v.choices[1]
  local content = type(choice) == "table" and type(choice.message) == "table" and choice.message.content
  if type(content) ~= "string" then
    error(llm.failure("malformed", "answer has no choices[1].message.content"))
  end
  return llm.decode_object(content), type(v.usage) == "table" and v.usage or {}
end

--- content decoded as a JSON object, or raises an llm.failure "malformed".
function llm.decode_object(content)
  local v = leash.json.decode(content)
  if type(v) ~= "table" then
    error(llm.failure("malformed", "model answer is not a JSON object: " .. snippet(content)))
  end
  return v
end

--- Embeddings of inputs (a list of strings): returns a list of vectors (lists of numbers)
--- in the order of inputs.
function llm.embed(url, inputs, opts)
  opts = opts or {}
  local v = llm.post_json(url, { model = opts.model or "mock-embedding", input = inputs }, opts)
  if type(v.data) ~= "table" then error(llm.failure("malformed", "answer has no data list")) end
  local out = {}
  for _, item in ipairs(v.data) do
    local i, e = type(item) == "table" and item.index, type(item) == "table" and item.embedding
    if math.type(i) ~= "integer" or i < 0 or i >= #inputs or type(e) ~= "table" or #e == 0 then
      error(llm.failure("malformed", "bad item in data (index/embedding)"))
    end
    for _, x in ipairs(e) do
      if type(x) ~= "number" or x ~= x or x == math.huge or x == -math.huge then
        error(llm.failure("malformed", "embedding holds a value that is not a finite number"))
      end
    end
    out[i + 1] = e
  end
  for i = 1, #inputs do
    if out[i] == nil then
      error(llm.failure("malformed", ("%d embeddings for %d inputs"):format(#v.data, #inputs)))
    end
  end
  return out
end

return llm
