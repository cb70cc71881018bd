-- rule/clock.rs: a backward step of the clock rebased away; a lost state recreated.

local function rebase()
  if now >= s.sn then
    s.sn = now
    return
  end
  load(PROBE)
  if P.kind == 2 then load(BUDGET) end
  local step = s.sn - now
  for l = 1, MAX_LIMITS do s[TAT[l]] = sat_sub(s[TAT[l]], step) end
  s.bu = sat_sub(s.bu, step)
  s.ru = sat_sub(s.ru, step)
  if s.cl ~= FOREVER then s.cl = sat_sub(s.cl, step) end
  s.lu = sat_sub(s.lu, step)
  s.np = sat_sub(s.np, step)
  load(ADAPTIVE)
  s.ca = sat_sub(s.ca, step)
  s.sa = sat_sub(s.sa, step)
  if P.kind == 2 then s.hd = sat_sub(s.hd, floor(step / max(P.b1, 1))) end
  s.rb = s.rb + step
  s.sn = now
end

-- rule::recreated: a state created for a caller that knew a lost one starts empty.
local function recreated()
  for l = 1, P.n do s[TAT[l]] = now + P.tol[l] end
end
