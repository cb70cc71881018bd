-- tower_allowance::rule (crates/tower-allowance/src/rule.rs) in Lua: each decision
-- transcribed, most functions under the Rust names, not in the Rust order. Lua's own
-- helpers: sat_sub, units, later, event; the Rust side's entry point (apply) is apply.lua
-- here, and its memory-only parts (schedule_one, is_settled) have no counterpart. The
-- differential property test replays random operations against both and requires
-- identical answers.
-- `s` is the state, `P` the parameters, `now` the clock (state.lua, clock.lua).

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

-- === The retry budget ===

local function advance(slot_us)
  local now_slot = math.floor(now / math.max(slot_us, 1))
  if now_slot > s.hd then
    local clear = math.min(now_slot - s.hd, BUDGET_SLOTS)
    for i = 1, clear do
      local idx = (s.hd + i) % BUDGET_SLOTS
      s['d' .. idx] = 0
      s['w' .. idx] = 0
    end
    s.hd = now_slot
  end
  return s.hd % BUDGET_SLOTS
end

local function deposit(n)
  if n == 0 then return end
  if P.kind == 2 then
    load(BUDGET)
    local i = advance(P.b1)
    s['d' .. i] = s['d' .. i] + n
  end
end

-- Retries that could be spent now; -1 for an unlimited budget (u64::MAX in Rust).
local function remaining()
  if P.kind == 0 then return -1 end
  load(BUDGET)
  if P.kind == 1 then return math.max(P.b1 - s.sp, 0) end
  advance(P.b1)
  local d, w = 0, 0
  for i = 0, BUDGET_SLOTS - 1 do
    d = d + s['d' .. i]
    w = w + s['w' .. i]
  end
  return math.max(P.b2 + math.floor(d * P.b3 / 1000) - w, 0)
end

local function spend()
  if P.kind == 1 then
    s.sp = s.sp + 1
    return 0
  elseif P.kind == 2 then
    local i = advance(P.b1)
    s['w' .. i] = s['w' .. i] + 1
    return s.hd
  end
  return 0
end

local function refund(slot)
  if P.kind == 1 then
    load(BUDGET)
    s.sp = sat_sub(s.sp, 1)
  elseif P.kind == 2 then
    load(BUDGET)
    if slot <= s.hd and s.hd - slot < BUDGET_SLOTS then
      local i = slot % BUDGET_SLOTS
      s['w' .. i] = sat_sub(s['w' .. i], 1)
    end
  end
end

-- === The rule ===

local function rebase()
  if now >= s.sn then
    s.sn = now
    return
  end
  load(PROBE)
  if P.kind == 2 then load(BUDGET) end
  local step = s.sn - now
  for l = 1, MAX_LIMITS do s['t' .. l] = sat_sub(s['t' .. l], step) end
  s.bu = sat_sub(s.bu, step)
  s.ru = sat_sub(s.ru, step)
  if s.cl ~= FOREVER then s.cl = sat_sub(s.cl, step) end
  s.lu = sat_sub(s.lu, step)
  s.np = sat_sub(s.np, step)
  load(ADAPTIVE)
  s.ca = sat_sub(s.ca, step)
  s.sa = sat_sub(s.sa, step)
  if P.kind == 2 then s.hd = sat_sub(s.hd, math.floor(step / math.max(P.b1, 1))) end
  s.rb = s.rb + step
  s.sn = now
end

-- The admission's answer when closed: {4, time until it reopens or -1, why}.
local function closed()
  if s.cl == FOREVER then return {4, -1, s.cb} end
  if now < s.cl then return {4, s.cl - now, s.cb} end
  return nil
end

-- The adaptive rate now (thousandths per second), or nil when the rate does not adapt.
local function adaptive_rate()
  if P.ad_on ~= 1 then return nil end
  local base = s.rc
  if base == 0 then base = P.ad_init end
  local rate
  if s.ca == 0 then
    local since = 0
    if s.sa ~= 0 then since = sat_sub(now, s.sa) end
    local d = math.floor(since / SLOW_START_DOUBLING_US)
    if d >= 40 then rate = 2 ^ 62 else rate = base * 2 ^ d end
  else
    local since = sat_sub(now, s.ca)
    local q = math.floor(since / ADDITIVE_INCREASE_PERIOD_US)
    local r = since % ADDITIVE_INCREASE_PERIOD_US
    rate = base + base * q + math.floor(base * r / ADDITIVE_INCREASE_PERIOD_US)
  end
  local ceiling = P.ad_ceil
  if s.av ~= 0 then ceiling = math.min(ceiling, s.av) end
  return math.max(math.min(rate, ceiling), P.ad_floor)
