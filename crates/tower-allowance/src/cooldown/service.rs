use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::ResponseFuture;
use crate::{classify::Classify, Allowance, BoxError};

/// Observes responses and raises the allowance's shared cooldown on throttling.
///
/// # Clone
///
/// Clones share the allowance; only the inner service and the classifier are cloned.
#[derive(Clone, Debug)]
pub struct Cooldown<S, C> {
    inner: S,
    allowance: Allowance,
    classifier: C,
}

// === impl Cooldown ===

impl<S, C> Cooldown<S, C> {
    /// Wraps `inner`.
    pub fn new(inner: S, allowance: Allowance, classifier: C) -> Self {
        Self {
            inner,
            allowance,
            classifier,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, C, B, RB> Service<Request<B>> for Cooldown<S, C>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    C: Classify,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, RB, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        ResponseFuture::new(
            self.inner.call(req),
            self.allowance.clone(),
            self.classifier.clone(),
        )
    }
}
