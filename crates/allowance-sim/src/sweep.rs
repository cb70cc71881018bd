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

const MODES: [(&str, &str); 4] = [
    ("naive", "#d9534f"),
    ("split:4", "#f0ad4e"),
    ("shared", "#5cb85c"),
    ("shared-redis-4p", "#337ab7"),
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

/// A y axis from 0 to `top` in steps of `step`: the smallest "nice" step (1, 2, 2.5 or 5
/// times a power of ten) that covers `max` in at most 6 steps.
///
/// ```
/// use allowance_sim::sweep::axis_ticks;
///
/// assert_eq!(axis_ticks(9.79), (10.0, 2.0));
/// assert_eq!(axis_ticks(5.0), (5.0, 1.0));
/// assert_eq!(axis_ticks(1.0), (1.0, 0.2));
/// ```
pub fn axis_ticks(max: f64) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let mut magnitude = 10f64.powf((max / 6.0).log10().floor());
    loop {
        for m in [1.0, 2.0, 2.5, 5.0] {
            let step = m * magnitude;
            let steps = (max / step - 1e-9).ceil().max(1.0);
            if steps <= 6.0 {
                // Rounded to a millionth: 6 x 0.2 is 1.2, not 1.2000000000000002.
                let round = |x: f64| (x * 1e6).round() / 1e6;
                return (round(steps * step), round(step));
            }
        }
        magnitude *= 10.0;
    }
}

