//! A spent monthly quota across processes (issue 9, point 4), over real HTTP: 64 jobs against
//! an upstream with 20 credits. Whether the allowance lives in one Redis shared by 4 processes,
//! in Redis for 1 process, or in memory, exactly 20 jobs complete, the other 44 are abandoned
//! (`quota_exhausted`), the upstream serves exactly ONE `/v1/usage` request for the group,
//! and after that probe not one snapshot request reaches it.
//!
//! Real time, a private `redis-server` (see `tower_allowance_redis::test_util`).

use std::path::Path;

use allowance_sim::{
    live::{self, StoreChoice, Target},
    multi::{run_name, run_processes_with, Spawn},
    report::RunReport,
    scenario::{Mode, Scenario},
    upstream::{SeenRequest, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY, USAGE_PATH},
};
use tower_allowance_redis::test_util::TestRedis;

const QUOTA: u64 = 20;
const JOBS: usize = 64;
/// Bursts of 2 at 10/s (the seed's burst, five times its rate: the same story in 2 s).
const BURST: u32 = 2;
const RATE: u32 = 10;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_allowance-sim"))
}

fn scenario() -> Scenario {
    Scenario {
        workers: 32,
        jobs: JOBS,
        burst: BURST,
        rate_per_sec: RATE,
        ..Scenario::seed(Mode::Shared)
    }
}

fn upstream_config() -> UpstreamConfig {
    UpstreamConfig::new(BURST, RATE).with_quota(QUOTA)
}

/// Checks the run and the upstream's log; returns a line for the test's output.
fn check(what: &str, report: &RunReport, log: &[SeenRequest]) {
    let usage: Vec<&SeenRequest> = log.iter().filter(|r| r.path == USAGE_PATH).collect();
    let snapshots: Vec<&SeenRequest> = log.iter().filter(|r| r.path != USAGE_PATH).collect();
    let ok = snapshots.iter().filter(|r| r.status == 200).count();
    let rejected = snapshots.iter().filter(|r| r.status == 429).count();
    eprintln!(
        "{what}: completed {} abandoned {:?} failed {}; upstream: {} snapshots ({ok} 200, {rejected} 429), usage at {:?} ms",
        report.completed,
        report.abandoned_by_reason,
        report.failed,
        snapshots.len(),
        usage.iter().map(|r| r.at_ms).collect::<Vec<_>>()
    );
    assert_eq!(report.completed, QUOTA as usize, "{what}: {report:?}");
    assert_eq!(report.abandoned, JOBS - QUOTA as usize, "{what}");
    assert_eq!(
        report.abandoned_by_reason.get("quota_exhausted").copied(),
        Some(JOBS - QUOTA as usize),
        "{what}: every abandoned job says why"
    );
    assert_eq!(report.failed, 0, "{what}: {:?}", report.first_error);
    assert_eq!(
        usage.len(),
        1,
        "{what}: one usage probe for the whole group"
    );
    assert_eq!(ok, QUOTA as usize, "{what}");
    // The first quota 429 (no Retry-After) triggers the probe; admissions are 100 ms apart,
    // so nothing else is in flight by then.
    assert_eq!(rejected, 1, "{what}: one 429 before the verdict");
    let verdict_asked_at = usage[0].at_ms;
    let after: Vec<&&SeenRequest> = snapshots
        .iter()
        .filter(|r| r.at_ms > verdict_asked_at)
        .collect();
    assert!(
        after.is_empty(),
        "{what}: snapshot requests reached the upstream after the probe: {after:?}"
    );
}

async fn over_redis(processes: usize) {
    let Some(redis) = TestRedis::start().await else {
        return;
    };
    let upstream = Upstream::start(upstream_config()).await.expect("upstream");
    let store = StoreChoice::Redis {
        url: redis.url().to_owned(),
        name: run_name(),
    };
    let spawn = Spawn {
        usage_url: Some(upstream.usage_url()),
        ..Spawn::default()
    };
    let report = run_processes_with(
        exe(),
        &scenario(),
        &upstream.snapshot_url("e{job}"),
        &[format!("{API_KEY_HEADER}: {DEFAULT_KEY}")],
        &store,
        processes,
        &spawn,
    )
    .await
    .expect("runs");
    let log = upstream.log();
    upstream.shutdown().await;
    check(&format!("{processes} process(es) on Redis"), &report, &log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_one_redis_allowance_probe_once() {
    over_redis(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_on_redis_probes_once() {
    over_redis(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_in_memory_probes_once() {
    let upstream = Upstream::start(upstream_config()).await.expect("upstream");
    let target = Target::upstream(&upstream, DEFAULT_KEY)
        .expect("target")
        .usage_probe(upstream.usage_url());
    let report = live::run_http(&scenario(), &target, None)
        .await
        .expect("runs");
    let log = upstream.log();
    upstream.shutdown().await;
    check("in memory", &report, &log);
}

/// Without the probe (naive workers share nothing) the quota still ends every job, by its
/// attempts: no probe is sent, and the CLI reports `usage_probes: 0`.
#[test]
fn naive_workers_do_not_probe_and_the_cli_counts_what_the_upstream_served() {
    let out = std::process::Command::new(exe())
        .args(["run", "--real", "--mode", "naive", "--workers", "4"])
        .args([
            "--jobs", "8", "--quota", "4", "--burst", "4", "--rate", "20",
        ])
        .args(["--max-attempts", "2", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["usage_probes"], 0, "{v}");
    assert_eq!(v["completed"], 4, "{v}");
    assert_eq!(v["abandoned_by_reason"]["max_attempts"], 4, "{v}");

    // Virtual time has no usage endpoint: refused, not ignored.
    let out = std::process::Command::new(exe())
        .args(["run", "--quota", "4"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--real"));
}
