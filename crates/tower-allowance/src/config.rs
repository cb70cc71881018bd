//! Validated configuration for an [`Allowance`](crate::Allowance).
//!
//! Every constructor returns `Result<_, ConfigError>`: a zero rate, a zero period or a
//! nonsensical ratio is an error with a static reason, never a panic or a silent default.
//!
//! ```
//! use std::time::Duration;
//! use tower_allowance::{AllowanceConfig, RetryBudgetConfig};
//!
//! // Two requests per second, bursts of two, a batch budget of four retries.
//! let config = AllowanceConfig::per_second(2, 2)?
//!     .with_max_waiters(10_000)
//!     .with_retry_budget(RetryBudgetConfig::fixed(4));
//! assert_eq!(config.burst(), 2);
//!
//! assert!(AllowanceConfig::per_second(0, 2).is_err());
//! assert!(AllowanceConfig::new(5, Duration::ZERO, 1).is_err());
//! # Ok::<(), tower_allowance::ConfigError>(())
//! ```

use std::time::Duration;

pub use self::limit::Limit;
use self::retry::RetryConfig;
use crate::{
    classify::{ReadWith, StatusClassifier},
    error::ConfigError,
    rule::{self, BudgetParams, BUDGET_SLOTS, MAX_LIMITS},
    signals::{Dialect, ReadContext},
    store::Params,
};

// One limit, and the headroom it keeps.
mod limit;
// The per-request retry rules an allowance carries (public as `retry::RetryConfig`).
pub(crate) mod retry;
// The feature-only setters and getters, in files the default build does not read.
#[cfg(any(test, feature = "adaptive"))]
pub(crate) mod adaptive;
#[cfg(feature = "shares")]
pub(crate) mod classes;
#[cfg(feature = "serde")]
pub(crate) mod de;
mod debug;
#[cfg(feature = "dialects")]
mod dialects;
#[cfg(feature = "settle")]
pub(crate) mod settle;

// The defaults, documented where they are set (`with_max_waiters`, `with_max_cooldown`,
// `OutagePolicy::default`).
pub(crate) const DEFAULT_MAX_WAITERS: usize = 1024;
pub(crate) const DEFAULT_MAX_COOLDOWN: Duration = Duration::from_secs(3600);
pub(crate) const DEFAULT_MAX_OUTAGE_WAIT: Duration = Duration::from_secs(60);

/// What one allowance may spend: one or more token buckets, a wait-queue bound, a retry
/// budget, and the bounds that keep a hostile server or a dead store from parking it.
///
/// `Clone + Debug`, and `Deserialize` with the `serde` feature, so one config can be
/// reused across services. Building an [`Allowance`](crate::Allowance) from it is what
/// creates shared state; the config itself is plain data.
///
/// ```
/// use std::time::Duration;
/// use tower_allowance::{AllowanceConfig, Limit};
///
/// // 100 requests per minute, at most 10 at once.
/// let config = AllowanceConfig::new(100, Duration::from_secs(60), 10)?;
/// assert_eq!(config.interval(), Duration::from_millis(600));
///
/// // 10/s with bursts of 10, plus 500 per minute and 10,000 per day, all at once.
/// let stacked = AllowanceConfig::per_second(10, 10)?
///     .with_limit(Limit::per_minute(500, 500)?)?
///     .with_limit(Limit::per_day(10_000, 10_000)?)?;
/// assert_eq!(stacked.limits().len(), 3);
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "de::RawAllowanceConfig"))]
pub struct AllowanceConfig {
    limits: Vec<Limit>,
    max_waiters: usize,
    retry_budget: RetryBudgetConfig,
    max_cooldown: Duration,
    outage: OutagePolicy,
    #[cfg(any(test, feature = "adaptive"))]
    adaptive: Option<adaptive::AdaptiveRate>,
    dialect: Dialect,
    classifier: StatusClassifier,
    retry: RetryConfig,
    max_date_skew: Duration,
    params: Params,
    #[cfg(feature = "shares")]
    pub(crate) classes: classes::Classes,
}

