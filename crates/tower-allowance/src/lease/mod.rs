//! Leases carved out of the shared bucket (feature `lease`): far fewer store calls than
//! admissions, and no overshoot.
//!
//! A [`LeaseStore`] wraps any [`Store`]. Instead of one store call per admission, it takes a
//! *lease*: several tokens of the shared bucket in one call, scheduled in the store exactly as
//! that many first attempts in a row would be, so that the bucket's bound holds whatever this
//! process does with them. It then admits locally, first come first served, each caller on
//! the next token's slot (now, or a reserved slot it sleeps to, like any reservation). When a
//! token's slot has passed unused it is dropped, never sent late; unused tokens at the tail of
//! the schedule go back to the bucket with the next call.
//!
//! The lease's size follows this process's measured rate: the admissions of the last
//! [`Lease::period`] (at least one token, at most [`MAX_LEASE`]), so that at a provider's
//! 2/s it is one call per admission as without a lease, and at high rates one call per
//! period. A new lease is taken when three quarters of the current one are spent, before the
//! callers need it.
//!
//! Everything else still holds: every event the store publishes (a cooldown, a closure, a
//! clearing, a lost state) is applied to the unused tokens at once, as to any reservation (a
//! cooldown moves them past its end; a closure drops them). Retries (they spend the shared
//! retry budget), requests of a cost above one, requests with a `not_before`, and allowances
//! with an adaptive rate go to the store as without a lease. With classes (feature `shares`)
//! the shares are applied inside the lease: a class's first attempt takes a leased token, in
//! the order the class queues give (weighted fair share, a high class first within its lead),
//! and the lease keeps the classes' virtual times for them (`lease/classes.rs`): the weights
//! hold inside each process. A high request within its lead takes this process's next token
//! when one is due within two intervals, else goes to the store and jumps its queue (the slot
//! after the one being served; every leased token moves on), carrying the virtual time this
//! lease admitted up to.
//!
//! The successes of the requests a lease admits reach a replenishing retry budget with its
//! next call (the rule's `GrantRequest::deposits`), as those of first attempts without a
//! lease reach it with the next admission, or with the next retry, which goes to the store
//! and takes them along: a retry is decided on every success admitted before it. A call the
//! store did not apply (an error, or refused as stale) leaves them for the next one; a call
//! given up unanswered ([below](#stale-calls)) may have been applied and takes them along: a
//! success may go uncounted, never counted twice (a retry granted too many).
//!
//! # Outages
//!
//! With [`Lease::local_fallback`], a store that does not answer does not stop admissions:
//! the process admits from its lease, then at its share of the rate: the rate divided by the
//! holders the store counted in its last window (a heartbeat every lease call carries), with
//! no burst, from where the store's schedule ends (the other holders' leased tokens still go
//! out; this holder estimates it from its last lease). It asks the store again in the
//! background. Its first answer charges the bucket with what the fleet may have sent at the
//! fallback's pace since that lease, capped at an empty bucket as of now, without waiting
//! for the other holders' calls (the rule's `GrantRequest::rejoin`),
//! then its own local slots still ahead. Until every holder of before has called again (or
//! for one holders' window), its leases are spaced at its share in the store, so that no
//! token is used late and the end of the pace makes no burst.
//!
//! # Stale calls
//!
//! Every lease call carries the instant, on the store's clock, after which it must not be
//! applied ([`Lease::call_timeout`] after it was sent, estimated from the last reply): a call
//! delayed past it (a partition, a paused server) is refused by the store unapplied, so it
//! reserves nothing for a caller that has gone. A call not answered in twice that time is
//! given up here (an outage, with the local fallback), whatever the store's own timeout.
//!
//! ```
//! use std::time::Duration;
//! use tower_allowance::{lease::{Lease, LeaseStore}, store::MemoryStore, Allowance, AllowanceConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let store = LeaseStore::new(MemoryStore::new(), Lease::auto());
//! let allowance = Allowance::with_store(AllowanceConfig::per_second(100, 10)?, store);
//! allowance.acquire().await?;
//! let fixed = Lease::fixed(20, Duration::from_millis(200))?;
//! assert_eq!(fixed.size(), Some(20));
//! # Ok(())
//! # }
//! ```

use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard, Weak},
    time::Duration,
};

use tokio::{sync::oneshot, time::Instant};

use crate::{
    rule::{self, Admission, Grant, GrantRequest, Reservation, HOLDER_WINDOW_US, MAX_LIMITS},
    store::{EventSink, Op, Params, Reply, Store, StoreError, StoreFuture, Watcher},
    ConfigError,
};

