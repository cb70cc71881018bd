-- rule/grant.rs: leases carved out of the shared bucket (group `l`: the holders' window).

local HOLDER_WINDOW_US = 2000000
local MAX_GRANT = 10000

-- Counts the holder in the current window (once per window): live holders, window, counted.
local function heartbeat(mark)
  load(HOLDERS)
  if s.hw == 0 or now >= s.hw + HOLDER_WINDOW_US then
    if now < s.hw + 2 * HOLDER_WINDOW_US then s.hp = s.hh else s.hp = 0 end
    s.hw = max(now, 1)
    s.hh = 0
  end
  if mark ~= s.hw then s.hh = s.hh + 1 end
  return max(s.hh, s.hp, 1), s.hw, s.hh
end

-- {2} stale; {1, admission...} denied; {0, tokens, now, t0, spacing, tat1..4, end1..4, generation,
-- epoch, rebased, returned, holders, window, counted} granted.
local function grant(tokens, max_wait, valid_until, mark, back, back_tat, back_gn, back_rb, debit, since, since_tat, spacing, after, deposits)
  if valid_until ~= 0 and now > valid_until then return {2} end
  -- Successes that already happened: recorded whatever the tokens' answer (not when stale).
  deposit(deposits)
  local holders, window, counted = heartbeat(mark)
  local iv, tol = effective_limits(now)
  local returned = 0
  if back > 0 then
    returned = 1
    local step = sat_sub(s.rb, back_rb)
    for l = 1, P.n do
      if not (back_gn == s.gn and s[TAT[l]] == sat_sub(back_tat[l], step)) then returned = 0 end
    end
    if returned == 1 then
      for l = 1, P.n do
        local t = s[TAT[l]]
        s[TAT[l]] = max(sat_sub(t, iv[l] * back), min(now, t))
      end
    end
  end
  if since > 0 then
    local pace = 1
    for l = 1, P.n do pace = max(pace, iv[l]) end
    local elapsed = sat_sub(now, since - 1)
    for l = 1, P.n do
      local moved = since_tat[l] + floor(elapsed * iv[l] / pace)
      s[TAT[l]] = max(s[TAT[l]], min(moved, now + tol[l]))
    end
  end
  if debit > 0 then
    for l = 1, P.n do s[TAT[l]] = max(s[TAT[l]], now) + iv[l] * debit end
  end
  local before = {s.t1, s.t2, s.t3, s.t4}
  local function granted(k, t0)
    return {0, k, now, t0, spacing, before[1], before[2], before[3], before[4], s.t1, s.t2, s.t3, s.t4,
      s.gn, s.ep, s.rb, returned, holders, window, counted}
  end
  if tokens == 0 then return granted(0, now) end
  local c = closed()
  if c then return {1, c[1], c[2], c[3]} end
  local t0 = max(now, s.bu, after)
  local last = 0
  local k = 0
  local from = t0
  while k < min(tokens, MAX_GRANT) do
    local at, new = schedule(iv, tol, from, 1)
    if not at then return {1, 5} end
    if at - now > max_wait then
      if k == 0 then
        return {1, 2, at - now, max(s.bu - now, 0)}
      end
      break
    end
    for l = 1, P.n do s[TAT[l]] = new[l] end
    last = at
    from = max(from, at + spacing)
    k = k + 1
  end
  s.ru = max(s.ru, last)
  return granted(k, t0)
end
