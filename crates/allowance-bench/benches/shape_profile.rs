//! The `shape` bench's competitors in a plain loop, for instruction counts under callgrind
//! (repeatable where wall time on a shared machine is not).
//!
//! ```text
//! cargo bench -p allowance-bench --bench shape_profile --no-run   # names the executable
//! valgrind --tool=callgrind --toggle-collect='shape_profile::run' \
//!     target/release/deps/shape_profile-<hash> <one|three|single|keyed|lookup> 100000
//! ```
//!
//! `cargo bench -p allowance-bench --bench shape_profile -- one 100000` runs it without
//! valgrind (the `--bench` flag cargo adds is ignored).
//!
//! `one`/`single`: `acquire()` polled once on a one-limit allowance; `three`: on a
//! three-limit one (per second, minute, day); `keyed`: `Keyed::get` of one key among 10,000
//! live ones, then `acquire()`; `lookup`: the `Keyed::get` alone. Instructions per operation
//! = the collected `Ir` / iterations.

use std::{
    future::Future,
    hint::black_box,
    pin::pin,
    task::{Context, Poll, Waker},
};

use tower_allowance::{
    keyed::{Keyed, KeyedConfig},
    Allowance, AllowanceConfig, Limit,
};

fn one_limit() -> AllowanceConfig {
    AllowanceConfig::per_second(1_000_000, u32::MAX).expect("valid")
}

fn three_limits() -> AllowanceConfig {
    one_limit()
        .with_limit(Limit::per_minute(60_000_000, u32::MAX).expect("valid"))
        .and_then(|c| c.with_limit(Limit::per_day(u32::MAX, u32::MAX).expect("valid")))
        .expect("three limits")
}

fn admit(a: &Allowance) {
    let fut = pin!(a.acquire());
    assert!(matches!(
        fut.poll(&mut Context::from_waker(Waker::noop())),
        Poll::Ready(Ok(()))
    ));
}

enum Target {
    Allowance(Allowance),
    Keyed(Keyed, String, bool),
}

#[inline(never)]
fn run(target: &Target, n: u64) {
    for _ in 0..n {
        match target {
            Target::Allowance(a) => admit(black_box(a)),
            Target::Keyed(k, key, acquire) => {
                let handle = k.get(black_box(key)).expect("live");
                if *acquire {
                    admit(handle.allowance());
                }
                black_box(handle);
            }
        }
    }
}

fn main() {
    // `cargo bench` adds `--bench`.
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let which = args.next().unwrap_or_else(|| "one".to_owned());
    let n: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let target = match which.as_str() {
        "one" | "single" => Target::Allowance(Allowance::new(one_limit())),
        "three" => Target::Allowance(Allowance::new(three_limits())),
        "keyed" | "lookup" => {
            let keyed = Keyed::new(
                KeyedConfig::new(one_limit())
                    .with_capacity(10_000)
                    .expect("valid"),
            );
            for i in 0..10_000 {
                keyed.get(format!("sk-live-{i:032x}")).expect("live");
            }
            Target::Keyed(keyed, format!("sk-live-{:032x}", 5_000), which == "keyed")
        }
        other => panic!("unknown competitor {other}"),
    };
    run(&target, 1_000);
    run(&target, n);
}
