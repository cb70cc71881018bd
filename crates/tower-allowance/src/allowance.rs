//! The shared handle: one allowance, however many clones.

use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::{
    acquire::{Acquire, WaitQueue},
    algorithm,
    error::{AbandonReason, UnrepresentableDelay},
    quota::{QuotaGuard, QuotaProbe, QuotaTrigger},
    store::{cell::Padded, Deferred, MemoryStore, Store, StoreError, StoreState},
    AllowanceConfig,
};

/// One shared allowance: what one credential (one API key, one provider bucket) may spend.
///
/// It holds the token bucket, the cooldown deadline, the retry budget and a bounded FIFO
/// wait queue. Every layer built from it, and every clone of it, spends the same allowance.
///
/// # Clone
///
/// Cloning is cheap (an `Arc`) and never creates a new bucket: all clones share one state.
/// Build one `Allowance` per credential and hand clones to every service that uses it.
///
/// # Runtime
///
/// Waiting uses Tokio timers: the wait queue's one shared timer is created on the runtime
/// of the first caller that has to wait. Use an allowance from one Tokio runtime (any
/// number of its worker threads); to coordinate several runtimes or processes, give each
/// its own `Allowance` over one shared [`Store`] (such as Redis).
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

pub(crate) struct Shared {
    pub(crate) config: AllowanceConfig,
    pub(crate) backend: Backend,
    pub(crate) queue: WaitQueue,
    pub(crate) stats: Stats,
    /// Seeds per-request jitter streams so that concurrent retries do not share one.
    pub(crate) jitter_seq: AtomicU64,
    /// The terminal path, when a quota probe is configured.
    pub(crate) quota: Option<QuotaGuard>,
}

// One per allowance, behind its `Arc`: boxing the memory store would add a pointer chase
// to every admission to save a few hundred bytes once.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    /// Called directly: no boxing, no allocation on the fast path.
    Memory(MemoryStore),
    /// A shared store, through its boxed futures (an I/O path).
    Custom(Arc<dyn Store>),
}

impl fmt::Debug for Allowance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let store: &dyn fmt::Debug = match &self.shared.backend {
            Backend::Memory(m) => m,
            Backend::Custom(s) => s,
        };
        f.debug_struct("Allowance")
            .field("config", &self.shared.config)
            .field("store", store)
            .field("waiting", &self.shared.queue.len())
            .finish()
    }
}

impl Allowance {
    /// An allowance kept in this process's memory.
    pub fn new(config: AllowanceConfig) -> Self {
        Self::builder(config).build()
    }

    /// A builder, to add a shared store or a quota probe.
    pub fn builder(config: AllowanceConfig) -> AllowanceBuilder {
        AllowanceBuilder {
            config,
            store: None,
            quota: None,
        }
    }

    /// An allowance kept in a shared [`Store`], such as Redis, so that several processes
    /// spend one allowance. The wait queue stays local: it orders this process's callers.
    pub fn with_store(config: AllowanceConfig, store: impl Store) -> Self {
        Self::builder(config).store(store).build()
    }

    /// Lifts the quota-exhausted state now (for example after buying more credits).
    pub fn reset_quota(&self) {
        if let Some(q) = &self.shared.quota {
            q.reset();
        }
    }

    /// How many times the quota probe has run.
    pub fn quota_probes(&self) -> u64 {
        self.shared.quota.as_ref().map_or(0, QuotaGuard::probes)
    }

