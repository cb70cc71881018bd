use std::{
    any::Any,
    fmt,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use http::{Extensions, Request, Response};
use tokio::time::{Instant, Sleep};
use tower::retry::Policy;

use super::RetryConfig;
use crate::{
    body::{Replay, Replayable},
    classify::{self, Classification, Classified, Classify, ServerDelay, StatusClassifier},
    error::{find, AbandonReason, Abandoned, StoreUnavailable},
    extensions::Attempt,
    signals, Allowance, BoxError, Deadline, Outcome,
};

/// A [`tower::retry::Policy`] that decides whether and when to retry; the admission layer
/// under it admits each retry, spending the allowance's shared budget.
///
/// See the [module docs](super) for the rules. Use it through
/// [`AllowanceLayer`](crate::AllowanceLayer), or with `tower::retry::RetryLayer` above an
/// [`AdmissionLayer`](crate::admission::AdmissionLayer) (say so with
/// [`over_admission`](Self::over_admission)), or with the `RetryLayer` alone (the module docs'
/// "Budget and stack order" says what holds then).
///
/// # Clone
///
/// Tower clones the policy for every request, to count that request's attempts. The
/// allowance, the config and the classifier are shared through one `Arc`, never copied: a
/// clone is one reference-count increment, and starts with nothing of another request's.
pub struct RetryPolicy<C = StatusClassifier> {
    shared: Arc<PolicyShared<C>>,
    /// Attempts made by this request so far.
    attempts: u32,
    rng: Option<fastrand::Rng>,
    /// The request's number in debug events, once named (`Attempt::request`).
    request: Option<std::num::NonZeroU64>,
    /// The response that prompted the retry in flight, for when admission refuses the retry.
    stash: Stash,
}

impl<C> Clone for RetryPolicy<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            attempts: self.attempts,
            rng: self.rng.clone(),
            request: self.request,
            stash: Stash::default(),
        }
    }
}

impl<C: fmt::Debug> fmt::Debug for RetryPolicy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("allowance", &self.shared.allowance.name())
            .field("config", &self.shared.config)
            .field("classifier", &self.shared.classifier)
            .field("over_admission", &self.shared.over_admission)
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
    /// An admission layer on the same allowance sits under the `Retry`: it waits out the
    /// server's delay for a retry (the retry's slot reserved at once), so the policy does not.
    pub(crate) over_admission: bool,
}

/// The response that prompted the retry in flight (an `http::Response<RB>`, typed at use:
/// the policy serves any body type). Held by the policy, which tower keeps for the request
/// across its attempts: if admission refuses the retry, the request ends with this response,
/// marked abandoned. Behind a mutex only to be `Sync`; only `&mut self` reaches it.
#[derive(Default)]
struct Stash(Mutex<Option<Box<dyn Any + Send>>>);

impl Stash {
    fn put<R: Send + 'static>(&mut self, response: Option<R>) {
        let slot = self.0.get_mut().unwrap_or_else(PoisonError::into_inner);
        *slot = response.map(|r| Box::new(r) as Box<dyn Any + Send>);
    }

    fn take<R: 'static>(&mut self) -> Option<R> {
        let slot = self.0.get_mut().unwrap_or_else(PoisonError::into_inner);
        slot.take()?.downcast().ok().map(|r| *r)
    }
}

/// What the policy decided for one response.
enum Plan {
    /// Retry: sleep this long first (a backoff, or a delay only this request must honour),
    /// then be admitted no earlier than `not_before` (a throttling delay, which the shared
    /// cooldown normally covers already).
    Retry {
        sleep: Duration,
        not_before: Option<Duration>,
    },
    Abandon(Abandoned),
    /// No retry, and nothing given up on: the response is the answer.
    Final,
}

// === impl RetryPolicy ===

impl RetryPolicy {
    /// A policy for `allowance`, with its retry rules and classifier
    /// ([`AllowanceConfig::with_retry`](crate::AllowanceConfig::with_retry),
    /// [`with_classifier`](crate::AllowanceConfig::with_classifier)).
    pub fn new(allowance: Allowance) -> Self {
        let config = allowance.config();
        let retry = Arc::new(config.retry().clone());
        Self::of(retry, config.classifier(), allowance, false)
    }
}

