//! The FIFO wait queue and the [`Acquire`] future.
//!
//! Only the waiter at the head of the queue ever talks to the store or sleeps on a timer;
//! everyone behind it is parked and is woken exactly once, when it becomes the head. The
//! head sleeps on one timer shared by the whole queue. When it is admitted it re-arms that
//! timer for the *next* head, registering the next head's waker, at the instant the next
//! token is due, so in steady state one admission costs one wakeup: no thundering herd.
//!
//! Cancellation: dropping a waiter removes it from the queue; if it was the head, the new
//! head is woken so nobody stalls. Nothing is ever reserved ahead of time, so a dropped
//! waiter spends no token.

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
    task::{ready, Context, Poll, Waker},
};

use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};

use crate::{
    allowance::{AcquireOptions, Backend, Shared},
    error::{AbandonReason, AcquireError, Overloaded, QuotaExhausted, StoreUnavailable},
    store::{Admit, Decision, StoreError, StoreFuture},
};

pub(crate) struct WaitQueue {
    state: Mutex<QueueState>,
    /// Mirrors `state.waiters.len()` so the fast path can skip the lock.
    len: AtomicUsize,
    max_waiters: usize,
}

struct QueueState {
    waiters: BTreeMap<u64, Waiter>,
    next_id: u64,
    /// The head should not ask the store before this instant.
    not_before: Option<Instant>,
    /// The latest cooldown deadline this process knows of.
    cooldown_until: Option<Instant>,
    /// One timer for the whole queue; armed with the head's waker.
    timer: Option<Pin<Box<Sleep>>>,
}

struct Waiter {
    waker: Waker,
    deadline: Option<Instant>,
}

impl WaitQueue {
    pub(crate) fn new(max_waiters: usize) -> Self {
        Self {
            state: Mutex::new(QueueState {
                waiters: BTreeMap::new(),
                next_id: 0,
                not_before: None,
                cooldown_until: None,
                timer: None,
            }),
            len: AtomicUsize::new(0),
            max_waiters,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // Critical sections do not panic; a poisoned lock still guards a consistent queue.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a cooldown deadline and wakes the waiters it dooms (their deadline falls
    /// before it), so they fail promptly instead of at their deadline.
    pub(crate) fn cooldown_until(&self, until: Instant) {
        let mut doomed = Vec::new();
        {
            let mut q = self.lock();
            if q.cooldown_until.is_some_and(|c| c >= until) {
                return;
            }
            q.cooldown_until = Some(until);
            q.not_before = Some(q.not_before.map_or(until, |nb| nb.max(until)));
            for w in q.waiters.values() {
                if w.deadline.is_some_and(|d| d < until) {
                    doomed.push(w.waker.clone());
                }
            }
        }
        doomed.into_iter().for_each(Waker::wake);
    }

    /// Wakes every waiter (the allowance closed: they all fail).
    pub(crate) fn wake_all(&self) {
        let wakers: Vec<Waker> = self
            .lock()
            .waiters
            .values()
            .map(|w| w.waker.clone())
            .collect();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// The earliest instant anyone could be admitted, as far as this process knows for
    /// certain: the end of a known cooldown, or the next token the head is waiting for.
    /// (Waiters ahead may still leave the queue, so their number is not counted.)
    fn earliest_admission(&self, now: Instant) -> Option<Instant> {
        let q = self.lock();
        let waiting_for_token = q.not_before.filter(|nb| *nb > now && !q.waiters.is_empty());
        match (q.cooldown_until.filter(|c| *c > now), waiting_for_token) {
            (Some(c), Some(t)) => Some(c.max(t)),
            (c, t) => c.or(t),
        }
    }

    /// Leaves the queue; wakes the new head if `id` was the head.
    fn leave(&self, id: u64) {
        let next = {
            let mut q = self.lock();
            let was_head = q.waiters.first_key_value().is_some_and(|(k, _)| *k == id);
            if q.waiters.remove(&id).is_some() {
                self.len.fetch_sub(1, Ordering::AcqRel);
            }
            if was_head {
                q.waiters.first_key_value().map(|(_, w)| w.waker.clone())
            } else {
                None
            }
        };
        if let Some(w) = next {
            w.wake();
        }
    }

    /// The head `id` was admitted: leave, and hand the head role to the next waiter, waking
    /// it exactly when the next token is due.
    fn admitted(&self, id: u64, now: Instant, next_in: std::time::Duration) {
        let wake = {
            let mut q = self.lock();
            if q.waiters.remove(&id).is_some() {
                self.len.fetch_sub(1, Ordering::AcqRel);
            }
            let due = now.checked_add(next_in).unwrap_or(now);
            let due = q
                .not_before
                .map_or(due, |nb| if nb > now { nb.max(due) } else { due });
            q.not_before = (due > now).then_some(due);
            let next = q.waiters.first_key_value().map(|(_, w)| w.waker.clone());
            match next {
                Some(waker) if due > now => {
                    let fired = arm(&mut q, due, &waker);
                    fired.then_some(waker)
                }
                other => other,
            }
        };
        if let Some(w) = wake {
            w.wake();
        }
    }
}

/// Points the shared timer at `at` with `waker`; returns whether it has already fired.
fn arm(q: &mut QueueState, at: Instant, waker: &Waker) -> bool {
    let timer = q.timer.get_or_insert_with(|| Box::pin(sleep_until(at)));
    if timer.deadline() != at {
        timer.as_mut().reset(at);
    }
    timer
        .as_mut()
        .poll(&mut Context::from_waker(waker))
        .is_ready()
}

enum State {
    Start,
    /// A shared store's answer to a call made while the queue was empty.
    Fast(StoreFuture<Decision>),
    Queued(u64),
    /// The head's in-flight question to a shared store.
    Asking(u64, StoreFuture<Decision>),
    Done,
}

pin_project! {
    /// Waits for admission; returned by [`Allowance::acquire`](crate::Allowance::acquire).
    ///
    /// Resolves to `Ok(())` once a token (and, for a retry, a unit of budget) has been spent
    /// for this caller. Dropping it before then leaves the queue and spends nothing.
    ///
    /// # Panics
    ///
    /// When polled outside a Tokio runtime with the time driver enabled (as any Tokio timer).
    #[must_use = "futures do nothing unless polled"]
    pub struct Acquire {
        shared: Arc<Shared>,
        options: AcquireOptions,
        state: State,
        #[pin]
        deadline_timer: Option<Sleep>,
    }

    impl PinnedDrop for Acquire {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let State::Queued(id) | State::Asking(id, _) = this.state {
                this.shared.queue.leave(*id);
            }
        }
    }
}

impl std::fmt::Debug for Acquire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Start => "start",
            State::Fast(_) => "asking store",
            State::Queued(_) => "queued",
            State::Asking(..) => "head, asking store",
            State::Done => "done",
        };
        f.debug_struct("Acquire")
            .field("options", &self.options)
            .field("state", &state)
            .finish()
    }
}

