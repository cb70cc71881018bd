//! A `reqwest_middleware::Middleware` that sends every attempt of a reqwest client through a
//! shared [`tower_allowance::Allowance`].
//!
//! [`AllowanceMiddleware`] runs each request through the same stack as
//! [`AllowanceLayer`]: every attempt, first try or retry,
//! is admitted by the allowance; a 429 or 503 with `Retry-After` raises the shared cooldown
//! for everyone using it (in this process, or in every process with a shared store); a retry
//! spends the shared retry budget, and only requests that may be replayed are retried
//! (idempotent methods or `Idempotency-Key`, see
//! [`RetryConfig`]) and only when their body can be
//! sent again: a body in memory is (reqwest clones it), a streamed body is not, and its
//! throttling answer is returned marked abandoned
//! ([`AbandonReason::NotReplayable`](tower_allowance::error::AbandonReason::NotReplayable)).
//!
//! ```no_run
//! use reqwest_middleware::ClientBuilder;
//! use tower_allowance::{Allowance, AllowanceConfig, Outcome};
//! use tower_allowance_reqwest::{outcome, AllowanceMiddleware};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // One allowance per API key, shared by every clone of the client.
//! let allowance = Allowance::new(AllowanceConfig::per_second(2, 2)?);
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(AllowanceMiddleware::new(allowance.clone()))
//!     .build();
//!
//! let result = client.get("http://127.0.0.1:8080/v1/odds").send().await;
//! match outcome(&result) {
//!     Outcome::Completed => println!("{}", result?.text().await?),
//!     Outcome::Unsuccessful(status) => println!("the server said {status}"),
//!     Outcome::Abandoned(reason) => println!("gave up: {reason}"),
//!     other => println!("{other:?}: {:?}", result.err()),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Extensions
//!
//! The middleware chain's extensions are visible to the stack, so a
//! [`Deadline`](tower_allowance::Deadline) or a [`Cost`](tower_allowance::Cost) can be set
//! with `reqwest_middleware::RequestBuilder::with_extension`. Middlewares after this one get a
//! copy of the chain's extensions for each attempt; what they write there is not seen by
//! the caller.
//!
//! # Where it goes in the chain
//!
//! Put it last (closest to the network) unless another middleware must see each attempt:
//! it retries by itself, so a retrying middleware before it would multiply the attempts.

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "settle")]
mod settle;

use std::fmt;

use http::Extensions;
use reqwest_middleware::{Middleware, Next};
use tower::{Layer, ServiceExt};
use tower_allowance::{
    body::{Replay, Replayable},
    classify::{Classify, StatusClassifier},
    retry::RetryConfig,
    Allowance, AllowanceLayer, BoxError, Outcome,
};

/// Sends every attempt of a reqwest client through a shared [`Allowance`].
///
/// See the [crate docs](crate).
///
/// # Clone
///
/// Cloning it does not create a new bucket, cooldown or budget: clones share the
/// [`Allowance`] it was given.
#[derive(Clone)]
pub struct AllowanceMiddleware<C = StatusClassifier> {
    layer: AllowanceLayer<C>,
    /// Settles each attempt's answer (feature `settle`).
    #[cfg(feature = "settle")]
    settle: Option<std::sync::Arc<dyn settle::Settler>>,
}

impl<C: fmt::Debug> fmt::Debug for AllowanceMiddleware<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("AllowanceMiddleware");
        d.field("layer", &self.layer);
        #[cfg(feature = "settle")]
        d.field("settles", &self.settle.is_some());
        d.finish()
    }
}

impl AllowanceMiddleware {
    /// Every attempt through `allowance`, classified and retried as the allowance's
    /// configuration says (`AllowanceConfig::with_classifier` and `with_retry`): exactly as
    /// an [`AllowanceLayer`] on the same allowance, so the shared cooldown reacts to a
    /// response the same whichever client received it.
    pub fn new(allowance: Allowance) -> Self {
        Self {
            layer: allowance.layer(),
            #[cfg(feature = "settle")]
            settle: None,
        }
    }
}

