-- leash.testing's fake leash.env: the names a spec allows answer, others raise the host's
-- error, and allowed values are redacted from errors and logs as the host does
-- (tests/integration/env.sh proves the host's side).
local testing = require "leash.testing"

local KEY = "sk-spec-0123456789abcdef"

local function script(body, opts)
  return testing.load_string("local leash = require 'leash'\nreturn function(task)\n"
                             .. body .. "\nend", opts)
end

describe("leash.testing fake env", function()
  it("answers allowed names, nil for allowed but unset ones", function()
    local h = script("return leash.ok{ k = leash.env('OPENAI_API_KEY'), u = leash.env('UNSET') == nil }",
                     { env = { OPENAI_API_KEY = KEY }, env_allow = { "UNSET" } })
    local out = h:run()
    assert.equal("done", out.status)
    assert.same({ k = KEY, u = true }, out.result)   -- results are kept as made
  end)

  it("raises the host's error for any other name, at the script's line", function()
    for _, name in ipairs({ "HOME", "PATH", "", "openai_api_key", string.rep("N", 70) }) do
      local h = script("return leash.ok(leash.env(task.payload.name))", { env = { OPENAI_API_KEY = KEY } })
      local out = h:run{ payload = { name = name } }
      assert.equal("retry", out.status)
      assert.equal("script_error", out.cause)
      local shown = name:sub(1, 64) .. (#name > 64 and "..." or "")
      assert.truthy(out.error:find("(script):3: leash.env: '" .. shown .. "' is not allowed "
                                   .. "(the worker allows only the names given with --env-allow)", 1, true),
                    out.error)
    end
  end)

  it("allows nothing without opts.env, and raises on a name that is not a string", function()
    local out = script("return leash.env('OPENAI_API_KEY')"):run()
    assert.truthy(out.error:find("'OPENAI_API_KEY' is not allowed", 1, true), out.error)
    out = script("return leash.env({})", { env = { A = KEY } }):run()
    assert.truthy(out.error:find("bad argument #1 to 'env'", 1, true), out.error)
  end)

  it("redacts allowed values from every kind of error", function()
    local bodies = {
      "error('calling with ' .. leash.env('K'))",
      "return leash.retry('refused ' .. leash.env('K'))",
      "return leash.fatal('bad key ' .. leash.env('K'))",
      "return nil, 'key was ' .. leash.env('K')",
      "return false, leash.env('K')",
      "error(leash.json.encode{ h = 'Bearer ' .. leash.env('K'), q = leash.env('Q') })",
      "error(setmetatable({}, { __tostring = function() return 'obj ' .. leash.env('K') end }))",
    }
    for _, body in ipairs(bodies) do
      local out = script(body, { env = { K = KEY, Q = 'pa"ss\\word-42' } }):run()
      assert.is_nil(out.error:find("0123456789", 1, true), out.error)
      assert.is_nil(out.error:find("ss\\", 1, true), out.error)
      assert.truthy(out.error:find("[redacted]", 1, true), out.error)
    end
  end)

  it("redacts allowed values from log messages, fields and print", function()
    local h = script("leash.log.warn('key ' .. leash.env('K'), { key = leash.env('K'), n = 3, ['by_' .. leash.env('K')] = 1 })\n"
                     .. "print('printed', leash.env('K'))", { env = { K = KEY } })
    h:run()
    assert.equal("key [redacted]", h.logs[1].msg)
    assert.same({ key = "[redacted]", n = 3, ["by_[redacted]"] = 1 }, h.logs[1].fields)
    assert.equal("printed\t[redacted]", h.logs[2].msg)
  end)

  it("does not redact values shorter than 8 bytes, like the host", function()
    local out = script("error('region ' .. leash.env('R'), 0)", { env = { R = "eu-1" } }):run()
    assert.truthy(out.error:find("region eu-1", 1, true), out.error)
    assert.equal(8, testing.ENV_MIN_REDACT)
  end)

  it("lets a spec change the environment between runs", function()
    local h = script("return leash.ok(leash.env('K') or 'unset')", { env_allow = { "K" } })
    assert.equal("unset", h:run().result)
    h.environ.K = KEY
    assert.equal(KEY, h:run().result)
    h.env_allowed.K = nil
    assert.equal("retry", h:run().status)
  end)
end)
