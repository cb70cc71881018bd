//! Evidence for one allowance shared by many processes: how fast a cooldown reaches them all,
//! the order their jobs are served in, and what cancelled waiters cost.
//!
//! Everything here is computed from two records that do not depend on the library: the
//! upstream's own log ([`SeenRequest`], one clock) and the clients' job times (started, first
//! attempt), which `--processes` runs put on one clock (see [`crate::multi`]).
//!
//! ```
//! use allowance_sim::scale::{cooldown_reach, PROPAGATION_BOUND_MS};
//! use allowance_sim::upstream::{SeenRequest, Throttled};
//!
//! let seen = |at_ms, status| SeenRequest {
//!     at_ms,
//!     key: "k".into(),
//!     path: "/v1/events/e1/odds/snapshot".into(),
//!     status,
//!     worker: None,
//! };
//! // The 429 at 1000 ms, a request 3 ms later (in flight), the next one after the cooldown.
//! let log = [seen(950, 200), seen(1000, 429), seen(1003, 429), seen(2001, 200)];
//! let reach = cooldown_reach(&log, Throttled { sent_at_ms: 1000, retry_after_ms: 1000 });
//! assert_eq!(reach.inside_after_ms, vec![3]);
//! assert_eq!(reach.late(PROPAGATION_BOUND_MS), 0);
//! ```

use std::{collections::HashMap, io::Write};

use crate::{
    report::{RunReport, Timeline},
    upstream::{SeenRequest, Throttled, Upstream, USAGE_PATH},
};

/// How long after a 429 a request from another process may still reach the upstream: the
/// time for the cooldown to travel (the response, the store call, the store's event).
pub const PROPAGATION_BOUND_MS: u64 = 10;

/// The figures `run --json` adds for the issue-15 measurements; each only where it applies.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ScaleFigures {
    /// Jobs cancelled while they waited for admission (`--cancel-fraction`); they are neither
    /// completed nor abandoned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<usize>,
    /// Reserved slots given back by cancelled waiters, and how many the store took back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub releases: Option<Releases>,
    /// The forced cooldown (`--throttle-at`) and the requests that arrived inside it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown: Option<CooldownReach>,
    /// The order jobs were served in against the order they arrived, and the waits per
    /// process (runs over several processes against the built-in upstream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fairness: Option<Fairness>,
    /// When the run's clock started, in µs since the Unix epoch (not serialised): how a
    /// `--processes` run puts its children's times on one clock.
    #[serde(skip)]
    pub started_unix_us: Option<u64>,
}

/// Releases of reserved slots by holders that left before their slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Releases {
    /// Releases the store answered.
    pub made: u64,
    /// Of those, the ones whose slot went back to the schedule (it was still the latest).
    pub taken_back: u64,
}

impl Releases {
    /// Slots lost: released too late to be given back (another slot had been reserved after
    /// them), each one interval of the schedule that nobody uses.
    pub fn lost(&self) -> u64 {
        self.made.saturating_sub(self.taken_back)
    }
}

impl std::ops::Add for Releases {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            made: self.made + other.made,
            taken_back: self.taken_back + other.taken_back,
        }
    }
}

/// What the upstream's log shows of a forced cooldown.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CooldownReach {
    /// When the 429 that started it was sent, ms on the upstream's log clock.
    pub sent_at_ms: u64,
    /// Its `Retry-After`, in ms.
    pub retry_after_ms: u64,
    /// Every other snapshot request that arrived inside the cooldown, in ms after the 429:
    /// requests already on their way when it was sent, and any that did not hear of it.
    pub inside_after_ms: Vec<u64>,
    /// The last snapshot request before the 429, ms before it.
    pub last_before_ms: Option<u64>,
    /// The first snapshot request once the cooldown was over, ms after the 429.
    pub first_after_ms: Option<u64>,
    /// Every other 429 of the run, ms on the upstream's log clock (none when the allowance
    /// kept the provider's limit everywhere else).
    pub other_429s_at_ms: Vec<u64>,
}

impl CooldownReach {
    /// The requests inside the cooldown that arrived more than `bound_ms` after the 429.
    pub fn late(&self, bound_ms: u64) -> usize {
        self.inside_after_ms
            .iter()
            .filter(|ms| **ms > bound_ms)
            .count()
    }
}

