-- Sliding windows (sliding_window.rs) in the Redis store's script.
-- p1 limit, p2 window.
-- A list: the shape, then the admissions' instants (decimal Unix ns), oldest first.
do
  local sw = { type = 'list' }
  algorithms.sw = sw

  function sw.load(k, p, ok, shape)
    local window = p[2]
    local st = { count = 0, skip = 0 }
    if not ok then
      return st
    end
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
    return st
  end

  -- Instant (relative ns) of the entry at 0-based position i among those that count.
  local function entry(k, st, i)
    return rel(redis.call('LINDEX', k, 1 + st.skip + i))
  end

  function sw.check(k, p, st)
    if st.count < p[1] then
      return 0, 0
    end
    if p[1] == 0 then
      return 2, math.max(p[2], 1)
    end
    local must_leave = entry(k, st, st.count - p[1])
    return 2, math.max(must_leave + p[2], 1)
  end

  function sw.record(k, a, st, admitted)
    local p = a.p
    if admitted then
      local len = redis.call('LLEN', k)
      if len == 0 then
        redis.call('RPUSH', k, a.shape, at(0))
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
        redis.call('RPUSH', k, a.shape, unpack(all))
      end
      st.count = st.count + 1
    end
    -- Only the newest `limit` entries can change an answer.
    local excess = st.count - p[1]
    if excess > 0 then
      redis.call('LTRIM', k, excess, -1)
      redis.call('LSET', k, 0, a.shape)
      st.count = p[1]
    end
    if st.count == 0 then
      redis.call('DEL', k)
    else
      expire(k, rel(redis.call('LINDEX', k, -1)) + p[2])
    end
  end

  function sw.quota(k, p, st)
    local reset = 0
    if st.count > 0 then
      reset = math.max(0, entry(k, st, st.count - 1) + p[2])
    end
    return math.max(0, p[1] - st.count), reset
  end

  -- Takes out `units` entries written at `place`.
  function sw.refund(k, place, units)
    return redis.call('LREM', k, units, place)
  end

  -- The units are logged at now + term: each counts a whole window after
  -- any instant it may be spent at.
  function sw.lease(k, a, st, size, term)
    local p = a.p
    local g = size(p[1] - st.count)
    if g <= 0 then
      return 0
    end
    local stamp = at(term)
    local units = {}
    for j = 1, g do
      units[j] = stamp
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
        table.insert(all, j + 1, stamp)
      end
      redis.call('DEL', k)
      redis.call('RPUSH', k, a.shape, unpack(all))
    end
    st.count = st.count + g
    expire(k, rel(redis.call('LINDEX', k, -1)) + p[2])
    return g
  end
end
