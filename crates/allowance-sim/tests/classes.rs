//! `run --class NAME:WEIGHT[:high][:jobs=N][:every=DURATION] --window D --virtual`: the
//! classes' report (`--json` `classes`) and the chart of the shares, in virtual time.

mod common;

use serde_json::Value;

use common::{run, svg};

fn run_json(args: &[&str]) -> Value {
    let mut all = vec![
        "run",
        "--virtual",
        "--exact",
        "--rate",
        "20",
        "--burst",
        "4",
    ];
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&run(&all)).expect("one JSON object")
}

fn windows(class: &Value) -> Vec<u64> {
    (class["windows"].as_array().expect("windows").iter())
        .map(|n| n.as_u64().expect("a count"))
        .collect()
}

#[test]
fn classes_report_their_jobs_and_their_weighted_share_per_window() {
    // 3:1, 100 jobs each, all there at the start, 20/s burst 4, 2 s windows.
    let v = run_json(&[
        "--class",
        "a:3",
        "--class",
        "b:1",
        "--jobs",
        "200",
        "--workers",
        "40",
        "--window",
        "2s",
    ]);
    assert_eq!(
        (v["jobs"].as_u64(), v["completed"].as_u64()),
        (Some(200), Some(200))
    );
    assert_eq!(v["window_ms"], 2000);
    let classes = v["classes"].as_object().expect("classes");
    assert_eq!(classes.len(), 2, "{v}");
    for (name, weight) in [("a", 3), ("b", 1)] {
        let c = &classes[name];
        let fields: Vec<&str> = c
            .as_object()
            .expect("a class")
            .keys()
            .map(String::as_str)
            .collect();
        for field in [
            "weight",
            "high",
            "jobs",
            "completed",
            "windows",
            "max_wait_ms",
            "p99_wait_ms",
        ] {
            assert!(fields.contains(&field), "{name}: {field} in {c}");
        }
        assert_eq!(c["weight"], weight);
        assert_eq!(c["high"], false);
        assert_eq!(
            (c["jobs"].as_u64(), c["completed"].as_u64()),
            (Some(100), Some(100))
        );
        assert_eq!(
            windows(c).iter().sum::<u64>(),
            100,
            "every job admitted once: {c}"
        );
        assert!(
            c["p99_wait_ms"].as_u64() <= c["max_wait_ms"].as_u64(),
            "{c}"
        );
    }
    // While both wait (a runs dry after ~6.6 s): a 3/4 of each of the first three windows,
    // within the burst and one admission.
    let (a, b) = (windows(&classes["a"]), windows(&classes["b"]));
    eprintln!("a {a:?}, b {b:?}");
    for w in 0..3 {
        let total = (a[w] + b[w]) as f64;
        let want = total * 3.0 / 4.0;
        assert!(
            (a[w] as f64 - want).abs() <= 5.0,
            "window {w}: a {a:?}, b {b:?}"
        );
        assert!(
            total >= 39.0,
            "the bucket's rate, shared: {total} in window {w}"
        );
    }
    // No slot wasted: 200 admissions at 20/s after a burst of 4 end at 9.8 s.
    assert!(v["makespan_ms"].as_u64() <= Some(9_800 + 60), "{v}");
    // The table says it ran in virtual time, and the upstream answered no 429.
    let text = run(&[
        "run",
        "--virtual",
        "--exact",
        "--rate",
        "20",
        "--burst",
        "4",
        "--class",
        "a:3",
        "--class",
        "b:1",
        "--jobs",
        "200",
        "--workers",
        "40",
        "--window",
        "2s",
    ]);
    assert!(
        text.starts_with("upstream (virtual time): burst 4 at 20/s, 0 429s\n200 of 200 jobs"),
        "{text}"
    );
}