    /// A throttling response arrived; `with_delay` when it carried a usable `Retry-After`.
    pub(crate) fn on_throttled(&self, with_delay: bool) {
        let Some(q) = &self.shared.quota else {
            return;
        };
        if with_delay {
            q.clear_streak();
            return;
        }
        let Some(probe) = q.throttled_without_delay(Instant::now()) else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            // No runtime to run the probe on: release the single flight.
            q.finish(
                Instant::now(),
                Err("no tokio runtime to run the quota probe".into()),
            );
            return;
        };
        let this = self.clone();
        handle.spawn(async move {
            let result = probe.probe().await;
            let Some(q) = &this.shared.quota else {
                return;
            };
            if let crate::quota::Verdict::Exhausted(until) = q.finish(Instant::now(), result) {
                this.shared.queue.wake_all();
                tracing::debug!(until = ?until, "allowance closed: quota exhausted");
            }
        });
    }

    /// A response that was not throttling.
    pub(crate) fn on_not_throttled(&self) {
        if let Some(q) = &self.shared.quota {
            q.clear_streak();
        }
    }

    /// The configuration this allowance was built from.
    pub fn config(&self) -> &AllowanceConfig {
        &self.shared.config
    }

    /// Waits for admission of one first attempt: first for the cooldown, then for a token.
    ///
    /// Waiters are admitted in arrival order. Dropping the future leaves the queue and
    /// spends nothing.
    pub fn acquire(&self) -> Acquire {
        self.acquire_with(AcquireOptions::default())
    }

    /// Waits for admission with a deadline and/or as a retry that spends the budget.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tower_allowance::{error::AbandonReason, AcquireOptions, Allowance, AllowanceConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let allowance = Allowance::new(AllowanceConfig::per_second(1, 1)?);
    /// allowance.defer(Duration::from_secs(30)).await?;
    ///
    /// // The cooldown ends after the deadline: fail now, don't wait and then fail.
    /// let deadline = Instant::now() + Duration::from_secs(10);
    /// let err = allowance
    ///     .acquire_with(AcquireOptions::new().deadline(deadline))
    ///     .await
    ///     .unwrap_err();
    /// assert_eq!(err.abandon_reason(), Some(AbandonReason::Deadline));
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_with(&self, options: AcquireOptions) -> Acquire {
        Acquire::new(self.shared.clone(), options)
    }

    /// Raises the shared cooldown to at least `delay` from now: no admission before then.
    ///
    /// The deadline only ever moves later; a shorter delay than the current one changes
    /// nothing. Waiters whose deadline falls before the new cooldown end fail promptly.
    ///
    /// # Errors
    ///
    /// [`UnrepresentableDelay`] when `delay` exceeds [`MAX_DELAY`](crate::MAX_DELAY)
    /// (nothing is changed: the wait is never clamped shorter), or [`StoreError`] from a
    /// shared store.
    pub async fn defer(&self, delay: Duration) -> Result<Deferred, DeferError> {
        let delay_us = algorithm::micros_ceil(delay).ok_or_else(|| {
            DeferError::Unrepresentable(UnrepresentableDelay::new(format!("{delay:?}")))
        })?;
        let now = Instant::now();
        let deferred = match &self.shared.backend {
            Backend::Memory(m) => m.defer_at(now, delay_us),
            Backend::Custom(s) => s
                .defer(&self.shared.config, delay)
                .await
                .map_err(DeferError::Store)?,
        };
        self.after_defer(now, deferred);
        Ok(deferred)
    }

    /// The synchronous defer used by the cooldown layer with the memory store.
    pub(crate) fn defer_now(&self, delay_us: u64) -> Option<Deferred> {
        match &self.shared.backend {
            Backend::Memory(m) => {
                let now = Instant::now();
                let deferred = m.defer_at(now, delay_us);
                self.after_defer(now, deferred);
                Some(deferred)
            }
            Backend::Custom(_) => None,
        }
    }

    pub(crate) fn after_defer(&self, now: Instant, deferred: Deferred) {
        if deferred.extended {
            self.shared.stats.deferred.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(blocked_for = ?deferred.blocked_for, "allowance cooldown extended");
        }
        if let Some(until) = now.checked_add(deferred.blocked_for) {
            self.shared.queue.cooldown_until(until);
        }
    }

    /// Records a successful request, replenishing a [`Replenishing`](crate::RetryBudgetConfig::Replenishing)
    /// budget. A no-op for other budgets.
    pub(crate) fn record_success(&self) {
        if !matches!(
            self.shared.config.retry_budget(),
            crate::RetryBudgetConfig::Replenishing(_)
        ) {
            return;
        }
        match &self.shared.backend {
            Backend::Memory(m) => m.deposit_now(&self.shared.config),
            Backend::Custom(s) => {
                let fut = s.deposit(&self.shared.config);
                // Deposits are advisory: a lost one only makes the budget more conservative.
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    handle.spawn(async move {
                        if let Err(e) = fut.await {
                            tracing::debug!(error = %e, "retry budget deposit failed");
                        }
                    });
                }
            }
        }
    }

    /// Whether a retry could spend from the budget now (advisory: the spend itself happens
    /// atomically at admission). Shared stores answer `true` and let admission decide.
    pub(crate) fn retry_budget_left(&self) -> bool {
        match &self.shared.backend {
            Backend::Memory(m) => m.state_now(&self.shared.config).retries_remaining != Some(0),
            Backend::Custom(_) => true,
        }
    }

    /// Reads the store's shared state: cooldown remaining and retry budget left.
    ///
    /// # Errors
    ///
    /// A shared store's failure.
    pub async fn store_state(&self) -> Result<StoreState, StoreError> {
        match &self.shared.backend {
            Backend::Memory(m) => Ok(m.state_now(&self.shared.config)),
            Backend::Custom(s) => s.state(&self.shared.config).await,
        }
    }

    /// This process's counters and the last rate-limit headers observed.
    pub fn snapshot(&self) -> Snapshot {
        let s = &self.shared.stats;
        let mut abandoned = AbandonedCounts::default();
        for (slot, counter) in abandoned.0.iter_mut().zip(&s.abandoned) {
            *slot = counter.load(Ordering::Relaxed);
        }
        let (admitted, waited, retries_spent) = s.admissions.totals();
        Snapshot {
            admitted,
            waited,
            deferred: s.deferred.load(Ordering::Relaxed),
            retries_spent,
            abandoned,
            waiting: self.shared.queue.len(),
            rate_limit: s
                .rate_limit
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    pub(crate) fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    pub(crate) fn next_jitter_seed(&self) -> u64 {
        self.shared.jitter_seq.fetch_add(1, Ordering::Relaxed)
    }
}

/// Builds an [`Allowance`] with a shared store and/or a quota probe.
///
/// ```
/// use tower_allowance::{store::MemoryStore, Allowance, AllowanceConfig};
///
/// let allowance = Allowance::builder(AllowanceConfig::per_second(5, 1)?)
///     .store(MemoryStore::new())
///     .build();
/// # let _ = allowance;
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct AllowanceBuilder {
    config: AllowanceConfig,
    store: Option<Arc<dyn Store>>,
    quota: Option<QuotaGuard>,
}

impl AllowanceBuilder {
    /// Keeps the state in a shared [`Store`] instead of this process's memory.
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// Adds the quota-exhaustion terminal path (see [`quota`](crate::quota)).
    pub fn quota_probe(mut self, probe: impl QuotaProbe, trigger: QuotaTrigger) -> Self {
        self.quota = Some(QuotaGuard::new(Arc::new(probe), trigger));
        self
    }

    /// Builds the allowance.
    pub fn build(self) -> Allowance {
        let backend = match self.store {
            Some(store) => Backend::Custom(store),
            None => Backend::Memory(MemoryStore::new()),
        };
        Allowance {
            shared: Arc::new(Shared {
                queue: WaitQueue::new(self.config.max_waiters()),
                config: self.config,
                backend,
                stats: Stats::default(),
                jitter_seq: AtomicU64::new(0),
                quota: self.quota,
            }),
        }
    }
}

/// Why [`Allowance::defer`] failed.
#[derive(Debug)]
pub enum DeferError {
    /// The delay is longer than [`MAX_DELAY`](crate::MAX_DELAY).
    Unrepresentable(UnrepresentableDelay),
    /// The shared store failed.
    Store(StoreError),
}

impl fmt::Display for DeferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unrepresentable(e) => e.fmt(f),
            Self::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for DeferError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unrepresentable(e) => Some(e),
            Self::Store(e) => Some(e),
        }
    }
}

