//! The sweep's chart explains itself: labelled axes with ticks, a caption for the
//! "burst@rate" cell labels, abandoned jobs plotted, and every missing series explained.
//! And `sweep` reports progress (on a terminal only) once per run.

mod common;

use allowance_sim::{
    chart::{Chart, Shape},
    sweep::{
        chart, planned_runs, run_virtual_grid, run_virtual_grid_with, svg, Grid, RedisRuns,
        SweepRow,
    },
};
use common::svg::{all_text, texts};

fn grid() -> Grid {
    Grid {
        workers: vec![8, 64],
        jobs: vec![100],
        buckets: vec![(2, 2), (10, 50)],
    }
}

fn rows() -> Vec<SweepRow> {
    run_virtual_grid(&grid()).expect("runs")
}

fn drawn(rows: &[SweepRow], redis: RedisRuns) -> String {
    svg(rows, redis).expect("drawn")
}

/// The caption's paragraphs, as the chart holds them before wrapping.
fn caption(rows: &[SweepRow], redis: RedisRuns) -> String {
    chart(rows, redis).caption.join(" ")
}

/// The bars of the series `mode` in panel `panel`: (group, value, hatched).
fn bars(chart: &Chart, panel: usize, mode: &str) -> Vec<(usize, f64, bool)> {
    let series = chart.panels[panel].series(mode).expect("a series per mode");
    match &series.shape {
        Shape::Bars(bars) => bars
            .iter()
            .map(|b| (b.category, b.value, b.hatched))
            .collect(),
        other => panic!("{mode} is drawn as {other:?}"),
    }
}

#[test]
fn axes_are_labelled_with_ticks() {
    let svg = drawn(&rows(), RedisRuns::NotRequested);
    let texts = texts(&svg);
    for title in [
        "attempts / job",
        "makespan / minimum",
        "% of jobs",
        "grid cell: workers (w), jobs, upstream bucket as burst@rate",
    ] {
        assert_eq!(texts.iter().filter(|t| *t == title).count(), 1, "{title}");
    }
    // Every panel has tick labels from 0 up.
    assert_eq!(texts.iter().filter(|t| *t == "0" || *t == "0%").count(), 3);
    for expected in ["2", "4", "6", "8", "20%", "40%", "100%"] {
        assert!(
            texts.iter().any(|t| t == expected),
            "{expected} in {texts:?}"
        );
    }
    // Each grid cell labelled once, line by line, under the bottom panel.
    assert_eq!(texts.iter().filter(|t| *t == "8 w").count(), 2);
    assert_eq!(texts.iter().filter(|t| *t == "100 jobs").count(), 4);
    let buckets = texts
        .iter()
        .filter(|t| t.ends_with("/s") && t.contains('@'));
    assert_eq!(buckets.count(), 4);
}

#[test]
fn the_caption_explains_burst_at_rate() {
    let rows = rows();
    let caption = caption(&rows, RedisRuns::NotRequested);
    assert!(
        caption.contains("the upstream's bucket written burst@rate: 2@2/s allows bursts of 2 and refills 2 requests per second"),
        "{caption}"
    );
    // Drawn whole under the chart (wrapped into lines), with the labels it explains.
    let svg = drawn(&rows, RedisRuns::NotRequested);
    assert!(all_text(&svg).contains(&caption), "{svg}");
    let texts = texts(&svg);
    assert!(texts.iter().any(|t| t == "2@2/s") && texts.iter().any(|t| t == "10@50/s"));
}

#[test]
fn abandoned_jobs_are_plotted() {
    let rows = rows();
    let chart = chart(&rows, RedisRuns::NotRequested);
    let abandoned: Vec<&SweepRow> = rows.iter().filter(|r| r.abandoned > 0).collect();
    assert!(!abandoned.is_empty(), "the grid has naive jobs abandoned");
    // A bar per row in the abandoned panel, its height the share of jobs abandoned.
    let modes = ["naive", "split:4", "shared"];
    let in_panel: usize = modes.iter().map(|m| bars(&chart, 2, m).len()).sum();
    assert_eq!(in_panel, rows.len());
    for r in &abandoned {
        let cells = bars(&chart, 2, &r.mode);
        let share = r.abandoned as f64 * 100.0 / r.jobs as f64;
        assert!(
            cells.iter().any(|(_, v, _)| *v == share),
            "{r:?}: {cells:?}"
        );
    }
    // Exactly the makespan bars of rows with abandoned jobs are hatched, no other panel's.
    let hatched = |panel: usize| -> usize {
        let hatched = |m: &&str| bars(&chart, panel, m).iter().filter(|b| b.2).count();
        modes.iter().map(hatched).sum()
    };
    assert_eq!(hatched(1), abandoned.len());
    assert_eq!(hatched(0) + hatched(2), 0);
    assert!(caption(&rows, RedisRuns::NotRequested)
        .contains("hatched makespan bar finished early because jobs were abandoned"));
    // The legend says what hatching means.
    let legend: Vec<&str> = chart.legend().into_iter().map(|(_, l)| l).collect();
    assert_eq!(
        legend,
        [
            "naive",
            "split:4",
            "shared",
            "shared-redis-4p",
            "jobs abandoned"
        ]
    );
}

