//! What every clone of an [`Allowance`](crate::Allowance) and every future it creates shares,
//! behind one `Arc`: the configuration, the store, this process's holders and counters.
//!
//! The handle (`allowance/`) and the admission future (`acquire.rs`) both depend on this
//! module and not on each other. Its fields are private: everything goes through the methods
//! below, so what is shared, and how it changes, is said in one place.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
};

use tokio::time::Instant;

use crate::{
    classify::ServerDelay,
    error::{AbandonReason, Abandoned, Exhausted},
    rule::{ClosedBy, Deferred, Op, Reply, Reservation},
    store::{self, EventSink, Store, StoreError, StoreFuture, Watcher, WrongReply},
    AllowanceConfig,
};

#[cfg(feature = "shares")]
pub(crate) mod classes;
// The feature-only accessors (`keyed`, `dialects`), in a file the default build does not read.
#[cfg(any(feature = "keyed", feature = "dialects"))]
mod features;
pub(crate) mod holders;
pub(crate) mod metrics;
#[cfg(feature = "quota")]
pub(crate) mod probe;
pub(crate) mod stats;
#[cfg(feature = "metrics")]
mod timed;

pub(crate) use self::{holders::Holders, stats::Stats};

/// The state behind an allowance's `Arc`.
pub(crate) struct Shared {
    name: Arc<str>,
    config: AllowanceConfig,
    store: Box<dyn Store>,
    holders: Arc<Holders>,
    stats: Stats,
    /// Successes not yet recorded in the store: they travel with the next admission.
    pending_deposits: AtomicU64,
    /// Seeds per-request jitter streams so that concurrent retries do not share one.
    jitter_seq: AtomicU64,
    /// Numbers requests for the debug events (`Attempt::request`), from 1.
    requests: AtomicU64,
    /// The rate a server last advertised, as last told to the store (thousandths per second).
    advertised: AtomicU64,
    /// Whether an untrusted `Date` has been warned about (once; later ones at debug).
    warned_date: AtomicBool,
    /// The quota probe, when configured.
    #[cfg(feature = "quota")]
    quota: Option<crate::quota::QuotaGuard>,
    #[cfg(feature = "shares")]
    classes: classes::Gate,
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
struct Sink(std::sync::Weak<Shared>);

impl EventSink for Sink {
    fn event(&self, event: store::Event) {
        if let Some(shared) = self.0.upgrade() {
            shared.holders.event(event.0);
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

// === impl Shared ===

impl Shared {
    /// The state of a new allowance over `store`, watched by the store for other processes'
    /// events (weakly: the store never keeps the allowance alive).
    pub(crate) fn new(
        name: Arc<str>,
        mut config: AllowanceConfig,
        store: Box<dyn Store>,
        #[cfg(feature = "quota")] quota: Option<crate::quota::QuotaGuard>,
    ) -> Arc<Self> {
        if store.name().is_some() {
            config.shared_by_processes();
        }
        let stats = Stats::new(name.clone());
        #[cfg(feature = "metrics")]
        let store: Box<dyn Store> = Box::new(timed::Timed::new(store, stats.metrics.clone()));
        let holders = Arc::new(Holders::new(*config.rule_params()));
        let shared = Arc::new(Self {
            name,
            config,
            store,
            holders,
            stats,
            pending_deposits: AtomicU64::new(0),
            jitter_seq: AtomicU64::new(0),
            requests: AtomicU64::new(1),
            advertised: AtomicU64::new(0),
            warned_date: AtomicBool::new(false),
            #[cfg(feature = "quota")]
            quota,
            #[cfg(feature = "shares")]
            classes: classes::Gate::default(),
        });
        // Only once the allowance exists: a store drops a watcher whose allowance is not
        // alive, and an event (or the subscription's first catch-up) can arrive from another
        // thread at any moment after `watch`.
        let sink: Arc<dyn EventSink> = Arc::new(Sink(Arc::downgrade(&shared)));
        shared.store.watch(Watcher::new(sink));
        shared
    }

    /// The allowance's name, for logs and metrics.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn config(&self) -> &AllowanceConfig {
        &self.config
    }

    /// This process's holders of reserved slots.
    pub(crate) fn holders(&self) -> &Holders {
        &self.holders
    }

    /// This process's counters.
    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Applies `op`: synchronously when the store can, else through its future.
    pub(crate) fn apply(&self, now: Instant, op: Op) -> Applying {
        let (params, op) = (self.config.params(), store::Op(op));
        match self.store.try_apply(now, params, &op) {
            Some(result) => Applying::Done(result.map(|reply| reply.0)),
            None => Applying::Pending(Answer(self.store.apply(params, op))),
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

    /// A success: one more for a replenishing retry budget (it travels with the next store
    /// call), and the end of a quota probe's streak.
    pub(crate) fn succeeded(&self) {
        #[cfg(feature = "quota")]
        if let Some(q) = &self.quota {
            q.clear_streak();
        }
        if let crate::RetryBudgetConfig::Replenishing(_) = self.config.retry_budget() {
            self.pending_deposits.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A seed for one request's jitter stream (concurrent retries must not share one).
    pub(crate) fn next_jitter_seed(&self) -> u64 {
        self.jitter_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// A number for a request the debug events name (`Attempt::request`).
    pub(crate) fn next_request(&self) -> std::num::NonZeroU64 {
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        std::num::NonZeroU64::new(n).unwrap_or(std::num::NonZeroU64::MIN)
    }

    /// Counts a request given up on, and why.
    pub(crate) fn abandon(&self, reason: AbandonReason) {
        self.stats.abandon(reason);
    }

    /// Counts a throttling response (its status, for the metrics).
    pub(crate) fn throttled(&self, status: u16) {
        self.stats.metrics.throttled(status);
    }

    /// The store's answer to a cooldown raise (a throttling response's, an operator's), for
    /// this process: counters, holders, the known deadline. A failure is logged: the response
    /// is still delivered (losing it would be worse than a cooldown the other processes do
    /// not hear of). `asked`: what the server asked for, for the warning when it closed the
    /// allowance.
    pub(crate) fn recorded(
        &self,
        now: Instant,
        result: Result<Reply, StoreError>,
        asked: Option<&str>,
    ) {
        let e = match result {
            Ok(Reply::Defer(deferred)) => return self.after_defer(now, &deferred, asked),
            Ok(_) => StoreError::protocol(WrongReply),
            Err(e) => e,
        };
        let cause = std::error::Error::source(&e).map(ToString::to_string);
        tracing::warn!(allowance = self.name(), error = %e, ?cause, "could not record the cooldown in the allowance store");
    }

    /// What a cooldown raise did, for this process: counters, holders, the known deadline.
    pub(crate) fn after_defer(&self, now: Instant, deferred: &Deferred, asked: Option<&str>) {
        if deferred.extended {
            self.stats.deferred.fetch_add(1, Ordering::Relaxed);
            self.stats.metrics.cooldown(deferred.blocked_for);
            let (allowance, blocked_for) = (self.name(), deferred.blocked_for);
            tracing::info!(allowance, ?blocked_for, "allowance cooling down");
            if let Some(until) = now.checked_add(deferred.blocked_for) {
                // Its end is logged by the first admission after it (`Holders::ended`).
                self.holders.learn_cooldown(until);
            }
        }
        if let Some(closed) = deferred.closed {
            let by = ClosedBy::ServerDelay;
            let until = closed.and_then(|d| now.checked_add(d));
            self.holders.learn_closed(Exhausted::new(until, by));
            self.stats.metrics.closed(by);
            let at = closed.and_then(|d| crate::signals::wall_clock().checked_add(d));
            tracing::warn!(
                allowance = self.name(),
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

    /// One admission: at once, or after waiting `waited` for a reserved slot. The first
    /// admission after a cooldown's end logs it.
    #[inline]
    pub(crate) fn admitted(&self, now: Instant, waited: Option<std::time::Duration>, retry: bool) {
        self.stats.admitted(waited, retry);
        if self.holders.cooldown_ended(now) {
            tracing::info!(allowance = self.name(), "allowance cooldown ended");
        }
    }

    /// The closure this process knows of, if it holds at `now`: every caller refused while
    /// it holds reports its reason, whatever its own deadline or `max_attempts`.
    pub(crate) fn closure(&self, now: Instant) -> Option<Exhausted> {
        let closed = self.holders.known().closed?;
        closed.until().is_none_or(|u| u > now).then_some(closed)
    }

    /// An abandonment for `reason`, to come back when the wait the server `asked` for ends;
    /// or for a closure that holds now (see [`Shared::closure`]), until it reopens.
    pub(crate) fn or_closed(&self, reason: AbandonReason, asked: Option<ServerDelay>) -> Abandoned {
        let e = self.closure(Instant::now());
        let Some(ServerDelay::After(wait)) = asked.filter(|_| e.is_none()) else {
            return e.map_or(Abandoned::new(reason), |e| {
                Abandoned::until(e.reason(), e.until())
            });
        };
        Abandoned::until(reason, Instant::now().checked_add(wait))
    }

    /// A response's `Date` was not trusted: warn once per allowance.
    pub(crate) fn warn_untrusted_date(&self) {
        let allowance = self.name();
        if self.warned_date.swap(true, Ordering::Relaxed) {
            tracing::debug!(allowance, "response Date not trusted; local clock used");
        } else {
            tracing::warn!(
                allowance,
                "a response's Date header is unparseable or too far from the local clock: \
                 its absolute times are measured against the local clock instead"
            );
        }
    }

    /// A server advertised its rate: tell the store when it changed (an adaptive rate is
    /// capped at it, or adopts it). Best effort, off the response's path.
    pub(crate) fn advertise(&self, rate_milli: u64) {
        if self.config.rule_params().adaptive().is_none()
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
pub(crate) fn spawn<F: std::future::Future<Output: Send> + Send + 'static>(fut: F) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(fut);
    }
}

/// A store call, answered or in flight.
#[cfg_attr(feature = "shares", allow(clippy::large_enum_variant))]
pub(crate) enum Applying {
    Done(Result<Reply, StoreError>),
    Pending(Answer),
}

/// A store's answer in flight, as the rule's reply.
pub(crate) struct Answer(StoreFuture<store::Reply>);

impl std::future::Future for Answer {
    type Output = Result<Reply, StoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.0.as_mut().poll(cx).map(|r| r.map(|reply| reply.0))
    }
}