/// The snapshot requests of `log` inside the cooldown `throttled` describes, the 429 that
/// started it left out.
pub fn cooldown_reach(log: &[SeenRequest], throttled: Throttled) -> CooldownReach {
    let end = throttled
        .sent_at_ms
        .saturating_add(throttled.retry_after_ms);
    let first = log
        .iter()
        .position(|r| r.at_ms >= throttled.sent_at_ms && r.status == 429 && r.path != USAGE_PATH);
    let inside_after_ms = log
        .iter()
        .enumerate()
        .filter(|(i, r)| {
            Some(*i) != first
                && r.path != USAGE_PATH
                && (throttled.sent_at_ms..end).contains(&r.at_ms)
        })
        .map(|(_, r)| r.at_ms - throttled.sent_at_ms)
        .collect();
    let snapshots = || log.iter().filter(|r| r.path != USAGE_PATH);
    let other_429s_at_ms = log
        .iter()
        .enumerate()
        .filter(|(i, r)| Some(*i) != first && r.status == 429)
        .map(|(_, r)| r.at_ms)
        .collect();
    CooldownReach {
        other_429s_at_ms,
        sent_at_ms: throttled.sent_at_ms,
        retry_after_ms: throttled.retry_after_ms,
        inside_after_ms,
        last_before_ms: snapshots()
            .filter(|r| r.at_ms < throttled.sent_at_ms)
            .map(|r| throttled.sent_at_ms - r.at_ms)
            .min(),
        first_after_ms: snapshots()
            .filter(|r| r.at_ms >= end)
            .map(|r| r.at_ms - throttled.sent_at_ms)
            .min(),
    }
}

/// The job a snapshot path is for: `/v1/events/e{job}/odds/snapshot`.
///
/// ```
/// assert_eq!(allowance_sim::scale::job_of("/v1/events/e17/odds/snapshot"), Some(17));
/// assert_eq!(allowance_sim::scale::job_of("/v1/usage"), None);
/// ```
pub fn job_of(path: &str) -> Option<usize> {
    path.strip_prefix("/v1/events/e")?
        .strip_suffix("/odds/snapshot")?
        .parse()
        .ok()
}

/// One job, on the run's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobTiming {
    /// The job's number (its URL's `e{job}`).
    pub job: usize,
    /// The process that ran it (index into the split).
    pub process: usize,
    /// When its worker started it: its arrival at the allowance, ms.
    pub arrived_ms: u64,
    /// When its first attempt was sent (admitted), ms; `None` when it never was.
    pub first_attempt_ms: Option<u64>,
}

/// The jobs of `timeline` that carry their number (real-time runs), with their processes:
/// `split` gives the workers of each process, in order (worker numbers are global, process 0
/// first).
pub fn job_timings(timeline: &Timeline, split: &[usize]) -> Vec<JobTiming> {
    let process_of = |worker: usize| {
        let mut first = 0;
        for (p, n) in split.iter().enumerate() {
            if worker < first + n {
                return p;
            }
            first += n;
        }
        split.len().saturating_sub(1)
    };
    let mut out: Vec<JobTiming> = timeline
        .ends
        .iter()
        .filter_map(|e| {
            Some(JobTiming {
                job: e.job?,
                process: process_of(e.worker as usize),
                arrived_ms: e.started_ms,
                first_attempt_ms: e.first_attempt_ms,
            })
        })
        .collect();
    out.sort_unstable_by_key(|j| j.job);
    out
}

/// Each job's first request in the upstream's log: `(job, at_ms)`, in the order served.
pub fn served_order(log: &[SeenRequest]) -> Vec<(usize, u64)> {
    let mut seen = std::collections::HashSet::new();
    log.iter()
        .filter_map(|r| Some((job_of(&r.path)?, r.at_ms)))
        .filter(|(job, _)| seen.insert(*job))
        .collect()
}

/// The order of service against the order of arrival, and the waits per process.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Fairness {
    /// One interval of the allowance, ms: the tolerance for arrival order.
    pub interval_ms: f64,
    /// The largest inversion: over jobs `a`, `b` where `a` arrived first but `b` was served
    /// first, the most `a` arrived before `b`, ms (0: served exactly in arrival order).
    pub max_inversion_ms: u64,
    /// Jobs served before some job that arrived more than one interval before them.
    pub overtaking: usize,
    /// When every process had a job waiting, ms: the waits below count the jobs that arrived
    /// from then on (before it, the processes started first had the allowance to themselves).
    pub contended_from_ms: u64,
    /// Per process, in order.
    pub processes: Vec<ProcessWaits>,
}

/// One process's jobs and how long they waited for admission.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ProcessWaits {
    /// Its workers.
    pub workers: usize,
    /// Its jobs that were admitted, having arrived once every process had started.
    pub jobs: usize,
    /// Their mean wait from arrival to first attempt, ms.
    pub mean_wait_ms: f64,
    /// Their longest wait, ms.
    pub max_wait_ms: u64,
}

