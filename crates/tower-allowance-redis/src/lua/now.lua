-- The clock, in microseconds: ARGV[2] when it is one, else (-1, what production passes) the
-- Redis server's TIME. Only `RedisStore::follow_tokio_clock` (feature `test-util`) passes a
-- clock, so that tests decide on tokio's paused clock with the script that ships. Arguments
-- start at ARGV[3].
-- (Redis 3.2 to 6: replicate the writes, not the script, since it reads TIME. A no-op since 7.)
if redis.replicate_commands then redis.replicate_commands() end
local now = tonumber(ARGV[2])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local A = 3
