-- rule/budget.rs: the retry budget, fixed or replenishing over a sliding window of slots.

local function advance(slot_us)
  local now_slot = floor(now / max(slot_us, 1))
  if now_slot > s.hd then
    local clear = min(now_slot - s.hd, BUDGET_SLOTS)
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
  if P.kind == 1 then return max(P.b1 - s.sp, 0) end
  advance(P.b1)
  local d, w = 0, 0
  for i = 0, BUDGET_SLOTS - 1 do
    d = d + s['d' .. i]
    w = w + s['w' .. i]
  end
  return max(P.b2 + floor(d * P.b3 / 1000) - w, 0)
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
