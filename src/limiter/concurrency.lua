-- Concurrency (concurrency.rs) in the Redis store's script.
-- p1 max in flight, p2 how long a slot lives (ms).
-- A sorted set: one member per slot, scored by when it frees itself (Unix ms).
do
  local cc = { type = 'zset' }
  algorithms.cc = cc

  function cc.load(k, _, ok)
    local st = { count = 0 }
    if ok and writes then
      redis.call('ZREMRANGEBYSCORE', k, '-inf', int(now_ms))
      st.count = redis.call('ZCARD', k)
    elseif ok then
      st.count = redis.call('ZCOUNT', k, '(' .. int(now_ms), '+inf')
    end
    return st
  end

  function cc.check(_, p, st)
    if st.count < p[1] then
      return 0, 0
    end
    return 2, E9
  end

  function cc.record(k, a, st, admitted)
    if admitted then
      redis.call('ZADD', k, int(now_ms + a.p[2]), a.member)
      redis.call('PEXPIRE', k, int(a.p[2]))
      st.count = st.count + 1
    end
  end

  function cc.quota(_, p, st)
    return math.max(0, p[1] - st.count), 0
  end

  function cc.release(k, member)
    redis.call('ZREM', k, member)
    return 1
  end
end
