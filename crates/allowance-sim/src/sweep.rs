//! The coordination-efficiency sweep: how many attempts per job, and how close to the
//! theoretical minimum makespan, each way of coordinating gets.
//!
//! The grid is workers × jobs × upstream bucket, for `naive`, `split:4` and `shared` in
//! virtual time (exact), and `shared` on Redis across 4 OS processes in real time (only
//! where a run takes seconds, not minutes). The allowance always matches the upstream.
//!
//! ```
//! use allowance_sim::sweep::{run_virtual_grid, Grid};
//!
//! let grid = Grid { workers: vec![8], jobs: vec![20], buckets: vec![(2, 2)] };
//! let rows = run_virtual_grid(&grid)?;
//! let shared = rows.iter().find(|r| r.mode == "shared").expect("shared row");
//! assert_eq!(shared.attempts_per_job, 1.0);
//! assert_eq!(shared.rejected, 0);
//! # Ok::<(), tower_allowance::BoxError>(())
//! ```

use std::{fmt::Write as _, path::Path};

use tower_allowance::BoxError;

use allowance_testkit::{
    fake::FakeConfig,
    report::{min_makespan_ms, RunReport},
    scenario::{self, Mode, OnStoreOutage, Scenario},
    upstream::{UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};

use crate::{
    chart::{fmt_tick, Bar, Chart, Colour, Panel, Series, Swatch, XAxis},
    live::{self, StoreChoice},
    multi,
};

/// The parameters swept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Worker counts.
    pub workers: Vec<usize>,
    /// Job counts.
    pub jobs: Vec<usize>,
    /// Upstream buckets (and matching allowances): (burst, requests per second).
    pub buckets: Vec<(u32, u32)>,
}

impl Default for Grid {
    /// workers ∈ {8, 64, 512}, jobs ∈ {100, 1000}, buckets ∈ {(2, 2/s), (10, 50/s)}.
    fn default() -> Self {
        Self {
            workers: vec![8, 64, 512],
            jobs: vec![100, 1_000],
            buckets: vec![(2, 2), (10, 50)],
        }
    }
}

/// One cell of the sweep.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SweepRow {
    /// `naive`, `split:4`, `shared`, or `shared-redis-4p`.
    pub mode: String,
    /// `virtual` or `real`.
    pub clock: &'static str,
    /// Workers.
    pub workers: usize,
    /// Jobs.
    pub jobs: usize,
    /// Upstream (and allowance) burst.
    pub burst: u32,
    /// Upstream (and allowance) rate per second.
    pub rate_per_sec: u32,
    /// Attempts the server saw.
    pub attempts: usize,
    /// Attempts per job.
    pub attempts_per_job: f64,
    /// 429s the server sent.
    pub rejected: usize,
    /// Jobs completed.
    pub completed: usize,
    /// Jobs abandoned (for naive workers: after 10 attempts).
    pub abandoned: usize,
    /// Makespan, ms.
    pub makespan_ms: u64,
    /// Theoretical minimum makespan, ms.
    pub min_makespan_ms: u64,
    /// `makespan / minimum` (0 when the minimum is 0).
    pub makespan_ratio: f64,
    /// Whether the issue's target holds: a coordinated mode makes one attempt per job and
    /// finishes within 1.02 x the minimum plus one refill interval. `None` for modes without
    /// a target (naive, split).
    pub meets_target: Option<bool>,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A row for a run of `s` against an upstream of `upstream_burst` at the same rate; the
/// minimum is the upstream's (what the key allows), whatever headroom the allowance keeps.
fn row(mode: String, report: &RunReport, s: &Scenario, upstream_burst: u32) -> SweepRow {
    let min = min_makespan_ms(s.jobs, upstream_burst, s.rate_per_sec);
    let interval_ms = 1_000 / u64::from(s.rate_per_sec.max(1));
    let attempts_per_job = report.attempts as f64 / s.jobs.max(1) as f64;
    let coordinated = matches!(s.mode, Mode::Shared);
    let meets = report.attempts == s.jobs
        && report.completed == s.jobs
        && report.makespan_ms * 100 <= min * 102 + interval_ms * 100;
    SweepRow {
        mode,
        clock: report.clock,
        workers: s.workers,
        jobs: s.jobs,
        burst: upstream_burst,
        rate_per_sec: s.rate_per_sec,
        attempts: report.attempts,
        attempts_per_job: round2(attempts_per_job),
        rejected: report.rejected,
        completed: report.completed,
        abandoned: report.abandoned,
        makespan_ms: report.makespan_ms,
        min_makespan_ms: min,
        makespan_ratio: if min == 0 {
            0.0
        } else {
            round2(report.makespan_ms as f64 / min as f64)
        },
        meets_target: coordinated.then_some(meets),
    }
}

