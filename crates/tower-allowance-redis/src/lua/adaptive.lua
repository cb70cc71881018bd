-- rule/adaptive.rs: the adaptive rate (slow start, AIMD, capped by what a server advertises).

-- The adaptive rate now (thousandths per second), or nil when the rate does not adapt.
local function adaptive_rate()
  if P.ad_on ~= 1 then return nil end
  local base = s.rc
  if base == 0 then base = P.ad_init end
  local rate
  if s.ca == 0 then
    local since = 0
    if s.sa ~= 0 then since = sat_sub(now, s.sa) end
    local d = floor(since / SLOW_START_DOUBLING_US)
    if d >= 40 then rate = 2 ^ 62 else rate = base * 2 ^ d end
  else
    local since = sat_sub(now, s.ca)
    local q = floor(since / ADDITIVE_INCREASE_PERIOD_US)
    local r = since % ADDITIVE_INCREASE_PERIOD_US
    rate = base + base * q + floor(base * r / ADDITIVE_INCREASE_PERIOD_US)
  end
  local ceiling = P.ad_ceil
  if s.av ~= 0 then ceiling = min(ceiling, s.av) end
  return max(min(rate, ceiling), P.ad_floor)
end

-- The limits as they stand now: the main one's interval from the adaptive rate.
-- Without an adaptive rate, the configured limits themselves (as rule/fixed.rs: no copy).
local function effective_limits(at)
  if P.ad_on ~= 1 then return P.iv, P.tol end
  local iv, tol = {}, {}
  for l = 1, MAX_LIMITS do
    iv[l] = P.iv[l]
    tol[l] = P.tol[l]
  end
  local saved = now
  -- The rate when the next slot falls: after the last one reserved (rule/adaptive.rs).
  now = max(at, s.ru)
  local rate = adaptive_rate()
  now = saved
  if rate then
    local q = floor(1000000000 / max(rate, 1))
    if q * max(rate, 1) < 1000000000 then q = q + 1 end
    iv[1] = max(q, 1)
    tol[1] = min(iv[1] * P.ad_burst, MAX_DELAY_US)
  end
  return iv, tol
end

-- rule::Stretch::apply (rule/ops.rs): where the slot at `t` moves when the pending schedule is
-- re-timed: `from + ceil(∫ rate / new)`, the rate piecewise constant (doubling each second
-- since `start` during the slow start, capped; constant at `base` when `start` is 0).
local function stretch_apply(st, t)
  if not st or t <= st[1] then return t end
  local from, start, base, cap, new = st[1], st[2], st[3], st[4], st[5]
  local at, q, r = from, 0, 0
  while at < t do
    local rate, stop
    if start == 0 then
      rate, stop = min(base, cap), t
    else
      local d = floor(sat_sub(at, start) / SLOW_START_DOUBLING_US)
      if d >= 40 then rate = cap else rate = min(base * 2 ^ d, cap) end
      if rate >= cap then
        stop = t
      else
        stop = max(min(start + (d + 1) * SLOW_START_DOUBLING_US, t), at + 1)
      end
    end
    local len = stop - at
    local part = (len % new) * rate
    q = q + floor(len / new) * rate + floor(part / new)
    r = r + part % new
    q = q + floor(r / new)
    r = r % new
    at = stop
  end
  local moved = from + q
  if r > 0 then moved = moved + 1 end
  return max(moved, t)
end

-- A throttling response cuts the adaptive rate once per round of sends (not for a request
-- sent before the last cut or within ROUND_GRACE_US after it) and re-times the main limit's
-- pending schedule at the new rate: returns the stretch {from, start, base, cap, new}, or nil.
local function cut_rate(age)
  local rate = adaptive_rate()
  if not rate then return nil end
  local sent = sat_sub(now, age)
  if s.ca ~= 0 and sent <= s.ca + ROUND_GRACE_US then return nil end
  local keep = CUT_PER_MILLE
  if s.ca ~= 0 and now - s.ca < FAST_CUT_WINDOW_US then keep = FAST_CUT_PER_MILLE end
  local fl = max(P.ad_floor, 1)
  local slow_start = s.ca == 0
  local base, cap
  if slow_start then
    base = s.rc
    if base == 0 then base = P.ad_init end
    cap = P.ad_ceil
    if s.av ~= 0 then cap = min(cap, s.av) end
    cap = max(cap, fl)
  else
    base, cap = rate, rate
  end
  s.rc = max(floor(rate * keep / 1000), fl)
  -- The bucket's debt keeps its count of units at the new rate, reserved slots or not.
  local st
  local start = 0
  if slow_start then start = s.sa end
  if base ~= 0 and cap ~= 0 and (start ~= 0 or min(base, cap) > s.rc) then
    st = {max(now, s.bu), start, base, cap, s.rc}
  end
  s.ca = max(now, 1)
  s[TAT[1]] = stretch_apply(st, s[TAT[1]])
  s.ru = stretch_apply(st, s.ru)
  return st
end

local function advertise(rate_milli)
  if P.ad_on ~= 1 then return {0} end
  if rate_milli == 0 then return {adaptive_rate()} end
  s.av = rate_milli
  if P.ad_adopt == 1 then
    s.rc = max(min(rate_milli, P.ad_ceil), P.ad_floor)
    s.ca = max(now, 1)
  end
  return {adaptive_rate()}
end
