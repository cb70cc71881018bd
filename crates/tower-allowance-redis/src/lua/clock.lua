-- The clock: the Redis server's TIME, in microseconds. Arguments start at ARGV[2].
-- (Redis 3.2 to 6: replicate the writes, not the script, since it reads TIME. A no-op since 7.)
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local A = 2
