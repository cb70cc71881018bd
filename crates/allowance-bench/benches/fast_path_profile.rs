//! The fast-path competitors in a plain loop, for instruction counts under callgrind
//! (repeatable where wall time on a shared machine is not).
//!
//! ```text
//! cargo bench -p allowance-bench --bench fast_path_profile --no-run   # names the executable
//! valgrind --tool=callgrind --toggle-collect='fast_path_profile::run_*' \
//!     target/release/deps/fast_path_profile-<hash> ours 100000
//! ```
//!
//! `cargo bench -p allowance-bench --bench fast_path_profile -- ours 100000` runs it without
//! valgrind (the `--bench` flag cargo adds is ignored).
//!
//! Competitors: `ours` (`Allowance::acquire()` polled once), `layer` (`AdmissionLayer`
//! `poll_ready` + `call` + poll, over a `service_fn` returning `std::future::ready`), `bare`
//! (the same without the layer), `stack` (the same through the full `AllowanceLayer`),
//! `no_retry` (the stack without tower's `Retry`: `CooldownLayer` over `AdmissionLayer`), `governor` (`check()`, default clock), `tps`
//! (`TpsBudget::withdraw`), and `clock` (`tokio::time::Instant::now()` alone, a component of
//! ours), and `waiters10`/`waiters1000`/`waiters10000` (one admission while that many tasks
//! wait, as in the `waiters` bench). Instructions per operation = the collected `Ir` /
//! iterations.

use std::{
    convert::Infallible,
    future::{ready, Future, Ready},
    hint::black_box,
    num::NonZeroU32,
    pin::pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use http::{Request, Response};
use tokio::sync::Notify;
use tower::{
    retry::budget::{Budget, TpsBudget},
    service_fn, Layer, Service,
};
use tower_allowance::{
    admission::AdmissionLayer, cooldown::CooldownLayer, Allowance, AllowanceConfig,
};

fn allowance() -> Allowance {
    Allowance::new(AllowanceConfig::per_second(1_000_000, u32::MAX).expect("valid config"))
}

fn answer(_req: Request<()>) -> Ready<Result<Response<()>, Infallible>> {
    ready(Ok(Response::new(())))
}

fn call_once<S>(service: &mut S, cx: &mut Context<'_>)
where
    S: Service<Request<()>, Response = Response<()>>,
{
    assert!(service.poll_ready(cx).is_ready());
    let fut = pin!(service.call(Request::new(())));
    assert!(matches!(fut.poll(cx), Poll::Ready(Ok(_))));
}

#[inline(never)]
fn run_ours(a: &Allowance, n: u64) {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..n {
        let acquire = pin!(a.acquire());
        assert!(matches!(acquire.poll(&mut cx), Poll::Ready(Ok(()))));
    }
}

#[inline(never)]
fn run_layer<S>(service: &mut S, n: u64)
where
    S: Service<Request<()>, Response = Response<()>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..n {
        call_once(service, &mut cx);
    }
}

#[inline(never)]
fn run_governor(g: &governor::DefaultDirectRateLimiter, n: u64) {
    for _ in 0..n {
        assert!(g.check().is_ok());
    }
}

#[inline(never)]
fn run_tps(b: &TpsBudget, n: u64) {
    for _ in 0..n {
        assert!(b.withdraw());
    }
}

#[inline(never)]
fn run_clock(n: u64) {
    for _ in 0..n {
        black_box(tokio::time::Instant::now());
    }
}

/// `waiters` tasks loop on `acquire().await` (1,000/s, burst 1, paused clock) until all are
/// queued; `run_waiters` then drives `n` admissions (only that part is collected).
fn waiters(waiters: usize, n: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let config = AllowanceConfig::per_second(1_000, 1)
        .expect("valid config")
        .with_max_waiters(waiters + 1);
    let allowance = Allowance::new(config);
    let done = Arc::new(AtomicU64::new(0));
    let target = Arc::new(AtomicU64::new(u64::MAX));
    let reached = Arc::new(Notify::new());
    rt.block_on(async {
        for _ in 0..waiters {
            let (allowance, done, target, reached) = (
                allowance.clone(),
                done.clone(),
                target.clone(),
                reached.clone(),
            );
            tokio::spawn(async move {
                loop {
                    allowance.acquire().await.expect("admitted");
                    let k = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if k == target.load(Ordering::Relaxed) {
                        reached.notify_one();
                    }
                }
            });
        }
        while allowance.snapshot().waiting + 1 < waiters {
            tokio::task::yield_now().await;
        }
    });
    target.store(done.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    run_waiters(&rt, &reached);
}

#[inline(never)]
fn run_waiters(rt: &tokio::runtime::Runtime, reached: &Notify) {
    rt.block_on(reached.notified());
}

fn main() {
    // `cargo bench` adds `--bench`.
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let which = args.next().unwrap_or_else(|| "ours".to_owned());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    match which.as_str() {
        "ours" => run_ours(&allowance(), n),
        "layer" => run_layer(
            &mut AdmissionLayer::new(allowance()).layer(service_fn(answer)),
            n,
        ),
        "bare" => run_layer(&mut service_fn(answer), n),
        "stack" => run_layer(&mut allowance().layer().layer(service_fn(answer)), n),
        "no_retry" => {
            let a = allowance();
            let inner = AdmissionLayer::new(a.clone()).layer(service_fn(answer));
            run_layer(&mut CooldownLayer::new(a).layer(inner), n);
        }
        "governor" => {
            let rate = NonZeroU32::new(1_000_000).expect("non-zero");
            let quota = governor::Quota::per_second(rate).allow_burst(NonZeroU32::MAX);
            run_governor(&governor::RateLimiter::direct(quota), n);
        }
        "tps" => {
            let budget = TpsBudget::new(Duration::from_secs(60), i32::MAX as u32 - 1, 1000.0);
            for _ in 0..1_000 {
                budget.deposit();
            }
            run_tps(&budget, n);
        }
        "clock" => run_clock(n),
        "waiters10" => waiters(10, n),
        "waiters1000" => waiters(1_000, n),
        "waiters10000" => waiters(10_000, n),
        other => {
            panic!("unknown competitor {other:?}: ours, layer, bare, stack, no_retry, governor, tps, clock")
        }
    }
}
