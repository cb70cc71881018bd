//! The lease settings: automatic or a fixed size, the period, the call timeout, the outage.

use std::{fmt, str::FromStr, time::Duration};

use crate::ConfigError;

/// The most tokens one lease holds.
pub const MAX_LEASE: u32 = 10_000;

/// How a [`LeaseStore`](super::LeaseStore) sizes its leases.
///
/// ```
/// use std::time::Duration;
/// use tower_allowance::lease::Lease;
///
/// let auto = Lease::auto();
/// assert_eq!(auto.size(), None);
/// assert_eq!(auto.period(), Duration::from_millis(500));
/// let fixed: Lease = "20:200ms".parse()?;
/// assert_eq!(fixed, Lease::fixed(20, Duration::from_millis(200))?);
/// assert_eq!("auto".parse::<Lease>()?, Lease::auto());
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    size: Option<u32>,
    period: Duration,
    call_timeout: Duration,
    local_fallback: bool,
}

impl Lease {
    /// Sized by the measured rate: the admissions of the last 500 ms (at least one).
    pub const fn auto() -> Self {
        Self {
            size: None,
            period: Duration::from_millis(500),
            call_timeout: Duration::from_millis(250),
            local_fallback: false,
        }
    }

    /// `size` tokens per lease; `period` is how long the rate is measured over (and the
    /// holders' heartbeat, which is at least one call per period while admitting).
    ///
    /// # Errors
    ///
    /// A size of 0 or above [`MAX_LEASE`], or a zero period.
    pub fn fixed(size: u32, period: Duration) -> Result<Self, ConfigError> {
        super::check(size, period)?;
        Ok(Self {
            size: Some(size),
            period,
            ..Self::auto()
        })
    }

    /// Measures the rate over `period` (automatic size).
    ///
    /// # Errors
    ///
    /// A zero period.
    pub fn with_period(mut self, period: Duration) -> Result<Self, ConfigError> {
        super::check(1, period)?;
        self.period = period;
        Ok(self)
    }

    /// A lease call delayed past `timeout` (on the store's clock) is refused by the store
    /// unapplied. Default: 250 ms (the Redis store's call timeout).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// While the store does not answer, admit from the lease, then at this process's share
    /// of the rate (the rate divided by the holders the store last counted).
    pub fn local_fallback(mut self, on: bool) -> Self {
        self.local_fallback = on;
        self
    }

    /// The fixed size; `None`: automatic.
    pub fn size(&self) -> Option<u32> {
        self.size
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The call timeout.
    pub fn get_call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// Whether the local fallback is on.
    pub fn get_local_fallback(&self) -> bool {
        self.local_fallback
    }
}

impl Default for Lease {
    fn default() -> Self {
        Self::auto()
    }
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.size {
            None => f.write_str("auto"),
            Some(n) => write!(f, "{n}:{}ms", self.period.as_millis()),
        }
    }
}

impl FromStr for Lease {
    type Err = ConfigError;

    /// `auto`, or `N:DURATION` (`20:200ms`, `50:1s`): the CLI's and a file's form.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(Self::auto());
        }
        let bad = || ConfigError::new("a lease is `auto` or N:DURATION, e.g. 20:200ms");
        let (n, d) = s.split_once(':').ok_or_else(bad)?;
        let n: u32 = n.trim().parse().map_err(|_| bad())?;
        let d = d.trim();
        let period = if let Some(ms) = d.strip_suffix("ms") {
            ms.parse().map(Duration::from_millis).map_err(|_| bad())?
        } else {
            let secs: f64 = d
                .strip_suffix('s')
                .unwrap_or(d)
                .parse()
                .map_err(|_| bad())?;
            Duration::try_from_secs_f64(secs).map_err(|_| bad())?
        };
        Self::fixed(n, period)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Lease {
    /// From its text form (`"auto"`, `"20:200ms"`).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
