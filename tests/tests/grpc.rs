//! The `grpc` module through its public API, over fake channels (`tower::service_fn`) in
//! virtual time: `WatchTrailers`, `GrpcClassifier`, and `GrpcLayer`'s retries, cooldowns,
//! deadlines and refusals. Against a real tonic server and client: `grpc_tonic.rs`.

use std::{
    cell::Cell,
    fmt,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, StreamBody};
use proptest::prelude::*;
use tower::{ServiceBuilder, ServiceExt};
use tower_allowance::{
    classify::{Classification, Classify, ServerDelay},
    error::AbandonReason,
    grpc::{
        Code, GrpcClassifier, GrpcLayer, GrpcResponse, GrpcStatus, Pushback, WatchTrailers,
        X_ALLOWANCE_ABANDONED, X_ALLOWANCE_COOLED, X_ALLOWANCE_WAITED,
    },
    retry::RetryConfig,
    Allowance, AllowanceConfig, BoxError, Outcome,
};

const GRPC_STATUS: &str = "grpc-status";
const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_static(value));
    }
    map
}

// === WatchTrailers ===

type Item = Result<Frame<Bytes>, std::convert::Infallible>;

fn stream(items: Vec<Item>) -> StreamBody<futures::stream::Iter<std::vec::IntoIter<Item>>> {
    StreamBody::new(futures::stream::iter(items))
}

/// Every frame, polled with a no-op waker (the test bodies are always ready).
fn frames<B: Body + Unpin>(mut body: B) -> Vec<Frame<B::Data>>
where
    B::Error: fmt::Debug,
{
    let mut frames = Vec::new();
    let mut cx = Context::from_waker(Waker::noop());
    while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
        frames.push(frame.expect("infallible"));
    }
    frames
}

#[test]
fn watch_trailers_without_trailers_never_calls_and_keeps_hints() {
    let called = Cell::new(false);
    let watched = WatchTrailers::new(Full::new(Bytes::from_static(b"plain")), |_: &HeaderMap| {
        called.set(true)
    });
    assert_eq!(watched.size_hint().exact(), Some(5));
    assert!(!watched.is_end_stream());
    assert_eq!(
        watched.get_ref().map(|b| b.size_hint().exact()),
        Some(Some(5))
    );
    let frames = frames(watched);
    assert_eq!(frames.len(), 1);
    assert!(!called.get());
}

#[tokio::test]
async fn watch_trailers_collects_like_the_inner_body() -> Result<(), std::convert::Infallible> {
    let trailers = map(&[("grpc-status", "0")]);
    let body = Full::new(Bytes::from_static(b"ok")).with_trailers({
        let trailers = trailers.clone();
        async move { Some(Ok(trailers)) }
    });
    let seen = Cell::new(None);
    let collected = WatchTrailers::new(body, |t: &HeaderMap| {
        seen.set(GrpcStatus::from_header_map(t))
    })
    .collect()
    .await?;
    assert_eq!(collected.trailers(), Some(&trailers));
    assert_eq!(collected.to_bytes(), "ok");
    assert_eq!(seen.get().map(|s| s.code()), Some(Code::OK));
    Ok(())
}

// === GrpcClassifier ===

