//! Running the group's quota probe (feature `quota`): one lease at a time through the store,
//! released on every exit path. The probe, its trigger and this process's streak are in
//! [`quota`](crate::quota).

use std::sync::Arc;

use tokio::time::Instant;

use super::{Applying, Shared};
use crate::{
    error::Exhausted,
    quota::{QuotaStatus, PROBE_LEASE},
    rule::{ClosedBy, Op, ProbeOutcome, Reply},
};

impl Shared {
    /// The quota probe, when configured.
    pub(crate) fn quota(&self) -> Option<&crate::quota::QuotaGuard> {
        self.quota.as_ref()
    }
}

/// Runs the probe for the group, if the store grants this process the lease.
///
/// The lease is released on every exit path: the probe's outcome is reported when it
/// finishes; a probe that errors, times out, panics or is cancelled (its task dropped, its
/// runtime shut down) is reported as failed by a drop guard, and if even that report cannot
/// be made, the lease expires after [`PROBE_LEASE`].
pub(crate) async fn run_probe(shared: Arc<Shared>) {
    let Some(quota) = &shared.quota else {
        return;
    };
    let token = fastrand::u64(..);
    let mut guard = LeaseGuard {
        shared: shared.clone(),
        token,
        held: false,
    };
    let granted = matches!(
        shared
            .apply_async(Op::Lease {
                ttl_us: PROBE_LEASE.as_micros() as u64,
                token,
            })
            .await,
        Ok(Reply::Lease { granted: true })
    );
    if !granted {
        return;
    }
    guard.held = true;
    quota.started();
    tracing::debug!(
        allowance = &*shared.name,
        "running the quota probe for the group"
    );
    let outcome = match tokio::time::timeout(PROBE_LEASE, quota.probe()).await {
        Ok(Ok(QuotaStatus::Available)) => ProbeOutcome::Available,
        Ok(Ok(QuotaStatus::Exhausted { retry_in })) => ProbeOutcome::Exhausted { retry_in },
        Ok(Err(e)) => {
            tracing::debug!(allowance = &*shared.name, error = %e, "quota probe failed; backing off");
            ProbeOutcome::Failed
        }
        Err(_) => ProbeOutcome::Failed,
    };
    guard.held = false;
    let now = Instant::now();
    match shared.apply_async(Op::FinishProbe { token, outcome }).await {
        Ok(Reply::ProbeFinished(Some(event))) => {
            if let ProbeOutcome::Exhausted { retry_in } = outcome {
                shared
                    .holders
                    .learn_closed(Exhausted::new(now.checked_add(retry_in), ClosedBy::Quota));
                shared.stats.metrics.closed(ClosedBy::Quota);
                tracing::warn!(
                    allowance = &*shared.name,
                    ?retry_in,
                    "quota exhausted: allowance closed"
                );
            }
            shared.holders.event(event);
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "could not record the quota probe's outcome"),
    }
}

/// Releases the lease (as a failed probe) if the probe did not finish, and the process-local
/// single flight in every case.
struct LeaseGuard {
    shared: Arc<Shared>,
    token: u64,
    held: bool,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.held {
            let op = Op::FinishProbe {
                token: self.token,
                outcome: ProbeOutcome::Failed,
            };
            match self.shared.apply(Instant::now(), op) {
                Applying::Done(_) => {}
                Applying::Pending(fut) => {
                    // Best effort; without a runtime the lease expires by itself.
                    if let Ok(handle) = tokio::runtime::Handle::try_current() {
                        handle.spawn(fut);
                    }
                }
            }
        }
        if let Some(q) = &self.shared.quota {
            q.finished();
        }
    }
}