end

-- The limits as they stand now: the main one's interval from the adaptive rate.
local function effective_limits(at)
  local iv, tol = {}, {}
  for l = 1, MAX_LIMITS do
    iv[l] = P.iv[l]
    tol[l] = P.tol[l]
  end
  local saved = now
  now = at
  local rate = adaptive_rate()
  now = saved
  if rate then
    local q = math.floor(1000000000 / math.max(rate, 1))
    if q * math.max(rate, 1) < 1000000000 then q = q + 1 end
    iv[1] = math.max(q, 1)
    tol[1] = math.min(iv[1] * P.ad_burst, MAX_DELAY_US)
  end
  return iv, tol
end

-- The earliest instant every limit admits `cost`, from `t0`, and the new arrival times.
local function schedule(iv, tol, t0, cost)
  local at = t0
  for l = 1, P.n do
    local inc = units(l, cost) * iv[l]
    if inc > tol[l] then return nil end
    at = math.max(at, sat_sub(math.max(s['t' .. l], t0) + inc, tol[l]))
  end
  if at > now then
    at = math.ceil(at / SLOT_GRANULARITY_US) * SLOT_GRANULARITY_US
  end
  local new = {}
  for l = 1, P.n do new[l] = math.max(s['t' .. l], at) + units(l, cost) * iv[l] end
  return at, new
end

-- rule::recreated: a state created for a caller that knew a lost one starts empty.
local function recreated()
  for l = 1, P.n do s['t' .. l] = now + P.tol[l] end
end

