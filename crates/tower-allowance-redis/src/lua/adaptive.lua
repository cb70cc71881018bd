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

-- A throttling response cuts the adaptive rate once per round (sent until s.rr, the last
-- slot reserved before the last cut, moved with the schedule by cooldowns since).
local function cut_rate(age)
  local rate = adaptive_rate()
  if rate then
    local sent = sat_sub(now, age)
    if s.ca == 0 or sent > max(s.ca, s.rr + ROUND_GRACE_US) then
      local keep = CUT_PER_MILLE
      if s.ca ~= 0 and now - s.ca < FAST_CUT_WINDOW_US then keep = FAST_CUT_PER_MILLE end
      s.rc = max(floor(rate * keep / 1000), max(P.ad_floor, 1))
      s.ca = max(now, 1)
      s.rr = max(s.ru, now)
    end
  end
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