fn fmt_tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').to_owned()
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Greedy word wrap at `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
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

struct Panel {
    key: &'static str,
    title: &'static str,
    axis: &'static str,
    value: fn(&SweepRow) -> f64,
    percent: bool,
}

fn abandoned_percent(r: &SweepRow) -> f64 {
    r.abandoned as f64 * 100.0 / r.jobs.max(1) as f64
}

const PANELS: [Panel; 3] = [
    Panel {
        key: "attempts",
        title: "Attempts per job (1 is ideal)",
        axis: "attempts / job",
        value: |r| r.attempts_per_job,
        percent: false,
    },
    Panel {
        key: "makespan",
        title: "Makespan / theoretical minimum (1 is ideal; hatched: jobs were abandoned)",
        axis: "makespan / minimum",
        value: |r| r.makespan_ratio,
        percent: false,
    },
    Panel {
        key: "abandoned",
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
pub fn svg(rows: &[SweepRow], redis: RedisRuns) -> String {
    const LEFT: f64 = 78.0;
    const GROUP_W: f64 = 64.0;
    const BAR_W: f64 = 13.0;
    const PANEL_H: f64 = 140.0;
    const PANEL_GAP: f64 = 44.0;
    const TOP: f64 = 34.0;
    const LINE: f64 = 14.0;
    let mut cells: Vec<Cell> = Vec::new();
    for r in rows {
        if !cells.contains(&cell_of(r)) {
            cells.push(cell_of(r));
        }
    }
    let plot_w = GROUP_W * cells.len().max(1) as f64;
    // Wide enough for the title, the legend and a readable caption however few the cells.
    let width = (LEFT + plot_w + 20.0).max(840.0);
    // About 6.5 px per character at 11 px.
    let wrap_at = ((width - 20.0) / 6.5) as usize;
    // Caption lines, each with the gap before it (a paragraph starts after a wider one).
    let caption: Vec<(f64, String)> = caption(rows, &cells, redis)
        .iter()
        .flat_map(|p| {
            wrap(p, wrap_at)
                .into_iter()
                .enumerate()
                .map(|(i, line)| (if i == 0 { LINE + 5.0 } else { LINE }, line))
        })
        .collect();
    let panels_bottom = TOP + PANELS.len() as f64 * (PANEL_H + PANEL_GAP) - PANEL_GAP;
    let labels_y = panels_bottom + 16.0;
    let x_title_y = labels_y + 3.0 * 13.0 + 6.0;
    let legend_y = x_title_y + 18.0;
    let caption_y = legend_y + 18.0;
    let height = caption_y + caption.iter().map(|(gap, _)| gap).sum::<f64>() + 10.0;

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11">"#
    );
    s.push_str("<defs>");
    for (m, (_, colour)) in MODES.iter().enumerate() {
        let _ = write!(
            s,
            r#"<pattern id="hatch-{m}" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)"><rect width="6" height="6" fill="{colour}" fill-opacity="0.3"/><line x1="0" y1="0" x2="0" y2="6" stroke="{colour}" stroke-width="3"/></pattern>"#
        );
    }
    s.push_str("</defs>");
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="18" font-weight="bold" font-size="13">Coordination-efficiency sweep: naive, split:4 and shared workers on one API key</text>"#
    );

    for (p, panel) in PANELS.iter().enumerate() {
        let top = TOP + p as f64 * (PANEL_H + PANEL_GAP) + 14.0;
        let base = top + PANEL_H - 14.0;
        let inner_h = base - top;
        let max = rows.iter().map(panel.value).fold(0.0, f64::max);
        let (axis_top, step) = if panel.percent {
            (100.0, 20.0)
        } else {
            axis_ticks(max.max(1.0))
        };
        let y = |v: f64| base - inner_h * v / axis_top;
        let _ = write!(
            s,
            r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text>"#,
            top - 8.0,
            escape(panel.title)
        );
        // Gridlines, ticks and tick labels.
        let steps = (axis_top / step).round() as usize;
        for i in 0..=steps {
            let v = step * i as f64;
            let ty = y(v);
            let label = if panel.percent {
                format!("{}%", fmt_tick(v))
            } else {
                fmt_tick(v)
            };
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#e4e4e4"/><line x1="{:.1}" y1="{ty:.1}" x2="{LEFT}" y2="{ty:.1}" stroke="#333"/><text class="ytick" x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
                LEFT + plot_w,
                LEFT - 4.0,
                LEFT - 6.0,
                ty + 4.0
            );
        }
        if !panel.percent {
            let iy = y(1.0);
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" y1="{iy:.1}" x2="{:.1}" y2="{iy:.1}" stroke="#555" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">ideal</text>"##,
                LEFT + plot_w,
                LEFT + plot_w - 2.0,
                iy - 3.0
            );
        }
        // The axes and the axis title.
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{top:.1}" x2="{LEFT}" y2="{base:.1}" stroke="#333"/><line x1="{LEFT}" y1="{base:.1}" x2="{:.1}" y2="{base:.1}" stroke="#333"/><text class="axis-title" transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            LEFT + plot_w,
            LEFT - 48.0,
            (top + base) / 2.0,
            escape(panel.axis)
        );
        for (i, cell) in cells.iter().enumerate() {
            let x0 = LEFT + GROUP_W * i as f64 + 6.0;
            for (m, (mode, colour)) in MODES.iter().enumerate() {
                let Some(r) = row_for(rows, mode, *cell) else {
                    continue;
                };
                let v = (panel.value)(r);
                // A zero is a visible stub, so that it cannot be mistaken for a missing run.
                let h = (base - y(v.min(axis_top))).max(1.5);
                let hatched = panel.key == "makespan" && r.abandoned > 0;
                let fill = if hatched {
                    format!("url(#hatch-{m})")
                } else {
                    (*colour).to_owned()
                };
                let shown = if panel.percent {
                    format!("{v:.1}% ({} of {} jobs abandoned)", r.abandoned, r.jobs)
                } else if hatched {
                    format!("{v:.2} ({} of {} jobs abandoned)", r.abandoned, r.jobs)
                } else {
                    format!("{v:.2}")
                };
                let _ = write!(
                    s,
                    r#"<rect class="bar {}" x="{:.1}" y="{:.1}" width="{BAR_W}" height="{h:.1}" fill="{fill}"><title>{}, {}: {shown}</title></rect>"#,
                    panel.key,
                    x0 + BAR_W * m as f64,
                    base - h,
                    escape(&r.mode),
                    cell_name(*cell),
                );
            }
        }
    }
    // The cells' parameters under the bottom panel, then the x-axis title.
    for (i, (burst, rate, jobs, workers)) in cells.iter().enumerate() {
        let x = LEFT + GROUP_W * i as f64 + GROUP_W / 2.0;
        let _ = write!(
            s,
            r#"<text class="xtick" x="{x:.1}" y="{labels_y:.1}" text-anchor="middle">{workers} w</text><text x="{x:.1}" y="{:.1}" text-anchor="middle">{jobs} jobs</text><text x="{x:.1}" y="{:.1}" text-anchor="middle">{burst}@{rate}/s</text>"#,
            labels_y + 13.0,
            labels_y + 26.0
        );
    }
    let _ = write!(
        s,
        r#"<text class="axis-title" x="{:.1}" y="{x_title_y:.1}" text-anchor="middle">grid cell: workers (w), jobs, upstream bucket as burst@rate</text>"#,
        LEFT + plot_w / 2.0
    );
    for (m, (mode, colour)) in MODES.iter().enumerate() {
        let x = LEFT + 120.0 * m as f64;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{legend_y}" width="12" height="12" fill="{colour}"/><text x="{}" y="{}">{mode}</text>"#,
            x + 16.0,
            legend_y + 10.0
        );
    }
    let x = LEFT + 120.0 * MODES.len() as f64;
    let _ = write!(
        s,
        r#"<rect x="{x}" y="{legend_y}" width="12" height="12" fill="url(#hatch-0)"/><text x="{}" y="{}">jobs abandoned</text>"#,
        x + 16.0,
        legend_y + 10.0
    );
    let mut line_y = caption_y;
    for (gap, line) in &caption {
        line_y += gap;
        let _ = write!(
            s,
            r##"<text class="caption" x="10" y="{line_y:.1}" fill="#333">{}</text>"##,
            escape(line)
        );
    }
    s.push_str("</svg>\n");
    s
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
        let chart = svg(&rows, RedisRuns::NotRequested);
        assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
        // One bar per row in each of the three panels.
        assert_eq!(chart.matches("<rect class=\"bar ").count(), 3 * rows.len());
    }
}
