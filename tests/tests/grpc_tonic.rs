//! `GrpcLayer` against a real tonic server and a real tonic client, over HTTP/2 on an
//! in-memory pipe, in virtual time: every figure is exact.
//!
//! The pipe (`tokio::io::duplex`) wakes its reader as soon as the writer writes, so paused
//! time moves on only when every task waits on a timer: a server's answer never races a
//! deadline.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use futures::StreamExt;
use http::{uri::PathAndQuery, HeaderMap, Method, StatusCode};
use tokio::time::Instant;
use tonic::{
    body::Body,
    codec::Streaming,
    metadata::MetadataValue,
    server::{ClientStreamingService, NamedService, ServerStreamingService, UnaryService},
    transport::{Endpoint, Server},
    Code, Status,
};
use tonic_prost::ProstCodec;
use tower::{Layer, ServiceExt};
use tower_allowance::{
    classify::{Classification, Classified, Classify},
    error::AbandonReason,
    grpc::{FeedAllowance, GrpcClassifier, GrpcLayer, TrailersLayer, WatchTrailers},
    retry::RetryConfig,
    Allowance, AllowanceConfig, BoxError, Outcome,
};

/// Every message of the test service.
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(uint32, tag = "1")]
    n: u32,
    #[prost(bytes = "vec", tag = "2")]
    pad: Vec<u8>,
}

const UNARY: &str = "/t.Svc/Unary";
const UPLOAD: &str = "/t.Svc/Upload";
const WATCH: &str = "/t.Svc/Watch";

/// How the server answers one call.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Ok,
    /// This code, with this `grpc-retry-pushback-ms` if any.
    Refuse(Code, Option<&'static str>),
    /// The same, after this many milliseconds (unary calls).
    Slow(u64, Code, Option<&'static str>),
    /// OK, after this many milliseconds (unary calls).
    Late(u64),
}

impl Answer {
    fn status(self) -> Option<Status> {
        let (Answer::Refuse(code, pushback) | Answer::Slow(_, code, pushback)) = self else {
            return None;
        };
        let mut status = Status::new(code, "refused by the test server");
        if let Some(ms) = pushback {
            status
                .metadata_mut()
                .insert("grpc-retry-pushback-ms", MetadataValue::from_static(ms));
        }
        Some(status)
    }
}

/// What the server saw of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    path: String,
    /// Milliseconds since the test started.
    at_ms: u64,
    grpc_timeout: Option<String>,
    /// Messages received (client-streaming).
    messages: u32,
}

type Script = Arc<dyn Fn(usize, u64) -> Answer + Send + Sync>;

/// The server's script (the `n`th call, arriving at `ms`) and its log.
#[derive(Clone)]
struct Svc {
    script: Script,
    seen: Arc<Mutex<Vec<Seen>>>,
    start: Instant,
}

impl NamedService for Svc {
    const NAME: &'static str = "t.Svc";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Svc {
    /// Logs a call; its answer.
    fn arrive(&self, path: &str, headers: &HeaderMap, messages: u32) -> Answer {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let at_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let grpc_timeout = headers
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let n = seen.len();
        seen.push(Seen {
            path: path.to_owned(),
            at_ms,
            grpc_timeout,
            messages,
        });
        (self.script)(n, at_ms)
    }
}

impl tower::Service<http::Request<Body>> for Svc {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let svc = self.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default());
            Ok(match req.uri().path() {
                UNARY => grpc.unary(svc, req).await,
                UPLOAD => grpc.client_streaming(svc, req).await,
                WATCH => grpc.server_streaming(svc, req).await,
                other => Status::unimplemented(other.to_owned()).into_http(),
            })
        })
    }
}

impl UnaryService<Msg> for Svc {
    type Response = Msg;
    type Future = BoxFuture<Result<tonic::Response<Msg>, Status>>;

    fn call(&mut self, request: tonic::Request<Msg>) -> Self::Future {
        let answer = self.arrive(UNARY, &request.metadata().clone().into_headers(), 1);
        Box::pin(async move {
            if let Answer::Slow(ms, ..) | Answer::Late(ms) = answer {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            match answer.status() {
                Some(status) => Err(status),
                None => Ok(tonic::Response::new(request.into_inner())),
            }
        })
    }
}

impl ClientStreamingService<Msg> for Svc {
    type Response = Msg;
    type Future = BoxFuture<Result<tonic::Response<Msg>, Status>>;

