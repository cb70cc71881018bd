//! The circuit breaker in front of Redis: after a failure, calls skip Redis until the next
//! probe is due, so that nothing queues behind an outage; one caller per probe interval asks
//! it again. A refusal (a changed password, a revoked permission) fails every caller at once
//! with its cause until Redis accepts a call again.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Mutex, PoisonError,
    },
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::store::StoreErrorKind;

use crate::error::{CallError, CallErrorKind};

/// What a call does about Redis.
pub(crate) enum Check {
    /// Healthy: ask Redis.
    Closed,
    /// Failing, and a probe is due: this call asks Redis.
    Probe,
    /// Failing: answer "unavailable" at once.
    Open,
}

/// Skips Redis for a while after a failure, so that calls never queue up behind an outage;
/// one caller per probe interval asks it again.
pub(crate) struct Circuit {
    epoch: Instant,
    probe_us: u64,
    /// Microseconds since `epoch` before which Redis is not tried; 0 when healthy.
    closed_until_us: AtomicU64,
    degraded: AtomicBool,
    /// The last refusal (a changed password, a revoked permission), until a call succeeds:
    /// calls skipped meanwhile fail with it at once, not as an outage to wait out.
    refusal: Mutex<Option<String>>,
    /// Whether a configuration refusal was logged since the last success.
    mismatch: AtomicBool,
}

// === impl Circuit ===

impl Circuit {
    pub(crate) fn new(probe_interval: Duration) -> Self {
        Self {
            epoch: Instant::now(),
            probe_us: u64::try_from(probe_interval.as_micros()).unwrap_or(u64::MAX),
            closed_until_us: AtomicU64::new(0),
            degraded: AtomicBool::new(false),
            refusal: Mutex::new(None),
            mismatch: AtomicBool::new(false),
        }
    }

    /// Whether the last call failed (and calls are failing or falling back).
    pub(crate) fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// What a call skipped while the circuit is open fails with: the refusal that opened it,
    /// else "unavailable".
    pub(crate) fn open_error(&self) -> CallError {
        let refusal = self
            .refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match refusal {
            Some(why) => CallError::with_source(CallErrorKind::Refused, why),
            None => CallError::new(CallErrorKind::Unavailable),
        }
    }

    /// Microseconds on the circuit's clock (tokio's, since the circuit was made), never 0.
    pub(crate) fn now_us(&self) -> u64 {
        // +1 so that "now" is never the "healthy" marker 0.
        u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    pub(crate) fn check(&self) -> Check {
        let until = self.closed_until_us.load(Ordering::Acquire);
        if until == 0 {
            return Check::Closed;
        }
        let now = self.now_us();
        let won = now >= until
            && self
                .closed_until_us
                .compare_exchange(
                    until,
                    now.saturating_add(self.probe_us),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok();
        if won {
            Check::Probe
        } else {
            Check::Open
        }
    }

    pub(crate) fn succeeded(&self, name: &str) {
        self.mismatch.store(false, Ordering::Relaxed);
        if self.closed_until_us.load(Ordering::Acquire) != 0 {
            self.closed_until_us.store(0, Ordering::Release);
            *self.refusal.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        if self.degraded.load(Ordering::Acquire) && self.degraded.swap(false, Ordering::AcqRel) {
            tracing::info!(
                allowance = name,
                "redis answers again; allowance decisions are shared again"
            );
        }
    }

    /// A call failed with `error`; `policy` names what callers get meanwhile, for the log.
    pub(crate) fn failed(&self, error: &CallError, name: &str, policy: &'static str) {
        if error.kind() == CallErrorKind::Unavailable {
            return;
        }
        if error.kind() == CallErrorKind::ConfigMismatch {
            // Not a failure of redis: logged as what it is, once per run of refusals.
            if !self.mismatch.swap(true, Ordering::AcqRel) {
                tracing::error!(
                    allowance = name,
                    error = %std::error::Error::source(error)
                        .map_or_else(|| error.to_string(), ToString::to_string),
                    "configuration refused: every call of this process is refused until it                      runs the configuration in force"
                );
            }
            return;
        }
        let next = self.now_us().saturating_add(self.probe_us);
        if error.store_kind() == StoreErrorKind::Unavailable {
            self.closed_until_us.store(next, Ordering::Release);
        } else if error.kind() == CallErrorKind::Refused {
            // A refusal (a password changed under us, a permission revoked) fails every
            // caller at once with its cause, until a probe finds it lifted: not an outage
            // that callers wait out one probe at a time.
            let why = std::error::Error::source(error)
                .map_or_else(|| error.to_string(), ToString::to_string);
            let first = self
                .refusal
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .replace(why.clone())
                .is_none();
            self.closed_until_us.store(next, Ordering::Release);
            if first {
                tracing::error!(
                    allowance = name,
                    error = %why,
                    "redis refused the allowance's call (a changed password or a missing \
                     permission): every call fails with it until redis accepts one again"
                );
            }
        }
        // A refusal was logged as what it is above; the outage's policy is for outages.
        if !self.degraded.swap(true, Ordering::AcqRel) && error.kind() != CallErrorKind::Refused {
            tracing::warn!(
                allowance = name,
                error = %error,
                cause = ?std::error::Error::source(error).map(ToString::to_string),
                policy,
                "redis failed for the allowance"
            );
        }
    }
}
