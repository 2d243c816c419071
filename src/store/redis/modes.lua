-- The modes (see the head): each reaches an algorithm through `algorithms`,
-- by the tag its arguments name.

if mode == 'refund' then
  local k, alg = KEYS[1], algorithms[ARGV[2]]
  if not (alg and alg.refund and shaped(k, alg.type, ARGV[2] .. ':' .. ARGV[3])) then
    return 0
  end
  return alg.refund(k, ARGV[4], tonumber(ARGV[5] or '1'), tonumber(ARGV[3]), ARGV[6])
end

if mode == 'release' then
  local alg = algorithms[ARGV[2]]
  if not (alg and alg.release) then
    return 0
  end
  return alg.release(KEYS[1], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[2] .. ':' .. ARGV[4])
end

-- Arguments per key in 'check', 'peek' and 'lease' (see the head).
local PER_KEY = 8
local n = #KEYS
local args, states, rulings = {}, {}, {}
local admitted = true
for i = 1, n do
  local b = 1 + (i - 1) * PER_KEY
  local tag = ARGV[b + 1]
  local a = {
    alg = algorithms[tag],
    shadow = ARGV[b + 2] == '1',
    member = ARGV[b + 3],
    shape = tag .. ':' .. ARGV[b + 5],
    p = { tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]), tonumber(ARGV[b + 8]) },
  }
  args[i] = a
  states[i] = a.alg.load(KEYS[i], a.p, usable(KEYS[i], a.alg.type, a.shape), a.shape)
  local v, ns = a.alg.check(KEYS[i], a.p, states[i])
  rulings[i] = { v, ns }
  if v == 2 and not a.shadow then
    admitted = false
  end
end

local out = { sec, tonumber(time[2]) }
for i = 1, n do
  local a = args[i]
  if writes then
    a.alg.record(KEYS[i], a, states[i], admitted)
  end
  local remaining, reset = a.alg.quota(KEYS[i], a.p, states[i])
  out[#out + 1] = rulings[i][1]
  out[#out + 1] = rulings[i][2]
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = states[i].mark or 0
end
if mode ~= 'lease' then
  return out
end