#[test]
fn the_classifier_reads_grpc_statuses_and_leaves_the_rest_to_http() {
    let grpc = ("content-type", "application/grpc");
    let c = GrpcClassifier::new();
    let cases: &[(
        &str,
        StatusCode,
        HeaderMap,
        Classification,
        Option<ServerDelay>,
    )] = &[
        (
            "RESOURCE_EXHAUSTED with pushback",
            StatusCode::OK,
            map(&[
                grpc,
                ("grpc-status", "8"),
                ("grpc-retry-pushback-ms", "1500"),
            ]),
            Classification::Throttled,
            Some(ServerDelay::After(Duration::from_millis(1500))),
        ),
        (
            "RESOURCE_EXHAUSTED, negative pushback: do not retry",
            StatusCode::OK,
            map(&[grpc, ("grpc-status", "8"), ("grpc-retry-pushback-ms", "-5")]),
            Classification::Throttled,
            Some(ServerDelay::DoNotRetry),
        ),
        (
            "RESOURCE_EXHAUSTED, pushback beyond MAX_DELAY",
            StatusCode::OK,
            map(&[
                grpc,
                ("grpc-status", "8"),
                ("grpc-retry-pushback-ms", "9223372036854775807"),
            ]),
            Classification::Throttled,
            Some(ServerDelay::TooLong),
        ),
        (
            "UNAVAILABLE with a pushback: throttling, the wait is shared",
            StatusCode::OK,
            map(&[
                grpc,
                ("grpc-status", "14"),
                ("grpc-retry-pushback-ms", "250"),
            ]),
            Classification::Throttled,
            Some(ServerDelay::After(Duration::from_millis(250))),
        ),
        (
            "UNAVAILABLE: transient",
            StatusCode::OK,
            map(&[grpc, ("grpc-status", "14")]),
            Classification::Transient,
            None,
        ),
        (
            "INVALID_ARGUMENT with a pushback: final, the pushback is not read",
            StatusCode::OK,
            map(&[grpc, ("grpc-status", "3"), ("grpc-retry-pushback-ms", "10")]),
            Classification::Failure,
            None,
        ),
        (
            "OK in the headers",
            StatusCode::OK,
            map(&[grpc, ("grpc-status", "0")]),
            Classification::Success,
            None,
        ),
        (
            "status in the trailers: the head is fine",
            StatusCode::OK,
            map(&[grpc]),
            Classification::Success,
            None,
        ),
        (
            "a proxy's 429 with Retry-After: the wait is the dialect's to read, in the stack",
            StatusCode::TOO_MANY_REQUESTS,
            map(&[grpc, ("retry-after", "2")]),
            Classification::Throttled,
            None,
        ),
        (
            "a proxy's 404",
            StatusCode::NOT_FOUND,
            HeaderMap::new(),
            Classification::Failure,
            None,
        ),
    ];
    for (name, status, headers, class, delay) in cases {
        let classified = c.classify_response(*status, headers);
        assert_eq!(
            (classified.class, classified.delay),
            (*class, *delay),
            "{name}"
        );
        assert_eq!(c.classify(*status, headers), *class, "{name}");
    }
}

// === in the stack ===

fn grpc_allowance() -> Allowance {
    Allowance::new(AllowanceConfig::per_second(10, 10).expect("valid"))
}

fn retry_posts() -> RetryConfig {
    RetryConfig::default().with_replayable_methods([Method::POST])
}

fn call() -> Request<String> {
    let mut req = Request::new(String::new());
    *req.method_mut() = Method::POST;
    req
}

/// A channel answering `first` (trailers-only headers) to the first call, then OK.
fn channel(
    first: &'static [(&'static str, &'static str)],
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_req: Request<String>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut res = Response::new(String::new());
            res.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/grpc"));
            let fields: &[(&str, &str)] = if n == 0 {
                first
            } else {
                &[("grpc-status", "0")]
            };
            for (name, value) in fields {
                res.headers_mut()
                    .append(*name, HeaderValue::from_static(value));
            }
            Ok::<_, BoxError>(res)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn resource_exhausted_is_retried_after_its_pushback_and_cools_everyone() {
    let allowance = grpc_allowance();
    let calls = Arc::new(AtomicUsize::new(0));
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
        .service(channel(
            &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "1500")],
            calls.clone(),
        ));
    let start = tokio::time::Instant::now();
    let result = stack.oneshot(call()).await;
    assert_eq!(Outcome::of(&result), Outcome::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    let snapshot = allowance.snapshot();
    assert_eq!((snapshot.deferred, snapshot.retries_spent), (1, 1));
}

/// gRPC retries draw on the allowance's shared budget like HTTP's: four calls against a
/// channel that always answers RESOURCE_EXHAUSTED, with a budget of two retries for the
/// whole allowance, make exactly six attempts (the first call spends both retries and
/// ends at its cap of three; the others are refused a retry), and none ends as a success.
#[tokio::test(start_paused = true)]
async fn grpc_retries_draw_on_the_shared_budget() {
    let allowance = Allowance::new(
        AllowanceConfig::per_second(10, 10)
            .expect("valid")
            .with_retry_budget(tower_allowance::RetryBudgetConfig::fixed(2)),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let always_exhausted = tower::service_fn(move |_req: Request<String>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut res = Response::new(String::new());
            let h = res.headers_mut();
            h.insert("content-type", HeaderValue::from_static("application/grpc"));
            h.insert("grpc-status", HeaderValue::from_static("8"));
            h.insert("grpc-retry-pushback-ms", HeaderValue::from_static("100"));
            Ok::<_, BoxError>(res)
        }
    });
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
        .service(always_exhausted);
    let first = stack.clone().oneshot(call()).await;
    assert_eq!(
        Outcome::of(&first),
        Outcome::Abandoned(AbandonReason::MaxAttempts)
    );
    for _ in 0..3 {
        let result = stack.clone().oneshot(call()).await;
        assert_eq!(
            Outcome::of(&result),
            Outcome::Abandoned(AbandonReason::BudgetExhausted)
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        6,
        "four first attempts, two retries"
    );
    assert_eq!(allowance.snapshot().retries_spent, 2);
}