/// What an admission does when the allowance's store does not answer (a Redis outage).
///
/// Never send without the authority: neither policy sends a request the store did not admit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutagePolicy {
    /// Wait for the store (probing with backoff) until it answers, the request's
    /// [`Deadline`](crate::Deadline) passes, or `max` has passed; only then fail with
    /// [`StoreUnavailable`](crate::error::StoreUnavailable). The default, with `max` one
    /// minute.
    Wait {
        /// The longest one admission waits for the store.
        max: Duration,
    },
    /// Fail at once with [`StoreUnavailable`](crate::error::StoreUnavailable).
    FailFast,
}

impl Default for OutagePolicy {
    fn default() -> Self {
        Self::Wait {
            max: DEFAULT_MAX_OUTAGE_WAIT,
        }
    }
}

impl AllowanceConfig {
    /// `rate` attempts per `period`, with bursts of up to `burst`.
    ///
    /// # Errors
    ///
    /// A zero `rate`, `burst` or `period`, or a rate so high that the interval between
    /// tokens is below one microsecond, or a `burst * interval` beyond [`MAX_DELAY`](crate::MAX_DELAY).
    pub fn new(rate: u32, period: Duration, burst: u32) -> Result<Self, ConfigError> {
        let main = Limit::new(rate, period, burst)?;
        let mut config = Self {
            limits: vec![main],
            max_waiters: DEFAULT_MAX_WAITERS,
            retry_budget: RetryBudgetConfig::Unlimited,
            max_cooldown: DEFAULT_MAX_COOLDOWN,
            outage: OutagePolicy::default(),
            #[cfg(any(test, feature = "adaptive"))]
            adaptive: None,
            dialect: Dialect::standard(),
            classifier: StatusClassifier::default(),
            retry: RetryConfig::default(),
            max_date_skew: ReadContext::DEFAULT_MAX_SKEW,
            params: Params(rule::Params {
                limits: [main.params; MAX_LIMITS],
                limit_count: 1,
                budget: BudgetParams::Unlimited,
                max_cooldown_us: 0,
                probe_backoff_min_us: PROBE_BACKOFF_MIN_US,
                probe_backoff_max_us: PROBE_BACKOFF_MAX_US,
                adaptive: None,
                #[cfg(feature = "settle")]
                settle: None,
            }),
            #[cfg(feature = "shares")]
            classes: classes::Classes::default(),
        };
        config.derive();
        Ok(config)
    }

    /// `rate` attempts per second, with bursts of up to `burst`.
    ///
    /// # Errors
    ///
    /// As [`AllowanceConfig::new`].
    pub fn per_second(rate: u32, burst: u32) -> Result<Self, ConfigError> {
        Self::new(rate, Duration::from_secs(1), burst)
    }

    /// `rate` attempts per minute, with bursts of up to `burst`.
    ///
    /// # Errors
    ///
    /// As [`AllowanceConfig::new`].
    pub fn per_minute(rate: u32, burst: u32) -> Result<Self, ConfigError> {
        Self::new(rate, Duration::from_secs(60), burst)
    }

