//! [`Prepare`]: the one step `tower::retry::Retry` needs before it, for a [`RetryPolicy`].

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use http::Request;
use tower_service::Service;

use super::{RetryConfig, RetryPolicy};
use crate::{body::Replayable, error::AbandonReason, extensions::Attempt};

/// Prepares each request for a `tower::retry::Retry` that uses a [`RetryPolicy`], then
/// calls it: [`RetryPolicy::prepare`] as a service.
///
/// `Retry` asks the policy for the copy of a request it keeps for the retries
/// ([`clone_request`](tower::retry::Policy::clone_request)) before the first attempt
/// starts, so the body has to be made replayable before `Retry` sees it. A body that is
/// cheap to copy is left as it is; a stream keeps a copy of up to
/// [`replay_cap`](RetryConfig::replay_cap) bytes while the first attempt sends it (a
/// [`Replay`](crate::body::Replay) in the request's extensions, where the policy finds
/// it). A request no retry will follow (its method, `max_attempts` of 1, a body known to
/// be over the cap) is marked so that a throttling answer to it is reported as abandoned,
/// with the reason, not as final.
///
/// Nothing else: the response future is `S`'s own, and the retry loop is `Retry`'s.
/// [`AllowanceLayer`](crate::AllowanceLayer) builds exactly
/// `Prepare<Retry<RetryPolicy<C>, Cooldown<Admission<S>, C>>>`.
///
/// ```
/// use std::sync::{
///     atomic::{AtomicUsize, Ordering},
///     Arc,
/// };
/// use bytes::Bytes;
/// use http::{HeaderValue, Request, Response, StatusCode};
/// use http_body_util::{combinators::BoxBody, BodyExt, StreamBody};
/// use tower::{retry::Retry, service_fn, ServiceExt};
/// use tower_allowance::{
///     retry::{Prepare, RetryConfig, RetryPolicy},
///     Allowance, AllowanceConfig, BoxError,
/// };
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let allowance = Allowance::new(AllowanceConfig::per_second(10, 10)?);
/// let policy = RetryPolicy::new(allowance);
///
/// // Answers 429 to the first attempt, then the body it read.
/// let calls = Arc::new(AtomicUsize::new(0));
/// let server = service_fn(move |req: Request<BoxBody<Bytes, BoxError>>| {
///     let first = calls.fetch_add(1, Ordering::Relaxed) == 0;
///     async move {
///         let body = req.into_body().collect().await?.to_bytes();
///         let mut res = Response::new(body);
///         if first {
///             *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
///             res.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
///         }
///         Ok::<_, BoxError>(res)
///     }
/// });
/// let stack = Prepare::new(Retry::new(policy.clone(), server), &policy);
///
/// // A streamed body: not `Clone`, sent again from the copy kept while it streamed.
/// let chunks = ["order", "=42"].map(|c| Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(c))));
/// let body = StreamBody::new(futures_util::stream::iter(chunks)).boxed();
/// let res = stack.oneshot(Request::put("/orders").body(body)?).await?;
/// assert_eq!(res.status(), StatusCode::OK);
/// assert_eq!(res.body(), "order=42");
/// # Ok(())
/// # }
/// ```
///
/// # Clone
///
/// Clones share the policy's configuration (an `Arc`); only `S` is cloned.
#[derive(Clone, Debug)]
pub struct Prepare<S> {
    inner: S,
    config: Arc<RetryConfig>,
}

impl<S> Prepare<S> {
    /// Wraps `inner`, preparing requests for `policy` (the policy of the `Retry` that
    /// `inner` is, or holds).
    pub fn new<C>(inner: S, policy: &RetryPolicy<C>) -> Self {
        let config = policy.config_handle().clone();
        Self { inner, config }
    }

    inner_accessors!();
}

impl<S, B> Service<Request<B>> for Prepare<S>
where
    S: Service<Request<B>>,
    B: Replayable + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    /// Readiness is the inner service's.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.inner.call(prepare(&self.config, req))
    }
}

/// [`RetryPolicy::prepare`], from the policy's configuration alone.
pub(crate) fn prepare<B: Replayable + 'static>(
    config: &RetryConfig,
    request: Request<B>,
) -> Request<B> {
    let (mut parts, body) = request.into_parts();
    let (body, last) = if !config.replayable_parts(&parts) {
        (body, Some(AbandonReason::NotReplayable))
    } else if config.max_attempts.get() <= 1 {
        (body, Some(AbandonReason::MaxAttempts))
    } else if body.try_clone(config.replay_cap).is_some() {
        (body, None)
    } else {
        match body.prepare(config.replay_cap) {
            (body, Some(replay)) => {
                parts.extensions.insert(replay);
                (body, None)
            }
            (body, None) => (body, Some(AbandonReason::NotReplayable)),
        }
    };
    if let Some(reason) = last {
        // The attempt's record: the cooldown layer marks a throttling answer to it abandoned.
        let record = Attempt::of(&parts.extensions).unwrap_or_default();
        parts.extensions.insert(Attempt {
            last: Some(reason),
            ..record
        });
    }
    Request::from_parts(parts, body)
}
