//! Zero heap allocations per call through the FULL `AllowanceLayer` stack (tower's `Retry`
//! → `Cooldown` → `Admission`) on the fast path: token available, nobody waiting, a
//! response that is a success and carries no headers.
//!
//! Its own test binary with a single test, like `alloc.rs`: the counting allocator is
//! global, and the test harness allocates when it reports another test's result.

use std::{
    convert::Infallible,
    future::{ready, Future, Ready},
    hint::black_box,
    num::NonZeroU32,
    pin::pin,
    task::{Context, Poll, Waker},
};

use http::{Request, Response};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::{service_fn, Layer, Service};
use tower_allowance::{retry::RetryConfig, Allowance, AllowanceConfig, AllowanceLayer};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const CALLS: usize = 1_000;

/// `poll_ready`, `call`, one poll of the response future, which must be ready.
fn call_once<S>(service: &mut S, cx: &mut Context<'_>, req: Request<String>)
where
    S: Service<Request<String>, Response = Response<()>>,
    S::Error: std::fmt::Display,
{
    assert!(service.poll_ready(cx).is_ready());
    let fut = pin!(service.call(req));
    match fut.poll(cx) {
        Poll::Ready(Ok(response)) => drop(black_box(response)),
        Poll::Ready(Err(e)) => panic!("refused: {e}"),
        Poll::Pending => panic!("the fast path returned Pending"),
    }
}

#[test]
fn full_stack_fast_path_does_not_allocate() {
    // Control: the counter sees an allocation made inside a region.
    let region = Region::new(GLOBAL);
    black_box(Box::new(black_box(7u64)));
    assert_eq!(
        region.change().allocations,
        1,
        "the allocation counter works"
    );

    // Never runs dry: every call takes the fast path (token available, nobody waiting).
    let config = AllowanceConfig::per_second(1_000_000, NonZeroU32::MAX.get()).expect("valid");
    let allowance = Allowance::new(config);
    let mut service =
        AllowanceLayer::new(allowance.clone(), RetryConfig::default()).layer(service_fn(
            |_req: Request<String>| -> Ready<Result<Response<()>, Infallible>> {
                ready(Ok(Response::new(())))
            },
        ));
    let mut cx = Context::from_waker(Waker::noop());

    // Warm-up (lazy statics, thread-locals), then count over requests built beforehand,
    // each with an empty, clonable body (the retry policy clones every request).
    for _ in 0..10 {
        call_once(&mut service, &mut cx, Request::new(String::new()));
    }
    let requests: Vec<Request<String>> = (0..CALLS).map(|_| Request::new(String::new())).collect();
    let region = Region::new(GLOBAL);
    for req in requests {
        call_once(&mut service, &mut cx, req);
    }
    let change = region.change();

    let snapshot = allowance.snapshot();
    assert_eq!(snapshot.admitted, (CALLS + 10) as u64);
    assert_eq!(snapshot.waited, 0, "every call took the fast path");
    assert_eq!(snapshot.retries_spent, 0, "nothing was retried");
    assert_eq!(
        (change.allocations, change.reallocations),
        (0, 0),
        "heap allocations through the full AllowanceLayer stack over {CALLS} calls: {change:?}"
    );
}