impl<C: Classify> AllowanceMiddleware<C> {
    /// Classifies responses with `classifier` instead of the allowance's classifier (an
    /// override, for this middleware alone).
    pub fn with_classifier<C2: Classify>(self, classifier: C2) -> AllowanceMiddleware<C2> {
        AllowanceMiddleware {
            layer: self.layer.with_classifier(classifier),
            #[cfg(feature = "settle")]
            settle: self.settle,
        }
    }

    /// Retries by `retry` instead of the allowance's retry rules (an override, for this
    /// middleware alone; the retry budget stays the allowance's).
    pub fn with_retry(self, retry: RetryConfig) -> Self {
        Self {
            layer: self.layer.with_retry(retry),
            ..self
        }
    }
}

/// A reqwest request on its way through the stack, as its body: the stack copies it with
/// [`reqwest::Request::try_clone`] for a retry (a body in memory is shared, not copied; a
/// streamed body cannot be cloned, so the request is sent once).
struct Attempt(reqwest::Request);

impl Replayable for Attempt {
    fn prepare(self, _cap: usize) -> (Self, Option<Replay<Self>>) {
        // Reached only when `try_clone` could not copy it: a streamed body.
        (self, None)
    }

    fn try_clone(&self, _cap: usize) -> Option<Self> {
        // In memory already: the cap (for copies kept while streaming) does not apply.
        self.0.try_clone().map(Attempt)
    }
}

/// A reqwest response carried through the stack untouched (its URL, its extensions, its
/// body), under a copy of its head for the stack to read.
struct Carried(reqwest::Response);

#[async_trait::async_trait]
impl<C: Classify> Middleware for AllowanceMiddleware<C> {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let chain: &Extensions = extensions;
        #[cfg(feature = "settle")]
        let settle = self.settle.clone();
        let send = tower::service_fn(move |attempt: http::Request<Attempt>| {
            let next = next.clone();
            let mut extensions = chain.clone();
            #[cfg(feature = "settle")]
            let settle = settle.clone();
            async move {
                #[cfg(feature = "settle")]
                let attempt_extensions = attempt.extensions().clone();
                let Attempt(request) = attempt.into_body();
                let response = next.run(request, &mut extensions).await?;
                // Each attempt settles by its own answer, under the stack (a retry reserves again).
                #[cfg(feature = "settle")]
                let response = match &settle {
                    Some(s) => s.settle(&attempt_extensions, response).await,
                    None => response,
                };
                Ok::<_, reqwest_middleware::Error>(head_of(Carried(response)))
            }
        });
        let result = self.layer.layer(send).oneshot(head_for(req, chain)).await;
        match result {
            Ok(response) => {
                let (parts, Carried(mut response)) = response.into_parts();
                // What the stack learned (classification, abandonment) goes with it.
                response.extensions_mut().extend(parts.extensions);
                Ok(response)
            }
            Err(e) => Err(into_middleware_error(e)),
        }
    }
}

/// The request the stack sees: the reqwest request's head (method, URL, headers) and the
/// chain's extensions, with the request itself as the body.
fn head_for(req: reqwest::Request, chain: &Extensions) -> http::Request<Attempt> {
    let mut head = http::Request::new(());
    *head.method_mut() = req.method().clone();
    if let Ok(uri) = req.url().as_str().parse() {
        *head.uri_mut() = uri;
    }
    *head.version_mut() = req.version();
    *head.headers_mut() = req.headers().clone();
    head.extensions_mut().extend(chain.clone());
    head.map(|()| Attempt(req))
}

/// The response the stack sees: status, version and headers copied, the response inside.
fn head_of(carried: Carried) -> http::Response<Carried> {
    let mut head = http::Response::new(());
    *head.status_mut() = carried.0.status();
    *head.version_mut() = carried.0.version();
    *head.headers_mut() = carried.0.headers().clone();
    head.map(|()| carried)
}

