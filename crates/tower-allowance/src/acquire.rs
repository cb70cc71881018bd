//! Waiting for admission: one store call, then a sleep until the reserved slot.
//!
//! An admission asks the store once ([`Op::Admit`]). The store either admits now, or reserves
//! the caller's slot and says how long until it: the caller sleeps on its own timer and is
//! admitted at that instant without asking again. So one admission costs one store call and
//! one wakeup, however many callers (in however many processes) wait, and callers are
//! admitted in the order they reached the store.
//!
//! While it sleeps, the caller is registered with the allowance's holders (`shared::holders`),
//! which apply the events the store publishes: a cooldown moves the slot later (the caller
//! re-arms its timer), a closure fails it at once, and a slot pushed past the caller's
//! deadline fails it promptly. Dropping a waiting caller gives its slot back to the store when
//! it is still the latest one (otherwise it is lost: at most one slot per dropped caller).
//!
//! When the store does not answer, the caller waits for it (probing with backoff) as the
//! allowance's [`OutagePolicy`] says, never sending without its admission.

use std::{
    future::Future,
    ops::Deref,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll, Waker},
    time::Duration,
};

use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};

use crate::{
    error::{AbandonReason, AcquireError, Exhausted, Overloaded, StoreUnavailable},
    rule::{Admission, AdmitRequest, Reply},
    shared::{holders::Check, Answer, Applying, Shared},
    store::{StoreError, WrongReply},
    AcquireOptions, OutagePolicy,
};

#[cfg(feature = "shares")]
pub(crate) mod classes;

/// The first step of an admission, made synchronously where the store allows it.
pub(crate) enum Begin {
    /// Decided: admitted now, or failed.
    Ready(Result<(), AcquireError>),
    /// Reserved: holder `id`, due at the instant.
    Hold(u64, Instant),
    /// The store's answer is on its way.
    Ask(Answer, Asked),
    /// The store did not answer: wait until the instant, then ask again.
    Outage(Instant),
}

/// What was asked, for when the answer comes.
#[derive(Clone, Copy)]
pub(crate) struct Asked {
    deposits: u64,
    overloaded: bool,
}

/// Per-admission bookkeeping that outlives one store call.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Progress {
    /// When the admission began (for the time waited).
    pub(crate) started: Option<Instant>,
    /// When the store first failed to answer this admission.
    outage_since: Option<Instant>,
    /// Calls that failed in a row.
    failures: u32,
    /// Counted as waiting because of an outage.
    in_outage: bool,
    /// Where it stands with the class queues (feature `shares`).
    #[cfg(feature = "shares")]
    pub(crate) turn: classes::Turn,
    /// The slot it was sent at, when paced (the admission layer reports its answer).
    pub(crate) slot: Option<Instant>,
    /// Of its wait, how long a cooldown held it (`Attempt::cooled`).
    pub(crate) cooled: Duration,
    /// Its number in the debug events, once one named it (`Attempt::request`).
    pub(crate) request: Option<std::num::NonZeroU64>,
}

/// Makes the first step of an admission at `now`.
pub(crate) fn begin(
    shared: &Shared,
    options: &AcquireOptions,
    progress: &mut Progress,
    now: Instant,
) -> Begin {
    if options.deadline.is_some_and(|d| d <= now) {
        return Begin::Ready(Err(match shared.closure(now) {
            Some(e) => exhausted(shared, progress, e),
            None => late(shared, progress, now, None),
        }));
    }
    let started = *progress.started.get_or_insert(now);
    progress.request = progress.request.or(options.request);
    #[cfg(feature = "shares")]
    if let Some(step) = classes::before(shared, options, progress, now) {
        return step;
    }
    let overloaded = shared.holders().waiting()
        >= shared.config().max_waiters() + usize::from(progress.in_outage);
    if let Some(Some((id, at))) = (!overloaded).then(|| shared.holders().take_spare(now, options)) {
        return Begin::Hold(id, at);
    }
    let deposits = shared.take_deposits();
    let mut req = if options.retry {
        AdmitRequest::retry()
    } else {
        AdmitRequest::first()
    };
    let generation = shared.holders().generation();
    req = req.deposits(deposits).known_generation(generation);
    if let Some(cost) = options.cost {
        req = req.cost(cost);
    }
    if let Some(delay) = options.not_before {
        // From when the admission began: asking again (after an outage, or for a slot the
        // store lost) keeps the instant, neither shortens nor lengthens the delay.
        let at = started.checked_add(delay);
        let left = at.map_or(delay, |at| at.saturating_duration_since(now));
        req = req.not_before(left);
    }
    if overloaded {
        req = req.max_wait(Duration::ZERO);
    } else if let Some(deadline) = options.deadline {
        req = req.max_wait(deadline - now);
    }
    let asked = Asked {
        deposits,
        overloaded,
    };
    #[cfg(feature = "shares")]
    let op = classes::op(shared, options, progress, req);
    #[cfg(not(feature = "shares"))]
    let op = crate::rule::Op::Admit(req);
    match shared.apply(now, op) {
        Applying::Done(result) => decide(shared, options, progress, now, result, asked),
        Applying::Pending(fut) => Begin::Ask(fut, asked),
    }
}

