-- tollgate's limiter arithmetic (src/limiter/*.rs) run inside Redis: one atomic call per request.
--
-- ARGV[1] is the mode:
--   'check'   KEYS = every limiter key of one request; then 7 ARGV per key:
--             kind, shadow ('1'/'0'), p1, p2, p3, p4, p5 (see below). Checks
--             every limiter, decides admission, records, returns quotas.
--   'peek'    same arguments; computes the quotas and writes nothing.
--   'refund'  KEYS[1]; ARGV[2] kind (fw, sw, tb), ARGV[3] window or interval,
--             ARGV[4] the unit's place: for fw the window start, for sw the
--             entry, for tb the instant the bucket was full again right
--             after the request plus what refunds had given back by then
--             (decimal Unix ns; see token_bucket.rs). Gives back what one
--             `count:` request took, as far as it still weighs (see count.rs).
--             ARGV[5], optional: how many units (default 1; a lease's
--             unspent units go back this way, see lease.lua).
--             ARGV[6], optional: the decision's instant (tb: a token taken
--             before the bucket was last full gives nothing back).
--   'lease'   'check', then leases (see lease.lua, appended to this script).
--   'release' KEYS[1]; ARGV[2] kind: 'cc' then the member to remove, or
--             'lb' then the interval and the ticket (Unix ns) to give back.
--
-- Kinds and parameters (times in nanoseconds):
--   fw fixed window     p1 limit, p2 window, p3 g, p4 w1, p5 a
--                       (g = gcd(1e9, window), w1 = window / g, a = 1e9 / g)
--   sw sliding window   p1 limit, p2 window
--   tb token bucket     p1 capacity, p2 interval
--   lb leaky bucket     p1 capacity, p2 interval
--   cc concurrency      p1 max in flight, p2 lease (ms), p3 member id
--
-- Time is the Redis server's TIME, so proxies with skewed clocks agree.
-- Lua numbers are doubles: Unix nanoseconds (~1.8e18) need more than 53
-- bits, so instants are stored as decimal strings and only ever handled as
-- exact nanoseconds relative to now (exact while |difference| < 2^53 ns,
-- about 104 days; the Rust side refuses longer windows).
--
-- Returns for check/peek: { TIME seconds, TIME microseconds, then per key:
-- verdict (0 allow, 1 delay, 2 deny), verdict ns, remaining, reset_after ns,
-- mark (tb: ns given back by refunds since the bucket was last full; else 0) }.
--
-- A tb hash: s shape, t when the bucket is full again, e the admission that
-- found it full last (decimal Unix ns), r ns refunds took off t since then,
-- h the refunds' holes not folded yet, "place:size ..." by place (see
-- src/limiter/token_bucket/refunds.rs, which this follows step by step).

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

local TYPE_OF = { fw = 'hash', tb = 'hash', lb = 'hash', sw = 'list', cc = 'zset' }

-- Whether the key holds state of this algorithm and shape. State built under
-- another algorithm or window/rate (a reload changed it) means nothing: the
-- key starts afresh, as in the in-memory table.
local function usable(k, kind, shape)
  local ty = redis.call('TYPE', k)['ok']
  if ty == 'none' then
    return false
  end
  local ok = ty == TYPE_OF[kind]
  if ok and kind == 'sw' then
    ok = redis.call('LINDEX', k, 0) == shape
  elseif ok and kind ~= 'cc' then
    ok = redis.call('HGET', k, 's') == shape
  end
  if not ok and writes then
    redis.call('DEL', k)
  end
  return ok
end

-- Holes kept before the one furthest ahead is folded (refunds.rs MAX_HOLES).
local MAX_HOLES = 8

