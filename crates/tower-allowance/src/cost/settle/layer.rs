//! `SettleLayer`: settles every attempt that passes it to what its answer used.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{ready, Context, Poll},
};

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{
    body::{Pending, Tail},
    SettleBody, UsageReader,
};
use crate::{shared::Shared, Allowance, Cost};

/// The body bytes kept by default to read the usage from (the last 64 KiB).
const DEFAULT_MAX_BODY: usize = 64 * 1024;

/// Settles every attempt under an [`AllowanceLayer`](crate::AllowanceLayer) to what its
/// answer used (see the [module docs](super), which show it in a stack).
///
/// Put it *under* the allowance's layer (it sees each attempt, retries included, after its
/// admission) and give it the same [`Allowance`]. The reservation is the request's
/// [`Cost`] (1 when unset), as the admission charged it.
#[derive(Clone)]
pub struct SettleLayer<R> {
    shared: Arc<Shared>,
    reader: R,
    max_body: usize,
    share: Arc<AtomicU64>,
}

impl<R> fmt::Debug for SettleLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleLayer")
            .field("allowance", &self.shared.name())
            .field("max_body", &self.max_body)
            .finish()
    }
}

impl<R: UsageReader> SettleLayer<R> {
    /// Settles the attempts admitted by `allowance`, reading usage with `reader`.
    pub fn new(allowance: &Allowance, reader: R) -> Self {
        Self {
            shared: allowance.shared.clone(),
            reader,
            max_body: DEFAULT_MAX_BODY,
            share: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The share of unused reservations coming back (0 to 1), as the last settlement through
    /// this layer (or its services) found it: configured, or learned so far.
    pub fn share(&self) -> f64 {
        self.share.load(Ordering::Relaxed) as f64 / 1000.0
    }

    /// Keeps the last `bytes` of each body to read the usage from (default 64 KiB; the usage
    /// of a stream comes last).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }
}

impl<S, R: Clone> Layer<S> for SettleLayer<R> {
    type Service = SettleService<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        SettleService {
            inner,
            shared: self.shared.clone(),
            reader: self.reader.clone(),
            max_body: self.max_body,
            share: self.share.clone(),
        }
    }
}

/// The service a [`SettleLayer`] makes.
#[derive(Clone)]
pub struct SettleService<S, R> {
    inner: S,
    shared: Arc<Shared>,
    reader: R,
    max_body: usize,
    share: Arc<AtomicU64>,
}

impl<S: fmt::Debug, R> fmt::Debug for SettleService<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleService")
            .field("inner", &self.inner)
            .field("allowance", &self.shared.name())
            .finish()
    }
}

impl<S, R, ReqB, ResB> Service<Request<ReqB>> for SettleService<S, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    R: UsageReader,
{
    type Response = Response<SettleBody<ResB, R>>;
    type Error = S::Error;
    type Future = SettleFuture<S::Future, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let reserved = req.extensions().get::<Cost>().map_or(1, |Cost(c)| *c);
        let pending = Pending {
            #[cfg(feature = "shares")]
            class: super::class_of(&self.shared, req.extensions()),
            shared: self.shared.clone(),
            reserved,
            reading: None,
            sent: tokio::time::Instant::now(),
            done: false,
            share: self.share.clone(),
        };
        SettleFuture {
            inner: self.inner.call(req),
            pending: Some(pending),
            reader: Some(self.reader.clone()),
            max_body: self.max_body,
        }
    }
}

pin_project! {
    /// The future of a [`SettleService`]: the answer, its body wrapped to settle at its end.
    /// Dropped before the answer, it settles the whole reservation (the request may have been
    /// charged).
    pub struct SettleFuture<F, R> {
        #[pin]
        inner: F,
        pending: Option<Pending>,
        reader: Option<R>,
        max_body: usize,
    }
}

impl<F, R> fmt::Debug for SettleFuture<F, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleFuture")
            .field("settled", &self.pending.is_none())
            .finish()
    }
}

impl<F, R, ResB, E> Future for SettleFuture<F, R>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    R: UsageReader,
{
    type Output = Result<Response<SettleBody<ResB, R>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let (Some(mut pending), Some(reader)) = (this.pending.take(), this.reader.take()) else {
            // Polled after completion: the inner future answers as it does.
            return Poll::Ready(result.map(|r| r.map(|b| SettleBody::new(b, None))));
        };
        let response = match result {
            Ok(response) => response,
            Err(e) => {
                // A transport failure: the provider may have charged it; nothing comes back.
                pending.settle(None);
                return Poll::Ready(Err(e));
            }
        };
        pending.reading = reader.reading(response.headers());
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            pending.refused();
            return Poll::Ready(Ok(response.map(|b| SettleBody::new(b, None))));
        }
        if let Some(used) = reader.used_from_headers(response.status(), response.headers()) {
            pending.settle(Some(used));
            return Poll::Ready(Ok(response.map(|b| SettleBody::new(b, None))));
        }
        let tail = Tail::new(pending, reader, *this.max_body);
        Poll::Ready(Ok(response.map(|b| SettleBody::new(b, Some(tail)))))
    }
}
