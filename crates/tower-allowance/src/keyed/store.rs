//! Stores per key, and what the registry learns from them to evict safely.

use std::{
    convert::Infallible,
    fmt,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
};

use tokio::time::Instant;

use crate::{
    rule::{
        Admission, BudgetParams, Deferred, EventKind, Op, Params, ProbeOutcome, Reply,
        BUDGET_SLOTS, FOREVER,
    },
    store::{MemoryStore, Store, StoreError, StoreFuture, Watcher},
    Allowance, AllowanceConfig, BoxError,
};

/// Makes the store of each key's allowance (see [`KeyedBuilder::stores`](super::KeyedBuilder::stores)).
///
/// The default, [`MemoryStores`], keeps each key's state in this process. Any function
/// `Fn(&str) -> Result<S, E>` from a name to a [`Store`] is a factory too; wrap it in
/// [`SharedStores`] when its stores keep their state outside the handle (Redis), which lets
/// the registry evict sooner.
///
/// The name given is derived from the key by a keyed hash (`{prefix}:{32 hex digits}`,
/// see [`KeySecret`](super::KeySecret)), never the key itself, so a store may use it in
/// its keys, channels and logs.
pub trait StoreFactory: Send + Sync + 'static {
    /// The store type.
    type Store: Store;
    /// What making one can fail with.
    type Error: Into<BoxError>;

    /// A store for the allowance called `name`.
    ///
    /// # Errors
    ///
    /// The factory's own (an invalid name, say); the request that needed the store fails with
    /// it, as the source of a [`KeyedError`](super::KeyedError).
    fn make(&self, name: &str) -> Result<Self::Store, Self::Error>;

    /// Whether a store made again for the same name finds the state the previous one left
    /// (a store over shared state such as Redis). Default `false`.
    ///
    /// When `true`, an allowance is evicted as soon as nothing in this process uses it: its
    /// cooldown, buckets and budget stay in the shared store for the next handle. When
    /// `false`, evicting drops the state, so the registry also waits until a fresh state would
    /// be no more permissive (see [`keyed`](super#eviction)). Saying `true` of a store whose
    /// state dies with the handle lets evictions reset buckets early.
    fn state_outlives_store(&self) -> bool {
        false
    }
}

/// Each key's state in this process's memory: a new [`MemoryStore`] per key (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStores;

impl StoreFactory for MemoryStores {
    type Store = MemoryStore;
    type Error = Infallible;

    fn make(&self, _name: &str) -> Result<MemoryStore, Infallible> {
        Ok(MemoryStore::new())
    }
}

impl<F, S, E> StoreFactory for F
where
    F: Fn(&str) -> Result<S, E> + Send + Sync + 'static,
    S: Store,
    E: Into<BoxError>,
{
    type Store = S;
    type Error = E;

    fn make(&self, name: &str) -> Result<S, E> {
        self(name)
    }
}

/// A factory whose stores keep their state outside the handle, shared by every process
/// that names the same allowance (Redis): [`StoreFactory::state_outlives_store`] is `true`.
///
/// For Redis: `SharedStores(move |name: &str| base.for_allowance(name))`, with `base` a
/// connected `RedisStore` (one connection for every key). Below, stores kept in a map that
/// outlives each handle, which is what Redis does across processes:
///
/// ```
/// use std::{collections::HashMap, convert::Infallible, sync::{Arc, Mutex}};
/// use tower_allowance::keyed::{KeySecret, Keyed, KeyedConfig, SharedStores};
/// use tower_allowance::{store::MemoryStore, AllowanceConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// let kept: Arc<Mutex<HashMap<String, Arc<MemoryStore>>>> = Arc::default();
/// let keyed = Keyed::builder(KeyedConfig::new(AllowanceConfig::per_second(10, 10)?))
///     .secret(KeySecret::derive(b"32 bytes from the secret manager..")?)
///     .stores(SharedStores(move |name: &str| {
///         let mut kept = kept.lock().map_err(|_| "poisoned")?;
///         Ok::<_, &str>(kept.entry(name.to_owned()).or_default().clone())
///     }))
///     .build()?;
/// keyed.get("k")?.allowance().acquire().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SharedStores<F>(pub F);

impl<F: StoreFactory> StoreFactory for SharedStores<F> {
    type Store = F::Store;
    type Error = F::Error;

    fn make(&self, name: &str) -> Result<F::Store, F::Error> {
        self.0.make(name)
    }

    fn state_outlives_store(&self) -> bool {
        true
    }
}

