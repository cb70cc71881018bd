use std::task::{Context, Poll};

use http::Request;
use tokio::time::Instant;
use tower_service::Service;

use super::ResponseFuture;
use crate::{
    acquire::{self, AcquireOptions, Begin, OwnedAdmit, Progress},
    extensions::{Attempt, Cost, SentAt},
    retry::ticket::{RetryTicket, Ticket},
    Allowance, BoxError, Deadline,
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

/// Tells the cooldown layer above when the attempt was sent (an adaptive allowance's
/// requests carry a [`SentAt`]).
#[inline]
pub(crate) fn mark_sent<B>(req: &Request<B>, now: Instant) {
    if let Some(sent) = req.extensions().get::<SentAt>() {
        sent.mark(now);
    }
}

/// The admission a request asks for, from its extensions.
pub(crate) fn options_for<B>(req: &Request<B>) -> AcquireOptions {
    let ext = req.extensions();
    AcquireOptions {
        deadline: ext.get::<Deadline>().map(|d| d.0),
        retry: ext.get::<Attempt>().is_some_and(Attempt::is_retry),
        cost: ext.get::<Cost>().map(|c| c.0),
        not_before: None,
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
        // A retry the retry policy already admitted (or gave up on) while it waited.
        if let Some(ticket) = req.extensions().get::<RetryTicket>() {
            match ticket.take() {
                Ticket::Admitted => {
                    mark_sent(&req, Instant::now());
                    return ResponseFuture::called(self.inner.call(req));
                }
                Ticket::Failed(e) => return ResponseFuture::failed(e),
                Ticket::Pending => {}
            }
        }
        let options = options_for(&req);
        let shared = &self.allowance.shared;
        let mut progress = Progress::default();
        let now = Instant::now();
        match acquire::begin(shared, &options, &mut progress, now) {
            // Admitted now: the ready inner service sends it immediately.
            Begin::Ready(Ok(())) => {
                mark_sent(&req, now);
                ResponseFuture::called(self.inner.call(req))
            }
            Begin::Ready(Err(e)) => ResponseFuture::failed(e),
            step => {
                // Keep the service that was polled ready for this request; leave a clone.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                let admit = OwnedAdmit::resume(shared.clone(), options, progress, step);
                let sent = req.extensions().get::<SentAt>().cloned();
                ResponseFuture::waiting(admit, ready, req, sent)
            }
        }
    }
}
