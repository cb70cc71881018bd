//! Helpers shared by the bench targets.

// Each bench target uses a subset.
#![allow(dead_code)]

use std::{
    future::Future,
    num::NonZeroU32,
    pin::Pin,
    task::{Context, Poll, Waker},
};

use tower_allowance::{Allowance, AllowanceConfig};

/// An allowance that never runs dry during a benchmark: one token per microsecond (the
/// finest interval the library accepts) and a burst of `u32::MAX`, so every admission takes
/// the fast path (token available, no cooldown, nobody waiting).
pub(crate) fn unreachable_allowance() -> Allowance {
    let config = AllowanceConfig::per_second(1_000_000, u32::MAX).expect("valid config");
    Allowance::new(config)
}

/// governor with the same quota: 1,000,000 per second, bursts of `u32::MAX`, default clock.
pub(crate) fn unreachable_governor() -> governor::DefaultDirectRateLimiter {
    let rate = NonZeroU32::new(1_000_000).expect("non-zero");
    let quota = governor::Quota::per_second(rate).allow_burst(NonZeroU32::MAX);
    governor::RateLimiter::direct(quota)
}

/// Polls `fut` once with a no-op waker and insists it is ready: the fast path never waits.
pub(crate) fn poll_once<F: Future>(fut: Pin<&mut F>) -> F::Output {
    match fut.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the fast path returned Pending"),
    }
}
