//! The shared handle: one allowance, however many clones.

use std::{future::Future, sync::Arc, time::Duration};

use tokio::time::Instant;

use crate::{
    acquire::{Acquire, OwnedAdmit},
    error::{AbandonReason, AcquireError, CooldownError, UnrepresentableDelay},
    rule::{self, Deferred, Op, Reply, StoreState},
    shared::{Applying, Shared},
    store::{StoreError, WrongReply},
    AcquireOptions, AllowanceConfig,
};

mod builder;
// What the keyed registry and the `rule` feature (the conformance suite) read of the store.
#[cfg(any(test, feature = "rule", feature = "keyed"))]
mod inspect;
#[cfg(feature = "quota")]
mod quota;
mod snapshot;
#[cfg(feature = "serde")]
mod spec;

#[cfg(feature = "dialects")]
pub use self::snapshot::RateLimitObservation;
#[cfg(feature = "serde")]
pub use self::spec::{AllowanceSpec, MemorySpec, OpenStore};
pub use self::{
    builder::AllowanceBuilder,
    snapshot::{AbandonedCounts, ClosedState, Snapshot},
};

/// One shared allowance: what one credential (one API key, one provider bucket) may spend.
///
/// It holds the token buckets, the cooldown deadline, the retry budget and the closed
/// (exhausted) state, in a [`Store`](crate::store::Store): this process's memory by
/// default, or a store several processes share. Every layer built from it, and every clone
/// of it, spends the same allowance.
///
/// # Clone
///
/// Cloning is cheap (an `Arc`) and never creates a new bucket: all clones share one state.
/// Build one `Allowance` per credential and hand clones to every service that uses it.
///
/// # Runtime
///
/// Waiting uses Tokio timers and the current runtime's tasks (to give a reserved slot back
/// through an I/O store, and to run a quota probe). Use an allowance from one Tokio runtime
/// (any number of its worker threads); to coordinate several runtimes or processes, give
/// each its own `Allowance` over one shared store (such as Redis).
///
/// ```
/// use tower_allowance::{Allowance, AllowanceConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let allowance = Allowance::new(AllowanceConfig::per_second(2, 2)?);
/// let other_service = allowance.clone(); // the same bucket
///
/// allowance.acquire().await?;
/// other_service.acquire().await?;
/// assert_eq!(allowance.snapshot().admitted, 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Allowance {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Allowance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl Allowance {
    /// An allowance kept in this process's memory.
    pub fn new(config: AllowanceConfig) -> Self {
        Self::builder(config).build()
    }

    /// A builder, to name the allowance, keep it in a shared store or add a quota probe.
    pub fn builder(config: AllowanceConfig) -> AllowanceBuilder {
        AllowanceBuilder::new(config)
    }

    /// An allowance kept in a shared [`Store`](crate::store::Store), such as Redis, so that
    /// several processes spend one allowance.
    pub fn with_store(config: AllowanceConfig, store: impl crate::store::Store) -> Self {
        Self::builder(config).store(store).build()
    }

    /// The allowance's name (for logs and metrics): the builder's, else the store's
    /// ([`Store::name`](crate::store::Store::name): a Redis store's allowance name), else
    /// `"default"`.
    pub fn name(&self) -> &str {
        self.shared.name()
    }

    /// The configuration this allowance was built from.
    pub fn config(&self) -> &AllowanceConfig {
        self.shared.config()
    }

    /// Waits for admission of one first attempt: at once, or at the slot the store reserves.
    ///
    /// Callers are admitted in the order they reach the store. Dropping the future before its
    /// slot gives the slot back when it is still the latest.
    pub fn acquire(&self) -> Acquire<'_> {
        Acquire::new(&self.shared, AcquireOptions::default())
    }

    /// Waits for admission with a deadline, a cost, a delay, or as a retry that spends the
    /// shared budget.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tower_allowance::{error::AbandonReason, AcquireOptions, Allowance, AllowanceConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let allowance = Allowance::new(AllowanceConfig::per_second(1, 1)?);
    /// allowance.extend_cooldown(Duration::from_secs(30)).await?;
    ///
    /// // The cooldown ends after the deadline: fail now, don't wait and then fail.
    /// let deadline = Instant::now() + Duration::from_secs(10);
    /// let result = allowance.acquire_with(AcquireOptions::new().deadline(deadline)).await;
    /// assert_eq!(result.err().and_then(|e| e.abandon_reason()), Some(AbandonReason::Deadline));
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_with(&self, options: AcquireOptions) -> Acquire<'_> {
        Acquire::new(&self.shared, options)
    }

    /// [`Allowance::acquire_with`], as a `'static` future that holds a clone of the handle
    /// (to spawn, or to keep in a struct). [`Allowance::acquire`] borrows instead, and is
    /// a reference-count increment cheaper.
    pub fn acquire_owned(
        &self,
        options: AcquireOptions,
    ) -> impl Future<Output = Result<(), AcquireError>> + Send + std::fmt::Debug + 'static {
        OwnedAdmit::new(self.shared.clone(), options)
    }

    /// Raises the shared cooldown to at least `delay` from now: no admission before then.
    ///
    /// The deadline only ever moves later; a shorter delay than the current one changes
    /// nothing. Callers already holding reserved slots move back by the added time, in the
    /// same order; those whose deadline that passes fail promptly. A delay beyond
    /// [`max_cooldown`](AllowanceConfig::with_max_cooldown) closes the allowance instead, until
    /// the delay's end (never shortened; beyond a year, which cannot be trusted, for
    /// `max_cooldown`), then it reopens by itself.
    ///
    /// # Errors
    ///
    /// [`UnrepresentableDelay`] when `delay` exceeds [`MAX_DELAY`](crate::MAX_DELAY)
    /// (nothing is changed), or the store's error.
    ///
    /// Returns whether anything changed: `true` when the cooldown moved later or the
    /// allowance closed. [`Allowance::snapshot`] shows the cooldown and closure that hold now.
    pub async fn extend_cooldown(&self, delay: Duration) -> Result<bool, CooldownError> {
        let raised = self.raise_cooldown(delay).await;
        raised.map(|d| d.extended || d.closed.is_some())
    }

    /// [`Allowance::extend_cooldown`], with the rule's whole answer.
    pub(crate) async fn raise_cooldown(&self, delay: Duration) -> Result<Deferred, CooldownError> {
        let delay_us = rule::micros_ceil(delay).map(Some).ok_or_else(|| {
            CooldownError::Unrepresentable(UnrepresentableDelay::new(format!("{delay:?}")))
        })?;
        let now = Instant::now();
        let reply = match self.shared.apply(now, Op::Defer { delay_us }) {
            Applying::Done(r) => r,
            Applying::Pending(fut) => fut.await,
        };
        match reply {
            Ok(Reply::Defer(deferred)) => {
                let asked = deferred.closed.map(|_| format!("{delay:?}"));
                self.shared.after_defer(now, &deferred, asked.as_deref());
                Ok(deferred)
            }
            Ok(_) => Err(CooldownError::Store(StoreError::protocol(WrongReply))),
            Err(e) => Err(CooldownError::Store(e)),
        }
    }

    /// Lifts the cooldown and the closed (exhausted) state, and gives the retry budget back
    /// (a fixed budget's spent retries, a replenishing one's window, as a fresh state has
    /// them), for every process sharing the store: an operator's decision (for example after
    /// buying more credits, before the next batch, or after a server sent an absurd
    /// `Retry-After`). Reserved slots keep their place.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn clear(&self) -> Result<(), StoreError> {
        let Reply::Changed(event) = self.shared.apply_async(Op::Clear).await? else {
            return Err(StoreError::protocol(WrongReply));
        };
        self.shared.holders().event(event);
        Ok(())
    }

    /// Reads the store's shared state (every process's cooldown, closure, retry budget and
    /// adaptive rate), learns the cooldown here, refreshes the gauges (feature `metrics`), and
    /// returns the [`Snapshot`] with the store's view in it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_allowance::{Allowance, AllowanceConfig, RetryBudgetConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// let config = AllowanceConfig::per_second(10, 5)?.with_retry_budget(RetryBudgetConfig::fixed(3));
    /// let allowance = Allowance::new(config);
    /// allowance.extend_cooldown(Duration::from_secs(2)).await?; // what a 429's Retry-After: 2 does
    /// let snapshot = allowance.refresh().await?;
    /// assert_eq!(snapshot.cooling_for, Some(Duration::from_secs(2)));
    /// assert_eq!(snapshot.retries_remaining, Some(3));
    /// assert!(snapshot.closed.is_none());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn refresh(&self) -> Result<Snapshot, StoreError> {
        let state = self.read_store().await?;
        let mut snapshot = self.snapshot();
        snapshot.cooling_for = (!state.blocked_for.is_zero()).then_some(state.blocked_for);
        snapshot.closed = state.closed.zip(state.closed_by).map(|(reopens_in, by)| {
            let reason = AbandonReason::closed_by(by);
            ClosedState { reopens_in, reason }
        });
        snapshot.retries_remaining = state.retries_remaining;
        snapshot.adaptive_rate = (state.rate_milli > 0).then(|| state.rate_milli as f64 / 1000.0);
        Ok(snapshot)
    }

    async fn read_store(&self) -> Result<StoreState, StoreError> {
        let deposits = self.shared.take_deposits();
        match self.shared.apply_async(Op::Read { deposits }).await {
            Ok(Reply::State(state)) => {
                if let Some(until) = Instant::now().checked_add(state.blocked_for) {
                    self.shared.holders().learn_cooldown(until);
                }
                let waiting = self.shared.holders().waiting();
                self.shared.stats().metrics.state(&state, waiting);
                Ok(state)
            }
            Ok(_) => Err(StoreError::protocol(WrongReply)),
            Err(e) => {
                self.shared.restore_deposits(deposits);
                Err(e)
            }
        }
    }

    /// This process's counters and its last view of the shared state.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::of(&self.shared)
    }

    /// A throttling response arrived; `with_delay` when it carried a usable delay.
    #[cfg(not(feature = "quota"))]
    pub(crate) fn on_throttled(&self, _with_delay: bool) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_clone_share_state() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let a = Allowance::new(AllowanceConfig::per_second(1, 1).expect("valid"));
            let b = a.clone();
            a.acquire().await.expect("admitted");
            assert_eq!(b.snapshot().admitted, 1);
            assert!(format!("{a:?}").contains("Allowance"));
        });
    }

    /// A store that, like the Redis store, can hear an event (or be told to catch up) on
    /// another thread the moment it is watched: here it does so at once, inside `watch`.
    #[derive(Debug, Default)]
    struct EagerStore {
        inner: crate::store::MemoryStore,
        watchers: std::sync::Mutex<Vec<crate::store::Watcher>>,
        alive_when_watched: std::sync::Mutex<Vec<bool>>,
    }

    impl crate::store::Store for std::sync::Arc<EagerStore> {
        fn apply(
            &self,
            params: &crate::store::Params,
            op: crate::store::Op,
        ) -> crate::store::StoreFuture<crate::store::Reply> {
            self.inner.apply(params, op)
        }

        fn watch(&self, watcher: crate::store::Watcher) {
            // What a store does with every watcher on each delivery: keep it while alive.
            let alive = watcher.resync();
            self.alive_when_watched
                .lock()
                .expect("not poisoned")
                .push(alive);
            if alive {
                self.watchers.lock().expect("not poisoned").push(watcher);
            }
        }
    }

    /// Regression: the watcher was handed to the store while the allowance was still being
    /// built (not yet alive), so a store delivering at once dropped it, and that process
    /// never heard another process's cooldown (a FLUSHALL test sent inside cooldowns).
    #[test]
    fn the_store_watches_an_allowance_that_is_alive() {
        let store = std::sync::Arc::new(EagerStore::default());
        let allowance = Allowance::builder(AllowanceConfig::per_second(1, 1).expect("valid"))
            .store(store.clone())
            .build();
        assert_eq!(
            *store.alive_when_watched.lock().expect("not poisoned"),
            [true]
        );
        assert_eq!(store.watchers.lock().expect("not poisoned").len(), 1);
        drop(allowance);
        assert!(!store.watchers.lock().expect("not poisoned")[0].is_alive());
    }
}
