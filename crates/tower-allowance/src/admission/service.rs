use std::task::{Context, Poll};

use http::Request;
use tower_service::Service;

use super::ResponseFuture;
use crate::{
    acquire::try_admit_now, extensions::Attempt, AcquireOptions, Allowance, BoxError, Deadline,
};

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

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

pub(crate) fn options_for<B>(req: &Request<B>) -> AcquireOptions {
    AcquireOptions {
        deadline: req.extensions().get::<Deadline>().map(|d| d.0),
        spend_retry: req
            .extensions()
            .get::<Attempt>()
            .is_some_and(Attempt::is_retry),
    }
}

impl<S, B> Service<Request<B>> for Admission<S>
where
    S: Service<Request<B>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Request<B>>;

    /// Readiness is the inner service's; it never takes a token.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let options = options_for(&req);
        match try_admit_now(&self.allowance.shared, &options) {
            // Admitted now: the ready inner service sends it immediately.
            Some(Ok(())) => ResponseFuture::called(self.inner.call(req)),
            Some(Err(e)) => ResponseFuture::failed(e),
            None => {
                // Keep the service that was polled ready for this request; leave a clone.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::waiting(self.allowance.acquire_with(options), ready, req)
            }
        }
    }
}
