-- Leased quotas (src/limiter/lease.rs), after modes.lua in the same
-- chunk, so the request's keys, arguments, states and `admitted` are in
-- scope here, after every limiter was checked and recorded.
--
-- Mode 'lease' is 'check' plus, after the 8 ARGV per key, 3 more per key:
-- max (0: no lease for this key), share, term (ns). Only an admitted request
-- takes leases. The reply is 'check's, then one number per key: the units
-- leased (0: none). The quotas in the reply are read before the lease was
-- taken: the leased units are this tollgate's to spend.
--
-- The units are counted in the shared state at once, as if spent at the end
-- of the term where timing matters, so no interval ever holds more
-- admissions than the limit, wherever and whenever they are spent:
-- each algorithm that takes leases says how in its own `lease` (a fixed
-- window counts them in its window, a sliding window logs them at
-- now + term, a token bucket is charged as if they were taken at now + term).

local function lease_size(max, share, remaining)
  if max <= 0 or remaining <= 0 then
    return 0
  end
  return math.min(max, math.floor(remaining / share))
end

local base = 1 + n * PER_KEY
for i = 1, n do
  local b = base + (i - 1) * 3
  local max, share, term = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local size = function(remaining)
    return lease_size(max, share, remaining)
  end
  local a, g = args[i], 0
  if admitted and max > 0 and a.alg.lease then
    g = a.alg.lease(KEYS[i], a, states[i], size, term)
  end
  out[#out + 1] = g
end
return out
