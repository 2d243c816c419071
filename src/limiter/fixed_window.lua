-- Fixed windows (fixed_window.rs) in the Redis store's script.
-- p1 limit, p2 window, p3 g, p4 w1, p5 a (g = gcd(1e9, window),
-- w1 = window / g, a = 1e9 / g: the window's start from TIME, exactly).
-- A hash: s shape, w the window's start (decimal Unix ns), n the count.
do
  local fw = { type = 'hash' }
  algorithms.fw = fw

  function fw.load(k, p, ok)
    local pos = (p[3] * (((sec % p[4]) * p[5]) % p[4]) + frac) % p[2]
    local st = { pos = pos, start = at(-pos), count = 0 }
    if ok and redis.call('HGET', k, 'w') == st.start then
      st.count = tonumber(redis.call('HGET', k, 'n'))
    end
    return st
  end

  function fw.check(_, p, st)
    if st.count < p[1] then
      return 0, 0
    end
    return 2, p[2] - st.pos
  end

  function fw.record(k, a, st, admitted)
    -- Every attempt counts, also a refused one, but only in a window this
    -- key has already counted in: a refused request creates no key.
    if admitted or st.count > 0 then
      st.count = st.count + 1
      redis.call('HSET', k, 's', a.shape, 'w', st.start, 'n', int(st.count))
      expire(k, 2 * a.p[2] - st.pos)
    end
  end

  function fw.quota(_, p, st)
    return math.max(0, p[1] - st.count), p[2] - st.pos
  end

  -- Gives back units counted in the window that starts at `place`.
  function fw.refund(k, place, units)
    local n = tonumber(redis.call('HGET', k, 'n') or '0')
    if redis.call('HGET', k, 'w') == place and n > 0 then
      redis.call('HSET', k, 'n', int(math.max(0, n - units)))
      return 1
    end
    return 0
  end

  -- The window's count grows by the units: they are spent in this window.
  function fw.lease(k, a, st, size)
    local g = size(a.p[1] - st.count)
    if g > 0 then
      st.count = st.count + g
      redis.call('HSET', k, 'n', int(st.count))
    end
    return g
  end
end
