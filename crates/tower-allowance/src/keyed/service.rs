use std::task::{Context, Poll};

use http::{Request, Response};
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use super::{future::ResponseFuture, key::KeyFn, Keyed, KeyedError};
use crate::{body::Replayable, BoxError};

/// The service [`KeyedLayer`](super::KeyedLayer) builds: looks the request's key up in the
/// registry, then calls the inner service through that key's allowance stack.
///
/// # Clone
///
/// Clones share the registry; only the inner service and the key extractor are cloned.
#[derive(Clone, Debug)]
pub struct KeyedService<S, K> {
    inner: S,
    keyed: Keyed,
    key: K,
}

// === impl KeyedService ===

impl<S, K> KeyedService<S, K> {
    /// Wraps `inner`.
    pub fn new(inner: S, keyed: Keyed, key: K) -> Self {
        Self { inner, keyed, key }
    }

    /// The registry.
    pub fn keyed(&self) -> &Keyed {
        &self.keyed
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

impl<S, K, B, RB> Service<Request<B>> for KeyedService<S, K>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    K: KeyFn<B>,
    B: Replayable + 'static,
    RB: Send + 'static,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B>;

    /// Always ready: each key's stack readies (a clone of) the inner service only once its
    /// request is admitted, so a key that waits holds nothing another key needs.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let entry = match self.key.key(&req) {
            Some(key) => match self.keyed.inner.lookup(&key) {
                Ok(entry) => entry,
                Err(e) => return ResponseFuture::failed(e),
            },
            None => return ResponseFuture::failed(KeyedError::NoKey),
        };
        let stack = entry.layer.layer(self.inner.clone());
        ResponseFuture::running(stack.oneshot(req), entry)
    }
}
