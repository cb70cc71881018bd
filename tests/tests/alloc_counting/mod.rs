//! The harness the zero-allocation test binaries (`alloc`, `alloc_stack`, `alloc_stack_full`)
//! share. Each binary is its own process with this module's counting global allocator and a
//! single test, so nothing else allocates while it counts: a test that counts allocations
//! gets a file of its own, never a place in another binary.

use std::{
    future::Future,
    hint::black_box,
    pin::pin,
    task::{Context, Poll, Waker},
};

use http::{Request, Response};
use stats_alloc::{Region, Stats, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::Service;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Calls counted after warm-up.
pub(crate) const CALLS: usize = 1_000;
/// Warm-up calls (lazy statics, thread-locals) before counting.
pub(crate) const WARM_UP: usize = 10;
/// Rounds of [`CALLS`] counted; the quietest is reported.
pub(crate) const ROUNDS: usize = 3;

/// `poll_ready`, `call`, one poll of the response future, which must be ready.
fn call_once<S, B>(service: &mut S, cx: &mut Context<'_>, req: Request<B>)
where
    S: Service<Request<B>, Response = Response<()>>,
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

/// Checks the counter sees an allocation, warms `service` up, then returns the heap
/// activity of [`CALLS`] fast-path calls on requests built beforehand by `request`: the
/// quietest of [`ROUNDS`] rounds.
pub(crate) fn allocations_over_calls<S, B>(
    service: &mut S,
    request: impl Fn() -> Request<B>,
) -> Stats
where
    S: Service<Request<B>, Response = Response<()>>,
    S::Error: std::fmt::Display,
{
    let region = Region::new(GLOBAL);
    black_box(Box::new(black_box(7u64)));
    assert_eq!(
        region.change().allocations,
        1,
        "the allocation counter works"
    );

    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..WARM_UP {
        call_once(service, &mut cx, request());
    }
    // The quietest of three rounds: an allocation made once in the process's life (seen in
    // about one run in four of the full-stack test: 4 allocations, 900 bytes, in one round)
    // does not fail the test; one made per call, or every round, does.
    let mut quietest: Option<Stats> = None;
    for _ in 0..ROUNDS {
        let requests: Vec<Request<B>> = (0..CALLS).map(|_| request()).collect();
        let region = Region::new(GLOBAL);
        for req in requests {
            call_once(service, &mut cx, req);
        }
        let change = region.change();
        if quietest.is_none_or(|q| change.allocations < q.allocations) {
            quietest = Some(change);
        }
    }
    quietest.unwrap_or_else(|| unreachable!("ROUNDS > 0"))
}
