//! (d) Waiters at scale, counted rather than timed: wakeups per admission and the wait
//! queue's own memory per waiter, with 10, 1,000 and 10,000 waiters.
//!
//! `cargo bench -p allowance-bench --bench waiters_report`
//!
//! - Wakeups: `n` tasks loop on `acquire().await` (1,000/s, burst 1, paused clock); every
//!   `Acquire` is wrapped in a future that counts its polls. Over a steady-state window,
//!   wakeups = polls - acquires started (each acquire's first poll is not a wakeup).
//! - Memory: `n` `Acquire` futures are boxed first, then each is polled once so that it
//!   joins the queue; a counting global allocator records what that enqueuing allocates
//!   (net of frees). That is the queue's own memory; the `Acquire` futures themselves
//!   (their size is printed too) live in the callers' tasks.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll, Waker},
};

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower_allowance::{Acquire, Allowance, AllowanceConfig};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Counts how often the wrapped future is polled.
struct Counted<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicU64>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

fn allowance(n: usize) -> Allowance {
    let config = AllowanceConfig::per_second(1_000, 1)
        .expect("valid config")
        .with_max_waiters(n + 1);
    Allowance::new(config)
}

/// (polls - starts) / admissions over a window of `window` admissions in steady state.
fn wakeups_per_admission(n: usize, window: u64) -> (u64, u64, f64) {
    paused_runtime().block_on(async move {
        let allowance = allowance(n);
        let polls = Arc::new(AtomicU64::new(0));
        let starts = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (allowance, polls, starts) = (allowance.clone(), polls.clone(), starts.clone());
                tokio::spawn(async move {
                    loop {
                        starts.fetch_add(1, Ordering::Relaxed);
                        let acquire = Counted {
                            inner: Box::pin(allowance.acquire()),
                            polls: polls.clone(),
                        };
                        acquire.await.expect("admitted");
                    }
                })
            })
            .collect();
        // Warm up: every task cycles through the queue once.
        let admitted = || allowance.snapshot().admitted;
        let settle = u64::try_from(n).expect("fits") + 100;
        while admitted() < settle {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let (p0, s0, a0) = (
            polls.load(Ordering::Relaxed),
            starts.load(Ordering::Relaxed),
            admitted(),
        );
        while admitted() < a0 + window {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let (p1, s1, a1) = (
            polls.load(Ordering::Relaxed),
            starts.load(Ordering::Relaxed),
            admitted(),
        );
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
        let wakeups = (p1 - p0) - (s1 - s0);
        let admissions = a1 - a0;
        #[allow(clippy::cast_precision_loss, reason = "a ratio for display")]
        let ratio = wakeups as f64 / admissions as f64;
        (wakeups, admissions, ratio)
    })
}

/// Net bytes and allocations made by `n` waiters joining the queue.
fn queue_memory(n: usize) -> (i128, usize) {
    paused_runtime().block_on(async move {
        let allowance = allowance(n);
        // Spend the only token, so every acquire below has to wait.
        allowance.acquire().await.expect("admitted");
        let mut waiters: Vec<Pin<Box<Acquire<'_>>>> =
            (0..n).map(|_| Box::pin(allowance.acquire())).collect();
        let mut cx = Context::from_waker(Waker::noop());
        let region = Region::new(GLOBAL);
        for w in &mut waiters {
            assert!(w.as_mut().poll(&mut cx).is_pending(), "must wait");
        }
        let change = region.change();
        assert_eq!(allowance.snapshot().waiting, n);
        let net = i128::try_from(change.bytes_allocated).expect("fits")
            - i128::try_from(change.bytes_deallocated).expect("fits")
            + i128::try_from(change.bytes_reallocated).expect("fits");
        drop(waiters);
        (net, change.allocations)
    })
}

fn main() {
    println!(
        "size_of::<Acquire>() = {} bytes (lives in the caller's future; holds its own timer)",
        std::mem::size_of::<Acquire<'static>>()
    );
    println!();
    println!("| waiters | window (admissions) | wakeups | wakeups/admission | queue bytes (net) | allocations | queue bytes/waiter |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in [10usize, 1_000, 10_000] {
        let window = 20_000;
        let (wakeups, admissions, ratio) = wakeups_per_admission(n, window);
        let (bytes, allocations) = queue_memory(n);
        #[allow(clippy::cast_precision_loss, reason = "a ratio for display")]
        let per_waiter = bytes as f64 / n as f64;
        println!(
            "| {n} | {admissions} | {wakeups} | {ratio:.4} | {bytes} | {allocations} | {per_waiter:.1} |"
        );
    }
}
