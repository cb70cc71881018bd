-- The clock, in microseconds: args[2] when it is one, else (-1, what production passes) the
-- Redis server's TIME. Only `RedisStore::follow_tokio_clock` (feature `test-util`) passes a
-- clock, so that tests decide on tokio's paused clock with the script that ships.
--
-- Everything from here to `apply` (apply.lua) is defined once: when Redis loads the library
-- (`FUNCTION LOAD`), or per call under `EVALSHA`. A call sets the per-call values (`now`, the
-- parameters, the state) in `apply`, before anything reads them.
local now
-- `math`'s functions as upvalues, set by the first call (a library's load-time code sees no
-- globals): cheaper than a global and a field looked up at each of the rule's many uses.
local max, min, floor, ceil
local function clock(args)
  if not max then max, min, floor, ceil = math.max, math.min, math.floor, math.ceil end
  now = tonumber(args[2])
  if now < 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
end
