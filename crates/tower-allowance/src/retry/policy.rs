use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
    time::Duration,
};

use http::{Extensions, Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::retry::Policy;

use super::{
    ticket::{RetryTicket, Stash, Ticket},
    RetryConfig,
};
use crate::{
    acquire::{self, Begin, OwnedAdmit, Progress},
    body::{Replay, Replayable},
    classify::{Classification, Classified, Classify, ServerDelay, StatusClassifier},
    cooldown::{read_response, FinalAttempt},
    error::{find, AbandonReason, Abandoned, StoreUnavailable},
    extensions::{AcquireOptions, Attempt, Cost},
    shared::Shared,
    Allowance, BoxError, Deadline, Outcome,
};

/// A [`tower::retry::Policy`] whose extra attempts draw on the allowance's shared budget.
///
/// See the [module docs](super) for the rules. Use it through
/// [`AllowanceLayer`](crate::AllowanceLayer), or with `tower::retry::RetryLayer` above an
/// [`AdmissionLayer`](crate::admission::AdmissionLayer), or with the `RetryLayer` alone (the
/// module docs' "Budget and stack order" says what the budget holds then).
///
/// # Clone
///
/// Tower clones the policy for every request, to count that request's attempts. The
/// allowance (and so the budget), the config and the classifier are shared through one
/// `Arc`, never copied: a clone is one reference-count increment.
pub struct RetryPolicy<C = StatusClassifier> {
    shared: Arc<PolicyShared<C>>,
    /// Attempts made by this request so far.
    attempts: u32,
    rng: Option<fastrand::Rng>,
}

impl<C> Clone for RetryPolicy<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            attempts: self.attempts,
            rng: self.rng.clone(),
        }
    }
}

impl<C: fmt::Debug> fmt::Debug for RetryPolicy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("allowance", &self.shared.allowance.name())
            .field("config", &self.shared.config)
            .field("classifier", &self.shared.classifier)
            .field("attempts", &self.attempts)
            .finish()
    }
}

/// What every clone of one policy shares, behind one `Arc`.
#[derive(Debug)]
pub(crate) struct PolicyShared<C> {
    pub(crate) allowance: Allowance,
    /// Shared with the [`Prepare`](super::Prepare) services made for this policy.
    pub(crate) config: Arc<RetryConfig>,
    pub(crate) classifier: C,
}

/// What the policy decided for one response.
enum Plan {
    /// Retry: sleep this long first (a backoff, or a delay only this request must honour),
    /// then ask for a slot no earlier than `not_before` (a throttling delay, which the shared
    /// cooldown normally covers already).
    Retry {
        sleep: Duration,
        not_before: Option<Duration>,
    },
    Abandon(AbandonReason),
    /// No retry, and nothing given up on: the response is the answer.
    Final,
}

// === impl RetryPolicy ===

impl RetryPolicy {
    /// A policy spending `allowance`'s retry budget, with the allowance's retry rules and
    /// classifier ([`AllowanceConfig::with_retry`](crate::AllowanceConfig::with_retry),
    /// [`with_classifier`](crate::AllowanceConfig::with_classifier)).
    pub fn new(allowance: Allowance) -> Self {
        let config = allowance.config();
        let retry = Arc::new(config.retry().clone());
        Self::of(retry, config.classifier(), allowance)
    }
}

impl<C: Classify> RetryPolicy<C> {
    fn of(config: Arc<RetryConfig>, classifier: C, allowance: Allowance) -> Self {
        Self::from_shared(Arc::new(PolicyShared {
            allowance,
            config,
            classifier,
        }))
    }

    /// This policy with `classifier` instead of the allowance's (an override, for this
    /// policy alone).
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> RetryPolicy<C2> {
        let s = &self.shared;
        RetryPolicy::of(s.config.clone(), classifier, s.allowance.clone())
    }

    /// This policy with `config` instead of the allowance's retry rules (an override, for
    /// this policy alone; the budget stays the allowance's).
    pub fn with_config(self, config: RetryConfig) -> Self {
        let s = &self.shared;
        Self::of(Arc::new(config), s.classifier.clone(), s.allowance.clone())
    }
}

impl<C> RetryPolicy<C> {
    pub(crate) fn from_shared(shared: Arc<PolicyShared<C>>) -> Self {
        Self {
            shared,
            attempts: 0,
            rng: None,
        }
    }

    pub(crate) fn shared(&self) -> &PolicyShared<C> {
        &self.shared
    }

    /// The configuration, shared (for [`Prepare`](super::Prepare)).
    pub(crate) fn config_handle(&self) -> &Arc<RetryConfig> {
        &self.shared.config
    }

    pub(crate) fn config(&self) -> &RetryConfig {
        &self.shared.config
    }