fn scenario(mode: Mode, workers: usize, jobs: usize, (burst, rate): (u32, u32)) -> Scenario {
    Scenario {
        mode,
        workers,
        jobs,
        upstream: FakeConfig {
            burst,
            rate_per_sec: rate,
            retry_after_secs: Some(1),
            ..FakeConfig::seed()
        },
        burst,
        rate_per_sec: rate,
        max_attempts: 10,
        retry_budget: None,
        deadline: None,
        cancel: None,
        on_store_outage: OnStoreOutage::default(),
        ..Scenario::seed(mode)
    }
}

/// How many runs a sweep of `grid` makes: three modes per cell in virtual time, plus the
/// Redis runs for the cells whose minimum is at most `redis_max_real_ms` (if given).
pub fn planned_runs(grid: &Grid, redis_max_real_ms: Option<u64>) -> usize {
    let per_bucket_jobs = grid.workers.len();
    let virtual_runs = grid.buckets.len() * grid.jobs.len() * per_bucket_jobs * 3;
    let redis_runs = redis_max_real_ms.map_or(0, |max| {
        let mut n = 0;
        for &(burst, rate) in &grid.buckets {
            for &jobs in &grid.jobs {
                if min_makespan_ms(jobs, burst, rate) <= max {
                    n += per_bucket_jobs;
                }
            }
        }
        n
    });
    virtual_runs + redis_runs
}

fn describe(mode: &str, workers: usize, jobs: usize, (burst, rate): (u32, u32)) -> String {
    format!("{mode}: {workers} w × {jobs} jobs × {burst}@{rate}/s")
}

/// The virtual-time modes over the grid: naive, split:4, shared.
///
/// # Errors
///
/// A configuration the library rejects.
pub fn run_virtual_grid(grid: &Grid) -> Result<Vec<SweepRow>, BoxError> {
    run_virtual_grid_with(grid, &mut |_| {})
}

/// [`run_virtual_grid`], calling `starting` with a description of each run before it
/// starts (for a progress display).
///
/// # Errors
///
/// As [`run_virtual_grid`].
pub fn run_virtual_grid_with(
    grid: &Grid,
    starting: &mut dyn FnMut(&str),
) -> Result<Vec<SweepRow>, BoxError> {
    let mut rows = Vec::new();
    for &bucket in &grid.buckets {
        for &jobs in &grid.jobs {
            for &workers in &grid.workers {
                for mode in [Mode::Naive, Mode::Split(4), Mode::Shared] {
                    starting(&describe(&mode.to_string(), workers, jobs, bucket));
                    let s = scenario(mode, workers, jobs, bucket);
                    let report = RunReport::from_virtual(&s, &scenario::run_virtual(&s)?);
                    rows.push(row(mode.to_string(), &report, &s, bucket.0));
                }
            }
        }
    }
    Ok(rows)
}

