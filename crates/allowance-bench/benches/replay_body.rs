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
use tower_allowance::{
    body::{ReplayBody, Replayable, DEFAULT_REPLAY_CAP},
    BoxError,
};

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

criterion_group!(benches, replay_body);
criterion_main!(benches);
