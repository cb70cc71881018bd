//! The rule's values read from outside (feature `rule`, outside semver; and the tests): the
//! accessors a store that mirrors the rule needs, kept out of the default build.

// Read only by the tests without the `rule` feature.
#![cfg_attr(not(feature = "rule"), allow(dead_code))]

use super::{
    apply, is_settled, AdaptiveParams, AdmitRequest, BudgetParams, LimitParams, Op, Params, Reply,
    Reservation, State, Unit, MAX_LIMITS,
};

impl AdmitRequest {
    /// See [`AdmitRequest::known_generation`].
    pub fn known_generation_of(&self) -> u64 {
        self.known_generation
    }

    /// Whether this is a retry.
    pub fn is_retry(&self) -> bool {
        self.retry
    }

    /// The cost.
    pub fn cost_units(&self) -> u32 {
        self.cost
    }

    /// Not before this many microseconds from now.
    pub fn not_before_us(&self) -> u64 {
        self.not_before_us
    }

    /// At most this many microseconds from now (`u64::MAX`: unbounded).
    pub fn max_wait_us(&self) -> u64 {
        self.max_wait_us
    }

    /// Successes to record first.
    pub fn deposit_count(&self) -> u64 {
        self.deposits
    }
}

impl Reservation {
    /// The event epoch the reservation has seen.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl LimitParams {
    /// Microseconds between two units (period / rate, rounded up so the admitted rate never
    /// exceeds the configured one).
    pub fn interval_us(&self) -> u64 {
        self.interval_us
    }

    /// `burst * interval_us`: how far ahead of now the limit's theoretical arrival time may run
    /// before an admission has to wait.
    pub fn tolerance_us(&self) -> u64 {
        self.tolerance_us
    }

    /// What the limit counts.
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// How much later an admission that finds the bucket full moves the schedule (the
    /// headroom for delivery jitter, a time; 0 when exact).
    pub fn headroom_us(&self) -> u64 {
        self.headroom_us
    }
}

impl Params {
    /// The retry budget.
    pub fn budget(&self) -> BudgetParams {
        self.budget
    }

    /// The longest cooldown a server may ask for; a longer (or unrepresentable) delay closes
    /// the allowance instead.
    pub fn max_cooldown_us(&self) -> u64 {
        self.max_cooldown_us
    }

    /// The first backoff after a quota probe failed or found quota left.
    pub fn probe_backoff_min_us(&self) -> u64 {
        self.probe_backoff_min_us
    }

    /// The longest backoff between quota probes.
    pub fn probe_backoff_max_us(&self) -> u64 {
        self.probe_backoff_max_us
    }
}

impl AdaptiveParams {
    /// The rate it starts at.
    pub fn initial_milli(&self) -> u64 {
        self.initial_milli
    }

    /// The lowest rate.
    pub fn floor_milli(&self) -> u64 {
        self.floor_milli
    }

    /// The highest rate.
    pub fn ceiling_milli(&self) -> u64 {
        self.ceiling_milli
    }

    /// The main limit's burst.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whether an advertised rate is adopted.
    pub fn adopts(&self) -> bool {
        self.adopt
    }
}

impl State {
    /// Applies one operation at `now` (the store's clock, in microseconds): the whole rule,
    /// one atomic step. A store that keeps a `State` under a lock or in a transaction calls
    /// this and is done.
    pub fn apply(&mut self, now: u64, params: &Params, op: &Op) -> Reply {
        apply(self, now, params, op)
    }

    /// Whether dropping this state and starting over from a fresh one would let nothing
    /// through that keeping it would not: no cooldown or closure running, every bucket full,
    /// no reservation pending, no retry budget spent, nothing learned by an adaptive rate.
    pub fn is_settled(&self, now: u64, params: &Params) -> bool {
        is_settled(self, now, params)
    }

    /// The cooldown deadline.
    pub fn blocked_until(&self) -> u64 {
        self.blocked_until
    }

    /// The event epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Each limit's theoretical arrival time.
    pub fn tat(&self) -> [u64; MAX_LIMITS] {
        self.tat
    }

    /// When this state was created (0: not yet).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

// The fixed rate's re-timing (rule/fixed.rs) on the wire, as adaptive.rs's twin writes it.
#[cfg(not(feature = "adaptive"))]
impl super::Stretch {
    /// Always [`Stretch::NONE`](super::Stretch::NONE).
    pub const fn from_parts(_from: u64, _start: u64, _base: u64, _cap: u64, _new: u64) -> Self {
        Self
    }

    /// Zeros.
    pub const fn to_parts(self) -> (u64, u64, u64, u64, u64) {
        (0, 0, 0, 0, 0)
    }
}
