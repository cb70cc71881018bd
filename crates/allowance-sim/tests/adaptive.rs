//! Issue 12's acceptance for the adaptive rate, through the command line: an upstream at
//! 20/s (burst 4, `Retry-After: 1`) that nobody states, eight workers, 1200 jobs.
//!
//! - virtual time: from 2/s and from 200/s the achieved rate over the last 30 s is 0.85–1.0
//!   of 20/s with at most 5% 429s, and the final rate is 17–24/s; after the upstream drops
//!   to 10/s at 30 s, the achieved rate settles within 15% of it in under 10 s; an IETF
//!   upstream's policy, adopted, sets the rate at the first response (0 429s);
//!
//! All in virtual time. The real-time half (four processes on one controller in Redis find
//! one rate with at most 5% 429s, while four processes with a controller each throttle
//! more) is a real-time experiment: `real_time.rs`, module `adaptive`.

mod common;

use allowance_sim::{
    chart::Colour,
    cli::{execute, Cli},
};
use allowance_testkit::{
    report::RunReport,
    scenario::{run_virtual, Adaptive, Mode, Scenario},
    upstream::RateChange,
};
use clap::Parser;
use serde_json::Value;

use common::{
    num,
    svg::{in_colour, texts},
};

const UPSTREAM: &[&str] = &[
    "run",
    "--virtual",
    "--mode",
    "shared",
    "--adaptive",
    "--rate",
    "20",
    "--burst",
    "4",
    "--workers",
    "8",
    "--jobs",
    "1200",
    "--retry-after",
    "1",
    "--json",
];

fn run_json(extra: &[&str]) -> Value {
    run_json_at("8", extra)
}

/// [`run_json`] with this many workers.
fn run_json_at(workers: &str, extra: &[&str]) -> Value {
    let mut upstream = UPSTREAM.to_vec();
    if let Some(i) = upstream.iter().position(|a| *a == "--workers") {
        upstream[i + 1] = workers;
    }
    let argv = std::iter::once("allowance-sim")
        .chain(upstream)
        .chain(extra.iter().copied());
    let cli = Cli::try_parse_from(argv).expect("valid arguments");
    let mut out = Vec::new();
    execute(cli, &mut out).expect("runs");
    serde_json::from_slice(&out).expect("one JSON object")
}

/// The same run as `run_json(&["--initial-rate", initial, ...])`, through the library, for
/// the rate over time.
fn scenario(initial: f64) -> Scenario {
    let mut s = Scenario {
        workers: 8,
        jobs: 1200,
        burst: 4,
        rate_per_sec: 20,
        adaptive: Some(Adaptive::starting_at(initial)),
        ..Scenario::seed(Mode::Shared)
    };
    s.upstream.burst = 4;
    s.upstream.rate_per_sec = 20;
    s
}

#[test]
fn from_2_and_from_200_per_second_it_finds_an_unstated_20() {
    for initial in ["2", "200"] {
        let v = run_json(&["--initial-rate", initial]);
        let (attempts, rejected) = (num(&v, "attempts"), num(&v, "rejected"));
        let (achieved, last) = (num(&v, "achieved_rate"), num(&v, "final_rate"));
        eprintln!(
            "from {initial}/s: {attempts} attempts, {rejected} 429s, achieved {achieved}/s over the last {} ms, final rate {last}/s",
            v["achieved_over_ms"]
        );
        assert_eq!(v["completed"], 1200, "{v}");
        assert_eq!(
            v["achieved_over_ms"], 30_000,
            "a run over a minute: the last 30 s"
        );
        assert!(rejected <= 0.05 * attempts, "429s {rejected} of {attempts}");
        assert!(
            (0.85 * 20.0..=20.0).contains(&achieved),
            "achieved {achieved}/s"
        );
        assert!((17.0..=24.0).contains(&last), "final rate {last}/s");
        assert_eq!(v["controller_rates"].as_array().map(Vec::len), Some(1));
    }
}

