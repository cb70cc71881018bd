//! The Lua scripts: the rules of `tower_allowance`'s pure algorithm, applied atomically on
//! the Redis server against its own clock (`TIME`).
//!
//! Every script takes the same key (one HASH per allowance) and the same leading arguments,
//! derived from the caller's [`AllowanceConfig`] on each call:
//!
//! | ARGV | meaning |
//! | --- | --- |
//! | 1 | `interval_us`: microseconds between tokens |
//! | 2 | `tolerance_us`: `burst * interval_us` |
//! | 3 | budget kind: 0 unlimited, 1 fixed, 2 replenishing |
//! | 4 | fixed: retries; replenishing: slot length in microseconds |
//! | 5 | replenishing: reserve (the floor over the window) |
//! | 6 | replenishing: retries earned per 1,000 successes |
//! | 7 | idle TTL in milliseconds, added to the time the state must be kept |
//! | 8 | the operation's own argument (admit: 1 for a retry; defer: delay in microseconds) |
//! | 9 | optional, tests only: the clock in microseconds, instead of `TIME` |
//!
//! Replies are arrays of integers, durations in microseconds; each script documents its own
//! and a `decode_*` function here checks its shape.
//! Lua numbers are doubles: every value here (server time in microseconds is about 2^51
//! today) is an integer below 2^53 and so exact.

use std::time::Duration;

use redis::Script;
use tower_allowance::{store::Decision, AllowanceConfig, RetryBudgetConfig};

/// Largest value passed to the scripts: Lua numbers are exact integers only up to 2^53.
const MAX_EXACT: u64 = 1 << 53;

/// Number of slots in a replenishing budget's window (as in `tower_allowance`).
const SLOTS: u64 = 10;

/// Shared prelude: read the clock and the state; helpers for the budget and for saving.
const PRELUDE: &str = r#"
-- Redis 3.2 to 6: replicate the writes, not the script (it reads TIME). A no-op since 7.
if redis.replicate_commands then redis.replicate_commands() end
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local kind = tonumber(ARGV[3])
local b1 = tonumber(ARGV[4])
local b2 = tonumber(ARGV[5])
local b3 = tonumber(ARGV[6])
local idle_ms = tonumber(ARGV[7])
local op_arg = tonumber(ARGV[8])

local now
if ARGV[9] then
  -- Test support only (`RedisStore::set_test_clock`): a given clock instead of TIME.
  now = tonumber(ARGV[9])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Only the fields this budget kind uses are read; `ex` is the expiry last set (ms).
local FIELDS = {'tat', 'bu', 'ex'}
local BUDGET = {}
if kind == 1 then
  BUDGET = {'sp'}
