-- Claims an idempotency key. KEYS: the record hash.
-- ARGV: body_sha (hex), now_ms, ttl_ms, retry_failed (1/0).
-- Returns {'fresh'} | {'mismatch'} | {state, status, has_ct, ct, body}.
local e = redis.call('HMGET', KEYS[1], 'sha', 'exp', 'st', 'status', 'has_ct', 'ct', 'body')
local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local function claim()
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'sha', ARGV[1], 'exp', now + ttl, 'st', 'inflight')
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {'fresh'}
end
if not e[1] or (tonumber(e[2]) or 0) <= now then return claim() end
if e[1] ~= ARGV[1] then return {'mismatch'} end
if e[3] == 'failed' and ARGV[4] == '1' then return claim() end
return {e[3], e[4] or '0', e[5] or '0', e[6] or '', e[7] or ''}
