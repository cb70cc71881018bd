-- Test builds only (feature `test-util`): ARGV[2] is a clock in microseconds to decide on
-- instead of TIME when it is not -1. Arguments start at ARGV[3].
if redis.replicate_commands then redis.replicate_commands() end
local now = tonumber(ARGV[2])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local A = 3
