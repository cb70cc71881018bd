//! What every clone of an [`Allowance`](crate::Allowance) and every future it creates shares,
//! behind one `Arc`: the configuration, the store, this process's holders and counters.
//!
//! The handle (`allowance/`) and the admission future (`acquire.rs`) both depend on this
//! module and not on each other.

use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use tokio::time::Instant;

use crate::{
    error::{AbandonReason, Exhausted},
    rule::{Deferred, Event, Op, Reply, Reservation},
    store::{EventSink, Store, StoreError, StoreFuture},
    AllowanceConfig,
};

pub(crate) mod holders;
pub(crate) mod metrics;
#[cfg(feature = "quota")]
pub(crate) mod probe;
pub(crate) mod stats;

pub(crate) use self::{holders::Holders, stats::Stats};

/// The state behind an allowance's `Arc`.
pub(crate) struct Shared {
    pub(crate) name: Arc<str>,
    pub(crate) config: AllowanceConfig,
    pub(crate) store: Box<dyn Store>,
    pub(crate) holders: Arc<Holders>,
    pub(crate) stats: Stats,
    /// Successes not yet recorded in the store: they travel with the next admission.
    pub(crate) pending_deposits: AtomicU64,
    /// Seeds per-request jitter streams so that concurrent retries do not share one.
    pub(crate) jitter_seq: AtomicU64,
    /// The rate a server last advertised, as last told to the store (thousandths per second).
    pub(crate) advertised: AtomicU64,
    /// Whether an untrusted `Date` has been warned about (once; later ones at debug).
    pub(crate) warned_date: std::sync::atomic::AtomicBool,
    /// The quota probe, when configured.
    #[cfg(feature = "quota")]
    pub(crate) quota: Option<crate::quota::QuotaGuard>,
    /// Itself, weakly (for work that outlives a borrow, such as timing a store call).
    pub(crate) me: std::sync::Weak<Shared>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allowance")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("store", &self.store)
            .field("waiting", &self.holders.waiting())
            .finish_non_exhaustive()
    }
}

/// Where a store's watcher delivers other processes' events. Held weakly by the store.
pub(crate) struct Sink(pub(crate) std::sync::Weak<Shared>);

impl EventSink for Sink {
    fn event(&self, event: Event) {
        if let Some(shared) = self.0.upgrade() {
            shared.holders.event(event);
        }
    }

    fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }

    fn resync(&self) {
        // Events may have been lost (a subscription not yet there, or dropped): read the
        // state; every holder that has not heard of the latest epoch asks again.
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        if shared.holders.waiting() == 0 {
            // Nobody holds a slot an event could have moved: nothing to catch up with.
            return;
        }
        spawn(async move {
            let now = Instant::now();
            if let Ok(Reply::State(state)) = shared.apply_async(Op::Read { deposits: 0 }).await {
                let until = now.checked_add(state.blocked_for).unwrap_or(now);
                shared.holders.resync(state.generation, state.epoch, until);
            }
        });
    }
}

impl Shared {
    /// Applies `op`: synchronously when the store can, else through its future (timed, with
    /// the `metrics` feature).
    pub(crate) fn apply(&self, now: Instant, op: Op) -> Applying {
        match self.store.try_apply(now, self.config.params(), &op) {
            Some(result) => Applying::Done(result),
            None => {
                let fut = self.store.apply(self.config.params(), op);
                if !metrics::Metrics::enabled() {
                    return Applying::Pending(fut);
                }
                // A weak handle to this state, for a store call's timing.
                let this = self.me.clone();
                Applying::Pending(Box::pin(async move {
                    let started = Instant::now();
                    let result = fut.await;
                    if let Some(shared) = this.upgrade() {
                        shared.stats.metrics.store_call(
                            started.elapsed(),
                            result.as_ref().err().map(StoreError::kind),
                        );
                    }
                    result
                }))
            }
        }
    }

    /// Applies `op` and waits for the answer.
    pub(crate) async fn apply_async(&self, op: Op) -> Result<Reply, StoreError> {
        match self.apply(Instant::now(), op) {
            Applying::Done(result) => result,
            Applying::Pending(fut) => fut.await,
        }
    }

    /// Takes the successes waiting to travel with the next store call.
    pub(crate) fn take_deposits(&self) -> u64 {
        if self.pending_deposits.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.pending_deposits.swap(0, Ordering::AcqRel)
    }