impl<C: Classify> RetryPolicy<C> {
    fn of(config: Arc<RetryConfig>, classifier: C, allowance: Allowance, over: bool) -> Self {
        Self {
            shared: Arc::new(PolicyShared {
                allowance,
                config,
                classifier,
                over_admission: over,
            }),
            attempts: 0,
            rng: None,
            request: None,
            stash: Stash::default(),
        }
    }

    /// This policy with `classifier` instead of the allowance's (an override, for this
    /// policy alone).
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> RetryPolicy<C2> {
        let s = &self.shared;
        let allowance = s.allowance.clone();
        RetryPolicy::of(s.config.clone(), classifier, allowance, s.over_admission)
    }

    /// This policy with `config` instead of the allowance's retry rules (an override, for
    /// this policy alone; the budget stays the allowance's).
    pub fn with_config(self, config: RetryConfig) -> Self {
        let s = &self.shared;
        let (classifier, allowance) = (s.classifier.clone(), s.allowance.clone());
        Self::of(Arc::new(config), classifier, allowance, s.over_admission)
    }

    /// Says that an [`AdmissionLayer`](crate::admission::AdmissionLayer) on the same allowance
    /// sits under the `Retry` (as in [`AllowanceLayer`](crate::AllowanceLayer), which says so
    /// itself): a retry then waits out the server's delay in the admission queue, its slot
    /// reserved as soon as the retry is decided (ahead of the callers who arrive during the
    /// cooldown), instead of the policy sleeping the delay before the retry asks.
    ///
    /// Without it the policy sleeps the delay itself: right over any service, and a retry
    /// then queues behind whoever asked meanwhile. With it and no admission layer below, a
    /// retry would not wait for the server's delay: do not.
    pub fn over_admission(self) -> Self {
        let s = &self.shared;
        let (config, classifier) = (s.config.clone(), s.classifier.clone());
        Self::of(config, classifier, s.allowance.clone(), true)
    }
}

impl<C> RetryPolicy<C> {
    pub(crate) fn shared(&self) -> &PolicyShared<C> {
        &self.shared
    }

    /// The configuration, shared (for [`Prepare`](super::Prepare)).
    pub(crate) fn config_handle(&self) -> &Arc<RetryConfig> {
        &self.shared.config
    }

    fn config(&self) -> &RetryConfig {
        &self.shared.config
    }

