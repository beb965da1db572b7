-- Checks and takes every window and slot of one admission, all or none.
-- KEYS: per window its slices (zset slice end -> end), costs (hash: slice
--       end -> cost, `_sum`, and `l<lease>` -> "end:cost" per open lease)
--       and open leases (zset lease -> slice end); then per slot its
--       holders (zset lease->expiry); last the lease counter.
-- ARGV: now_ms, n_windows, n_slots, slot_lease_ms,
--       per window: limit, window_ms, slice_ms, cost, enforce (1/0),
--       per slot: limit, enforce.
-- Returns {0, kind, index, retry_ms} when refused (kind 1 window, 2 slot;
-- retry_ms -1: never fits), or {1, lease, would_kind, would_index,
-- would_retry_ms, remaining...} when taken (would_kind 0: nothing).
-- A window holds at most window/slice + 1 slices, however busy it is.
local now = tonumber(ARGV[1])
local nw = tonumber(ARGV[2])
local ns = tonumber(ARGV[3])
local slot_ms = tonumber(ARGV[4])

-- Slices whose end plus the window is past: their cost has left. (In
-- chunks: a window holds ~600 slices, but a log written by an older
-- version held one member per admission.) Open leases of those slices are
-- forgotten too: one whose instance died before finishing cannot pile up.
local function drop_expired(z, h, o, cutoff, sum)
  while true do
    local old = redis.call('ZRANGEBYSCORE', z, '-inf', cutoff, 'LIMIT', 0, 1000)
    if #old == 0 then break end
    local costs = redis.call('HMGET', h, unpack(old))
    for j = 1, #costs do sum = sum - (tonumber(costs[j]) or 0) end
    redis.call('HDEL', h, unpack(old))
    redis.call('ZREM', z, unpack(old))
  end
  while true do
    local gone = redis.call('ZRANGEBYSCORE', o, '-inf', cutoff, 'LIMIT', 0, 1000)
    if #gone == 0 then return sum end
    local fields = {}
    for j = 1, #gone do fields[j] = 'l' .. gone[j] end
    redis.call('HDEL', h, unpack(fields))
    redis.call('ZREM', o, unpack(gone))
  end
end

-- When enough of the oldest slices have left for `cost` to fit.
local function retry_ms(z, h, sum, cost, limit, win)
  local rem, from = sum, 0
  while true do
    local slices = redis.call('ZRANGE', z, from, from + 999, 'WITHSCORES')
    if #slices == 0 then return 0 end
    local ends = {}
    for j = 1, #slices, 2 do ends[#ends + 1] = slices[j] end
    local costs = redis.call('HMGET', h, unpack(ends))
    for j = 1, #ends do
      rem = rem - (tonumber(costs[j]) or 0)
      if rem + cost <= limit then
        return tonumber(slices[2 * j]) + win - now
      end
    end
    from = from + 1000
  end
end

local would = {0, 0, 0}
local sums = {}
for i = 1, nw do
  local z, h, o = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local a = 4 + (i - 1) * 5
  local limit, win, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 4])
  local enforce = ARGV[a + 5] == '1'
  local sum = tonumber(redis.call('HGET', h, '_sum')) or 0
  sum = capped(drop_expired(z, h, o, now - win, sum))
  redis.call('HSET', h, '_sum', sum)
  if sum + cost > limit then
    local retry = -1
    if cost <= limit then retry = retry_ms(z, h, sum, cost, limit, win) end
    if enforce then return {0, 1, i - 1, retry} end
    if would[1] == 0 then would = {1, i - 1, retry} end
  end
  sums[i] = sum
end
for i = 1, ns do
  local s = KEYS[3 * nw + i]
  local a = 4 + nw * 5 + (i - 1) * 2
  local limit, enforce = tonumber(ARGV[a + 1]), ARGV[a + 2] == '1'
  -- Holders whose lease ran out (an instance died) give their slot back.
  redis.call('ZREMRANGEBYSCORE', s, '-inf', now)
  if redis.call('ZCARD', s) >= limit then
    if enforce then return {0, 2, i - 1, 0} end
    if would[1] == 0 then would = {2, i - 1, 0} end
  end
end

local lease = redis.call('INCR', KEYS[#KEYS])
local out = {1, lease, would[1], would[2], would[3]}
for i = 1, nw do
  local z, h, o = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local a = 4 + (i - 1) * 5
  local limit, win, slice, cost =
    tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local sum = capped(sums[i] + cost)
  local e = (math.floor(now / slice) + 1) * slice
  local ek = string.format('%d', e)
  -- Added and capped here, not by HINCRBY: a slice holding a number an
  -- older version wrote past 2^63 (as `1.8e+19`) is healed, not refused.
  local c = capped((tonumber(redis.call('HGET', h, ek)) or 0) + cost)
  redis.call('ZADD', z, e, ek)
  redis.call('HSET', h, ek, c, '_sum', sum, 'l' .. lease, ek .. ':' .. string.format('%d', cost))
  redis.call('ZADD', o, e, lease)
  -- Bounded: the window lives as long as its newest slice can matter.
  redis.call('PEXPIRE', z, win + slice + 60000)
  redis.call('PEXPIRE', h, win + slice + 60000)
  redis.call('PEXPIRE', o, win + slice + 60000)
  local left = limit - sum
  if left < 0 then left = 0 end
  out[#out + 1] = left
end
for i = 1, ns do
  local s = KEYS[3 * nw + i]
  redis.call('ZADD', s, now + slot_ms, lease)
  redis.call('PEXPIRE', s, slot_ms * 2 + 60000)
end
return out
