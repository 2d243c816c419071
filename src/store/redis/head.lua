-- tollgate's limiter arithmetic (src/limiter/*.rs) run inside Redis: one atomic call per request.
--
-- The script is assembled at build time (src/store/redis.rs): this head
-- (Redis' time, the helpers every algorithm shares, the registry), then
-- each algorithm's part, beside its arithmetic (src/limiter/<name>.lua,
-- registering `algorithms.<tag>`; src/limiter/script.rs says what it holds),
-- then the modes (modes.lua) and leases (lease.lua), which reach an
-- algorithm only through the registry.
--
-- ARGV[1] is the mode:
--   'check'   KEYS = every limiter key of one request; then 8 ARGV per key:
--             tag, shadow ('1'/'0'), member (a concurrency slot's id, else
--             empty), p1 … p5 (the algorithm's parameters, see its .lua).
--             Checks every limiter, decides admission, records, returns quotas.
--   'peek'    same arguments; computes the quotas and writes nothing.
--   'refund'  KEYS[1]; ARGV[2] tag, ARGV[3] the shape's span (window or
--             interval), ARGV[4] the unit's place (decimal Unix ns: a fixed
--             window's start, a sliding window's entry, a token's place in
--             the bucket's debt). Gives back what one `count:` request took,
--             as far as it still weighs (see count.rs). ARGV[5], optional:
--             how many units (default 1; a lease's unspent units go back
--             this way, see lease.lua). ARGV[6], optional: the decision's
--             instant (tb: a token taken before the bucket was last full
--             gives nothing back).
--   'lease'   'check', then leases (see lease.lua, appended to this script).
--   'release' KEYS[1]; ARGV[2] tag, ARGV[3] member, ARGV[4] the shape's
--             span, ARGV[5] the ticket (Unix ns): gives back a concurrency
--             slot (the member) or a leaky bucket's place (the ticket).
--
-- A key's shape is `<tag>:<p2>`: state built under another algorithm or
-- window/rate (a reload changed it) means nothing, and the key starts
-- afresh, as in the in-memory table.
--
-- Time is the Redis server's TIME, so proxies with skewed clocks agree.
-- Lua numbers are doubles: Unix nanoseconds (~1.8e18) need more than 53
-- bits, so instants are stored as decimal strings and only ever handled as
-- exact nanoseconds relative to now (exact while |difference| < 2^53 ns,
-- about 104 days; the Rust side refuses longer windows).
--
-- Returns for check/peek: { TIME seconds, TIME microseconds, then per key:
-- ruling (0 allow, 1 delay, 2 deny), its ns, remaining, reset_after ns,
-- mark (the state's `st.mark`, else 0) }.

local E9 = 1000000000
local time = redis.call('TIME')
local sec = tonumber(time[1])
local frac = tonumber(time[2]) * 1000
local now_ms = sec * 1000 + math.floor(frac / 1000000)
local mode = ARGV[1]
local writes = mode ~= 'peek'

-- A stored instant (decimal Unix ns) as ns relative to now.
local function rel(s)
  if not s then
    return nil
  end
  local n = #s
  if n <= 9 then
    return -sec * E9 + (tonumber(s) - frac)
  end
  return (tonumber(string.sub(s, 1, n - 9)) - sec) * E9 + (tonumber(string.sub(s, n - 8)) - frac)
end

-- now + d as a decimal Unix ns string.
local function at(d)
  local total = frac + d
  local carry = math.floor(total / E9)
  return string.format('%d%09d', sec + carry, total - carry * E9)
end

local function int(x)
  return string.format('%d', x)
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

-- Keys expire exactly when the algorithm no longer needs them.
local function expire(k, d)
  if d <= 0 then
    redis.call('DEL', k)
  else
    redis.call('PEXPIRE', k, int(math.ceil(d / 1000000)))
  end
end

-- Whether the key holds state of type `ty` and this shape (a hash keeps its
-- shape under 's', a list as its first entry; a sorted set's members are its
-- whole state), and whether it exists at all.
local function shaped(k, ty, shape)
  local found = redis.call('TYPE', k)['ok']
  if found == 'none' then
    return false, false
  end
  if found ~= ty then
    return false, true
  end
  if ty == 'hash' then
    return redis.call('HGET', k, 's') == shape, true
  elseif ty == 'list' then
    return redis.call('LINDEX', k, 0) == shape, true
  end
  return true, true
end

-- Whether the key holds usable state; a key of another algorithm or shape
-- is deleted (when this call writes), so the algorithm starts afresh.
local function usable(k, ty, shape)
  local ok, exists = shaped(k, ty, shape)
  if exists and not ok and writes then
    redis.call('DEL', k)
  end
  return ok
end

-- The algorithms' parts, by tag.
local algorithms = {}