#[tokio::test(start_paused = true)]
async fn a_negative_pushback_is_not_retried_and_invents_no_cooldown() {
    let allowance = grpc_allowance();
    let calls = Arc::new(AtomicUsize::new(0));
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
        .service(channel(
            &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "-1")],
            calls.clone(),
        ));
    let result = stack.oneshot(call()).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The server's answer is final: a failure on an HTTP 200, never a success.
    assert_eq!(Outcome::of(&result), Outcome::Unsuccessful(StatusCode::OK));
    let snapshot = allowance.snapshot();
    assert_eq!((snapshot.deferred, snapshot.cooling_for), (0, None));
    assert_eq!(snapshot.abandoned.total(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_post_not_marked_replayable_is_answered_once_and_marked_abandoned() {
    let allowance = grpc_allowance();
    let calls = Arc::new(AtomicUsize::new(0));
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()))
        .service(channel(
            &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "700")],
            calls.clone(),
        ));
    let result = stack.oneshot(call()).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::NotReplayable)
    );
    // Still fed to the shared cooldown.
    assert_eq!(
        allowance.store_state().await.expect("memory").blocked_for,
        Duration::from_millis(700)
    );
}

/// A streamed call whose RESOURCE_EXHAUSTED comes in the trailers, after a message.
fn streamed_call(
    status: &'static str,
) -> impl tower::Service<
    Request<String>,
    Response = Response<StreamBody<futures::stream::Iter<std::vec::IntoIter<Item>>>>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_req: Request<String>| async move {
        let trailers = map(&[("grpc-status", status), ("grpc-retry-pushback-ms", "3000")]);
        let mut res = Response::new(stream(vec![
            Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\x02hi"))),
            Ok(Frame::trailers(trailers)),
        ]));
        res.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        Ok::<_, BoxError>(res)
    })
}

#[tokio::test(start_paused = true)]
async fn a_status_in_the_trailers_feeds_the_cooldown_as_it_passes() -> Result<(), BoxError> {
    let allowance = grpc_allowance();
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
        .service(streamed_call("8"));
    let response = stack.oneshot(call()).await?;
    // The head is handed on at once; nothing is known yet.
    assert_eq!(allowance.store_state().await?.blocked_for, Duration::ZERO);
    let collected = response.into_body().collect().await?;
    // Every frame reached the caller, trailers included...
    assert_eq!(
        collected.trailers().and_then(|t| t.get("grpc-status")),
        Some(&HeaderValue::from_static("8"))
    );
    assert_eq!(collected.to_bytes(), Bytes::from_static(b"\0\0\0\0\x02hi"));
    // ...and the pushback now holds everyone sharing the allowance.
    assert_eq!(
        allowance.store_state().await?.blocked_for,
        Duration::from_secs(3)
    );
    assert_eq!(allowance.snapshot().deferred, 1);

    // An OK in the trailers changes nothing.
    let allowance = grpc_allowance();
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
        .service(streamed_call("0"));
    let response = stack.oneshot(call()).await?;
    response.into_body().collect().await?;
    assert_eq!(allowance.store_state().await?.blocked_for, Duration::ZERO);
    Ok(())
}

/// `n`th attempt (trailers-only fields).
fn recording(
    answer: fn(usize) -> &'static [(&'static str, &'static str)],
    seen: Arc<std::sync::Mutex<Vec<String>>>,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |req: Request<String>| {
        let timeout = req.headers().get("grpc-timeout");
        let timeout = timeout.and_then(|t| t.to_str().ok()).unwrap_or("none");
        let mut seen = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.push(timeout.to_owned());
        let fields = answer(seen.len() - 1);
        async move {
            let mut res = Response::new(String::new());
            res.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/grpc"));
            for (name, value) in fields {
                res.headers_mut()
                    .append(*name, HeaderValue::from_static(value));
            }
            Ok::<_, BoxError>(res)
        }
    })
}

