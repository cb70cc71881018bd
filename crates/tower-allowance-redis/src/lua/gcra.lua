-- rule/gcra.rs: the token buckets, GCRA with reservations, every limit in one step.

-- The earliest instant every limit admits `cost`, from `t0`, and the new arrival times.
local function schedule(iv, tol, t0, cost)
  local at = t0
  for l = 1, P.n do
    local inc = units(l, cost) * iv[l]
    if inc > tol[l] then return nil end
    at = max(at, sat_sub(max(s[TAT[l]], t0) + inc, tol[l]))
  end
  local start = at
  if at > now then
    at = ceil(at / SLOT_GRANULARITY_US) * SLOT_GRANULARITY_US
  end
  -- (Tables are built whole where they can be: growing one costs more than the rest here.)
  local new = {0, 0, 0, 0}
  for l = 1, P.n do new[l] = next_tat(s[TAT[l]], P.hr[l], start, at, units(l, cost) * iv[l]) end
  return at, new
end

-- {0} admitted; {1, wait, slot, t1..t4, generation, epoch, rebased, budget slot} reserved;
-- {2, wait, cooldown left or 0} refused; {3} budget exhausted; {4, until or -1, by} closed;
-- {5} too costly.
local function admit(cost, retry, not_before, max_wait, deposits)
  deposit(deposits)
  local c = closed()
  if c then return c end
  if retry and P.kind ~= 0 and remaining() < 1 then return {3} end
  local natural = max(now, s.bu)
  local t0 = max(natural, now + not_before)
  if P.ad_on == 1 and s.sa == 0 then s.sa = max(now, 1) end
  local iv, tol = effective_limits(now)
  local at, new = schedule(iv, tol, t0, cost)
  if not at then return {5} end
  local wait = at - now
  if wait > max_wait then
    return {2, wait, max(s.bu - now, 0)}
  end
  for l = 1, P.n do s[TAT[l]] = new[l] end
  settle_admitted(cost)
  local budget_slot = 0
  if retry then budget_slot = spend() end
  if wait == 0 then return {0} end
  s.ru = max(s.ru, at)
  return {1, wait, at, new[1], new[2], new[3], new[4], s.gn, s.ep, s.rb, budget_slot}
end

-- {1} when every limit took the slot back, else {0} (and nothing for a reservation made in a
-- state since lost: this one never scheduled it).
local function release(slot, tats, rebased, generation, cost, retry, budget_slot)
  if generation ~= s.gn then return {0} end
  local step = sat_sub(s.rb, rebased)
  local all = 1
  local iv, tol = effective_limits(slot)
  for l = 1, P.n do
    local mine = sat_sub(tats[l], step)
    if s[TAT[l]] == mine then
      -- (At burst 1 every admission moved the schedule by the headroom as well.)
      local back = units(l, cost) * iv[l]
      if back >= tol[l] then back = back + P.hr[l] end
      s[TAT[l]] = sat_sub(mine, back)
    else
      all = 0
    end
  end
  if retry then refund(budget_slot) end
  return {all}
end
