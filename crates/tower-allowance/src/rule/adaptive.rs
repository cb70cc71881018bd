//! The adaptive rate: slow start, then additive increase and multiplicative decrease, capped by what a server advertises.

use super::{LimitParams, Params, State, MAX_DELAY_US, MAX_LIMITS};

/// The adaptive rate at `now`, in thousandths of a request per second, if the rate adapts.
///
/// Before the first throttling response it doubles every second from the initial rate (a
/// slow start: an unknown limit is found in a few seconds from far below it). After a cut it
/// grows by 1% of the rate at the cut per second (additive increase: it stays near the limit,
/// probing it rarely). Always within the floor and the ceiling, and never above a rate the
/// server advertised.
pub(crate) fn adaptive_rate(state: &State, now: u64, params: &Params) -> Option<u64> {
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
pub(crate) fn effective_limits(
    state: &State,
    now: u64,
    params: &Params,
) -> [LimitParams; MAX_LIMITS] {
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

/// A throttling response cuts the adaptive rate, once per round of sends: unless the
/// throttled request was sent before the last cut (or within [`ROUND_GRACE_US`] after it, before the
/// cut's event reached every holder). The main limit's pending schedule is re-timed at the
/// new rate in the same step (the returned [`Stretch`], which holders apply to their slots),
/// so the slots reserved before the cut go out at the new spacing: none of them is sent at
/// the spacing that was throttled, and each of their refusals would otherwise cut again (with
/// many workers, one cut per worker's slot: the rate collapsed). See [`throttle`](super::throttle).
pub(crate) fn cut_rate(state: &mut State, now: u64, params: &Params, age_us: u64) -> Stretch {
    let Some(rate) = adaptive_rate(state, now, params) else {
        return Stretch::NONE;
    };
    let sent = now.saturating_sub(age_us);
    if state.cut_at != 0 && sent <= state.cut_at.saturating_add(ROUND_GRACE_US) {
        return Stretch::NONE;
    }
    let fast = state.cut_at != 0 && now - state.cut_at < FAST_CUT_WINDOW_US;
    let keep = if fast {
        FAST_CUT_PER_MILLE
    } else {
        CUT_PER_MILLE
    };
    let Some(a) = params.adaptive else {
        return Stretch::NONE;
    };
    let floor = a.floor_milli.max(1);
    // How the pending schedule was reserved: during the slow start at the doubling rate
    // (capped as `adaptive_rate` caps it); after a cut at the rate now, at its head. Its later
    // slots were reserved at the rate growing since (closer), and come out no closer than
    // the new rate grown as long; re-timing them all by the rate of the last slot instead
    // spaced a long queue (1,024 workers) by far less than the new rate: 1.53-1.66x.
    let slow_start = state.cut_at == 0;
    let (base, cap) = if slow_start {
        let base = if state.rate_at_cut == 0 {
            a.initial_milli
        } else {
            state.rate_at_cut
        };
        let cap = match state.advertised {
            0 => a.ceiling_milli,
            adv => a.ceiling_milli.min(adv),
        };
        (base, cap.max(floor))
    } else {
        (rate, rate)
    };
    state.rate_at_cut = (rate.saturating_mul(keep) / 1_000).max(floor);
    // The bucket's debt keeps its count of units, now of the new rate: the schedule after
    // `from` (the cooldown's end, or now) is re-timed, reserved slots or not.
    let from = now.max(state.blocked_until);
    let stretch = if slow_start {
        Stretch::slow_start(from, state.started_at, base, cap, state.rate_at_cut)
    } else {
        Stretch::constant(from, base, state.rate_at_cut)
    };
    state.cut_at = now.max(1);
    state.tat[0] = stretch.apply(state.tat[0]);
    state.reserved_until = stretch.apply(state.reserved_until);
    stretch
}

/// A request sent this long after a cut still belongs to the cut's round (100 ms: the cut's
/// event reaches every holder well within it, and a timer firing late on a slot due at the
/// cut is within it too).
pub const ROUND_GRACE_US: u64 = 100_000;

/// A server advertised its rate: the adaptive rate is capped at it from now on and, when
/// configured to adopt it, restarts from it. Returns the adaptive rate now (0: not adaptive).
pub(crate) fn advertise(state: &mut State, now: u64, params: &Params, rate_milli: u64) -> u64 {
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

/// A slow start doubles the adaptive rate this often (one second).
pub const SLOW_START_DOUBLING_US: u64 = 1_000_000;

/// A re-timing of the main limit's pending schedule, published when a throttling response
/// cuts the adaptive rate: every slot after `from` keeps its place in the queue, and the
/// queue goes out at the new rate. The slots were reserved at the rate as it was when each
/// fell (`rate(t)`: during the slow start the initial rate doubled every second since
/// `start`, capped at `cap`; after a cut, at most `base`, constant); so the slot at `t`
/// had `∫ rate` from `from` to `t` slots before it, and moves to `from + ∫ rate / new`,
/// rounded up. No slot moves earlier.
///
#[cfg_attr(feature = "rule", doc = "```")]
#[cfg_attr(not(feature = "rule"), doc = "```ignore")]
/// use tower_allowance::rule::Stretch;
///
/// // Reserved at 4/s (4,000 thousandths), now 3/s: from 1 ms on, 4/3 as far.
/// let s = Stretch::constant(1_000, 4_000, 3_000);
/// assert_eq!(s.apply(4_000), 5_000);
/// assert_eq!(s.apply(500), 500); // before `from`: unchanged
/// // A slow start from 1/s (doubling each second since 1 us), cut to 2/s at 1 s: the
/// // slot at 3 s had 2 + 4 = 6 before it, now 3 s after the cut.
/// let s = Stretch::slow_start(1_000_001, 1, 1_000, 1_000_000, 2_000);
/// assert_eq!(s.apply(3_000_001), 4_000_001);
/// assert_eq!(Stretch::NONE.apply(4_000), 4_000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stretch {
    pub(crate) from: u64,
    /// The slow start's start (0: the rate was constant at `base`).
    pub(crate) start: u64,
    pub(crate) base: u64,
    pub(crate) cap: u64,
    /// The new rate (0: no re-timing).
    pub(crate) new: u64,
}

impl Stretch {
    /// No re-timing.
    pub const NONE: Self = Self {
        from: 0,
        start: 0,
        base: 0,
        cap: 0,
        new: 0,
    };

    /// Slots after `from` were reserved at `rate_milli` at most; the queue now goes out at
    /// `new_milli` (rates in thousandths per second). Nothing moves unless the rate fell.
    pub const fn constant(from: u64, rate_milli: u64, new_milli: u64) -> Self {
        Self::from_parts(from, 0, rate_milli, rate_milli, new_milli)
    }

    /// Slots after `from` were reserved during a slow start from `base_milli` at `start`
    /// (doubling every second, capped at `cap_milli`); the queue now goes out at `new_milli`.
    pub const fn slow_start(
        from: u64,
        start: u64,
        base_milli: u64,
        cap_milli: u64,
        new_milli: u64,
    ) -> Self {
        Self::from_parts(from, start, base_milli, cap_milli, new_milli)
    }

    /// From [`Stretch::to_parts`]; [`Stretch::NONE`] when nothing would move.
    pub const fn from_parts(from: u64, start: u64, base: u64, cap: u64, new: u64) -> Self {
        let top = if cap < base { cap } else { base };
        let fell = if start == 0 { top > new } else { true };
        if new == 0 || base == 0 || cap == 0 || !fell {
            Self::NONE
        } else {
            Self {
                from,
                start,
                base,
                cap,
                new,
            }
        }
    }

    /// `(from, start, base, cap, new)`, for stores that carry it over the wire.
    #[cfg(any(test, feature = "rule"))]
    pub const fn to_parts(self) -> (u64, u64, u64, u64, u64) {
        (self.from, self.start, self.base, self.cap, self.new)
    }

    /// Whether anything moves.
    pub const fn is_none(&self) -> bool {
        self.new == 0
    }

    /// Where the slot at `t` moves (see the type's docs). Exact in integers below 2^53 for
    /// rates up to 10,000 per second: every product is split below that (the Redis store's
    /// Lua computes the same).
    pub fn apply(&self, t: u64) -> u64 {
        if self.is_none() || t <= self.from {
            return t;
        }
        // Σ len * rate / new over the pieces where the rate is constant, as q + r / new.
        let (mut at, mut q, mut r) = (self.from, 0u64, 0u64);
        while at < t {
            let (rate, end) = self.piece(at, t);
            let len = end - at;
            let part = (len % self.new).saturating_mul(rate);
            q = q
                .saturating_add((len / self.new).saturating_mul(rate))
                .saturating_add(part / self.new);
            r += part % self.new;
            q = q.saturating_add(r / self.new);
            r %= self.new;
            at = end;
        }
        let moved = self.from.saturating_add(q).saturating_add(u64::from(r > 0));
        moved.max(t)
    }

    /// The rate at `at`, and until when (at most `t`) it holds.
    fn piece(&self, at: u64, t: u64) -> (u64, u64) {
        if self.start == 0 {
            return (self.base.min(self.cap), t);
        }
        let doublings = at.saturating_sub(self.start) / SLOW_START_DOUBLING_US;
        let rate = if doublings >= 40 {
            self.cap
        } else {
            self.base.saturating_mul(1 << doublings).min(self.cap)
        };
        if rate >= self.cap {
            return (rate, t);
        }
        let next = self
            .start
            .saturating_add((doublings + 1).saturating_mul(SLOW_START_DOUBLING_US));
        (rate, next.min(t).max(at + 1))
    }
}
