-- rule/probe.rs: the quota probe's lease.

local function lease(ttl, token)
  load(PROBE)
  if s.cl == FOREVER or now < s.cl or now < s.np or now < s.lu then return {0} end
  s.lu = now + max(ttl, 1)
  s.lt = token
  s.pc = s.pc + 1
  return {1}
end

-- outcome: 0 available, 1 exhausted (retry_in: microseconds, -1 unrepresentable), 2 failed.
local function finish_probe(token, outcome, retry_in)
  load(PROBE)
  if s.lt == token then s.lu = 0 end
  if outcome == 1 then
    s.pf = 0
    return {1, unpack(close(retry_in, 1))}
  elseif outcome == 0 then
    s.pf = 0
    s.np = now + P.pb_min
    return {0}
  end
  local backoff = min(P.pb_min * 2 ^ s.pf, P.pb_max)
  s.pf = s.pf + 1
  s.np = now + backoff
  return {0}
end
