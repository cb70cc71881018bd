use std::{
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response};
use tower::retry::{future::ResponseFuture as RetryFuture, Policy, Retry};
use tower_layer::Layer;
use tower_service::Service;

use crate::{
    admission::Admission,
    classify::{Classify, StatusClassifier},
    cooldown::{service::CooldownShared, Cooldown, FinalAttempt},
    error::AbandonReason,
    retry::{policy::PolicyShared, RetryConfig, RetryPolicy},
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
        Self {
            policy: Arc::new(PolicyShared {
                allowance: allowance.clone(),
                config: retry,
                classifier: classifier.clone(),
            }),
            cooldown: Arc::new(CooldownShared {
                allowance,
                classifier,
            }),
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
        let cooldown = Cooldown::from_shared(admission, self.cooldown.clone());
        AllowanceService {
            inner: Retry::new(RetryPolicy::from_shared(self.policy.clone()), cooldown),
            policy: self.policy.clone(),
        }
    }
}

/// The service [`AllowanceLayer`] builds: Retry → Cooldown → Admission → `S`.
///
/// # Clone
///
/// Clones share the allowance and the configuration; only `S` is cloned.
#[derive(Debug)]
pub struct AllowanceService<S, C = StatusClassifier> {
    inner: Retry<RetryPolicy<C>, Cooldown<Admission<S>, C>>,
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
        self.inner.get_ref().get_ref().get_ref()
    }

    /// The innermost service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut().get_mut().get_mut()
    }

    /// Unwraps the innermost service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner().into_inner().into_inner()
    }
}

/// The response future of [`AllowanceService`].
pub type AllowanceFuture<S, C, B> =
    RetryFuture<RetryPolicy<C>, Cooldown<Admission<S>, C>, Request<B>>;

impl<S, C, B, RB> Service<Request<B>> for AllowanceService<S, C>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    C: Classify,
    RetryPolicy<C>: Policy<Request<B>, Response<RB>, BoxError>,
    B: Clone,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = AllowanceFuture<S, C, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let config = &self.policy.config;
        let last = if !config.replayable(&req) {
            Some(AbandonReason::NotReplayable)
        } else if config.max_attempts.get() <= 1 {
            Some(AbandonReason::MaxAttempts)
        } else {
            None
        };
        if let Some(reason) = last {
            // No retry will follow: a throttling answer is reported as abandoned, and why.
            req.extensions_mut().insert(FinalAttempt(reason));
        }
        self.inner.call(req)
    }
}