/// What to do after a store decision.
enum Next {
    Ready(Result<(), AcquireError>),
    Continue,
}

impl Acquire {
    pub(crate) fn new(shared: Arc<Shared>, options: AcquireOptions) -> Self {
        Self {
            shared,
            options,
            state: State::Start,
            deadline_timer: None,
        }
    }

    fn ask(&self) -> Admit {
        Admit {
            spend_retry: self.options.spend_retry,
        }
    }
}

/// The admission fast path, called synchronously by the admission layer: with the memory
/// store and nobody waiting, decide now without creating a future.
///
/// Returns `None` when the caller has to go through [`Acquire`].
pub(crate) fn try_admit_now(
    shared: &Shared,
    options: &AcquireOptions,
) -> Option<Result<(), AcquireError>> {
    let Backend::Memory(store) = &shared.backend else {
        return None;
    };
    if shared.queue.len() != 0 || options.deadline.is_some() {
        return None;
    }
    // The one clock read of this admission, for the quota (if any) and the store.
    let now = Instant::now();
    if let Some(e) = quota_closed(shared, now) {
        return Some(Err(e));
    }
    let ask = Admit {
        spend_retry: options.spend_retry,
    };
    match store.admit_at(now, &shared.config, ask) {
        Decision::Admitted { .. } => {
            count_admission(shared, options, false);
            Some(Ok(()))
        }
        Decision::BudgetExhausted => Some(Err(abandon(shared, AbandonReason::BudgetExhausted))),
        // Nothing was spent; the caller queues through `Acquire`.
        Decision::Wait { .. } => None,
    }
}

/// The quota-exhausted error, if the allowance is closed. Without a quota probe this is
/// one branch: `now` is a clock read the caller needs anyway.
#[inline]
fn quota_closed(shared: &Shared, now: Instant) -> Option<AcquireError> {
    let until = shared.quota.as_ref()?.exhausted_until(now)?;
    shared.stats.abandon(AbandonReason::QuotaExhausted);
    Some(AcquireError::Quota(QuotaExhausted::new(until)))
}

fn count_admission(shared: &Shared, options: &AcquireOptions, waited: bool) {
    shared.stats.admissions.record(waited, options.spend_retry);
}

