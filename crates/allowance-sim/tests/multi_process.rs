//! Four OS processes (the `allowance-sim` binary, started as `worker` children) share a
//! retry budget of K exactly (counted by the upstream: jobs + K attempts), the CLI runs
//! processes end to end, and progress counts every job once.
//!
//! Real time, a private `redis-server` (see `tower_allowance_redis::test_util`), but every
//! verdict is a count that load cannot change: the budget test's upstream refuses everything,
//! and the others only count completed jobs (retries allowed). The runs that count 429s
//! against a matching upstream or compare store calls with admissions are real-time
//! experiments: `real_time.rs`, module `multi_process`.

mod common;

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use allowance_sim::{
    live::StoreChoice,
    multi::{run_processes_with, Spawn},
};
use allowance_testkit::{
    scenario::{Mode, Scenario},
    upstream::{RetryAfterMode, Upstream, UpstreamConfig},
};
use tower_allowance_redis::test_util::TestRedis;

use common::{
    exe, key_header,
    multi_process::{scenario, BURST, PROCESSES, RATE},
    redis_store, run_against,
};

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
    let redis = TestRedis::start().await;
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
    let (report, seen) = run_against(upstream, &s, &redis_store(&redis), PROCESSES).await;
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

/// `run --real --processes N --redis URL` with the issue-15 flags (`--throttle-at`,
/// `--workers-per-process`, `--cancel-fraction`): the report carries the forced cooldown,
/// the fairness per process and the cancelled jobs, counted by the upstream. (What those
/// figures must be is measured by the real-time experiments in `scale.rs`; here only what
/// load cannot change: the run ends past the forced 429's 500 ms, since 40 jobs at 20/s take
/// at least 1.8 s, and every job is counted once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reports_a_cooldown_fairness_and_cancellations() {
    let redis = TestRedis::start_private().await;
    let out = tokio::process::Command::new(exe())
        .args(["run", "--real", "--mode", "shared", "--redis", redis.url()])
        .args([
            "--processes",
            "2",
            "--workers",
            "8",
            "--workers-per-process",
            "7,1",
        ])
        .args(["--jobs", "40", "--burst", "4", "--rate", "20"])
        .args([
            "--throttle-at",
            "500:1",
            "--cancel-fraction",
            "0.2",
            "--json",
        ])
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["counted_by"], "server", "{v}");
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    assert_eq!(
        n("completed") + n("cancelled") + n("abandoned") + n("failed"),
        40,
        "{v}"
    );
    assert!(v["cancelled"].as_u64().is_some(), "{v}");
    assert!(v["releases"]["made"].as_u64().is_some(), "{v}");
    assert_eq!(v["cooldown"]["retry_after_ms"], 1000, "{v}");
    assert!(v["cooldown"]["sent_at_ms"].as_u64() >= Some(500), "{v}");
    let processes = v["fairness"]["processes"].as_array().expect("per process");
    assert_eq!(
        processes
            .iter()
            .map(|p| p["workers"].as_u64())
            .collect::<Vec<_>>(),
        [Some(7), Some(1)],
        "{v}"
    );
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
