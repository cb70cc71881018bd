use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use http::{request::Parts, Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::{
    admission::Admission,
    body::{Replay, Replayable},
    classify::{Classify, StatusClassifier},
    cooldown::{service::CooldownShared, Cooldown, FinalAttempt},
    error::AbandonReason,
    retry::{policy::PolicyShared, RetryConfig, RetryPolicy, RetryWait},
    Allowance, BoxError,
};

/// The whole stack from one allowance: Retry → Cooldown → Admission → inner.
///
/// That order is what makes every retry re-enter admission (and spend the budget there),
/// and every response, first or retried, feed the cooldown.
///
/// # Clone
///
/// Cloning this layer does not create a new bucket, cooldown or budget: every service it
/// builds shares the one [`Allowance`] it was given (and one copy of its configuration).
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_allowance::{retry::RetryConfig, Allowance, AllowanceConfig, AllowanceLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// let allowance = Allowance::new(AllowanceConfig::per_second(10, 5)?);
/// let layer = AllowanceLayer::new(allowance, RetryConfig::default());
///
/// // Two services, one allowance.
/// let users = ServiceBuilder::new().layer(layer.clone()).service_fn(|_: Request<String>| async {
///     Ok::<_, Infallible>(Response::new("users"))
/// });
/// let orders = ServiceBuilder::new().layer(layer).service_fn(|_: Request<String>| async {
///     Ok::<_, Infallible>(Response::new("orders"))
/// });
/// users.oneshot(Request::new(String::new())).await?;
/// orders.oneshot(Request::new(String::new())).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct AllowanceLayer<C = StatusClassifier> {
    policy: Arc<PolicyShared<C>>,
    cooldown: Arc<CooldownShared<C>>,
}

impl<C> Clone for AllowanceLayer<C> {
    fn clone(&self) -> Self {
        Self {
            policy: self.policy.clone(),
            cooldown: self.cooldown.clone(),
        }
    }
}

impl AllowanceLayer {
    /// The full stack over `allowance`, retrying by `retry`.
    pub fn new(allowance: Allowance, retry: RetryConfig) -> Self {
        Self::build(allowance, retry, StatusClassifier::default())
    }
}

impl<C: Classify> AllowanceLayer<C> {
    fn build(allowance: Allowance, retry: RetryConfig, classifier: C) -> Self {
        let cooldown = Arc::new(CooldownShared {
            allowance: allowance.clone(),
            classifier: classifier.clone(),
        });
        Self {
            policy: Arc::new(PolicyShared {
                allowance,
                config: retry,
                classifier,
                cooldown: Some(cooldown.clone()),
            }),
            cooldown,
        }
    }
}

impl<C> AllowanceLayer<C> {
    /// Uses `classifier` for both the cooldown and the retry decisions.
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> AllowanceLayer<C2> {
        AllowanceLayer::build(
            self.policy.allowance.clone(),
            self.policy.config.clone(),
            classifier,
        )
    }
}

impl<S, C> Layer<S> for AllowanceLayer<C> {
    type Service = AllowanceService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        let admission = Admission::new(inner, self.policy.allowance.clone());
        AllowanceService {
            inner: Cooldown::from_shared(admission, self.cooldown.clone()),
            policy: self.policy.clone(),
        }
    }
}

/// The service [`AllowanceLayer`] builds: Retry → Cooldown → Admission → `S`.
///
/// It serves `http::Request<B>` for any body `B` that implements
/// [`Replayable`](crate::body::Replayable), and passes the inner service a body of that same
/// type on every attempt: `Full<Bytes>`, `String`, `BoxBody`, hyper's `Incoming`, axum's and
/// tonic's `Body`. A retry sends the body again: cloned when it is cheap to copy, otherwise
/// from a copy of up to [`RetryConfig::replay_cap`] bytes kept while the first attempt
/// streamed. A body longer than that is sent once; a throttling answer to it is returned,
/// marked abandoned ([`AbandonReason::NotReplayable`]).
///
/// A body type that does not implement `Replayable` is refused where the stack is first
/// used as a service, with a message naming the trait and the bodies that implement it:
///
/// ```compile_fail
/// # use std::convert::Infallible;
/// # use http::{Request, Response};
/// # use tower::{ServiceBuilder, ServiceExt};
/// # use tower_allowance::{retry::RetryConfig, Allowance, AllowanceConfig, AllowanceLayer};
/// /// Not a body the stack can send again.
/// struct Upload;
///
/// # async fn run() {
/// let allowance = Allowance::new(AllowanceConfig::per_second(1, 1).expect("valid"));
/// let stack = ServiceBuilder::new()
///     .layer(AllowanceLayer::new(allowance, RetryConfig::default()))
///     .service_fn(|_: Request<Upload>| async { Ok::<_, Infallible>(Response::new(())) });
/// // error[E0277]: `Upload` is not a request body the allowance can replay for a retry
/// let _ = stack.oneshot(Request::new(Upload)).await;
/// # }
/// ```
///
/// # Clone
///
/// Clones share the allowance and the configuration; only `S` is cloned.
#[derive(Debug)]
pub struct AllowanceService<S, C = StatusClassifier> {
    inner: Cooldown<Admission<S>, C>,
    policy: Arc<PolicyShared<C>>,
}

impl<S: Clone, C> Clone for AllowanceService<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            policy: self.policy.clone(),
        }
    }
}

impl<S, C> AllowanceService<S, C> {
    /// The innermost service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref().get_ref()
    }

    /// The innermost service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut().get_mut()
    }

    /// Unwraps the innermost service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner().into_inner()
    }
}

