//! The local fallback ([`FailurePolicy::LocalFallback`]): while Redis does not answer, this
//! process decides alone, in memory, at its share of the allowance.
//!
//! Every limit's rate and burst are divided by the expected processes, a replenishing
//! budget's floor likewise, and a fixed budget gives no retries (what the others spent is
//! unknown). The local allowance hears every cooldown, closure and clearing decided through
//! Redis too, so that it honours the ones raised before an outage. Its replies carry no
//! events: other processes cannot hear them.

use std::{num::NonZeroU32, time::Duration};

use tokio::time::Instant;
use tower_allowance::{
    rule::{BudgetParams, Op, Params, Reply, Unit},
    store::{MemoryStore, Store, StoreError},
    AllowanceConfig, ConfigError, Limit, ReplenishingBudget, RetryBudgetConfig, MAX_DELAY,
};

use crate::{
    error::{CallError, CallErrorKind},
    FailurePolicy,
};

/// The local allowance used under [`FailurePolicy::LocalFallback`].
pub(crate) struct Fallback {
    processes: NonZeroU32,
    local: MemoryStore,
}

// === impl Fallback ===

impl Fallback {
    /// The fallback `policy` asks for, if any.
    pub(crate) fn new(policy: FailurePolicy) -> Option<Self> {
        match policy {
            FailurePolicy::Report => None,
            FailurePolicy::LocalFallback { expected_processes } => Some(Self {
                processes: expected_processes,
                local: MemoryStore::new(),
            }),
        }
    }

    /// Hears an operation sent to Redis: a cooldown, closure or clearing (a throttling
    /// response's cooldown comes as `Throttle`) applies here too; anything else is Redis's.
    pub(crate) fn hear(&self, params: &Params, op: &Op) {
        let cools = matches!(
            op,
            Op::Defer { .. } | Op::Throttle { .. } | Op::Close { .. } | Op::Clear
        );
        if !cools {
            return;
        }
        if let Ok(local_params) = fallback_config(params, NonZeroU32::MIN) {
            let op = (*op).into();
            let _ = self
                .local
                .try_apply(Instant::now(), local_params.params(), &op);
        }
    }

    /// Decides `op` in this process, at its share of the allowance, without the reply's event;
    /// `None` when the local store cannot answer it synchronously.
    ///
    /// # Errors
    ///
    /// A [`CallErrorKind::Fallback`] rejection when the divided configuration is invalid.
    pub(crate) fn decide(&self, params: &Params, op: &Op) -> Option<Result<Reply, StoreError>> {
        // A lease is the store's tokens or none: its holder falls back at its own share.
        if matches!(op, Op::Grant(_)) {
            return None;
        }
        let local_params = match fallback_config(params, self.processes) {
            Ok(config) => config,
            Err(c) => {
                let why = CallError::with_source(CallErrorKind::Fallback, c);
                return Some(Err(StoreError::rejected(why)));
            }
        };
        let reply = self
            .local
            .try_apply(Instant::now(), local_params.params(), &(*op).into())?;
        // The fallback's events are its own: other processes cannot hear them.
        Some(reply.map(|reply| strip_event(reply.into())))
    }
}

/// A reply without the event it carried (decided by the local fallback).
fn strip_event(reply: Reply) -> Reply {
    match reply {
        Reply::Defer(mut d) => {
            d.event = None;
            Reply::Defer(d)
        }
        Reply::ProbeFinished(_) => Reply::ProbeFinished(None),
        #[cfg(feature = "settle")]
        Reply::Settled(mut s) => {
            s.event = None;
            Reply::Settled(s)
        }
        other => other,
    }
}

/// The conservative local allowance: every limit's rate and burst divided by the expected
/// processes; no retries from a fixed budget (what the others spent is unknown).
fn fallback_config(params: &Params, processes: NonZeroU32) -> Result<AllowanceConfig, ConfigError> {
    let n = u64::from(processes.get());
    let limit = |interval_us: u64, tolerance_us: u64, headroom_us: u64| {
        // `interval * n` per unit; a burst of `burst / n`, at least one; its own headroom
        // when the limit has one.
        let burst = (tolerance_us / interval_us.max(1)).max(1);
        let per = Duration::from_micros(interval_us.saturating_mul(n)).min(MAX_DELAY);
        Limit::new(
            1,
            per,
            u32::try_from((burst / n).max(1)).unwrap_or(u32::MAX),
        )
        .map(|l| if headroom_us == 0 { l.exact() } else { l })
    };
    let Some((main, extra_limits)) = params.limits().split_first() else {
        // A validated configuration always has its main limit; nothing is admitted without.
        return AllowanceConfig::new(1, MAX_DELAY, 1);
    };
    let first = limit(main.interval_us(), main.tolerance_us(), main.headroom_us())?;
    let mut config = AllowanceConfig::new(first.rate(), first.period(), first.burst())?;
    if main.headroom_us() == 0 {
        config = config.exact();
    }
    for extra in extra_limits {
        let mut l = limit(
            extra.interval_us(),
            extra.tolerance_us(),
            extra.headroom_us(),
        )?;
        if extra.unit() == Unit::Cost {
            l = l.counting_cost();
        }
        config = config.with_limit(l)?;
    }
    let budget = match params.budget() {
        BudgetParams::Unlimited => RetryBudgetConfig::Unlimited,
        BudgetParams::Fixed { .. } => RetryBudgetConfig::fixed(0),
        BudgetParams::Replenishing {
            slot_us,
            reserve,
            per_mille,
        } => {
            let window = Duration::from_micros(slot_us.saturating_mul(10));
            let per_sec = reserve.saturating_mul(1_000_000) / window.as_micros().max(1) as u64 / n;
            RetryBudgetConfig::Replenishing(ReplenishingBudget::new(
                window,
                u32::try_from(per_sec).unwrap_or(u32::MAX),
                per_mille as f64 / 1000.0,
            )?)
        }
    };
    config
        .with_retry_budget(budget)
        .with_max_cooldown(Duration::from_micros(params.max_cooldown_us().max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_divides_the_rate() {
        let n = NonZeroU32::new(4).expect("non-zero");
        let config = AllowanceConfig::per_second(10, 6)
            .expect("valid")
            .with_retry_budget(RetryBudgetConfig::fixed(9));
        let local = fallback_config(config.params().rule(), n).expect("valid");
        assert_eq!(local.interval(), Duration::from_millis(400));
        assert_eq!(local.burst(), 1);
        assert_eq!(local.retry_budget(), &RetryBudgetConfig::fixed(0));

        let budget = ReplenishingBudget::new(Duration::from_secs(10), 8, 0.2).expect("valid");
        let config = config.with_retry_budget(RetryBudgetConfig::Replenishing(budget));
        let local = fallback_config(config.params().rule(), n).expect("valid");
        let RetryBudgetConfig::Replenishing(r) = local.retry_budget() else {
            panic!("still replenishing");
        };
        assert_eq!((r.min_per_sec(), r.ratio()), (2, 0.2));
    }
}
