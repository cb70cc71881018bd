//! The CLI as operators meet it (issue 21, point 4): Redis errors printed whole (a wrong or
//! missing password, a missing ACL permission), a run where no job completed is not exit 0,
//! naive mode's `--max-attempts 1` reports a final 429 as abandoned like shared and split,
//! and naive mode's `--retry-budget` is a pool that never paces first attempts.

use std::process::{Command, Output};

use allowance_testkit::scenario::{Mode, Scenario};
use serde_json::Value;
use tower_allowance_redis::test_util::TestRedis;

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

const ONE_JOB: [&str; 8] = [
    "run",
    "--real",
    "--mode",
    "shared",
    "--workers",
    "1",
    "--jobs",
    "1",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refusals_print_their_whole_cause() {
    let redis = TestRedis::start_private().await;
    let reply = redis
        .commands(&[
            &[
                "ACL", "SETUSER", "nopub", "on", ">pw", "~*", "&*", "+@all", "-publish",
            ],
            &["ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all"],
        ])
        .await;
    assert!(reply.starts_with("+OK\r\n+OK"), "{reply}");
    let with = |userinfo: &str| {
        redis
            .url()
            .replacen("redis://", &format!("redis://{userinfo}@"), 1)
    };
    let cases = [
        (with("app:wrong"), "WRONGPASS"),
        (with("nopub:pw"), "ACL SETUSER nopub +publish"),
    ];
    for (url, says) in cases {
        let out = tokio::task::spawn_blocking({
            let url = url.clone();
            move || sim(&[&ONE_JOB[..], &["--redis", &url]].concat())
        })
        .await
        .expect("joined");
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = stderr(&out);
        assert!(err.contains(says), "{says}: {err}");
        assert!(!err.contains("wrong@"), "no password printed: {err}");
    }
}

#[test]
fn naive_max_attempts_1_reports_a_final_429_as_abandoned_in_every_mode() {
    for mode in ["naive", "split:2", "shared"] {
        for clock in ["--real", "--virtual"] {
            let out = sim(&[
                "run",
                clock,
                "--mode",
                mode,
                "--max-attempts",
                "1",
                "--json",
            ]);
            let v = json(&out);
            assert_eq!(v["failed"], 0, "{mode} {clock}: {v}");
            assert!(out.status.success(), "{mode} {clock}: {out:?}");
            // The seed: 8 workers, a bucket of 2. Naive and split see 429s: abandoned.
            let rejected = v["rejected"].as_u64().unwrap_or(0);
            assert_eq!(
                v["abandoned_by_reason"]["max_attempts"]
                    .as_u64()
                    .unwrap_or(0),
                rejected,
                "{mode} {clock}: {v}"
            );
        }
    }
}

#[test]
fn a_run_where_no_job_completed_exits_3() {
    // A bucket of one token: one job completes, the others are abandoned at their cap.
    let out = sim(&[
        "run",
        "--virtual",
        "--mode",
        "naive",
        "--max-attempts",
        "1",
        "--workers",
        "4",
        "--jobs",
        "4",
        "--burst",
        "1",
        "--rate",
        "1",
        "--json",
    ]);
    let v = json(&out);
    // One token: one job completes, so this run exits 0.
    assert_eq!(v["completed"], 1, "{v}");
    assert!(out.status.success(), "{out:?}");

    // No credit at all: every answer is a 429, every job abandoned, none completed.
    let out = sim(&[
        "run",
        "--real",
        "--mode",
        "naive",
        "--max-attempts",
        "1",
        "--workers",
        "4",
        "--jobs",
        "4",
        "--quota",
        "0",
        "--json",
    ]);
    let v = json(&out);
    assert_eq!(v["completed"], 0, "{v}");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        stderr(&out).contains("no job of 4 completed"),
        "{}",
        stderr(&out)
    );
}

/// Naive mode's group budget spends retries only: a worker whose first job went through
/// sends its second job's first attempt at once, not behind another worker's retry
/// reserved for 1 s later (the upstream's Retry-After), as `run --real --mode naive
/// --retry-budget 8` runs it. (First attempts no longer pass the pool at all; on one
/// process with the pool in memory this run was not paced before either.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_retry_budget_never_paces_first_attempts() {
    let s = Scenario {
        retry_budget: Some(8),
        max_attempts: 3,
        jobs: 16,
        ..Scenario::seed(Mode::Naive)
    };
    let report = allowance_sim::live::run_real(&s, None).await.expect("runs");
    let early = report
        .timeline
        .attempts
        .iter()
        .filter(|a| a.at_ms < 900)
        .count();
    // Eight first attempts at once (the upstream's burst of 2 serves two), then the next
    // first attempt of each worker whose job completed: sending them on loopback takes
    // milliseconds; 900 ms (before the 1 s Retry-After ends) is some hundred times that.
    assert!(
        early > 8,
        "{early} attempts before 900 ms: {:?}",
        report.timeline.attempts
    );
}
