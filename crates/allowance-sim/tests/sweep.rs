//! The sweep's chart explains itself: labelled axes with ticks, a caption for the
//! "burst@rate" cell labels, abandoned jobs plotted, and every missing series explained.
//! And `sweep` reports progress (on a terminal only) once per run.

use allowance_sim::sweep::{
    axis_ticks, planned_runs, run_virtual_grid, run_virtual_grid_with, svg, Grid, RedisRuns,
    SweepRow,
};

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

/// The text of every `<text>` element with `class="{class}"`.
fn texts(svg: &str, class: &str) -> Vec<String> {
    let open = format!("class=\"{class}\"");
    svg.split("<text ")
        .filter(|t| t.contains(&open))
        .filter_map(|t| {
            t.split_once('>')
                .and_then(|(_, rest)| rest.split_once("</text>"))
        })
        .map(|(text, _)| text.to_owned())
        .collect()
}

fn caption(svg: &str) -> String {
    texts(svg, "caption").join(" ")
}

#[test]
fn axes_are_labelled_with_ticks() {
    let chart = svg(&rows(), RedisRuns::NotRequested);
    let titles = texts(&chart, "axis-title");
    assert_eq!(
        titles,
        [
            "attempts / job",
            "makespan / minimum",
            "% of jobs",
            "grid cell: workers (w), jobs, upstream bucket as burst@rate"
        ]
    );
    let ticks = texts(&chart, "ytick");
    // Every panel has at least four tick labels from 0 up.
    assert!(ticks.len() >= 12, "{ticks:?}");
    assert_eq!(ticks.iter().filter(|t| *t == "0" || *t == "0%").count(), 3);
    for expected in ["2", "4", "6", "8", "20%", "40%", "100%"] {
        assert!(
            ticks.iter().any(|t| t == expected),
            "{expected} in {ticks:?}"
        );
    }
    // One x label per grid cell.
    assert_eq!(texts(&chart, "xtick").len(), 4);
}

#[test]
fn ticks_are_round_and_cover_the_data() {
    for (max, want) in [
        (9.79, (10.0, 2.0)),
        (5.0, (5.0, 1.0)),
        (1.0, (1.0, 0.2)),
        (1.02, (1.2, 0.2)),
        (0.37, (0.4, 0.1)),
        (120.0, (120.0, 20.0)),
    ] {
        assert_eq!(axis_ticks(max), want, "{max}");
    }
    // Degenerate input still gives an axis.
    assert_eq!(axis_ticks(0.0), (1.0, 0.2));
    assert_eq!(axis_ticks(f64::NAN), (1.0, 0.2));
}

#[test]
fn the_caption_explains_burst_at_rate() {
    let chart = svg(&rows(), RedisRuns::NotRequested);
    let caption = caption(&chart);
    assert!(
        caption.contains("the upstream's bucket written burst@rate: 2@2/s allows bursts of 2 and refills 2 requests per second"),
        "{caption}"
    );
    // The labels it explains are there.
    assert!(chart.contains(">2@2/s</text>") && chart.contains(">10@50/s</text>"));
}

#[test]
fn abandoned_jobs_are_plotted() {
    let rows = rows();
    let chart = svg(&rows, RedisRuns::NotRequested);
    let abandoned: Vec<&SweepRow> = rows.iter().filter(|r| r.abandoned > 0).collect();
    assert!(!abandoned.is_empty(), "the grid has naive jobs abandoned");
    // A bar per row in the abandoned panel, saying how many of how many.
    assert_eq!(
        chart.matches("<rect class=\"bar abandoned\"").count(),
        rows.len()
    );
    for r in &abandoned {
        // With its parenthesis: "5 of 100" is also the tail of "25 of 100".
        let says = format!("({} of {} jobs abandoned)", r.abandoned, r.jobs);
        // In the abandoned panel, and on the hatched makespan bar, for every row with that
        // many (two cells of the grid may well abandon the same number).
        let rows_saying = abandoned
            .iter()
            .filter(|o| (o.abandoned, o.jobs) == (r.abandoned, r.jobs))
            .count();
        assert_eq!(chart.matches(&says).count(), 2 * rows_saying, "{says}");
    }
    // Exactly the makespan bars of rows with abandoned jobs are hatched.
    let hatched = chart
        .split("<rect class=\"bar makespan\"")
        .skip(1)
        .filter_map(|bar| bar.split_once('>').map(|(attributes, _)| attributes))
        .filter(|attributes| attributes.contains("fill=\"url(#hatch-"))
        .count();
    assert_eq!(hatched, abandoned.len());
    assert!(
        caption(&chart).contains("hatched makespan bar finished early because jobs were abandoned")
    );
}

#[test]
fn a_series_missing_everywhere_is_explained() {
    let chart = svg(&rows(), RedisRuns::NotRequested);
    assert!(
        caption(&chart)
            .contains("shared-redis-4p is missing everywhere: the sweep ran without --redis"),
        "{}",
        caption(&chart)
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
    let chart = svg(&rows, runs);
    let caption = caption(&chart);
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
    let caption = self::caption(&svg(&rows, runs));
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
    assert!(caption(&chart).contains("the sweep ran without --redis"));
}
