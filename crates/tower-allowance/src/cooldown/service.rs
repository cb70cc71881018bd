use std::{
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response};
use tower_service::Service;

use super::ResponseFuture;
use crate::{classify::Classify, extensions::Attempt, Allowance, BoxError};

/// Observes responses and raises the allowance's shared cooldown on throttling.
///
/// # Clone
///
/// Clones share the allowance and the classifier (one `Arc`); only the inner service is
/// cloned.
#[derive(Debug)]
pub struct Cooldown<S, C> {
    inner: S,
    shared: Arc<CooldownShared<C>>,
}

impl<S: Clone, C> Clone for Cooldown<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

/// What every request through one cooldown layer shares.
#[derive(Debug)]
pub(crate) struct CooldownShared<C> {
    pub(crate) allowance: Allowance,
    pub(crate) classifier: C,
}

impl<C> CooldownShared<C> {
    pub(crate) fn new(allowance: Allowance, classifier: C) -> Arc<Self> {
        Arc::new(Self {
            allowance,
            classifier,
        })
    }
}

// === impl Cooldown ===

impl<S, C> Cooldown<S, C> {
    /// Wraps `inner`.
    pub fn new(inner: S, allowance: Allowance, classifier: C) -> Self {
        Self::from_shared(inner, CooldownShared::new(allowance, classifier))
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<CooldownShared<C>>) -> Self {
        Self { inner, shared }
    }

    inner_accessors!();
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
        let attempt = Attempt::of(req.extensions()).unwrap_or_default();
        // One span per attempt, with the allowance's name and the attempt number.
        let span = tracing::debug_span!(
            "allowance_attempt",
            allowance = %self.shared.allowance.name(),
            attempt = attempt.number(),
        );
        let future = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        ResponseFuture::new(future, self.shared.clone(), attempt.last, span)
    }
}