/// The stack's error as reqwest-middleware's: reqwest's own errors as they were, the
/// stack's (abandoned, overloaded, store unavailable...) as `Error::Middleware`, findable
/// along its `chain()` (and by [`outcome`]).
fn into_middleware_error(e: BoxError) -> reqwest_middleware::Error {
    match e.downcast::<reqwest_middleware::Error>() {
        Ok(e) => *e,
        Err(e) => reqwest_middleware::Error::Middleware(anyhow::Error::new(StackError(e))),
    }
}

/// An error of the allowance stack, inside `reqwest_middleware::Error::Middleware`.
///
/// Its `source()` is the stack's error itself (an
/// [`Abandoned`](tower_allowance::error::Abandoned), an
/// [`Overloaded`](tower_allowance::error::Overloaded), ...), so that walking the chain finds
/// it.
#[derive(Debug)]
pub struct StackError(BoxError);

impl StackError {
    /// The stack's error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the allowance stack refused the request")
    }
}

impl std::error::Error for StackError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// How a request through [`AllowanceMiddleware`] ended, as
/// [`Outcome::of`] tells it for the tower stack: a success, a final failure status, an
/// abandonment (with its reason, also for a response returned marked abandoned), or an
/// error.
pub fn outcome(result: &reqwest_middleware::Result<reqwest::Response>) -> Outcome {
    match result {
        Ok(response) => {
            let mut probe = http::Response::new(());
            *probe.status_mut() = response.status();
            *probe.extensions_mut() = response.extensions().clone();
            Outcome::of(&Ok(probe))
        }
        Err(reqwest_middleware::Error::Middleware(e)) => Outcome::of_error(e.as_ref()),
        Err(reqwest_middleware::Error::Reqwest(e)) => Outcome::of_error(e),
    }
}

#[cfg(test)]
mod tests {
    use tower_allowance::error::{AbandonReason, Abandoned};

    use super::*;

    #[test]
    fn stack_errors_stay_findable_and_reqwest_errors_stay_reqwest_errors() {
        let abandoned: BoxError = Box::new(Abandoned::new(AbandonReason::Deadline));
        let e = into_middleware_error(abandoned);
        assert!(matches!(e, reqwest_middleware::Error::Middleware(_)));
        assert_eq!(
            outcome(&Err(e)),
            Outcome::Abandoned(AbandonReason::Deadline)
        );

        let inner = reqwest_middleware::Error::Middleware(anyhow::anyhow!("refused upstream"));
        let e = into_middleware_error(Box::new(inner));
        assert_eq!(e.to_string(), "refused upstream");
        assert_eq!(outcome(&Err(e)), Outcome::Failed);
    }

    #[test]
    fn in_memory_bodies_replay_and_streams_do_not() {
        let url = reqwest::Url::parse("http://127.0.0.1/x").expect("url");
        let mut req = reqwest::Request::new(reqwest::Method::PUT, url);
        *req.body_mut() = Some(reqwest::Body::from("payload"));
        let attempt = Attempt(req);
        let copy = attempt.try_clone(0).expect("in memory");
        assert_eq!(
            copy.0.body().and_then(reqwest::Body::as_bytes),
            Some(&b"payload"[..])
        );
        let (_, replay) = attempt.prepare(0);
        assert!(replay.is_none(), "prepare is for streams: never replayed");

        let url = reqwest::Url::parse("http://127.0.0.1/x").expect("url");
        let mut req = reqwest::Request::new(reqwest::Method::PUT, url);
        *req.body_mut() = Some(reqwest::Body::wrap(String::from("streamed")));
        assert!(
            Attempt(req).try_clone(usize::MAX).is_none(),
            "a stream cannot be cloned"
        );
    }
}
