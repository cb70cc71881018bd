//! The adaptive rate: its type, constructors, setter and getter (feature `adaptive`; all but
//! the getter in tests too), out of the default build.

use super::{rule, AllowanceConfig, ConfigError};

/// An adaptive rate for the main limit: found and followed when nobody states the limit, or
/// when it changes (see [`AllowanceConfig::with_adaptive_rate`]).
///
/// The rate starts at `initial` and doubles every second until the first throttling response
/// (a slow start), then is cut to 85% (70% when throttling persists within 2.5 s) and grows by
/// 1% of its value per second (additive increase, multiplicative decrease), always within
/// `floor..=ceiling` and never above a rate the server advertised (see
/// `signals` (feature `dialects`)). The state lives in the store: every process sharing the
/// allowance follows one rate.
///
#[cfg_attr(feature = "adaptive", doc = "```")]
#[cfg_attr(not(feature = "adaptive"), doc = "```ignore")]
/// use tower_allowance::{AdaptiveRate, AllowanceConfig};
///
/// let config = AllowanceConfig::per_second(20, 4)?
///     .with_adaptive_rate(AdaptiveRate::new(2.0, 0.5, 200.0)?.adopt_advertised(true));
/// # let _ = config;
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(not(feature = "adaptive"), allow(unreachable_pub, dead_code))]
pub struct AdaptiveRate {
    initial: f64,
    floor: f64,
    ceiling: f64,
    adopt: bool,
}

impl AdaptiveRate {
    fn milli(r: f64) -> u64 {
        // Validated to 0.001..=10,000: the product fits.
        ((r * 1000.0).round() as u64).max(1)
    }
}

// Eq for the config: the rates are validated finite.
impl Eq for AdaptiveRate {}

impl AdaptiveRate {
    /// Starts at `initial` requests per second, never below `floor` or above `ceiling`.
    ///
    /// # Errors
    ///
    /// Rates that are not finite, below 0.001 per second, above 10,000 per second (the
    /// stores' integer arithmetic stays exact below that), or not ordered
    /// `floor <= initial <= ceiling`.
    pub fn new(initial: f64, floor: f64, ceiling: f64) -> Result<Self, ConfigError> {
        let ok = |r: f64| r.is_finite() && (0.001..=10_000.0).contains(&r);
        if !(ok(initial) && ok(floor) && ok(ceiling)) {
            return Err(ConfigError::new(
                "adaptive rates must be finite, from 0.001 to 10,000 per second",
            ));
        }
        if floor > initial || initial > ceiling {
            return Err(ConfigError::new(
                "adaptive rates must be ordered: floor <= initial <= ceiling",
            ));
        }
        Ok(Self {
            initial,
            floor,
            ceiling,
            adopt: false,
        })
    }

    /// Also adopt a rate the server advertises as the current rate, not only cap at it.
    ///
    /// What each dialect advertises, as its provider documents it: IETF `RateLimit-Policy`
    /// (`q` per `w` seconds); OpenAI's `x-ratelimit-limit-requests` and Anthropic's
    /// `anthropic-ratelimit-requests-limit` per minute; GitHub's `x-ratelimit-limit` per hour
    /// (per minute for the `search` and `code_search` resources). A limit without a
    /// documented window (the legacy `RateLimit-Limit`, a generic `X-RateLimit-Limit`) is
    /// no rate and is neither adopted nor capped at.
    pub fn adopt_advertised(mut self, adopt: bool) -> Self {
        self.adopt = adopt;
        self
    }
}

impl AllowanceConfig {
    /// Lets the main limit's rate adapt (see [`AdaptiveRate`]); its configured rate is then
    /// only the starting point's fallback, and its burst is kept.
    #[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
    pub fn with_adaptive_rate(mut self, adaptive: AdaptiveRate) -> Self {
        self.adaptive = Some(adaptive);
        self.derive();
        self
    }

    /// The rule's parameters for the adaptive rate, if any.
    pub(super) fn derive_adaptive(&mut self) {
        if self.adaptive.is_some() {
            // Whole: no headroom either (below).
            self.params.0.limits[0].headroom_us = 0;
        }
        self.params.0.adaptive = self.adaptive.map(|a| rule::AdaptiveParams {
            initial_milli: AdaptiveRate::milli(a.initial),
            floor_milli: AdaptiveRate::milli(a.floor),
            ceiling_milli: AdaptiveRate::milli(a.ceiling),
            // Whole: an adaptive rate finds its level from the server's 429s.
            burst: u64::from(self.limits[0].burst()),
            adopt: a.adopt,
        });
    }

    /// The adaptive rate, if any.
    #[cfg(feature = "adaptive")]
    #[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
    pub fn adaptive_rate(&self) -> Option<AdaptiveRate> {
        self.adaptive
    }
}