/// Issue 20.5 (`../shared/acceptance/18-adaptive-many`): from 2/s and from 200/s, with 8 to
/// 1,024 workers, within 1.25x the minimum makespan and at most 5% throttled. Every reserved
/// slot is re-timed at a cut (without that, 128 workers from 2/s took 3.23x, and from
/// 200/s 5.10x with 19.9% 429s), from the rate at the queue's head (issue 30.6: re-timed by
/// the rate of its last slot, 256 workers took 1.26-1.28x and 1,024 workers 1.53-1.66x).
/// Virtual time: the figures are exact, the same on every run.
#[test]
fn the_rate_converges_at_any_number_of_workers() {
    for workers in ["8", "32", "64", "128", "256", "1024"] {
        for initial in ["2", "200"] {
            let v = run_json_at(workers, &["--initial-rate", initial]);
            let (attempts, rejected) = (num(&v, "attempts"), num(&v, "rejected"));
            let slow = num(&v, "makespan_ms") / num(&v, "min_makespan_ms");
            eprintln!("W{workers} from {initial}/s: {slow:.3}x min, {rejected} 429s of {attempts}");
            assert_eq!(v["completed"], 1200, "{v}");
            assert!(
                slow <= 1.25,
                "W{workers} from {initial}/s: {slow:.3}x the minimum"
            );
            assert!(
                rejected <= 0.05 * attempts,
                "W{workers} from {initial}/s: 429s {rejected} of {attempts}"
            );
        }
    }
}

#[test]
fn after_the_upstream_drops_to_10_the_rate_follows_within_10_s() {
    let v = run_json(&["--initial-rate", "2", "--upstream-rate-change", "30s:10"]);
    let change = &v["rate_changes"][0];
    assert_eq!(
        (change["at_ms"].as_u64(), change["rate_per_sec"].as_u64()),
        (Some(30_000), Some(10))
    );
    let settled = change["settled_after_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("never settled: {v}"));
    eprintln!(
        "upstream 20/s -> 10/s at 30 s: settled within 15% after {settled} ms; {} 429s of {} attempts; final rate {}/s",
        v["rejected"], v["attempts"], v["final_rate"]
    );
    assert!(settled <= 10_000, "settled after {settled} ms");
    assert!(num(&v, "rejected") <= 0.05 * num(&v, "attempts"), "{v}");
    let last = num(&v, "final_rate");
    assert!((8.5..=11.5).contains(&last), "final rate {last}/s");

    // The controller itself: from 10 s after the change on, its rate stays within 15% of
    // the new one, while before the change it was in the 20/s regime.
    let mut s = scenario(2.0);
    s.upstream.rate_changes = vec!["30s:10".parse::<RateChange>().expect("valid")];
    let report = RunReport::from_virtual(&s, &run_virtual(&s).expect("runs"));
    // Before the change, in the 20/s regime: on average over the 10 s before it, above the
    // band the rate must fall into after it (a single sample may sit in the dip after a cut:
    // the controller probes upward and is cut back, and every throttling response to a
    // request sent after the last cut cuts again).
    let before: Vec<f64> = report
        .rates
        .adaptive
        .iter()
        .filter(|(t, _)| (20_000..30_000).contains(t))
        .map(|(_, r)| *r)
        .collect();
    let mean = before.iter().sum::<f64>() / before.len().max(1) as f64;
    assert!((11.5..=24.0).contains(&mean), "mean {mean} over 20-30 s");
    let after: Vec<f64> = report
        .rates
        .adaptive
        .iter()
        .filter(|(t, _)| *t >= 40_000)
        .map(|(_, r)| *r)
        .collect();
    assert!(after.len() > 100, "sampled until the end");
    assert!(
        after.iter().all(|r| (8.5..=11.5).contains(r)),
        "{:?}",
        after
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)))
    );
}

