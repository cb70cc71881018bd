//! The rate without the `adaptive` feature: always the configured one.
//!
//! No configuration can ask for an adaptive rate without the feature (`AdaptiveRate` is
//! behind it), so `params.adaptive` is always `None` here and these are what `adaptive.rs`
//! answers for it. Stores that mirror the rule (the Redis crate) build with the feature.

use super::{LimitParams, Params, State, MAX_LIMITS};

/// Never adapts.
pub(crate) fn adaptive_rate(_state: &State, _now: u64, _params: &Params) -> Option<u64> {
    None
}

/// The configured limits.
pub(crate) fn effective_limits(
    _state: &State,
    _now: u64,
    params: &Params,
) -> [LimitParams; MAX_LIMITS] {
    params.limits
}

/// Nothing to cut.
pub(crate) fn cut_rate(_state: &mut State, _now: u64, _params: &Params, _age_us: u64) -> Stretch {
    Stretch::NONE
}

/// Nothing to cap or adopt: 0, "not adaptive".
pub(crate) fn advertise(_state: &mut State, _now: u64, _params: &Params, _rate_milli: u64) -> u64 {
    0
}

/// No re-timing: without an adaptive rate nothing is cut (its twin in `adaptive.rs`
/// re-times the pending schedule at a cut). Kept so that events encode alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stretch;

impl Stretch {
    /// No re-timing.
    pub const NONE: Self = Self;

    // (`from_parts` and `to_parts`, for the wire: in `view.rs`.)

    /// Always.
    pub const fn is_none(&self) -> bool {
        true
    }

    /// `t`.
    pub fn apply(&self, t: u64) -> u64 {
        t
    }
}
