use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

use super::{Admit, Decision, Deferred, Store, StoreError, StoreFuture, StoreState};
use crate::{
    algorithm::{self, Ask, State, Verdict},
    AllowanceConfig,
};

/// An allowance's state in this process: the pure decision applied under a mutex.
///
/// Its clock is `tokio::time::Instant`, so paused-time tests drive it exactly. The
/// admission fast path takes the lock once and does not allocate.
///
/// # Clone
///
/// Not `Clone`: share it by sharing the [`Allowance`](crate::Allowance) that owns it.
#[derive(Debug)]
pub struct MemoryStore {
    epoch: Instant,
    state: Mutex<State>,
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
            state: Mutex::new(State::default()),
        }
    }

    fn now_us(&self) -> u64 {
        // Microseconds since creation; u64 covers 584,000 years.
        u64::try_from(
            Instant::now()
                .saturating_duration_since(self.epoch)
                .as_micros(),
        )
        .unwrap_or(u64::MAX)
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State, u64) -> T) -> T {
        // The critical sections are pure arithmetic that cannot panic, so a poisoned lock
        // still guards consistent state.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.now_us();
        f(&mut state, now)
    }

    pub(crate) fn admit_now(&self, config: &AllowanceConfig, ask: Admit) -> Decision {
        let ask = Ask {
            spend_retry: ask.spend_retry,
        };
        let verdict = self.with_state(|s, now| algorithm::admit(s, now, &config.params, ask));
        match verdict {
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

    /// `delay_us` must already be within `MAX_DELAY`.
    pub(crate) fn defer_now(&self, delay_us: u64) -> Deferred {
        self.with_state(|s, now| {
            let extended = algorithm::defer(s, now, delay_us);
            Deferred {
                extended,
                blocked_for: Duration::from_micros(s.blocked_until_us.saturating_sub(now)),
            }
        })
    }

    pub(crate) fn deposit_now(&self, config: &AllowanceConfig) {
        self.with_state(|s, now| algorithm::deposit(s, now, &config.params));
    }

    pub(crate) fn state_now(&self, config: &AllowanceConfig) -> StoreState {
        self.with_state(|s, now| {
            let remaining = algorithm::budget_remaining(s, now, &config.params);
            StoreState {
                blocked_for: Duration::from_micros(s.blocked_until_us.saturating_sub(now)),
                retries_remaining: (remaining != u64::MAX).then_some(remaining),
            }
        })
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
            Some(us) => ready(self.defer_now(us)),
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
