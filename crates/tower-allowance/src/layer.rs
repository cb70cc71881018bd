use std::sync::Arc;

use tower::retry::Retry;
use tower_layer::Layer;

use crate::{
    admission::Admission,
    classify::{Classify, StatusClassifier},
    cooldown::{service::CooldownShared, Cooldown},
    retry::{Prepare, RetryConfig, RetryPolicy},
    Allowance,
};

/// The whole stack from one allowance: Retry → Cooldown → Admission → inner, where Retry is
/// `tower::retry::Retry` with a [`RetryPolicy`], under a [`Prepare`] for the bodies.
///
/// That order is what makes every retry re-enter admission (which admits it like any
/// attempt, spending the budget once, its slot no earlier than the server's wait), and every
/// response, first or retried, feed the cooldown. The service it builds is exactly
/// `Prepare<Retry<RetryPolicy<C>, Cooldown<Admission<S>, C>>>`, its policy told of the
/// admission layer ([`RetryPolicy::over_admission`]): the same as building it by hand from
/// the parts on one allowance.
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
/// use tower_allowance::{Allowance, AllowanceConfig, AllowanceLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// let allowance = Allowance::new(AllowanceConfig::per_second(10, 5)?);
/// let layer = allowance.layer();
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
    policy: RetryPolicy<C>,
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
    /// The full stack over `allowance`, retrying by `retry` (this layer's own rules, in place
    /// of the allowance's) and classifying as the allowance's configuration says:
    /// `allowance.layer().with_retry(retry)`. [`Allowance::layer`] takes the retry rules
    /// from the allowance too.
    pub fn new(allowance: Allowance, retry: RetryConfig) -> Self {
        allowance.layer().with_retry(retry)
    }
}

impl Allowance {
    /// The full stack over this allowance ([`AllowanceLayer`]), classifying and retrying as
    /// its configuration says ([`AllowanceConfig::with_classifier`](crate::AllowanceConfig::with_classifier),
    /// [`with_retry`](crate::AllowanceConfig::with_retry)), like every other layer on it.
    pub fn layer(&self) -> AllowanceLayer {
        AllowanceLayer::of(RetryPolicy::new(self.clone()))
    }
}

impl<C: Classify> AllowanceLayer<C> {
    /// The stack around `policy`: its allowance, its classifier for the cooldown too.
    fn of(policy: RetryPolicy<C>) -> Self {
        // The admission layer under the `Retry` waits out the server's delay for a retry.
        let policy = policy.over_admission();
        let shared = policy.shared();
        let cooldown = CooldownShared::new(shared.allowance.clone(), shared.classifier.clone());
        Self { policy, cooldown }
    }

    /// Uses `classifier` for both the cooldown and the retry decisions of this layer,
    /// instead of the allowance's (an override: other layers on the allowance keep theirs).
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> AllowanceLayer<C2> {
        AllowanceLayer::of(self.policy.with_classifier(classifier))
    }

    /// Retries by `retry` in this layer, instead of the allowance's retry rules (an
    /// override: the budget stays the allowance's, shared with every other layer).
    pub fn with_retry(self, retry: RetryConfig) -> Self {
        Self::of(self.policy.with_config(retry))
    }
}

/// The stack is tower's `Retry` with a [`RetryPolicy`] over [`Cooldown`] over [`Admission`],
/// under a [`Prepare`] that makes each request's body replayable before `Retry` keeps its
/// copy. There is one retry loop, tower's; for each request, `Retry` clones the stack under
/// it (`S` and two `Arc`s) to send the retries.
///
/// It serves `http::Request<B>` for any body `B` that implements
/// [`Replayable`](crate::body::Replayable), and passes the inner service a body of that same
/// type on every attempt: `Full<Bytes>`, `String`, `BoxBody`, hyper's `Incoming`, axum's and
/// tonic's `Body`. A retry sends the body again: cloned when it is cheap to copy, otherwise
/// from a copy of up to [`RetryConfig::replay_cap`] bytes kept while the first attempt
/// streamed. A body longer than that is sent once; a throttling answer to it is returned,
/// marked abandoned ([`AbandonReason::NotReplayable`](crate::error::AbandonReason::NotReplayable)).
///
/// A body type that does not implement `Replayable` is refused where the stack is first
/// used as a service, with a message naming the trait and the bodies that implement it:
///
/// ```compile_fail
/// # use std::convert::Infallible;
/// # use http::{Request, Response};
/// # use tower::{Service, ServiceBuilder};
/// # use tower_allowance::{Allowance, AllowanceConfig, AllowanceLayer};
/// /// Not a body the stack can send again.
/// struct Upload;
///
/// # fn run() {
/// let allowance = Allowance::new(AllowanceConfig::per_second(1, 1).expect("valid"));
/// let mut stack = ServiceBuilder::new()
///     .layer(allowance.layer())
///     .service_fn(|_: Request<Upload>| async { Ok::<_, Infallible>(Response::new(())) });
/// // error[E0277]: `Upload` is not a request body the allowance can replay for a retry
/// let _ = stack.call(Request::new(Upload));
/// # }
/// ```
impl<S, C> Layer<S> for AllowanceLayer<C> {
    type Service = Prepare<Retry<RetryPolicy<C>, Cooldown<Admission<S>, C>>>;

    fn layer(&self, inner: S) -> Self::Service {
        let admission = Admission::new(inner, self.policy.shared().allowance.clone());
        let cooldown = Cooldown::from_shared(admission, self.cooldown.clone());
        Prepare::new(Retry::new(self.policy.clone(), cooldown), &self.policy)
    }
}
