//! One limit of an allowance: a token bucket's rate, period and burst, validated, and the
//! headroom it keeps for delivery jitter.

use std::{num::NonZeroU32, time::Duration};

use crate::{
    error::ConfigError,
    rule::{self, LimitParams, Unit},
};

/// The headroom of a limit with a burst above 1, in time: its schedule moves this much later
/// once per burst (half the burst's time where that is shorter); see [Headroom](Limit#headroom).
/// Delivery jitter is a time (a descheduled client, timers firing together, a new
/// connection), not a share of the interval: measured against a strict bucket on a loaded
/// 2-core machine, 10 ms is the least that passed every round (see `BENCHMARKS.md`, §12).
const BURST_HEADROOM_US: u64 = 10_000;

/// A burst of 1 keeps this share of its interval (`1/BURST_ONE_SHARE`, at most
/// [`BURST_HEADROOM_US`]) between two sends (see [Headroom](Limit#headroom)).
const BURST_ONE_SHARE: u64 = 50;

/// A burst of 1 over a store other processes share keeps this much between two sends, at
/// most an interval (see [Headroom](Limit#headroom)).
pub(crate) const SHARED_BURST_ONE_US: u64 = 10_000;

/// One more limit of an allowance, beside its main rate (see [`AllowanceConfig::with_limit`](crate::AllowanceConfig::with_limit)).
///
/// # Headroom
///
/// A limit counting requests is kept a little behind the schedule configured, by default, so
/// that an allowance set exactly at a provider's documented limit draws no 429 from a strict
/// token bucket: requests sent exactly one interval apart reach the server closer together
/// or further apart (delivery jitter), and a bucket with no tolerance refuses the ones that
/// arrive early. Jitter is a time, not a share of the interval (a client descheduled, timers
/// firing together, a new connection's handshake), so the headroom is a time too: with a
/// burst above 1, an admission that finds the bucket full moves the schedule 10 ms later
/// (half the burst's time, burst × interval / 2, where that is shorter: at least one
/// interval), which absorbs an arrival up to that much early. The price, precisely: whenever
/// the burst is whole (at the start, after a quiet spell), the schedule is that much later
/// than without headroom (burst 4 at 20/s: 3 at once, the 4th 10 ms later, then one every
/// 50 ms; burst 100 at 1,000/s: 90 at once, then one every millisecond; a run of 200 requests
/// ends 10 ms later); no request of the burst is lost and the steady
/// rate is the configured one, at every rate (the tolerance stays whole, so reserved slots
/// rounded up to the millisecond cost nothing). With a burst of 1 every admission finds the
/// bucket full: two sends are a 50th of the interval further apart (at most 10 ms: 20/s sends
/// every 51 ms, 98% of the rate), and this process paces each reserved slot from when the one
/// before actually left (a late send moves a strict server's schedule as much), or, through
/// the layers, from when its answer came back within 10 ms (a request delayed on its way, or
/// a server descheduled, answers late). Over a store other processes share (Redis), a process
/// cannot pace from the others' sends: a burst of 1 keeps 10 ms between two sends there (at
/// most an interval; 20/s: 83% of the rate). Limits counting a cost keep their whole burst
/// (a request may cost the burst), and so does an adaptive rate (it finds its level from the
/// server's 429s). [`Limit::exact`] (or
/// [`AllowanceConfig::exact`](crate::AllowanceConfig::exact) for the main limit) turns the
/// headroom and the pacing off.
///
/// ```
/// use tower_allowance::Limit;
///
/// // 10,000 requests a day, all of them at once if need be (the last 10 ms later: headroom).
/// let daily = Limit::per_day(10_000, 10_000)?;
/// // 90,000 tokens a minute, charged by each request's cost.
/// let tokens = Limit::per_minute(90_000, 90_000)?.counting_cost();
/// # let _ = (daily, tokens);
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    rate: NonZeroU32,
    period: Duration,
    burst: NonZeroU32,
    pub(super) params: LimitParams,
    exact: bool,
}