-- A tb refund: the part of the token ticketed at `place` still unpaid.
local function tb_refund(k, place, interval, decided)
  local f = redis.call('HMGET', k, 't', 'e', 'r', 'h')
  local debt = math.max(0, rel(f[1]) or 0)
  if debt == 0 or not f[2] or (decided and rel(decided) < rel(f[2])) then
    return 0
  end
  local total, holes, base = tonumber(f[3] or '0'), {}, tonumber(f[3] or '0')
  for p, n in string.gmatch(f[4] or '', '(%d+):(%d+)') do
    holes[#holes + 1] = { p, tonumber(n) }
    base = base - tonumber(n)
  end
  -- Holes whose place has passed: every token still owing is behind them.
  while #holes > 0 and rel(holes[1][1]) - (base + holes[1][2]) <= 0 do
    base = base + holes[1][2]
    table.remove(holes, 1)
  end
  local p = rel(place)
  local newest = p >= debt + total
  local ahead, at_i = base, #holes + 1
  for i, h in ipairs(holes) do
    if rel(h[1]) >= p then
      at_i = i
      break
    end
    ahead = ahead + h[2]
  end
  local unpaid = math.min(interval, math.max(0, p - ahead))
  local left = math.max(0, debt - unpaid)
  local given = debt - left
  if given > 0 and not newest then
    total = total + given
    table.insert(holes, at_i, { place, given })
    if #holes > MAX_HOLES then
      table.remove(holes, 1)
    end
  end
  local text = {}
  for i, h in ipairs(holes) do
    text[i] = h[1] .. ':' .. int(h[2])
  end
  redis.call('HSET', k, 't', at(left), 'r', int(total), 'h', table.concat(text, ' '))
  expire(k, left)
  return given > 0 and 1 or 0
end

if mode == 'refund' then
  local k, kind = KEYS[1], ARGV[2]
  local units = tonumber(ARGV[5] or '1')
  local shape = kind .. ':' .. ARGV[3]
  local ty = redis.call('TYPE', k)['ok']
  if kind == 'sw' then
    if ty == 'list' and redis.call('LINDEX', k, 0) == shape then
      return redis.call('LREM', k, units, ARGV[4])
    end
    return 0
  end
  if ty ~= 'hash' or redis.call('HGET', k, 's') ~= shape then
    return 0
  end
  if kind == 'fw' then
    local n = tonumber(redis.call('HGET', k, 'n') or '0')
    if redis.call('HGET', k, 'w') == ARGV[4] and n > 0 then
      redis.call('HSET', k, 'n', int(math.max(0, n - units)))
      return 1
    end
  elseif kind == 'tb' then
    return tb_refund(k, ARGV[4], tonumber(ARGV[3]), ARGV[6])
  end
  return 0
end

if mode == 'release' then
  local k = KEYS[1]
  if ARGV[2] == 'cc' then
    redis.call('ZREM', k, ARGV[3])
    return 1
  end
  -- Leaky bucket: only the last slot can be handed back (see leaky_bucket.rs).
  local iv = math.max(tonumber(ARGV[3]), 1)
  local ticket = ARGV[4]
  if redis.call('TYPE', k)['ok'] ~= 'hash' or redis.call('HGET', k, 's') ~= 'lb:' .. ARGV[3] then
    return 0
  end
  local t = rel(ticket)
  local nf = rel(redis.call('HGET', k, 't'))
  if nf and t > 0 and t + iv == nf then
    redis.call('HSET', k, 't', ticket)
    expire(k, t)
    return 1
  end
  return 0
end

-- Per-kind state as plain Lua values, loaded once per key.
local function load(k, kind, p, shape)
  local st = {}
  local ok = usable(k, kind, shape)
  if kind == 'fw' then
    local pos = (p[3] * (((sec % p[4]) * p[5]) % p[4]) + frac) % p[2]
    st.pos = pos
    st.start = at(-pos)
    st.count = 0
    if ok and redis.call('HGET', k, 'w') == st.start then
      st.count = tonumber(redis.call('HGET', k, 'n'))
    end
  elseif kind == 'sw' then
    local window = p[2]
    local entries = {}
    if ok then
      if writes then
        -- Entries that no longer count change no answer: drop them first.
        local len = redis.call('LLEN', k)
        local stale = 0
        while stale < len - 1 and rel(redis.call('LINDEX', k, 1 + stale)) + window <= 0 do
          stale = stale + 1
        end
        if stale > 0 then
          redis.call('LTRIM', k, stale, -1)
          redis.call('LSET', k, 0, shape)
        end
        st.count = redis.call('LLEN', k) - 1
      else
        local all = redis.call('LRANGE', k, 1, -1)
        local first = #all + 1
        for i = 1, #all do
          if rel(all[i]) + window > 0 then
            first = i
            break
          end
        end
        st.count = #all - first + 1
        st.skip = first - 1
      end
    else
      st.count = 0
    end
    st.skip = st.skip or 0
  elseif kind == 'tb' or kind == 'lb' then
    st.debt = 0
    if ok then
      st.debt = math.max(0, rel(redis.call('HGET', k, 't')) or 0)
    end
    if kind == 'tb' and st.debt > 0 then
      st.refunded = tonumber(redis.call('HGET', k, 'r') or '0')
    end
  elseif kind == 'cc' then
    if ok and writes then
      redis.call('ZREMRANGEBYSCORE', k, '-inf', int(now_ms))
      st.count = redis.call('ZCARD', k)
    elseif ok then
      st.count = redis.call('ZCOUNT', k, '(' .. int(now_ms), '+inf')
    else
      st.count = 0
    end
  end
  return st
end

-- Instant (relative ns) of the sliding-window entry at 0-based position i among those that count.
local function sw_entry(k, st, i)
  return rel(redis.call('LINDEX', k, 1 + st.skip + i))
end

local function leaky_waiting(d, iv)
  return math.max(0, ceil_div(d, iv) - 1)
end

-- (verdict, ns) without changing anything.
local function check(k, kind, p, st)
  if kind == 'fw' then
    if st.count < p[1] then
      return 0, 0
    end
    return 2, p[2] - st.pos
  elseif kind == 'sw' then
    if st.count < p[1] then
      return 0, 0
    end
    if p[1] == 0 then
      return 2, math.max(p[2], 1)
    end
    local must_leave = sw_entry(k, st, st.count - p[1])
    return 2, math.max(must_leave + p[2], 1)
  elseif kind == 'tb' then
    if p[1] == 0 then
      return 2, math.max(p[2], 1)
    end
    local tolerance = (p[1] - 1) * p[2]
    if st.debt <= tolerance then
      return 0, 0
    end
    return 2, st.debt - tolerance
  elseif kind == 'lb' then
    local iv = math.max(p[2], 1)
    if st.debt == 0 then
      return 0, 0
    end
    if leaky_waiting(st.debt, iv) < p[1] then
      return 1, st.debt
    end
    return 2, st.debt - p[1] * iv
  else
    if st.count < p[1] then
      return 0, 0
    end
    return 2, E9
  end
end

local function record(k, kind, p, st, admitted, shape, member)
  if kind == 'fw' then
    -- Every attempt counts, also a refused one, but only in a window this
    -- key has already counted in: a refused request creates no key.
    if admitted or st.count > 0 then
      st.count = st.count + 1
      redis.call('HSET', k, 's', shape, 'w', st.start, 'n', int(st.count))
      expire(k, 2 * p[2] - st.pos)
    end
  elseif kind == 'sw' then
    if admitted then
      local len = redis.call('LLEN', k)
      if len == 0 then
        redis.call('RPUSH', k, shape, at(0))
      elseif len == 1 or rel(redis.call('LINDEX', k, -1)) <= 0 then
        redis.call('RPUSH', k, at(0))
      else
        -- Redis' clock stepped back: file the entry where it belongs.
        local all = redis.call('LRANGE', k, 1, -1)
        local i = #all
        while i > 0 and rel(all[i]) > 0 do
          i = i - 1
        end
        table.insert(all, i + 1, at(0))
        redis.call('DEL', k)
        redis.call('RPUSH', k, shape, unpack(all))
      end
      st.count = st.count + 1
    end
    -- Only the newest `limit` entries can change an answer.
    local excess = st.count - p[1]
    if excess > 0 then
      redis.call('LTRIM', k, excess, -1)
      redis.call('LSET', k, 0, shape)
      st.count = p[1]
    end
    if st.count == 0 then
      redis.call('DEL', k)
    else
      expire(k, rel(redis.call('LINDEX', k, -1)) + p[2])
    end
  elseif kind == 'tb' or kind == 'lb' then
    if admitted and kind == 'tb' and st.debt == 0 then
      -- Full: earlier tokens are paid off, a new debt starts (token_bucket.rs).
      st.refunded = 0
      redis.call('HSET', k, 'e', at(0), 'r', '0', 'h', '')
    end
    if admitted then
      st.debt = st.debt + math.max(p[2], kind == 'lb' and 1 or 0)
      redis.call('HSET', k, 's', shape, 't', at(st.debt))
      expire(k, st.debt)
    end
  elseif admitted then
    redis.call('ZADD', k, int(now_ms + p[2]), member)
    redis.call('PEXPIRE', k, int(p[2]))
    st.count = st.count + 1
  end
end

-- (remaining, reset_after ns) as the headers show them.
local function quota(k, kind, p, st)
  if kind == 'fw' then
    return math.max(0, p[1] - st.count), p[2] - st.pos
  elseif kind == 'sw' then
    local reset = 0
    if st.count > 0 then
      reset = math.max(0, sw_entry(k, st, st.count - 1) + p[2])
    end
    return math.max(0, p[1] - st.count), reset
  elseif kind == 'tb' then
    return math.max(0, p[1] - ceil_div(st.debt, math.max(p[2], 1))), st.debt
  elseif kind == 'lb' then
    local iv = math.max(p[2], 1)
    return math.max(0, p[1] - leaky_waiting(st.debt, iv)), math.max(0, st.debt - iv)
  else
    return math.max(0, p[1] - st.count), 0
  end
end

local n = #KEYS
local args, states, verdicts = {}, {}, {}
local admitted = true
for i = 1, n do
  local b = 1 + (i - 1) * 7
  local kind = ARGV[b + 1]
  local a = {
    kind = kind,
    shadow = ARGV[b + 2] == '1',
    shape = kind .. ':' .. ARGV[b + 4],
    member = ARGV[b + 5],
    p = { tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]) },
  }
  if kind == 'cc' then
    a.shape = 'cc'
  end
  args[i] = a
  states[i] = load(KEYS[i], kind, a.p, a.shape)
  local v, ns = check(KEYS[i], kind, a.p, states[i])
  verdicts[i] = { v, ns }
  if v == 2 and not a.shadow then
    admitted = false
  end
end

local out = { sec, tonumber(time[2]) }
for i = 1, n do
  local a = args[i]
  if writes then
    record(KEYS[i], a.kind, a.p, states[i], admitted, a.shape, a.member)
  end
  local remaining, reset = quota(KEYS[i], a.kind, a.p, states[i])
  out[#out + 1] = verdicts[i][1]
  out[#out + 1] = verdicts[i][2]
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = states[i].refunded or 0
end
if mode ~= 'lease' then
  return out
end

