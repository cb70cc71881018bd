use std::{num::NonZeroU32, time::Duration};

use http::Method;

use crate::{body::DEFAULT_REPLAY_CAP, rule::MAX_DELAY, ConfigError};

const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// Per-request retry rules for [`RetryPolicy`](crate::retry::RetryPolicy).
///
/// `Clone + Debug`, and `Deserialize` with the `serde` feature (see [the file
/// form](#configuration-files) below).
///
/// ```
/// use std::time::Duration;
/// use tower_allowance::retry::RetryConfig;
///
/// let config = RetryConfig::default()
///     .with_max_attempts(5)?
///     .with_backoff(Duration::from_millis(50), Duration::from_secs(5))?
///     .with_jitter_seed(7);
/// assert_eq!(config.max_attempts(), 5);
/// assert!(RetryConfig::default().with_max_attempts(0).is_err());
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
///
/// # Configuration files
///
/// Every field is optional and defaults as [`RetryConfig::default`] does; durations are
/// written as `"100ms"`, `"5s"`; unknown fields are refused, and a value that breaks a rule
/// is refused with an error naming its field:
///
/// ```toml
/// max_attempts = 4                 # counting the first
/// backoff_base = "100ms"           # full jitter over [0, min(backoff_max, base * 2^(n-1))]
/// backoff_max = "5s"
/// retry_transport_errors = false
/// replayable_methods = ["GET", "HEAD", "PUT"]
/// idempotency_key = true           # a request with `Idempotency-Key` is replayable too
/// replay_cap_bytes = 65536
/// jitter_seed = 7                  # for reproducible runs only
/// ```
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use std::time::Duration;
/// use tower_allowance::retry::RetryConfig;
///
/// let config: RetryConfig = serde_json::from_str(
///     r#"{ "max_attempts": 4, "backoff_base": "100ms", "backoff_max": "5s" }"#,
/// )?;
/// let built = RetryConfig::default()
///     .with_max_attempts(4)?
///     .with_backoff(Duration::from_millis(100), Duration::from_secs(5))?;
/// assert_eq!(config, built);
///
/// let err = serde_json::from_str::<RetryConfig>(r#"{ "backoff_base": "0s" }"#).unwrap_err();
/// assert!(err.to_string().contains("`backoff_base`"), "{err}");
/// # }
/// # Ok::<(), tower_allowance::BoxError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "de::RawRetryConfig"))]
pub struct RetryConfig {
    pub(crate) max_attempts: NonZeroU32,
    pub(crate) retry_transport_errors: bool,
    pub(crate) replayable_methods: Vec<Method>,
    pub(crate) idempotency_key: bool,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) jitter_seed: Option<u64>,
    pub(crate) replay_cap: usize,
}

impl Default for RetryConfig {
    /// Three attempts, 429/503 only, idempotent methods or `Idempotency-Key`, backoff from
    /// 100 ms up to 10 s with full jitter, request bodies replayed up to 64 KiB.
    fn default() -> Self {
        Self {
            max_attempts: NonZeroU32::new(3).unwrap_or(NonZeroU32::MIN),
            retry_transport_errors: false,
            replayable_methods: vec![
                Method::GET,
                Method::HEAD,
                Method::OPTIONS,
                Method::PUT,
                Method::DELETE,
            ],
            idempotency_key: true,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            jitter_seed: None,
            replay_cap: DEFAULT_REPLAY_CAP,
        }
    }
}