impl<S, C, B, RB> Service<Request<B>> for AllowanceService<S, C>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    C: Classify,
    B: Replayable,
    RB: Send + 'static,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = AllowanceFuture<S, C, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let config = &self.policy.config;
        let (spare, last) = if !config.replayable(&req) {
            (None, Some(AbandonReason::NotReplayable))
        } else if config.max_attempts.get() <= 1 {
            (None, Some(AbandonReason::MaxAttempts))
        } else if let Some(copy) = req.body().try_clone(config.replay_cap) {
            (Some(Spare::Copy(copy)), None)
        } else {
            let (parts, body) = req.into_parts();
            let (body, replay) = body.prepare(config.replay_cap);
            req = Request::from_parts(parts, body);
            match replay {
                Some(replay) => (Some(Spare::Replay(replay)), None),
                // Known to be over the cap already: sent once.
                None => (None, Some(AbandonReason::NotReplayable)),
            }
        };
        if let Some(reason) = last {
            // No retry will follow: a throttling answer is reported as abandoned, and why.
            req.extensions_mut().insert(FinalAttempt(reason));
        }
        let retry = match spare {
            None => None,
            Some(spare) => Some(Retrying {
                policy: RetryPolicy::from_shared(self.policy.clone()),
                // For the retries: the innermost service only; the stack around it is rebuilt
                // from the policy's handles if a retry comes.
                inner: Some(self.inner.get_ref().get_ref().clone()),
                service: None,
                head: head_of(&req),
                spare,
                next: None,
            }),
        };
        AllowanceFuture {
            state: State::Called {
                future: self.inner.call(req),
            },
            retry,
        }
    }
}

/// A copy of `req`'s head, cloned field by field (the request itself is not moved).
fn head_of<B>(req: &Request<B>) -> Parts {
    let (mut head, ()) = Request::new(()).into_parts();
    head.method = req.method().clone();
    head.uri = req.uri().clone();
    head.version = req.version();
    head.headers = req.headers().clone();
    head.extensions = req.extensions().clone();
    head
}

/// Where the body of a retry comes from.
enum Spare<B> {
    /// A copy taken by reference ([`Replayable::try_clone`]), copied again for each retry.
    Copy(B),
    /// A copy kept while the first attempt streamed.
    Replay(Replay<B>),
}

impl<B: Replayable> Spare<B> {
    fn body(&self, cap: usize) -> Option<B> {
        match self {
            Self::Copy(body) => body.try_clone(cap),
            Self::Replay(replay) => replay.body(),
        }
    }
}

/// What a request that may be retried keeps for its retries.
struct Retrying<S, C, B> {
    policy: RetryPolicy<C>,
    /// The innermost service, until a retry needs the stack around it.
    inner: Option<S>,
    /// The stack for the retries; polled ready before each.
    service: Option<Cooldown<Admission<S>, C>>,
    /// The request's head; the policy marks its extensions for each retry.
    head: Parts,
    spare: Spare<B>,
    /// The body of the next attempt, made when the policy decided on it.
    next: Option<B>,
}

pin_project! {
    /// The response future of [`AllowanceService`]: one request's attempts, each through
    /// the cooldown and admission layers, with the retry policy deciding in between.
    pub struct AllowanceFuture<S, C, B>
    where
        Cooldown<Admission<S>, C>: Service<Request<B>>,
    {
        #[pin]
        state: State<<Cooldown<Admission<S>, C> as Service<Request<B>>>::Future>,
        // `None` for a request that will not be retried: nothing kept.
        retry: Option<Retrying<S, C, B>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // An attempt in flight.
        Called { #[pin] future: F },
        // The policy's wait (backoff, then the retry's admission).
        Waiting { #[pin] wait: RetryWait },
        // Waiting for the inner service to be ready for the retry.
        Retrying,
    }
}

impl<S, C, B> fmt::Debug for AllowanceFuture<S, C, B>
where
    Cooldown<Admission<S>, C>: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllowanceFuture")
            .field("retryable", &self.retry.is_some())
            .finish_non_exhaustive()
    }
}

impl<S, C, B, RB> Future for AllowanceFuture<S, C, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    C: Classify,
    B: Replayable,
    RB: Send + 'static,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    let mut result = ready!(future.poll(cx));
                    let Some(retry) = this.retry.as_mut() else {
                        return Poll::Ready(result);
                    };
                    let cap = retry.policy.config().replay_cap;
                    let (spare, next) = (&retry.spare, &mut retry.next);
                    let wait =
                        retry
                            .policy
                            .after_attempt(&mut retry.head.extensions, &mut result, || {
                                *next = spare.body(cap);
                                next.is_some()
                            });
                    match wait {
                        Some(wait) => this.state.set(State::Waiting { wait }),
                        None => return Poll::Ready(result),
                    }
                }
                StateProj::Waiting { wait } => {
                    ready!(wait.poll(cx));
                    this.state.set(State::Retrying);
                }
                StateProj::Retrying => {
                    let retry = this
                        .retry
                        .as_mut()
                        .expect("only a request that may be retried waits for a retry");
                    let service = retry.service.get_or_insert_with(|| {
                        let shared = retry.policy.shared();
                        let inner = retry
                            .inner
                            .take()
                            .expect("the inner service is kept until the first retry");
                        let cooldown = shared
                            .cooldown
                            .clone()
                            .expect("an AllowanceLayer's policy has the cooldown's handle");
                        Cooldown::from_shared(
                            Admission::new(inner, shared.allowance.clone()),
                            cooldown,
                        )
                    });
                    ready!(service.poll_ready(cx))?;
                    let body = retry.next.take().expect("a retry is planned with its body");
                    let future = service.call(Request::from_parts(retry.head.clone(), body));
                    this.state.set(State::Called { future });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
