//! The adaptive rate: slow start, then additive increase and multiplicative decrease, capped by what a server advertises.

use super::{LimitParams, Params, State, MAX_DELAY_US, MAX_LIMITS};

/// The adaptive rate at `now`, in thousandths of a request per second, if the rate adapts.
///
/// Before the first throttling response it doubles every second from the initial rate (a
/// slow start: an unknown limit is found in a few seconds from far below it). After a cut it
/// grows by 1% of the rate at the cut per second (additive increase: it stays near the limit,
/// probing it rarely). Always within the floor and the ceiling, and never above a rate the
/// server advertised.
pub fn adaptive_rate(state: &State, now: u64, params: &Params) -> Option<u64> {
    let a = params.adaptive?;
    let base = if state.rate_at_cut == 0 {
        a.initial_milli
    } else {
        state.rate_at_cut
    };
    let rate = if state.cut_at == 0 {
        // Doubling each whole second since the first admission.
        let since = if state.started_at == 0 {
            0
        } else {
            now.saturating_sub(state.started_at)
        };
        let doublings = since / SLOW_START_DOUBLING_US;
        if doublings >= 40 {
            u64::MAX
        } else {
            base.saturating_mul(1 << doublings)
        }
    } else {
        // base * since / period, computed so that no product exceeds 2^53 (exact in Lua).
        let since = now.saturating_sub(state.cut_at);
        let (q, r) = (
            since / ADDITIVE_INCREASE_PERIOD_US,
            since % ADDITIVE_INCREASE_PERIOD_US,
        );
        base.saturating_add(
            base.saturating_mul(q)
                .saturating_add(base.saturating_mul(r) / ADDITIVE_INCREASE_PERIOD_US),
        )
    };
    let mut ceiling = a.ceiling_milli;
    if state.advertised != 0 {
        ceiling = ceiling.min(state.advertised);
    }
    Some(rate.min(ceiling).max(a.floor_milli))
}

/// A slow start doubles the adaptive rate this often (one second).
pub const SLOW_START_DOUBLING_US: u64 = 1_000_000;

/// After a cut the adaptive rate grows by its value at the cut every this long (100 s: 1% per
/// second).
pub const ADDITIVE_INCREASE_PERIOD_US: u64 = 100_000_000;

/// A cut keeps this many thousandths of the rate (0.85).
pub const CUT_PER_MILLE: u64 = 850;

/// A cut within [`FAST_CUT_WINDOW_US`] of the previous one keeps this many thousandths (0.7):
/// throttling that persists after a cut means the limit dropped, and it is found faster.
pub const FAST_CUT_PER_MILLE: u64 = 700;

/// See [`FAST_CUT_PER_MILLE`] (2.5 s).
pub const FAST_CUT_WINDOW_US: u64 = 2_500_000;

/// The limits as they stand at `now`: the configured ones, with the main limit's interval
/// from the adaptive rate when it adapts.
pub fn effective_limits(state: &State, now: u64, params: &Params) -> [LimitParams; MAX_LIMITS] {
    let mut limits = params.limits;
    // The rate when the next slot falls: after the last one reserved. A schedule reserved
    // ahead (one slot per waiting worker) is spaced by the rate as it will then be, so a
    // slow start from far below the limit is not stuck behind slots reserved at its start.
    let at = now.max(state.reserved_until);
    if let (Some(rate), Some(a)) = (adaptive_rate(state, at, params), params.adaptive) {
        let interval_us = 1_000_000_000u64.div_ceil(rate.max(1)).max(1);
        limits[0].interval_us = interval_us;
        limits[0].tolerance_us = interval_us.saturating_mul(a.burst).min(MAX_DELAY_US);
    }
    limits
}

/// A throttling response cuts the adaptive rate once per round: unless the throttled request
/// was sent in the last cut's round, that is before the cut or on a slot reserved before it
/// (until `round_until`, the latest slot then reserved, moved with the schedule by the
/// cooldowns since, give or take [`ROUND_GRACE_US`]). Slots reserved at the old rate go out
/// at its spacing and may be throttled too; each of their refusals cutting again collapsed
/// the rate with many workers (one cut per worker's slot). See [`throttle`](super::throttle).
pub fn cut_rate(state: &mut State, now: u64, params: &Params, age_us: u64) {
    if let Some(rate) = adaptive_rate(state, now, params) {
        let sent = now.saturating_sub(age_us);
        let round_end = state
            .cut_at
            .max(state.round_until.saturating_add(ROUND_GRACE_US));
        if state.cut_at == 0 || sent > round_end {
            let fast = state.cut_at != 0 && now - state.cut_at < FAST_CUT_WINDOW_US;
            let keep = if fast {
                FAST_CUT_PER_MILLE
            } else {
                CUT_PER_MILLE
            };
            let floor = params.adaptive.map_or(1, |a| a.floor_milli.max(1));
            state.rate_at_cut = (rate.saturating_mul(keep) / 1_000).max(floor);
            state.cut_at = now.max(1);
            state.round_until = state.reserved_until.max(now);
        }
    }
}

/// A request sent this long after the end of a cut's round still belongs to it (1 ms, the
/// slots' granularity: a timer firing late on the last slot reserved before the cut).
pub const ROUND_GRACE_US: u64 = 1_000;

/// A server advertised its rate: the adaptive rate is capped at it from now on and, when
/// configured to adopt it, restarts from it. Returns the adaptive rate now (0: not adaptive).
pub fn advertise(state: &mut State, now: u64, params: &Params, rate_milli: u64) -> u64 {
    let Some(a) = params.adaptive else {
        return 0;
    };
    if rate_milli == 0 {
        return adaptive_rate(state, now, params).unwrap_or(0);
    }
    state.advertised = rate_milli;
    if a.adopt {
        state.rate_at_cut = rate_milli.min(a.ceiling_milli).max(a.floor_milli);
        state.cut_at = now.max(1);
    }
    adaptive_rate(state, now, params).unwrap_or(0)
}
