use std::time::Duration;

use tokio::time::Instant;

use super::{cell::Cell, Admit, Decision, Deferred, Store, StoreError, StoreFuture, StoreState};
use crate::{
    algorithm::{self, Ask, Verdict},
    AllowanceConfig,
};

/// An allowance's state in this process: the pure decision applied atomically.
///
/// Its clock is `tokio::time::Instant`, so paused-time tests drive it exactly. A first
/// attempt is lock-free (one compare-and-swap on the token bucket, one load of the
/// cooldown deadline) and does not allocate; a retry also locks the retry budget, so that
/// the budget check, the token and the spend are one atomic step.
///
/// # Clone
///
/// Not `Clone`: share it by sharing the [`Allowance`](crate::Allowance) that owns it.
#[derive(Debug)]
pub struct MemoryStore {
    epoch: Instant,
    cell: Cell,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A fresh store: full burst, no cooldown, full budget.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
            cell: Cell::new(),
        }
    }

    /// Microseconds from creation to `now`: `u64` arithmetic, no `u128` (u64 microseconds
    /// cover 584,000 years; the multiplication saturates rather than wraps past that).
    #[inline]
    fn micros(&self, now: Instant) -> u64 {
        let d = now.saturating_duration_since(self.epoch);
        d.as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(d.subsec_micros()))
    }

    /// Decides one admission at `now`, a clock read the caller already made.
    #[inline]
    pub(crate) fn admit_at(&self, now: Instant, config: &AllowanceConfig, ask: Admit) -> Decision {
        let ask = Ask {
            spend_retry: ask.spend_retry,
        };
        match self.cell.admit(self.micros(now), &config.params, ask) {
            Verdict::Admitted { next_in_us } => Decision::Admitted {
                next_in: Duration::from_micros(next_in_us),
            },
            Verdict::Wait { wait_us, cooldown } => Decision::Wait {
                wait: Duration::from_micros(wait_us),
                cooldown,
            },
            Verdict::BudgetExhausted => Decision::BudgetExhausted,
        }
    }

    fn admit_now(&self, config: &AllowanceConfig, ask: Admit) -> Decision {
        self.admit_at(Instant::now(), config, ask)
    }

    /// Raises the cooldown from `now`; `delay_us` must already be within `MAX_DELAY`.
    pub(crate) fn defer_at(&self, now: Instant, delay_us: u64) -> Deferred {
        let now_us = self.micros(now);
        let (extended, until) = self.cell.defer(now_us, delay_us);
        Deferred {
            extended,
            blocked_for: Duration::from_micros(until.saturating_sub(now_us)),
        }
    }

    pub(crate) fn deposit_now(&self, config: &AllowanceConfig) {
        self.cell
            .deposit(self.micros(Instant::now()), &config.params);
    }

    pub(crate) fn state_now(&self, config: &AllowanceConfig) -> StoreState {
        let now = self.micros(Instant::now());
        let remaining = self.cell.budget_remaining(now, &config.params);
        StoreState {
            blocked_for: Duration::from_micros(self.cell.blocked_until_us().saturating_sub(now)),
            retries_remaining: (remaining != u64::MAX).then_some(remaining),
        }
    }
}

fn ready<T: Send + 'static>(value: T) -> StoreFuture<T> {
    Box::pin(std::future::ready(Ok(value)))
}

/// The boxed interface, for code written against any [`Store`] (such as a conformance
/// suite). The [`Allowance`](crate::Allowance) calls the memory store directly, without boxing.
impl Store for MemoryStore {
    fn admit(&self, config: &AllowanceConfig, ask: Admit) -> StoreFuture<Decision> {
        ready(self.admit_now(config, ask))
    }

    fn defer(&self, _config: &AllowanceConfig, delay: Duration) -> StoreFuture<Deferred> {
        match algorithm::micros_ceil(delay) {
            Some(us) => ready(self.defer_at(Instant::now(), us)),
            None => Box::pin(std::future::ready(Err(StoreError::new(
                crate::error::UnrepresentableDelay::new(format!("{delay:?}")),
            )))),
        }
    }

    fn deposit(&self, config: &AllowanceConfig) -> StoreFuture<()> {
        self.deposit_now(config);
        ready(())
    }

    fn state(&self, config: &AllowanceConfig) -> StoreFuture<StoreState> {
        ready(self.state_now(config))
    }
}