#[test]
fn a_series_missing_everywhere_is_explained() {
    let caption = caption(&rows(), RedisRuns::NotRequested);
    assert!(
        caption.contains("shared-redis-4p is missing everywhere: the sweep ran without --redis"),
        "{caption}"
    );
}

#[test]
fn a_series_missing_in_some_cells_is_explained_cell_by_cell() {
    // Redis ran only where the minimum fits in 25 s: the 10@50/s cells, not the 2@2/s ones.
    let mut rows = rows();
    let redis: Vec<SweepRow> = rows
        .iter()
        .filter(|r| r.mode == "shared" && r.burst == 10)
        .map(|r| SweepRow {
            mode: "shared-redis-4p (burst 9)".to_owned(),
            clock: "real",
            ..r.clone()
        })
        .collect();
    rows.extend(redis);
    let runs = RedisRuns::UpTo {
        max_real_ms: 25_000,
        headroom: 1,
    };
    // The Redis bars stand in the two 10@50/s groups only.
    let chart = chart(&rows, runs);
    let groups: Vec<usize> = bars(&chart, 0, "shared-redis-4p")
        .iter()
        .map(|b| b.0)
        .collect();
    assert_eq!(groups, [2, 3]);
    let caption = self::caption(&rows, runs);
    assert!(
        caption.contains("shared-redis-4p is not run for 2@2/s with 100 jobs (minimum 49 s): real-time runs are limited to cells whose theoretical minimum is at most 25 s (--max-real)"),
        "{caption}"
    );
    assert!(
        caption.contains("keeping 1 token(s) of the burst in reserve"),
        "{caption}"
    );
    assert!(!caption.contains("missing everywhere"), "{caption}");

    // A virtual series without rows (here: split:4 dropped) is named with its cells.
    rows.retain(|r| r.mode != "split:4" || r.workers != 64);
    let caption = self::caption(&rows, runs);
    assert!(
        caption.contains(
            "split:4 has no result for 64 w × 100 jobs × 2@2/s, 64 w × 100 jobs × 10@50/s"
        ),
        "{caption}"
    );
}

#[test]
fn every_run_is_announced_once_for_the_progress_bar() {
    let grid = grid();
    let mut seen = Vec::new();
    let rows = run_virtual_grid_with(&grid, &mut |what| seen.push(what.to_owned())).expect("runs");
    assert_eq!(seen.len(), rows.len());
    assert_eq!(planned_runs(&grid, None), rows.len());
    assert_eq!(seen[0], "naive: 8 w × 100 jobs × 2@2/s");
    // With Redis up to 25 s: the two 10@50/s cells (minimum 1.8 s), not the 2@2/s ones (49 s).
    assert_eq!(planned_runs(&grid, Some(25_000)), rows.len() + 2);
}

/// Off a terminal, `sweep` prints the table and nothing else (no progress bar); the chart
/// it writes carries its caption.
#[test]
fn the_cli_sweep_writes_the_chart_and_prints_nothing_extra() {
    let dir = std::env::temp_dir().join(format!("allowance-sim-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("sweep.svg");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allowance-sim"))
        .args(["sweep", "--quick", "--json", "--svg"])
        .arg(&path)
        .output()
        .expect("runs");
    let chart = std::fs::read_to_string(&path).expect("written");
    std::fs::remove_dir_all(&dir).expect("cleaned up");
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON rows");
    assert_eq!(rows.as_array().map(Vec::len), Some(12));
    assert!(all_text(&chart).contains("the sweep ran without --redis"));
}
