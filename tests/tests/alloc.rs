//! Zero heap allocations on the admission fast path, counted by a global allocator.

mod alloc_counting;

use std::{
    convert::Infallible,
    future::{ready, Ready},
    num::NonZeroU32,
};

use alloc_counting::{allocations_over_calls, CALLS, ROUNDS, WARM_UP};
use http::{Request, Response};
use tower::{service_fn, Layer};
use tower_allowance::{admission::AdmissionLayer, Allowance, AllowanceConfig};

#[test]
fn admission_fast_path_does_not_allocate() {
    // Never runs dry: every call takes the fast path (token available, nobody waiting).
    let config = AllowanceConfig::per_second(1_000_000, NonZeroU32::MAX.get()).expect("valid");
    let allowance = Allowance::new(config);
    let mut service = AdmissionLayer::new(allowance.clone()).layer(service_fn(
        |_req: Request<()>| -> Ready<Result<Response<()>, Infallible>> {
            ready(Ok(Response::new(())))
        },
    ));
    let change = allocations_over_calls(&mut service, || Request::new(()));

    let snapshot = allowance.snapshot();
    assert_eq!(snapshot.admitted, (ROUNDS * CALLS + WARM_UP) as u64);
    assert_eq!(snapshot.waited, 0, "every call took the fast path");
    assert_eq!(
        (change.allocations, change.reallocations),
        (0, 0),
        "heap allocations on the admission fast path over {CALLS} calls: {change:?}"
    );
}