/// Fairness of `jobs` served as `served` says ([`served_order`]), for an allowance at
/// `rate_per_sec`, processes as in `split`.
pub fn fairness(
    jobs: &[JobTiming],
    served: &[(usize, u64)],
    split: &[usize],
    rate_per_sec: u32,
) -> Fairness {
    let interval_ms = 1000.0 / f64::from(rate_per_sec.max(1));
    let arrived: HashMap<usize, u64> = jobs.iter().map(|j| (j.job, j.arrived_ms)).collect();
    // In the order served: each job against the earliest arrival among those served after it.
    let order: Vec<u64> = served
        .iter()
        .filter_map(|(job, _)| arrived.get(job).copied())
        .collect();
    let (mut max_inversion_ms, mut overtaking) = (0, 0);
    let mut earliest_later = u64::MAX;
    for &arrival in order.iter().rev() {
        if earliest_later < arrival {
            let inversion = arrival - earliest_later;
            max_inversion_ms = max_inversion_ms.max(inversion);
            // Exact enough: milliseconds of a run are far below 2^52.
            if inversion as f64 > interval_ms {
                overtaking += 1;
            }
        }
        earliest_later = earliest_later.min(arrival);
    }
    let contended_from_ms = (0..split.len())
        .filter_map(|p| {
            jobs.iter()
                .filter(|j| j.process == p)
                .map(|j| j.arrived_ms)
                .min()
        })
        .max()
        .unwrap_or(0);
    let processes = split
        .iter()
        .enumerate()
        .map(|(p, &workers)| {
            let waits: Vec<u64> = jobs
                .iter()
                .filter(|j| j.process == p && j.arrived_ms >= contended_from_ms)
                .filter_map(|j| Some(j.first_attempt_ms?.saturating_sub(j.arrived_ms)))
                .collect();
            let mean = if waits.is_empty() {
                0.0
            } else {
                waits.iter().sum::<u64>() as f64 / waits.len() as f64
            };
            ProcessWaits {
                workers,
                jobs: waits.len(),
                mean_wait_ms: (mean * 10.0).round() / 10.0,
                max_wait_ms: waits.iter().copied().max().unwrap_or(0),
            }
        })
        .collect();
    Fairness {
        interval_ms,
        max_inversion_ms,
        overtaking,
        contended_from_ms,
        processes,
    }
}

/// Adds what `upstream`'s log shows to a run's report: the forced cooldown's reach, if one
/// was sent, and fairness across the processes of `split` (modes with allowances).
pub fn add_upstream_figures(report: &mut RunReport, upstream: &Upstream, split: &[usize]) {
    let log = upstream.log();
    if let Some(throttled) = upstream.throttled() {
        report.scale.cooldown = Some(cooldown_reach(&log, throttled));
    }
    if report.scenario.starts_with("naive") {
        return;
    }
    let jobs = job_timings(&report.timeline, split);
    let served = served_order(&log);
    report.scale.fairness = Some(fairness(&jobs, &served, split, report.rate_per_sec));
}