    fn jitter(&mut self, cap: Duration) -> Duration {
        let allowance = &self.shared.allowance;
        let seed = self.shared.config.jitter_seed;
        let rng = self.rng.get_or_insert_with(|| {
            // One stream per request: concurrent retries must not share a jitter sequence.
            let stream = allowance.next_jitter_seed();
            let base = seed.unwrap_or_else(|| fastrand::u64(..));
            fastrand::Rng::with_seed(base ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        });
        let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.u64(0..=nanos))
    }

    /// Decides whether to retry after attempt `self.attempts`, whose response was `class`
    /// and asked for `server_delay`.
    fn plan(
        &mut self,
        extensions: &Extensions,
        class: Classification,
        server_delay: Option<ServerDelay>,
    ) -> Plan {
        if server_delay == Some(ServerDelay::TooLong) {
            return Plan::Abandon(AbandonReason::CooldownTooLong);
        }
        // A closed allowance refuses whatever the request's own limits say: its reason.
        let closed =
            |policy: &PolicyShared<C>, r| Plan::Abandon(policy.allowance.shared.or_closed(r));
        if self.attempts >= self.config().max_attempts.get() {
            return closed(&self.shared, AbandonReason::MaxAttempts);
        }
        let backoff = self.jitter(self.config().backoff_cap(self.attempts));
        let (sleep, not_before) = match (class, server_delay) {
            // The server asked not to be retried (gRPC's negative or malformed pushback):
            // its answer is final. (Too long: abandoned above.)
            (_, Some(ServerDelay::DoNotRetry | ServerDelay::TooLong)) => return Plan::Final,
            // The server's delay, never shortened: the shared cooldown holds everyone until
            // then, and the retry's slot is reserved no earlier.
            (Classification::Throttled, Some(ServerDelay::After(d))) if !d.is_zero() => {
                (Duration::ZERO, Some(d))
            }
            // A delay for this request only: honoured before asking, with our backoff as a
            // floor so that `Retry-After: 0` never turns into a hot loop.
            (_, Some(ServerDelay::After(d))) => (d.max(backoff), None),
            (_, None) => (backoff, None),
        };
        let total = sleep.saturating_add(not_before.unwrap_or_default());
        if let Some(Deadline(deadline)) = extensions.get::<Deadline>() {
            // Don't sleep only to fail, and don't retry exactly at the deadline.
            if Instant::now()
                .checked_add(total)
                .is_none_or(|at| at >= *deadline)
            {
                return closed(&self.shared, AbandonReason::Deadline);
            }
        }
        let (attempt, name) = (
            self.attempts.saturating_add(1),
            self.shared.allowance.name(),
        );
        tracing::debug!(allowance = name, attempt, delay = ?total, reason = ?class, "retrying");
        Plan::Retry { sleep, not_before }
    }
}

/// The layers' own failures are final: retrying them would only repeat them.
fn is_own_error(e: &BoxError) -> bool {
    Outcome::of_error(&**e) != Outcome::Failed || find::<StoreUnavailable>(&**e).is_some()
}