    /// Keeps the main limit exactly as configured, without headroom for delivery jitter (see
    /// [`Limit::exact`] and [Headroom](Limit#headroom)).
    ///
    /// ```
    /// use tokio::time::Instant;
    /// use tower_allowance::{Allowance, AllowanceConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// // The 4th 10 ms after the first three by default, with them when exact.
    /// for (config, fourth_after_ms) in [
    ///     (AllowanceConfig::per_second(20, 4)?, 10),
    ///     (AllowanceConfig::per_second(20, 4)?.exact(), 0),
    /// ] {
    ///     let allowance = Allowance::new(config);
    ///     let start = Instant::now();
    ///     for _ in 0..4 {
    ///         allowance.acquire().await?;
    ///     }
    ///     assert_eq!(start.elapsed().as_millis(), fourth_after_ms);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn exact(mut self) -> Self {
        self.limits[0] = self.limits[0].exact();
        self.derive();
        self
    }

    /// Adds a limit that must admit every attempt too (all or nothing, in one atomic step).
    ///
    /// # Errors
    ///
    /// More than 4 limits in all.
    pub fn with_limit(mut self, limit: Limit) -> Result<Self, ConfigError> {
        if self.limits.len() >= MAX_LIMITS {
            return Err(ConfigError::new("an allowance holds at most 4 limits"));
        }
        self.limits.push(limit);
        self.derive();
        Ok(self)
    }

    /// Bounds the number of callers that may wait for admission at once in this process
    /// (default 1024). Past it, calls that would wait fail at once with
    /// [`Overloaded`](crate::error::Overloaded). Zero means "never wait".
    pub fn with_max_waiters(mut self, max_waiters: usize) -> Self {
        self.max_waiters = max_waiters;
        self
    }

    /// Sets the shared retry budget (default [`RetryBudgetConfig::Unlimited`]).
    pub fn with_retry_budget(mut self, budget: RetryBudgetConfig) -> Self {
        self.retry_budget = budget;
        self.derive();
        self
    }

    /// The longest cooldown a server may impose (default one hour). A longer delay, or one
    /// too long to represent, closes the allowance instead, for exactly `max_cooldown`
    /// (never until cleared): every call fails at once with
    /// [`Exhausted`](crate::error::Exhausted) until it reopens by itself, metered.
    ///
    /// # Why one hour
    ///
    /// Providers ask for seconds to minutes between short-window retries; the longest common
    /// `Retry-After` values (GitHub's secondary limits, hourly quotas) stay within an hour. A
    /// longer delay is almost always a quota (a day, a month) or a bug (a `Date` of 1970,
    /// twenty digits), and parking every worker for it silently is the worst answer. Beyond
    /// the bound the allowance closes visibly instead, which an operator can see in the
    /// snapshot and clear.
    ///
    /// # Errors
    ///
    /// Zero, or beyond [`MAX_DELAY`](crate::MAX_DELAY).
    pub fn with_max_cooldown(mut self, max: Duration) -> Result<Self, ConfigError> {
        if max.is_zero() || max > rule::MAX_DELAY {
            return Err(ConfigError::new(
                "max_cooldown must be longer than zero and at most MAX_DELAY",
            ));
        }
        self.max_cooldown = max;
        self.derive();
        Ok(self)
    }

    /// What an admission does while the store does not answer (default: wait up to
    /// one minute).
    pub fn with_outage_policy(mut self, policy: OutagePolicy) -> Self {
        self.outage = policy;
        self
    }

    /// How far a response's `Date` may be from the local clock and still be trusted to
    /// measure its absolute times (default five minutes); beyond it the local clock is used and
    /// a warning logged.
    pub fn with_max_date_skew(mut self, skew: Duration) -> Self {
        self.max_date_skew = skew;
        self
    }

    /// What every layer built on the allowance calls throttling, transient or a failure
    /// (default [`StatusClassifier::default`]: 429 and 503 throttle): the
    /// [`CooldownLayer`](crate::cooldown::CooldownLayer), the retry policy,
    /// [`AllowanceLayer`](crate::AllowanceLayer) and the reqwest middleware all read a
    /// response the same way, so the shared cooldown reacts the same whichever client got it.
    /// A layer's `with_classifier` overrides it for that layer alone.
    pub fn with_classifier(mut self, classifier: StatusClassifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// The classifier the layers inherit.
    pub fn classifier(&self) -> StatusClassifier {
        self.classifier
    }

    /// The per-request retry rules every retrying layer built on the allowance inherits
    /// (default [`RetryConfig::default`]); a layer's `with_retry` overrides them for that
    /// layer alone.
    ///
    /// ```
    /// use tower_allowance::{classify::StatusClassifier, retry::RetryConfig, AllowanceConfig};
    ///
    /// // Set once: every layer and client on this allowance classifies and retries alike.
    /// let config = AllowanceConfig::per_second(5, 5)?
    ///     .with_classifier(StatusClassifier::default().throttled([403, 429]))
    ///     .with_retry(RetryConfig::default().with_max_attempts(4)?);
    /// assert_eq!(config.retry().max_attempts(), 4);
    /// # Ok::<(), tower_allowance::ConfigError>(())
    /// ```
    pub fn with_retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
    }

    /// The retry rules the layers inherit.
    pub fn retry(&self) -> &RetryConfig {
        &self.retry
    }

    /// What the cooldown reads responses with, in every build.
    /// How the layers read a response on this allowance: its dialect and bounds.
    pub(crate) fn reading(&self) -> ReadWith {
        ReadWith {
            readers: self.dialect,
            max_date_skew: self.max_date_skew,
            max_cooldown: self.max_cooldown,
        }
    }

    /// The largest trusted `Date` skew.
    pub fn max_date_skew(&self) -> Duration {
        self.max_date_skew
    }

    fn derive(&mut self) {
        let params = &mut self.params.0;
        for (l, limit) in self.limits.iter().enumerate() {
            params.limits[l] = limit.rule_params();
        }
        params.limit_count = self.limits.len();
        params.budget = self.retry_budget.params();
        params.max_cooldown_us = rule::micros_ceil(self.max_cooldown).unwrap_or(rule::MAX_DELAY_US);
        #[cfg(any(test, feature = "adaptive"))]
        self.derive_adaptive();
    }

    /// Over a store other processes share (it has a name), a burst of 1 keeps more headroom:
    /// a process paces its sends from its own, never from the others' (see
    /// [Headroom](Limit#headroom)).
    pub(crate) fn shared_by_processes(&mut self) {
        for l in &mut self.params.0.limits[..self.limits.len()] {
            if l.headroom_us > 0 && l.tolerance_us == l.interval_us {
                l.headroom_us = l.interval_us.min(limit::SHARED_BURST_ONE_US);
            }
        }
    }

    /// The derived parameters every store decides with (opaque: a store passes them on).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The rule's view of [`params`](Self::params).
    pub(crate) fn rule_params(&self) -> &rule::Params {
        &self.params.0
    }

    /// Every limit, the main one first.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// Attempts per period (the main limit).
    pub fn rate(&self) -> u32 {
        self.limits[0].rate()
    }

    /// The period `rate` is counted over.
    pub fn period(&self) -> Duration {
        self.limits[0].period()
    }

    /// The main limit's burst as configured (its last request waits 10 ms as headroom: see
    /// [Headroom](Limit#headroom)).
    pub fn burst(&self) -> u32 {
        self.limits[0].burst()
    }

    /// Time between tokens: `period / rate`, rounded up to the microsecond so that the
    /// admitted rate never exceeds the configured one (50% longer at burst 1 with headroom:
    /// see [Headroom](Limit#headroom); [`params`](Self::params) has what the rule uses).
    pub fn interval(&self) -> Duration {
        self.limits[0].interval()
    }

    /// The wait-queue bound.
    pub fn max_waiters(&self) -> usize {
        self.max_waiters
    }

    /// The retry budget.
    pub fn retry_budget(&self) -> &RetryBudgetConfig {
        &self.retry_budget
    }

    /// The longest cooldown a server may impose.
    pub fn max_cooldown(&self) -> Duration {
        self.max_cooldown
    }

    /// The outage policy.
    pub fn outage_policy(&self) -> OutagePolicy {
        self.outage
    }
}