elseif kind == 2 then
  BUDGET = {'hd'}
  for i = 0, 9 do
    BUDGET[#BUDGET + 1] = 'd' .. i
    BUDGET[#BUDGET + 1] = 'w' .. i
  end
end
for _, f in ipairs(BUDGET) do FIELDS[#FIELDS + 1] = f end
local raw = redis.call('HMGET', key, unpack(FIELDS))
local s = {sp = 0, hd = 0}
for i, f in ipairs(FIELDS) do s[f] = tonumber(raw[i]) or 0 end

-- Moves the sliding window forward to now; returns the current slot index.
local function advance()
  local slot_us = math.max(b1, 1)
  local now_slot = math.floor(now / slot_us)
  if now_slot > s.hd then
    local clear = math.min(now_slot - s.hd, 10)
    for i = 1, clear do
      local idx = (s.hd + i) % 10
      s['d' .. idx] = 0
      s['w' .. idx] = 0
    end
    s.hd = now_slot
  end
  return s.hd % 10
end

-- Retries that could be spent now; -1 for an unlimited budget.
local function remaining()
  if kind == 1 then
    return math.max(b1 - s.sp, 0)
  elseif kind == 2 then
    advance()
    local d, w = 0, 0
    for i = 0, 9 do
      d = d + s['d' .. i]
      w = w + s['w' .. i]
    end
    return math.max(b2 + math.floor(d * b3 / 1000) - w, 0)
  end
  return -1
end

-- Writes the given fields back, and keeps a TTL covering everything the key holds plus at
-- least half the idle TTL: the expiry is pushed to (what it must cover + the idle TTL) only
-- when it would otherwise fall short of (what it must cover + half the idle TTL), so in the
-- steady state an admission writes one field and sets no TTL.
local function save(fields)
  local keep_us = math.max(s.tat - now, s.bu - now, 0)
  if kind == 2 then keep_us = math.max(keep_us, b1 * 10) end
  local now_ms = math.floor(now / 1000)
  local keep_ms = math.ceil(keep_us / 1000)
  local refresh = s.ex - now_ms < keep_ms + math.floor(idle_ms / 2)
  local args = {}
  for _, f in ipairs(fields) do
    args[#args + 1] = f
    args[#args + 1] = string.format('%.0f', s[f])
  end
  if refresh then
    s.ex = now_ms + keep_ms + idle_ms
    args[#args + 1] = 'ex'
    args[#args + 1] = string.format('%.0f', s.ex)
  end
  redis.call('HSET', key, unpack(args))
  if refresh then
    redis.call('PEXPIRE', key, string.format('%.0f', keep_ms + idle_ms))
  end
end
"#;

/// `{0, next_in_us}` admitted; `{1, wait_us, cooldown}` wait; `{2}` budget exhausted.
/// The budget is checked first, then the cooldown, then GCRA: `algorithm::admit` exactly.
const ADMIT: &str = r#"
local spend = op_arg == 1
if spend and kind ~= 0 and remaining() < 1 then return {2} end
if now < s.bu then return {1, s.bu - now, 1} end
local new_tat = math.max(s.tat, now) + interval
local ahead = new_tat - now
if ahead > tolerance then return {1, ahead - tolerance, 0} end
s.tat = new_tat
if spend and kind ~= 0 then
  if kind == 1 then
    s.sp = s.sp + 1
  else
    local i = advance()
    s['w' .. i] = s['w' .. i] + 1
  end
  local fields = {'tat'}
  for _, f in ipairs(BUDGET) do fields[#fields + 1] = f end
  save(fields)
else
  save({'tat'})
end
return {0, math.max(new_tat + interval - tolerance - now, 0)}
"#;

/// `{extended, blocked_for_us}`: raise-only cooldown.
const DEFER: &str = r#"
local until_us = now + op_arg
local extended = 0
if until_us > s.bu then
  s.bu = until_us
  extended = 1
  save({'bu'})
end
return {extended, math.max(s.bu - now, 0)}
"#;

/// `{0}`: one success recorded for a replenishing budget.
const DEPOSIT: &str = r#"
if kind == 2 then
  local i = advance()
  s['d' .. i] = s['d' .. i] + 1
  save(BUDGET)
end
return {0}
"#;

/// `{blocked_for_us, retries_remaining or -1}`; read-only.
const STATE: &str = r#"
return {math.max(s.bu - now, 0), remaining()}
"#;

/// One of the four decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Admit,
    Defer,
    Deposit,
    State,
}

/// The four scripts, hashed once per store, with their sources for `SCRIPT LOAD` and `EVAL`.
pub(crate) struct Scripts {
    scripts: [Script; 4],
    sources: [String; 4],
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let sources = [ADMIT, DEFER, DEPOSIT, STATE].map(|body| format!("{PRELUDE}{body}"));
        Self {
            scripts: [
                Script::new(&sources[0]),
                Script::new(&sources[1]),
                Script::new(&sources[2]),
                Script::new(&sources[3]),
            ],
            sources,
        }
    }

    /// The script for `op` and its source.
    pub(crate) fn get(&self, op: Op) -> (&Script, &str) {
        let i = op as usize;
        (&self.scripts[i], &self.sources[i])
    }

    /// The script sources, for `SCRIPT LOAD`.
    pub(crate) fn sources(&self) -> &[String; 4] {
        &self.sources
    }
}

/// The leading ARGV of every script, from the caller's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Params {
    pub(crate) interval_us: u64,
    pub(crate) tolerance_us: u64,
    pub(crate) kind: u64,
    pub(crate) b1: u64,
    pub(crate) b2: u64,
    pub(crate) b3: u64,
    pub(crate) idle_ms: u64,
}

impl Params {
    /// Computes the parameters exactly as `tower_allowance` does for its own store.
    pub(crate) fn new(config: &AllowanceConfig, idle_ttl: Duration) -> Self {
        let interval_us = micros(config.interval());
        let tolerance_us = interval_us
            .saturating_mul(u64::from(config.burst()))
            .min(MAX_EXACT);
        let (kind, b1, b2, b3) = match config.retry_budget() {
            RetryBudgetConfig::Unlimited => (0, 0, 0, 0),
            // A budget beyond 2^53 retries is unlimited in practice.
            RetryBudgetConfig::Fixed { retries } => (1, (*retries).min(MAX_EXACT), 0, 0),
            RetryBudgetConfig::Replenishing(r) => {
                let window_us = micros(r.window());
                let slot_us = window_us / SLOTS;
                let reserve = u64::from(r.min_per_sec()).saturating_mul(window_us) / 1_000_000;
                // `ratio()` is `per_mille / 1000`: rounding recovers the integer exactly.
                let per_mille = (r.ratio() * 1000.0).round() as u64;
                (2, slot_us, reserve.min(MAX_EXACT), per_mille)
            }
        };
        Self {
            interval_us,
            tolerance_us,
            kind,
            b1,
            b2,
            b3,
            idle_ms: u64::try_from(idle_ttl.as_millis())
                .unwrap_or(u64::MAX)
                .min(MAX_EXACT),
        }
    }

    /// The script's ARGV and how many of them to send (9 with a test clock, else 8).
    pub(crate) fn argv(&self, op_arg: u64, test_clock_us: Option<u64>) -> ([u64; 9], usize) {
        let args = [
            self.interval_us,
            self.tolerance_us,
            self.kind,
            self.b1,
            self.b2,
            self.b3,
            self.idle_ms,
            op_arg,
            test_clock_us.unwrap_or(0),
        ];
        (args, if test_clock_us.is_some() { 9 } else { 8 })
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .min(MAX_EXACT)
}

/// A reply that does not have the documented shape.
#[derive(Debug)]
pub(crate) struct BadReply;

fn us(v: i64) -> Result<Duration, BadReply> {
    u64::try_from(v)
        .map(Duration::from_micros)
        .map_err(|_| BadReply)
}

pub(crate) fn decode_admit(reply: &[i64]) -> Result<Decision, BadReply> {
    match *reply {
        [0, next_in] => Ok(Decision::Admitted {
            next_in: us(next_in)?,
        }),
        [1, wait, cooldown @ (0 | 1)] => Ok(Decision::Wait {
            wait: us(wait)?,
            cooldown: cooldown == 1,
        }),
        [2] => Ok(Decision::BudgetExhausted),
        _ => Err(BadReply),
    }
}

pub(crate) fn decode_defer(reply: &[i64]) -> Result<tower_allowance::store::Deferred, BadReply> {
    match *reply {
        [extended @ (0 | 1), blocked_for] => Ok(tower_allowance::store::Deferred {
            extended: extended == 1,
            blocked_for: us(blocked_for)?,
        }),
        _ => Err(BadReply),
    }
}

pub(crate) fn decode_deposit(reply: &[i64]) -> Result<(), BadReply> {
    match *reply {
        [0] => Ok(()),
        _ => Err(BadReply),
    }
}

pub(crate) fn decode_state(reply: &[i64]) -> Result<tower_allowance::store::StoreState, BadReply> {
    match *reply {
        [blocked_for, remaining] => Ok(tower_allowance::store::StoreState {
            blocked_for: us(blocked_for)?,
            retries_remaining: match remaining {
                -1 => None,
                n => Some(u64::try_from(n).map_err(|_| BadReply)?),
            },
        }),
        _ => Err(BadReply),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_allowance::ReplenishingBudget;

    #[test]
    fn params_match_the_library() {
        let config = AllowanceConfig::per_second(3, 2).expect("valid");
        let p = Params::new(&config, Duration::from_secs(60));
        assert_eq!(p.interval_us, 333_334);
        assert_eq!(p.tolerance_us, 666_668);
        assert_eq!((p.kind, p.idle_ms), (0, 60_000));

        let budget = ReplenishingBudget::new(Duration::from_secs(10), 2, 0.25).expect("valid");
        let config = config.with_retry_budget(RetryBudgetConfig::Replenishing(budget));
        let p = Params::new(&config, Duration::ZERO);
        assert_eq!((p.kind, p.b1, p.b2, p.b3), (2, 1_000_000, 20, 250));

        let config = config.with_retry_budget(RetryBudgetConfig::fixed(u64::MAX));
        let p = Params::new(&config, Duration::ZERO);
        assert_eq!((p.kind, p.b1), (1, MAX_EXACT));
    }

    #[test]
    fn replies_decode_or_are_refused() {
        assert_eq!(
            decode_admit(&[0, 5]).ok(),
            Some(Decision::Admitted {
                next_in: Duration::from_micros(5)
            })
        );
        assert_eq!(
            decode_admit(&[1, 7, 1]).ok(),
            Some(Decision::Wait {
                wait: Duration::from_micros(7),
                cooldown: true
            })
        );
        assert_eq!(decode_admit(&[2]).ok(), Some(Decision::BudgetExhausted));
        for bad in [&[][..], &[3], &[0, -1], &[1, 1, 2], &[0, 1, 2, 3]] {
            assert!(decode_admit(bad).is_err(), "{bad:?}");
        }
        assert!(decode_defer(&[2, 0]).is_err());
        assert!(decode_deposit(&[1]).is_err());
        assert_eq!(
            decode_state(&[0, -1]).ok().map(|s| s.retries_remaining),
            Some(None)
        );
        assert!(decode_state(&[0, -2]).is_err());
    }
}
