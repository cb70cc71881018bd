//! The CLI says what happened (issue 10, point 5): failed jobs by cause next to completed and
//! abandoned, a non-zero exit with the first cause on stderr, `RUST_LOG` reaching the
//! terminal, and `--retry-budget` in naive mode as one pool for the group.

use std::process::{Command, Output};

use allowance_testkit::{
    scenario::{run_virtual, Mode, Scenario},
    upstream::{Upstream, UpstreamConfig},
};
use serde_json::Value;

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allowance-sim"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("runs")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("one JSON object ({e}): {out:?}"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Nothing listens on port 9 of loopback: every job fails with a transport error.
#[test]
fn transport_failures_are_counted_shown_and_exit_3() {
    let url = "http://127.0.0.1:9/v1/events/{job}/odds/snapshot";
    let common = ["--mode", "shared", "--workers", "2", "--jobs", "4"];
    let common = [
        &common[..],
        &["--rate", "10", "--burst", "2", "--max-attempts", "1"],
    ]
    .concat();

    let out = sim(&[&["http", "--url", url, "--json"], &common[..]].concat());
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let v = json(&out);
    assert_eq!(
        (v["completed"].as_u64(), v["failed"].as_u64()),
        (Some(0), Some(4)),
        "{v}"
    );
    assert_eq!(
        v["failed_by_cause"],
        serde_json::json!({ "transport": 4 }),
        "{v}"
    );
    let err = stderr(&out);
    assert!(err.contains("4 of 4 jobs failed (transport: 4)"), "{err}");
    assert!(err.contains("Connection refused"), "{err}");

    // The table has the column and the causes.
    let out = sim(&[&["http", "--url", url], &common[..]].concat());
    assert_eq!(out.status.code(), Some(3));
    let table = String::from_utf8_lossy(&out.stdout);
    let header = table
        .lines()
        .find(|l| l.starts_with("mode"))
        .expect("header");
    assert!(
        header.contains("abandoned") && header.contains("failed"),
        "{table}"
    );
    assert!(table.contains("failed by cause: transport: 4"), "{table}");
}

/// A final non-2xx response is a failure, never a completion: here a 401 (wrong key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_non_2xx_status_is_a_failure_by_status() {
    let upstream = Upstream::start(UpstreamConfig::new(10, 50))
        .await
        .expect("upstream");
    let url = upstream.snapshot_url("e{job}");
    let out = tokio::task::spawn_blocking(move || {
        sim(&[
            "http",
            "--url",
            &url,
            "--header",
            "X-API-Key: wrong",
            "--mode",
            "shared",
            "--workers",
            "2",
            "--jobs",
            "3",
            "--rate",
            "50",
            "--burst",
            "10",
            "--json",
        ])
    })
    .await
    .expect("joined");
    let seen = upstream.log();
    upstream.shutdown().await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let v = json(&out);
    assert_eq!(v["completed"], 0, "{v}");
    assert_eq!(
        v["failed_by_cause"],
        serde_json::json!({ "status_401": 3 }),
        "{v}"
    );
    assert_eq!(v["first_error"], "final status 401", "{v}");
    assert!(stderr(&out).contains("status_401: 3"), "{}", stderr(&out));
    assert_eq!(seen.len(), 3, "a 401 is not retried");
}

/// Abandonment by design (attempts, quota...) is not a failure: exit 0.
#[test]
fn abandoned_jobs_exit_0() {
    let out = sim(&[
        "run",
        "--mode",
        "naive",
        "--virtual",
        "--max-attempts",
        "2",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json(&out);
    assert!(v["abandoned"].as_u64().is_some_and(|n| n > 0), "{v}");
    assert_eq!(v["failed"], 0);
}

/// The stores' and the allowance's warnings reach stderr by default (`warn`); `RUST_LOG`
/// changes that. Here the quota verdict's WARN, from a worker child and in-process.
#[test]
fn warnings_reach_stderr_and_rust_log_filters_them() {
    for processes in ["1", "2"] {
        let mut args = vec!["run", "--real", "--mode", "shared", "--workers", "2"];
        args.extend([
            "--jobs", "6", "--quota", "2", "--burst", "4", "--rate", "20",
        ]);
        args.extend(["--json", "--processes", processes]);
        let out = sim(&args);
        assert!(out.status.success(), "{out:?}");
        let err = stderr(&out);
        assert!(
            err.contains("WARN") && err.contains("quota exhausted"),
            "{processes}: {err}"
        );
        if processes == "2" {
            assert!(err.contains("worker "), "forwarded from a child: {err}");
        }
        let quiet = Command::new(env!("CARGO_BIN_EXE_allowance-sim"))
            .args(&args)
            .env("RUST_LOG", "error")
            .output()
            .expect("runs");
        assert!(quiet.status.success(), "{quiet:?}");
        assert!(quiet.stderr.is_empty(), "{}", stderr(&quiet));
    }
}

/// `--retry-budget` in naive mode: one pool for the group, as in the seed's scenario 4b
/// (8 jobs against an upstream that always answers 429, 3 attempts each, budget 4 → 12
/// attempts), while each worker still retries alone.
#[test]
fn naive_retry_budget_is_one_pool_for_the_group() {
    let naive_4b = Scenario {
        mode: Mode::Naive,
        ..Scenario::always_429(Some(4))
    };
    let r = run_virtual(&naive_4b).expect("runs");
    assert_eq!(r.attempts, 8 + 4, "{r:?}");
    assert_eq!(r.completed, 0);
    // Four jobs got a retry each, then met the empty pool; the other four met it at once.
    assert_eq!(
        r.abandoned.get("budget_exhausted"),
        Some(&8),
        "{:?}",
        r.abandoned
    );
    // Each worker still waits the server's Retry-After (1 s) alone before its retry (to
    // the millisecond: slots fall on whole milliseconds).
    for retry in r.timeline.iter().skip(8) {
        let first = r
            .timeline
            .iter()
            .find(|seen| seen.worker == retry.worker)
            .expect("a first attempt");
        let waited = retry.at_ms - first.at_ms;
        assert!((1000..=1001).contains(&waited), "{:?}", r.timeline);
    }

    // Through the CLI, on the seed's naive herd (12 retries without a budget).
    let unlimited = json(&sim(&["run", "--mode", "naive", "--virtual", "--json"]));
    assert_eq!(unlimited["attempts"], 20, "{unlimited}");
    let out = sim(&[
        "run",
        "--mode",
        "naive",
        "--virtual",
        "--retry-budget",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let v = json(&out);
    assert_eq!(v["attempts"], 8 + 2, "{v}");
    assert_eq!(
        v["completed"].as_u64().unwrap_or(0) + v["abandoned"].as_u64().unwrap_or(0),
        8
    );
    assert!(
        v["abandoned_by_reason"]["budget_exhausted"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{v}"
    );
}

/// Settings that would otherwise be ignored are refused.
#[test]
fn an_outage_policy_without_redis_is_refused() {
    let out = sim(&[
        "run",
        "--mode",
        "shared",
        "--real",
        "--on-store-outage",
        "fail-fast",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("needs --redis"), "{}", stderr(&out));
    let out = sim(&["run", "--on-store-outage", "sometimes"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
