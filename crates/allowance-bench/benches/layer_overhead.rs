//! (b) Layer overhead per call over a bare `service_fn` that answers at once.
//!
//! Each iteration builds a request, polls the service ready, calls it and polls the response
//! future once (it must be ready). `bare` is the `service_fn` alone; `admission` adds
//! `AdmissionLayer`; `allowance_stack` is the full `AllowanceLayer` (retry -> cooldown ->
//! admission) with an empty `Full<Bytes>` body (clonable, so the retry policy keeps a copy);
//! `stack_without_retry` is the same stack without tower's `Retry` (and `retry::Prepare`):
//! `CooldownLayer` over `AdmissionLayer`, so that `allowance_stack - stack_without_retry` is
//! what the one retry loop costs per call. The allowance never runs dry, so admission takes
//! its fast path.
//!
//! `cargo bench -p allowance-bench --bench layer_overhead -- --measurement-time 3 --warm-up-time 1`

#![allow(missing_docs)] // criterion_group! generates undocumented items.

use std::{
    convert::Infallible,
    future::{ready, Ready},
    pin::pin,
    task::{Context, Waker},
};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::Full;
use tower::{service_fn, Layer, Service};
use tower_allowance::{admission::AdmissionLayer, cooldown::CooldownLayer};

mod common;

type Body = Full<Bytes>;

fn answer(_req: Request<Body>) -> Ready<Result<Response<()>, Infallible>> {
    ready(Ok(Response::new(())))
}

/// One call through `service`: ready, call, one poll.
fn call_once<S>(service: &mut S, cx: &mut Context<'_>)
where
    S: Service<Request<Body>, Response = Response<()>>,
    S::Error: std::fmt::Debug,
{
    assert!(service.poll_ready(cx).is_ready());
    let fut = pin!(service.call(Request::new(Full::new(Bytes::new()))));
    let response = common::poll_once(fut).expect("answered");
    assert!(response.status().is_success());
}

fn layer_overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer_overhead");

    let mut bare = service_fn(answer);
    group.bench_function("bare", |b| {
        let mut cx = Context::from_waker(Waker::noop());
        b.iter(|| call_once(&mut bare, &mut cx))
    });

    let mut admission =
        AdmissionLayer::new(common::unreachable_allowance()).layer(service_fn(answer));
    group.bench_function("admission", |b| {
        let mut cx = Context::from_waker(Waker::noop());
        b.iter(|| call_once(&mut admission, &mut cx))
    });

    let mut stack = common::unreachable_allowance()
        .layer()
        .layer(service_fn(answer));
    group.bench_function("allowance_stack", |b| {
        let mut cx = Context::from_waker(Waker::noop());
        b.iter(|| call_once(&mut stack, &mut cx))
    });

    let allowance = common::unreachable_allowance();
    let mut no_retry = CooldownLayer::new(allowance.clone())
        .layer(AdmissionLayer::new(allowance).layer(service_fn(answer)));
    group.bench_function("stack_without_retry", |b| {
        let mut cx = Context::from_waker(Waker::noop());
        b.iter(|| call_once(&mut no_retry, &mut cx))
    });

    group.finish();
}

criterion_group!(benches, layer_overhead);
criterion_main!(benches);