/// First backoff between quota probes that failed or found quota left.
const PROBE_BACKOFF_MIN_US: u64 = 1_000_000;
/// Longest backoff between quota probes.
const PROBE_BACKOFF_MAX_US: u64 = 60_000_000;

/// How many extra attempts (retries) the whole group sharing an allowance may make.
///
/// Every retry, whichever worker makes it, spends from the same budget at the moment it is
/// admitted. First attempts never spend.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "de::RawRetryBudget"))]
pub enum RetryBudgetConfig {
    /// No group bound; only each request's `max_attempts` limits retries.
    #[default]
    Unlimited,
    /// A fixed number of retries for the whole group, never replenished (a batch budget).
    Fixed {
        /// Retries the group may make in total.
        retries: u64,
    },
    /// A budget that refills with traffic, for long-running services.
    Replenishing(ReplenishingBudget),
}

impl RetryBudgetConfig {
    /// A batch budget of `retries` extra attempts in total.
    pub fn fixed(retries: u64) -> Self {
        Self::Fixed { retries }
    }

    pub(crate) fn params(&self) -> BudgetParams {
        match self {
            Self::Unlimited => BudgetParams::Unlimited,
            Self::Fixed { retries } => BudgetParams::Fixed { retries: *retries },
            Self::Replenishing(r) => BudgetParams::Replenishing {
                slot_us: r.slot_us,
                reserve: r.reserve,
                per_mille: r.per_mille,
            },
        }
    }
}

