-- Shared by settle.lua and finish.lua (prepended to each when loaded,
-- after ceiling.lua).
-- Sets the cost an open lease took from a window (hash `h`; `rec`, the
-- lease's field, is "slice end:cost") to `actual`: sets, never adds, so a
-- repeat changes nothing. A slice that aged out has nothing left to
-- correct. Returns the slice end, or nil for a record it cannot read (an
-- older version wrote a cost past 10^14 in exponent form): that lease's
-- cost stays as taken.
local function set_lease_cost(h, rec, actual)
  local e, old = string.match(rec, '^(%d+):(%d+)$')
  if not e then return nil end
  old = tonumber(old)
  local c = tonumber(redis.call('HGET', h, e))
  if c then
    c = capped(c - old + actual)
    local sum = capped((tonumber(redis.call('HGET', h, '_sum')) or 0) - old + actual)
    redis.call('HSET', h, e, c, '_sum', sum)
  end
  return e
end

