-- rule/cooldown.rs: the cooldown (raised, never shortened) and the closed state.

-- The admission's answer when closed: {4, time until it reopens or -1, why}.
local function closed()
  if s.cl == FOREVER then return {4, -1, s.cb} end
  if now < s.cl then return {4, s.cl - now, s.cb} end
  return nil
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
  local rigid = sat_sub(until_us, max(now, s.bu))
  for l = 1, P.n do shift[l] = rigid end
  return shift
end

-- {extended, blocked for, closed (0/1), closed for or -1, has event, event...}. Too long:
-- closed until the server's time (a delay stated validly, up to a year, is never shortened);
-- one that cannot be trusted (-1, unrepresentable, or beyond a year) for exactly
-- max_cooldown; never until cleared.
local MAX_STATED_DELAY_US = 365 * 86400 * 1000000
local function extend_cooldown(delay)
  if delay < 0 or delay > P.max_cd then
    local closed_for = P.max_cd
    if delay >= 0 and delay <= MAX_STATED_DELAY_US then closed_for = delay end
    local ev = close(closed_for, 2)
    local closed_for = -1
    if s.cl ~= FOREVER then closed_for = sat_sub(s.cl, now) end
    return {0, sat_sub(s.bu, now), 1, closed_for, 1, unpack(ev)}
  end
  local until_us = now + delay
  if until_us <= s.bu then return {0, sat_sub(s.bu, now), 0, 0, 0} end
  local shift = cooldown_shift(until_us)
  local moved = false
  for l = 1, P.n do
    s[TAT[l]] = s[TAT[l]] + shift[l]
    if shift[l] > 0 then moved = true end
  end
  if moved then
    local last = until_us
    for l = 1, P.n do last = max(last, sat_sub(s[TAT[l]], P.tol[l])) end
    s.ru = max(s.ru, last)
  end
  s.bu = until_us
  s.ep = s.ep + 1
  return {1, until_us - now, 0, 0, 1, unpack(event(1, until_us, shift[1], shift[2], shift[3], shift[4]))}
end

local function clear()
  load(PROBE)
  load(BUDGET)
  s.sp, s.hd = 0, 0
  for i = 0, BUDGET_SLOTS - 1 do
    s['d' .. i], s['w' .. i] = 0, 0
  end
  s.bu = min(s.bu, now)
  s.cl = 0
  s.cb = 0
  s.np = 0
  s.pf = 0
  s.ep = s.ep + 1
  return event(3, 0, 0)
end

-- A throttling response: cut the adaptive rate (once per round; re-timing the pending
-- schedule), then the cooldown; one event carries both (rule::throttle).
local function throttle(delay, age)
  local st = cut_rate(age)
  local reply
  if delay == 0 then
    reply = {0, sat_sub(s.bu, now), 0, 0, 0}
  else
    reply = extend_cooldown(delay)
  end
  if not st then return reply end
  if reply[5] == 1 then
    -- The event from word 6 on; its kind is word 9 (1: moved; 2: closed, nothing to re-time).
    if reply[9] == 1 then
      for i = 1, 5 do reply[14 + i] = st[i] end
    end
    return reply
  end
  -- Nobody holds a slot to re-time: nothing to publish.
  if s.ru == 0 or s.ru + PENDING_GRACE_US <= now then return reply end
  s.ep = s.ep + 1
  local ev = event(1, s.bu)
  for i = 1, 5 do ev[9 + i] = st[i] end
  return {reply[1], reply[2], reply[3], reply[4], 1, unpack(ev)}
end