const EXHAUSTED_1S: &[(&str, &str)] = &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "1000")];
const OK: &[(&str, &str)] = &[("grpc-status", "0")];

fn timed_call(timeout: &'static str) -> Request<String> {
    let mut req = call();
    req.headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static(timeout));
    req
}

#[tokio::test(start_paused = true)]
async fn each_attempt_sends_the_time_left_in_grpc_timeout() -> Result<(), BoxError> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let first_refused = |n| if n == 0 { EXHAUSTED_1S } else { OK };
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(grpc_allowance()).with_retry(retry_posts()))
        .service(recording(first_refused, seen.clone()));
    let start = tokio::time::Instant::now();
    let result = stack.oneshot(timed_call("1500000u")).await;
    assert_eq!(Outcome::of(&result), Outcome::Completed);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(*seen.lock().expect("not poisoned"), ["1500000u", "500000u"]);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_would_pass_the_deadline_ends_the_call_marked() -> Result<(), BoxError> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let allowance = grpc_allowance();
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
        .service(recording(|_| EXHAUSTED_1S, seen.clone()));
    let start = tokio::time::Instant::now();
    let result = stack.oneshot(timed_call("1500m")).await;
    // Attempts at 0 and 1,000 ms; one at 2,000 ms would pass the deadline: not made.
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    // Each attempt says the time left, the first one too (in the most precise unit).
    assert_eq!(*seen.lock().expect("not poisoned"), ["1500000u", "500000u"]);
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
    let answer = result?;
    assert_eq!(
        answer.headers()["grpc-status"],
        "8",
        "the server's own status"
    );
    assert_eq!(answer.headers()[X_ALLOWANCE_ABANDONED], "deadline");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_passes_in_the_queue_is_refused_at_once() -> Result<(), BoxError> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let allowance = grpc_allowance();
    allowance.extend_cooldown(Duration::from_secs(3)).await?;
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
        .service(recording(|_| OK, seen.clone()));
    let start = tokio::time::Instant::now();
    let result = stack.oneshot(timed_call("300m")).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(
        seen.lock().expect("not poisoned").is_empty(),
        "nothing sent"
    );
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
    let answer = result?;
    let headers = answer.headers();
    assert_eq!(headers["grpc-status"], "4", "DEADLINE_EXCEEDED");
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers[X_ALLOWANCE_ABANDONED], "deadline");
    assert!(headers.get("grpc-retry-pushback-ms").is_none());
    assert!(answer.body().is_end_stream(), "trailers-only");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_and_a_closure_answer_with_the_wait_left() -> Result<(), BoxError> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let config = AllowanceConfig::per_second(1, 1)?
        .exact()
        .with_max_waiters(0);
    let allowance = Allowance::new(config.with_max_cooldown(Duration::from_secs(10))?);
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
        .service(recording(|_| OK, seen.clone()));
    stack.clone().oneshot(call()).await?;
    // The burst is spent and nobody may wait: UNAVAILABLE, come back in a second.
    let full = stack.clone().oneshot(call()).await?;
    let headers = full.headers();
    assert_eq!(headers["grpc-status"], "14");
    assert_eq!(headers["grpc-retry-pushback-ms"], "1000");
    assert_eq!(headers[X_ALLOWANCE_ABANDONED], "overloaded");
    assert_eq!(
        headers["grpc-message"], "allowance wait queue is full",
        "{headers:?}"
    );

    // A wait beyond max_cooldown closes the allowance (until the server's time, 60 s: never
    // shortened to max_cooldown): RESOURCE_EXHAUSTED, relaying the time until it reopens.
    allowance.extend_cooldown(Duration::from_secs(60)).await?;
    tokio::time::advance(Duration::from_millis(250)).await;
    let closed = stack.oneshot(call()).await?;
    let headers = closed.headers();
    assert_eq!(headers["grpc-status"], "8");
    assert_eq!(headers["grpc-retry-pushback-ms"], "59750");
    assert_eq!(headers[X_ALLOWANCE_ABANDONED], "cooldown_too_long");
    assert_eq!(seen.lock().expect("not poisoned").len(), 1, "one call sent");
    Ok(())
}