/// Turns the store's answer into the next step.
fn decide(
    shared: &Shared,
    options: &AcquireOptions,
    progress: &mut Progress,
    now: Instant,
    result: Result<Reply, StoreError>,
    asked: Asked,
) -> Begin {
    let admission = match result {
        Ok(Reply::Admit(admission)) => admission,
        #[cfg(feature = "shares")]
        Ok(Reply::Share(r)) => classes::replied(shared, progress, now, &r),
        Ok(_) => return fail_store(shared, progress, StoreError::protocol(WrongReply)),
        Err(e) => {
            shared.restore_deposits(asked.deposits);
            return outage(shared, options, progress, now, e);
        }
    };
    end_outage(shared, progress);
    match admission {
        Admission::Admitted => {
            progress.slot = shared.holders().sent_now(now);
            shared.admitted(now, None, options.retry);
            Begin::Ready(Ok(()))
        }
        Admission::Reserved { wait, reservation } => {
            // Named when an event first names it (never on the fast path).
            let (name, next) = (shared.name(), || shared.next_request());
            let request = *progress.request.get_or_insert_with(next);
            #[cfg(feature = "shares")]
            classes::waiting((shared, name), options, wait, request);
            #[cfg(not(feature = "shares"))]
            tracing::debug!(allowance = name, ?wait, request, "waiting for a slot");
            let at = now.checked_add(wait).unwrap_or(now);
            // Held by a cooldown this process knows of, until its end.
            let cooldown = shared.holders().known().blocked_until.filter(|c| *c > now);
            progress.cooled += cooldown.map_or(Duration::ZERO, |c| c.min(at) - now);
            // Its checks (a state already replaced, a closure, a deadline) come on the first
            // poll, which also replaces the waker; until then nothing can wake us late.
            let id =
                (shared.holders()).register(reservation, at, options.deadline, Some(Waker::noop()));
            Begin::Hold(id, at)
        }
        Admission::Refused { wait, .. } if asked.overloaded => {
            shared.abandon(AbandonReason::Overloaded);
            Begin::Ready(Err(AcquireError::Overloaded(Overloaded { wait })))
        }
        // Past its deadline: to come back when the cooldown that held it ends, as the store
        // told (even before this process hears of it), else at the slot the store offered.
        Admission::Refused { wait, cooldown } => {
            let until = now.checked_add(cooldown.unwrap_or(wait));
            Begin::Ready(Err(late(shared, progress, now, until)))
        }
        Admission::BudgetExhausted => {
            tracing::debug!(allowance = shared.name(), "retry budget exhausted");
            let reason = AbandonReason::BudgetExhausted;
            Begin::Ready(Err(abandon(shared, progress, reason)))
        }
        Admission::Closed { until, by } => {
            let e = Exhausted::new(until.and_then(|d| now.checked_add(d)), by);
            shared.holders().learn_closed(e);
            Begin::Ready(Err(exhausted(shared, progress, e)))
        }
        Admission::TooCostly => {
            Begin::Ready(Err(abandon(shared, progress, AbandonReason::TooCostly)))
        }
    }
}