#[test]
fn every_spaces_a_class_s_arrivals_and_a_high_one_jumps_the_backlog() {
    // Job k of "late" arrives k seconds after the start: one admission a 1 s window, none
    // kept waiting (the bucket has room).
    let v = run_json(&[
        "--class",
        "late:1:jobs=6:every=1s",
        "--jobs",
        "6",
        "--workers",
        "6",
        "--window",
        "1s",
    ]);
    let late = &v["classes"]["late"];
    assert_eq!(windows(late), [1, 1, 1, 1, 1, 1], "{v}");
    assert_eq!(late["max_wait_ms"], 0, "{v}");
    assert!(v["makespan_ms"].as_u64() >= Some(5_000), "{v}");
    // Without `every`, all six at the start.
    let v = run_json(&[
        "--class",
        "late:1:jobs=6",
        "--jobs",
        "6",
        "--workers",
        "6",
        "--window",
        "1s",
    ]);
    assert_eq!(windows(&v["classes"]["late"]), [6], "{v}");
    // Ten urgent jobs every 500 ms beside 200 bulk ones: each waits one interval (50 ms) at
    // most behind the backlog, two arrive per 1 s window.
    let v = run_json(&[
        "--class",
        "urgent:1:high:jobs=10:every=500ms",
        "--class",
        "bulk:1:jobs=200",
        "--jobs",
        "210",
        "--workers",
        "40",
        "--window",
        "1s",
    ]);
    let urgent = &v["classes"]["urgent"];
    assert_eq!(urgent["high"], true);
    assert_eq!(&windows(urgent)[..5], [2, 2, 2, 2, 2], "{v}");
    assert!(urgent["max_wait_ms"].as_u64() <= Some(51), "{v}");
    assert!(
        v["classes"]["bulk"]["max_wait_ms"].as_u64() >= Some(1_000),
        "a backlog: {v}"
    );
    assert_eq!(v["completed"], 210);
}

#[test]
fn the_timeline_of_a_class_run_charts_the_shares() {
    let dir = std::env::temp_dir().join(format!("allowance-sim-classes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let path = dir.join("shares.svg");
    let path_arg = path.to_str().expect("utf-8");
    let v = run_json(&[
        "--class",
        "a:3",
        "--class",
        "b:1",
        "--jobs",
        "80",
        "--workers",
        "16",
        "--window",
        "1s",
        "--timeline",
        path_arg,
    ]);
    assert_eq!(v["completed"], 80);
    let chart = std::fs::read_to_string(&path).expect("the chart written");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(chart.starts_with("<svg"), "{chart}");
    // One line per class, and the legend naming each with its weight.
    assert!(svg::elements(&chart, "polyline").len() >= 2, "{chart}");
    let text = svg::all_text(&chart);
    assert!(
        text.contains("a (weight 3)") && text.contains("b (weight 1)"),
        "{text}"
    );
}

#[test]
fn classes_share_a_lease_by_weight_and_a_high_one_takes_the_next_token() {
    // `--lease auto` at 200/s: 3:1 and a high class arriving every 250 ms, 2,020 jobs. (A
    // child process: the lease is set once per process, and this one's other runs have none.)
    let out = std::process::Command::new(common::exe())
        .args([
            "run",
            "--virtual",
            "--exact",
            "--rate",
            "200",
            "--burst",
            "5",
            "--lease",
            "auto",
            "--class",
            "a:3",
            "--class",
            "b:1",
            "--class",
            "live:1:high:jobs=20:every=250ms",
            "--jobs",
            "2020",
            "--workers",
            "80",
            "--window",
            "2s",
            "--json",
        ])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["completed"].as_u64(), Some(2020), "{v}");
    // Far fewer store calls than admissions (the old code ignored --lease with classes).
    let calls = v["lease_calls"].as_u64().expect("lease calls reported");
    assert!(calls <= 2020 / 20, "{calls} lease calls");
    // 3:1 while both wait (the first two windows), within a few admissions.
    let (a, b) = (windows(&v["classes"]["a"]), windows(&v["classes"]["b"]));
    for w in 0..2 {
        let want = (a[w] + b[w]) as f64 * 3.0 / 4.0;
        assert!(
            (a[w] as f64 - want).abs() <= 6.0,
            "window {w}: a {a:?}, b {b:?}"
        );
    }
    // The high class: this process's next token (one interval, 5 ms, and the one held).
    assert!(
        v["classes"]["live"]["max_wait_ms"].as_u64() <= Some(10),
        "{v}"
    );
    // No slot stranded: the bucket's makespan, to an interval.
    let (made, min) = (v["makespan_ms"].as_u64(), v["min_makespan_ms"].as_u64());
    assert!(made <= min.map(|m| m + 5), "{v}");
}