impl RetryConfig {
    /// Attempts per request, counting the first (default 3).
    ///
    /// # Errors
    ///
    /// Zero.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Result<Self, ConfigError> {
        self.max_attempts = NonZeroU32::new(max_attempts)
            .ok_or(ConfigError::new("max_attempts must be at least 1"))?;
        Ok(self)
    }

    /// Also retry errors from the inner service (connection failures), not only responses.
    /// The layers' own errors (abandoned, overloaded, store unavailable) are never retried.
    pub fn with_transport_errors(mut self, retry: bool) -> Self {
        self.retry_transport_errors = retry;
        self
    }

    /// Methods that may be replayed (default GET, HEAD, OPTIONS, PUT, DELETE).
    pub fn with_replayable_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.replayable_methods = methods.into_iter().collect();
        self
    }

    /// Whether a request carrying `Idempotency-Key` may be replayed whatever its method
    /// (default true).
    pub fn with_idempotency_key(mut self, honour: bool) -> Self {
        self.idempotency_key = honour;
        self
    }

    /// Backoff when the server gives no `Retry-After`: attempt `n` waits a uniformly random
    /// time in `[0, min(max, base * 2^(n-1))]` (full jitter).
    ///
    /// # Errors
    ///
    /// A zero `base`, `max < base`, or `max` beyond [`MAX_DELAY`](crate::MAX_DELAY).
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Result<Self, ConfigError> {
        if base.is_zero() {
            return Err(ConfigError::new("backoff base must be longer than zero"));
        }
        if max < base {
            return Err(ConfigError::new("backoff max must be at least the base"));
        }
        if max > MAX_DELAY {
            return Err(ConfigError::new("backoff max must not exceed MAX_DELAY"));
        }
        self.backoff_base = base;
        self.backoff_max = max;
        Ok(self)
    }

    /// Seeds the jitter, for reproducible runs. Each request still draws its own stream.
    pub fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    /// The most bytes of a streamed request body kept for a retry (default 64 KiB).
    ///
    /// The first attempt streams the body while a copy of it is kept; a body that turns out
    /// longer than this is sent once and not retried: its response is the answer, marked
    /// abandoned ([`AbandonReason::NotReplayable`](crate::error::AbandonReason::NotReplayable))
    /// when it asked for a retry. Bodies that are cheap to copy (`Full<Bytes>`,
    /// `Empty<Bytes>`) are cloned instead and ignore the cap; see
    /// [`Replayable`](crate::body::Replayable).
    pub fn with_replay_cap(mut self, bytes: usize) -> Self {
        self.replay_cap = bytes;
        self
    }

    /// Attempts per request, counting the first.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts.get()
    }

    /// The most bytes of a streamed request body kept for a retry.
    pub fn replay_cap(&self) -> usize {
        self.replay_cap
    }

    /// Whether `req` may be replayed: its method, or an `Idempotency-Key` header.
    pub fn replayable<B>(&self, req: &http::Request<B>) -> bool {
        self.replayable_head(req.method(), req.headers())
    }

    pub(crate) fn replayable_parts(&self, parts: &http::request::Parts) -> bool {
        self.replayable_head(&parts.method, &parts.headers)
    }

    fn replayable_head(&self, method: &Method, headers: &http::HeaderMap) -> bool {
        self.replayable_methods.contains(method)
            || (self.idempotency_key && headers.contains_key(&IDEMPOTENCY_KEY))
    }

    /// The backoff bound when the server gives no `Retry-After`, before jitter.
    pub(crate) fn backoff_cap(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.saturating_sub(1));
        let backoff = self.backoff_base.saturating_mul(factor.unwrap_or(u32::MAX));
        backoff.min(self.backoff_max)
    }
}

#[cfg(feature = "serde")]
mod de;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_cap_doubles_and_saturates() {
        let c = RetryConfig::default()
            .with_backoff(Duration::from_millis(100), Duration::from_secs(1))
            .expect("valid");
        let caps: Vec<_> = (1..=6).map(|n| c.backoff_cap(n).as_millis()).collect();
        assert_eq!(caps, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(c.backoff_cap(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn invalid_backoffs() {
        let d = RetryConfig::default();
        assert!(d
            .clone()
            .with_backoff(Duration::ZERO, Duration::from_secs(1))
            .is_err());
        assert!(d
            .clone()
            .with_backoff(Duration::from_secs(2), Duration::from_secs(1))
            .is_err());
        assert!(d
            .with_backoff(Duration::from_secs(1), Duration::MAX)
            .is_err());
    }
}
