//! The terminal path: when a quota is spent, waiting does not help.
//!
//! Throttling and quota exhaustion often share a status (429). Backoff does not replenish a
//! monthly quota, and every worker polling a usage endpoint is another herd. So an
//! allowance can carry one [`QuotaProbe`]: when throttling responses without `Retry-After`
//! persist ([`QuotaTrigger`]), the probe runs **once for the whole allowance**
//! (single-flight). If it reports the quota exhausted, every waiting and new call fails at
//! once with [`QuotaExhausted`](crate::error::QuotaExhausted) until the reported time or
//! until [`Allowance::reset_quota`](crate::Allowance::reset_quota): nothing polls in a
//! loop. If the probe fails (or is itself throttled), the next probe waits for a bounded,
//! doubling backoff (1 s up to 60 s) — never a tight loop.
//!
//! ```
//! use std::{future::Future, pin::Pin, time::Duration};
//! use tower_allowance::{quota::{QuotaProbe, QuotaStatus, QuotaTrigger}, Allowance, AllowanceConfig, BoxError};
//!
//! /// Asks the provider's usage endpoint (here: pretends the month is spent).
//! #[derive(Debug)]
//! struct Usage;
//!
//! impl QuotaProbe for Usage {
//!     fn probe(&self) -> Pin<Box<dyn Future<Output = Result<QuotaStatus, BoxError>> + Send>> {
//!         Box::pin(async { Ok(QuotaStatus::Exhausted { retry_in: Duration::from_secs(3600) }) })
//!     }
//! }
//!
//! # fn main() -> Result<(), BoxError> {
//! let allowance = Allowance::builder(AllowanceConfig::per_second(2, 2)?)
//!     .quota_probe(Usage, QuotaTrigger::after_consecutive(3)?)
//!     .build();
//! # let _ = allowance;
//! # Ok(())
//! # }
//! ```

use std::{
    fmt,
    future::Future,
    num::NonZeroU32,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::{BoxError, ConfigError};

/// What a quota probe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaStatus {
    /// Quota remains: the throttling was a short-window limit.
    Available,
    /// The quota is spent; it renews in `retry_in` (for example, at the end of the billing
    /// period, computed against the provider's `Date`).
    Exhausted {
        /// Time until the quota renews.
        retry_in: Duration,
    },
}

/// A check of the provider's quota, supplied by the user (for example `GET /v1/usage`).
///
/// It runs at most once at a time per allowance.
pub trait QuotaProbe: Send + Sync + fmt::Debug + 'static {
    /// Asks the provider. An error (or a throttled probe) makes the allowance back off
    /// before probing again.
    fn probe(&self) -> Pin<Box<dyn Future<Output = Result<QuotaStatus, BoxError>> + Send>>;
}

/// When to run the probe: after this many consecutive throttling responses without a usable
/// `Retry-After` (a response with one, or a success, resets the count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaTrigger {
    after: NonZeroU32,
}

impl QuotaTrigger {
    /// Probe after `n` consecutive throttling responses without `Retry-After`.
    ///
    /// # Errors
    ///
    /// Zero.
    pub fn after_consecutive(n: u32) -> Result<Self, ConfigError> {
        let after =
            NonZeroU32::new(n).ok_or(ConfigError::new("quota trigger must be at least 1"))?;
        Ok(Self { after })
    }
}

impl Default for QuotaTrigger {
    /// Three consecutive throttling responses without `Retry-After`.
    fn default() -> Self {
        Self {
            after: NonZeroU32::new(3).unwrap_or(NonZeroU32::MIN),
        }
    }
}

const PROBE_BACKOFF_MIN: Duration = Duration::from_secs(1);
const PROBE_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// The allowance's quota state. Shared behind the allowance's `Arc`.
pub(crate) struct QuotaGuard {
    probe: Arc<dyn QuotaProbe>,
    trigger: QuotaTrigger,
    consecutive: AtomicU32,
    probing: AtomicBool,
    inner: Mutex<QuotaInner>,
}

#[derive(Default)]
struct QuotaInner {
    exhausted_until: Option<Instant>,
    next_probe_at: Option<Instant>,
    failures: u32,
    probes: u64,
}

impl fmt::Debug for QuotaGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaGuard")
            .field("probe", &self.probe)
            .field("trigger", &self.trigger)
            .finish_non_exhaustive()
    }
}

/// What the probe task should do with its verdict.
pub(crate) enum Verdict {
    Exhausted(Instant),
    Open,
}

impl QuotaGuard {
    pub(crate) fn new(probe: Arc<dyn QuotaProbe>, trigger: QuotaTrigger) -> Self {
        Self {
            probe,
            trigger,
            consecutive: AtomicU32::new(0),
            probing: AtomicBool::new(false),
            inner: Mutex::new(QuotaInner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QuotaInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The instant the quota reopens, if it is exhausted now.
    pub(crate) fn exhausted_until(&self, now: Instant) -> Option<Instant> {
        self.lock().exhausted_until.filter(|u| *u > now)
    }

    pub(crate) fn reset(&self) {
        let mut q = self.lock();
        q.exhausted_until = None;
        q.next_probe_at = None;
        q.failures = 0;
        self.consecutive.store(0, Ordering::Relaxed);
    }

    pub(crate) fn probes(&self) -> u64 {
        self.lock().probes
    }

    /// A response that says nothing about the quota (success, or throttling with a delay).
    pub(crate) fn clear_streak(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
    }

    /// A throttling response without a usable delay. Returns the probe to run, if this
    /// caller won the single flight.
    pub(crate) fn throttled_without_delay(&self, now: Instant) -> Option<Arc<dyn QuotaProbe>> {
        let n = self
            .consecutive
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if n < self.trigger.after.get() {
            return None;
        }
        {
            let q = self.lock();
            if q.exhausted_until.is_some_and(|u| u > now)
                || q.next_probe_at.is_some_and(|t| t > now)
            {
                return None;
            }
        }
        if self.probing.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.lock().probes += 1;
        Some(self.probe.clone())
    }

    /// Records the probe's result; returns what the allowance must do.
    pub(crate) fn finish(&self, now: Instant, result: Result<QuotaStatus, BoxError>) -> Verdict {
        let mut q = self.lock();
        let verdict = match result {
            Ok(QuotaStatus::Exhausted { retry_in }) => {
                let until = now
                    .checked_add(retry_in)
                    .unwrap_or(now + Duration::from_secs(86_400 * 365));
                q.exhausted_until = Some(until);
                q.failures = 0;
                tracing::debug!(?retry_in, "quota exhausted");
                Verdict::Exhausted(until)
            }
            Ok(QuotaStatus::Available) => {
                q.failures = 0;
                // Throttling continues without delays: don't probe again at once.
                q.next_probe_at = now.checked_add(PROBE_BACKOFF_MIN);
                Verdict::Open
            }
            Err(e) => {
                let backoff = PROBE_BACKOFF_MIN
                    .saturating_mul(1u32.checked_shl(q.failures).unwrap_or(u32::MAX))
                    .min(PROBE_BACKOFF_MAX);
                q.failures = q.failures.saturating_add(1);
                q.next_probe_at = now.checked_add(backoff);
                tracing::debug!(error = %e, ?backoff, "quota probe failed; backing off");
                Verdict::Open
            }
        };
        self.consecutive.store(0, Ordering::Relaxed);
        self.probing.store(false, Ordering::Release);
        verdict
    }
}
