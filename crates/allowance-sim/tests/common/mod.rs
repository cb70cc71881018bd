//! Helpers shared by the integration tests, above all by a deterministic test file and its
//! real-time half in `real_time.rs` (each user has `mod common;`).

// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

pub(crate) mod svg;

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
};

use allowance_sim::{
    cli::{execute, Cli},
    live::StoreChoice,
    multi::{run_name, run_processes},
};
use allowance_testkit::{
    report::RunReport,
    scenario::Scenario,
    upstream::{SeenRequest, Upstream, API_KEY_HEADER, DEFAULT_KEY},
};
use clap::Parser;
use serde_json::Value;
use tower_allowance_redis::test_util::TestRedis;

/// The `allowance-sim` binary.
pub(crate) fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_allowance-sim"))
}

/// The default key's header, as `run_processes` takes headers.
pub(crate) fn key_header() -> Vec<String> {
    vec![format!("{API_KEY_HEADER}: {DEFAULT_KEY}")]
}

/// One allowance in `redis`, under a name of its own.
pub(crate) fn redis_store(redis: &TestRedis) -> StoreChoice {
    StoreChoice::Redis {
        url: redis.url().to_owned(),
        name: run_name(),
    }
}

/// `s` in `processes` worker processes on `store`, against `upstream` with the default key:
/// the report and what the upstream saw (then shut down).
pub(crate) async fn run_against(
    upstream: Upstream,
    s: &Scenario,
    store: &StoreChoice,
    processes: usize,
) -> (RunReport, Vec<SeenRequest>) {
    let report = run_processes(
        exe(),
        s,
        &upstream.snapshot_url("e{job}"),
        &key_header(),
        store,
        processes,
    )
    .await
    .expect("runs");
    let seen = upstream.log();
    upstream.shutdown().await;
    (report, seen)
}

/// `allowance-sim ARGS...` in this process: what it prints.
pub(crate) fn run(args: &[&str]) -> String {
    let cli = Cli::try_parse_from(std::iter::once("allowance-sim").chain(args.iter().copied()))
        .expect("valid arguments");
    let mut out = Vec::new();
    execute(cli, &mut out).expect("runs");
    String::from_utf8(out).expect("utf-8")
}

/// A JSON report's attempts, 429s, completed and abandoned jobs.
pub(crate) fn figures(v: &Value) -> (u64, u64, u64, u64) {
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    (n("attempts"), n("rejected"), n("completed"), n("abandoned"))
}

/// A JSON report's number at `key`.
pub(crate) fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// The store's decisions (`FCALL`, or `EVALSHA` and `EVAL`) in a Redis `INFO commandstats` reply.
pub(crate) fn script_calls(stats: &str) -> u64 {
    stats
        .lines()
        .filter(|l| {
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// `serve` in a child process: its URL, and the child (killed on drop).
pub(crate) struct Served {
    pub(crate) url: String,
    child: Child,
}

impl Served {
    pub(crate) fn start(args: &[&str]) -> Self {
        let mut child = Command::new(exe())
            .arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut url = String::new();
        out.read_line(&mut url).expect("prints its URL");
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Self {
            url: url.trim().to_owned(),
            child,
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `http --dialect CLIENT_DIALECT` against a GitHub-shaped `serve` at 1/s (burst 2), its own
/// allowance far too fast (20/s, burst 2): two workers, six jobs, all of them completed. The
/// 429s it saw.
pub(crate) fn http_against_github_serve(client_dialect: &str) -> u64 {
    let served = Served::start(&["--dialect", "github", "--burst", "2", "--rate", "1"]);
    let url = format!("{}/v1/events/e{{job}}/odds/snapshot", served.url);
    let out = Command::new(exe())
        .args(["http", "--url", &url, "--header", "X-API-Key: sim-key"])
        .args(["--dialect", client_dialect, "--mode", "shared"])
        .args([
            "--rate",
            "20",
            "--burst",
            "2",
            "--workers",
            "2",
            "--jobs",
            "6",
            "--json",
        ])
        .output()
        .expect("http runs");
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    eprintln!("http --dialect {client_dialect}: {v}");
    assert_eq!(v["completed"], 6, "{v}");
    v["rejected"].as_u64().expect("a count")
}

/// `multi_process.rs`'s upstream and scenario, shared with its real-time half.
pub(crate) mod multi_process {
    use allowance_testkit::scenario::{Mode, Scenario};

    pub(crate) const PROCESSES: usize = 4;
    pub(crate) const RATE: u32 = 40;
    pub(crate) const BURST: u32 = 4;

    pub(crate) fn scenario(workers: usize, jobs: usize) -> Scenario {
        Scenario {
            workers,
            jobs,
            // The upstream's rate; one token less of burst as headroom for delivery jitter: a
            // request admitted 25 ms after another can arrive a few ms sooner than that when
            // its process was scheduled late, and the upstream forgives only 1/10 of a token.
            burst: BURST - 1,
            rate_per_sec: RATE,
            max_attempts: 10,
            ..Scenario::seed(Mode::Shared)
        }
    }
}