mod back;
#[cfg(feature = "shares")]
mod classes;
/// Without the `shares` feature a lease answers first attempts only.
#[cfg(not(feature = "shares"))]
#[path = "no_classes.rs"]
mod classes;
mod config;
mod local;
use back::{carry_deposits, give_back_on_drop, keep_deposits, keep_unapplied};
use classes::Classed;
pub use config::{Lease, MAX_LEASE};
use local::{admitted, admitted_at, Local, Outage, Served, Token, Waiting};

/// How late after its slot a token may still be used (a timer's lateness); later, it is
/// dropped: sent later, it could meet the next slots' requests at the upstream.
const TOKEN_GRACE: Duration = Duration::from_millis(2);

/// How often a process in an outage asks the store again.
const REJOIN_PROBE: Duration = Duration::from_millis(100);

/// `budget_slot` of a reservation made from a lease (a first attempt's is 0): its release
/// goes back to the lease, not to the store.
const FROM_LEASE: u64 = u64::MAX;

/// A [`Store`] that admits from leases of the store it wraps (see the [module](self)).
///
/// # Clone
///
/// Cheap: clones share the lease.
pub struct LeaseStore<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for LeaseStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<S> {
    store: Arc<S>,
    /// Gives the unused tail back when the last handle goes (made where `S: Store`).
    on_drop: Box<dyn Fn(&mut Local) + Send + Sync>,
    lease: Lease,
    local: Mutex<Local>,
}

// === impl LeaseStore ===

impl<S: Store> LeaseStore<S> {
    /// Wraps `store`: admissions come from leases of its bucket, as `lease` says.
    pub fn new(store: S, lease: Lease) -> Self {
        let store = Arc::new(store);
        let tail = store.clone();
        let on_drop = Box::new(move |local: &mut Local| give_back_on_drop(&*tail, local));
        Self {
            inner: Arc::new(Inner {
                store,
                on_drop,
                lease,
                local: Mutex::new(Local::default()),
            }),
        }
    }

    /// The lease settings.
    pub fn lease(&self) -> Lease {
        self.inner.lease
    }

    /// The store it wraps.
    pub fn inner(&self) -> &S {
        &self.inner.store
    }

    /// Lease calls made so far (each one store call).
    pub fn lease_calls(&self) -> u64 {
        self.inner.lock().calls
    }

    /// Tokens granted so far, and those dropped unused (their slot passed): the capacity
    /// this holder stranded.
    pub fn tokens_granted_and_expired(&self) -> (u64, u64) {
        let local = self.inner.lock();
        (local.granted, local.expired)
    }

    /// Time until the next unused token's slot (`None`: none held).
    pub fn next_token_in(&self) -> Option<Duration> {
        let local = self.inner.lock();
        let at = local.tokens.front()?.at;
        Some(at.saturating_duration_since(Instant::now()))
    }

    /// Unused tokens held now.
    pub fn tokens_held(&self) -> usize {
        self.inner.lock().tokens.len()
    }

    /// Whether the store is not answering and admissions are decided here, at the share.
    pub fn in_outage(&self) -> bool {
        self.inner.lock().outage.is_some()
    }

    /// The live holders the store counted at the last lease call (0: none yet).
    pub fn holders(&self) -> u64 {
        self.inner.lock().holders
    }
}

impl<S> fmt::Debug for LeaseStore<S>
where
    S: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseStore")
            .field("store", &self.inner.store)
            .field("lease", &self.inner.lease)
            .finish_non_exhaustive()
    }
}

