//! (c) Contention: two threads hammering one allowance whose limit is never reached,
//! against two threads hammering one governor limiter the same way.
//!
//! Ours twice: `acquire()` polled once (clones the allowance's `Arc` per call), and a call
//! through each thread's own clone of one `AdmissionLayer` service (includes building the
//! request, about 40 ns alone: see `layer_overhead/bare`), and a call through each thread's
//! own clone of one full `AllowanceLayer` service (empty `String` body).
//!
//! One iteration is one admission on each thread (throughput counts 2 elements); each
//! sample starts both threads behind a barrier and takes the slower thread's time. Flat
//! sampling with 10 samples keeps every sample long (thread start-up is outside the timing).
//!
//! `cargo bench -p allowance-bench --bench contention -- --measurement-time 3 --warm-up-time 1`

#![allow(missing_docs)] // criterion_group! generates undocumented items.

use std::{
    convert::Infallible,
    future::{ready, Ready},
    pin::pin,
    sync::Barrier,
    task::{Context, Waker},
    thread,
    time::Duration,
};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use http::{Request, Response};
// tokio's Instant is std's here (no paused clock in this process); the workspace lints
// keep std's Instant out of the code.
use tokio::time::Instant;
use tower::{service_fn, Layer, Service};
use tower_allowance::admission::AdmissionLayer;

mod common;

const THREADS: usize = 2;

/// Runs an operation `iters` times on each of two threads started together (each thread
/// gets its own from `make`); the slower thread's time.
fn hammer<M, F>(iters: u64, make: &M) -> Duration
where
    M: Fn() -> F + Sync,
    F: FnMut(),
{
    let barrier = Barrier::new(THREADS);
    thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    let mut op = make();
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        op();
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

fn contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("contention_2_threads");
    group
        .throughput(Throughput::Elements(THREADS as u64))
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10);

    let allowance = common::unreachable_allowance();
    group.bench_function("ours/acquire_poll_once", |b| {
        b.iter_custom(|iters| {
            hammer(iters, &|| {
                || {
                    let acquire = pin!(allowance.acquire());
                    common::poll_once(acquire).expect("admitted");
                }
            })
        })
    });

    // Each thread with its own clone of one admission service (one allowance), as workers
    // hold theirs: no `Arc` clone per call, unlike `acquire()`.
    let service = AdmissionLayer::new(common::unreachable_allowance()).layer(service_fn(
        |_req: Request<()>| -> Ready<Result<Response<()>, Infallible>> {
            ready(Ok(Response::new(())))
        },
    ));
    group.bench_function("ours/admission_layer_call", |b| {
        b.iter_custom(|iters| {
            hammer(iters, &|| {
                let mut service = service.clone();
                move || {
                    let mut cx = Context::from_waker(Waker::noop());
                    assert!(service.poll_ready(&mut cx).is_ready());
                    let fut = pin!(service.call(Request::new(())));
                    common::poll_once(fut).expect("admitted");
                }
            })
        })
    });

    // The full stack (tower `Retry` → `Cooldown` → `Admission`), each thread with its own
    // clone of one service: tower clones the policy and the inner stack per call, so this
    // is where per-call `Arc` clones of the allowance meet under contention.
    let stack = common::unreachable_allowance().layer().layer(service_fn(
        |_req: Request<String>| -> Ready<Result<Response<()>, Infallible>> {
            ready(Ok(Response::new(())))
        },
    ));
    group.bench_function("ours/allowance_stack_call", |b| {
        b.iter_custom(|iters| {
            hammer(iters, &|| {
                let mut service = stack.clone();
                move || {
                    let mut cx = Context::from_waker(Waker::noop());
                    assert!(service.poll_ready(&mut cx).is_ready());
                    let fut = pin!(service.call(Request::new(String::new())));
                    common::poll_once(fut).expect("admitted");
                }
            })
        })
    });

    let governor = common::unreachable_governor();
    group.bench_function("governor/check", |b| {
        b.iter_custom(|iters| {
            hammer(iters, &|| {
                || {
                    governor.check().expect("conforming");
                }
            })
        })
    });

    group.finish();
}

criterion_group!(benches, contention);
criterion_main!(benches);