// === a deadline that passes while an attempt is in flight ===

/// A `grpc-timeout` value as a duration (the values the stack writes).
fn grpc_timeout(value: &str) -> Duration {
    let (n, unit) = value.split_at(value.len() - 1);
    let n: u64 = n.parse().expect("digits");
    match unit {
        "n" => Duration::from_nanos(n),
        "u" => Duration::from_micros(n),
        "m" => Duration::from_millis(n),
        "S" => Duration::from_secs(n),
        "M" => Duration::from_secs(n * 60),
        "H" => Duration::from_secs(n * 3600),
        other => panic!("unit {other:?}"),
    }
}

/// A gRPC answer: trailers-only OK.
fn grpc_ok() -> Response<String> {
    let mut res = Response::new(String::new());
    let headers = res.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static("0"));
    res
}

/// A channel with tonic's timer (`GrpcTimeout`, inside `Channel`): set from the attempt's
/// `grpc-timeout` when the attempt is sent, it ends the attempt with an error
/// (`TimeoutExpired`) if the server has not answered by then. The server answers OK after
/// `slow`, and at once a call without a `grpc-timeout`. Records each attempt's value.
fn channel_with_a_timer(
    slow: Duration,
    seen: Arc<std::sync::Mutex<Vec<String>>>,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |req: Request<String>| {
        let timeout = req.headers().get("grpc-timeout");
        let timeout = timeout.and_then(|t| t.to_str().ok()).map(str::to_owned);
        seen.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(timeout.clone().unwrap_or_else(|| "none".to_owned()));
        let timer = timeout.as_deref().map(grpc_timeout).map(tokio::time::sleep);
        async move {
            let Some(timer) = timer else {
                return Ok::<_, BoxError>(grpc_ok());
            };
            // The answer first, as tonic polls it first.
            tokio::select! {
                biased;
                () = tokio::time::sleep(slow) => Ok(grpc_ok()),
                () = timer => Err("timeout expired".into()),
            }
        }
    })
}

/// A call still in flight at its deadline ends there, as DEADLINE_EXCEEDED marked
/// `deadline` and counted once, even where the channel's timer, set from the `grpc-timeout`
/// the attempt was sent with (rounded down), fires before the deadline: calls started at odd
/// instants and sent after waits that are not whole milliseconds (a slot every 1/3 s, 1/7 s
/// or 1/30 s), with timeouts in each unit. The attempt was sent, and the call ends less than
/// 2 ms after its deadline: tokio rounds a timer up to a whole millisecond, and paused time
/// moves on in whole milliseconds from where it stands (here, between two).
#[tokio::test(start_paused = true)]
async fn an_attempt_the_channel_times_out_ends_the_call_at_its_deadline() -> Result<(), BoxError> {
    let cases: [(u64, u32, &str); 6] = [
        (0, 10, "1000m"),
        (400, 3, "1000m"),
        (999_999, 3, "700m"),
        (123_456, 7, "1500000u"),
        (1, 30, "99999999n"),
        (777, 7, "2S"),
    ];
    for (offset_ns, rate, timeout) in cases {
        let case = format!("{offset_ns} ns, {rate}/s, {timeout}");
        let allowance = Allowance::new(AllowanceConfig::per_second(rate, 1)?.exact());
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let slow = Duration::from_secs(10);
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
            .service(channel_with_a_timer(slow, seen.clone()));
        // The burst, spent by a call without a deadline: the next waits for its slot.
        stack.clone().oneshot(call()).await?;
        tokio::time::advance(Duration::from_nanos(offset_ns)).await;
        let start = tokio::time::Instant::now();
        let result = stack.oneshot(timed_call(timeout)).await;
        let elapsed = start.elapsed();
        assert_eq!(
            Outcome::of(&result),
            Outcome::Abandoned(AbandonReason::Deadline),
            "{case}"
        );
        let answer = result?;
        let headers = answer.headers();
        assert_eq!(headers["grpc-status"], "4", "{case}: DEADLINE_EXCEEDED");
        assert_eq!(headers[X_ALLOWANCE_ABANDONED], "deadline", "{case}");
        assert!(answer.body().is_end_stream(), "{case}: trailers-only");
        let deadline = grpc_timeout(timeout);
        assert!(
            elapsed + Duration::from_micros(1) > deadline
                && elapsed < deadline + Duration::from_millis(2),
            "{case}: ended after {elapsed:?}"
        );
        let seen = seen.lock().expect("not poisoned").clone();
        assert_eq!(seen.len(), 2, "{case}: the burst and the attempt: {seen:?}");
        let sent_with = grpc_timeout(&seen[1]);
        assert!(
            sent_with > Duration::ZERO && sent_with < deadline,
            "{case}: {seen:?}"
        );
        let abandoned = allowance.snapshot().abandoned;
        assert_eq!(abandoned.get(AbandonReason::Deadline), 1, "{case}");
        assert_eq!(abandoned.total(), 1, "{case}");
    }
    Ok(())
}