#[test]
fn an_adopted_ietf_policy_sets_the_rate_at_the_first_response() {
    for initial in ["2", "200"] {
        let v = run_json(&["--initial-rate", initial, "--dialect", "ietf", "--adopt"]);
        eprintln!(
            "ietf, adopting, from {initial}/s: {} attempts, {} 429s, final {}/s, achieved {}/s",
            v["attempts"], v["rejected"], v["final_rate"], v["achieved_rate"]
        );
        assert_eq!(
            (v["rejected"].as_u64(), v["completed"].as_u64()),
            (Some(0), Some(1200)),
            "{v}"
        );
        assert_eq!(num(&v, "final_rate"), 20.0);
        assert_eq!(num(&v, "achieved_rate"), 20.0);
    }
    // The rate is the policy's from the first response on (the first sample after t = 0);
    // not adopting, it still starts at 2/s (capped at the policy, never raised to it).
    for (adopt, at_100_ms) in [(true, 20.0), (false, 2.0)] {
        let mut s = scenario(2.0);
        s.upstream.dialect = "ietf".parse().expect("a dialect");
        s.dialect = Some(s.upstream.dialect);
        s.adaptive = s.adaptive.map(|a| Adaptive { adopt, ..a });
        let report = RunReport::from_virtual(&s, &run_virtual(&s).expect("runs"));
        let first = report.rates.adaptive.iter().find(|(t, _)| *t >= 100);
        assert_eq!(first.map(|(_, r)| *r), Some(at_100_ms), "adopt: {adopt}");
        assert!(
            report.rates.adaptive.iter().all(|(_, r)| *r <= 20.0),
            "never above the advertised 20/s"
        );
    }
}

/// `allowance-sim adaptive` (virtual rows only): one row per documented run, each with the
/// `run` command that reproduces it, and the chart of the three charted runs.
#[test]
fn the_adaptive_command_prints_the_table_and_draws_the_chart() {
    let dir = std::env::temp_dir().join(format!("allowance-sim-adaptive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let svg = dir.join("adaptive.svg");
    let cli = Cli::try_parse_from([
        "allowance-sim",
        "adaptive",
        "--json",
        "--svg",
        svg.to_str().expect("utf-8 path"),
    ])
    .expect("valid arguments");
    let mut out = Vec::new();
    execute(cli, &mut out).expect("runs");
    let rows: Value = serde_json::from_slice(&out).expect("JSON rows");
    let rows = rows.as_array().expect("an array");
    assert_eq!(rows.len(), 5);
    for row in rows {
        let command = row["command"].as_str().expect("a command");
        // The command reproduces the row: run it and compare.
        let args: Vec<&str> = command.split(' ').skip(2).collect();
        let mut argv = vec!["allowance-sim", "run"];
        argv.extend(args);
        argv.push("--json");
        let cli = Cli::try_parse_from(argv).expect("the command parses");
        let mut again = Vec::new();
        execute(cli, &mut again).expect("runs");
        let again: Value = serde_json::from_slice(&again).expect("JSON");
        assert_eq!(row["report"]["attempts"], again["attempts"], "{command}");
        assert_eq!(
            row["report"]["final_rate"], again["final_rate"],
            "{command}"
        );
    }
    let drawn = std::fs::read_to_string(&svg).expect("written");
    std::fs::remove_dir_all(&dir).expect("cleaned up");
    assert!(drawn.starts_with("<svg"));
    // Three panels, each with an adaptive and an achieved line (after the legend's
    // swatches), the upstream's rate as steps, and one time axis title.
    let lines = |c: Colour| in_colour(&drawn, "polyline", c);
    assert_eq!(lines(Colour::BLUE).len(), 1 + 3);
    assert_eq!(lines(Colour::GREEN).len(), 1 + 3);
    assert_eq!(lines(Colour::DARK_GREY).len(), 1 + 3);
    // Every adaptive line has its samples (every 100 ms).
    assert!(lines(Colour::BLUE)[1..]
        .iter()
        .all(|l| l.points().len() > 100));
    let texts = texts(&drawn);
    let axis_titles = texts.iter().filter(|t| *t == "seconds since the start");
    assert_eq!(axis_titles.count(), 3);
}
