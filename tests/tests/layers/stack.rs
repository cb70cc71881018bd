//! The stack with bodies that are not `Clone`: compile tests for each body type a client
//! stack declares, and what a retry sends.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{
    combinators::{BoxBody, UnsyncBoxBody},
    BodyExt, Full, StreamBody,
};
use tower::Service;
use tower::{service_fn, ServiceBuilder, ServiceExt};

use tower_allowance::{
    error::AbandonReason, retry::RetryConfig, Allowance, AllowanceConfig, BoxError, Outcome,
};

// === compile tests: the layer accepts each body type, and hands the same type on ===

fn allowance() -> Allowance {
    Allowance::new(AllowanceConfig::per_second(10, 10).expect("valid"))
}

/// Builds the stack over a service of `Request<B>` and checks it serves `Request<B>`.
fn accepts<B>()
where
    B: tower_allowance::body::Replayable + Send + 'static,
{
    fn assert_service<S: Service<Request<B>>, B>(_: &S) {}
    let stack = ServiceBuilder::new()
        .layer(allowance().layer())
        .service(service_fn(|_req: Request<B>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    assert_service::<_, B>(&stack);
}

#[test]
fn the_layer_accepts_every_client_body_type() {
    accepts::<Full<Bytes>>();
    accepts::<String>();
    accepts::<()>();
    accepts::<BoxBody<Bytes, BoxError>>();
    accepts::<UnsyncBoxBody<Bytes, BoxError>>();
    accepts::<hyper::body::Incoming>();
    accepts::<axum_core::body::Body>();
    accepts::<tonic::body::Body>();
}

// === what a retry sends ===

type Item = Result<Frame<Bytes>, BoxError>;

/// A streamed body of unknown length: `chunks` frames, each ready at once.
fn streamed(chunks: &[&'static [u8]]) -> BoxBody<Bytes, BoxError> {
    let items: Vec<Item> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::from_static(c))))
        .collect();
    let body = StreamBody::new(futures_util::stream::iter(items));
    assert_eq!(body.size_hint().upper(), None, "unknown length");
    body.boxed()
}

fn throttled() -> Response<String> {
    let mut res = Response::new(String::new());
    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    res.headers_mut()
        .insert("retry-after", HeaderValue::from_static("1"));
    res
}

/// A server that reads each request body whole (unless `read` is false), records it, and
/// answers 429 to the first `throttle` attempts, then 200.
#[derive(Clone)]
struct Server {
    seen: Arc<Mutex<Vec<Bytes>>>,
    throttle: usize,
    read: bool,
}

impl Server {
    fn new(throttle: usize) -> Self {
        Self {
            seen: Arc::default(),
            throttle,
            read: true,
        }
    }

    fn seen(&self) -> Vec<Bytes> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn serve<B>(self, req: Request<B>) -> Result<Response<String>, BoxError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let body = if self.read {
            req.into_body()
                .collect()
                .await
                .map_err(Into::into)?
                .to_bytes()
        } else {
            Bytes::new()
        };
        let attempt = {
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            seen.push(body);
            seen.len()
        };
        Ok(if attempt <= self.throttle {
            throttled()
        } else {
            Response::new("ok".to_owned())
        })
    }
}

fn put<B>(body: B) -> Request<B> {
    let mut req = Request::new(body);
    *req.method_mut() = Method::PUT;
    req
}

async fn send<B>(
    allowance: &Allowance,
    retry: RetryConfig,
    server: &Server,
    req: Request<B>,
) -> Result<Response<String>, BoxError>
where
    B: tower_allowance::body::Replayable + Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let server = server.clone();
    ServiceBuilder::new()
        .layer(allowance.layer().with_retry(retry))
        .service(service_fn(move |req| server.clone().serve(req)))
        .oneshot(req)
        .await
}