/// A channel that never answers (no timer of its own): the call ends at its deadline.
#[tokio::test(start_paused = true)]
async fn a_call_whose_channel_never_answers_ends_at_its_deadline() -> Result<(), BoxError> {
    let allowance = grpc_allowance();
    let silent = tower::service_fn(|_req: Request<String>| {
        std::future::pending::<Result<Response<String>, BoxError>>()
    });
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()))
        .service(silent);
    let start = tokio::time::Instant::now();
    // Bounded, so that a call that never ends fails the test rather than hangs it.
    let result = tokio::time::timeout(Duration::from_secs(10), stack.oneshot(timed_call("300m")))
        .await
        .expect("ends at its deadline");
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
    let answer = result?;
    let headers = answer.headers();
    assert_eq!(headers["grpc-status"], "4", "DEADLINE_EXCEEDED");
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers[X_ALLOWANCE_ABANDONED], "deadline");
    assert!(headers.get("grpc-retry-pushback-ms").is_none());
    let abandoned = allowance.snapshot().abandoned;
    assert_eq!(abandoned.get(AbandonReason::Deadline), 1);
    assert_eq!(abandoned.total(), 1);
    Ok(())
}

/// Whichever timer is seen first: an error from the attempt in flight once the time it was
/// given has run out is the deadline's, even when the stack's own timer cannot answer (the
/// task's cooperative budget spent, tokio's timers say `Pending`). The channel here gives up
/// without a tokio timer, so the budget does not hold its error back.
#[tokio::test(start_paused = true)]
async fn an_error_once_the_attempts_time_is_out_is_the_deadlines_whichever_timer_is_seen(
) -> Result<(), BoxError> {
    let allowance = grpc_allowance();
    let gives_up = tower::service_fn(|req: Request<String>| {
        let given = req
            .headers()
            .get("grpc-timeout")
            .and_then(|t| t.to_str().ok());
        let until =
            tokio::time::Instant::now() + given.map(grpc_timeout).unwrap_or(Duration::MAX / 4);
        std::future::poll_fn(move |_cx| {
            if tokio::time::Instant::now() >= until {
                Poll::Ready(Err::<Response<String>, BoxError>("timeout expired".into()))
            } else {
                Poll::Pending
            }
        })
    });
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()))
        .service(gives_up);
    let mut call = std::pin::pin!(stack.oneshot(timed_call("300m")));
    assert!(
        futures::poll!(call.as_mut()).is_pending(),
        "sent, in flight"
    );
    tokio::time::advance(Duration::from_millis(300)).await;
    // One poll of the call with the task's budget spent.
    let polled = std::future::poll_fn(|cx| {
        for _ in 0..10_000 {
            if !tokio::task::coop::has_budget_remaining() {
                break;
            }
            let _ = std::pin::pin!(tokio::task::consume_budget()).poll(cx);
        }
        assert!(!tokio::task::coop::has_budget_remaining(), "budget spent");
        Poll::Ready(call.as_mut().poll(cx))
    })
    .await;
    let Poll::Ready(result) = polled else {
        panic!("the channel's error answers the call in that poll");
    };
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
    let answer = result?;
    assert_eq!(answer.headers()["grpc-status"], "4", "DEADLINE_EXCEEDED");
    assert_eq!(answer.headers()[X_ALLOWANCE_ABANDONED], "deadline");
    assert_eq!(
        allowance.snapshot().abandoned.get(AbandonReason::Deadline),
        1
    );
    Ok(())
}

