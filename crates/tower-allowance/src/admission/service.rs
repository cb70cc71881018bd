use std::task::{Context, Poll};

use http::Request;
use tokio::time::Instant;
use tower_service::Service;

use super::ResponseFuture;
use crate::{
    acquire::{self, Begin, OwnedAdmit, Progress},
    extensions::{AcquireOptions, Attempt, Cost, SentAt},
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

    /// Always ready: admission is no scarce resource (a full queue is a verdict of `call`),
    /// and the inner service is readied only once a request is admitted (module docs).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Nothing is decided here: the first poll asks for admission, so a future dropped
        // unpolled takes no token (and reserves no slot).
        let service = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, service);
        ResponseFuture::start(self.allowance.shared.clone(), inner, req)
    }
}

/// The first poll of an admission future: asks for admission for `req` (or takes the retry
/// policy's ticket) and, admitted now, readies `inner` and calls it; otherwise the step the
/// future then waits on.
pub(crate) fn begin_call<S, B>(
    shared: &std::sync::Arc<crate::shared::Shared>,
    mut inner: S,
    req: Request<B>,
    cx: &mut Context<'_>,
) -> ResponseFuture<S, Request<B>>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    let options = options_for(&req);
    let mut progress = Progress::default();
    let now = Instant::now();
    let step = match req.extensions().get::<RetryTicket>().map(RetryTicket::take) {
        // A retry the retry policy already admitted (or gave up on) while it waited.
        Some(Ticket::Admitted) => Begin::Ready(Ok(())),
        Some(Ticket::Failed(e)) => Begin::Ready(Err(e)),
        _ => acquire::begin(shared, &options, &mut progress, now),
    };
    match step {
        // Admitted now: sent now if the inner service is ready now.
        Begin::Ready(Ok(())) => match inner.poll_ready(cx) {
            Poll::Ready(Ok(())) => {
                mark_sent(&req, now);
                ResponseFuture::called(inner.call(req))
            }
            Poll::Ready(Err(e)) => ResponseFuture::failed(e.into()),
            // The future waits for that readiness (the waker is registered), by the deadline.
            Poll::Pending => ResponseFuture::waiting(None, options.deadline, inner, req),
        },
        Begin::Ready(Err(e)) => ResponseFuture::failed(e.into_box()),
        step => {
            let admit = OwnedAdmit::resume(shared.clone(), options, progress, step);
            ResponseFuture::waiting(Some(admit), options.deadline, inner, req)
        }
    }
}