/// Options for one admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    pub(crate) deadline: Option<Instant>,
    pub(crate) spend_retry: bool,
}

impl AcquireOptions {
    /// A first attempt without a deadline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fail with [`AbandonReason::Deadline`] rather than be admitted after `deadline`.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// This attempt is a retry: spend one unit of the retry budget when admitted.
    pub fn retry(mut self, spend_retry: bool) -> Self {
        self.spend_retry = spend_retry;
        self
    }
}

/// Counters kept by this process.
#[derive(Default)]
pub(crate) struct Stats {
    /// Written on every admission: striped, so concurrent threads do not share a line.
    pub(crate) admissions: Admissions,
    pub(crate) deferred: AtomicU64,
    pub(crate) abandoned: [AtomicU64; AbandonReason::ALL.len()],
    pub(crate) rate_limit: Mutex<Option<RateLimitObservation>>,
}

/// Slots of the admission counters owned by one thread each; later threads share one more.
const OWNED_SLOTS: usize = 8;

/// Admission counters in cache-line-padded slots, summed by [`Allowance::snapshot`].
///
/// Up to [`OWNED_SLOTS`] live threads each own a slot (handed on when the thread exits):
/// one writer, so a plain load and store (no locked read-modify-write, no line shared with
/// another writer). Threads beyond those share the last slot with `fetch_add`. So two
/// threads admitting at once write two different lines instead of bouncing one between
/// their caches. (1.1 KiB per allowance.)
#[derive(Default)]
pub(crate) struct Admissions {
    slots: [Padded<AdmissionSlot>; OWNED_SLOTS + 1],
}

#[derive(Default)]
struct AdmissionSlot {
    admitted: AtomicU64,
    waited: AtomicU64,
    retries_spent: AtomicU64,
}