    /// Puts back deposits whose store call failed.
    pub(crate) fn restore_deposits(&self, n: u64) {
        if n > 0 {
            self.pending_deposits.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// What a cooldown raise did, for this process: counters, holders, the known deadline.
    /// `asked`: what the server asked for, for the warning when it closed the allowance.
    pub(crate) fn after_defer(&self, now: Instant, deferred: &Deferred, asked: Option<&str>) {
        if deferred.extended {
            self.stats.deferred.fetch_add(1, Ordering::Relaxed);
            self.stats.metrics.cooldown(deferred.blocked_for);
            let (name, blocked_for) = (self.name.clone(), deferred.blocked_for);
            tracing::info!(allowance = &*name, ?blocked_for, "allowance cooling down");
            if let Some(until) = now.checked_add(deferred.blocked_for) {
                self.holders.learn_cooldown(until);
                // Its end, logged unless a longer cooldown replaced it (which logs its own).
                let holders = Arc::downgrade(&self.holders);
                spawn(async move {
                    tokio::time::sleep_until(until).await;
                    let known = holders.upgrade().and_then(|h| h.known().blocked_until);
                    if known == Some(until) {
                        tracing::info!(allowance = &*name, "allowance cooldown ended");
                    }
                });
            }
        }
        if let Some(closed) = deferred.closed {
            let by = crate::rule::ClosedBy::ServerDelay;
            let until = closed.and_then(|d| now.checked_add(d));
            self.holders.learn_closed(Exhausted::new(until, by));
            self.stats.metrics.closed(by);
            let at = closed.and_then(|d| crate::signals::wall_clock().checked_add(d));
            tracing::warn!(
                allowance = &*self.name,
                asked = asked.unwrap_or("?"),
                reopens_in = ?closed,
                reopens_at = %at.map_or("when cleared".into(), httpdate::fmt_http_date),
                "a server asked for a wait beyond max_cooldown: allowance closed"
            );
        }
        if let Some(event) = deferred.event {
            self.holders.event(event);
        }
    }

    /// The closure this process knows of, if it holds at `now`: every caller refused while
    /// it holds reports its reason, whatever its own deadline or `max_attempts`.
    pub(crate) fn closure(&self, now: Instant) -> Option<Exhausted> {
        let closed = self.holders.known().closed?;
        closed.until().is_none_or(|u| u > now).then_some(closed)
    }

    /// `reason`, or the reason of a closure that holds now (see [`Shared::closure`]).
    pub(crate) fn or_closed(&self, reason: AbandonReason) -> AbandonReason {
        self.closure(Instant::now()).map_or(reason, |e| e.reason())
    }

    /// A response's `Date` was not trusted: warn once per allowance.
    pub(crate) fn warn_untrusted_date(&self) {
        if self.warned_date.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                allowance = &*self.name,
                "response Date not trusted; local clock used"
            );
        } else {
            tracing::warn!(
                allowance = &*self.name,
                "a response's Date header is unparseable or too far from the local clock: \
                 its absolute times are measured against the local clock instead"
            );
        }
    }

    /// A server advertised its rate: tell the store when it changed (an adaptive rate is
    /// capped at it, or adopts it). Best effort, off the response's path.
    pub(crate) fn advertise(&self, rate_milli: u64) {
        if self.config.params().adaptive().is_none()
            || self.advertised.swap(rate_milli, Ordering::Relaxed) == rate_milli
        {
            return;
        }
        match self.apply(Instant::now(), Op::Advertise { rate_milli }) {
            Applying::Done(_) => {}
            Applying::Pending(fut) => spawn(fut),
        }
    }

    /// Gives a slot back whose holder left before using it (due at `at`): a slot the store
    /// cannot take back is kept for this process's next arrival ([`Holders::keep_spare`]).
    pub(crate) fn release(&self, reservation: Reservation, at: Instant) {
        let holders = self.holders.clone();
        let kept = move |r: Result<Reply, StoreError>| match r {
            Ok(Reply::Release { released: false }) => holders.keep_spare(reservation, at),
            Err(e) => tracing::debug!(error = %e, "could not release a reserved slot"),
            Ok(_) => {}
        };
        match self.apply(Instant::now(), Op::Release(reservation)) {
            Applying::Done(r) => kept(r),
            Applying::Pending(fut) => spawn(async move { kept(fut.await) }),
        }
    }
}

/// Runs `fut` on the current runtime, if there is one (best effort, like what it does).
fn spawn<F: std::future::Future<Output: Send> + Send + 'static>(fut: F) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(fut);
    }
}

/// A store call, answered or in flight.
pub(crate) enum Applying {
    Done(Result<Reply, StoreError>),
    Pending(StoreFuture<Reply>),
}
