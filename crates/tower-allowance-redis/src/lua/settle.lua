-- rule/settle.rs: reserve, then settle (feature `settle` of tower-allowance). Its parameters
-- are the block after the marker -32 in the parameters' text (share in thousandths, learns:
-- 0/1), absent when not configured; its state is the group `s` (outstanding, unused,
-- credited, share learned, last settlement, when the first cost limit was last full).

local SETTLE = {'so', 'su', 'sc', 'sh', 'sl', 'sf'}
FIELD[SETTLE] = 's'
FORMAT[SETTLE] = '<dddddd'
-- rule::settle::DRIFT_UNITS_CAP.
local DRIFT_UNITS_CAP = 8589934592
GROUPS[#GROUPS + 1] = SETTLE

-- The settlement's parameters, parsed once per parameters' text (false: not configured).
local function settle_params()
  local sp = P.settle
  if sp == nil then
    sp = false
    local v = {}
    for x in string.gmatch(PTEXT, '[^,]+') do v[#v + 1] = tonumber(x) end
    for i = 28, #v - 2 do
      if v[i] == -32 then
        sp = {share = v[i + 1], learn = v[i + 2]}
        break
      end
    end
    P.settle = sp
  end
  -- In force beside the main limit only (rule::Params::settle).
  if P.n < 2 then return false end
  return sp
end

-- rule::settle::first_cost: the first limit counted in cost (nil: none).
local function settle_first()
  for l = 1, P.n do
    if P.unit[l] == 1 then return l end
  end
end

-- rule::settle::admitted: an admission's cost is outstanding until settled; the first cost
-- limit was full before it if it holds no more than this cost now.
local function settle_admitted(cost)
  if not settle_params() then return end
  load(SETTLE)
  s.so = s.so + cost
  local f = settle_first()
  if f and s[TAT[f]] <= now + cost * P.iv[f] then s.sf = now end
end

local function settle_share(sp)
  if sp.learn == 1 then return max(s.sh, sp.share) end
  return sp.share
end

-- Whole units of limit `l` owed now.
local function settle_deficit(l)
  return floor(sat_sub(s[TAT[l]], now) / max(P.iv[l], 1))
end

-- rule::settle::class_settled: a classed settlement moves its class's virtual finish time
-- by the units it gives back to the class (Settle::class_units), at the class's weight.
local function settle_class(class, weight, reserved, used, refused, fin)
  if weight == 0 then return end
  local own = reserved
  if not refused then own = sat_sub(reserved, used) end
  local units = max(min(fin, own), -sat_sub(used, reserved))
  if units == 0 then return end
  load(CLASSES)
  local field = 'c' .. (min(class, MAX_CLASSES - 1) + 1)
  if units > 0 then
    s[field] = sat_sub(s[field], floor(units * SHARE_SCALE / weight))
  else
    s[field] = s[field] + floor(-units * SHARE_SCALE / weight)
  end
end

-- rule::settle::settle: {moved, share, 0} or {moved, share, 1, event words...}.
local function settle(reserved, used, refused, observed, limit, remaining, sent_ago, class, weight, excess)
  local sp = settle_params()
  if not sp then return {0, 0, 0} end
  load(SETTLE)
  s.so = sat_sub(s.so, reserved)
  local o = s.so
  local first = settle_first()
  if not first then return {0, settle_share(sp), 0} end
  if s[TAT[first]] <= now then s.sf = now end
  local k = settle_deficit(first)
  -- What the provider has not seen is within what the bucket owes.
  s.so = min(s.so, k)
  o = s.so
  -- Fresh: no settlement since the request was sent; a stale reading only takes away.
  local fresh = s.sl <= sat_sub(now, sent_ago)
  s.sl = max(s.sl, now)
  local room
  if observed then
    room = k - o - sat_sub(limit, remaining)
    if not fresh then room = min(room, 0) end
  end
  local extra = sat_sub(used, reserved)
  local target
  if refused then
    target = reserved
  else
    s.su = s.su + sat_sub(reserved, used)
    if room and sp.learn == 1 and s.su > 0 and fresh then
      -- Less the provider's refill beyond the bucket's count since both were full.
      local units = min(floor(sat_sub(now, s.sf) / max(P.iv[first], 1)), DRIFT_UNITS_CAP)
      local p = units * excess
      local bound = s.sc + room - (p - p % 1000000) / 1000000
      if bound > 0 then s.sh = max(s.sh, min(floor(bound * 1000 / s.su), 1000)) end
    end
    target = floor(s.su * settle_share(sp) / 1000) - s.sc - extra
  end
  local fin
  if room then
    fin = min(target, room)
  elseif target > 0 then
    fin = min(target, max(k - o, 0))
  else
    fin = target
  end
  if refused then s.sc = s.sc + fin - reserved else s.sc = s.sc + fin + extra end
  settle_class(class, weight, reserved, used, refused, fin)
  local shift = {0, 0, 0, 0}
  local moved = false
  for l = 1, P.n do
    if P.unit[l] == 1 then
      local iv = P.iv[l]
      if fin > 0 then
        local c = min(fin, max(settle_deficit(l) - o, 0))
        shift[l] = c * iv
        s[TAT[l]] = sat_sub(s[TAT[l]], shift[l])
        if shift[l] > 0 then moved = true end
      elseif fin < 0 then
        shift[l] = (-fin) * iv
        s[TAT[l]] = max(s[TAT[l]], now) + shift[l]
        moved = true
      end
    end
  end
  if moved and s.ru ~= 0 and s.ru + PENDING_GRACE_US > now then
    s.ep = s.ep + 1
    local reply = {fin, settle_share(sp), 1}
    local ev = event(5, max(now, s.bu), shift[1], shift[2], shift[3], shift[4])
    if fin < 0 then ev[10] = 1 end
    for i = 1, #ev do reply[3 + i] = ev[i] end
    return reply
  end
  return {fin, settle_share(sp), 0}
end
