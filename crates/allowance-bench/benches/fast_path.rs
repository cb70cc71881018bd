//! (a) The admission fast path: a token is available, no cooldown, nobody waiting.
//!
//! One group, four competitors, one run:
//! - `ours/acquire_poll_once`: `Allowance::acquire()` polled once with a no-op waker (the
//!   public API closest to the admission layer's synchronous fast path);
//! - `ours/admission_layer_call`: `poll_ready` + `call` + one poll through `AdmissionLayer`
//!   over a `service_fn` returning `std::future::ready` (includes building the request);
//! - `reference/bare_service_fn_call`: the same call without the layer (building the request
//!   and the response is most of it), to subtract;
//! - `reference/tokio_instant_now`: one `tokio::time::Instant::now()`, the clock ours reads;
//! - `governor/check`: `RateLimiter::direct(..).check()` with the default clock;
//! - `tower/tps_budget_withdraw`: `TpsBudget::withdraw` after deposits, as a reference for a
//!   shared counter.
//!
//! `cargo bench -p allowance-bench --bench fast_path -- --measurement-time 3 --warm-up-time 1`

#![allow(missing_docs)] // criterion_group! generates undocumented items.

use std::{
    convert::Infallible,
    future::{ready, Ready},
    pin::pin,
    task::{Context, Waker},
    time::Duration,
};

use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use tower::{
    retry::budget::{Budget, TpsBudget},
    service_fn, Layer, Service,
};
use tower_allowance::admission::AdmissionLayer;

mod common;

fn fast_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission_fast_path");

    let allowance = common::unreachable_allowance();
    group.bench_function("ours/acquire_poll_once", |b| {
        b.iter(|| {
            let acquire = pin!(allowance.acquire());
            common::poll_once(acquire).expect("admitted")
        })
    });

    let mut service = AdmissionLayer::new(common::unreachable_allowance()).layer(service_fn(
        |_req: Request<()>| -> Ready<Result<Response<()>, Infallible>> {
            ready(Ok(Response::new(())))
        },
    ));
    group.bench_function("ours/admission_layer_call", |b| {
        let mut cx = Context::from_waker(Waker::noop());
        b.iter(|| {
            assert!(service.poll_ready(&mut cx).is_ready());
            let fut = pin!(service.call(Request::new(())));
            common::poll_once(fut).expect("admitted")
        })
    });

    // The same call without the layer: `admission_layer_call` minus this is the layer's cost.
    let mut bare = service_fn(
        |_req: Request<()>| -> Ready<Result<Response<()>, Infallible>> {
            ready(Ok(Response::new(())))
        },
    );
    group.bench_function("reference/bare_service_fn_call", |b| {
        let mut cx = Context::from_waker(Waker::noop());
        b.iter(|| {
            assert!(bare.poll_ready(&mut cx).is_ready());
            let fut = pin!(bare.call(Request::new(())));
            common::poll_once(fut).expect("answered")
        })
    });

    // One read of the library's only clock (a component of ours; governor reads quanta's TSC).
    group.bench_function("reference/tokio_instant_now", |b| {
        b.iter(tokio::time::Instant::now)
    });

    let governor = common::unreachable_governor();
    group.bench_function("governor/check", |b| {
        b.iter(|| governor.check().expect("conforming"))
    });

    // min_per_sec near i32::MAX over 60 s: the reserve never runs out, so every withdraw succeeds.
    let budget = TpsBudget::new(Duration::from_secs(60), i32::MAX as u32 - 1, 1000.0);
    for _ in 0..1_000 {
        budget.deposit();
    }
    group.bench_function("tower/tps_budget_withdraw", |b| {
        b.iter(|| assert!(budget.withdraw()))
    });

    group.finish();
}

criterion_group!(benches, fast_path);
criterion_main!(benches);