/// `shared` on one Redis allowance across 4 processes of `exe`, in real time, for the grid
/// cells whose minimum makespan is at most `max_real_ms`.
///
/// The allowance keeps `headroom` tokens of the upstream's burst in reserve (same rate):
/// across processes, a request admitted one interval after another can reach the upstream a
/// few milliseconds sooner than that, and a single 429 costs everyone its `Retry-After`.
///
/// `starting` is called with a description of each run before it starts (for a progress
/// display).
///
/// # Errors
///
/// The upstream could not start, or a worker process failed.
pub async fn run_redis_grid(
    exe: &Path,
    grid: &Grid,
    redis_url: &str,
    (max_real_ms, headroom): (u64, u32),
    starting: &mut dyn FnMut(&str),
) -> Result<Vec<SweepRow>, BoxError> {
    let mut rows = Vec::new();
    for &bucket in &grid.buckets {
        for &jobs in &grid.jobs {
            if min_makespan_ms(jobs, bucket.0, bucket.1) > max_real_ms {
                continue;
            }
            for &workers in &grid.workers {
                starting(&describe("shared-redis-4p", workers, jobs, bucket));
                let mut s = scenario(Mode::Shared, workers, jobs, bucket);
                s.burst = bucket.0.saturating_sub(headroom).max(1);
                let store = StoreChoice::Redis {
                    url: redis_url.to_owned(),
                    name: multi::run_name(),
                };
                let config = UpstreamConfig::new(bucket.0, bucket.1);
                let (scenario_ref, store_ref) = (&s, &store);
                let report = live::counted_by_upstream(config, |upstream| async move {
                    let headers = [format!("{API_KEY_HEADER}: {DEFAULT_KEY}")];
                    let template = upstream.snapshot_url("e{job}");
                    multi::run_processes(exe, scenario_ref, &template, &headers, store_ref, 4).await
                })
                .await?;
                let mode = if headroom == 0 {
                    "shared-redis-4p".to_owned()
                } else {
                    format!("shared-redis-4p (burst {})", s.burst)
                };
                rows.push(row(mode, &report, &s, bucket.0));
            }
        }
    }
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[SweepRow]) -> String {
    let mut out = String::from(
        "| bucket | jobs | workers | mode | clock | attempts/job | 429s | completed | abandoned | makespan ms | minimum ms | ratio | target |\n\
         |---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let target = match r.meets_target {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "",
        };
        let _ = writeln!(
            out,
            "| {} at {}/s | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {:.2} | {} |",
            r.burst,
            r.rate_per_sec,
            r.jobs,
            r.workers,
            r.mode,
            r.clock,
            r.attempts_per_job,
            r.rejected,
            r.completed,
            r.abandoned,
            r.makespan_ms,
            r.min_makespan_ms,
            r.makespan_ratio,
            target
        );
    }
    out
}

const MODES: [(&str, Colour); 4] = [
    ("naive", Colour(0xd9534f)),
    ("split:4", Colour(0xf0ad4e)),
    ("shared", Colour(0x5cb85c)),
    ("shared-redis-4p", Colour(0x337ab7)),
];

/// Which Redis runs a sweep made, so that the chart can say why that series is missing
/// where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisRuns {
    /// The sweep ran without `--redis`: no Redis series.
    NotRequested,
    /// Cells whose theoretical minimum is at most `max_real_ms` ran on Redis in real time;
    /// the allowance kept `headroom` tokens of the upstream's burst in reserve.
    UpTo {
        /// The longest theoretical minimum run in real time, ms (`--max-real`).
        max_real_ms: u64,
        /// Tokens of the burst kept in reserve (`--headroom`).
        headroom: u32,
    },
}

/// One grid cell: (burst, rate per second, jobs, workers).
type Cell = (u32, u32, usize, usize);

fn cell_of(r: &SweepRow) -> Cell {
    (r.burst, r.rate_per_sec, r.jobs, r.workers)
}

fn row_for<'a>(rows: &'a [SweepRow], mode: &str, cell: Cell) -> Option<&'a SweepRow> {
    rows.iter().find(|r| {
        let same_mode =
            r.mode == mode || (mode.starts_with("shared-redis") && r.mode.starts_with(mode));
        same_mode && cell_of(r) == cell
    })
}

fn cell_name((burst, rate, jobs, workers): Cell) -> String {
    format!("{workers} w × {jobs} jobs × {burst}@{rate}/s")
}

fn secs(ms: u64) -> String {
    fmt_tick(ms as f64 / 1000.0) + " s"
}

