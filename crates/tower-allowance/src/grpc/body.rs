//! [`WatchTrailers`]: a response body that shows its trailers to a closure as they pass.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// What runs when a [`WatchTrailers`] body's trailers pass: any `FnOnce(&HeaderMap)`, or a
/// named type such as [`FeedAllowance`](super::FeedAllowance) (so that a service's response type can be named).
pub trait OnTrailers {
    /// Called once, with the trailers, just before they are passed on.
    fn on_trailers(self, trailers: &HeaderMap);
}

impl<F: FnOnce(&HeaderMap)> OnTrailers for F {
    fn on_trailers(self, trailers: &HeaderMap) {
        self(trailers)
    }
}

pin_project_lite::pin_project! {
    /// A response body that shows its trailers to `F` as they pass, once.
    ///
    /// Frames are forwarded unchanged and at once: nothing is consumed, copied or
    /// delayed, and `F` sees the trailers (by reference) just before the caller does.
    /// A body that ends without trailers never calls `F`.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use bytes::Bytes;
    /// use http::{HeaderMap, HeaderValue};
    /// use http_body_util::{BodyExt, Full};
    /// use tower_allowance::grpc::{Code, GrpcStatus, WatchTrailers};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// let mut trailers = HeaderMap::new();
    /// trailers.insert("grpc-status", HeaderValue::from_static("8"));
    /// let body = Full::new(Bytes::from_static(b"\0\0\0\0\0")).with_trailers(async { Some(Ok(trailers)) });
    ///
    /// let seen = Arc::new(Mutex::new(None));
    /// let slot = Arc::clone(&seen);
    /// let body = WatchTrailers::new(body, move |trailers: &HeaderMap| {
    ///     *slot.lock().unwrap_or_else(|e| e.into_inner()) = GrpcStatus::from_header_map(trailers);
    /// });
    /// let collected = body.collect().await?;
    /// assert!(collected.trailers().is_some(), "the trailers still reach the caller");
    /// let status = seen.lock().unwrap_or_else(|e| e.into_inner()).map(|s| s.code());
    /// assert_eq!(status, Some(Code::RESOURCE_EXHAUSTED));
    /// # Ok(())
    /// # }
    /// ```
    pub struct WatchTrailers<B, F> {
        // `None`: the stack's own trailers-only answer, an empty body.
        #[pin]
        inner: Option<B>,
        on_trailers: Option<F>,
    }
}

// === impl WatchTrailers ===

impl<B, F> WatchTrailers<B, F> {
    /// Wraps `body`; `on_trailers` runs when its trailers pass, if they do.
    pub fn new(body: B, on_trailers: F) -> Self {
        Self {
            inner: Some(body),
            on_trailers: Some(on_trailers),
        }
    }

    /// Wraps `body`, watching its trailers if there is an `on_trailers`.
    pub(super) fn watching(body: B, on_trailers: Option<F>) -> Self {
        Self {
            inner: Some(body),
            on_trailers,
        }
    }

    /// An empty body, with nothing to watch: the body of the trailers-only answers
    /// [`GrpcLayer`](super::GrpcLayer) makes of the stack's own refusals.
    pub fn empty() -> Self {
        Self {
            inner: None,
            on_trailers: None,
        }
    }

    /// The wrapped body; `None` for an [`empty`](Self::empty) one.
    pub fn get_ref(&self) -> Option<&B> {
        self.inner.as_ref()
    }

    /// The wrapped body, mutably.
    pub fn get_mut(&mut self) -> Option<&mut B> {
        self.inner.as_mut()
    }

    /// The wrapped body, unwrapped (`F` is dropped without being called).
    pub fn into_inner(self) -> Option<B> {
        self.inner
    }
}

impl<B: fmt::Debug, F> fmt::Debug for WatchTrailers<B, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchTrailers")
            .field("inner", &self.inner)
            .field("watching", &self.on_trailers.is_some())
            .finish()
    }
}

impl<B, F> Body for WatchTrailers<B, F>
where
    B: Body,
    F: OnTrailers,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(None);
        };
        let polled = inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(trailers) = frame.trailers_ref() {
                if let Some(on_trailers) = this.on_trailers.take() {
                    on_trailers.on_trailers(trailers);
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(B::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), B::size_hint)
    }
}
