use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::{cell::Cell, Event, Op, Params, Reply, Store, StoreError, StoreFuture, Watcher};
use crate::rule::{self, Deferred};

/// An allowance's state in this process: the rule applied atomically, on tokio's clock.
///
/// Paused-time tests drive it exactly. A first attempt on a one-limit allowance is
/// lock-free (one compare-and-swap on a word holding the token bucket and the event epoch,
/// two loads) and allocates nothing; everything else (retries against a budget, several
/// limits, cooldowns, releases, quota probes) takes one short lock and applies
/// [`State::apply`](super::State::apply). See `cell.rs` for why the two agree.
///
/// Several allowances in one process (one per Tokio runtime, say) can share one memory store
/// through an `Arc`: each hears the others' cooldowns, closures and settlements through
/// [`Store::watch`].
///
/// # Clone
///
/// Not `Clone`: share it by sharing the [`Allowance`](crate::Allowance) that owns it, or an
/// `Arc<MemoryStore>`.
#[derive(Debug)]
pub struct MemoryStore {
    epoch: Instant,
    cell: Cell,
    watchers: Mutex<Vec<Watcher>>,
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
            watchers: Mutex::new(Vec::new()),
        }
    }

    /// Microseconds from creation to `now`: `u64` arithmetic (584,000 years), saturating.
    #[inline]
    fn micros(&self, now: Instant) -> u64 {
        let d = now.saturating_duration_since(self.epoch);
        let us = u64::from(d.subsec_micros());
        d.as_secs().saturating_mul(1_000_000).saturating_add(us)
    }

    /// Applies `op` and tells every watcher of the event it caused, if any.
    #[inline]
    fn decide(&self, now: Instant, params: &Params, op: &Op) -> Reply {
        let reply = self.cell.apply(self.micros(now), &params.0, &op.0);
        if let Some(event) = event_of(&reply) {
            self.publish(Event(event));
        }
        Reply(reply)
    }

    /// The watchers, through a poisoned lock too (a list stays valid).
    fn watchers(&self) -> MutexGuard<'_, Vec<Watcher>> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, event: Event) {
        let watchers: Vec<Watcher> = self.watchers().clone();
        let mut gone = false;
        for w in &watchers {
            gone |= !w.notify(event);
        }
        if gone {
            self.watchers().retain(Watcher::is_alive);
        }
    }
}

/// The event a reply carries, if any.
fn event_of(reply: &rule::Reply) -> Option<rule::Event> {
    match *reply {
        rule::Reply::Defer(Deferred { event, .. }) => event,
        #[cfg(feature = "quota")]
        rule::Reply::ProbeFinished(event) => event,
        #[cfg(feature = "settle")]
        rule::Reply::Settled(settled) => settled.event,
        rule::Reply::Changed(event) => Some(event),
        #[cfg(feature = "shares")]
        rule::Reply::Share(ref share) => share.event,
        _ => None,
    }
}

impl Store for MemoryStore {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        let reply = self.decide(Instant::now(), params, &op);
        Box::pin(std::future::ready(Ok(reply)))
    }

    #[inline]
    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        Some(Ok(self.decide(now, params, op)))
    }

    fn is_settled(&self, now: Instant, params: &Params) -> bool {
        self.cell.is_settled(self.micros(now), &params.0)
    }

    fn watch(&self, watcher: Watcher) {
        let mut watchers = self.watchers();
        watchers.retain(Watcher::is_alive);
        watchers.push(watcher);
    }
}
