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

use crate::{
    fake::FakeConfig,
    live::{self, StoreChoice},
    multi,
    report::{min_makespan_ms, RunReport},
    scenario::{self, Mode, Scenario},
    upstream::{UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
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
            always_reject: false,
        },
        burst,
        rate_per_sec: rate,
        max_attempts: 10,
        retry_budget: None,
        deadline: None,
    }
}

/// The virtual-time modes over the grid: naive, split:4, shared.
///
/// # Errors
///
/// A configuration the library rejects.
pub fn run_virtual_grid(grid: &Grid) -> Result<Vec<SweepRow>, BoxError> {
    let mut rows = Vec::new();
    for &bucket in &grid.buckets {
        for &jobs in &grid.jobs {
            for &workers in &grid.workers {
                for mode in [Mode::Naive, Mode::Split(4), Mode::Shared] {
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
/// # Errors
///
/// The upstream could not start, or a worker process failed.
pub async fn run_redis_grid(
    exe: &Path,
    grid: &Grid,
    redis_url: &str,
    max_real_ms: u64,
    headroom: u32,
) -> Result<Vec<SweepRow>, BoxError> {
    let mut rows = Vec::new();
    for &bucket in &grid.buckets {
        for &jobs in &grid.jobs {
            if min_makespan_ms(jobs, bucket.0, bucket.1) > max_real_ms {
                continue;
            }
            for &workers in &grid.workers {
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

/// A chart: attempts per job (top) and makespan ÷ minimum (bottom), one group of bars per
/// grid cell, one bar per mode.
pub fn svg(rows: &[SweepRow]) -> String {
    let mut cells: Vec<(u32, u32, usize, usize)> = Vec::new();
    for r in rows {
        let key = (r.burst, r.rate_per_sec, r.jobs, r.workers);
        if !cells.contains(&key) {
            cells.push(key);
        }
    }
    let group_w = 64.0;
    let bar_w = 13.0;
    let left = 60.0;
    let panel_h = 180.0;
    let width = left + group_w * cells.len() as f64 + 20.0;
    let height = 2.0 * panel_h + 170.0;
    let max_apj = rows.iter().map(|r| r.attempts_per_job).fold(1.0, f64::max);
    let max_ratio = rows.iter().map(|r| r.makespan_ratio).fold(1.0, f64::max);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let panels = [
        ("attempts per job (1.00 is ideal)", 30.0, max_apj, true),
        (
            "makespan / theoretical minimum (1.00 is ideal)",
            30.0 + panel_h + 40.0,
            max_ratio,
            false,
        ),
    ];
    for (title, top, max, apj) in panels {
        let base = top + panel_h;
        let _ = write!(
            s,
            r#"<text x="{left}" y="{}" font-weight="bold">{title}</text>"#,
            top - 8.0
        );
        let _ = write!(
            s,
            r##"<line x1="{left}" y1="{base}" x2="{}" y2="{base}" stroke="#333"/>"##,
            width - 10.0
        );
        // The ideal line at 1.0.
        let y1 = base - panel_h / max;
        let _ = write!(
            s,
            r##"<line x1="{left}" y1="{y1:.1}" x2="{}" y2="{y1:.1}" stroke="#999" stroke-dasharray="4 3"/><text x="{}" y="{:.1}" text-anchor="end">1.0</text>"##,
            width - 10.0,
            left - 4.0,
            y1 + 4.0
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{max:.1}</text>"#,
            left - 4.0,
            top + 4.0
        );
        for (i, cell) in cells.iter().enumerate() {
            let x0 = left + group_w * i as f64 + 6.0;
            for (m, (mode, colour)) in MODES.iter().enumerate() {
                let Some(r) = rows.iter().find(|r| {
                    let same_mode = r.mode == *mode
                        || (mode.starts_with("shared-redis") && r.mode.starts_with(mode));
                    same_mode && (r.burst, r.rate_per_sec, r.jobs, r.workers) == *cell
                }) else {
                    continue;
                };
                let v = if apj {
                    r.attempts_per_job
                } else {
                    r.makespan_ratio
                };
                let h = panel_h * v / max;
                let _ = write!(
                    s,
                    r#"<rect x="{:.1}" y="{:.1}" width="{bar_w}" height="{h:.1}" fill="{colour}"><title>{mode}: {v:.2}</title></rect>"#,
                    x0 + bar_w * m as f64,
                    base - h
                );
            }
        }
    }
    // Cell labels under the lower panel.
    let label_y = 30.0 + 2.0 * panel_h + 40.0 + 16.0;
    for (i, (burst, rate, jobs, workers)) in cells.iter().enumerate() {
        let x = left + group_w * i as f64 + group_w / 2.0;
        let _ = write!(
            s,
            r#"<text x="{x:.1}" y="{label_y:.1}" text-anchor="middle">{workers}w</text><text x="{x:.1}" y="{:.1}" text-anchor="middle">{jobs} jobs</text><text x="{x:.1}" y="{:.1}" text-anchor="middle">{burst}@{rate}/s</text>"#,
            label_y + 13.0,
            label_y + 26.0
        );
    }
    let legend_y = label_y + 50.0;
    for (m, (mode, colour)) in MODES.iter().enumerate() {
        let x = left + 130.0 * m as f64;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{legend_y}" width="12" height="12" fill="{colour}"/><text x="{}" y="{}">{mode}</text>"#,
            x + 16.0,
            legend_y + 10.0
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
        let chart = svg(&rows);
        assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
        assert_eq!(
            chart.matches("<rect x=").count(),
            2 * rows.len() + MODES.len()
        );
    }
}