impl<S> Inner<S> {
    fn lock(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether `op` is one a lease answers: a first attempt of cost 1, no `not_before`, on an
/// allowance without an adaptive rate (of a class, or not). Not a high class's request within
/// its lead when this process holds no token within two intervals (it would wait for the next
/// lease, behind the tokens the other processes hold): the store's jump serves it the slot
/// after the one being served, and every token moves on.
fn leasable(
    params: &rule::Params,
    op: &rule::Op,
    local: &mut Local,
    now: Instant,
) -> Option<(rule::AdmitRequest, Option<Classed>)> {
    let (req, class) = classes::admission(op)?;
    let plain = !req.retry && req.cost == 1 && req.not_before_us == 0;
    if !plain || params.adaptive.is_some() {
        return None;
    }
    if class.is_some_and(|c| c.first(&local.classes)) && local.outage.is_none() {
        local.expire(now);
        let interval = params.limits().first().map_or(0, |l| l.interval_us);
        let soon = now + Duration::from_micros(interval.saturating_mul(2));
        if local.tokens.front().is_none_or(|t| t.at > soon) {
            return None;
        }
    }
    Some((req, class))
}

/// `answer` as its caller asked for it: a class's, with the classes' virtual times.
fn classed(
    local: &mut Local,
    class: Option<Classed>,
    answer: Result<Reply, StoreError>,
) -> Result<Reply, StoreError> {
    match class {
        Some(c) => c.answer(&mut local.classes, answer),
        None => answer,
    }
}

/// An op the lease sends on to the store: a retry takes the successes held here (see
/// `carry_deposits`), a class's request the virtual time this lease admitted up to (the store
/// counts a high request's lead from it). Returns the successes carried.
fn forward(local: &mut Local, op: &mut rule::Op) -> u64 {
    #[cfg(feature = "shares")]
    if let rule::Op::Share(req) = op {
        req.seen = req.seen.max(local.classes.vtime());
    }
    carry_deposits(local, op)
}

impl<S: Store> Inner<S> {
    /// The request for the next lease of `n` tokens (with the give-back and debit due).
    fn request(&self, local: &mut Local, now: Instant, n: u32) -> GrantRequest {
        let mut req = GrantRequest::new(n)
            .mark(local.mark)
            .known_generation(local.generation)
            .deposits(local.take_deposits());
        if let Some((every, after, _)) = local.spacing(now) {
            req = req.spaced(every, after);
        }
        if let Some(store_now) = local.store_now(now) {
            let timeout = u64::try_from(self.lease.get_call_timeout().as_micros()).unwrap_or(0);
            req = req.valid_until_us(store_now.saturating_add(timeout).max(1));
        }
        if let (Some(_), Some((last, _))) = (&local.outage, &local.last) {
            // Rejoining: the fleet's fallback charged (see `GrantRequest::rejoin`), then the
            // local admissions still ahead.
            let debit = local.outage_sent.iter().filter(|t| **t > now).count();
            req = req
                .rejoin(last)
                .debit(u32::try_from(debit).unwrap_or(u32::MAX));
        }
        req
    }

    /// Takes in the answer to a lease call, and serves the waiting callers in order.
    fn answered(
        &self,
        local: &mut Local,
        sent: Instant,
        reply: Result<Reply, StoreError>,
        params: &rule::Params,
    ) {
        local.refilling = false;
        let now = Instant::now();
        match reply {
            Ok(Reply(rule::Reply::Grant(Grant::Granted(lease)))) => {
                if let Some(outage) = local.outage.take() {
                    local.rejoin_after = outage.since_store;
                    tracing::debug!(
                        sent = local.outage_sent.len(),
                        holders = lease.holders,
                        counted = lease.counted,
                        "the lease store answers again: rejoined, pacing at the share until every holder has"
                    );
                    // Rejoined: keep the share's pace for a window, until every process has.
                    local.outage_sent.clear();
                    local.pace_until = Some(now + Duration::from_micros(HOLDER_WINDOW_US));
                }
                local.take_in(lease, now, params);
            }
            Ok(Reply(rule::Reply::Grant(Grant::Denied(answer)))) => {
                local.denied = Some(Ok(answer));
                // Not one token: every waiting caller hears what a first attempt would have.
                let waiters = std::mem::take(&mut local.waiters);
                for w in waiters {
                    local.deposited(w.deposits);
                    let _ = w.tx.send((Ok(Reply(rule::Reply::Admit(answer))), None));
                }
                return;
            }
            Ok(Reply(rule::Reply::Grant(Grant::Stale))) => {}
            Ok(_) => {
                for w in local.waiters.drain(..) {
                    let e = StoreError::protocol(crate::store::WrongReply);
                    let _ = w.tx.send((Err(e), None));
                }
                return;
            }
            Err(e)
                if e.is_unavailable() && self.lease.get_local_fallback() && local.holders > 0 =>
            {
                if local.outage.is_none() {
                    tracing::debug!(
                        holders = local.holders,
                        share_in_ms = local.schedule_end(sent).saturating_duration_since(now).as_millis(),
                        error = %e,
                        "the lease store does not answer: admitting at this holder's share"
                    );
                }
                let start = local.schedule_end(sent);
                let since_store = local.store_now(sent).unwrap_or(0);
                local
                    .outage
                    .get_or_insert(Outage {
                        last_try: now,
                        start,
                        since_store,
                    })
                    .last_try = now;
            }
            Err(e) => {
                let mut first = Some(e);
                for w in local.waiters.drain(..) {
                    let e = first.take().unwrap_or_else(|| {
                        StoreError::unavailable("the lease call failed (told the first caller)")
                    });
                    let _ = w.tx.send((Err(e), None));
                }
                // Nobody waiting: the caller whose admission made the call (a store that
                // answered without I/O) is told, never left waiting for a call that is over.
                local.denied = first.map(Err);
                return;
            }
        }
        self.serve(local, now);
    }

    /// Serves waiting callers from the tokens (or the outage's share), in order (a high
    /// class's within its lead first).
    fn serve(&self, local: &mut Local, now: Instant) {
        loop {
            let first = |w: &Waiting| w.class.is_some_and(|c| c.first(&local.classes));
            let i = local.waiters.iter().position(first).unwrap_or(0);
            let Some(max_wait) = local.waiters.get(i).map(|w| w.max_wait) else {
                break;
            };
            let served = match local.take(now, max_wait) {
                Some(a) => Served::Reply(a),
                None if local.outage.is_some() => match local.take_local(now, max_wait) {
                    Some(a) => a,
                    None => break,
                },
                None => break,
            };
            if matches!(
                served,
                Served::At(_)
                    | Served::Reply(Ok(Reply(rule::Reply::Admit(
                        Admission::Admitted | Admission::Reserved { .. }
                    ))))
            ) {
                local.count(now, self.lease.period());
            }
            if let Some(w) = local.waiters.remove(i) {
                keep_deposits(local, w.deposits, &served);
                let (answer, at) = match served {
                    Served::Reply(answer) => (answer, None),
                    Served::At(at) => (Ok(admitted()), Some(at)),
                };
                // A class's times move when the answer is given, in the order given.
                let _ = w.tx.send((classed(local, w.class, answer), at));
            }
        }
    }
}

/// Starts a lease call unless one is in flight (or the outage's next try is not due).
fn refill<S: Store>(inner: &Arc<Inner<S>>, local: &mut Local, params: &Params, now: Instant) {
    if local.refilling {
        return;
    }
    if local
        .outage
        .as_ref()
        .is_some_and(|o| now < o.last_try + REJOIN_PROBE)
    {
        return;
    }
    let n = local.size(now, &inner.lease);
    let req = inner.request(local, now, n);
    local.refilling = true;
    local.calls += 1;
    let op = Op(rule::Op::Grant(req));
    let rule_params = params.0;
    // A store that answers without I/O answers here; otherwise in the background.
    if let Some(reply) = inner.store.try_apply(now, params, &op) {
        keep_unapplied(local, req.deposits, &reply);
        inner.answered(local, now, reply, &rule_params);
        return;
    }
    let fut = inner.store.apply(params, op);
    // A call that has not answered in twice the call timeout is given up (it cannot apply
    // later: its valid-until has passed), so that a store call that hangs does not hold
    // the lease, and the outage's share and the rejoin go on.
    let give_up = inner.lease.get_call_timeout().saturating_mul(2);
    let sent_deposits = req.deposits;
    let weak: Weak<Inner<S>> = Arc::downgrade(inner);
    tokio::spawn(async move {
        // Given up, the call may have been applied: its deposits are not kept (see the
        // module docs: at worst a few successes uncounted).
        let (reply, deposits) = match tokio::time::timeout(give_up, fut).await {
            Ok(reply) => (reply, sent_deposits),
            Err(_) => {
                let e =
                    StoreError::unavailable("the lease call did not answer in twice its timeout");
                (Err(e), 0)
            }
        };
        if let Some(inner) = weak.upgrade() {
            let mut local = inner.lock();
            keep_unapplied(&mut local, deposits, &reply);
            inner.answered(&mut local, now, reply, &rule_params);
            // Half the lease spent already (a slow call): ask again.
            if !local.waiters.is_empty() {
                let p = Params(rule_params);
                refill(&inner, &mut local, &p, Instant::now());
            }
        }
    });
}

impl<S: Store> LeaseStore<S> {
    /// Answers a leasable admission from the tokens held (or the outage's share), starting
    /// the next lease call when three quarters are spent; `None`: wait for the next lease.
    fn admit_now(
        &self,
        local: &mut Local,
        now: Instant,
        params: &Params,
        req: &rule::AdmitRequest,
    ) -> Option<Served> {
        local.params.get_or_insert(params.0);
        let max_wait = Duration::from_micros(req.max_wait_us);
        let answer = if local.waiters.is_empty() {
            match local.take(now, max_wait) {
                Some(a) => Some(Served::Reply(a)),
                None if local.outage.is_some() => local.take_local(now, max_wait),
                None => None,
            }
        } else {
            None
        };
        // Before the next lease call below, so that it carries them.
        if let Some(a) = &answer {
            keep_deposits(local, req.deposits, a);
        }
        if matches!(
            answer,
            Some(
                Served::At(_)
                    | Served::Reply(Ok(Reply(rule::Reply::Admit(
                        Admission::Admitted | Admission::Reserved { .. }
                    ))))
            )
        ) {
            local.count(now, self.inner.lease.period());
        }
        // The next lease is asked for when three quarters of this one are spent (a small one:
        // when a caller needs it): what a holder keeps ahead stays small.
        let low = local.size(now, &self.inner.lease) as usize / 4;
        if answer.is_none() || local.tokens.len() < low || local.outage.is_some() {
            local.denied = None;
            refill(&self.inner, local, params, now);
            if let (None, Some(denied)) = (&answer, local.denied.take()) {
                let served = Served::Reply(denied.map(|d| Reply(rule::Reply::Admit(d))));
                keep_deposits(local, req.deposits, &served);
                return Some(served);
            }
            if answer.is_none() && local.waiters.is_empty() {
                // A store without I/O has answered already.
                if let Some(a) = local.take(now, max_wait) {
                    if matches!(
                        a,
                        Ok(Reply(rule::Reply::Admit(
                            Admission::Admitted | Admission::Reserved { .. }
                        )))
                    ) {
                        local.count(now, self.inner.lease.period());
                    }
                    let served = Served::Reply(a);
                    keep_deposits(local, req.deposits, &served);
                    return Some(served);
                }
            }
        }
        answer
    }
}

impl<S: Store> Store for LeaseStore<S> {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        let now = Instant::now();
        let rx = {
            let mut local = self.inner.lock();
            match leasable(&params.0, &op.0, &mut local, now) {
                Some((req, class)) => match self.admit_now(&mut local, now, params, &req) {
                    Some(Served::Reply(answer)) => {
                        let answer = classed(&mut local, class, answer);
                        return Box::pin(std::future::ready(answer));
                    }
                    Some(Served::At(at)) => {
                        let answer = classed(&mut local, class, Ok(admitted()));
                        return admitted_at(at, now, answer);
                    }
                    None => {
                        let (tx, rx) = oneshot::channel();
                        let waiting = Waiting {
                            max_wait: Duration::from_micros(req.max_wait_us),
                            class,
                            deposits: req.deposits,
                            tx,
                        };
                        local.waiters.push_back(waiting);
                        // The lease call may have answered already (a store without I/O).
                        self.inner.serve(&mut local, now);
                        Some(rx)
                    }
                },
                None => None,
            }
        };
        if let Some(rx) = rx {
            return Box::pin(async move {
                match rx.await {
                    Ok((answer, None)) => answer,
                    Ok((answer, Some(at))) => admitted_at(at, Instant::now(), answer).await,
                    Err(_) => Err(StoreError::unavailable("the lease holder was dropped")),
                }
            });
        }
        if let rule::Op::Release(res) = op.0 {
            if res.budget_slot == FROM_LEASE && !res.retry {
                self.put_back(res);
                return Box::pin(std::future::ready(Ok(Reply(rule::Reply::Release {
                    released: true,
                }))));
            }
        }
        // A cooldown the store could not hear of (an outage) still holds here.
        let cools = match op.0 {
            rule::Op::Defer { delay_us } | rule::Op::Throttle { delay_us, .. } => delay_us,
            _ => None,
        };
        let mut op = op;
        let carried = forward(&mut self.inner.lock(), &mut op.0);
        let fut = self.inner.store.apply(params, op);
        let weak = Arc::downgrade(&self.inner);
        Box::pin(async move {
            let reply = fut.await;
            if let Some(inner) = weak.upgrade() {
                let mut local = inner.lock();
                keep_unapplied(&mut local, carried, &reply);
                match &reply {
                    Ok(r) => hear_reply(&mut local, r),
                    Err(e) if e.is_unavailable() => {
                        if let Some(d) = cools.filter(|d| *d > 0) {
                            let until = Instant::now() + Duration::from_micros(d);
                            local.blocked_until = local.blocked_until.max(Some(until));
                        }
                    }
                    Err(_) => {}
                }
            }
            reply
        })
    }

    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        let mut local = self.inner.lock();
        if let Some((req, class)) = leasable(&params.0, &op.0, &mut local, now) {
            // An outage's share may mean a sleep: `apply` answers that (the tokens whose slot
            // passed dropped first: `admit_now` would take a share's slot for nothing).
            local.expire(now);
            if local.outage.is_some() && local.tokens.is_empty() {
                return None;
            }
            return match self.admit_now(&mut local, now, params, &req)? {
                Served::Reply(answer) => Some(classed(&mut local, class, answer)),
                Served::At(_) => None,
            };
        }
        if matches!(op.0, rule::Op::Release(res) if res.budget_slot == FROM_LEASE && !res.retry) {
            return None;
        }
        let mut op = *op;
        let carried = forward(&mut local, &mut op.0);
        drop(local);
        let Some(reply) = self.inner.store.try_apply(now, params, &op) else {
            // Not answered here: `apply` carries them.
            self.inner.lock().deposited(carried);
            return None;
        };
        let mut local = self.inner.lock();
        keep_unapplied(&mut local, carried, &reply);
        if let Ok(r) = &reply {
            hear_reply(&mut local, r);
        }
        Some(reply)
    }

