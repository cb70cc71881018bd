use std::{
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
};

use http::Response;
use pin_project_lite::pin_project;

use crate::{
    algorithm,
    allowance::DeferError,
    classify::{Classification, Classify},
    headers, Allowance, BoxError,
};

type DeferFuture = Pin<Box<dyn Future<Output = Result<crate::store::Deferred, DeferError>> + Send>>;

pin_project! {
    /// Response future of [`Cooldown`](super::Cooldown).
    pub struct ResponseFuture<F, RB, C> {
        #[pin]
        inner: F,
        allowance: Allowance,
        classifier: C,
        // A shared store's defer in flight, and the response waiting for it.
        deferring: Option<(DeferFuture, Response<RB>)>,
    }
}

impl<F, RB, C> ResponseFuture<F, RB, C> {
    pub(crate) fn new(inner: F, allowance: Allowance, classifier: C) -> Self {
        Self {
            inner,
            allowance,
            classifier,
            deferring: None,
        }
    }
}

impl<F, RB, C> std::fmt::Debug for ResponseFuture<F, RB, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, E, RB, C> Future for ResponseFuture<F, RB, C>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    C: Classify,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some((defer, _)) = this.deferring {
            let result = ready!(defer.as_mut().poll(cx));
            let (_, response) = this.deferring.take().expect("checked above");
            if let Err(e) = result {
                defer_failed(&e);
            }
            return Poll::Ready(Ok(response));
        }
        let response = ready!(this.inner.poll(cx)).map_err(Into::into)?;
        let allowance: &Allowance = this.allowance;
        if let Some(seen) = headers::rate_limit(response.headers()) {
            *allowance
                .stats()
                .rate_limit
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(seen);
        }
        if this
            .classifier
            .classify(response.status(), response.headers())
            != Classification::Throttled
        {
            allowance.on_not_throttled();
            return Poll::Ready(Ok(response));
        }
        let delay = match headers::retry_after(response.headers()) {
            Ok(Some(delay)) => {
                allowance.on_throttled(true);
                delay
            }
            // No usable Retry-After: no cooldown is invented; it may be a spent quota.
            Ok(None) => {
                allowance.on_throttled(false);
                return Poll::Ready(Ok(response));
            }
            Err(e) => {
                allowance
                    .stats()
                    .abandon(crate::error::AbandonReason::UnrepresentableDelay);
                return Poll::Ready(Err(e.into()));
            }
        };
        let Some(delay_us) = algorithm::micros_ceil(delay) else {
            // `retry_after` never returns more than MAX_DELAY.
            return Poll::Ready(Ok(response));
        };
        if allowance.defer_now(delay_us).is_some() {
            return Poll::Ready(Ok(response));
        }
        // A shared store: the defer is a round trip; hold the response until it lands.
        let shared = allowance.clone();
        let mut defer: DeferFuture = Box::pin(async move { shared.defer(delay).await });
        match defer.as_mut().poll(cx) {
            Poll::Ready(result) => {
                if let Err(e) = result {
                    defer_failed(&e);
                }
                Poll::Ready(Ok(response))
            }
            Poll::Pending => {
                *this.deferring = Some((defer, response));
                Poll::Pending
            }
        }
    }
}

/// The response is still delivered: losing it would be worse than a cooldown that other
/// processes do not hear about. The retry policy still honours the delay for this request.
fn defer_failed(e: &DeferError) {
    tracing::warn!(error = %e, "could not record cooldown in the allowance store");
}