/// A replenishing retry budget, in the manner of Finagle's and tower's `TpsBudget`.
///
/// Over a sliding `window`, the group may retry `min_per_sec * window` times plus
/// `ratio` retries for each successful request. Deposits and withdrawals older than the
/// window expire. Unlike a lock-free approximation, spending is exact: concurrent spenders
/// can never overdraw it.
///
/// ```
/// use std::time::Duration;
/// use tower_allowance::{ReplenishingBudget, RetryBudgetConfig};
///
/// // 10 s window, at least 1 retry/s, plus one retry per five successes.
/// let budget = ReplenishingBudget::new(Duration::from_secs(10), 1, 0.2)?;
/// let _config = RetryBudgetConfig::Replenishing(budget);
///
/// assert!(ReplenishingBudget::new(Duration::from_secs(10), 1, f64::NAN).is_err());
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplenishingBudget {
    window: Duration,
    min_per_sec: u32,
    per_mille: u64,
    slot_us: u64,
    reserve: u64,
}

impl ReplenishingBudget {
    /// A budget over `window` with a floor of `min_per_sec` retries per second and `ratio`
    /// retries earned per successful request (0.0 to 1000.0).
    ///
    /// # Errors
    ///
    /// A window shorter than 10 ms or longer than a day, or a ratio that is not a finite
    /// number in `0.0..=1000.0` (resolved to 1/1000).
    pub fn new(window: Duration, min_per_sec: u32, ratio: f64) -> Result<Self, ConfigError> {
        if window < Duration::from_millis(10) || window > Duration::from_secs(86_400) {
            return Err(ConfigError::new(
                "budget window must be between 10 ms and one day",
            ));
        }
        if !ratio.is_finite() || !(0.0..=1000.0).contains(&ratio) {
            return Err(ConfigError::new(
                "retry ratio must be a finite number from 0 to 1000",
            ));
        }
        let window_us =
            u64::try_from(window.as_micros()).map_err(|_| ConfigError::new("window too long"))?;
        let slot_us = window_us / BUDGET_SLOTS;
        // The floor over the whole window, in whole retries.
        let reserve = u64::from(min_per_sec).saturating_mul(window_us) / 1_000_000;
        // ratio is validated to 0..=1000, so the product fits comfortably.
        let per_mille = (ratio * 1000.0).round() as u64;
        Ok(Self {
            window,
            min_per_sec,
            per_mille,
            slot_us,
            reserve,
        })
    }

    /// The sliding window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The floor, in retries per second.
    pub fn min_per_sec(&self) -> u32 {
        self.min_per_sec
    }

