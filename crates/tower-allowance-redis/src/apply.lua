-- rule::apply: absorb a clock step, then the operation; save what changed; publish the event
-- reservation holders in other processes must hear of.

-- rule::read (rule/mod.rs): the shared state, for a snapshot.
-- {blocked for, closed by (0: open, else 1 quota / 2 server delay), closed for or -1, retries
-- remaining or -1, probes, epoch, rate, generation}.
local function read()
  load(PROBE)
  local left = remaining()
  local is_closed, closed_for = 0, 0
  if s.cl == FOREVER or now < s.cl then
    is_closed, closed_for = 2, -1
    if s.cb == 1 then is_closed = 1 end
    if s.cl ~= FOREVER then closed_for = s.cl - now end
  end
  return {sat_sub(s.bu, now), is_closed, closed_for, left, s.pc, s.ep, adaptive_rate() or 0, s.gn}
end

-- The operation's own arguments, from ARGV[7] on.
local function arg(i) return tonumber(ARGS[7 + i]) end

-- A call that arrives late (validity.rs). ARGV[5] is when it was sent and ARGV[6] until when
-- it is valid, both on this server's clock as the client bounds them (0: unknown). A call
-- that takes from the bucket or reserves for its caller is refused after its valid-until,
-- before anything changes: its caller has stopped waiting. The ones whose caller does not
-- wait for their effect apply late: a cooldown or closure counted from when it was sent
-- (extend-only: one whose end has passed changes nothing, one still running still reaches
-- every process), a release or settlement as it is (refusing it would leave its reservation
-- behind).
local STALE = -2
local late = 0
local function refused_late(args)
  local op, sent, valid_until = tonumber(args[1]), tonumber(args[5]), tonumber(args[6])
  late = 0
  if sent > 0 and now > sent then late = now - sent end
  if valid_until == 0 or now <= valid_until then return false end
  return not (op == 2 or op == 3 or op == 4 or op == 7 or op == 9 or op == 12)
end

-- A delay counted from the call's sending: what is left of it now (-1, none, stays).
local function left(delay)
  if delay < 0 then return delay end
  return max(delay - late, 0)
end

-- One call: the clock, the parameters and the state, then the rule.
local function apply(keys, args)
  clock(args)
  if refused_late(args) then return {STALE, now} end
  local ok, refusal = begin(keys, args)
  if not ok then
    return refusal or redis.error_reply('ERR tower-allowance: unreadable parameters')
  end

  rebase()
  -- A state created now (first use, or lost and recreated) is stamped with its creation time.
  -- A read creates nothing; only a first admission (a caller that knew no state) finds the
  -- bucket full.
  local created = s.gn == 0 and OP ~= 8
  if created then
    s.gn = max(now, 1)
    local first_use = ((OP == 1 or OP == 11) and arg(5) == 0) or (OP == 13 and arg(12) == 0)
    if not first_use then recreated() end
  end
  local reply
  local ev_at
  if OP == 1 then
    reply = admit(arg(0), arg(1) == 1, arg(2), arg(3), arg(4))
  elseif OP == 2 then
    local tats = {}
    for l = 1, MAX_LIMITS do tats[l] = arg(l) end
    reply = release(arg(0), tats, arg(MAX_LIMITS + 1), arg(MAX_LIMITS + 2), arg(MAX_LIMITS + 3), arg(MAX_LIMITS + 4) == 1, arg(MAX_LIMITS + 5))
  elseif OP == 3 then
    if arg(0) > 0 and left(arg(0)) == 0 then
      -- Over before it arrived: nothing to extend.
      reply = {0, sat_sub(s.bu, now), 0, 0, 0}
    else
      reply = extend_cooldown(left(arg(0)))
    end
    if reply[5] == 1 then ev_at = 6 end
  elseif OP == 4 then
    reply = close(left(arg(0)), arg(1))
    ev_at = 1
  elseif OP == 5 then
    reply = clear()
    ev_at = 1
  elseif OP == 6 then
    reply = lease(arg(0), arg(1))
  elseif OP == 7 then
    reply = finish_probe(arg(0), arg(1), left(arg(2)))
    if reply[1] == 1 then ev_at = 2 end
  elseif OP == 8 then
    deposit(arg(0))
    reply = read()
  elseif OP == 9 then
    reply = throttle(left(arg(0)), arg(1) + late)
    if reply[5] == 1 then ev_at = 6 end
  elseif OP == 10 then
    reply = advertise(arg(0))
  elseif OP == 11 then
    reply = admit_share(arg(0), arg(1) == 1, arg(2), arg(3), arg(4), arg(6), arg(7), arg(8), arg(9), arg(10))
    if reply[MAX_CLASSES + 2] == 1 then ev_at = MAX_CLASSES + 3 end
  elseif OP == 12 then
    reply = settle(arg(0), arg(1), arg(2) == 1, arg(3) == 1, arg(4), arg(5), arg(6), arg(7), arg(8), arg(9))
    if reply[3] == 1 then ev_at = 4 end
  elseif OP == 13 then
    reply = grant(arg(0), arg(1), arg(2), arg(3), arg(4), {arg(5), arg(6), arg(7), arg(8)}, arg(9), arg(10), arg(11), arg(13), {arg(14), arg(15), arg(16), arg(17)}, arg(18), arg(19), arg(20))
  else
    return redis.error_reply('ERR tower-allowance: unknown operation')
  end
  save()
  if created then
    -- Holders of reservations made in a lost state ask again at once, in every process.
    local words = {}
    for _, w in ipairs(event(4)) do words[#words + 1] = string.format('%.0f', w) end
    redis.call('PUBLISH', channel, table.concat(words, ','))
  end
  if ev_at then
    local words = {}
    for i = 0, EVENT_WORDS - 1 do words[#words + 1] = string.format('%.0f', reply[ev_at + i]) end
    redis.call('PUBLISH', channel, table.concat(words, ','))
  end
  -- The server's clock last: the client bounds the next calls' validity with it.
  reply[#reply + 1] = now
  return reply
end