impl<C: Classify> RetryPolicy<C> {
    /// Decides what follows an attempt whose result is `result`: `Some(wait)` to retry once
    /// `wait` resolves, with `extensions` (those of the next attempt) marked for it.
    ///
    /// `replay` is asked for the body of the next attempt only when a retry is planned, and
    /// before anything is spent: when it has none (the body outgrew its replay cap), the
    /// response is the answer, marked abandoned ([`AbandonReason::NotReplayable`]).
    pub(crate) fn after_attempt<RB: Send + 'static>(
        &mut self,
        extensions: &mut Extensions,
        result: &mut Result<Response<RB>, BoxError>,
        replay: impl FnOnce() -> bool,
    ) -> Option<RetryWait> {
        self.attempts = self.attempts.saturating_add(1);
        let plan = match result {
            Ok(res) => {
                if res.extensions().get::<Abandoned>().is_some() {
                    return None;
                }
                let classified = res.extensions().get::<Classified>().copied();
                // Without the cooldown layer below: classify here.
                let classified = classified.unwrap_or_else(|| {
                    let config = self.shared.allowance.config();
                    read_response(&self.shared.classifier, config, res.status(), res.headers())
                        .classified
                });
                match classified.class {
                    class @ (Classification::Throttled | Classification::Transient) => {
                        self.plan(extensions, class, classified.delay)
                    }
                    _ => return None,
                }
            }
            Err(e) => {
                // A retry the store refused while the policy waited: end with the response
                // that prompted it, marked abandoned.
                if let Some(reason) = extensions
                    .get::<RetryTicket>()
                    .and_then(RetryTicket::refused)
                {
                    if let Some(mut response) = extensions
                        .get::<Stash<Response<RB>>>()
                        .and_then(Stash::take)
                    {
                        response.extensions_mut().insert(Abandoned::new(reason));
                        *result = Ok(response);
                    }
                    return None;
                }
                if is_own_error(e) || !self.config().retry_transport_errors {
                    return None;
                }
                self.plan(extensions, Classification::Transient, None)
            }
        };
        let plan = match plan {
            Plan::Retry { .. } if !replay() => Plan::Abandon(AbandonReason::NotReplayable),
            plan => plan,
        };
        match plan {
            Plan::Final => None,
            Plan::Abandon(reason) => {
                self.shared.allowance.shared.stats.abandon(reason);
                if let Ok(res) = result {
                    res.extensions_mut().insert(Abandoned::new(reason));
                }
                None
            }
            Plan::Retry { sleep, not_before } => {
                let deadline = extensions.get::<Deadline>().map(|Deadline(d)| {
                    // The slot must come strictly before the deadline.
                    d.checked_sub(Duration::from_micros(1)).unwrap_or(*d)
                });
                let options = AcquireOptions {
                    deadline,
                    retry: true,
                    cost: extensions.get::<Cost>().map(|Cost(c)| *c),
                    not_before,
                };
                let shared = &self.shared.allowance.shared;
                // Nothing to sleep before asking: ask now, as the wait's first poll would, at
                // the same instant. A store that decides at once (the in-memory one does)
                // then refuses before anything is committed to sending the retry, with or
                // without an admission layer below (see the module docs, "Budget and stack
                // order").
                let asked = sleep.is_zero().then(|| {
                    let mut progress = Progress::default();
                    let step = acquire::begin(shared, &options, &mut progress, Instant::now());
                    (progress, step)
                });
                let (progress, step) = match asked {
                    Some((_, Begin::Ready(Err(e)))) => {
                        // Refused (the budget used up, a deadline, a closed allowance): the
                        // request ends with the response that prompted the retry, marked
                        // abandoned, as a refusal handed to an admission layer ends
                        // (`RetryTicket::refused`). The admission counted the abandonment.
                        match (e.abandon_reason(), &mut *result) {
                            (Some(reason), Ok(res)) => {
                                res.extensions_mut().insert(Abandoned::new(reason));
                            }
                            (_, result) => *result = Err(e.into_box()),
                        }
                        return None;
                    }
                    Some((progress, step)) => (progress, Some(step)),
                    None => (Progress::default(), None),
                };
                // The slot's stand-in once its response moved to the stash (tower drops the
                // slot when a retry is scheduled; nobody observes it).
                match std::mem::replace(result, Err("response kept for a retry".into())) {
                    Ok(response) => {
                        extensions.insert(Stash::new(response));
                    }
                    Err(e) => {
                        *result = Err(e);
                        // Nothing to end with but the error: no stale response from an
                        // earlier retry either.
                        extensions.remove::<Stash<Response<RB>>>();
                    }
                }
                let ticket = RetryTicket::default();
                let next = self.attempts.saturating_add(1);
                extensions.insert(Attempt(next));
                extensions.insert(ticket.clone());
                let shared = shared.clone();
                Some(match step {
                    Some(step) => RetryWait::asked(shared, options, progress, step, ticket),
                    None => RetryWait::new(shared, sleep, options, ticket),
                })
            }
        }
    }

    /// Prepares `request` for a `tower::retry::Retry` that uses this policy, as
    /// [`AllowanceLayer`](crate::AllowanceLayer) does on its own: a body that
    /// [`Replayable::try_clone`] cannot copy (a stream) keeps a copy of up to
    /// [`replay_cap`](RetryConfig::replay_cap) bytes while the first attempt streams, and its
    /// [`Replay`] goes in the request's extensions, where
    /// [`clone_request`](Policy::clone_request) finds it.
    ///
    /// A request that cannot be retried (its method, `max_attempts` of 1, a body known to
    /// be over the cap) is marked so that a throttling answer to it is reported as
    /// abandoned, with the reason.
    pub fn prepare<B: Replayable + 'static>(&self, request: Request<B>) -> Request<B> {
        prepare(self.config(), request)
    }
}

