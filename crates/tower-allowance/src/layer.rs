use std::sync::Arc;

use tower::retry::Retry;
use tower_layer::Layer;

use crate::{
    admission::Admission,
    classify::{Classify, StatusClassifier},
    cooldown::Cooldown,
    retry::{policy::PolicyShared, RetryConfig, RetryPolicy},
    Allowance,
};

/// The whole stack from one allowance: Retry → Cooldown → Admission → inner.
///
/// That order is what makes every retry re-enter admission (and spend the budget there),
/// and every response, first or retried, feed the cooldown.
///
/// # Clone
///
/// Cloning this layer does not create a new bucket, cooldown or budget: every service it
/// builds shares the one [`Allowance`] it was given.
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
#[derive(Clone, Debug)]
pub struct AllowanceLayer<C = StatusClassifier> {
    allowance: Allowance,
    /// The allowance and the retry config, shared by every policy (one `Arc` per clone).
    policy: Arc<PolicyShared>,
    classifier: C,
}

impl AllowanceLayer {
    /// The full stack over `allowance`, retrying by `retry`.
    pub fn new(allowance: Allowance, retry: RetryConfig) -> Self {
        Self {
            policy: PolicyShared::new(allowance.clone(), retry),
            allowance,
            classifier: StatusClassifier::default(),
        }
    }
}

impl<C> AllowanceLayer<C> {
    /// Uses `classifier` for both the cooldown and the retry decisions.
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> AllowanceLayer<C2> {
        AllowanceLayer {
            allowance: self.allowance,
            policy: self.policy,
            classifier,
        }
    }
}

impl<S, C: Classify> Layer<S> for AllowanceLayer<C> {
    type Service = Retry<RetryPolicy<C>, Cooldown<Admission<S>, C>>;

    fn layer(&self, inner: S) -> Self::Service {
        let admission = Admission::new(inner, self.allowance.clone());
        let cooldown = Cooldown::new(admission, self.allowance.clone(), self.classifier.clone());
        let policy = RetryPolicy::from_shared(self.policy.clone(), self.classifier.clone());
        Retry::new(policy, cooldown)
    }
}