    fn jitter(&mut self, cap: Duration) -> Duration {
        let allowance = &self.shared.allowance;
        let seed = self.shared.config.jitter_seed;
        let rng = self.rng.get_or_insert_with(|| {
            // One stream per request: concurrent retries must not share a jitter sequence.
            let stream = allowance.shared.next_jitter_seed();
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
            return Plan::Abandon(Abandoned::new(AbandonReason::CooldownTooLong));
        }
        // A closed allowance refuses whatever the request's own limits say: its reason. The
        // server's wait is when to come back.
        let closed =
            |p: &PolicyShared<C>, r| Plan::Abandon(p.allowance.shared.or_closed(r, server_delay));
        if self.attempts >= self.config().max_attempts.get() {
            return closed(&self.shared, AbandonReason::MaxAttempts);
        }
        let backoff = self.jitter(self.config().backoff_cap(self.attempts));
        let (sleep, not_before) = match (class, server_delay) {
            // The server asked not to be retried (gRPC's negative or malformed pushback):
            // its answer is final. (Too long: abandoned above.)
            (_, Some(ServerDelay::DoNotRetry | ServerDelay::TooLong)) => return Plan::Final,
            // The server's delay, never shortened: the shared cooldown holds everyone until
            // then, and the retry is admitted no earlier.
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
            let at = Instant::now().checked_add(total);
            if at.is_none_or(|at| at >= *deadline) {
                return closed(&self.shared, AbandonReason::Deadline);
            }
        }
        let attempt = self.attempts.saturating_add(1);
        let name = self.shared.allowance.name();
        let request =
            *(self.request).get_or_insert_with(|| self.shared.allowance.shared.next_request());
        tracing::debug!(allowance = name, request, attempt, delay = ?total, reason = ?class, "retrying");
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
    /// `replay` is asked for the body of the next attempt only when a retry is planned: when
    /// it has none (the body outgrew its replay cap), the response is the answer, marked
    /// abandoned ([`AbandonReason::NotReplayable`]).
    fn after_attempt<RB: Send + 'static>(
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
                // Read by the cooldown layer below; without one, read here.
                let classified = res.extensions().get::<Classified>().copied();
                let classified = classified.unwrap_or_else(|| {
                    let reading = self.shared.allowance.config().reading();
                    let (status, headers) = (res.status(), res.headers());
                    let classifier = &self.shared.classifier;
                    classify::read(classifier, reading, signals::wall_clock, status, headers)
                        .classified
                });
                match classified.class {
                    class @ (Classification::Throttled | Classification::Transient) => {
                        // Named by the admission layer's events already, perhaps.
                        let record = Attempt::of(res.extensions());
                        self.request = self.request.or(record.and_then(|a| a.request));
                        self.plan(extensions, class, classified.delay)
                    }
                    _ => return None,
                }
            }
            Err(e) => {
                // A retry the admission layer refused (the budget spent, its deadline, a
                // closure): the request ends with the response that prompted it, marked
                // abandoned with the refusal's reason.
                if let (Some(abandoned), Some(mut response)) =
                    (Abandoned::of_error(&**e), self.stash.take::<Response<RB>>())
                {
                    response.extensions_mut().insert(abandoned);
                    *result = Ok(response);
                    return None;
                }
                if is_own_error(e) || !self.config().retry_transport_errors {
                    return None;
                }
                self.plan(extensions, Classification::Transient, None)
            }
        };
        let plan = match plan {
            Plan::Retry { .. } if !replay() => {
                Plan::Abandon(Abandoned::new(AbandonReason::NotReplayable))
            }
            plan => plan,
        };
        match plan {
            Plan::Final => None,
            // Counted where it is marked: a response given up on. An error stays the request's
            // answer (`Outcome::Failed`), and a layer above that turns it into a verdict of
            // its own (gRPC's deadline) counts that one.
            Plan::Abandon(abandoned) => {
                if let Ok(res) = result {
                    self.shared.allowance.shared.abandon(abandoned.reason());
                    res.extensions_mut().insert(abandoned);
                }
                None
            }
            Plan::Retry { sleep, not_before } => {
                // Kept for when the retry is refused (tower drops the result when a retry is
                // scheduled; nobody observes its stand-in). Nothing stale is kept for an error.
                let kept = std::mem::replace(result, Err("response kept for a retry".into()));
                let prior = kept.as_ref().ok().and_then(|r| Attempt::of(r.extensions()));
                self.stash.put(kept.ok());
                let over = self.shared.over_admission;
                let record = Attempt {
                    retries: self.attempts,
                    // The admission layer below waits out the server's delay...
                    not_before: not_before
                        .filter(|_| over)
                        .and_then(|d| Instant::now().checked_add(d)),
                    last: None,
                    sent: None,
                    request: self.request,
                    // The time queued, and held by cooldowns, so far.
                    ..prior.unwrap_or_default()
                };
                extensions.insert(record);
                // ... or the policy does.
                let sleep = sleep.saturating_add(not_before.filter(|_| !over).unwrap_or_default());
                Some(RetryWait::after(sleep))
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
        super::prepare::prepare(self.config(), request)
    }
}

/// A copy of `req`'s head around `body`.
fn with_body<B, B2>(req: &Request<B>, body: B2) -> Request<B2> {
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

/// What a retry waits for before it is sent: a backoff, or a delay the policy honours itself
/// (a server's delay, when no admission layer below waits it out). Then the retry goes
/// through the stack under the `Retry`, which admits it. Boxed when it sleeps: only a retry
/// that waits pays for the timer.
pub struct RetryWait {
    sleep: Option<Pin<Box<Sleep>>>,
}

impl RetryWait {
    fn after(wait: Duration) -> Self {
        let sleep = (!wait.is_zero()).then(|| Box::pin(tokio::time::sleep(wait)));
        Self { sleep }
    }
}

impl fmt::Debug for RetryWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let until = self.sleep.as_ref().map(|s| s.deadline());
        f.debug_struct("RetryWait").field("until", &until).finish()
    }
}

impl Future for RetryWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}
