//! [`GrpcLayer`]: the whole allowance stack for a tonic `Channel`.

use tower::retry::Retry;
use tower_layer::Layer;

use super::{
    call::GrpcCall,
    classify::GrpcClassifier,
    trailers::{Trailers, TrailersLayer},
};
use crate::{
    admission::Admission,
    cooldown::Cooldown,
    retry::{Prepare, RetryConfig, RetryPolicy},
    Allowance, AllowanceLayer,
};

/// The whole allowance stack for gRPC: a [`GrpcCall`] (deadlines in, outcomes out) over
/// [`AllowanceLayer`] with a [`GrpcClassifier`], over a [`TrailersLayer`] feeding the same
/// allowance. For a tonic `Channel`.
///
/// gRPC calls are POSTs: a call is retried only if its method is listed in the
/// [`RetryConfig`] (`with_replayable_methods([Method::POST])` when every call is
/// idempotent) or it carries `Idempotency-Key`; otherwise a RESOURCE_EXHAUSTED is returned
/// as is, marked abandoned ([`AbandonReason::NotReplayable`](crate::error::AbandonReason::NotReplayable)).
/// The [module docs](super#deadlines-and-what-a-tonic-caller-sees) say what a call's
/// `grpc-timeout` does and what a tonic caller is told.
///
/// # Clone
///
/// Cloning this layer does not create a new bucket, cooldown or budget.
#[derive(Clone, Debug)]
pub struct GrpcLayer {
    allowance: AllowanceLayer<GrpcClassifier>,
    trailers: TrailersLayer,
}

impl GrpcLayer {
    /// The gRPC stack over `allowance`, retrying by the allowance's retry rules and
    /// classifying answers without a gRPC status by the allowance's classifier.
    pub fn new(allowance: Allowance) -> Self {
        let http = allowance.config().classifier();
        Self {
            trailers: TrailersLayer::new(allowance.clone()),
            allowance: allowance
                .layer()
                .with_classifier(GrpcClassifier::new().with_http(http)),
        }
    }

    /// Retries by `retry` instead of the allowance's retry rules (this layer alone).
    pub fn with_retry(mut self, retry: RetryConfig) -> Self {
        self.allowance = self.allowance.with_retry(retry);
        self
    }
}

impl<S> Layer<S> for GrpcLayer {
    type Service = GrpcCall<
        Prepare<
            Retry<RetryPolicy<GrpcClassifier>, Cooldown<Admission<Trailers<S>>, GrpcClassifier>>,
        >,
    >;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcCall::new(
            self.allowance.layer(self.trailers.layer(inner)),
            self.trailers.allowance().clone(),
        )
    }
}
