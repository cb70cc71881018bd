-- rule::apply: absorb a clock step, then the operation; save what changed; publish the event
-- reservation holders in other processes must hear of.

local function arg(i) return tonumber(ARGV[O + i]) end

rebase()
local reply
local ev_at
if OP == 1 then
  reply = admit(arg(0), arg(1) == 1, arg(2), arg(3), arg(4))
elseif OP == 2 then
  local tats = {}
  for l = 1, MAX_LIMITS do tats[l] = arg(l) end
  reply = release(arg(0), tats, arg(MAX_LIMITS + 1), arg(MAX_LIMITS + 2), arg(MAX_LIMITS + 3) == 1, arg(MAX_LIMITS + 4))
elseif OP == 3 then
  reply = extend_cooldown(arg(0))
  if reply[5] == 1 then ev_at = 6 end
elseif OP == 4 then
  reply = close(arg(0), arg(1))
  ev_at = 1
elseif OP == 5 then
  reply = clear()
  ev_at = 1
elseif OP == 6 then
  reply = lease(arg(0), arg(1))
elseif OP == 7 then
  reply = finish_probe(arg(0), arg(1), arg(2))
  if reply[1] == 1 then ev_at = 2 end
elseif OP == 8 then
  deposit(arg(0))
  reply = read()
elseif OP == 9 then
  reply = throttle(arg(0), arg(1))
  if reply[5] == 1 then ev_at = 6 end
elseif OP == 10 then
  reply = advertise(arg(0))
else
  return redis.error_reply('ERR tower-allowance: unknown operation')
end
save()
if ev_at then
  local words = {}
  for i = 0, EVENT_WORDS - 1 do words[#words + 1] = string.format('%.0f', reply[ev_at + i]) end
  redis.call('PUBLISH', channel, table.concat(words, ','))
end
return reply
