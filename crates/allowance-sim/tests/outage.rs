//! Store outages lose no work (issue 10, point 1), over real HTTP: 4 processes x 8 workers
//! share one Redis allowance (bursts of 4 at 20/s, the upstream's own bucket), 300 jobs, and
//! mid-run the test (a) stops Redis for 3 s (`SIGSTOP`, then `SIGCONT`), (b) kills it
//! (`SIGKILL`) and restarts it on the same port 2 s later, empty, (c) flushes its scripts,
//! (d) flushes all its data. Each case has its own private `redis-server` and upstream.
//!
//! Admissions wait for Redis (the default `--on-store-outage wait`): in every case all 300
//! jobs complete and none fails; the upstream sees no 429 where the state survives ((a) and
//! (c)) and at most one burst where it is lost ((b) and (d)); the makespan stays within the
//! minimum plus the outage plus one second. With `fail-fast` chosen, the failures are
//! counted by cause, shown, and the run exits 3.
//!
//! Every 429 is printed with its cause (`allowance_testkit::scale::stray_429s`): one that delivery
//! jitter explains (the upstream's bucket, fed every request at the moment it was sent,
//! admits it) is named as such and not counted; every other one counts against the bound
//! above (none where the state survives, one burst where it is lost).
//!
//! A real-time experiment (`--features experiments`, tests/README.md): run one at a time.

mod common;

use std::time::Duration;

use allowance_sim::{
    live::StoreChoice,
    multi::{run_name, run_processes},
};
use allowance_testkit::{
    report::RunReport,
    scale::{print_strays, stray_429s},
    scenario::{Mode, Scenario},
    upstream::{SeenRequest, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};
use tokio::time::Instant;
use tower_allowance_redis::test_util::TestRedis;

use common::{exe, script_calls};

const PROCESSES: usize = 4;
const WORKERS: usize = 32;
const JOBS: usize = 300;
const BURST: u32 = 4;
const RATE: u32 = 20;
/// The fault comes once the upstream has seen this many requests (about 4 s in).
const FAULT_AFTER: usize = 80;

/// One real-time run at a time: the upstream forgives 5 ms of delivery jitter (a tenth of a
/// token), and four runs of four processes each on two cores make more than that.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// `SIGSTOP` for 3 s, then `SIGCONT`.
    Stop3s,
    /// `SIGKILL`, and a new server on the same port 2 s later (without the state).
    KillRestart2s,
    /// `SCRIPT FLUSH`.
    ScriptFlush,
    /// `FLUSHALL`.
    FlushAll,
}

impl Fault {
    /// Whether the allowance's state survives the fault.
    fn keeps_state(self) -> bool {
        matches!(self, Self::Stop3s | Self::ScriptFlush)
    }

    /// Applies the fault; returns how long Redis did not answer.
    async fn apply(self, redis: &mut TestRedis) -> Duration {
        let start = Instant::now();
        match self {
            Self::Stop3s => {
                redis.freeze();
                tokio::time::sleep(Duration::from_secs(3)).await;
                redis.thaw();
            }
            Self::KillRestart2s => {
                redis.kill();
                tokio::time::sleep(Duration::from_secs(2)).await;
                redis.restart().await;
            }
            Self::ScriptFlush => {
                assert_eq!(redis.command(&["SCRIPT", "FLUSH"]).await, "+OK");
            }
            Self::FlushAll => {
                assert_eq!(redis.command(&["FLUSHALL"]).await, "+OK");
            }
        }
        match self {
            Self::Stop3s | Self::KillRestart2s => start.elapsed(),
            Self::ScriptFlush | Self::FlushAll => Duration::ZERO,
        }
    }
}

struct Case {
    report: RunReport,
    log: Vec<SeenRequest>,
    outage: Duration,
    fault_at_ms: u64,
}

