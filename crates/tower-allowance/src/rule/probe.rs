//! The quota probe's lease: one probe at a time per allowance, across processes (feature
//! `quota`; the Redis crate builds with it).

use std::time::Duration;

use super::{close, micros_ceil, ClosedBy, Event, Op, Params, Reply, State};

/// What a quota probe found, reported with [`Op::FinishProbe`](super::Op::FinishProbe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Quota remains.
    Available,
    /// The quota is spent until `retry_in` from now.
    Exhausted {
        /// Time until it renews.
        retry_in: Duration,
    },
    /// The probe failed (an error, a panic, a cancellation): back off before the next one.
    Failed,
}

/// Applies the quota probe's `op` (see [`apply`](super::apply), which matches every other
/// operation itself).
pub(super) fn apply(state: &mut State, now: u64, params: &Params, op: &Op) -> Reply {
    match *op {
        Op::Lease { ttl_us, token } => Reply::Lease {
            granted: lease(state, now, ttl_us, token),
        },
        Op::FinishProbe { token, outcome } => {
            Reply::ProbeFinished(finish_probe(state, now, params, token, outcome))
        }
        // Never reached (`apply` matches every other operation); a read changes nothing.
        _ => Reply::State(super::read(state, now, params)),
    }
}

/// Grants the quota probe's lease to `token` unless the allowance is closed, a probe is
/// backing off, or another prober holds an unexpired lease.
pub(crate) fn lease(state: &mut State, now: u64, ttl_us: u64, token: u64) -> bool {
    if now < state.closed_until || now < state.next_probe_at || now < state.lease_until {
        return false;
    }
    state.lease_until = now.saturating_add(ttl_us.max(1));
    state.lease_token = token;
    state.probes += 1;
    true
}

/// Records a probe's outcome: an exhausted quota closes the allowance; anything else backs
/// off the next probe (doubling after failures). The lease is released when `token` still
/// holds it. Returns the event when the allowance closed.
pub(crate) fn finish_probe(
    state: &mut State,
    now: u64,
    params: &Params,
    token: u64,
    outcome: ProbeOutcome,
) -> Option<Event> {
    if state.lease_token == token {
        state.lease_until = 0;
    }
    match outcome {
        ProbeOutcome::Exhausted { retry_in } => {
            state.probe_failures = 0;
            Some(close(state, now, micros_ceil(retry_in), ClosedBy::Quota))
        }
        ProbeOutcome::Available => {
            state.probe_failures = 0;
            state.next_probe_at = now.saturating_add(params.probe_backoff_min_us);
            None
        }
        ProbeOutcome::Failed => {
            let factor = 1u64
                .checked_shl(u32::try_from(state.probe_failures).unwrap_or(u32::MAX))
                .unwrap_or(u64::MAX);
            let backoff = params
                .probe_backoff_min_us
                .saturating_mul(factor)
                .min(params.probe_backoff_max_us);
            state.probe_failures += 1;
            state.next_probe_at = now.saturating_add(backoff);
            None
        }
    }
}
