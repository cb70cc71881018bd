//! Secrets stay off command lines (issue 10, point 4): the `--processes N` worker children
//! get the Redis URL (with its password) and the request headers (with the API key) on their
//! standard input, never as arguments, nor in their environment. Read from
//! `/proc/PID/cmdline` and `/proc/PID/environ` of the children while they run.

use std::{process::Stdio, time::Duration};

use allowance_testkit::upstream::{Upstream, UpstreamConfig};
use serde_json::Value;
use tokio::{
    process::{Child, Command},
    time::Instant,
};
use tower_allowance_redis::test_util::TestRedis;

const PASSWORD: &str = "s3cret-pass-8d1f";
const KEY: &str = "key-7c2e-not-for-ps";

fn read_proc(pid: u32, file: &str) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/{file}")).ok()?;
    Some(String::from_utf8_lossy(&bytes).replace('\0', " "))
}

/// The children of `parent`, from `/proc/*/stat` (field 4 is the parent's pid).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            read_proc(*pid, "stat")
                .and_then(|stat| {
                    // `pid (comm) state ppid ...`; comm may contain spaces: split after ')'.
                    let rest = stat.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                .is_some_and(|ppid| ppid == parent)
        })
        .collect()
}

/// Polls until `parent` has `n` worker children, then returns what their command lines and
/// environments hold. Fails the test if they never show up.
async fn workers_seen(parent: &mut Child, n: usize) -> Vec<(String, String)> {
    let until = Instant::now() + Duration::from_secs(20);
    let pid = parent.id().expect("running");
    loop {
        let seen: Vec<(String, String)> = children_of(pid)
            .into_iter()
            .filter_map(|pid| Some((read_proc(pid, "cmdline")?, read_proc(pid, "environ")?)))
            .filter(|(cmdline, _)| cmdline.contains(" worker "))
            .collect();
        if seen.len() >= n {
            return seen;
        }
        assert!(
            parent.try_wait().expect("parent").is_none(),
            "the run ended before its workers were seen"
        );
        assert!(Instant::now() < until, "no worker children appeared");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn finish(parent: Child) -> Value {
    let out = parent.wait_with_output().await.expect("run ends");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_the_redis_password_nor_the_api_key_is_on_a_childs_command_line() {
    let redis = TestRedis::start_private().await;
    let reply = redis
        .command(&["CONFIG", "SET", "requirepass", PASSWORD])
        .await;
    assert_eq!(reply, "+OK");
    let url = redis
        .url()
        .replacen("redis://", &format!("redis://:{PASSWORD}@"), 1);
    let upstream = Upstream::start(UpstreamConfig::new(4, 40).with_keys([KEY]))
        .await
        .expect("upstream");
    let template = upstream.snapshot_url("e{job}");

    // `http` with the key in a header and the password in the Redis URL, over 3 processes.
    let run = tokio::spawn(async move {
        let mut parent = Command::new(env!("CARGO_BIN_EXE_allowance-sim"))
            .args([
                "http",
                "--url",
                &template,
                "--header",
                &format!("X-API-Key: {KEY}"),
            ])
            .args(["--redis", &url, "--processes", "3", "--mode", "shared"])
            .args([
                "--workers",
                "6",
                "--jobs",
                "60",
                "--burst",
                "3",
                "--rate",
                "40",
            ])
            .arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts");
        let seen = workers_seen(&mut parent, 3).await;
        (seen, finish(parent).await)
    });
    let (seen, report) = run.await.expect("joined");
    upstream.shutdown().await;

    assert_eq!(seen.len(), 3);
    for (cmdline, environ) in &seen {
        assert!(cmdline.contains("--secrets-on-stdin"), "{cmdline}");
        for secret in [PASSWORD, KEY] {
            assert!(
                !cmdline.contains(secret),
                "{secret} on a command line: {cmdline}"
            );
            assert!(!environ.contains(secret), "{secret} in an environment");
        }
    }
    // ...and the children had them all the same: Redis let them in, the upstream too.
    assert_eq!(report["completed"], 60, "{report}");
    assert!(
        report["store_calls"].as_u64().is_some_and(|n| n >= 60),
        "{report}"
    );
}

/// `run --real --processes N`: the upstream's key (a header) and the Redis URL go the same
/// way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_real_children_get_their_key_and_url_on_stdin() {
    let redis = TestRedis::start_private().await;
    let reply = redis
        .command(&["CONFIG", "SET", "requirepass", PASSWORD])
        .await;
    assert_eq!(reply, "+OK");
    let url = redis
        .url()
        .replacen("redis://", &format!("redis://:{PASSWORD}@"), 1);
    let run = tokio::spawn(async move {
        let mut parent = Command::new(env!("CARGO_BIN_EXE_allowance-sim"))
            .args(["run", "--real", "--mode", "shared", "--redis", &url])
            .args(["--processes", "2", "--workers", "4", "--jobs", "40"])
            .args(["--burst", "3", "--rate", "40", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts");
        let seen = workers_seen(&mut parent, 2).await;
        (seen, finish(parent).await)
    });
    let (seen, report) = run.await.expect("joined");
    for (cmdline, environ) in &seen {
        for secret in [PASSWORD, allowance_testkit::upstream::DEFAULT_KEY] {
            assert!(
                !cmdline.contains(secret),
                "{secret} on a command line: {cmdline}"
            );
            assert!(!environ.contains(secret), "{secret} in an environment");
        }
    }
    assert_eq!(report["completed"], 40, "{report}");
}
