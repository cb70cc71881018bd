//! Four OS processes x eight workers against one HTTP upstream whose bucket matches the
//! allowance (same rate; the allowance keeps one token of the burst as headroom): with one Redis allowance the server sees (almost) no 429s and every job
//! completes; with four in-memory allowances, the seed's lesson, it sees many. And a shared
//! retry budget of K is exact across processes: the server sees exactly jobs + K attempts.
//!
//! Each process is `src/bin/redis_worker.rs`. Real time, a private `redis-server`.

use std::process::{Command, Stdio};

use allowance_sim::upstream::{RetryAfterMode, Upstream, UpstreamConfig};
use tower_allowance_redis::test_util::{unique_name, TestRedis};

const PROCESSES: usize = 4;
const WORKERS: usize = 8;

#[derive(Debug, Default, PartialEq, Eq)]
struct Totals {
    completed: usize,
    abandoned: usize,
    failed: usize,
}

/// Runs `PROCESSES` workers processes at once with `args`, each on its own slice of jobs.
async fn run_processes(
    store: &str,
    name: &str,
    url: &str,
    jobs_each: usize,
    extra: &[&str],
) -> Totals {
    let mut children = vec![];
    for p in 0..PROCESSES {
        let child = Command::new(env!("CARGO_BIN_EXE_redis_worker"))
            .args(["--url", url, "--store", store, "--name", name])
            .args(["--workers", &WORKERS.to_string()])
            .args(["--jobs", &jobs_each.to_string()])
            .args(["--first-job", &(p * jobs_each).to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn redis_worker");
        children.push(child);
    }
    let mut totals = Totals::default();
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .expect("join")
            .expect("wait");
        assert!(
            out.status.success(),
            "a worker process failed: {:?}",
            out.status
        );
        let line = String::from_utf8_lossy(&out.stdout);
        for field in line.split_whitespace() {
            let (k, v) = field.split_once('=').expect("k=v");
            let v: usize = v.parse().expect("number");
            match k {
                "completed" => totals.completed += v,
                "abandoned" => totals.abandoned += v,
                "failed" => totals.failed += v,
                _ => panic!("unexpected field {k}"),
            }
        }
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_allowance_for_four_processes_vs_four_in_memory() {
    let Some(redis) = TestRedis::start().await else {
        return;
    };
    const RATE: u32 = 40;
    const BURST: u32 = 4;
    const JOBS_EACH: usize = 24; // 96 jobs: about 2.3 s at 40/s
    let rate = RATE.to_string();
    // The same rate as the upstream; one token less of burst as headroom for delivery
    // jitter: a request admitted 25 ms after another can arrive a few ms sooner than that
    // (another process was scheduled late), and the upstream only forgives 1/10 of a token.
    let burst = (BURST - 1).to_string();
    let extra = ["--rate", &rate, "--burst", &burst];

    let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
        .await
        .expect("upstream");
    let url = upstream.snapshot_url("e{job}");
    let shared = run_processes(redis.url(), &unique_name("mp"), &url, JOBS_EACH, &extra).await;
    let seen = upstream.log();
    upstream.shutdown().await;
    let rejected = seen.iter().filter(|r| r.status == 429).count();
    eprintln!(
        "redis allowance, {PROCESSES} processes x {WORKERS} workers: {} attempts, {rejected} 429s, {shared:?}",
        seen.len()
    );

    let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
        .await
        .expect("upstream");
    let url = upstream.snapshot_url("e{job}");
    let split = run_processes("memory", "unused", &url, JOBS_EACH, &extra).await;
    let split_seen = upstream.log();
    upstream.shutdown().await;
    let split_rejected = split_seen.iter().filter(|r| r.status == 429).count();
    eprintln!(
        "4 in-memory allowances, {PROCESSES} processes x {WORKERS} workers: {} attempts, {split_rejected} 429s, {split:?}",
        split_seen.len()
    );

    let jobs = PROCESSES * JOBS_EACH;
    assert_eq!(shared.completed, jobs, "every job completes: {shared:?}");
    // At most 1% of attempts: delivery jitter between admission and arrival.
    assert!(
        rejected * 100 <= seen.len(),
        "{rejected} 429s of {}",
        seen.len()
    );
    // Each process's own allowance admits its burst at once: 4 x 3 requests against a
    // bucket of 4 at the start alone.
    assert!(
        split_rejected >= 5 && split_rejected > 5 * rejected,
        "in-memory allowances per process must overrun the upstream: {split_rejected} 429s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_budget_of_k_is_exact_across_processes() {
    let Some(redis) = TestRedis::start().await else {
        return;
    };
    const K: usize = 6;
    const JOBS_EACH: usize = 4; // 16 jobs, each of which would retry twice
                                // Always 429 (an empty bucket), without Retry-After: retries back off and spend budget.
    let upstream =
        Upstream::start(UpstreamConfig::new(0, 1).with_retry_after(RetryAfterMode::Absent))
            .await
            .expect("upstream");
    let url = upstream.snapshot_url("e{job}");
    let k = K.to_string();
    let extra = [
        "--rate",
        "1000",
        "--burst",
        "100",
        "--budget",
        &k,
        "--attempts",
        "3",
    ];
    let totals = run_processes(
        redis.url(),
        &unique_name("mp-budget"),
        &url,
        JOBS_EACH,
        &extra,
    )
    .await;
    let seen = upstream.log();
    upstream.shutdown().await;
    let jobs = PROCESSES * JOBS_EACH;
    eprintln!(
        "always-429 upstream, budget {K}: {} attempts for {jobs} jobs, {totals:?}",
        seen.len()
    );
    assert_eq!(
        seen.len(),
        jobs + K,
        "the server sees exactly jobs + K attempts"
    );
    assert_eq!(totals.completed, 0);
}
