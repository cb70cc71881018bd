//! The terminal path: when a quota is spent, waiting does not help.
//!
//! Throttling and quota exhaustion often share a status (429). Backoff does not replenish a
//! monthly quota, and every worker polling a usage endpoint is another herd. So an
//! allowance can carry one [`QuotaProbe`]: when throttling responses without `Retry-After`
//! persist ([`QuotaTrigger`]), the probe runs **once for the whole allowance**, across every
//! process that shares its store: the store grants one lease at a time ([`PROBE_LEASE`]), and
//! keeps the verdict. If the probe reports the quota exhausted, the allowance closes: every
//! waiting and new call, in every process, fails at once with
//! [`error::Exhausted`](crate::error::Exhausted) until the reported time or until
//! [`Allowance::clear`](crate::Allowance::clear): nothing polls in a loop. If the probe
//! fails (or is itself throttled), the next probe waits for a bounded, doubling backoff
//! (1 s up to 60 s), also kept in the store — never a tight loop.
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
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

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

/// How long a quota probe's lease lasts: the probe is cut off after this long, and a lease
/// whose prober died (a crashed process, a runtime shut down mid-probe) expires after it.
pub const PROBE_LEASE: Duration = Duration::from_secs(30);

/// This process's side of the quota path: the trigger, and the probe it may run. The lease
/// (one probe at a time for the whole group), the backoff and the verdict live in the store.
pub(crate) struct QuotaGuard {
    probe: Arc<dyn QuotaProbe>,
    trigger: QuotaTrigger,
    consecutive: AtomicU32,
    /// One lease request in flight per process at most.
    probing: AtomicBool,
    /// Probes this process ran.
    probes: AtomicU64,
}

impl fmt::Debug for QuotaGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaGuard")
            .field("probe", &self.probe)
            .field("trigger", &self.trigger)
            .finish_non_exhaustive()
    }
}

impl QuotaGuard {
    pub(crate) fn new(probe: Arc<dyn QuotaProbe>, trigger: QuotaTrigger) -> Self {
        Self {
            probe,
            trigger,
            consecutive: AtomicU32::new(0),
            probing: AtomicBool::new(false),
            probes: AtomicU64::new(0),
        }
    }

    /// Probes this process ran.
    pub(crate) fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    /// This process holds the lease and runs the probe.
    pub(crate) fn started(&self) {
        self.probes.fetch_add(1, Ordering::Relaxed);
    }

    /// Asks the provider.
    pub(crate) fn probe(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<QuotaStatus, BoxError>> + Send>> {
        self.probe.probe()
    }

    /// The probe is over (whatever it found): another may be asked for.
    pub(crate) fn finished(&self) {
        self.probing.store(false, Ordering::Release);
        self.clear_streak();
    }

    /// A response that says nothing about the quota (success, or throttling with a delay).
    pub(crate) fn clear_streak(&self) {
        if self.consecutive.load(Ordering::Relaxed) != 0 {
            self.consecutive.store(0, Ordering::Relaxed);
        }
    }

    /// A throttling response without a usable delay: whether this caller should try to take
    /// the group's probe lease (the trigger is reached and no lease request is in flight here).
    pub(crate) fn throttled_without_delay(&self) -> bool {
        let n = self
            .consecutive
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        n >= self.trigger.after.get() && !self.probing.swap(true, Ordering::AcqRel)
    }
}
