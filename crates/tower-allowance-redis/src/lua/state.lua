-- The parameters (tower_allowance::rule::Params) and the state (rule::State) of one
-- allowance: one HASH per allowance, KEYS[1]. Every number is an integer below 2^53, exact in
-- Lua's doubles; a state closed until cleared stores -1 (FOREVER).

-- The call's key, operation, parameters, channel and arguments (`scripts::argv`).
local key, OP, P, channel, ARGS
-- The parameters text in force (the caller's, or the newer one stored: `config.lua`).
local PTEXT
-- The state's fields (`s`), and each loaded group's packed field as read (`loaded`).
local s, loaded

-- The state's fields in four groups, each stored packed in one field of the hash (`b`, `u`,
-- `q`, `a`: as many little-endian doubles, exact for integers below 2^53): one `HGET` and one
-- `struct.unpack` load a group, one `struct.pack` saves it. An absent group reads as zeros.
-- Each limit's theoretical arrival time: `t1` to `t4` (MAX_LIMITS).
local TAT = {}
for l = 1, MAX_LIMITS do TAT[l] = 't' .. l end
local BASE = {'bu', 'ep', 'ru', 'cl', 'cb', 'sn', 'rb', 'ex', 'gn', TAT[1], TAT[2], TAT[3], TAT[4]}
local BUDGET = {'sp', 'hd'}
for i = 0, BUDGET_SLOTS - 1 do
  BUDGET[#BUDGET + 1] = 'd' .. i
  BUDGET[#BUDGET + 1] = 'w' .. i
end
local PROBE = {'lu', 'lt', 'np', 'pf', 'pc'}
local ADAPTIVE = {'rc', 'ca', 'sa', 'av'}
-- The classes' virtual times (rule/shares.rs): `vt`, then `c1` to `c8` (MAX_CLASSES).
local CLASSES = {'vt'}
for i = 1, MAX_CLASSES do CLASSES[#CLASSES + 1] = 'c' .. i end
-- Leases (rule/grant.rs): the holders' window, its count, the last window's count.
local HOLDERS = {'hw', 'hh', 'hp'}
local FIELD = {[BASE] = 'b', [BUDGET] = 'u', [PROBE] = 'q', [ADAPTIVE] = 'a', [CLASSES] = 'c', [HOLDERS] = 'l'}
-- (Built without globals: a library's load-time code under `FUNCTION LOAD` sees none.)
local FORMAT = {}
local GROUPS = {BASE, BUDGET, PROBE, ADAPTIVE, CLASSES, HOLDERS}
for g = 1, #GROUPS do
  local f = '<'
  for _ = 1, #GROUPS[g] do f = f .. 'd' end
  FORMAT[GROUPS[g]] = f
end

-- Sets a group's fields from its packed field (`false`: absent, all zeros).
local function unpack_group(group, packed)
  loaded[group] = packed
  if packed then
    -- Written by a version whose group had fewer fields (a process not upgraded yet): the
    -- fields it lacks read as zeros.
    local short = 8 * #group - #packed
    if short > 0 then packed = packed .. string.rep('\0', short) end
    local v = {struct.unpack(FORMAT[group], packed)}
    for j = 1, #group do s[group[j]] = v[j] end
  else
    for j = 1, #group do s[group[j]] = 0 end
  end
end

-- Loads a group unless it is loaded already.
local function load(group)
  if loaded[group] ~= nil then return end
  unpack_group(group, redis.call('HGET', key, FIELD[group]))
end

-- The parameters (rule::Params), from their text: the limits' count, then per limit its
-- interval, tolerance and unit (`MAX_LIMITS` of them), the budget (kind and three values),
-- the longest cooldown, the probe's backoff (least, most), the adaptive rate (on, initial,
-- floor, ceiling, burst, adopts), and the idle TTL in milliseconds, then each block appended
-- after it (its own file parses it: "headroom", the last, in `headroom.lua`), comma-separated.
-- Parsed once per distinct text while the library stays loaded (under `EVALSHA`: per call);
-- never modified.
local PARAMS, PARAMS_COUNT = {}, 0
local function params(text)
  local p = PARAMS[text]
  if p then return p end
  local v = {}
  for x in string.gmatch(text, '[^,]+') do v[#v + 1] = tonumber(x) end
  p = {
    n = v[1],
    iv = {v[2], v[5], v[8], v[11]},
    tol = {v[3], v[6], v[9], v[12]},
    unit = {v[4], v[7], v[10], v[13]},
    kind = v[14], b1 = v[15], b2 = v[16], b3 = v[17],
    max_cd = v[18], pb_min = v[19], pb_max = v[20],
    ad_on = v[21], ad_init = v[22], ad_floor = v[23],
    ad_ceil = v[24], ad_burst = v[25], ad_adopt = v[26],
    idle_ms = v[27],
  }
  -- Block "headroom" at 28..31; later blocks ("settle", ...) follow their markers.
  if #v < 27 + 4 or MAX_LIMITS ~= 4 then return nil end
  headroom(p, v)
  if PARAMS_COUNT >= 1000 then PARAMS, PARAMS_COUNT = {}, 0 end
  PARAMS[text] = p
  PARAMS_COUNT = PARAMS_COUNT + 1
  return p
end

-- Reads one call's key, operation, parameters and channel, and loads the state's common
-- fields (and the adaptive rate's, in the same `HMGET`).
local function begin(keys, args)
  key = keys[1]
  OP = tonumber(args[1])
  ARGS = args
  channel = args[4]
  -- The common fields, the adaptive rate's and the configuration in force, in one read.
  local raw = redis.call('HMGET', key, 'b', 'a', 'k')
  local text, refusal = adopt(key, args[3], channel, raw[3])
  if not text then return false, refusal end
  P = params(text)
  if not P then return false end
  PTEXT = text
  local base, adaptive = raw[1], raw[2]
  -- The common fields, unrolled (the one group every call loads).
  local bu, ep, ru, cl, cb, sn, rb, ex, gn, t1, t2, t3, t4 = 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
  if base then
    bu, ep, ru, cl, cb, sn, rb, ex, gn, t1, t2, t3, t4 = struct.unpack(FORMAT[BASE], base)
  end
  s = {bu = bu, ep = ep, ru = ru, cl = cl, cb = cb, sn = sn, rb = rb, ex = ex, gn = gn, t1 = t1, t2 = t2, t3 = t3, t4 = t4}
  loaded = {[BASE] = base}
  if P.ad_on == 1 then unpack_group(ADAPTIVE, adaptive) end
  return true
end

-- Writes back the groups that changed, and keeps a TTL covering everything the key must
-- remember plus at least half the idle TTL: the expiry moves only when it would fall short, so
-- in the steady state an admission writes one field and sets no TTL. Closed until cleared: no
-- TTL.
local function save()
  local ttl_cmd
  if s.cl == FOREVER then
    if s.ex ~= -1 then
      s.ex = -1
      ttl_cmd = 'PERSIST'
    end
  else
    local keep_us = max(s.bu - now, s.ru - now, s.cl - now, 0)
    for l = 1, P.n do keep_us = max(keep_us, s[TAT[l]] - now) end
    if loaded[PROBE] ~= nil then keep_us = max(keep_us, s.np - now, s.lu - now) end
    if P.kind == 2 then keep_us = max(keep_us, P.b1 * BUDGET_SLOTS) end
    local now_ms = floor(now / 1000)
    local keep_ms = ceil(keep_us / 1000)
    if s.ex == -1 or s.ex - now_ms < keep_ms + floor(P.idle_ms / 2) then
      s.ex = now_ms + keep_ms + P.idle_ms
      ttl_cmd = 'PEXPIRE'
    end
  end
  local args
  for g = 1, #GROUPS do
    local group = GROUPS[g]
    local was = loaded[group]
    if was ~= nil then
      local packed
      if group == BASE then
        packed = struct.pack(FORMAT[BASE], s.bu, s.ep, s.ru, s.cl, s.cb, s.sn, s.rb, s.ex, s.gn, s.t1, s.t2, s.t3, s.t4)
      else
        local v = {}
        for j = 1, #group do v[j] = s[group[j]] end
        packed = struct.pack(FORMAT[group], unpack(v))
      end
      if packed ~= was then
        if args then
          args[#args + 1] = FIELD[group]
          args[#args + 1] = packed
        else
          args = {FIELD[group], packed}
        end
      end
    end
  end
  if args then redis.call('HSET', key, unpack(args)) end
  if ttl_cmd == 'PERSIST' then
    redis.call('PERSIST', key)
  elseif ttl_cmd == 'PEXPIRE' then
    redis.call('PEXPIRE', key, string.format('%.0f', s.ex - floor(now / 1000)))
  end
end

-- Helpers over the state and parameters, for the rule's files that follow.

local function sat_sub(a, b) return max(a - b, 0) end

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
  return {s.gn, s.ep, s.rb, kind, w4 or 0, w5 or 0, w6 or 0, w7 or 0, w8 or 0, 0, 0, 0, 0, 0}
end