async fn run_case(fault: Fault) -> Case {
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut redis = TestRedis::start_private().await;
    let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
        .await
        .expect("upstream");
    let s = Scenario {
        workers: WORKERS,
        jobs: JOBS,
        burst: BURST,
        rate_per_sec: RATE,
        max_attempts: 10,
        ..Scenario::seed(Mode::Shared)
    };
    let store = StoreChoice::Redis {
        url: redis.url().to_owned(),
        name: run_name(),
    };
    let template = upstream.snapshot_url("e{job}");
    let headers = [format!("{API_KEY_HEADER}: {DEFAULT_KEY}")];
    let run = tokio::spawn(async move {
        run_processes(exe(), &s, &template, &headers, &store, PROCESSES).await
    });
    // The fault comes mid-run, when the upstream has seen enough (not after a fixed sleep).
    while upstream.log().len() < FAULT_AFTER {
        assert!(!run.is_finished(), "the run ended before the fault");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fault_at_ms = upstream.log().last().map_or(0, |r| r.at_ms);
    let outage = fault.apply(&mut redis).await;
    let report = run.await.expect("joined").expect("the run completes");
    let log = upstream.log();
    upstream.shutdown().await;
    Case {
        report,
        log,
        outage,
        fault_at_ms,
    }
}

async fn check(fault: Fault) {
    let Case {
        report,
        log,
        outage,
        fault_at_ms,
    } = run_case(fault).await;
    let rejected: Vec<u64> = log
        .iter()
        .filter(|r| r.status == 429)
        .map(|r| r.at_ms)
        .collect();
    let slack_ms = u64::try_from(outage.as_millis()).unwrap_or(u64::MAX) + 1000;
    eprintln!(
        "{fault:?} at {fault_at_ms} ms, Redis silent {} ms: completed {}, failed {}, abandoned {}; upstream: {} attempts, 429s at {rejected:?} ms; makespan {} ms (minimum {} ms, bound {} ms)",
        outage.as_millis(),
        report.completed,
        report.failed,
        report.abandoned,
        log.len(),
        report.makespan_ms,
        report.min_makespan_ms,
        report.min_makespan_ms + slack_ms,
    );
    let strays = stray_429s(&log, &report.timeline, BURST, RATE, None);
    let early = print_strays(&format!("{fault:?}"), &strays);
    assert_eq!(report.failed, 0, "{fault:?}: {:?}", report.first_error);
    assert_eq!(report.completed, JOBS, "{fault:?}: {report:?}");
    let allowed = if fault.keeps_state() {
        0
    } else {
        BURST as usize
    };
    assert!(
        early <= allowed,
        "{fault:?}: {early} 429s not explained by delivery jitter (of {}), at most {allowed} allowed",
        rejected.len()
    );
    // Each 429 that delivery jitter explains (printed above with its cause) costs the whole
    // group the upstream's `Retry-After: 1` as a shared cooldown: its known price, added to
    // the bound; any other 429 has already failed the check above.
    let jitter = strays.iter().filter(|s| s.is_jitter()).count() as u64;
    assert!(
        report.makespan_ms <= report.min_makespan_ms + slack_ms + 1000 * jitter,
        "{fault:?}: makespan {} ms > minimum {} + outage {} + 1000 ms + {jitter} x 1000 ms (jitter 429s)",
        report.makespan_ms,
        report.min_makespan_ms,
        outage.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stopped_for_3_s_delays_work_and_loses_none() {
    check(Fault::Stop3s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_killed_and_restarted_empty_loses_no_work() {
    check(Fault::KillRestart2s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_flush_is_invisible() {
    check(Fault::ScriptFlush).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushall_costs_at_most_one_burst() {
    check(Fault::FlushAll).await;
}

/// `--on-store-outage fail-fast` through the binary: the jobs that meet the stopped Redis
/// fail at once, and the run says so (failed by cause `store`, the first cause on stderr,
/// exit status 3) instead of calling them completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_failures_are_counted_and_shown() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut redis = TestRedis::start_private().await;
    let url = redis.url().to_owned();
    let run = tokio::process::Command::new(exe())
        .args(["run", "--real", "--mode", "shared", "--redis", &url])
        .args(["--processes", "4", "--workers", "8", "--jobs", "100"])
        .args([
            "--burst",
            "4",
            "--rate",
            "20",
            "--on-store-outage",
            "fail-fast",
        ])
        .arg("--json")
        .env_remove("RUST_LOG")
        .output();
    let run = tokio::spawn(run);
    // Stop Redis once the run has made some admissions there.
    loop {
        let calls = script_calls(&redis.command(&["INFO", "commandstats"]).await);
        if calls >= 30 {
            break;
        }
        assert!(!run.is_finished(), "the run ended before the fault");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    redis.freeze();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.thaw();
    let out = run.await.expect("joined").expect("ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    eprintln!("fail-fast: {v}\n{stderr}");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let failed = v["failed"].as_u64().expect("failed");
    assert!(failed > 0, "{v}");
    assert_eq!(v["failed_by_cause"]["store"], failed, "{v}");
    assert_eq!(
        v["completed"].as_u64().unwrap_or(0) + failed + v["abandoned"].as_u64().unwrap_or(0),
        100,
        "{v}"
    );
    assert!(stderr.contains("jobs failed (store: "), "{stderr}");
    assert!(
        stderr.contains("allowance store could not decide"),
        "{stderr}"
    );
    // The store's own warning reached the terminal too.
    assert!(stderr.contains("WARN"), "{stderr}");
}

/// The cause of (d), in isolation: ten holders of reserved slots (bursts of 1 at 10/s, so
/// slots 100 ms apart), Redis loses the state (`FLUSHALL`), then a 500 ms cooldown is raised
/// (as the first 429 after the loss raises one). The holders must honour the cooldown and
/// still go out spaced (at most one burst together), as they do when the state survives.
async fn holders_after_a_state_loss(prior_cooldown: bool) {
    use tower_allowance::{Allowance, AllowanceConfig};
    use tower_allowance_redis::{RedisStore, RedisStoreOptions};

    let redis = TestRedis::start_private().await;
    let store = RedisStore::connect(redis.url(), &run_name(), RedisStoreOptions::new())
        .await
        .expect("connects");
    let allowance =
        Allowance::with_store(AllowanceConfig::per_second(10, 1).expect("valid"), store);
    let start = Instant::now();
    let holders: Vec<_> = (0..10)
        .map(|_| {
            let allowance = allowance.clone();
            tokio::spawn(async move {
                allowance.acquire().await.expect("admitted");
                start.elapsed()
            })
        })
        .collect();
    // Nine hold reserved slots (the tenth went at once).
    while allowance.snapshot().waiting < 9 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if prior_cooldown {
        // A cooldown the holders heard of (event epoch 1), before the loss.
        allowance
            .extend_cooldown(Duration::from_millis(1))
            .await
            .expect("raised");
    }
    assert_eq!(redis.command(&["FLUSHALL"]).await, "+OK");
    let cooldown_from = start.elapsed();
    allowance
        .extend_cooldown(Duration::from_millis(500))
        .await
        .expect("cooldown raised");
    let cooldown_until = cooldown_from + Duration::from_millis(500);
    let mut at = Vec::new();
    for h in holders {
        at.push(h.await.expect("joined"));
    }
    at.sort();
    let ms: Vec<u128> = at.iter().map(Duration::as_millis).collect();
    eprintln!(
        "prior cooldown {prior_cooldown}: admitted at {ms:?} ms; cooldown {} to {} ms",
        cooldown_from.as_millis(),
        cooldown_until.as_millis()
    );
    let inside: Vec<u128> = at
        .iter()
        .filter(|t| **t > cooldown_from && **t + Duration::from_millis(2) < cooldown_until)
        .map(Duration::as_millis)
        .collect();
    assert!(
        inside.is_empty(),
        "admitted inside the cooldown at {inside:?} ms"
    );
    // Admissions within 5 ms of the one before: what went out together.
    let together = at
        .windows(2)
        .filter(|w| w[1] - w[0] < Duration::from_millis(5))
        .count();
    assert!(
        together <= 1,
        "{together} admissions went out together with the one before them: {ms:?} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_stay_spaced_after_a_state_loss_and_a_cooldown() {
    holders_after_a_state_loss(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_honour_a_cooldown_raised_after_a_state_loss() {
    holders_after_a_state_loss(true).await;
}
