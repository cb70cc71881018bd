//! The cost of replaying a request body without `B: Clone` (issue 11).
//!
//! One group, one run, a 16 KiB body in 1 KiB frames; each iteration is a first attempt that
//! streams the whole body and a retry that reads it again (32 KiB read in all):
//! - `full_bytes_clone`: the same 16 KiB as one `Full<Bytes>`, cloned, both polled: what
//!   `B: Clone` costs for a body that is already in memory (the floor);
//! - `stream_once`: the 16 frames streamed once, without a copy, for reference (the source
//!   body's own cost; half the bytes of the others);
//! - `replay_body`: the frames through a `ReplayBody` (default 64 KiB cap), then a clone
//!   replaying the copy;
//! - `boxed_replayable`: the realistic path, a `BoxBody<Bytes, BoxError>` through
//!   `Replayable::prepare` (a `ReplayBody` inside, re-boxed), then `Replay::body()`.
//!
//! Frames are `Bytes::slice`s of one buffer, so the source never allocates per frame.
//!
//! A second group runs the same 16 KiB through the whole `AllowanceLayer` stack: the inner
//! service reads each request body whole and answers the first attempt 502 (transient),
//! the retry 200, so every iteration is a first attempt and a replay, on a paused-clock
//! runtime (the backoff sleep costs no wall time):
//! - `full_bytes_clone`: a `Full<Bytes>` body, which the stack clones for the retry
//!   (`Replayable::try_clone`);
//! - `replay_wrapper`: the 16 frames as a `BoxBody<Bytes, BoxError>`, which the stack wraps
//!   in a `ReplayBody` (a copy kept while the first attempt streams) and replays.
//!
//! `cargo bench -p allowance-bench --bench replay_body -- --measurement-time 2 --warm-up-time 1`

#![allow(missing_docs)] // criterion_group! generates undocumented items.

use std::{
    convert::Infallible,
    hint::black_box,
    pin::Pin,
    task::{Context, Poll, Waker},
};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http_body::{Body, Frame};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use tower::{service_fn, Layer, ServiceExt};
use tower_allowance::{
    body::{ReplayBody, Replayable},
    classify::StatusClassifier,
    retry::RetryConfig,
    Allowance, AllowanceConfig, Attempt, BoxError, Outcome,
};

/// The library's default replay cap (`RetryConfig::replay_cap`).
const DEFAULT_REPLAY_CAP: usize = 64 * 1024;

const BODY: usize = 16 * 1024;
const FRAME: usize = 1024;

/// A streamed body of unknown length: `FRAME`-byte slices of one buffer, each ready at once.
struct Frames {
    data: Bytes,
    at: usize,
}

impl Frames {
    fn new(data: &Bytes) -> Self {
        Self {
            data: data.clone(),
            at: 0,
        }
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let start = self.at;
        if start >= self.data.len() {
            return Poll::Ready(None);
        }
        let end = (start + FRAME).min(self.data.len());
        self.at = end;
        Poll::Ready(Some(Ok(Frame::data(self.data.slice(start..end)))))
    }
}

/// Polls `body` to its end with a no-op waker; the bytes read.
fn drain<B>(mut body: B) -> usize
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut read = 0;
    while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
        if let Ok(data) = frame.expect("bench bodies do not fail").into_data() {
            read += black_box(data).len();
        }
    }
    read
}

fn replay_body(c: &mut Criterion) {
    let data = Bytes::from((0..BODY).map(|i| i as u8).collect::<Vec<u8>>());
    let mut group = c.benchmark_group("replay_body_16KiB_in_1KiB_frames");
    group.throughput(Throughput::Bytes(2 * BODY as u64));

    group.bench_function("full_bytes_clone", |b| {
        b.iter(|| {
            let body = Full::new(data.clone());
            let retry = body.clone();
            assert_eq!(drain(body) + drain(retry), 2 * BODY);
        })
    });

    group.throughput(Throughput::Bytes(BODY as u64));
    group.bench_function("stream_once", |b| {
        b.iter(|| assert_eq!(drain(Frames::new(&data)), BODY))
    });

    group.throughput(Throughput::Bytes(2 * BODY as u64));

    group.bench_function("replay_body", |b| {
        b.iter(|| {
            let body = ReplayBody::new(Frames::new(&data), DEFAULT_REPLAY_CAP);
            let retry = body.clone();
            assert_eq!(drain(body) + drain(retry), 2 * BODY);
        })
    });

    group.bench_function("boxed_replayable", |b| {
        b.iter(|| {
            let body: BoxBody<Bytes, BoxError> =
                Frames::new(&data).map_err(|never| match never {}).boxed();
            let (first, replay) = body.prepare(DEFAULT_REPLAY_CAP);
            let first = drain(first);
            let retry = replay.and_then(|r| r.body()).expect("under the cap");
            assert_eq!(first + drain(retry), 2 * BODY);
        })
    });

    group.finish();
}

/// Reads the body whole; 502 to a first attempt, 200 to a retry.
async fn read_then_answer<B>(req: http::Request<B>) -> Result<http::Response<()>, BoxError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let retry = req
        .extensions()
        .get::<Attempt>()
        .is_some_and(Attempt::is_retry);
    let body = req.into_body().collect().await.map_err(Into::into)?;
    assert_eq!(black_box(body.to_bytes()).len(), BODY);
    let mut res = http::Response::new(());
    if !retry {
        *res.status_mut() = http::StatusCode::BAD_GATEWAY;
    }
    Ok(res)
}

fn through_the_stack(c: &mut Criterion) {
    let data = Bytes::from((0..BODY).map(|i| i as u8).collect::<Vec<u8>>());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let allowance =
        Allowance::new(AllowanceConfig::per_second(1_000_000, 1_000_000).expect("valid"));
    let layer = allowance
        .layer()
        .with_retry(
            RetryConfig::default()
                .with_backoff(
                    std::time::Duration::from_micros(1),
                    std::time::Duration::from_micros(1),
                )
                .expect("valid"),
        )
        .with_classifier(StatusClassifier::default().transient([502]));

    let mut group = c.benchmark_group("replay_through_the_stack_16KiB");
    group.throughput(Throughput::Bytes(2 * BODY as u64));

    let full = layer.layer(service_fn(read_then_answer::<Full<Bytes>>));
    group.bench_function("full_bytes_clone", |b| {
        b.iter(|| {
            let req = http::Request::new(Full::new(data.clone()));
            let result = rt.block_on(full.clone().oneshot(req));
            assert_eq!(Outcome::of(&result), Outcome::Completed);
        })
    });

    let boxed = layer.layer(service_fn(read_then_answer::<BoxBody<Bytes, BoxError>>));
    group.bench_function("replay_wrapper", |b| {
        b.iter(|| {
            let body = Frames::new(&data).map_err(|never| match never {}).boxed();
            let result = rt.block_on(boxed.clone().oneshot(http::Request::new(body)));
            assert_eq!(Outcome::of(&result), Outcome::Completed);
        })
    });

    group.finish();
}

criterion_group!(benches, replay_body, through_the_stack);
criterion_main!(benches);