    /// Retries earned per successful request.
    pub fn ratio(&self) -> f64 {
        self.per_mille as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::{adaptive::AdaptiveRate, *};

    #[test]
    fn invalid_configs_are_typed_errors() {
        let cases: [(u32, Duration, u32); 6] = [
            (0, Duration::from_secs(1), 1),
            (1, Duration::from_secs(1), 0),
            (1, Duration::ZERO, 1),
            (2_000_000, Duration::from_secs(1), 1),
            (1, Duration::MAX, 1),
            (1, Duration::from_secs(86_400 * 365), u32::MAX),
        ];
        for (rate, period, burst) in cases {
            let err = AllowanceConfig::new(rate, period, burst).expect_err("must be rejected");
            assert!(!err.reason().is_empty());
        }
        assert!(AllowanceConfig::new(1_000_000, Duration::from_secs(1), 1).is_ok());
    }

    #[test]
    fn headroom_is_a_time_the_schedule_moves_by() {
        let limits = |c: &AllowanceConfig| {
            let l = c.rule_params().limits()[0];
            (l.interval_us(), l.tolerance_us(), l.headroom_us())
        };
        // Burst 4 at 20/s: the whole burst and interval, 10 ms once per burst; exact: none.
        let c = AllowanceConfig::per_second(20, 4).expect("valid");
        assert_eq!((c.burst(), c.interval()), (4, Duration::from_millis(50)));
        assert_eq!(limits(&c), (50_000, 200_000, 10_000));
        assert_eq!(limits(&c.clone().exact()), (50_000, 200_000, 0));
        // Half the burst where that is shorter: 999/s at burst 2 keeps its tolerance whole.
        let c = AllowanceConfig::per_second(999, 2).expect("valid");
        assert_eq!(limits(&c), (1_002, 2_004, 1_002));
        let c = AllowanceConfig::per_second(1_000, 10).expect("valid");
        assert_eq!(limits(&c), (1_000, 10_000, 5_000));
        let c = AllowanceConfig::per_second(1_000, 100).expect("valid");
        assert_eq!(limits(&c), (1_000, 100_000, 10_000));
        // Burst 1: a 50th of the interval between two sends, at most 10 ms.
        let c = AllowanceConfig::per_second(20, 1).expect("valid");
        assert_eq!(limits(&c), (50_000, 50_000, 1_000));
        let c = AllowanceConfig::new(1, Duration::from_secs(60), 1).expect("valid");
        assert_eq!(limits(&c), (60_000_000, 60_000_000, 10_000));
        // A cost limit and an exact one have none; an extra request limit has its own.
        let c = AllowanceConfig::per_second(20, 4)
            .and_then(|c| c.with_limit(Limit::per_minute(100, 100)?.counting_cost()))
            .and_then(|c| c.with_limit(Limit::per_minute(10, 5)?))
            .and_then(|c| c.with_limit(Limit::per_minute(10, 5)?.exact()))
            .expect("valid");
        let headroom: Vec<u64> = (c.rule_params().limits().iter())
            .map(|l| l.headroom_us())
            .collect();
        assert_eq!(headroom, [10_000, 0, 10_000, 0]);
        // An adaptive rate keeps the whole burst and no headroom (it finds its level from the 429s).
        let c = AllowanceConfig::per_second(20, 4)
            .expect("valid")
            .with_adaptive_rate(AdaptiveRate::new(2.0, 1.0, 100.0).expect("valid"));
        assert_eq!(c.rule_params().adaptive().map(|a| a.burst()), Some(4));
        assert_eq!(c.rule_params().limits()[0].headroom_us(), 0);
    }

    #[test]
    fn bad_ratios_and_windows() {
        let w = Duration::from_secs(10);
        for ratio in [f64::NAN, f64::INFINITY, -0.1, 1000.5] {
            assert!(ReplenishingBudget::new(w, 1, ratio).is_err(), "{ratio}");
        }
        assert!(ReplenishingBudget::new(Duration::ZERO, 1, 0.1).is_err());
        assert!(ReplenishingBudget::new(Duration::from_secs(86_401), 1, 0.1).is_err());
        let b = ReplenishingBudget::new(w, 2, 0.25).expect("valid");
        assert_eq!(b.reserve, 20);
        assert_eq!(b.ratio(), 0.25);
    }
}