    fn is_settled(&self, now: Instant, params: &Params) -> bool {
        self.inner.lock().tokens.is_empty() && self.inner.store.is_settled(now, params)
    }

    fn watch(&self, watcher: Watcher) {
        let sink = Arc::new(LeaseSink {
            inner: Arc::downgrade(&self.inner) as Weak<dyn Hear>,
            next: watcher,
        });
        self.inner.store.watch(Watcher::new(sink));
    }

    fn name(&self) -> Option<&str> {
        self.inner.store.name()
    }
}

impl<S: Store> LeaseStore<S> {
    /// A lease token its caller did not use: back in line, if its slot is still ahead.
    fn put_back(&self, res: Reservation) {
        let mut local = self.inner.lock();
        let Some(lease_at) = local.last else {
            return;
        };
        let (g, at) = lease_at;
        if res.generation != g.generation {
            return;
        }
        let on_ours = match res.slot.checked_sub(g.now) {
            Some(d) => at + Duration::from_micros(d),
            None => return,
        };
        if on_ours + TOKEN_GRACE < Instant::now() {
            return;
        }
        let i = local.tokens.partition_point(|t| t.res.slot <= res.slot);
        local.tokens.insert(i, Token { res, at: on_ours });
    }
}

/// Applies the event a reply carries (this process's own cooldowns and closures).
fn hear_reply(local: &mut Local, reply: &Reply) {
    let event = match reply.0 {
        rule::Reply::Defer(d) => d.event,
        rule::Reply::Changed(e) => Some(e),
        // A high request that jumped the queue (one the lease did not answer).
        #[cfg(feature = "shares")]
        rule::Reply::Share(s) => {
            // Its classes' times (a high request that jumped): this lease's next high
            // request counts the jump in its lead.
            local.classes.merge(&s.classes);
            s.event
        }
        _ => None,
    };
    if let Some(e) = event {
        local.hear(&e);
    }
}