/// One sentence per series that lacks a bar somewhere, saying where and why.
fn missing_series(rows: &[SweepRow], cells: &[Cell], redis: RedisRuns) -> Vec<String> {
    let mut notes = Vec::new();
    for (mode, _) in MODES {
        let missing: Vec<Cell> = cells
            .iter()
            .copied()
            .filter(|c| row_for(rows, mode, *c).is_none())
            .collect();
        if missing.is_empty() {
            continue;
        }
        let mut unexplained = missing.clone();
        if mode.starts_with("shared-redis") {
            match redis {
                RedisRuns::NotRequested => {
                    notes.push(format!(
                        "{mode} is missing everywhere: the sweep ran without --redis."
                    ));
                    unexplained.clear();
                }
                RedisRuns::UpTo { max_real_ms, .. } => {
                    // Too long for real time: one note per (bucket, jobs) group.
                    let mut groups: Vec<(u32, u32, usize, u64)> = Vec::new();
                    for &(burst, rate, jobs, _) in &missing {
                        let min = min_makespan_ms(jobs, burst, rate);
                        if min > max_real_ms && !groups.contains(&(burst, rate, jobs, min)) {
                            groups.push((burst, rate, jobs, min));
                        }
                    }
                    unexplained.retain(|&(burst, rate, jobs, _)| {
                        min_makespan_ms(jobs, burst, rate) <= max_real_ms
                    });
                    if !groups.is_empty() {
                        let list: Vec<String> = groups
                            .iter()
                            .map(|(b, r, j, min)| {
                                format!("{b}@{r}/s with {j} jobs (minimum {})", secs(*min))
                            })
                            .collect();
                        notes.push(format!(
                            "{mode} is not run for {}: real-time runs are limited to cells whose theoretical minimum is at most {} (--max-real).",
                            list.join(", "),
                            secs(max_real_ms)
                        ));
                    }
                }
            }
        }
        if !unexplained.is_empty() {
            let list: Vec<String> = unexplained.iter().map(|c| cell_name(*c)).collect();
            notes.push(format!(
                "{mode} has no result for {} (not in the sweep's rows).",
                list.join(", ")
            ));
        }
    }
    if rows.iter().any(|r| r.min_makespan_ms == 0) {
        notes.push(
            "Where the theoretical minimum is 0 (no more jobs than the burst), makespan / minimum is undefined and drawn as 0."
                .to_owned(),
        );
    }
    notes
}

/// The caption under the chart: what the cells and series are, how abandoned jobs show,
/// and why any series is missing where it is.
fn caption(rows: &[SweepRow], cells: &[Cell], redis: RedisRuns) -> Vec<String> {
    let example = cells.first().map_or((2, 2), |c| (c.0, c.1));
    let mut text = vec![format!(
        "Each group of bars is one grid cell: W workers (w) sharing one API key, J jobs of one request each, and the upstream's bucket written burst@rate: {}@{}/s allows bursts of {} and refills {} requests per second. Every allowance matches the upstream's rate.",
        example.0, example.1, example.0, example.1
    )];
    let redis_series = match redis {
        RedisRuns::UpTo { headroom, .. } if headroom > 0 => format!(
            "shared-redis-4p: one Redis allowance across 4 OS processes, real time, keeping {headroom} token(s) of the burst in reserve"
        ),
        _ => "shared-redis-4p: one Redis allowance across 4 OS processes, real time".to_owned(),
    };
    text.push(format!(
        "Series: naive: each worker retries on its own, honouring Retry-After, and abandons a job after 10 attempts; split:4: four independent allowances; shared: one allowance (virtual time); {redis_series}. A stub bar is 0."
    ));
    text.push(
        "Abandoned jobs are plotted in the bottom panel. A hatched makespan bar finished early because jobs were abandoned, not because the work was done sooner than the minimum allows."
            .to_owned(),
    );
    text.extend(missing_series(rows, cells, redis));
    text
}

struct Measure {
    title: &'static str,
    axis: &'static str,
    value: fn(&SweepRow) -> f64,
    percent: bool,
}

fn abandoned_percent(r: &SweepRow) -> f64 {
    r.abandoned as f64 * 100.0 / r.jobs.max(1) as f64
}

