local testing = require "leash.testing"

describe("route.lua", function()
  local h
  before_each(function() h = testing.load("examples/patterns/route.lua") end)

  it("sends each kind to its handler", function()
    assert.equal(3, h:run({ payload = { kind = "grade", text = "abcdefg" } }).result.grade)
    assert.equal("[fr] hello", h:run({ payload = { kind = "translate", text = "hello", to = "fr" } }).result.text)
    h.db:on("DELETE FROM drafts", function(_, ticket) assert.equal(9, ticket); return {}, 2 end)
    assert.equal(2, h:run({ payload = { kind = "cleanup", ticket = 9 } }).result.deleted)
  end)

  it("kills unknown, missing and non-text kinds at once", function()
    for _, payload in ipairs { { kind = "grader" }, {}, { kind = 3 }, { kind = "__index" } } do
      local out = h:run { payload = payload }
      assert.equal("dead", out.status)
      assert.truthy(out.error:find("unknown payload.kind", 1, true))
    end
  end)
end)