    /// Reads the whole upload, then answers with the number of messages read.
    fn call(&mut self, request: tonic::Request<Streaming<Msg>>) -> Self::Future {
        let svc = self.clone();
        Box::pin(async move {
            let headers = request.metadata().clone().into_headers();
            let mut stream = request.into_inner();
            let mut n = 0;
            while stream.message().await?.is_some() {
                n += 1;
            }
            match svc.arrive(UPLOAD, &headers, n).status() {
                Some(status) => Err(status),
                None => Ok(tonic::Response::new(Msg { n, pad: Vec::new() })),
            }
        })
    }
}

type Messages = futures::stream::Iter<std::vec::IntoIter<Result<Msg, Status>>>;

impl ServerStreamingService<Msg> for Svc {
    type Response = Msg;
    type ResponseStream = Messages;
    type Future = BoxFuture<Result<tonic::Response<Messages>, Status>>;

    /// One message, then the scripted status in the trailers.
    fn call(&mut self, request: tonic::Request<Msg>) -> Self::Future {
        let answer = self.arrive(WATCH, &request.metadata().clone().into_headers(), 1);
        Box::pin(async move {
            let mut items = vec![Ok(request.into_inner())];
            items.extend(answer.status().map(Err));
            Ok(tonic::Response::new(futures::stream::iter(items)))
        })
    }
}

/// A tonic server scripted by `script`, and a `Channel` to it over an in-memory pipe.
struct Rig {
    channel: tonic::transport::Channel,
    seen: Arc<Mutex<Vec<Seen>>>,
    start: Instant,
}

impl Rig {
    async fn start(script: impl Fn(usize, u64) -> Answer + Send + Sync + 'static) -> Rig {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let start = Instant::now();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let svc = Svc {
            script: Arc::new(script),
            seen: seen.clone(),
            start,
        };
        let incoming = futures::stream::iter([Ok::<_, std::io::Error>(server_io)])
            .chain(futures::stream::pending());
        tokio::spawn(
            Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming),
        );
        let mut client_io = Some(client_io);
        let channel = Endpoint::from_static("http://in-memory")
            .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                let io = client_io.take();
                async move {
                    io.map(hyper_util::rt::TokioIo::new)
                        .ok_or_else(|| std::io::Error::other("one connection only"))
                }
            }))
            .await
            .expect("in-memory connection");
        Rig {
            channel,
            seen,
            start,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn arrivals_ms(&self) -> Vec<u64> {
        self.seen().iter().map(|s| s.at_ms).collect()
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A tonic client over `GrpcLayer` on `allowance`, retrying every call.
    fn client(&self, allowance: &Allowance, retry: RetryConfig) -> tonic::client::Grpc<Boxed> {
        let stack = GrpcLayer::new(allowance.clone())
            .with_retry(retry)
            .layer(self.channel.clone());
        tonic::client::Grpc::new(Boxed::new(stack))
    }
}

/// `GrpcLayer` over a tonic `Channel` (or, in the UNAVAILABLE measurement, the same stack
/// with another classifier), boxed.
type Boxed = tower::util::BoxCloneService<
    http::Request<Body>,
    http::Response<WatchTrailers<Body, FeedAllowance>>,
    BoxError,
>;

fn retry_all() -> RetryConfig {
    RetryConfig::default()
        .with_replayable_methods([Method::POST])
        .with_jitter_seed(1)
}

fn allowance(rate: u32) -> Allowance {
    Allowance::new(AllowanceConfig::per_second(rate, rate).expect("valid"))
}

fn msg(n: u32) -> Msg {
    Msg { n, pad: Vec::new() }
}

fn timed(n: u32, timeout_ms: u64) -> tonic::Request<Msg> {
    let mut request = tonic::Request::new(msg(n));
    request.set_timeout(Duration::from_millis(timeout_ms));
    request
}

async fn unary(
    client: &mut tonic::client::Grpc<Boxed>,
    request: tonic::Request<Msg>,
) -> Result<Msg, Status> {
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let path = PathAndQuery::from_static(UNARY);
    let reply = client.unary(request, path, ProstCodec::default()).await?;
    Ok(reply.into_inner())
}

fn abandoned(status: &Status) -> Option<&str> {
    status
        .metadata()
        .get("x-allowance-abandoned")
        .and_then(|v| v.to_str().ok())
}

const EXHAUSTED_1S: Answer = Answer::Refuse(Code::ResourceExhausted, Some("1000"));

// === deadlines ===

/// `set_timeout(1500 ms)` is the call's deadline across attempts: the retry after a 1 s
/// pushback says 500 ms are left.
#[tokio::test(start_paused = true)]
async fn each_retry_sends_the_time_left_before_the_calls_deadline() {
    let rig = Rig::start(|n, _| if n == 0 { EXHAUSTED_1S } else { Answer::Ok }).await;
    let mut client = rig.client(&allowance(10), retry_all());
    let reply = unary(&mut client, timed(7, 1500))
        .await
        .expect("the retry succeeds");
    assert_eq!(reply.n, 7);
    let timeouts: Vec<_> = rig.seen().into_iter().map(|s| s.grpc_timeout).collect();
    assert_eq!(
        timeouts,
        [Some("1500000u".to_owned()), Some("500000u".to_owned())]
    );
    assert_eq!(rig.arrivals_ms(), [0, 1000]);
}

/// A retry that would pass the deadline is not made: the call ends when the pushback comes,
/// with the server's status, marked `deadline`.
#[tokio::test(start_paused = true)]
async fn a_retry_that_would_pass_the_deadline_is_not_made() {
    let rig = Rig::start(|_, _| EXHAUSTED_1S).await;
    let mut client = rig.client(&allowance(10), retry_all());
    let status = unary(&mut client, timed(1, 1500))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(abandoned(&status), Some("deadline"));
    assert_eq!(
        Outcome::of_error(&status),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
    // Attempts at 0 and 1,000 ms (not 2,000), and the call ended at 1,000 ms.
    assert_eq!(rig.arrivals_ms(), [0, 1000]);
    assert_eq!(rig.elapsed_ms(), 1000);
}

/// A 300 ms call behind a 3 s cooldown fails at once with DEADLINE_EXCEEDED (trailers-only,
/// not `Code::Unknown`), and nothing reaches the server.
#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_passes_in_the_queue_fails_at_once() {
    let rig = Rig::start(|_, _| Answer::Ok).await;
    let allowance = allowance(10);
    allowance
        .extend_cooldown(Duration::from_secs(3))
        .await
        .expect("memory store");
    let mut client = rig.client(&allowance, retry_all());
    let status = unary(&mut client, timed(1, 300))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(abandoned(&status), Some("deadline"));
    assert_eq!(
        Outcome::of_error(&status),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
    assert_eq!(rig.elapsed_ms(), 0);
    assert!(rig.seen().is_empty());
}

/// A call queued within its deadline fails as soon as a cooldown raised meanwhile pushes its
/// slot past the deadline, not when the slot would have come.
#[tokio::test(start_paused = true)]
async fn a_queued_call_pushed_past_its_deadline_fails_when_it_is_pushed() {
    // The first call is answered after 200 ms: RESOURCE_EXHAUSTED, pushback 3 s.
    let rig = Rig::start(|n, _| {
        if n == 0 {
            Answer::Slow(200, Code::ResourceExhausted, Some("3000"))
        } else {
            Answer::Ok
        }
    })
    .await;
    let allowance = allowance(1);
    let mut first = rig.client(&allowance, retry_all());
    let mut second = rig.client(&allowance, retry_all());
    let start = Instant::now();
    let (first, second) = futures::future::join(unary(&mut first, timed(1, 10_000)), async {
        // Queued for the slot at 1,000 ms, within its 1,500 ms.
        let result = unary(&mut second, timed(2, 1500)).await;
        (result, start.elapsed())
    })
    .await;
    let (second, ended) = second;
    let status = second.expect_err("pushed past its deadline");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(abandoned(&status), Some("deadline"));
    assert_eq!(ended, Duration::from_millis(200), "when the cooldown came");
    // The first call is retried, no earlier than its pushback; the second never reached
    // the server.
    assert_eq!(first.map(|m| m.n).ok(), Some(1));
    let arrivals = rig.arrivals_ms();
    assert!(arrivals.len() == 2 && arrivals[1] >= 3200, "{arrivals:?}");
}

/// A call whose deadline passes while its attempt is in flight (the server answers after
/// 2 s, the call has 1 s) ends at its deadline as DEADLINE_EXCEEDED, marked `deadline`,
/// whichever timer fires first: the stack's own, tonic's (in `Channel`) on the
/// `grpc-timeout` the attempt was sent with, or the server's on the same value.
#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_passes_in_flight_ends_as_deadline_exceeded() {
    let rig = Rig::start(|_, _| Answer::Late(2000)).await;
    let allowance = allowance(10);
    let mut client = rig.client(&allowance, retry_all());
    let status = unary(&mut client, timed(1, 1000))
        .await
        .expect_err("past its deadline");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(abandoned(&status), Some("deadline"));
    assert_eq!(
        Outcome::of_error(&status),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
    assert_eq!(rig.elapsed_ms(), 1000, "ended at the deadline");
    let timeouts: Vec<_> = rig.seen().into_iter().map(|s| s.grpc_timeout).collect();
    assert_eq!(timeouts, [Some("1000000u".to_owned())], "one attempt");
    let abandoned = allowance.snapshot().abandoned;
    assert_eq!(abandoned.get(AbandonReason::Deadline), 1, "counted once");
    assert_eq!(abandoned.total(), 1);
}

// === the stack's own refusals ===

/// A full queue: UNAVAILABLE with the wait left as pushback, which the tonic caller reads.
#[tokio::test(start_paused = true)]
async fn a_full_queue_is_unavailable_with_the_wait_left() {
    let rig = Rig::start(|_, _| Answer::Ok).await;
    // Exact: the next slot is the interval away (no headroom).
    let config = AllowanceConfig::per_second(2, 1)
        .expect("valid")
        .exact()
        .with_max_waiters(0);
    let allowance = Allowance::new(config);
    let mut client = rig.client(&allowance, retry_all());
    unary(&mut client, timed(1, 5000)).await.expect("admitted");
    let status = unary(&mut client, timed(2, 5000)).await.expect_err("full");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(abandoned(&status), Some("overloaded"));
    let pushback = status.metadata().get("grpc-retry-pushback-ms");
    assert_eq!(pushback.and_then(|v| v.to_str().ok()), Some("500"));
    assert_eq!(status.message(), "allowance wait queue is full");
    assert_eq!(
        Outcome::of_error(&status),
        Outcome::Abandoned(AbandonReason::Overloaded)
    );
    assert_eq!(rig.seen().len(), 1);
}

// === pushback ===

/// A negative pushback: the server's answer is final (not retried, no cooldown invented);
/// the tonic caller gets the server's status, with nothing abandoned.
#[tokio::test(start_paused = true)]
async fn a_negative_pushback_is_final_and_invents_no_cooldown() {
    let rig = Rig::start(|_, _| Answer::Refuse(Code::ResourceExhausted, Some("-1"))).await;
    let allowance = allowance(10);
    let mut client = rig.client(&allowance, retry_all());
    let status = unary(&mut client, timed(1, 5000))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(abandoned(&status), None);
    assert_eq!(Outcome::of_error(&status), Outcome::Failed);
    assert_eq!(rig.seen().len(), 1);
    let state = allowance.store_state().await.expect("memory store");
    assert_eq!(state.blocked_for, Duration::ZERO);
}

/// A pushback too long to represent closes the allowance (for `max_cooldown`, 1 h by
/// default): this call is abandoned (`cooldown_too_long`), and the next is refused without
/// reaching the server, its pushback the time until the allowance reopens.
#[tokio::test(start_paused = true)]
async fn a_huge_pushback_closes_the_allowance_and_says_so() {
    let huge = Answer::Refuse(Code::ResourceExhausted, Some("9223372036854775807"));
    let rig = Rig::start(move |_, _| huge).await;
    let allowance = allowance(10);
    let mut client = rig.client(&allowance, retry_all());
    let status = unary(&mut client, timed(1, 5000))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(abandoned(&status), Some("cooldown_too_long"));
    let next = unary(&mut client, timed(2, 5000))
        .await
        .expect_err("closed");
    assert_eq!(next.code(), Code::ResourceExhausted, "{next:?}");
    assert_eq!(abandoned(&next), Some("cooldown_too_long"));
    let pushback = next.metadata().get("grpc-retry-pushback-ms");
    assert_eq!(pushback.and_then(|v| v.to_str().ok()), Some("3600000"));
    assert_eq!(
        Outcome::of_error(&next),
        Outcome::Abandoned(AbandonReason::CooldownTooLong)
    );
    assert_eq!(rig.seen().len(), 1, "the second call was never sent");
}

// === client streaming ===

fn upload(
    messages: u32,
    pad: usize,
) -> tonic::Request<futures::stream::Iter<std::vec::IntoIter<Msg>>> {
    let msgs: Vec<Msg> = (0..messages)
        .map(|n| Msg {
            n,
            pad: vec![0; pad],
        })
        .collect();
    let mut request = tonic::Request::new(futures::stream::iter(msgs));
    request.set_timeout(Duration::from_secs(5));
    request
}

/// A client-streaming call refused once is replayed whole from the copy kept while it
/// streamed; one longer than the replay cap is sent once, and its refusal says
/// `not_replayable`.
#[tokio::test(start_paused = true)]
async fn a_client_streaming_call_is_replayed_or_abandoned_visibly() {
    let first_refused = |n, _| {
        if n == 0 {
            Answer::Refuse(Code::ResourceExhausted, Some("200"))
        } else {
            Answer::Ok
        }
    };
    let rig = Rig::start(first_refused).await;
    let allowance = allowance(10);
    let mut client = rig.client(&allowance, retry_all());
    client.ready().await.expect("ready");
    let path = PathAndQuery::from_static(UPLOAD);
    let reply = client
        .client_streaming(
            upload(3, 10),
            path.clone(),
            ProstCodec::<Msg, Msg>::default(),
        )
        .await
        .expect("replayed");
    assert_eq!(reply.into_inner().n, 3);
    let seen = rig.seen();
    assert_eq!(
        seen.iter()
            .map(|s| (s.messages, s.at_ms))
            .collect::<Vec<_>>(),
        [(3, 0), (3, 200)]
    );

    // Over the cap: 3 messages of 100 bytes, a cap of 64 bytes.
    let rig = Rig::start(|_, _| Answer::Refuse(Code::ResourceExhausted, Some("200"))).await;
    let allowance = self::allowance(10);
    let mut client = rig.client(&allowance, retry_all().with_replay_cap(64));
    client.ready().await.expect("ready");
    let status = client
        .client_streaming(upload(3, 100), path, ProstCodec::<Msg, Msg>::default())
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(abandoned(&status), Some("not_replayable"));
    assert_eq!(
        Outcome::of_error(&status),
        Outcome::Abandoned(AbandonReason::NotReplayable)
    );
    assert_eq!(
        allowance
            .snapshot()
            .abandoned
            .get(AbandonReason::NotReplayable),
        1
    );
    assert_eq!(rig.seen().len(), 1);
}

// === a status in the trailers ===

/// RESOURCE_EXHAUSTED in the trailers, after the headers and a message: not retried (the
/// caller has the message already), the caller gets the server's status, and the pushback
/// holds the next call until it ends.
#[tokio::test(start_paused = true)]
async fn a_status_in_the_trailers_is_not_retried_and_holds_the_next_call() {
    let rig = Rig::start(|n, _| {
        if n == 0 {
            Answer::Refuse(Code::ResourceExhausted, Some("2000"))
        } else {
            Answer::Ok
        }
    })
    .await;
    let allowance = allowance(10);
    let mut client = rig.client(&allowance, retry_all());
    client.ready().await.expect("ready");
    let mut stream = client
        .server_streaming(
            timed(5, 5000),
            PathAndQuery::from_static(WATCH),
            ProstCodec::<Msg, Msg>::default(),
        )
        .await
        .expect("headers")
        .into_inner();
    let first = stream.message().await.expect("a message");
    assert_eq!(first.map(|m| m.n), Some(5));
    let status = stream.message().await.expect_err("the trailers' status");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(abandoned(&status), None, "the server's own answer");
    let state = allowance.store_state().await.expect("memory store");
    assert_eq!(state.blocked_for, Duration::from_secs(2));

    unary(&mut client, timed(6, 5000))
        .await
        .expect("after the cooldown");
    assert_eq!(rig.arrivals_ms(), [0, 2000]);
}

// === UNAVAILABLE's pushback: the measurement behind the choice ===

/// `GrpcClassifier`, but with UNAVAILABLE transient whatever its pushback: each call
/// honours its own (the behaviour before UNAVAILABLE with a pushback became throttling).
#[derive(Clone, Copy, Debug, Default)]
struct OwnPushback(GrpcClassifier);

impl Classify for OwnPushback {
    fn classify(&self, status: StatusCode, headers: &HeaderMap) -> Classification {
        self.classify_response(status, headers).class
    }

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Classified {
        let classified = self.0.classify_response(status, headers);
        match headers.get("grpc-status").map(|v| v.as_bytes()) {
            Some(b"14") => Classified::new(Classification::Transient, classified.delay),
            _ => classified,
        }
    }
}

/// Ten calls, 100 ms apart, while the server sheds load for its first second (UNAVAILABLE,
/// pushback 1,000 ms): `(attempts, last call done in ms)`.
async fn shed_load(shared: bool) -> (usize, u64) {
    let rig = Rig::start(|_, ms| {
        if ms < 1000 {
            Answer::Refuse(Code::Unavailable, Some("1000"))
        } else {
            Answer::Ok
        }
    })
    .await;
    let allowance = allowance(100);
    let stack: Boxed = if shared {
        Boxed::new(
            GrpcLayer::new(allowance.clone())
                .with_retry(retry_all())
                .layer(rig.channel.clone()),
        )
    } else {
        // The same stack, with UNAVAILABLE transient: without `GrpcCall`, which changes
        // nothing here (no deadline, nothing refused).
        let layer = allowance
            .layer()
            .with_retry(retry_all())
            .with_classifier(OwnPushback::default());
        let stack = layer.layer(TrailersLayer::new(allowance.clone()).layer(rig.channel.clone()));
        Boxed::new(stack)
    };
    // Concurrent in one task (a tonic call's future trips rustc's `Send` check in a spawn).
    let calls = (0..10u32).map(|n| {
        let mut client = tonic::client::Grpc::new(stack.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(100 * u64::from(n))).await;
            unary(&mut client, tonic::Request::new(msg(n)))
                .await
                .map(|m| m.n)
        }
    });
    let ends = futures::future::join_all(calls).await;
    assert!(ends.iter().all(Result::is_ok), "{ends:?}");
    (rig.seen().len(), rig.elapsed_ms())
}

#[tokio::test(start_paused = true)]
async fn unavailable_with_a_pushback_cools_every_call_down() {
    // Shared: the first UNAVAILABLE holds the nine calls that follow until the server is
    // back; 10 first attempts, 1 retry.
    let (attempts, done_ms) = shed_load(true).await;
    assert_eq!((attempts, done_ms), (11, 1000));
    // Each call alone: every call in the first second is refused, then retried.
    let (attempts, done_ms) = shed_load(false).await;
    assert_eq!((attempts, done_ms), (20, 1900));
}

/// The response-type check: `ServiceExt::oneshot` on the stack, for `Outcome::of`.
#[tokio::test(start_paused = true)]
async fn outcome_of_reads_the_stacks_own_answer() {
    let rig = Rig::start(|_, _| Answer::Ok).await;
    let allowance = allowance(10);
    allowance
        .extend_cooldown(Duration::from_secs(3))
        .await
        .expect("memory store");
    let stack = GrpcLayer::new(allowance)
        .with_retry(retry_all())
        .layer(rig.channel.clone());
    let mut request = http::Request::post(UNARY)
        .header("grpc-timeout", "300m")
        .body(Body::empty())
        .expect("valid");
    *request.uri_mut() = "http://in-memory/t.Svc/Unary".parse().expect("valid");
    let result = stack.oneshot(request).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
}