/// A [`StoreFactory`] behind a trait object: the registry is not generic over it.
pub(crate) trait ErasedFactory: Send + Sync {
    /// The allowance called `name`, over a store from the factory; tracked (see [`Settle`])
    /// unless its state outlives it.
    fn allowance(
        &self,
        name: String,
        config: AllowanceConfig,
        settle: &Arc<Settle>,
    ) -> Result<Allowance, BoxError>;
    fn outlives(&self) -> bool;
    fn type_name(&self) -> &'static str;
}

pub(crate) struct Erased<F>(pub(crate) F);

impl<F: StoreFactory> ErasedFactory for Erased<F> {
    fn allowance(
        &self,
        name: String,
        config: AllowanceConfig,
        settle: &Arc<Settle>,
    ) -> Result<Allowance, BoxError> {
        let store = self.0.make(&name).map_err(Into::into)?;
        let builder = Allowance::builder(config).name(name);
        Ok(if self.0.state_outlives_store() {
            builder.store(store).build()
        } else {
            builder
                .store(Tracked {
                    inner: store,
                    settle: settle.clone(),
                })
                .build()
        })
    }

    fn outlives(&self) -> bool {
        self.0.state_outlives_store()
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<F>()
    }
}

// === Settle ===

/// When a key's state, kept only in its store, becomes indistinguishable from a fresh one:
/// a conservative bound learned from every reply of the store (see the module docs of
/// [`keyed`](super#eviction)).
///
/// Times are microseconds since the registry's epoch, on tokio's clock.
pub(crate) struct Settle {
    epoch: Instant,
    /// The longest `burst * interval` of the allowance's limits.
    max_tolerance_us: u64,
    budget: BudgetParams,
    /// No reservation, bucket lead or cooldown outlasts this instant.
    quiet_until: AtomicU64,
    /// A fixed retry budget has been spent from: never evicted.
    spent_fixed_budget: AtomicBool,
    closure: Mutex<Closure>,
}