/// The store did not decide: wait for it (as the outage policy says) or fail.
fn outage(
    shared: &Shared,
    options: &AcquireOptions,
    progress: &mut Progress,
    now: Instant,
    error: StoreError,
) -> Begin {
    let OutagePolicy::Wait { max } = shared.config().outage_policy() else {
        return fail_store(shared, progress, error);
    };
    if !error.is_unavailable() {
        return fail_store(shared, progress, error);
    }
    let since = *progress.outage_since.get_or_insert(now);
    // Probe again after 50 ms, doubling to 1 s: a short outage costs little, a long one
    // costs one call per second per waiting caller.
    let backoff = Duration::from_millis(50)
        .saturating_mul(1u32.checked_shl(progress.failures).unwrap_or(u32::MAX))
        .min(Duration::from_secs(1));
    progress.failures = progress.failures.saturating_add(1);
    let next = now.checked_add(backoff).unwrap_or(now);
    let give_up = since.checked_add(max).unwrap_or(next);
    if next > give_up || options.deadline.is_some_and(|d| next > d) {
        return fail_store(shared, progress, error);
    }
    if !progress.in_outage {
        progress.in_outage = true;
        shared.holders().enter();
        tracing::debug!(allowance = shared.name(), error = %error, request = *progress.request.get_or_insert_with(|| shared.next_request()), "store unavailable; waiting for it");
    }
    Begin::Outage(next)
}

fn end_outage(shared: &Shared, progress: &mut Progress) {
    if progress.in_outage {
        progress.in_outage = false;
        shared.holders().leave();
    }
}

fn fail_store(shared: &Shared, progress: &mut Progress, error: StoreError) -> Begin {
    end_outage(shared, progress);
    tracing::debug!(allowance = shared.name(), error = %error, "allowance store failed");
    Begin::Ready(Err(AcquireError::Store(StoreUnavailable::new(error))))
}

fn abandon(shared: &Shared, progress: &mut Progress, reason: AbandonReason) -> AcquireError {
    end_outage(shared, progress);
    shared.abandon(reason);
    AcquireError::abandoned(reason, None)
}

/// Given up on for its deadline; to come back when the cooldown that held it ends (as this
/// process knows it), else at the `slot` the store offered.
fn late(s: &Shared, p: &mut Progress, now: Instant, slot: Option<Instant>) -> AcquireError {
    let cooldown = s.holders().known().blocked_until.filter(|b| *b > now);
    let until = cooldown.into_iter().chain(slot).min();
    abandon(s, p, AbandonReason::Deadline);
    AcquireError::abandoned(AbandonReason::Deadline, until)
}

fn exhausted(shared: &Shared, progress: &mut Progress, e: Exhausted) -> AcquireError {
    end_outage(shared, progress);
    shared.abandon(e.reason());
    AcquireError::Exhausted(e)
}

pin_project! {
    #[project = StateProj]
    enum State {
        Start,
        Asking { fut: Answer, asked: Asked },
        Holding { id: u64, #[pin] sleep: Sleep },
        Outage { #[pin] sleep: Sleep },
        Done,
    }
}

pin_project! {
    /// The admission state machine, over a borrowed or an owned handle.
    pub(crate) struct Admit<H: Deref<Target = Shared>> {
        shared: H,
        options: AcquireOptions,
        pub(crate) progress: Progress,
        #[pin]
        state: State,
    }

    impl<H: Deref<Target = Shared>> PinnedDrop for Admit<H> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let StateProj::Holding { id, .. } = this.state.project() {
                // Left before its slot: give the slot back (a bounded loss when it cannot be).
                if let Some((res, at)) = this.shared.holders().give_up(*id) {
                    this.shared.release(res, at);
                }
            }
            end_outage(this.shared, this.progress);
            #[cfg(feature = "shares")]
            classes::end(this.shared, this.progress);
        }
    }
}

impl<H: Deref<Target = Shared>> Admit<H> {
    pub(crate) fn new(shared: H, options: AcquireOptions) -> Self {
        Self {
            shared,
            options,
            progress: Progress::default(),
            state: State::Start,
        }
    }

    /// Continues an admission whose first step was made synchronously (one decided already
    /// is done: the caller returns its result without resuming).
    pub(crate) fn resume(
        shared: H,
        options: AcquireOptions,
        progress: Progress,
        step: Begin,
    ) -> Self {
        let state = State::of(step).unwrap_or(State::Done);
        Self {
            shared,
            options,
            progress,
            state,
        }
    }

    fn step(mut state: Pin<&mut State>, step: Begin) -> Option<Result<(), AcquireError>> {
        let (next, result) = match State::of(step) {
            Ok(next) => (next, None),
            Err(result) => (State::Done, Some(result)),
        };
        state.set(next);
        result
    }
}

impl State {
    /// The state that waits on `step`, or the result it decided.
    fn of(step: Begin) -> Result<Self, Result<(), AcquireError>> {
        Ok(match step {
            Begin::Ready(result) => return Err(result),
            Begin::Hold(id, at) => State::Holding {
                id,
                sleep: sleep_until(at),
            },
            Begin::Ask(fut, asked) => State::Asking { fut, asked },
            Begin::Outage(at) => State::Outage {
                sleep: sleep_until(at),
            },
        })
    }
}

