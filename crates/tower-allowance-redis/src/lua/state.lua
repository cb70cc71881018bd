-- The parameters (tower_allowance::rule::Params) and the state (rule::State) of one
-- allowance: one HASH per allowance, KEYS[1]. Every number is an integer below 2^53, exact in
-- Lua's doubles; a state closed until cleared stores -1 (FOREVER).

local key = KEYS[1]
local OP = tonumber(ARGV[1])

-- Params, in `scripts::Params::argv` order.
local P = {n = tonumber(ARGV[A]), iv = {}, tol = {}, unit = {}}
for l = 1, MAX_LIMITS do
  P.iv[l] = tonumber(ARGV[A + 3 * l - 2])
  P.tol[l] = tonumber(ARGV[A + 3 * l - 1])
  P.unit[l] = tonumber(ARGV[A + 3 * l])
end
local B = A + 3 * MAX_LIMITS + 1
P.kind = tonumber(ARGV[B])
P.b1 = tonumber(ARGV[B + 1])
P.b2 = tonumber(ARGV[B + 2])
P.b3 = tonumber(ARGV[B + 3])
P.max_cd = tonumber(ARGV[B + 4])
P.pb_min = tonumber(ARGV[B + 5])
P.pb_max = tonumber(ARGV[B + 6])
P.ad_on = tonumber(ARGV[B + 7])
P.ad_init = tonumber(ARGV[B + 8])
P.ad_floor = tonumber(ARGV[B + 9])
P.ad_ceil = tonumber(ARGV[B + 10])
P.ad_burst = tonumber(ARGV[B + 11])
P.ad_adopt = tonumber(ARGV[B + 12])
local idle_ms = tonumber(ARGV[B + 13])
local channel = ARGV[B + 14]
-- The operation's own arguments start here.
local O = B + 15

-- The state, loaded a group of fields at a time.
local s = {}
local orig = {}
local loaded = {}
local function load(fields)
  local want = {}
  for _, f in ipairs(fields) do
    if not loaded[f] then want[#want + 1] = f end
  end
  if #want == 0 then return end
  local raw = redis.call('HMGET', key, unpack(want))
  for i, f in ipairs(want) do
    local v = tonumber(raw[i]) or 0
    s[f] = v
    orig[f] = v
    loaded[f] = true
  end
end

local BASE = {'bu', 'ep', 'ru', 'cl', 'cb', 'sn', 'rb', 'ex', 'gn'}
for l = 1, MAX_LIMITS do BASE[#BASE + 1] = 't' .. l end
local BUDGET = {'sp', 'hd'}
for i = 0, BUDGET_SLOTS - 1 do
  BUDGET[#BUDGET + 1] = 'd' .. i
  BUDGET[#BUDGET + 1] = 'w' .. i
end
local PROBE = {'lu', 'lt', 'np', 'pf', 'pc'}
local ADAPTIVE = {'rc', 'ca', 'sa', 'av', 'rr'}

load(BASE)
if P.ad_on == 1 then load(ADAPTIVE) end

-- Writes back what changed, and keeps a TTL covering everything the key must remember plus
-- at least half the idle TTL: the expiry moves only when it would fall short, so in the
-- steady state an admission writes its fields and sets no TTL. Closed until cleared: no TTL.
local function save()
  local args = {}
  for f, v in pairs(s) do
    if f ~= 'ex' and v ~= orig[f] then
      args[#args + 1] = f
      args[#args + 1] = string.format('%.0f', v)
    end
  end
  local ttl_cmd
  if s.cl == FOREVER then
    if s.ex ~= -1 then
      s.ex = -1
      args[#args + 1] = 'ex'
      args[#args + 1] = '-1'
      ttl_cmd = 'PERSIST'
    end
  else
    local keep_us = math.max(s.bu - now, s.ru - now, s.cl - now, 0)
    for l = 1, P.n do keep_us = math.max(keep_us, s['t' .. l] - now) end
    if loaded.np then keep_us = math.max(keep_us, s.np - now, s.lu - now) end
    if P.kind == 2 then keep_us = math.max(keep_us, P.b1 * BUDGET_SLOTS) end
    local now_ms = math.floor(now / 1000)
    local keep_ms = math.ceil(keep_us / 1000)
    if s.ex == -1 or s.ex - now_ms < keep_ms + math.floor(idle_ms / 2) then
      s.ex = now_ms + keep_ms + idle_ms
      args[#args + 1] = 'ex'
      args[#args + 1] = string.format('%.0f', s.ex)
      ttl_cmd = 'PEXPIRE'
    end
  end
  if #args > 0 then redis.call('HSET', key, unpack(args)) end
  if ttl_cmd == 'PERSIST' then
    redis.call('PERSIST', key)
  elseif ttl_cmd == 'PEXPIRE' then
    redis.call('PEXPIRE', key, string.format('%.0f', s.ex - math.floor(now / 1000)))
  end
end

-- Helpers over the state and parameters, for the rule's files that follow.

local function sat_sub(a, b) return math.max(a - b, 0) end

-- Whether closure `a` ends later than `b` (FOREVER = -1 is the latest).
local function later(a, b)
  if b == FOREVER then return false end
  if a == FOREVER then return true end
  return a > b
end

local function units(l, cost)
  if P.unit[l] == 1 then return cost end
  return 1
end

local function event(kind, w4, w5, w6, w7, w8)
  return {s.gn, s.ep, s.rb, kind, w4 or 0, w5 or 0, w6 or 0, w7 or 0, w8 or 0}
end