#[derive(Clone, Copy, Default)]
struct Closure {
    /// Closed until this instant ([`FOREVER`]: until cleared); 0 when open.
    until: u64,
    /// The epoch of the latest closing event applied.
    epoch: u64,
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settle")
            .field("quiet_until_us", &self.quiet_until.load(Ordering::Relaxed))
            .field(
                "spent_fixed_budget",
                &self.spent_fixed_budget.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl Settle {
    pub(crate) fn new(epoch: Instant, params: &Params) -> Self {
        let max_tolerance_us = params
            .limits()
            .iter()
            .map(|l| l.tolerance_us())
            .max()
            .unwrap_or(0);
        Self {
            epoch,
            max_tolerance_us,
            budget: params.budget(),
            quiet_until: AtomicU64::new(0),
            spent_fixed_budget: AtomicBool::new(false),
            closure: Mutex::new(Closure::default()),
        }
    }

    #[inline]
    pub(crate) fn micros(&self, now: Instant) -> u64 {
        let d = now.saturating_duration_since(self.epoch);
        d.as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(d.subsec_micros()))
    }

    /// Whether a fresh state would be no more permissive than this one at `now_us`.
    pub(crate) fn settled(&self, now_us: u64) -> bool {
        if self.spent_fixed_budget.load(Ordering::Acquire) {
            return false;
        }
        let closed_until = self
            .closure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .until;
        self.quiet_until.load(Ordering::Acquire) <= now_us && closed_until <= now_us
    }

    /// Raises the bound to `until` (max semantics). A read first: admissions within the same
    /// microsecond (a hot key) then leave the shared word alone.
    #[inline]
    fn quiet_at_least(&self, until: u64) {
        if self.quiet_until.load(Ordering::Acquire) < until {
            self.quiet_until.fetch_max(until, Ordering::AcqRel);
        }
    }

    /// Records what `reply` to `op` at `now` says about the state.
    #[inline]
    fn observe(&self, now: Instant, op: &Op, reply: &Reply) {
        let now_us = self.micros(now);
        match (op, reply) {
            (Op::Admit(req), Reply::Admit(admission)) => {
                let slot = match admission {
                    // After an admission at `t`, every limit's theoretical arrival time is at
                    // most `t + burst * interval`: from then on the bucket is full again.
                    Admission::Admitted => now_us,
                    Admission::Reserved { wait, .. } => {
                        now_us.saturating_add(crate::rule::micros_ceil(*wait).unwrap_or(FOREVER))
                    }
                    Admission::Closed { until, .. } => {
                        let until = until.map_or(FOREVER, |d| {
                            now_us.saturating_add(crate::rule::micros_ceil(d).unwrap_or(FOREVER))
                        });
                        self.close(until, None);
                        return;
                    }
                    _ => return,
                };
                self.quiet_at_least(slot.saturating_add(self.max_tolerance_us));
                if req.is_retry() {
                    self.spent_retry(slot);
                }
            }
            (Op::Defer { .. }, Reply::Defer(deferred)) => self.deferred(now_us, deferred),
            (Op::Close { delay_us, .. }, Reply::Changed(event)) => {
                let until = delay_us.map_or(FOREVER, |d| now_us.saturating_add(d));
                self.close(until, Some(event.epoch()));
            }
            (Op::Clear, Reply::Changed(event)) => {
                if let EventKind::Cleared = event.kind() {
                    let mut c = self.closure.lock().unwrap_or_else(PoisonError::into_inner);
                    if event.epoch() > c.epoch {
                        *c = Closure {
                            until: 0,
                            epoch: event.epoch(),
                        };
                    }
                }
            }
            (
                Op::FinishProbe {
                    outcome: ProbeOutcome::Exhausted { retry_in },
                    ..
                },
                Reply::ProbeFinished(Some(event)),
            ) => {
                let until = crate::rule::micros_ceil(*retry_in)
                    .map_or(FOREVER, |d| now_us.saturating_add(d));
                self.close(until, Some(event.epoch()));
            }
            // A probe's backoff: keyed allowances have no quota probe, but be safe.
            (Op::FinishProbe { .. }, _) | (Op::Lease { .. }, Reply::Lease { granted: true }) => {
                self.quiet_at_least(FOREVER);
            }
            _ => {}
        }
    }

    fn spent_retry(&self, at_us: u64) {
        match self.budget {
            BudgetParams::Unlimited => {}
            // A fresh budget would have every retry back.
            BudgetParams::Fixed { .. } => self.spent_fixed_budget.store(true, Ordering::Release),
            // Out of the sliding window one window (and a slot of rounding) after it.
            BudgetParams::Replenishing { slot_us, .. } => {
                let window = slot_us.saturating_mul(BUDGET_SLOTS + 1);
                self.quiet_at_least(at_us.saturating_add(window));
            }
        }
    }

    fn deferred(&self, now_us: u64, d: &Deferred) {
        if let Some(closed) = d.closed {
            let until = closed.map_or(FOREVER, |c| {
                now_us.saturating_add(crate::rule::micros_ceil(c).unwrap_or(FOREVER))
            });
            self.close(until, d.event.map(|e| e.epoch()));
        }
        let blocked =
            now_us.saturating_add(crate::rule::micros_ceil(d.blocked_for).unwrap_or(FOREVER));
        let shift = match d.event.map(|e| e.kind()) {
            Some(EventKind::Cooldown { shift, .. }) => shift.iter().copied().max().unwrap_or(0),
            _ => 0,
        };
        // Pending schedules moved by `shift`: so did the bound on them.
        let mut cur = self.quiet_until.load(Ordering::Acquire);
        loop {
            let next = cur.saturating_add(shift).max(blocked);
            match self.quiet_until.compare_exchange_weak(
                cur,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
    }

    fn close(&self, until: u64, epoch: Option<u64>) {
        let mut c = self.closure.lock().unwrap_or_else(PoisonError::into_inner);
        c.until = c.until.max(until);
        if let Some(e) = epoch {
            c.epoch = c.epoch.max(e);
        }
    }
}

// === Tracked ===

/// A store whose replies teach a [`Settle`] when its state may be dropped.
struct Tracked<S> {
    inner: S,
    settle: Arc<Settle>,
}

impl<S: fmt::Debug> fmt::Debug for Tracked<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl<S: Store> Store for Tracked<S> {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        let fut = self.inner.apply(params, op);
        let settle = self.settle.clone();
        Box::pin(async move {
            let reply = fut.await?;
            // Observed after the store decided: later than its `now`, so every bound errs
            // on the late side.
            settle.observe(Instant::now(), &op, &reply);
            Ok(reply)
        })
    }

    #[inline]
    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        let result = self.inner.try_apply(now, params, op)?;
        if let Ok(reply) = &result {
            self.settle.observe(now, op, reply);
        }
        Some(result)
    }

    fn watch(&self, watcher: Watcher) {
        self.inner.watch(watcher);
    }
}
