-- Leaky buckets (leaky_bucket.rs) in the Redis store's script.
-- p1 capacity, p2 interval.
-- A hash: s shape, t the instant the next request may be released (decimal Unix ns).
do
  local lb = { type = 'hash' }
  algorithms.lb = lb

  function lb.load(k, _, ok)
    local st = { debt = 0 }
    if ok then
      st.debt = math.max(0, rel(redis.call('HGET', k, 't')) or 0)
    end
    return st
  end

  local function waiting(d, iv)
    return math.max(0, ceil_div(d, iv) - 1)
  end

  function lb.check(_, p, st)
    local iv = math.max(p[2], 1)
    if st.debt == 0 then
      return 0, 0
    end
    if waiting(st.debt, iv) < p[1] then
      return 1, st.debt
    end
    return 2, st.debt - p[1] * iv
  end

  function lb.record(k, a, st, admitted)
    if admitted then
      st.debt = st.debt + math.max(a.p[2], 1)
      redis.call('HSET', k, 's', a.shape, 't', at(st.debt))
      expire(k, st.debt)
    end
  end

  function lb.quota(_, p, st)
    local iv = math.max(p[2], 1)
    return math.max(0, p[1] - waiting(st.debt, iv)), math.max(0, st.debt - iv)
  end

  -- Only the last place can be handed back (see leaky_bucket.rs).
  function lb.release(k, _, span, ticket, shape)
    local iv = math.max(span, 1)
    if not shaped(k, 'hash', shape) then
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
end