-- {0} admitted; {1, wait, slot, t1..t4, generation, epoch, rebased, budget slot} reserved;
-- {2, wait, cooldown} refused; {3} budget exhausted; {4, until or -1, by} closed;
-- {5} too costly.
local function admit(cost, retry, not_before, max_wait, deposits)
  deposit(deposits)
  local c = closed()
  if c then return c end
  if retry and P.kind ~= 0 and remaining() < 1 then return {3} end
  local natural = math.max(now, s.bu)
  local t0 = math.max(natural, now + not_before)
  if P.ad_on == 1 and s.sa == 0 then s.sa = math.max(now, 1) end
  local iv, tol = effective_limits(now)
  local at, new = schedule(iv, tol, t0, cost)
  if not at then return {5} end
  local wait = at - now
  if wait > max_wait then
    local cd = 0
    if s.bu > now then cd = 1 end
    return {2, wait, cd}
  end
  for l = 1, P.n do s['t' .. l] = new[l] end
  local budget_slot = 0
  if retry then budget_slot = spend() end
  if wait == 0 then return {0} end
  s.ru = math.max(s.ru, at)
  local reply = {1, wait, at}
  for l = 1, MAX_LIMITS do reply[#reply + 1] = new[l] or 0 end
  reply[#reply + 1] = s.gn
  reply[#reply + 1] = s.ep
  reply[#reply + 1] = s.rb
  reply[#reply + 1] = budget_slot
  return reply
end

-- {1} when every limit took the slot back, else {0} (and nothing for a reservation made in a
-- state since lost: this one never scheduled it).
local function release(slot, tats, rebased, generation, cost, retry, budget_slot)
  if generation ~= s.gn then return {0} end
  local step = sat_sub(s.rb, rebased)
  local all = 1
  local iv = effective_limits(slot)
  for l = 1, P.n do
    local mine = sat_sub(tats[l], step)
    if s['t' .. l] == mine then
      s['t' .. l] = sat_sub(mine, units(l, cost) * iv[l])
    else
      all = 0
    end
  end
  if retry then refund(budget_slot) end
  return {all}
end

local function close(delay, by)
  local until_us = FOREVER
  if delay >= 0 and delay <= MAX_DELAY_US then until_us = now + delay end
  if later(until_us, s.cl) then
    s.cl = until_us
    s.cb = by
  end
  s.ep = s.ep + 1
  return event(2, s.cl, s.cb)
end

-- rule::cooldown_shift: per limit, how far the pending schedule moves when the cooldown is
-- raised to `until_us` (rigidly, by the time added, when anything is pending).
local function cooldown_shift(until_us)
  local shift = {0, 0, 0, 0}
  if s.ru == 0 or s.ru + PENDING_GRACE_US <= now then return shift end
  local rigid = sat_sub(until_us, math.max(now, s.bu))
  for l = 1, P.n do shift[l] = rigid end
  return shift
end

-- {extended, blocked for, closed (0/1), closed for or -1, has event, event...}.
local function extend_cooldown(delay)
  if delay < 0 or delay > P.max_cd then
    local ev = close(delay, 2)
    local closed_for = -1
    if s.cl ~= FOREVER then closed_for = sat_sub(s.cl, now) end
    return {0, sat_sub(s.bu, now), 1, closed_for, 1, unpack(ev)}
  end
  local until_us = now + delay
  if until_us <= s.bu then return {0, sat_sub(s.bu, now), 0, 0, 0} end
  local shift = cooldown_shift(until_us)
  local moved = false
  for l = 1, P.n do
    s['t' .. l] = s['t' .. l] + shift[l]
    if shift[l] > 0 then moved = true end
  end
  if moved then
    local last = until_us
    for l = 1, P.n do last = math.max(last, sat_sub(s['t' .. l], P.tol[l])) end
    s.ru = math.max(s.ru, last)
  end
  s.bu = until_us
  s.ep = s.ep + 1
  return {1, until_us - now, 0, 0, 1, unpack(event(1, until_us, shift[1], shift[2], shift[3], shift[4]))}
end

-- A throttling response: cut the adaptive rate (once per round), then the cooldown.
local function throttle(delay, age)
  local rate = adaptive_rate()
  if rate then
    local sent = sat_sub(now, age)
    if s.ca == 0 or sent > s.ca then
      local keep = CUT_PER_MILLE
      if s.ca ~= 0 and now - s.ca < FAST_CUT_WINDOW_US then keep = FAST_CUT_PER_MILLE end
      s.rc = math.max(math.floor(rate * keep / 1000), math.max(P.ad_floor, 1))
      s.ca = math.max(now, 1)
    end
  end
  if delay == 0 then return {0, sat_sub(s.bu, now), 0, 0, 0} end
  return extend_cooldown(delay)
end

local function advertise(rate_milli)
  if P.ad_on ~= 1 then return {0} end
  if rate_milli == 0 then return {adaptive_rate()} end
  s.av = rate_milli
  if P.ad_adopt == 1 then
    s.rc = math.max(math.min(rate_milli, P.ad_ceil), P.ad_floor)
    s.ca = math.max(now, 1)
  end
  return {adaptive_rate()}
end

local function clear()
  load(PROBE)
  s.bu = math.min(s.bu, now)
  s.cl = 0
  s.cb = 0
  s.np = 0
  s.pf = 0
  s.ep = s.ep + 1
  return event(3, 0, 0)
end

local function lease(ttl, token)
  load(PROBE)
  if s.cl == FOREVER or now < s.cl or now < s.np or now < s.lu then return {0} end
  s.lu = now + math.max(ttl, 1)
  s.lt = token
  s.pc = s.pc + 1
  return {1}
end

-- outcome: 0 available, 1 exhausted (retry_in: microseconds, -1 unrepresentable), 2 failed.
local function finish_probe(token, outcome, retry_in)
  load(PROBE)
  if s.lt == token then s.lu = 0 end
  if outcome == 1 then
    s.pf = 0
    return {1, unpack(close(retry_in, 1))}
  elseif outcome == 0 then
    s.pf = 0
    s.np = now + P.pb_min
    return {0}
  end
  local backoff = math.min(P.pb_min * 2 ^ s.pf, P.pb_max)
  s.pf = s.pf + 1
  s.np = now + backoff
  return {0}
end

-- {blocked for, closed by (0: open, else 1 quota / 2 server delay), closed for or -1, retries
-- remaining or -1, probes, epoch, rate, generation}.
local function read()
  load(PROBE)
  local left = remaining()
  local is_closed, closed_for = 0, 0
  if s.cl == FOREVER or now < s.cl then
    is_closed, closed_for = 2, -1
    if s.cb == 1 then is_closed = 1 end
    if s.cl ~= FOREVER then closed_for = s.cl - now end
  end
  return {sat_sub(s.bu, now), is_closed, closed_for, left, s.pc, s.ep, adaptive_rate() or 0, s.gn}
end