impl Limit {
    /// `rate` units per `period`, at most `burst` back to back, counting requests.
    ///
    /// # Errors
    ///
    /// A zero `rate`, `burst` or `period`, an interval below one microsecond, or a
    /// `burst * interval` beyond [`MAX_DELAY`](crate::MAX_DELAY).
    pub fn new(rate: u32, period: Duration, burst: u32) -> Result<Self, ConfigError> {
        let rate = NonZeroU32::new(rate).ok_or(ConfigError::new("rate must be at least 1"))?;
        let burst = NonZeroU32::new(burst).ok_or(ConfigError::new("burst must be at least 1"))?;
        if period.is_zero() {
            return Err(ConfigError::new("period must be longer than zero"));
        }
        if period > rule::MAX_DELAY {
            return Err(ConfigError::new("period must not exceed MAX_DELAY"));
        }
        let period_us = u64::try_from(period.as_micros())
            .map_err(|_| ConfigError::new("period must not exceed MAX_DELAY"))?;
        let interval_us = period_us.div_ceil(u64::from(rate.get()));
        if u128::from(rate.get()) > period.as_micros() || interval_us == 0 {
            return Err(ConfigError::new(
                "rate too high: the interval between tokens must be at least one microsecond",
            ));
        }
        let tolerance_us = interval_us
            .checked_mul(u64::from(burst.get()))
            .filter(|t| *t <= rule::MAX_DELAY_US)
            .ok_or(ConfigError::new(
                "burst times the token interval must not exceed MAX_DELAY",
            ))?;
        Ok(Self {
            rate,
            period,
            burst,
            params: LimitParams {
                interval_us,
                tolerance_us,
                unit: Unit::Requests,
                headroom_us: 0,
            },
            exact: false,
        })
    }

    /// Keeps the limit exactly as configured: the whole burst at once, the exact interval,
    /// no headroom for delivery jitter (see [Headroom](Limit#headroom)). Right for a server
    /// that tolerates some jitter itself, or for a limit set below the server's already.
    ///
    /// ```
    /// use tokio::time::Instant;
    /// use tower_allowance::{Allowance, AllowanceConfig, Limit};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// for (limit, fourth_after_ms) in [
    ///     // 3 at once, the 4th 10 ms later (the headroom of a burst above 1).
    ///     (Limit::per_minute(20, 4)?, 10),
    ///     // 4 at once.
    ///     (Limit::per_minute(20, 4)?.exact(), 0),
    /// ] {
    ///     let allowance = Allowance::new(AllowanceConfig::per_second(10, 10)?.with_limit(limit)?);
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
        self.exact = true;
        self
    }

    /// What the rule decides with: the configured parameters and the headroom (a burst above
    /// 1: 10 ms once per burst, or half the burst's time where that is shorter; at burst 1: a
    /// 50th of the interval between two sends, at most 10 ms).
    pub(super) fn rule_params(&self) -> LimitParams {
        let mut p = self.params;
        if !self.exact && p.unit == Unit::Requests {
            p.headroom_us = match self.burst.get() {
                1 => (p.interval_us / BURST_ONE_SHARE).min(BURST_HEADROOM_US),
                // Half the burst at most: a short interval's jitter is still a time (timers
                // fire on whole milliseconds), and one interval of margin at 1,000/s is less
                // than it (BENCHMARKS.md, §15).
                _ => BURST_HEADROOM_US.min(p.tolerance_us / 2),
            };
        }
        p
    }

    /// `rate` per second.
    ///
    /// # Errors
    ///
    /// As [`Limit::new`].
    pub fn per_second(rate: u32, burst: u32) -> Result<Self, ConfigError> {
        Self::new(rate, Duration::from_secs(1), burst)
    }

    /// `rate` per minute.
    ///
    /// # Errors
    ///
    /// As [`Limit::new`].
    pub fn per_minute(rate: u32, burst: u32) -> Result<Self, ConfigError> {
        Self::new(rate, Duration::from_secs(60), burst)
    }

    /// `rate` per day.
    ///
    /// # Errors
    ///
    /// As [`Limit::new`].
    pub fn per_day(rate: u32, burst: u32) -> Result<Self, ConfigError> {
        Self::new(rate, Duration::from_secs(86_400), burst)
    }

    /// Charges each request its cost (see [`Cost`](crate::Cost)) instead of one.
    pub fn counting_cost(mut self) -> Self {
        self.params.unit = Unit::Cost;
        self
    }

    /// Units per period.
    pub fn rate(&self) -> u32 {
        self.rate.get()
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Units that may go back to back.
    pub fn burst(&self) -> u32 {
        self.burst.get()
    }

    /// Whether the limit counts each request's [`Cost`](crate::Cost) (set by
    /// [`Limit::counting_cost`]) rather than one per request.
    pub fn counts_cost(&self) -> bool {
        self.params.unit == Unit::Cost
    }

    /// Time per unit: `period / rate`, rounded up to the microsecond.
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.params.interval_us)
    }
}
