-- Leased quotas (src/limiter/lease.rs), appended to redis.lua: the same
-- chunk, so the request's keys, arguments, states and `admitted` are in
-- scope here, after every limiter was checked and recorded.
--
-- Mode 'lease' is 'check' plus, after the 7 ARGV per key, 3 more per key:
-- max (0: no lease for this key), share, term (ns). Only an admitted request
-- takes leases. The reply is 'check's, then one number per key: the units
-- leased (0: none). The quotas in the reply are read before the lease was
-- taken: the leased units are this tollgate's to spend.
--
-- The units are counted in the shared state at once, as if spent at the end
-- of the term where timing matters, so no interval ever holds more
-- admissions than the limit, wherever and whenever they are spent:
--   fw  the window's count grows by the units (they are spent in this window);
--   sw  the units are logged at now + term (each counts a whole window after
--       any instant it may be spent at);
--   tb  the bucket is charged as if they were taken at now + term.

local function lease_size(max, share, remaining)
  if max <= 0 or remaining <= 0 then
    return 0
  end
  return math.min(max, math.floor(remaining / share))
end

local function lease_fw(k, p, st, size)
  local g = size(p[1] - st.count)
  if g > 0 then
    st.count = st.count + g
    redis.call('HSET', k, 'n', int(st.count))
  end
  return g
end

local function lease_sw(k, a, st, size, term)
  local p = a.p
  local g = size(p[1] - st.count)
  if g <= 0 then
    return 0
  end
  local entry = at(term)
  local units = {}
  for j = 1, g do
    units[j] = entry
  end
  -- The request itself was just logged, so the list has an entry.
  if rel(redis.call('LINDEX', k, -1)) <= term then
    redis.call('RPUSH', k, unpack(units))
  else
    -- Another lease ends later (Redis' clock stepped back): keep the log sorted.
    local all = redis.call('LRANGE', k, 1, -1)
    local j = #all
    while j > 0 and rel(all[j]) > term do
      j = j - 1
    end
    for _ = 1, g do
      table.insert(all, j + 1, entry)
    end
    redis.call('DEL', k)
    redis.call('RPUSH', k, a.shape, unpack(all))
  end
  st.count = st.count + g
  expire(k, rel(redis.call('LINDEX', k, -1)) + p[2])
  return g
end

local function lease_tb(k, a, st, size, term)
  local iv = math.max(a.p[2], 1)
  local g = size(a.p[1] - ceil_div(st.debt, iv))
  if g > 0 then
    st.debt = math.max(st.debt, term) + g * iv
    redis.call('HSET', k, 's', a.shape, 't', at(st.debt))
    expire(k, st.debt)
  end
  return g
end

local base = 1 + n * 7
for i = 1, n do
  local b = base + (i - 1) * 3
  local max, share, term = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local size = function(remaining)
    return lease_size(max, share, remaining)
  end
  local a, g = args[i], 0
  if admitted and max > 0 then
    if a.kind == 'fw' then
      g = lease_fw(KEYS[i], a.p, states[i], size)
    elseif a.kind == 'sw' then
      g = lease_sw(KEYS[i], a, states[i], size, term)
    elseif a.kind == 'tb' then
      g = lease_tb(KEYS[i], a, states[i], size, term)
    end
  end
  out[#out + 1] = g
end
return out