fn abandon(shared: &Shared, reason: AbandonReason) -> AcquireError {
    shared.stats.abandon(reason);
    if reason == AbandonReason::BudgetExhausted {
        tracing::debug!("retry budget exhausted");
    }
    AcquireError::abandoned(reason)
}

fn store_failed(e: StoreError) -> AcquireError {
    tracing::debug!(error = %e, "allowance store failed");
    AcquireError::Store(StoreUnavailable::new(e))
}

impl Future for Acquire {
    type Output = Result<(), AcquireError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ask = self.ask();
        let mut this = self.project();
        loop {
            let shared: &Shared = this.shared;
            let deadline = this.options.deadline;
            match this.state {
                State::Start => {
                    let now = Instant::now();
                    if let Some(e) = quota_closed(shared, now) {
                        *this.state = State::Done;
                        return Poll::Ready(Err(e));
                    }
                    if let Some(d) = deadline {
                        let cooling = shared.queue.earliest_admission(now).is_some_and(|e| e > d);
                        if d <= now || cooling {
                            *this.state = State::Done;
                            return Poll::Ready(Err(abandon(shared, AbandonReason::Deadline)));
                        }
                    }
                    if shared.queue.len() != 0 {
                        match enqueue(shared, deadline, cx.waker(), None) {
                            Ok(id) => *this.state = State::Queued(id),
                            Err(e) => {
                                *this.state = State::Done;
                                return Poll::Ready(Err(e));
                            }
                        }
                        continue;
                    }
                    match &shared.backend {
                        Backend::Memory(m) => {
                            let decision = m.admit_at(now, &shared.config, ask);
                            if let Next::Ready(r) = fresh_decision(
                                shared,
                                this.options,
                                this.state,
                                cx,
                                now,
                                Ok(decision),
                            ) {
                                return Poll::Ready(r);
                            }
                        }
                        Backend::Custom(s) => {
                            *this.state = State::Fast(s.admit(&shared.config, ask))
                        }
                    }
                }
                State::Fast(fut) => {
                    let decision = ready!(fut.as_mut().poll(cx));
                    let now = Instant::now();
                    if let Next::Ready(r) =
                        fresh_decision(shared, this.options, this.state, cx, now, decision)
                    {
                        return Poll::Ready(r);
                    }
                }
                State::Queued(id) => {
                    let id = *id;
                    let now = Instant::now();
                    if let Some(e) = quota_closed(shared, now) {
                        shared.queue.leave(id);
                        *this.state = State::Done;
                        return Poll::Ready(Err(e));
                    }
                    let mut q = shared.queue.lock();
                    let head = q.waiters.first_key_value().is_some_and(|(k, _)| *k == id);
                    if !head {
                        if let Some(w) = q.waiters.get_mut(&id) {
                            if !w.waker.will_wake(cx.waker()) {
                                w.waker = cx.waker().clone();
                            }
                        }
                        let doomed =
                            deadline.is_some_and(|d| q.cooldown_until.is_some_and(|c| c > d));
                        drop(q);
                        if let Some(d) = deadline {
                            if this.deadline_timer.is_none() {
                                this.deadline_timer.set(Some(sleep_until(d)));
                            }
                            let expired = this
                                .deadline_timer
                                .as_mut()
                                .as_pin_mut()
                                .is_some_and(|t| t.poll(cx).is_ready());
                            if doomed || expired {
                                shared.queue.leave(id);
                                *this.state = State::Done;
                                return Poll::Ready(Err(abandon(shared, AbandonReason::Deadline)));
                            }
                        }
                        return Poll::Pending;
                    }
                    if let Some(nb) = q.not_before.filter(|nb| *nb > now) {
                        if deadline.is_some_and(|d| d < nb) {
                            drop(q);
                            shared.queue.leave(id);
                            *this.state = State::Done;
                            return Poll::Ready(Err(abandon(shared, AbandonReason::Deadline)));
                        }
                        if let Some(w) = q.waiters.get_mut(&id) {
                            if !w.waker.will_wake(cx.waker()) {
                                w.waker = cx.waker().clone();
                            }
                        }
                        if arm(&mut q, nb, cx.waker()) {
                            continue;
                        }
                        return Poll::Pending;
                    }
                    drop(q);
                    match &shared.backend {
                        Backend::Memory(m) => {
                            let decision = m.admit_at(now, &shared.config, ask);
                            if let Next::Ready(r) = head_decision(
                                shared,
                                this.options,
                                this.state,
                                id,
                                now,
                                Ok(decision),
                            ) {
                                return Poll::Ready(r);
                            }
                        }
                        Backend::Custom(s) => {
                            *this.state = State::Asking(id, s.admit(&shared.config, ask))
                        }
                    }
                }
                State::Asking(id, fut) => {
                    let id = *id;
                    let decision = ready!(fut.as_mut().poll(cx));
                    let now = Instant::now();
                    if let Next::Ready(r) =
                        head_decision(shared, this.options, this.state, id, now, decision)
                    {
                        return Poll::Ready(r);
                    }
                }
                State::Done => panic!("Acquire polled after completion"),
            }
        }
    }
}

