-- Checks and takes every window and slot of one admission, all or none.
-- KEYS: per window its log (zset lease->time) and costs (hash lease->cost,
--       plus `_sum`); then per slot its holders (zset lease->expiry);
--       last the lease counter.
-- ARGV: now_ms, n_windows, n_slots, slot_lease_ms,
--       per window: limit, window_ms, cost, enforce (1/0),
--       per slot: limit, enforce.
-- Returns {0, kind, index, retry_ms} when refused (kind 1 window, 2 slot;
-- retry_ms -1: never fits), or {1, lease, would_kind, would_index,
-- would_retry_ms, remaining...} when taken (would_kind 0: nothing).
local now = tonumber(ARGV[1])
local nw = tonumber(ARGV[2])
local ns = tonumber(ARGV[3])
local slot_ms = tonumber(ARGV[4])

local function drop_expired(z, h, cutoff, sum)
  while true do
    local old = redis.call('ZRANGEBYSCORE', z, '-inf', cutoff, 'LIMIT', 0, 1000)
    if #old == 0 then return sum end
    local costs = redis.call('HMGET', h, unpack(old))
    for j = 1, #costs do sum = sum - (tonumber(costs[j]) or 0) end
    redis.call('HDEL', h, unpack(old))
    redis.call('ZREM', z, unpack(old))
  end
end

local would = {0, 0, 0}
local sums = {}
for i = 1, nw do
  local z, h = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 4 + (i - 1) * 4
  local limit, win, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local enforce = ARGV[a + 4] == '1'
  local sum = tonumber(redis.call('HGET', h, '_sum')) or 0
  sum = drop_expired(z, h, now - win, sum)
  if sum < 0 then sum = 0 end
  redis.call('HSET', h, '_sum', sum)
  if sum + cost > limit then
    local retry = -1
    if cost <= limit then
      retry = 0
      local entries = redis.call('ZRANGE', z, 0, -1, 'WITHSCORES')
      local rem = sum
      for j = 1, #entries, 2 do
        rem = rem - (tonumber(redis.call('HGET', h, entries[j])) or 0)
        if rem + cost <= limit then
          retry = tonumber(entries[j + 1]) + win - now
          break
        end
      end
    end
    if enforce then return {0, 1, i - 1, retry} end
    if would[1] == 0 then would = {1, i - 1, retry} end
  end
  sums[i] = sum
end
for i = 1, ns do
  local s = KEYS[2 * nw + i]
  local a = 4 + nw * 4 + (i - 1) * 2
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
  local z, h = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 4 + (i - 1) * 4
  local limit, win, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local sum = sums[i] + cost
  redis.call('ZADD', z, now, lease)
  redis.call('HSET', h, lease, cost, '_sum', sum)
  -- Bounded: a log lives as long as its newest entry can matter.
  redis.call('PEXPIRE', z, win + 60000)
  redis.call('PEXPIRE', h, win + 60000)
  local left = limit - sum
  if left < 0 then left = 0 end
  out[#out + 1] = left
end
for i = 1, ns do
  local s = KEYS[2 * nw + i]
  redis.call('ZADD', s, now + slot_ms, lease)
  redis.call('PEXPIRE', s, slot_ms * 2 + 60000)
end
return out
