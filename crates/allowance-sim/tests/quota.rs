//! A spent monthly quota through the binary, naive workers: no probe, the quota ends every
//! job by its attempts, and virtual time refuses `--quota`. Counts only (four credits for
//! four workers within the upstream's burst of four): load cannot change them.
//!
//! The runs over processes and Redis (exactly one usage probe and exactly one 429 for the
//! group) count 429s in real time: a real-time experiment, `real_time.rs`, module `quota`.

use std::path::Path;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_allowance-sim"))
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
