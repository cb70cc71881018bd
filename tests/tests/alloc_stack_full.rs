//! Zero heap allocations per call through the full `AllowanceLayer` stack with a non-empty
//! `Full<Bytes>` request body: the retry layer keeps its copy for a retry by cloning the
//! body (`Replayable::try_clone`, a reference count on the shared bytes), so a body that is
//! already in memory costs no `Replay` handle and no allocation on the fast path.

mod alloc_counting;

use std::{
    convert::Infallible,
    future::{ready, Ready},
    num::NonZeroU32,
};

use alloc_counting::{allocations_over_calls, CALLS, ROUNDS, WARM_UP};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{service_fn, Layer};
use tower_allowance::{Allowance, AllowanceConfig};

#[test]
fn full_stack_fast_path_with_a_full_bytes_body_does_not_allocate() {
    let config = AllowanceConfig::per_second(1_000_000, NonZeroU32::MAX.get()).expect("valid");
    let allowance = Allowance::new(config);
    let mut service = allowance.layer().layer(service_fn(
        |_req: Request<Full<Bytes>>| -> Ready<Result<Response<()>, Infallible>> {
            ready(Ok(Response::new(())))
        },
    ));
    // 16 KiB shared by every request, as a client holding a serialized payload would.
    let payload = Bytes::from(vec![7u8; 16 * 1024]);
    let change = allocations_over_calls(&mut service, || Request::new(Full::new(payload.clone())));

    let snapshot = allowance.snapshot();
    assert_eq!(snapshot.admitted, (ROUNDS * CALLS + WARM_UP) as u64);
    assert_eq!(snapshot.waited, 0, "every call took the fast path");
    assert_eq!(
        (change.allocations, change.reallocations),
        (0, 0),
        "heap allocations through the full AllowanceLayer stack over {CALLS} calls: {change:?}"
    );
}
