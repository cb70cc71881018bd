//! [`TrailersLayer`]: a gRPC status in a response's trailers fed to the allowance as the
//! trailers pass ([`FeedAllowance`]), and each attempt's `grpc-timeout` written as it is sent.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
};

use http::{HeaderMap, Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::{
    body::{OnTrailers, WatchTrailers},
    deadline::{format_timeout, GrpcDeadline},
    status::{GrpcResponse, GrpcStatus, Pushback},
    GRPC_RETRY_PUSHBACK_MS, GRPC_TIMEOUT,
};
use crate::{
    classify::{Classification, ServerDelay},
    cooldown::raise_detached,
    rule, Allowance,
};

/// Feeds the allowance from a gRPC status in trailers: a RESOURCE_EXHAUSTED raises the
/// shared cooldown by its `grpc-retry-pushback-ms` (as a throttling response's delay does
/// in the [`CooldownLayer`](crate::cooldown::CooldownLayer)); any other status changes
/// nothing.
#[derive(Clone, Debug)]
pub struct FeedAllowance {
    allowance: Allowance,
}

impl FeedAllowance {
    /// Feeds `allowance`.
    pub fn new(allowance: Allowance) -> Self {
        Self { allowance }
    }
}

impl OnTrailers for FeedAllowance {
    fn on_trailers(self, trailers: &HeaderMap) {
        let Some(status) = GrpcStatus::from_header_map(trailers) else {
            return;
        };
        if status.classification() != Classification::Throttled {
            return;
        }
        match status.pushback().map(Pushback::server_delay) {
            Some(ServerDelay::After(d)) => {
                self.allowance.on_throttled(true);
                let max = self.allowance.config().max_cooldown();
                raise_detached(
                    &self.allowance,
                    rule::micros_ceil(d),
                    (d > max).then(|| format!("{d:?}")),
                );
            }
            // Beyond what can be represented: the allowance closes rather than wait less.
            Some(ServerDelay::TooLong) => {
                let asked = trailers
                    .get(GRPC_RETRY_PUSHBACK_MS)
                    .and_then(|v| v.to_str().ok());
                raise_detached(&self.allowance, None, asked.map(str::to_owned));
            }
            // No delay, or "do not retry": no cooldown is invented.
            _ => self.allowance.on_throttled(false),
        }
    }
}

/// Reads the gRPC status in each response's trailers as they pass, and feeds it to the
/// allowance ([`FeedAllowance`]). Responses keep streaming as they come.
///
/// # Clone
///
/// Cloning this layer does not create a new allowance: every service it builds feeds the
/// same one.
#[derive(Clone, Debug)]
pub struct TrailersLayer {
    allowance: Allowance,
}

impl TrailersLayer {
    /// Feeds `allowance` from trailers.
    pub fn new(allowance: Allowance) -> Self {
        Self { allowance }
    }

    /// The allowance fed.
    pub(super) fn allowance(&self) -> &Allowance {
        &self.allowance
    }
}

impl<S> Layer<S> for TrailersLayer {
    type Service = Trailers<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Trailers {
            inner,
            allowance: self.allowance.clone(),
        }
    }
}

/// The service of [`TrailersLayer`]: each response body is a [`WatchTrailers`] that feeds
/// the allowance from a gRPC response's trailers.
///
/// # Clone
///
/// Clones share the allowance; only `S` is cloned.
#[derive(Clone, Debug)]
pub struct Trailers<S> {
    inner: S,
    allowance: Allowance,
}

impl<S> Trailers<S> {
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

impl<S, B, RB> Service<Request<B>> for Trailers<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<WatchTrailers<RB, FeedAllowance>>;
    type Error = S::Error;
    type Future = TrailersFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    /// Sends the attempt; a call with a `grpc-timeout` (read by [`GrpcLayer`](super::GrpcLayer)) says the time
    /// left before its deadline, now that it is sent.
    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(GrpcDeadline(at)) = req.extensions().get::<GrpcDeadline>() {
            let left = at.saturating_duration_since(Instant::now());
            req.headers_mut().insert(GRPC_TIMEOUT, format_timeout(left));
        }
        TrailersFuture {
            inner: self.inner.call(req),
            allowance: Some(self.allowance.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`Trailers`].
    pub struct TrailersFuture<F> {
        #[pin]
        inner: F,
        allowance: Option<Allowance>,
    }
}

impl<F> fmt::Debug for TrailersFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrailersFuture").finish_non_exhaustive()
    }
}

impl<F, RB, E> Future for TrailersFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<WatchTrailers<RB, FeedAllowance>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let allowance = this
            .allowance
            .take()
            .expect("TrailersFuture polled after completion");
        // Only a call whose status is still to come has trailers worth reading: a
        // trailers-only answer was classified from its headers already.
        let watch = GrpcResponse::from_head(response.status(), response.headers())
            == Some(GrpcResponse::StatusInTrailers);
        let on_trailers = watch.then(|| FeedAllowance::new(allowance));
        Poll::Ready(Ok(
            response.map(|inner| WatchTrailers::watching(inner, on_trailers))
        ))
    }
}