const MEASURES: [Measure; 3] = [
    Measure {
        title: "Attempts per job (1 is ideal)",
        axis: "attempts / job",
        value: |r| r.attempts_per_job,
        percent: false,
    },
    Measure {
        title: "Makespan / theoretical minimum (1 is ideal; hatched: jobs were abandoned)",
        axis: "makespan / minimum",
        value: |r| r.makespan_ratio,
        percent: false,
    },
    Measure {
        title: "Jobs abandoned (0% is ideal)",
        axis: "% of jobs",
        value: abandoned_percent,
        percent: true,
    },
];

/// A chart of the sweep in three panels, one group of bars per grid cell and one bar per
/// mode: attempts per job, makespan over the theoretical minimum (hatched where jobs were
/// abandoned), and the share of jobs abandoned; labelled axes with ticks, the cells'
/// parameters under the bars, and a caption explaining the labels, the series and every
/// series missing somewhere (`redis` says why the Redis series may be).
pub fn chart(rows: &[SweepRow], redis: RedisRuns) -> Chart {
    let mut cells: Vec<Cell> = Vec::new();
    for r in rows {
        if !cells.contains(&cell_of(r)) {
            cells.push(cell_of(r));
        }
    }
    let labels = cells
        .iter()
        .map(|(burst, rate, jobs, workers)| format!("{workers} w\n{jobs} jobs\n{burst}@{rate}/s"))
        .collect();
    let x = XAxis::categories(
        labels,
        "grid cell: workers (w), jobs, upstream bucket as burst@rate",
    );
    let mut chart = Chart::new(x)
        .title("Coordination-efficiency sweep: naive, split:4 and shared workers on one API key");
    for measure in &MEASURES {
        let mut panel = Panel::values(measure.axis).title(measure.title);
        if measure.percent {
            panel = panel.y_max(100.0).y_unit("%");
        }
        for (mode, colour) in MODES {
            let bar = |(i, cell): (usize, &Cell)| {
                row_for(rows, mode, *cell).map(|r| Bar {
                    category: i,
                    value: (measure.value)(r),
                    // Only the makespan is hatched where jobs were abandoned.
                    hatched: measure.axis == "makespan / minimum" && r.abandoned > 0,
                })
            };
            let bars = cells.iter().enumerate().filter_map(bar).collect();
            panel.push(Series::bars(mode, colour, bars));
        }
        if !measure.percent {
            panel.push(Series::level("ideal", 1.0));
        }
        chart = chart.panel(panel);
    }
    chart
        .legend_entry(Swatch::Hatched(MODES[0].1), "jobs abandoned")
        .caption(caption(rows, &cells, redis))
}

/// [`chart`] as an SVG document.
///
/// # Errors
///
/// As [`Chart::svg`].
pub fn svg(rows: &[SweepRow], redis: RedisRuns) -> Result<String, BoxError> {
    chart(rows, redis).svg()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_meets_the_target_in_virtual_time() {
        let grid = Grid {
            workers: vec![8, 64],
            jobs: vec![100],
            buckets: vec![(2, 2), (10, 50)],
        };
        let rows = run_virtual_grid(&grid).expect("runs");
        assert_eq!(rows.len(), 2 * 2 * 3);
        for r in rows.iter().filter(|r| r.mode == "shared") {
            assert_eq!(r.meets_target, Some(true), "{r:?}");
            assert_eq!(r.rejected, 0);
        }
        // The uncoordinated modes waste attempts somewhere on the grid.
        assert!(rows
            .iter()
            .any(|r| r.mode == "naive" && r.attempts_per_job > 1.5));
        assert!(rows.iter().any(|r| r.mode == "split:4" && r.rejected > 0));
        let md = markdown(&rows);
        assert_eq!(md.lines().count(), rows.len() + 2);
        // One bar per row in each of the three panels.
        let chart = chart(&rows, RedisRuns::NotRequested);
        let bars = |p: &crate::chart::Panel| p.series.iter().map(|s| s.len()).sum::<usize>();
        let counts: Vec<usize> = chart.panels.iter().map(bars).collect();
        // (and the "ideal" level in the first two)
        assert_eq!(counts, [rows.len() + 1, rows.len() + 1, rows.len()]);
        let svg = svg(&rows, RedisRuns::NotRequested).expect("drawn");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
