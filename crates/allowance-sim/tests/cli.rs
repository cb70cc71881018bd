//! The `allowance-sim` command line: the seed's figures and shared at scale, in virtual
//! time. (`http` against `serve` agreeing with `run --real`, with no 429 in either, is a
//! real-time experiment: `real_time.rs`, module `cli`.)

mod common;

use std::process::Command;

use allowance_sim::chart::Colour;
use allowance_testkit::scenario::{seed_table, seed_table_text};
use serde_json::Value;

use common::{figures, run};

fn run_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    serde_json::from_str(&run(&all)).expect("one JSON object")
}

#[test]
fn seed_json_is_the_seed_table() {
    let rows: Value = serde_json::from_str(&run(&["seed", "--json"])).expect("JSON");
    let expected = serde_json::to_value(seed_table()).expect("serialisable");
    assert_eq!(rows, expected);
    assert_eq!(rows[0]["attempts"], 20);
    assert_eq!(rows[1]["attempts"], 8);
}

/// One table: `seed` prints the text the `eight_workers` example prints and the README
/// shows (`tests/tests/seed.rs` holds the README to it).
#[test]
fn seed_text_is_the_seed_table() {
    let text = run(&["seed"]);
    let table = seed_table_text(&seed_table());
    assert!(text.ends_with(&table), "{text}");
}

#[test]
fn virtual_run_matches_the_seed_figures() {
    // `--exact`: the seed's allowance holds the upstream's limit to the token.
    for (mode, want) in [
        ("naive", (20, 12, 8, 0)),
        ("shared", (8, 0, 8, 0)),
        // 13/5, not the seed JS model's 14/6: see tests/tests/seed.rs.
        ("split:2", (13, 5, 8, 0)),
    ] {
        let v = run_json(&["run", "--mode", mode, "--virtual", "--exact"]);
        assert_eq!(figures(&v), want, "{mode}: {v}");
        assert_eq!(v["clock"], "virtual");
    }
    // The shared run is as fast as the allowance allows: the last job at the minimum.
    let v = run_json(&["run", "--mode", "shared", "--virtual", "--exact"]);
    assert_eq!(v["makespan_ms"], 3000);
    assert_eq!(v["min_makespan_ms"], 3000);
    assert_eq!(v["last_attempt_ms"], 3000);
    // By default the burst's last request waits 10 ms (headroom): the shared run is 10 ms
    // longer than the minimum for the configured limit, still without a 429, and
    // two allowances on the key exceed it (three 429s).
    let v = run_json(&["run", "--mode", "shared", "--virtual"]);
    assert_eq!(figures(&v), (8, 0, 8, 0), "{v}");
    assert_eq!(
        (v["makespan_ms"].as_u64(), v["min_makespan_ms"].as_u64()),
        (Some(3010), Some(3000))
    );
    let v = run_json(&["run", "--mode", "split:2", "--virtual"]);
    assert_eq!(figures(&v), (11, 3, 8, 0), "{v}");
}

/// At 3/s an interval is 333.3 ms: the minimum is rounded up, never down, and a shared run
/// that achieves it reports it exactly (the makespan is rounded up too).
#[test]
fn the_minimum_is_rounded_up() {
    let v = run_json(&[
        "run",
        "--mode",
        "shared",
        "--virtual",
        "--jobs",
        "2",
        "--burst",
        "1",
        "--rate",
        "3",
        "--exact",
    ]);
    assert_eq!(v["min_makespan_ms"], 334, "{v}");
    assert_eq!(v["makespan_ms"], 334, "{v}");
    // Three intervals are exactly one second, not 999 ms.
    let v = run_json(&[
        "run",
        "--mode",
        "shared",
        "--virtual",
        "--jobs",
        "4",
        "--burst",
        "1",
        "--rate",
        "3",
        "--exact",
    ]);
    assert_eq!(v["min_makespan_ms"], 1000, "{v}");
    // Never below the minimum; tokio's timer fires on whole milliseconds, so each of the
    // three waits may end up to 1 ms late.
    let makespan = v["makespan_ms"].as_u64().expect("ms");
    assert!((1000..=1003).contains(&makespan), "{v}");
    assert_eq!(allowance_testkit::report::min_makespan_ms(7, 1, 7), 858);
}

