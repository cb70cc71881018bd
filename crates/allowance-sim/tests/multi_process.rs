//! Four OS processes (the `allowance-sim` binary, started as `worker` children) x eight
//! workers against one upstream whose bucket matches the allowance: with one Redis allowance
//! the server sees (almost) no 429s and every job completes; with four in-memory allowances,
//! the seed's lesson, it sees many. And a shared retry budget of K is exact across processes.
//!
//! Real time, a private `redis-server` (see `tower_allowance_redis::test_util`).

use std::{
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use allowance_sim::{
    live::StoreChoice,
    multi::{run_name, run_processes, run_processes_with, Spawn},
    scenario::{Mode, Scenario},
    upstream::{RetryAfterMode, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};
use tower_allowance_redis::test_util::TestRedis;

const PROCESSES: usize = 4;
const RATE: u32 = 40;
const BURST: u32 = 4;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_allowance-sim"))
}

fn key_header() -> Vec<String> {
    vec![format!("{API_KEY_HEADER}: {DEFAULT_KEY}")]
}

fn scenario(workers: usize, jobs: usize) -> Scenario {
    Scenario {
        workers,
        jobs,
        // The upstream's rate; one token less of burst as headroom for delivery jitter: a
        // request admitted 25 ms after another can arrive a few ms sooner than that when its
        // process was scheduled late, and the upstream forgives only 1/10 of a token.
        burst: BURST - 1,
        rate_per_sec: RATE,
        max_attempts: 10,
        ..Scenario::seed(Mode::Shared)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_allowance_for_four_processes_vs_one_allowance_each() {
    let Some(redis) = TestRedis::start().await else {
        return;
    };
    let s = scenario(32, 96);

    let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
        .await
        .expect("upstream");
    let redis_store = StoreChoice::Redis {
        url: redis.url().to_owned(),
        name: run_name(),
    };
    let template = upstream.snapshot_url("e{job}");
    let shared = run_processes(exe(), &s, &template, &key_header(), &redis_store, PROCESSES)
        .await
        .expect("runs");
    let seen = upstream.log();
    upstream.shutdown().await;
    let rejected = seen.iter().filter(|r| r.status == 429).count();
    eprintln!(
        "one Redis allowance, {PROCESSES} processes x 8 workers: {} attempts, {rejected} 429s, {} completed, {} ms",
        seen.len(),
        shared.completed,
        shared.makespan_ms
    );

    let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
        .await
        .expect("upstream");
    let template = upstream.snapshot_url("e{job}");
    let split = run_processes(
        exe(),
        &s,
        &template,
        &key_header(),
        &StoreChoice::Memory,
        PROCESSES,
    )
    .await
    .expect("runs");
    let split_seen = upstream.log();
    upstream.shutdown().await;
    let split_rejected = split_seen.iter().filter(|r| r.status == 429).count();
    eprintln!(
        "one in-memory allowance per process: {} attempts, {split_rejected} 429s, {} completed, {} ms",
        split_seen.len(),
        split.completed,
        split.makespan_ms
    );

    assert_eq!(shared.completed, 96, "every job completes");
    // At most 1% of attempts: delivery jitter between admission and arrival.
    assert!(
        rejected * 100 <= seen.len(),
        "{rejected} 429s of {}",
        seen.len()
    );
    // Each process's allowance admits its own burst at once: 4 x 3 against a bucket of 4.
    assert!(
        split_rejected >= 5 && split_rejected > 5 * rejected,
        "separate allowances must overrun the upstream: {split_rejected} 429s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_budget_of_k_is_exact_across_processes() {
    budget_of_k_across_processes(Mode::Shared).await;
}

/// Naive workers with `--retry-budget`: one pool for the group, in Redis across processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_naive_budget_pool_of_k_is_exact_across_processes() {
    budget_of_k_across_processes(Mode::Naive).await;
}

async fn budget_of_k_across_processes(mode: Mode) {
    let Some(redis) = TestRedis::start().await else {
        return;
    };
    const K: u64 = 6;
    // Always 429 (an empty bucket), without Retry-After: retries back off and spend budget.
    let upstream =
        Upstream::start(UpstreamConfig::new(0, 1).with_retry_after(RetryAfterMode::Absent))
            .await
            .expect("upstream");
    let s = Scenario {
        burst: 100,
        rate_per_sec: 1000,
        max_attempts: 3,
        retry_budget: Some(K),
        mode,
        ..scenario(16, 16)
    };
    let store = StoreChoice::Redis {
        url: redis.url().to_owned(),
        name: run_name(),
    };
    let report = run_processes(
        exe(),
        &s,
        &upstream.snapshot_url("e{job}"),
        &key_header(),
        &store,
        PROCESSES,
    )
    .await
    .expect("runs");
    let seen = upstream.log();
    upstream.shutdown().await;
    eprintln!(
        "always-429 upstream, {mode} budget {K}: {} attempts for 16 jobs; abandoned {:?}",
        seen.len(),
        report.abandoned_by_reason
    );
    assert_eq!(
        seen.len() as u64,
        16 + K,
        "the server sees exactly jobs + K attempts"
    );
    assert_eq!(report.completed, 0);
    assert_eq!(report.abandoned, 16);
}

#[test]
fn the_cli_runs_processes_end_to_end() {
    // `--processes` without `--redis`: no Redis needed; each process has its own allowance.
    let out = std::process::Command::new(exe())
        .args([
            "run",
            "--mode",
            "shared",
            "--real",
            "--processes",
            "2",
            "--workers",
            "4",
            "--jobs",
            "4",
        ])
        .args(["--burst", "4", "--rate", "20", "--json"])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not a terminal: no progress bar, nothing but the report.
    assert!(out.stderr.is_empty(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["completed"], 4);
    assert_eq!(report["counted_by"], "server");
    assert!(report["scenario"]
        .as_str()
        .is_some_and(|s| s.contains("x2")));
    // Virtual time cannot span processes: a clear error.
    let out = std::process::Command::new(exe())
        .args(["run", "--processes", "2"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--real"));
}

/// The progress a `--processes` run shows: the children's `progress N` lines, added up,
/// count every job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_counts_every_job_across_processes() {
    let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
        .await
        .expect("upstream");
    let s = scenario(4, 12);
    let done = Arc::new(AtomicUsize::new(0));
    let spawn = Spawn {
        progress: Some(done.clone()),
        ..Spawn::default()
    };
    let template = upstream.snapshot_url("e{job}");
    let report = run_processes_with(
        exe(),
        &s,
        &template,
        &key_header(),
        &StoreChoice::Memory,
        2,
        &spawn,
    )
    .await
    .expect("runs");
    upstream.shutdown().await;
    assert_eq!(report.completed, 12);
    assert_eq!(done.load(Ordering::Relaxed), 12);
}

/// `store_calls` (issue 15, point 2) is what the Redis server counted: the scripts the run's
/// stores called, summed over the processes (the connect-time script load left out), and
/// about one per admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_calls_are_what_redis_counted() {
    let Some(redis) = TestRedis::start_private().await else {
        return;
    };
    let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
        .await
        .expect("upstream");
    let store = StoreChoice::Redis {
        url: redis.url().to_owned(),
        name: run_name(),
    };
    assert_eq!(redis.command(&["CONFIG", "RESETSTAT"]).await, "+OK");
    let report = run_processes(
        exe(),
        &scenario(32, 120),
        &upstream.snapshot_url("e{job}"),
        &key_header(),
        &store,
        PROCESSES,
    )
    .await
    .expect("runs");
    upstream.shutdown().await;
    let stats = redis.command(&["INFO", "commandstats"]).await;
    let counted: u64 = stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let (calls, admissions) = (
        report.store_calls.expect("store_calls with Redis"),
        report.admissions.expect("admissions"),
    );
    eprintln!("{PROCESSES} processes: {calls} store calls, Redis counted {counted} script calls, {admissions} admissions");
    assert_eq!(calls, counted);
    assert!(admissions >= 120, "{admissions}");
    assert!(
        calls * 10 <= admissions * 13,
        "{calls} calls for {admissions} admissions"
    );
}
