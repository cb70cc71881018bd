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

use std::{fmt, num::NonZeroU32, time::Duration};

use crate::algorithm::{self, BudgetParams, Params, SLOTS};

/// A configuration value was out of range.
///
/// The reason is a static description of the rule that was broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigError {
    reason: &'static str,
}

impl ConfigError {
    pub(crate) const fn new(reason: &'static str) -> Self {
        Self { reason }
    }

    /// The rule that was broken.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid allowance configuration: {}", self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Default bound on the number of callers waiting for admission in one process.
pub const DEFAULT_MAX_WAITERS: usize = 1024;

/// What one allowance may spend: a token bucket, a wait-queue bound and a retry budget.
///
/// `Clone + Debug`, and `Deserialize` with the `serde` feature, so one config can be
/// reused across services. Building an [`Allowance`](crate::Allowance) from it is what
/// creates shared state; the config itself is plain data.
///
/// ```
/// use std::time::Duration;
/// use tower_allowance::AllowanceConfig;
///
/// // 100 requests per minute, at most 10 at once.
/// let config = AllowanceConfig::new(100, Duration::from_secs(60), 10)?;
/// assert_eq!(config.interval(), Duration::from_millis(600));
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "serde_impl::RawAllowanceConfig"))]
pub struct AllowanceConfig {
    rate: NonZeroU32,
    period: Duration,
    burst: NonZeroU32,
    max_waiters: usize,
    retry_budget: RetryBudgetConfig,
    pub(crate) params: Params,
}

impl AllowanceConfig {
    /// `rate` attempts per `period`, with bursts of up to `burst`.
    ///
    /// # Errors
    ///
    /// A zero `rate`, `burst` or `period`, or a rate so high that the interval between
    /// tokens is below one microsecond, or a `burst * interval` beyond [`MAX_DELAY`](crate::MAX_DELAY).
    pub fn new(rate: u32, period: Duration, burst: u32) -> Result<Self, ConfigError> {
        let rate = NonZeroU32::new(rate).ok_or(ConfigError::new("rate must be at least 1"))?;
        let burst = NonZeroU32::new(burst).ok_or(ConfigError::new("burst must be at least 1"))?;
        if period.is_zero() {
            return Err(ConfigError::new("period must be longer than zero"));
        }
        if period > algorithm::MAX_DELAY {
            return Err(ConfigError::new("period must not exceed MAX_DELAY"));
        }
        if u128::from(rate.get()) > period.as_micros() {
            return Err(ConfigError::new(
                "rate too high: the interval between tokens must be at least one microsecond",
            ));
        }
        let params = Params::new(period, rate.get(), burst.get(), BudgetParams::Unlimited).ok_or(
            ConfigError::new("burst times the token interval must not exceed MAX_DELAY"),
        )?;
        Ok(Self {
            rate,
            period,
            burst,
            max_waiters: DEFAULT_MAX_WAITERS,
            retry_budget: RetryBudgetConfig::Unlimited,
            params,
        })
    }

    /// `rate` attempts per second, with bursts of up to `burst`.
    ///
    /// # Errors
    ///
    /// As [`AllowanceConfig::new`].
    pub fn per_second(rate: u32, burst: u32) -> Result<Self, ConfigError> {
        Self::new(rate, Duration::from_secs(1), burst)
    }

    /// Bounds the number of callers that may wait for admission at once in this process
    /// (default [`DEFAULT_MAX_WAITERS`]). Past it, calls fail at once with
    /// [`Overloaded`](crate::error::Overloaded). Zero means "never wait".
    pub fn with_max_waiters(mut self, max_waiters: usize) -> Self {
        self.max_waiters = max_waiters;
        self
    }

    /// Sets the shared retry budget (default [`RetryBudgetConfig::Unlimited`]).
    pub fn with_retry_budget(mut self, budget: RetryBudgetConfig) -> Self {
        self.params.budget = budget.params();
        self.retry_budget = budget;
        self
    }

    /// Attempts per period.
    pub fn rate(&self) -> u32 {
        self.rate.get()
    }

    /// The period `rate` is counted over.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Attempts that may be admitted back to back.
    pub fn burst(&self) -> u32 {
        self.burst.get()
    }

    /// Time between tokens: `period / rate`, rounded up to the microsecond so that the
    /// admitted rate never exceeds the configured one.
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.params.interval_us)
    }

    /// The wait-queue bound.
    pub fn max_waiters(&self) -> usize {
        self.max_waiters
    }

    /// The retry budget.
    pub fn retry_budget(&self) -> &RetryBudgetConfig {
        &self.retry_budget
    }
}

/// How many extra attempts (retries) the whole group sharing an allowance may make.
///
/// Every retry, whichever worker makes it, spends from the same budget at the moment it is
/// admitted. First attempts never spend.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "serde_impl::RawRetryBudget"))]
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
        let slot_us = window_us / SLOTS as u64;
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

#[cfg(feature = "serde")]
mod serde_impl {
    use super::*;

    fn default_period_ms() -> u64 {
        1_000
    }

    fn default_max_waiters() -> usize {
        DEFAULT_MAX_WAITERS
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct RawAllowanceConfig {
        rate: u32,
        #[serde(default = "default_period_ms")]
        period_ms: u64,
        burst: u32,
        #[serde(default = "default_max_waiters")]
        max_waiters: usize,
        #[serde(default)]
        retry_budget: RetryBudgetConfig,
    }

    impl TryFrom<RawAllowanceConfig> for AllowanceConfig {
        type Error = ConfigError;

        fn try_from(raw: RawAllowanceConfig) -> Result<Self, ConfigError> {
            Ok(
                AllowanceConfig::new(raw.rate, Duration::from_millis(raw.period_ms), raw.burst)?
                    .with_max_waiters(raw.max_waiters)
                    .with_retry_budget(raw.retry_budget),
            )
        }
    }

    #[derive(serde::Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
    pub(super) enum RawRetryBudget {
        Unlimited,
        Fixed {
            retries: u64,
        },
        Replenishing {
            window_ms: u64,
            min_per_sec: u32,
            ratio: f64,
        },
    }

    impl TryFrom<RawRetryBudget> for RetryBudgetConfig {
        type Error = ConfigError;

        fn try_from(raw: RawRetryBudget) -> Result<Self, ConfigError> {
            Ok(match raw {
                RawRetryBudget::Unlimited => RetryBudgetConfig::Unlimited,
                RawRetryBudget::Fixed { retries } => RetryBudgetConfig::Fixed { retries },
                RawRetryBudget::Replenishing {
                    window_ms,
                    min_per_sec,
                    ratio,
                } => RetryBudgetConfig::Replenishing(ReplenishingBudget::new(
                    Duration::from_millis(window_ms),
                    min_per_sec,
                    ratio,
                )?),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