/// An error before the deadline is the channel's own (a connection refused): passed on as
/// it is, not taken for the deadline's.
#[tokio::test(start_paused = true)]
async fn an_error_before_the_deadline_is_passed_on() {
    let allowance = grpc_allowance();
    let refused = tower::service_fn(|_req: Request<String>| async {
        tokio::time::sleep(Duration::from_millis(299)).await;
        Err::<Response<String>, BoxError>("connection refused".into())
    });
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance.clone()))
        .service(refused);
    let result = stack.oneshot(timed_call("300m")).await;
    assert_eq!(Outcome::of(&result), Outcome::Failed);
    let error = result.err().map(|e| e.to_string());
    assert_eq!(error.as_deref(), Some("connection refused"));
    assert_eq!(allowance.snapshot().abandoned.total(), 0);
}

// === properties ===

proptest! {
    /// Arbitrary bytes in every field this module reads: never a panic, and the
    /// documented rules hold.
    #[test]
    fn arbitrary_bytes_never_panic(
        status_bytes in prop::collection::vec(any::<u8>(), 0..24),
        pushback_bytes in prop::collection::vec(any::<u8>(), 0..24),
        content_type in prop::collection::vec(any::<u8>(), 0..32),
        http_status in 100u16..=999,
    ) {
        let mut headers = HeaderMap::new();
        for (name, bytes) in [
            (GRPC_STATUS, &status_bytes),
            (GRPC_RETRY_PUSHBACK_MS, &pushback_bytes),
            ("content-type", &content_type),
        ] {
            if let Ok(value) = HeaderValue::from_bytes(bytes) {
                headers.insert(name, value);
            }
        }
        let http_status = StatusCode::from_u16(http_status).expect("100..=999");
        let head = GrpcResponse::from_head(http_status, &headers);
        if headers.contains_key(GRPC_STATUS) {
            prop_assert!(matches!(head, Some(GrpcResponse::TrailersOnly(_))));
        }
        let _ = Code::from_bytes(&status_bytes);
        if let Some(status) = GrpcStatus::from_header_map(&headers) {
            let _ = status.classification();
            prop_assert_eq!(status.pushback(), Pushback::from_header_map(&headers));
        }
        if let Some(code) = Code::from_bytes(&status_bytes) {
            prop_assert_eq!(code.get().to_string().parse::<u32>().ok(), Some(code.get()));
        }
    }

    /// Every integer pushback: non-negative is a delay, negative is "do not retry".
    #[test]
    fn pushback_integers(ms in any::<i64>()) {
        let value = HeaderValue::from_str(&ms.to_string()).expect("digits");
        let mut trailers = HeaderMap::new();
        trailers.insert(GRPC_RETRY_PUSHBACK_MS, value);
        let expected = u64::try_from(ms)
            .map(|ms| Pushback::Delay(Duration::from_millis(ms)))
            .unwrap_or(Pushback::DoNotRetry);
        prop_assert_eq!(Pushback::from_header_map(&trailers), Some(expected));
    }
}

/// Each answer says why it waited: a call that queued for its slot carries the milliseconds
/// in `x-allowance-waited` (tonic hands it on as metadata); one that went at once, none.
#[tokio::test(start_paused = true)]
async fn a_call_that_queued_says_how_long_in_its_metadata() -> Result<(), BoxError> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let allowance = Allowance::new(AllowanceConfig::per_second(1, 1)?.exact());
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance))
        .service(recording(|_| OK, seen));
    let first = stack.clone().oneshot(call()).await?;
    assert!(first.headers().get(X_ALLOWANCE_WAITED).is_none());
    let second = stack.oneshot(call()).await?;
    assert_eq!(second.headers()[X_ALLOWANCE_WAITED], "1000");
    // The rate held it, not a cooldown.
    assert!(second.headers().get(X_ALLOWANCE_COOLED).is_none());
    Ok(())
}

/// A call a cooldown held says so: `x-allowance-cooled` beside `x-allowance-waited`.
#[tokio::test(start_paused = true)]
async fn a_call_a_cooldown_held_says_how_long_in_its_metadata() -> Result<(), BoxError> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let allowance = Allowance::new(AllowanceConfig::per_second(10, 10)?.exact());
    allowance.extend_cooldown(Duration::from_secs(3)).await?;
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance))
        .service(recording(|_| OK, seen));
    let answer = stack.oneshot(call()).await?;
    assert_eq!(answer.headers()[X_ALLOWANCE_WAITED], "3000");
    assert_eq!(answer.headers()[X_ALLOWANCE_COOLED], "3000");
    Ok(())
}