/// Handles a decision for a caller that is not yet in the queue.
fn fresh_decision(
    shared: &Shared,
    options: &AcquireOptions,
    state: &mut State,
    cx: &Context<'_>,
    now: Instant,
    decision: Result<Decision, StoreError>,
) -> Next {
    match decision {
        Ok(Decision::Admitted { .. }) => {
            *state = State::Done;
            count_admission(shared, options, false);
            Next::Ready(Ok(()))
        }
        Ok(Decision::BudgetExhausted) => {
            *state = State::Done;
            Next::Ready(Err(abandon(shared, AbandonReason::BudgetExhausted)))
        }
        Ok(Decision::Wait { wait, cooldown }) => {
            let until = now.checked_add(wait);
            if cooldown {
                if let Some(u) = until {
                    shared.queue.cooldown_until(u);
                }
            }
            if options
                .deadline
                .is_some_and(|d| until.is_none_or(|u| u > d))
            {
                *state = State::Done;
                return Next::Ready(Err(abandon(shared, AbandonReason::Deadline)));
            }
            match enqueue(shared, options.deadline, cx.waker(), until) {
                Ok(id) => {
                    *state = State::Queued(id);
                    Next::Continue
                }
                Err(e) => {
                    *state = State::Done;
                    Next::Ready(Err(e))
                }
            }
        }
        Err(e) => {
            *state = State::Done;
            Next::Ready(Err(store_failed(e)))
        }
    }
}

/// Handles a decision for the head of the queue.
fn head_decision(
    shared: &Shared,
    options: &AcquireOptions,
    state: &mut State,
    id: u64,
    now: Instant,
    decision: Result<Decision, StoreError>,
) -> Next {
    match decision {
        Ok(Decision::Admitted { next_in }) => {
            *state = State::Done;
            shared.queue.admitted(id, now, next_in);
            count_admission(shared, options, true);
            Next::Ready(Ok(()))
        }
        Ok(Decision::Wait { wait, cooldown }) => {
            let until = now.checked_add(wait);
            if cooldown {
                if let Some(u) = until {
                    shared.queue.cooldown_until(u);
                }
            }
            if options
                .deadline
                .is_some_and(|d| until.is_none_or(|u| u > d))
            {
                *state = State::Done;
                {
                    let mut q = shared.queue.lock();
                    if let Some(u) = until {
                        q.not_before = Some(q.not_before.map_or(u, |nb| nb.max(u)));
                    }
                }
                shared.queue.leave(id);
                return Next::Ready(Err(abandon(shared, AbandonReason::Deadline)));
            }
            {
                let mut q = shared.queue.lock();
                let u = until.unwrap_or(now);
                q.not_before = Some(q.not_before.map_or(u, |nb| nb.max(u)));
            }
            *state = State::Queued(id);
            Next::Continue
        }
        Ok(Decision::BudgetExhausted) => {
            *state = State::Done;
            shared.queue.leave(id);
            Next::Ready(Err(abandon(shared, AbandonReason::BudgetExhausted)))
        }
        Err(e) => {
            *state = State::Done;
            shared.queue.leave(id);
            Next::Ready(Err(store_failed(e)))
        }
    }
}

fn enqueue(
    shared: &Shared,
    deadline: Option<Instant>,
    waker: &Waker,
    not_before: Option<Instant>,
) -> Result<u64, AcquireError> {
    let queue = &shared.queue;
    let mut q = queue.lock();
    if q.waiters.len() >= queue.max_waiters {
        drop(q);
        shared.stats.abandon(AbandonReason::Overloaded);
        return Err(AcquireError::Overloaded(Overloaded::new()));
    }
    let id = q.next_id;
    q.next_id += 1;
    q.waiters.insert(
        id,
        Waiter {
            waker: waker.clone(),
            deadline,
        },
    );
    queue.len.fetch_add(1, Ordering::AcqRel);
    if let Some(nb) = not_before {
        q.not_before = Some(q.not_before.map_or(nb, |old| old.max(nb)));
    }
    Ok(id)
}
