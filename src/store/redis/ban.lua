-- Bans and strikes in Redis (src/store/ban.rs), on the Redis server's clock, in milliseconds.
--
-- One hash per limiter key: f = first strike of the current span, n = strikes
-- in it, u = banned until (all Unix ms). Its TTL is what still matters.
--
-- ARGV[1] is the mode:
--   'peek'   KEYS = ban keys; returns { TIME s, TIME us, then per key the ms
--            of ban left (0 = not banned) }. Writes nothing.
--   'strike' KEYS[1]; ARGV[2] after, ARGV[3] window ms, ARGV[4] ban ms.
--            Counts one rejection; returns { TIME s, TIME us, 1 if this
--            strike started a ban else 0, ms of ban left }.
-- Unix ms (~1.8e12) are exact in Lua's doubles; they are written with %d.

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local function int(x)
  return string.format('%d', x)
end

local function until_of(k)
  return tonumber(redis.call('HGET', k, 'u') or '0') or 0
end

if ARGV[1] == 'peek' then
  local out = { tonumber(time[1]), tonumber(time[2]) }
  for i = 1, #KEYS do
    out[#out + 1] = math.max(0, until_of(KEYS[i]) - now)
  end
  return out
end

local k = KEYS[1]
local after, window, ban = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local u = until_of(k)
if u > now then
  return { tonumber(time[1]), tonumber(time[2]), 0, u - now }
end
local f = tonumber(redis.call('HGET', k, 'f') or '0') or 0
local n = tonumber(redis.call('HGET', k, 'n') or '0') or 0
if n == 0 or now >= f + window then
  f = now
  n = 0
end
n = n + 1
if n >= after then
  redis.call('HSET', k, 'f', int(f), 'n', '0', 'u', int(now + ban))
  redis.call('PEXPIRE', k, int(ban))
  return { tonumber(time[1]), tonumber(time[2]), 1, ban }
end
redis.call('HSET', k, 'f', int(f), 'n', int(n), 'u', '0')
redis.call('PEXPIRE', k, int(math.max(1, f + window - now)))
return { tonumber(time[1]), tonumber(time[2]), 0, 0 }
