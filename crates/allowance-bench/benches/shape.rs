//! (f) The shape of real allowances: several limits and one allowance per key, each next to
//! the one-limit, one-allowance fast path in the same group, the same run.
//!
//! Group `several_limits` (target: three limits ≤ 1.3× one):
//! - `one_limit/acquire_poll_once`: `acquire()` polled once, one limit (the lock-free path);
//! - `three_limits/acquire_poll_once`: the same with 3 limits (per second, minute, day):
//!   one short lock and the rule's loop over the limits;
//! - `three_limits_cost/acquire_with_cost`: the same, one limit counting a cost of 10.
//!
//! Group `keyed_lookup` (target: ≤ +50 ns over a single allowance, 10,000 live keys):
//! - `single/acquire_poll_once`: one allowance, as above;
//! - `keyed_10k/get_same_key`: `Keyed::get` of one key among 10,000 live ones, then the same
//!   `acquire()`; `keyed_10k/get_only`: the lookup alone; `keyed_10k/get_rotating_keys`:
//!   cycling through all 10,000 (cache misses);
//! - `single/allowance_stack_call`: a call through an `AllowanceLayer` stack, the request
//!   carrying `X-API-Key`; `keyed_10k/keyed_layer_call`: the same through a `KeyedLayer` over
//!   10,000 live keys (header read, lookup, the key's stack built per call).
//!
//! All allowances never run dry (1,000,000/s, burst `u32::MAX`; the other limits as large).
//!
//! `cargo bench -p allowance-bench --bench shape -- --measurement-time 3 --warm-up-time 1`

#![allow(missing_docs)] // criterion_group! generates undocumented items.

use std::{
    convert::Infallible,
    future::{ready, Ready},
    pin::pin,
    task::{Context, Waker},
};

use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use tower::{service_fn, Layer, Service};
use tower_allowance::{
    keyed::{key, Keyed, KeyedConfig, KeyedLayer},
    AcquireOptions, Allowance, AllowanceConfig, Limit,
};

mod common;

const KEYS: usize = 10_000;

/// One limit that never runs dry.
fn one_limit() -> AllowanceConfig {
    AllowanceConfig::per_second(1_000_000, u32::MAX).expect("valid")
}

/// Three limits that never run dry: per second, per minute, per day.
fn three_limits(cost: bool) -> AllowanceConfig {
    let minute = Limit::per_minute(60_000_000, u32::MAX).expect("valid");
    let day = Limit::per_day(u32::MAX, u32::MAX).expect("valid");
    one_limit()
        .with_limit(if cost { minute.counting_cost() } else { minute })
        .and_then(|c| c.with_limit(day))
        .expect("three limits")
}

fn api_key(i: usize) -> String {
    format!("sk-live-{i:032x}")
}

fn several_limits(c: &mut Criterion) {
    let mut group = c.benchmark_group("several_limits");
    let one = Allowance::new(one_limit());
    group.bench_function("one_limit/acquire_poll_once", |b| {
        b.iter(|| common::poll_once(pin!(one.acquire())).expect("admitted"))
    });
    let three = Allowance::new(three_limits(false));
    group.bench_function("three_limits/acquire_poll_once", |b| {
        b.iter(|| common::poll_once(pin!(three.acquire())).expect("admitted"))
    });
    let costed = Allowance::new(three_limits(true));
    group.bench_function("three_limits_cost/acquire_with_cost", |b| {
        b.iter(|| {
            let fut = pin!(costed.acquire_with(AcquireOptions::new().cost(10)));
            common::poll_once(fut).expect("admitted")
        })
    });
    group.finish();
}

fn ok_service() -> impl Service<
    Request<String>,
    Response = Response<()>,
    Error = Infallible,
    Future = Ready<Result<Response<()>, Infallible>>,
> + Clone {
    service_fn(|_req: Request<String>| ready(Ok::<_, Infallible>(Response::new(()))))
}

fn keyed_request(key: &str) -> Request<String> {
    Request::builder()
        .header("x-api-key", key)
        .body(String::new())
        .expect("request")
}

fn keyed_lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_lookup");
    let single = Allowance::new(one_limit());
    group.bench_function("single/acquire_poll_once", |b| {
        b.iter(|| common::poll_once(pin!(single.acquire())).expect("admitted"))
    });

    let keyed = Keyed::new(
        KeyedConfig::new(one_limit())
            .with_capacity(KEYS)
            .expect("valid"),
    );
    let keys: Vec<String> = (0..KEYS).map(api_key).collect();
    for k in &keys {
        keyed.get(k).expect("live");
    }
    assert_eq!(keyed.len(), KEYS);
    let one_key = &keys[KEYS / 2];
    group.bench_function("keyed_10k/get_same_key", |b| {
        b.iter(|| {
            let handle = keyed.get(one_key).expect("live");
            let admitted = common::poll_once(pin!(handle.allowance().acquire()));
            admitted.expect("admitted")
        })
    });
    // The lookup alone (hash, read lock, handle clone and drop), no admission.
    group.bench_function("keyed_10k/get_only", |b| {
        b.iter(|| keyed.get(one_key).expect("live"))
    });
    let mut i = 0;
    group.bench_function("keyed_10k/get_rotating_keys", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let handle = keyed.get(&keys[i]).expect("live");
            let admitted = common::poll_once(pin!(handle.allowance().acquire()));
            admitted.expect("admitted")
        })
    });

    let mut stack = Allowance::new(one_limit()).layer().layer(ok_service());
    group.bench_function("single/allowance_stack_call", |b| {
        let mut cx = Context::from_waker(Waker::noop());
        b.iter(|| {
            assert!(stack.poll_ready(&mut cx).is_ready());
            let fut = pin!(stack.call(keyed_request(one_key)));
            common::poll_once(fut).expect("admitted")
        })
    });
    let mut keyed_stack = KeyedLayer::new(keyed.clone(), key::api_key()).layer(ok_service());
    group.bench_function("keyed_10k/keyed_layer_call", |b| {
        let mut cx = Context::from_waker(Waker::noop());
        b.iter(|| {
            assert!(keyed_stack.poll_ready(&mut cx).is_ready());
            let fut = pin!(keyed_stack.call(keyed_request(one_key)));
            common::poll_once(fut).expect("admitted")
        })
    });
    group.finish();
    assert_eq!(keyed.len(), KEYS, "nothing was evicted or added");
}

criterion_group!(benches, several_limits, keyed_lookup);
criterion_main!(benches);
