-- The headroom (config/limit.rs, rule/gcra.rs `next_tat`): a time each limit's schedule moves
-- later when an admission finds its bucket full.

-- The params block "headroom", the `MAX_LIMITS` values after the first 27: each limit's
-- headroom (the blocks after it start with their markers).
local function headroom(p, v)
  p.hr = {v[28], v[29], v[30], v[31]}
end

-- A limit's arrival time after an admission at `at` (`start` before the slot grid's rounding)
-- taking `inc`: the headroom `hr` added once when the bucket was full (`tat <= start`).
local function next_tat(tat, hr, start, at, inc)
  if tat <= start then return max(tat, at) + inc + hr end
  return max(tat, at) + inc
end
