-- Versioned configurations (config.rs): the newest configuration on a name decides for every
-- process on it. The caller's parameters text may end with its configuration block,
-- `;VERSION,PINNED` (VERSION: the Redis server's time, in microseconds, when the process
-- first checked its configuration; PINNED: 1 when it refuses to decide with another one).
-- The configuration in force is kept in the state hash, field `k`, as `VERSION;TEXT`.
--
-- `adopt` (given the stored field, read with the state's in one `HMGET`) returns the
-- parameters text to decide with: the caller's when it is the newest
-- (then it is stored, and a takeover published on the channel as `k:VERSION:TEXT`, so that
-- every process logs it once), else the stored one; or nil and an error reply for a pinned
-- caller whose configuration is older and different. A text without the block (the test
-- clock's calls, an older client) decides with its own and touches nothing.
-- The last answer that wrote nothing, by its two inputs: in the steady state every call asks
-- the same question (a function library keeps this between calls; under `EVALSHA`, per call).
local SEEN_FULL, SEEN_STORED, SEEN_TEXT
local function adopt(key, full, chan, stored)
  if full == SEEN_FULL and stored == SEEN_STORED then return SEEN_TEXT end
  local text, v, pinned = string.match(full, '^([^;]*);(%d+),([01])$')
  if not text then return full end
  v = tonumber(v)
  if stored then
    local sv, st = string.match(stored, '^(%d+);(.*)$')
    sv = tonumber(sv)
    if sv then
      if st == text then
        if sv >= v then
          SEEN_FULL, SEEN_STORED, SEEN_TEXT = full, stored, text
          return text
        end
        -- The same configuration, newer: nothing to hear of; the version moves on.
        redis.call('HSET', key, 'k', string.format('%.0f', v) .. ';' .. text)
        return text
      end
      -- Different: the newer wins (equal versions: the greater text, the same everywhere).
      if sv > v or (sv == v and st > text) then
        if pinned == '1' then
          return nil, {err = 'TACONFIG ' .. stored}
        end
        SEEN_FULL, SEEN_STORED, SEEN_TEXT = full, stored, st
        return st
      end
    end
  end
  local value = string.format('%.0f', v) .. ';' .. text
  redis.call('HSET', key, 'k', value)
  if stored then redis.call('PUBLISH', chan, 'k:' .. value) end
  return text
end