/// What the event sink reaches of the lease, whatever the store type.
trait Hear: Send + Sync {
    fn hear(&self, event: &rule::Event);
    fn resync(&self);
}

impl<S: Store> Hear for Inner<S> {
    fn hear(&self, event: &rule::Event) {
        self.lock().hear(event);
    }

    fn resync(&self) {
        // Events may have been missed: the tokens' slots are unknown.
        self.lock().tokens.clear();
    }
}

/// Hears every event before the allowance does.
struct LeaseSink {
    inner: Weak<dyn Hear>,
    next: Watcher,
}

impl EventSink for LeaseSink {
    fn event(&self, event: crate::store::Event) {
        if let Some(inner) = self.inner.upgrade() {
            inner.hear(&event.0);
        }
        self.next.notify(event);
    }

    fn resync(&self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.resync();
        }
        self.next.resync();
    }

    fn is_alive(&self) -> bool {
        self.next.is_alive()
    }
}

/// Refuses a lease of no tokens or no period.
pub(crate) fn check(size: u32, period: Duration) -> Result<(), ConfigError> {
    if size == 0 || size > MAX_LEASE || period.is_zero() {
        return Err(ConfigError::new(
            "a lease holds 1 to 10,000 tokens and its period is not zero",
        ));
    }
    Ok(())
}

// The array length the give-back carries.
const _: () = assert!(MAX_LIMITS == 4);
#[cfg(test)]
mod tests;