impl Admissions {
    /// Counts one admission.
    #[inline]
    pub(crate) fn record(&self, waited: bool, retry: bool) {
        let id = thread_slot();
        let slot = &self.slots[id.min(OWNED_SLOTS)].0;
        let add = |counter: &AtomicU64| {
            if id < OWNED_SLOTS {
                // This thread is the slot's only writer: nothing can land in between.
                let n = counter.load(Ordering::Relaxed);
                counter.store(n.wrapping_add(1), Ordering::Relaxed);
            } else {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        };
        add(&slot.admitted);
        if waited {
            add(&slot.waited);
        }
        if retry {
            add(&slot.retries_spent);
        }
    }

    /// `(admitted, waited, retries_spent)` over all slots.
    fn totals(&self) -> (u64, u64, u64) {
        self.slots.iter().fold((0, 0, 0), |(a, w, r), slot| {
            let slot = &slot.0;
            (
                a.wrapping_add(slot.admitted.load(Ordering::Relaxed)),
                w.wrapping_add(slot.waited.load(Ordering::Relaxed)),
                r.wrapping_add(slot.retries_spent.load(Ordering::Relaxed)),
            )
        })
    }
}

/// This thread's slot number: below [`OWNED_SLOTS`] it is owned by this thread alone (in
/// every allowance) until the thread exits and hands it on; [`OWNED_SLOTS`] is the shared
/// slot, for threads beyond the first [`OWNED_SLOTS`] alive at once.
#[inline]
fn thread_slot() -> usize {
    thread_local! {
        static SLOT: SlotClaim = SlotClaim::claim();
    }
    // During thread teardown the claim may be gone already: use the shared slot.
    SLOT.try_with(|s| s.0).unwrap_or(OWNED_SLOTS)
}

/// Owned slot numbers handed back by exited threads.
static FREE_SLOTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// The next owned slot number never handed out.
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

/// A thread's claim on a slot number, returned when the thread exits. The hand-over goes
/// through the `FREE_SLOTS` mutex, so the next owner sees the last owner's stores.
struct SlotClaim(usize);

impl SlotClaim {
    fn claim() -> Self {
        let freed = FREE_SLOTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        Self(freed.unwrap_or_else(|| {
            // Saturates at OWNED_SLOTS: the shared slot.
            NEXT_SLOT
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_add(1).min(OWNED_SLOTS))
                })
                .unwrap_or(OWNED_SLOTS)
        }))
    }
}

impl Drop for SlotClaim {
    fn drop(&mut self) {
        if self.0 < OWNED_SLOTS {
            FREE_SLOTS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(self.0);
        }
    }
}

impl Stats {
    pub(crate) fn abandon(&self, reason: AbandonReason) {
        self.abandoned[reason.index()].fetch_add(1, Ordering::Relaxed);
        tracing::debug!(reason = reason.as_str(), "request abandoned");
    }
}

/// A point-in-time copy of an allowance's counters in this process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Attempts admitted (first tries and retries).
    pub admitted: u64,
    /// Of those, attempts that had to wait in the queue first.
    pub waited: u64,
    /// Times a response extended the cooldown.
    pub deferred: u64,
    /// Retries admitted (each spent one unit of budget, if the budget is limited).
    pub retries_spent: u64,
    /// Requests given up on, by reason.
    pub abandoned: AbandonedCounts,
    /// Callers waiting right now.
    pub waiting: usize,
    /// The last `X-RateLimit-*` headers seen on a response, if any.
    pub rate_limit: Option<RateLimitObservation>,
}

/// Abandonment counters by [`AbandonReason`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AbandonedCounts([u64; AbandonReason::ALL.len()]);

impl AbandonedCounts {
    /// The count for one reason.
    pub fn get(&self, reason: AbandonReason) -> u64 {
        self.0[reason.index()]
    }

    /// The sum over all reasons.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// The provider's own view, from `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
/// `X-RateLimit-Bucket` response headers.
///
/// `remaining` is approximate and shared by everyone using the key: it is an observation,
/// never a reservation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitObservation {
    /// `X-RateLimit-Limit`.
    pub limit: Option<u64>,
    /// `X-RateLimit-Remaining`.
    pub remaining: Option<u64>,
    /// `X-RateLimit-Bucket`.
    pub bucket: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_stay_exact_as_threads_come_and_go() {
        let counts = Arc::new(Admissions::default());
        // Far more threads over time than slots, a few alive at once: all counted exactly.
        for _ in 0..(OWNED_SLOTS * 4) {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let counts = counts.clone();
                    std::thread::spawn(move || {
                        for _ in 0..100 {
                            counts.record(false, false);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("thread");
            }
        }
        assert_eq!(counts.totals().0, (OWNED_SLOTS * 4 * 2 * 100) as u64);
    }

    #[test]
    fn admission_counts_are_exact_across_more_threads_than_slots() {
        let counts = Arc::new(Admissions::default());
        let threads: Vec<_> = (0..OWNED_SLOTS * 2 + 3)
            .map(|i| {
                let counts = counts.clone();
                std::thread::spawn(move || {
                    for n in 0..1_000 {
                        counts.record(n % 2 == 0, i % 3 == 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let threads = (OWNED_SLOTS * 2 + 3) as u64;
        let retrying = (0..threads).filter(|i| i % 3 == 0).count() as u64;
        assert_eq!(
            counts.totals(),
            (threads * 1_000, threads * 500, retrying * 1_000)
        );
    }

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
}