/// Prints the figures of [`ScaleFigures`] a run has, one line each, under its table.
///
/// # Errors
///
/// `out` failing.
pub fn print_figures(report: &RunReport, out: &mut dyn Write) -> std::io::Result<()> {
    let figures = &report.scale;
    if let Some(n) = figures.cancelled {
        write!(out, "cancelled while waiting: {n}")?;
        if let Some(r) = figures.releases {
            write!(
                out,
                "; reserved slots released {}, taken back {}, lost {}",
                r.made,
                r.taken_back,
                r.lost()
            )?;
        }
        writeln!(out)?;
    }
    if let Some(c) = &figures.cooldown {
        writeln!(
            out,
            "forced 429 at {} ms, Retry-After {} ms: {} other requests inside the cooldown, {} of them more than {PROPAGATION_BOUND_MS} ms after the 429 (at {:?} ms after it); the last request before it {} ms before, the first after it {} ms after",
            c.sent_at_ms,
            c.retry_after_ms,
            c.inside_after_ms.len(),
            c.late(PROPAGATION_BOUND_MS),
            c.inside_after_ms,
            c.last_before_ms.map_or("-".to_owned(), |ms| ms.to_string()),
            c.first_after_ms.map_or("-".to_owned(), |ms| ms.to_string()),
        )?;
    }
    if let Some(f) = &figures.fairness {
        let waits: Vec<String> = f
            .processes
            .iter()
            .map(|p| {
                format!(
                    "{} workers: {} jobs, {:.0} ms (max {})",
                    p.workers, p.jobs, p.mean_wait_ms, p.max_wait_ms
                )
            })
            .collect();
        writeln!(
            out,
            "order: largest inversion {} ms (one interval: {:.0} ms), {} jobs served ahead of one that arrived more than an interval before; mean wait per process, jobs arriving from {} ms: {}",
            f.max_inversion_ms,
            f.interval_ms,
            f.overtaking,
            f.contended_from_ms,
            waits.join("; ")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{report::JobEnd, scenario::Mode};
    use tower_allowance::Outcome;

    fn seen(at_ms: u64, job: usize, status: u16) -> SeenRequest {
        SeenRequest {
            at_ms,
            key: String::new(),
            path: crate::upstream::snapshot_path(&format!("e{job}")),
            status,
            worker: None,
        }
    }

    #[test]
    fn the_cooldown_shows_every_request_inside_it_but_the_first_429() {
        let log = [
            seen(990, 1, 200),
            seen(1000, 2, 429),
            seen(1000, 3, 429),
            seen(1012, 4, 429),
            seen(1999, 5, 429),
            seen(2000, 6, 200),
        ];
        let reach = cooldown_reach(
            &log,
            Throttled {
                sent_at_ms: 1000,
                retry_after_ms: 1000,
            },
        );
        assert_eq!(reach.inside_after_ms, vec![0, 12, 999]);
        assert_eq!(
            (reach.last_before_ms, reach.first_after_ms),
            (Some(10), Some(1000))
        );
        assert_eq!(reach.late(PROPAGATION_BOUND_MS), 2);
    }

    #[test]
    fn jobs_carry_their_processes_and_waits() {
        // Three workers (one process of 1, one of 2): worker 0 runs jobs 0 and 3.
        let end = |w, job, started, first, ended| {
            JobEnd::new(w, started, ended, Outcome::Completed).timed(job, Some(first))
        };
        let ends = vec![
            end(0, 0, 0, 5, 10),
            end(1, 1, 0, 55, 60),
            end(2, 2, 0, 105, 110),
            end(0, 3, 10, 155, 160),
            JobEnd::new(1, 60, 70, Outcome::Completed), // no number: left out
        ];
        let t = Timeline::new(Mode::Shared, 3, Vec::new(), ends);
        let jobs = job_timings(&t, &[1, 2]);
        let got: Vec<(usize, usize, u64, Option<u64>)> = jobs
            .iter()
            .map(|j| (j.job, j.process, j.arrived_ms, j.first_attempt_ms))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, 0, Some(5)),
                (1, 1, 0, Some(55)),
                (2, 1, 0, Some(105)),
                (3, 0, 10, Some(155)),
            ]
        );
        let f = fairness(&jobs, &[(0, 5), (1, 55), (2, 105), (3, 155)], &[1, 2], 20);
        assert_eq!((f.max_inversion_ms, f.overtaking), (0, 0));
        assert_eq!(f.contended_from_ms, 0);
        assert_eq!(f.processes[0].jobs, 2);
        assert_eq!(f.processes[0].mean_wait_ms, 75.0);
        assert_eq!(f.processes[1].max_wait_ms, 105);
        // Process 1 starts at 10 ms: the waits count from then on.
        let late: Vec<JobTiming> = jobs
            .iter()
            .map(|j| JobTiming {
                arrived_ms: j.arrived_ms.max(if j.process == 1 { 10 } else { 0 }),
                ..*j
            })
            .collect();
        let f = fairness(&late, &[(0, 5), (1, 55), (2, 105), (3, 155)], &[1, 2], 20);
        assert_eq!(f.contended_from_ms, 10);
        assert_eq!(
            (f.processes[0].jobs, f.processes[0].mean_wait_ms),
            (1, 145.0)
        );
    }

    #[test]
    fn inversions_are_measured_in_arrival_time() {
        let job = |job, arrived_ms| JobTiming {
            job,
            process: 0,
            arrived_ms,
            first_attempt_ms: None,
        };
        let jobs = [job(0, 0), job(1, 30), job(2, 200), job(3, 210)];
        // Served 1, 0, 3, 2: job 0 arrived 30 ms before 1, job 2 10 ms before 3.
        let served = [(1, 100), (0, 150), (3, 250), (2, 300)];
        let f = fairness(&jobs, &served, &[4], 20);
        assert_eq!((f.max_inversion_ms, f.overtaking), (30, 0));
        // Served 3 first: it overtakes 0, 1 and 2, the earliest by 210 ms.
        let served = [(3, 100), (0, 150), (1, 250), (2, 300)];
        let f = fairness(&jobs, &served, &[4], 20);
        assert_eq!((f.max_inversion_ms, f.overtaking), (210, 1));
        assert_eq!(
            served_order(&[seen(5, 2, 429), seen(9, 1, 200), seen(70, 2, 200)]),
            vec![(2, 5), (1, 9)]
        );
    }
}
