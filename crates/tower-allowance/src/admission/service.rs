use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::ResponseFuture;
use crate::{Allowance, BoxError};

/// Waits for the shared allowance before each call reaches the inner service.
///
/// # Clone
///
/// Clones share the allowance; only the inner service is cloned.
#[derive(Clone, Debug)]
pub struct Admission<S> {
    inner: S,
    allowance: Allowance,
}

// === impl Admission ===

impl<S> Admission<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, allowance: Allowance) -> Self {
        Self { inner, allowance }
    }

    inner_accessors!();
}

impl<S, B, RB> Service<Request<B>> for Admission<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B>;

    /// Always ready: admission is no scarce resource (a full queue is a verdict of the
    /// future's first poll), and the inner service is readied only once a request is
    /// admitted (module docs).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Nothing is decided here: the future's first poll asks for admission, so a future
        // dropped unpolled takes no token (and reserves no slot). The inner service that was
        // polled ready stays here; the future gets a clone, readied only once admitted.
        let service = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, service);
        ResponseFuture::new(self.allowance.shared.clone(), inner, req)
    }
}