impl<H: Deref<Target = Shared>> Future for Admit<H> {
    type Output = Result<(), AcquireError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let shared: &Shared = this.shared;
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Start => begin(shared, this.options, this.progress, Instant::now()),
                StateProj::Asking { fut, asked } => {
                    let (result, now) = (ready!(Pin::new(fut).poll(cx)), Instant::now());
                    decide(shared, this.options, this.progress, now, result, *asked)
                }
                StateProj::Holding { id, mut sleep } => {
                    let id = *id;
                    match shared.holders().check(id, cx.waker()) {
                        Check::Wait(at) => {
                            if sleep.deadline() != at {
                                // Moved later by a cooldown: held by it as long.
                                let moved = at.saturating_duration_since(sleep.deadline());
                                this.progress.cooled += moved;
                                sleep.as_mut().reset(at);
                            }
                            ready!(sleep.as_mut().poll(cx));
                            if let Some(due) = shared.holders().send(at, Instant::now()) {
                                // Paced from the last send: woken again at `due`.
                                sleep.as_mut().reset(due);
                                ready!(sleep.poll(cx));
                            }
                            this.progress.slot = Some(at);
                            shared.holders().remove(id);
                            let waited = this.progress.started.map(|s| s.elapsed());
                            let waited = waited.unwrap_or_default();
                            shared.admitted(Instant::now(), Some(waited), this.options.retry);
                            Begin::Ready(Ok(()))
                        }
                        Check::Closed(e) => {
                            shared.holders().remove(id);
                            Begin::Ready(Err(exhausted(shared, this.progress, e)))
                        }
                        Check::Doomed(at) => {
                            if let Some((res, at)) = shared.holders().give_up(id) {
                                shared.release(res, at);
                            }
                            let (now, slot) = (Instant::now(), Some(at));
                            Begin::Ready(Err(late(shared, this.progress, now, slot)))
                        }
                        Check::Reask => {
                            // The store lost the state this slot was reserved in (and every
                            // other slot): ask the new one, which schedules the holders in
                            // the order they ask (a request's own `not_before` still holds).
                            shared.holders().remove(id);
                            begin(shared, this.options, this.progress, Instant::now())
                        }
                        Check::Gone => Begin::Ready(Ok(())),
                    }
                }
                StateProj::Outage { sleep } => {
                    #[cfg(feature = "shares")]
                    ready!(classes::wait(shared, this.progress, sleep, cx));
                    #[cfg(not(feature = "shares"))]
                    ready!(sleep.poll(cx));
                    begin(shared, this.options, this.progress, Instant::now())
                }
                StateProj::Done => panic!("Acquire polled after completion"),
            };
            if let Some(result) = Self::step(this.state.as_mut(), next) {
                return Poll::Ready(result);
            }
        }
    }
}

/// An admission owned by a layer's response future, or by the future
/// [`Allowance::acquire_owned`](crate::Allowance::acquire_owned) returns.
pub(crate) type OwnedAdmit = Admit<Arc<Shared>>;

impl<H: Deref<Target = Shared>> std::fmt::Debug for Admit<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Start => "start",
            State::Asking { .. } => "asking the store",
            State::Holding { .. } => "holding a reserved slot",
            State::Outage { .. } => "waiting for the store",
            State::Done => "done",
        };
        f.debug_struct("Acquire")
            .field("options", &self.options)
            .field("state", &state)
            .finish()
    }
}

pin_project! {
    /// Waits for admission; returned by [`Allowance::acquire`](crate::Allowance::acquire).
    ///
    /// Resolves to `Ok(())` once a token (and, for a retry, a unit of budget) has been spent
    /// for this caller: at once, or at the slot the store reserved for it. Dropping it before
    /// then gives the slot back to the store when it is still the latest one.
    ///
    /// # Panics
    ///
    /// When polled outside a Tokio runtime with the time driver enabled (as any Tokio timer).
    #[must_use = "futures do nothing unless polled"]
    pub struct Acquire<'a> {
        #[pin]
        inner: Admit<&'a Shared>,
    }
}

impl<'a> Acquire<'a> {
    pub(crate) fn new(shared: &'a Shared, options: AcquireOptions) -> Self {
        Self {
            inner: Admit::new(shared, options),
        }
    }
}

impl std::fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Future for Acquire<'_> {
    type Output = Result<(), AcquireError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}