/// Where several attempts of one worker fall in one column, the ASCII timeline shows how
/// many, and the legend says so.
#[test]
fn the_ascii_timeline_counts_attempts_sharing_a_cell() {
    // 100 jobs on 2 workers at 50/s: about 50 attempts per lane in 64 columns.
    let out = run(&[
        "run",
        "--mode",
        "shared",
        "--virtual",
        "--workers",
        "2",
        "--jobs",
        "100",
        "--burst",
        "10",
        "--rate",
        "50",
    ]);
    let lanes: Vec<&str> = out.lines().filter(|l| l.starts_with('w')).collect();
    assert_eq!(lanes.len(), 2, "{out}");
    // The burst's ten attempts at 0 ms share worker 0's first cell; later cells hold two.
    assert!(lanes[0][6..].starts_with('+'), "{out}");
    assert!(lanes.iter().any(|l| l[6..].contains('2')), "{out}");
    assert!(out.contains("2-9 that many attempts in one cell"), "{out}");
}

#[test]
fn virtual_run_reports_abandonments_by_reason() {
    // Two attempts each, no budget: the naive herd leaves jobs abandoned (max_attempts).
    let v = run_json(&["run", "--mode", "naive", "--virtual", "--max-attempts", "2"]);
    let abandoned = v["abandoned"].as_u64().expect("count");
    assert!(abandoned > 0, "{v}");
    assert_eq!(v["abandoned_by_reason"]["max_attempts"], abandoned);
}

#[test]
fn shared_at_scale_in_virtual_time() {
    let v = run_json(&[
        "run",
        "--mode",
        "shared",
        "--virtual",
        "--workers",
        "200",
        "--jobs",
        "1000",
        "--burst",
        "10",
        "--rate",
        "50",
    ]);
    let (attempts, rejected, completed, abandoned) = figures(&v);
    assert_eq!(
        (attempts, rejected, completed, abandoned),
        (1000, 0, 1000, 0),
        "{v}"
    );
    let min = v["min_makespan_ms"].as_u64().expect("ms");
    assert_eq!(min, (1000 - 10) * 20);
    let makespan = v["makespan_ms"].as_u64().expect("ms");
    assert!(
        makespan <= min + 20,
        "makespan {makespan} ms, minimum {min} ms"
    );
}

#[test]
fn table_output_explains_itself() {
    let out = run(&["run", "--mode", "naive", "--virtual"]);
    assert!(out.contains("attempts"), "{out}");
    assert!(out.contains("counted by the server"), "{out}");
    // One lane per worker, with 429s marked.
    assert_eq!(
        out.lines().filter(|l| l.starts_with('w')).count(),
        8,
        "{out}"
    );
    assert!(out.contains('x'), "{out}");
}

#[test]
fn timeline_svg_is_written() {
    let dir = std::env::temp_dir().join(format!("allowance-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("naive.svg");
    let path_str = path.to_str().expect("utf-8 path");
    run(&[
        "run",
        "--mode",
        "naive",
        "--virtual",
        "--json",
        "--timeline",
        path_str,
    ]);
    let svg = std::fs::read_to_string(&path).expect("written");
    std::fs::remove_dir_all(&dir).expect("cleaned up");
    assert!(svg.starts_with("<svg"));
    // 20 attempts, a dot each in its status's colour: 8 answered 200, 12 refused with a
    // 429 (each colour after its legend's dot), and the cooldowns shaded.
    let dots = |c: Colour| common::svg::in_colour(&svg, "circle", c).len() - 1;
    assert_eq!(dots(Colour::GREEN), 8);
    assert_eq!(dots(Colour::RED), 12);
    assert_eq!(dots(Colour::GREY), 0);
    assert_eq!(common::svg::elements(&svg, "circle").len() - 3, 20);
    assert!(common::svg::in_colour(&svg, "rect", Colour::AMBER).len() > 1);
    let texts = common::svg::texts(&svg);
    assert!(
        texts.iter().any(|t| t.contains("20 attempts, 12 × 429")),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t == "worker 7"), "{texts:?}");
}

#[test]
fn help_lists_the_commands() {
    let out = Command::new(env!("CARGO_BIN_EXE_allowance-sim"))
        .arg("--help")
        .output()
        .expect("runs");
    let help = String::from_utf8(out.stdout).expect("utf-8");
    for cmd in ["seed", "run", "serve", "http"] {
        assert!(help.contains(cmd), "{help}");
    }
}
