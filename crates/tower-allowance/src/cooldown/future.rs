use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, PoisonError},
    task::{ready, Context, Poll},
};

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::service::CooldownShared;
use crate::{
    classify::{Classification, Classified, Classify, ServerDelay},
    error::{AbandonReason, Abandoned},
    headers,
    rule::{self, Op, Reply},
    shared::Applying,
    store::{StoreError, StoreFuture},
    Allowance, BoxError,
};

pin_project! {
    /// Response future of [`Cooldown`](super::Cooldown).
    pub struct ResponseFuture<F, RB, C> {
        #[pin]
        inner: F,
        shared: Arc<CooldownShared<C>>,
        final_attempt: Option<AbandonReason>,
        // A shared store's cooldown raise in flight, and the response waiting for it.
        deferring: Option<(StoreFuture<Reply>, Instant, Response<RB>)>,
    }
}

impl<F, RB, C> ResponseFuture<F, RB, C> {
    pub(crate) fn new(
        inner: F,
        shared: Arc<CooldownShared<C>>,
        final_attempt: Option<AbandonReason>,
    ) -> Self {
        Self {
            inner,
            shared,
            final_attempt,
            deferring: None,
        }
    }
}

impl<F, RB, C> std::fmt::Debug for ResponseFuture<F, RB, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("deferring", &self.deferring.is_some())
            .finish_non_exhaustive()
    }
}

/// Classifies a response once: what it means, and the wait it asks for.
pub(crate) fn classify<C: Classify>(
    classifier: &C,
    status: http::StatusCode,
    response_headers: &http::HeaderMap,
) -> Classified {
    classifier.classify_response(status, response_headers)
}

/// The wait a throttling or transient response asks for, from its headers: `Retry-After`.
/// The one place the default classification reads a server's delay.
pub(crate) fn server_delay(response_headers: &http::HeaderMap) -> Option<ServerDelay> {
    match headers::retry_after(response_headers) {
        Ok(Some(d)) => Some(ServerDelay::After(d)),
        Ok(None) => None,
        Err(_) => Some(ServerDelay::TooLong),
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
        if let Some((defer, now, _)) = this.deferring {
            let result = ready!(defer.as_mut().poll(cx));
            let now = *now;
            let Some((_, _, response)) = this.deferring.take() else {
                unreachable!("checked above");
            };
            deferred(&this.shared.allowance, now, result);
            return Poll::Ready(Ok(response));
        }
        let response = ready!(this.inner.poll(cx)).map_err(Into::into)?;
        let (mut parts, body) = response.into_parts();
        let shared: &CooldownShared<C> = this.shared;
        let allowance = &shared.allowance;
        if let Some(seen) = headers::rate_limit(&parts.headers) {
            *allowance
                .shared
                .stats
                .rate_limit
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(seen);
        }
        let classified = classify(&shared.classifier, parts.status, &parts.headers);
        // Handed on to the retry policy and `Outcome::of`. A success that any reader would
        // call one anyway (2xx/3xx) carries nothing: an extension costs allocations, and the
        // fast path makes none.
        if classified.class != Classification::Success || !plainly_successful(parts.status) {
            parts.extensions.insert(classified);
        }
        let retryable = matches!(
            classified.class,
            Classification::Throttled | Classification::Transient
        );
        if let (true, Some(reason)) = (retryable, *this.final_attempt) {
            // No retry follows: report it as abandoned, not as final.
            allowance.shared.stats.abandon(reason);
            parts.extensions.insert(Abandoned::new(reason));
        }
        let response = Response::from_parts(parts, body);
        let delay_us = match (classified.class, classified.delay) {
            (Classification::Success, _) => {
                allowance.on_success();
                return Poll::Ready(Ok(response));
            }
            (Classification::Throttled, Some(ServerDelay::After(d))) => {
                allowance.on_throttled(true);
                rule::micros_ceil(d)
            }
            // An unrepresentable wait closes the allowance (the rule decides).
            (Classification::Throttled, Some(ServerDelay::TooLong)) => None,
            // No usable delay (or "do not retry"): no cooldown is invented; it may be a
            // spent quota.
            (Classification::Throttled, None | Some(ServerDelay::DoNotRetry)) => {
                allowance.on_throttled(false);
                return Poll::Ready(Ok(response));
            }
            _ => return Poll::Ready(Ok(response)),
        };
        let now = Instant::now();
        match allowance.shared.apply(now, Op::Defer { delay_us }) {
            Applying::Done(result) => {
                deferred(&shared.allowance, now, result);
                Poll::Ready(Ok(response))
            }
            Applying::Pending(mut fut) => match fut.as_mut().poll(cx) {
                Poll::Ready(result) => {
                    deferred(&shared.allowance, now, result);
                    Poll::Ready(Ok(response))
                }
                Poll::Pending => {
                    // A shared store: hold the response until the cooldown is recorded, so the
                    // retry that follows is scheduled after it.
                    *this.deferring = Some((fut, now, response));
                    Poll::Pending
                }
            },
        }
    }
}

/// What readers assume of a response without a [`Classified`] extension.
pub(crate) fn plainly_successful(status: http::StatusCode) -> bool {
    status.is_success() || status.is_redirection() || status.is_informational()
}

/// Raises the shared cooldown outside a response future (a gRPC status in trailers, seen
/// after the response was handed on): at once on an in-memory store, in a task on a shared
/// one.
pub(crate) fn raise_detached(allowance: &Allowance, delay_us: Option<u64>) {
    let now = Instant::now();
    match allowance.shared.apply(now, Op::Defer { delay_us }) {
        Applying::Done(result) => deferred(allowance, now, result),
        Applying::Pending(fut) => match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let allowance = allowance.clone();
                handle.spawn(async move { deferred(&allowance, now, fut.await) });
            }
            Err(_) => tracing::warn!("no tokio runtime to record a cooldown seen in trailers"),
        },
    }
}

/// The cooldown raise's answer. A failure is logged, and the response still delivered: losing
/// it would be worse than a cooldown the other processes do not hear of.
fn deferred(allowance: &Allowance, now: Instant, result: Result<Reply, StoreError>) {
    match result {
        Ok(Reply::Defer(d)) => allowance.shared.after_defer(now, &d),
        Ok(_) => tracing::warn!("the allowance store answered a cooldown raise out of contract"),
        Err(e) => tracing::warn!(
            allowance = &*allowance.shared.name,
            error = %e,
            cause = ?std::error::Error::source(&e).map(ToString::to_string),
            "could not record the cooldown in the allowance store"
        ),
    }
}
