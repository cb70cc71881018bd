//! (d) Waiters at scale: the cost of one admission while 10, 1,000 or 10,000 tasks wait.
//!
//! `n` tasks each loop on `allowance.acquire().await` against one allowance of 1,000/s with
//! a burst of 1, on a current-thread runtime with a paused clock: after each admission the
//! admitted task queues again at the tail, so the queue holds `n - 1` or `n` waiters all
//! along, and the clock jumps straight to the next token (virtual time costs nothing), so
//! the wall time measured is the machinery's own: queue, shared timer, wakeup, re-queue.
//! Timing starts once every task is queued and covers exactly `iters` admissions.
//!
//! With a paused clock, `tokio::time::Instant::now()` reads the runtime's clock under a
//! mutex, which real-time use does not pay; it is the same for every `n`.
//!
//! `cargo bench -p allowance-bench --bench waiters -- --measurement-time 3 --warm-up-time 1`

#![allow(missing_docs)] // criterion_group! generates undocumented items.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use tokio::sync::Notify;
use tower_allowance::{Allowance, AllowanceConfig};

/// Wall time for `admissions` admissions with `n` tasks waiting.
#[allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "wall time: tokio's clock is paused here"
)]
fn steady_state(n: usize, admissions: u64) -> Duration {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let config = AllowanceConfig::per_second(1_000, 1)
            .expect("valid config")
            .with_max_waiters(n + 1);
        let allowance = Allowance::new(config);
        let done = Arc::new(AtomicU64::new(0));
        let target = Arc::new(AtomicU64::new(u64::MAX));
        let reached = Arc::new(Notify::new());
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (allowance, done, target, reached) = (
                    allowance.clone(),
                    done.clone(),
                    target.clone(),
                    reached.clone(),
                );
                tokio::spawn(async move {
                    loop {
                        allowance.acquire().await.expect("admitted");
                        if done.fetch_add(1, Ordering::Relaxed) + 1
                            == target.load(Ordering::Relaxed)
                        {
                            reached.notify_one();
                        }
                    }
                })
            })
            .collect();
        // Let every task queue up (the runtime is busy with us, so the clock stays put).
        while allowance.snapshot().waiting + 1 < n {
            tokio::task::yield_now().await;
        }
        target.store(done.load(Ordering::Relaxed) + admissions, Ordering::Relaxed);
        let start = std::time::Instant::now();
        reached.notified().await;
        let elapsed = start.elapsed();
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
        elapsed
    })
}

fn waiters(c: &mut Criterion) {
    let mut group = c.benchmark_group("waiters");
    group
        .throughput(Throughput::Elements(1))
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10);
    for n in [10usize, 1_000, 10_000] {
        group.bench_with_input(BenchmarkId::new("ours/admission", n), &n, |b, &n| {
            b.iter_custom(|iters| steady_state(n, iters.max(1)))
        });
    }
    group.finish();
}

criterion_group!(benches, waiters);
criterion_main!(benches);
