-- rule/shares.rs: the classes' virtual finish times next to the bucket (hash field `c`), and a
-- high request that jumps the queue (the slot after the one being served; the pending
-- schedule moves two increments later).

-- rule::share_step: virtual time a request of `cost` takes at `weight`.
local function share_step(cost, weight)
  return floor(max(cost, 1) * SHARE_SCALE / max(weight, 1))
end

-- rule::shares::jump: nil (nothing to jump, or something admit answers), else the
-- reservation's reply (as admit's) and the event.
local function jump(cost, retry, not_before, max_wait)
  if closed() then return nil end
  if retry and P.kind ~= 0 and remaining() < 1 then return nil end
  local natural = max(now, s.bu)
  local t0 = max(natural, now + not_before)
  local iv, tol = effective_limits(now)
  local at = schedule(iv, tol, t0, cost)
  if not at then return nil end
  local shift = {0, 0, 0, 0}
  local d = 0
  for l = 1, P.n do
    local inc = units(l, cost) * iv[l]
    d = max(d, inc)
    shift[l] = 2 * inc
  end
  local front = ceil((t0 + d) / SLOT_GRANULARITY_US) * SLOT_GRANULARITY_US
  if at <= front or front - now > max_wait then return nil end
  for l = 1, P.n do s[TAT[l]] = s[TAT[l]] + shift[l] end
  s.ru = max(s.ru + 2 * d, front)
  -- Charged like any admission: outstanding until settled (rule::settle::admitted).
  settle_admitted(cost)
  s.ep = s.ep + 1
  local budget_slot = 0
  if retry then budget_slot = spend() end
  local ev = event(1, s.bu, shift[1], shift[2], shift[3], shift[4])
  local tat = {0, 0, 0, 0}
  for l = 1, P.n do tat[l] = front + tol[l] end
  return {1, front - now, front, tat[1], tat[2], tat[3], tat[4], s.gn, s.ep, s.rb, budget_slot}, ev
end

-- rule::shares::admit_share: {vtime, finish 1..MAX_CLASSES, has event, event..., admission...}.
local function admit_share(cost, retry, not_before, max_wait, deposits, class, weight, high, start, seen)
  load(CLASSES)
  -- rule::shares::admit_share: the starts its process admitted without the store (a lease's).
  s.vt = max(s.vt, seen)
  deposit(deposits)
  local field = 'c' .. (min(class, MAX_CLASSES - 1) + 1)
  local f = s[field]
  local reply, ev
  if high == 1 and f - s.vt < HIGH_LEAD * share_step(1, weight) then
    if P.ad_on == 1 and s.sa == 0 then s.sa = max(now, 1) end
    reply, ev = jump(cost, retry, not_before, max_wait)
  end
  if not reply then reply = admit(cost, retry, not_before, max_wait, 0) end
  if ev then
    s[field] = max(f, s.vt) + share_step(cost, weight)
  elseif reply[1] == 0 or reply[1] == 1 then
    if start == 0 then start = max(f, s.vt) else start = max(f, start) end
    s[field] = start + share_step(cost, weight)
    s.vt = max(s.vt, start)
  end
  local out = {s.vt}
  for i = 1, MAX_CLASSES do out[#out + 1] = s['c' .. i] end
  if ev then
    out[#out + 1] = 1
    for i = 1, #ev do out[#out + 1] = ev[i] end
  else
    out[#out + 1] = 0
  end
  for i = 1, #reply do out[#out + 1] = reply[i] end
  return out
end
