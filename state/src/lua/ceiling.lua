-- Prepended to admit.lua, settle.lua and finish.lua. Every window sum and
-- slice cost a script writes is capped at 2^52 (policy's `MAX_SUM`; the
-- store clamps each cost to `MAX_COST`, 2^50, before it gets here): Lua
-- numbers are doubles, exact below 2^53, and past 10^17 Redis writes them
-- as `1.8e+19`, which no later HINCRBY or integer read accepts.
local MAX_SUM = 4503599627370496
local function capped(x)
  if x > MAX_SUM then return MAX_SUM end
  if x < 0 then return 0 end
  return x
end