/// [`RetryPolicy::prepare`], from the policy's configuration alone.
pub(crate) fn prepare<B: Replayable + 'static>(
    config: &RetryConfig,
    request: Request<B>,
) -> Request<B> {
    let (mut parts, body) = request.into_parts();
    let (body, last) = if !config.replayable_parts(&parts) {
        (body, Some(AbandonReason::NotReplayable))
    } else if config.max_attempts.get() <= 1 {
        (body, Some(AbandonReason::MaxAttempts))
    } else if body.try_clone(config.replay_cap).is_some() {
        (body, None)
    } else {
        match body.prepare(config.replay_cap) {
            (body, Some(replay)) => {
                parts.extensions.insert(replay);
                (body, None)
            }
            (body, None) => (body, Some(AbandonReason::NotReplayable)),
        }
    };
    if let Some(reason) = last {
        parts.extensions.insert(FinalAttempt(reason));
    }
    Request::from_parts(parts, body)
}

/// A copy of `req`'s head around `body`.
pub(crate) fn with_body<B, B2>(req: &Request<B>, body: B2) -> Request<B2> {
    let mut copy = Request::new(body);
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    copy
}

/// Standalone, under `tower::retry::Retry`: the body of each further attempt comes from the
/// request's [`Replay`] extension (see [`RetryPolicy::prepare`]), or else from
/// [`Replayable::try_clone`]; a request with neither is not retried.
impl<B, RB, C> Policy<Request<B>, Response<RB>, BoxError> for RetryPolicy<C>
where
    B: Replayable + 'static,
    RB: Send + 'static,
    C: Classify,
{
    type Future = RetryWait;

    fn retry(
        &mut self,
        req: &mut Request<B>,
        result: &mut Result<Response<RB>, BoxError>,
    ) -> Option<RetryWait> {
        let replay = req.extensions().get::<Replay<B>>().cloned();
        let mut body = None;
        let wait = self.after_attempt(req.extensions_mut(), result, || match &replay {
            // Made now that the attempt is over: a copy taken before it may have been
            // outgrown by it.
            Some(replay) => {
                body = replay.body();
                body.is_some()
            }
            // `clone_request` copied the body already.
            None => true,
        });
        if let Some(body) = body {
            *req.body_mut() = body;
        }
        wait
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        let config = self.config();
        if config.max_attempts.get() <= 1 || !config.replayable(req) {
            // Never replayed: no copy.
            return None;
        }
        let body = match req.extensions().get::<Replay<B>>() {
            Some(replay) => replay.body()?,
            None => req.body().try_clone(config.replay_cap)?,
        };
        Some(with_body(req, body))
    }
}

/// The retry's wait: a backoff sleep if any, then its admission (spending the shared retry
/// budget), made for a slot no earlier than the server's delay.
///
/// Resolves when the slot comes, or at once when the store refuses, leaving the verdict in
/// the request's ticket for the admission layer. Without a backoff, the policy made the
/// admission's first step when it decided to retry (a refusal known then ended the request
/// there), and the wait carries on from it. Boxed: only a retry pays for it.
pub struct RetryWait {
    inner: Pin<Box<RetryWaitInner>>,
}

pin_project! {
    struct RetryWaitInner {
        #[pin]
        sleep: Option<Sleep>,
        // `None`: admitted already, when the policy decided.
        #[pin]
        admit: Option<OwnedAdmit>,
        ticket: RetryTicket,
    }
}

impl fmt::Debug for RetryWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryWait").finish_non_exhaustive()
    }
}

impl RetryWait {
    fn new(
        shared: Arc<Shared>,
        sleep: Duration,
        options: AcquireOptions,
        ticket: RetryTicket,
    ) -> Self {
        let sleep = (!sleep.is_zero()).then(|| tokio::time::sleep(sleep));
        Self::of(sleep, Some(OwnedAdmit::new(shared, options)), ticket)
    }

    /// The rest of an admission whose first step the policy made when it decided (`step`
    /// is not a refusal: those end the request there).
    fn asked(
        shared: Arc<Shared>,
        options: AcquireOptions,
        progress: Progress,
        step: Begin,
        ticket: RetryTicket,
    ) -> Self {
        let admit = match step {
            Begin::Ready(result) => {
                ticket.set(Ticket::of(result));
                None
            }
            step => Some(OwnedAdmit::resume(shared, options, progress, step)),
        };
        Self::of(None, admit, ticket)
    }

    fn of(sleep: Option<Sleep>, admit: Option<OwnedAdmit>, ticket: RetryTicket) -> Self {
        Self {
            inner: Box::pin(RetryWaitInner {
                sleep,
                admit,
                ticket,
            }),
        }
    }
}

impl Future for RetryWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.inner.as_mut().project();
        if let Some(sleep) = this.sleep.as_mut().as_pin_mut() {
            ready!(sleep.poll(cx));
            this.sleep.set(None);
        }
        if let Some(admit) = this.admit.as_mut().as_pin_mut() {
            let result = ready!(admit.poll(cx));
            this.admit.set(None);
            this.ticket.set(Ticket::of(result));
        }
        Poll::Ready(())
    }
}
