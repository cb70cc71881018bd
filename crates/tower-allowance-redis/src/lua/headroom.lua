-- The headroom (config/limit.rs, rule/gcra.rs `next_tat`): a time each limit's schedule moves
-- later when an admission finds its bucket full.

-- The params block "headroom", the text's last `MAX_LIMITS` values: each limit's headroom.
local function headroom(p, v)
  local n = #v
  p.hr = {v[n - 3], v[n - 2], v[n - 1], v[n]}
end

-- A limit's arrival time after an admission at `at` (`start` before the slot grid's rounding)
-- taking `inc`: the headroom `hr` added once when the bucket was full (`tat <= start`).
local function next_tat(tat, hr, start, at, inc)
  if tat <= start then return max(tat, at) + inc + hr end
  return max(tat, at) + inc
end
