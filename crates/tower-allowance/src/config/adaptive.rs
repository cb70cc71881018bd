//! The adaptive rate's constructors, setter and getter (feature `adaptive`; all but the
//! getter in tests too).

use super::{AdaptiveRate, AllowanceConfig, ConfigError};

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

    /// The adaptive rate, if any.
    #[cfg(feature = "adaptive")]
    #[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
    pub fn adaptive_rate(&self) -> Option<AdaptiveRate> {
        self.adaptive
    }
}