#[tokio::test(start_paused = true)]
async fn a_streamed_body_under_the_cap_is_replayed_byte_for_byte() {
    let allowance = allowance();
    let server = Server::new(1);
    let chunks: &[&'static [u8]] = &[b"{\"order\":", b"42,", b"\"qty\":7}"];
    let result = send(
        &allowance,
        RetryConfig::default().with_replay_cap(64),
        &server,
        put(streamed(chunks)),
    )
    .await;
    assert_eq!(Outcome::of(&result), Outcome::Completed);
    let whole = Bytes::from_static(b"{\"order\":42,\"qty\":7}");
    assert_eq!(server.seen(), vec![whole.clone(), whole]);
    let snapshot = allowance.snapshot();
    assert_eq!((snapshot.admitted, snapshot.retries_spent), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_streamed_body_over_the_cap_is_sent_once_and_not_retried() {
    let allowance = allowance();
    let server = Server::new(1);
    let chunks: &[&'static [u8]] = &[b"0123456789", b"0123456789", b"0123456789"];
    let result = send(
        &allowance,
        RetryConfig::default().with_replay_cap(16),
        &server,
        put(streamed(chunks)),
    )
    .await;
    // The 429 is the answer, marked: not a success, not a silent final failure.
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::NotReplayable)
    );
    assert_eq!(
        result.as_ref().map(Response::status).ok(),
        Some(StatusCode::TOO_MANY_REQUESTS)
    );
    // Sent once, whole: the cap bounds the copy, not the request.
    assert_eq!(server.seen(), vec![Bytes::from(chunks.concat())]);
    let snapshot = allowance.snapshot();
    assert_eq!((snapshot.admitted, snapshot.retries_spent), (1, 0));
    assert_eq!(snapshot.abandoned.get(AbandonReason::NotReplayable), 1);
    // The cooldown still heard the 429.
    assert!(snapshot.cooling_for.is_some_and(|d| d > Duration::ZERO));
}

#[tokio::test(start_paused = true)]
async fn a_body_known_to_exceed_the_cap_is_marked_before_it_is_sent() {
    let allowance = allowance();
    let server = Server::new(1);
    let body: BoxBody<Bytes, BoxError> = Full::new(Bytes::from_static(b"0123456789"))
        .map_err(|never| match never {})
        .boxed();
    let result = send(
        &allowance,
        RetryConfig::default().with_replay_cap(4),
        &server,
        put(body),
    )
    .await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::NotReplayable)
    );
    assert_eq!(server.seen().len(), 1);
    assert_eq!(
        allowance
            .snapshot()
            .abandoned
            .get(AbandonReason::NotReplayable),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_an_unread_body_streams_what_the_first_attempt_never_read() {
    let allowance = allowance();
    // The first attempt is answered without its body being read (a server that refuses
    // before reading); the retry must still send every byte.
    let server = Server {
        read: false,
        ..Server::new(1)
    };
    let reading = Server::new(0);
    let seen = reading.seen.clone();
    let calls = Arc::new(Mutex::new(0usize));
    let stack = ServiceBuilder::new()
        .layer(allowance.layer())
        .service(service_fn(move |req: Request<BoxBody<Bytes, BoxError>>| {
            let first = {
                let mut calls = calls.lock().unwrap_or_else(PoisonError::into_inner);
                *calls += 1;
                *calls == 1
            };
            let (server, reading) = (server.clone(), reading.clone());
            async move {
                if first {
                    server.serve(req).await
                } else {
                    reading.serve(req).await
                }
            }
        }));
    let chunks: &[&'static [u8]] = &[b"abc", b"def"];
    let result = stack.oneshot(put(streamed(chunks))).await;
    assert_eq!(Outcome::of(&result), Outcome::Completed);
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(seen, vec![Bytes::from_static(b"abcdef")]);
}

#[tokio::test(start_paused = true)]
async fn clonable_bodies_are_replayed_whatever_the_cap() {
    let allowance = allowance();
    let server = Server::new(1);
    let body = Full::new(Bytes::from_static(b"0123456789"));
    let result = send(
        &allowance,
        RetryConfig::default().with_replay_cap(0),
        &server,
        put(body),
    )
    .await;
    assert_eq!(Outcome::of(&result), Outcome::Completed);
    assert_eq!(server.seen().len(), 2);

    // A `String` is copied, so the cap applies to it.
    let server = Server::new(1);
    let result = send(
        &allowance,
        RetryConfig::default().with_replay_cap(4),
        &server,
        put("0123456789".to_owned()),
    )
    .await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::NotReplayable)
    );
    assert_eq!(server.seen().len(), 1);
}

/// `RetryPolicy` alone, under tower's `Retry`: `prepare` puts the replay handle where
/// `clone_request` finds it.
#[tokio::test(start_paused = true)]
async fn the_policy_alone_replays_a_prepared_stream() {
    use tower::retry::Retry;

    use tower_allowance::{cooldown::CooldownLayer, retry::RetryPolicy};

    let allowance = allowance();
    let server = Server::new(1);
    let policy = RetryPolicy::new(allowance.clone());
    let inner = {
        let server = server.clone();
        ServiceBuilder::new()
            .layer(CooldownLayer::new(allowance.clone()))
            .service(service_fn(move |req| server.clone().serve(req)))
    };
    let chunks: &[&'static [u8]] = &[b"one,", b"two"];
    let req = policy.prepare(put(streamed(chunks)));
    let result = Retry::new(policy, inner).oneshot(req).await;
    assert_eq!(Outcome::of(&result), Outcome::Completed);
    let whole = Bytes::from_static(b"one,two");
    assert_eq!(server.seen(), vec![whole.clone(), whole]);

    // Without `prepare`, a stream is not retried: its 429 is the answer.
    let server = Server::new(1);
    let policy = RetryPolicy::new(allowance.clone());
    let inner = {
        let server = server.clone();
        ServiceBuilder::new()
            .layer(CooldownLayer::new(allowance))
            .service(service_fn(move |req| server.clone().serve(req)))
    };
    let result = Retry::new(policy, inner)
        .oneshot(put(streamed(chunks)))
        .await;
    assert_eq!(
        result.as_ref().map(Response::status).ok(),
        Some(StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(server.seen().len(), 1);
}
