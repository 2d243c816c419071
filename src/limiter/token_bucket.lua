-- Token buckets (token_bucket.rs) in the Redis store's script.
-- p1 capacity, p2 interval.
-- A hash: s shape, t when the bucket is full again, e the admission that
-- found it full last (decimal Unix ns), r ns refunds took off t since then,
-- h the refunds' holes not folded yet, "place:size ..." by place (see
-- src/limiter/token_bucket/refunds.rs, which this follows step by step).
do
  local tb = { type = 'hash' }
  algorithms.tb = tb

  -- Holes kept before the one furthest ahead is folded (refunds.rs MAX_HOLES).
  local MAX_HOLES = 8

  function tb.load(k, _, ok)
    local st = { debt = 0 }
    if ok then
      st.debt = math.max(0, rel(redis.call('HGET', k, 't')) or 0)
    end
    if st.debt > 0 then
      st.mark = tonumber(redis.call('HGET', k, 'r') or '0')
    end
    return st
  end

  function tb.check(_, p, st)
    if p[1] == 0 then
      return 2, math.max(p[2], 1)
    end
    local tolerance = (p[1] - 1) * p[2]
    if st.debt <= tolerance then
      return 0, 0
    end
    return 2, st.debt - tolerance
  end

  function tb.record(k, a, st, admitted)
    if not admitted then
      return
    end
    if st.debt == 0 then
      -- Full: earlier tokens are paid off, a new debt starts (token_bucket.rs).
      st.mark = 0
      redis.call('HSET', k, 'e', at(0), 'r', '0', 'h', '')
    end
    st.debt = st.debt + math.max(a.p[2], 0)
    redis.call('HSET', k, 's', a.shape, 't', at(st.debt))
    expire(k, st.debt)
  end

  function tb.quota(_, p, st)
    return math.max(0, p[1] - ceil_div(st.debt, math.max(p[2], 1))), st.debt
  end

  -- The part of the token ticketed at `place` still unpaid.
  function tb.refund(k, place, _, interval, decided)
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

  -- Charged as if the units were taken at now + term.
  function tb.lease(k, a, st, size, term)
    local iv = math.max(a.p[2], 1)
    local g = size(a.p[1] - ceil_div(st.debt, iv))
    if g > 0 then
      st.debt = math.max(st.debt, term) + g * iv
      redis.call('HSET', k, 's', a.shape, 't', at(st.debt))
      expire(k, st.debt)
    end
    return g
  end
end
