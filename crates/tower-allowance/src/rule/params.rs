//! The parameters: a validated configuration as the rule reads it.

use super::MAX_LIMITS;

/// What one limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Unit {
    /// Every request counts one.
    Requests,
    /// Every request counts its cost (for example, the tokens an LLM request carries).
    Cost,
}

/// One limit's derived parameters: a read-only view of a validated configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LimitParams {
    pub(crate) interval_us: u64,
    pub(crate) tolerance_us: u64,
    pub(crate) unit: Unit,
    /// Added to the schedule by an admission that finds the bucket full (the headroom, a time).
    pub(crate) headroom_us: u64,
}

impl LimitParams {
    /// The units a request of `cost` takes from this limit.
    pub fn units(&self, cost: u32) -> u64 {
        match self.unit {
            Unit::Requests => 1,
            Unit::Cost => u64::from(cost),
        }
    }
}

/// The retry budget's derived parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum BudgetParams {
    /// No group bound.
    Unlimited,
    /// A fixed number of retries for the group.
    Fixed {
        /// Retries in total.
        retries: u64,
    },
    /// A sliding window of [`BUDGET_SLOTS`](super::BUDGET_SLOTS) slots.
    Replenishing {
        /// Length of one slot, in microseconds.
        slot_us: u64,
        /// Retries always available per window (the floor).
        reserve: u64,
        /// Retries earned per 1,000 successful requests.
        per_mille: u64,
    },
}

/// Every number the rule needs, derived once from an [`AllowanceConfig`](crate::AllowanceConfig)
/// and passed to the store with every call, so that no store re-derives (or drifts from) them.
///
/// A read-only view: obtain it with [`AllowanceConfig::params`](crate::AllowanceConfig::params).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Params {
    pub(crate) limits: [LimitParams; MAX_LIMITS],
    pub(crate) limit_count: usize,
    pub(crate) budget: BudgetParams,
    pub(crate) max_cooldown_us: u64,
    pub(crate) probe_backoff_min_us: u64,
    pub(crate) probe_backoff_max_us: u64,
    pub(crate) adaptive: Option<AdaptiveParams>,
    #[cfg(feature = "settle")]
    pub(crate) settle: Option<super::settle::SettleParams>,
}

impl Params {
    /// The limits, at least one.
    pub fn limits(&self) -> &[LimitParams] {
        &self.limits[..self.limit_count]
    }

    /// The adaptive rate, if the main limit's rate adapts.
    pub fn adaptive(&self) -> Option<AdaptiveParams> {
        self.adaptive
    }

    /// Whether the rule can decide a first attempt from the main limit's bucket alone: the
    /// memory store's lock-free path.
    pub(crate) fn single_limit(&self) -> bool {
        self.limit_count == 1 && self.adaptive.is_none()
    }
}

/// The adaptive rate's derived parameters: rates in thousandths of a request per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AdaptiveParams {
    pub(crate) initial_milli: u64,
    pub(crate) floor_milli: u64,
    pub(crate) ceiling_milli: u64,
    /// The main limit's burst: the tolerance is `burst` intervals at whatever rate.
    pub(crate) burst: u64,
    /// Take the rate a server advertises (not only cap at it).
    pub(crate) adopt: bool,
}
