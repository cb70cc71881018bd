//! Evidence for one allowance shared by many processes: how fast a cooldown reaches them all,
//! the order their jobs are served in, and what cancelled waiters cost.
//!
//! Everything here is computed from two records that do not depend on the library: the
//! upstream's own log ([`SeenRequest`], one clock) and the clients' job times (started, first
//! attempt), which `--processes` runs put on one clock (see `allowance-sim`'s `multi` module).
//!
//! ```
//! use allowance_testkit::scale::{cooldown_reach, PROPAGATION_BOUND_MS};
//! use allowance_testkit::upstream::{SeenRequest, Throttled};
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
    figures::{CooldownReach, Fairness, ProcessWaits},
    report::{RunReport, Timeline},
    upstream::{SeenRequest, Throttled, Upstream, USAGE_PATH},
};

/// How long after a 429 a request from another process may still reach the upstream: the
/// time for the cooldown to travel (the response, the store call, the store's event).
pub const PROPAGATION_BOUND_MS: u64 = 10;

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
/// assert_eq!(allowance_testkit::scale::job_of("/v1/events/e17/odds/snapshot"), Some(17));
/// assert_eq!(allowance_testkit::scale::job_of("/v1/usage"), None);
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

/// Prints the figures of [`ScaleFigures`](crate::figures::ScaleFigures) a run has, one line each, under its table.
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

/// One request the upstream saw, with when it was sent, both on the upstream's log clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Its index in the upstream's log.
    pub index: usize,
    /// The job it was for (its path's `e{job}`), if a snapshot.
    pub job: Option<usize>,
    /// Which attempt of its job, from 1.
    pub attempt: usize,
    /// When its client sent it (the allowance had admitted it), ms on the upstream's clock:
    /// the client's time moved by the run's fastest delivery (taken as zero transit).
    pub sent_ms: u64,
    /// When the upstream saw it, ms ([`SeenRequest::at_ms`]).
    pub arrived_ms: u64,
}

impl Delivery {
    /// Its time in transit beyond the run's fastest delivery, ms.
    pub fn lag_ms(&self) -> u64 {
        self.arrived_ms.saturating_sub(self.sent_ms)
    }
}

/// Why a 429 that a run did not force came back ([`stray_429s`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrayCause {
    /// Delivery jitter: the upstream's own bucket, fed every request at the moment it was
    /// *sent* (admitted by the allowance) instead of when it arrived, admits this one. The
    /// allowance kept the limit; the requests' transit times did not stay equal. `late` is
    /// the request sent before it, within the bucket's depth (burst + 1 intervals), that
    /// spent the longest in transit: the usual culprit is one that arrived late while the
    /// upstream's bucket was full, so the bucket lost that refill.
    DeliveryJitter {
        /// The request sent before it that was longest in transit.
        late: Option<Delivery>,
    },
    /// Sent early: the same bucket rejects it at its send time too. The allowance let it go
    /// before the upstream had a token for it (coordination failed, or its state was lost).
    SentEarly,
    /// Its send is not in the clients' records (no pairing): nothing explains it.
    Unpaired,
}

/// A 429 the run did not force, and its cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stray {
    /// When the upstream sent it, ms on its clock.
    pub at_ms: u64,
    /// The request, when its send was found.
    pub request: Option<Delivery>,
    /// Why.
    pub cause: StrayCause,
}

impl Stray {
    /// Whether delivery jitter explains it.
    pub fn is_jitter(&self) -> bool {
        matches!(self.cause, StrayCause::DeliveryJitter { .. })
    }
}

/// How early the upstream's bucket admits a request (a tenth of an interval), ms.
pub fn forgiveness_ms(rate_per_sec: u32) -> f64 {
    1000.0 / f64::from(rate_per_sec.max(1)) / crate::upstream::TOLERANCE_DIVISOR as f64
}

impl std::fmt::Display for Stray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let job = |d: &Delivery| {
            d.job.map_or("a request".to_owned(), |j| {
                format!("job e{j} attempt {}", d.attempt)
            })
        };
        write!(f, "429 at {} ms", self.at_ms)?;
        if let Some(r) = &self.request {
            write!(
                f,
                " ({}, sent at {} ms, {} ms in transit)",
                job(r),
                r.sent_ms,
                r.lag_ms()
            )?;
        }
        match &self.cause {
            StrayCause::DeliveryJitter { late } => {
                write!(
                    f,
                    ": DELIVERY JITTER (the upstream's bucket fed the send times admits it)"
                )?;
                if let Some(l) = late {
                    write!(
                        f,
                        "; longest in transit before it: {}, sent at {} ms, arrived at {} ms ({} ms in transit)",
                        job(l),
                        l.sent_ms,
                        l.arrived_ms,
                        l.lag_ms()
                    )?;
                }
                Ok(())
            }
            StrayCause::SentEarly => write!(
                f,
                ": SENT EARLY (the upstream's bucket rejects it at its send time too: the allowance let it go before a token was there)"
            ),
            StrayCause::Unpaired => write!(
                f,
                ": UNEXPLAINED (its send is not in the clients' records)"
            ),
        }
    }
}

/// The index in `log` of the 429 that `forced` describes (the first snapshot 429 at or
/// after its time).
pub fn forced_index(log: &[SeenRequest], forced: Option<Throttled>) -> Option<usize> {
    let forced = forced?;
    log.iter()
        .position(|r| r.at_ms >= forced.sent_at_ms && r.status == 429 && r.path != USAGE_PATH)
}

/// Pairs each snapshot request of the upstream's `log` with its send in the clients'
/// `timeline` (the run's marks and job ends, one clock): per worker, its jobs in order, each
/// taking as many of the worker's marks as the upstream saw attempts of that job; a pair
/// must agree on the status. The client clock is put on the upstream's by the smallest
/// `arrived - sent` of the run (the fastest delivery, taken as zero transit).
///
/// Returns one entry per log index (`None`: not paired).
pub fn deliveries(log: &[SeenRequest], timeline: &Timeline) -> Vec<Option<Delivery>> {
    let mut by_job: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, r) in log.iter().enumerate() {
        if let Some(job) = job_of(&r.path) {
            by_job.entry(job).or_default().push(i);
        }
    }
    let mut jobs_of: HashMap<u32, Vec<(u64, u64, usize)>> = HashMap::new();
    for e in &timeline.ends {
        if let Some(job) = e.job {
            jobs_of
                .entry(e.worker)
                .or_default()
                .push((e.started_ms, e.at_ms, job));
        }
    }
    // Each worker's attempts in the order sent.
    let mut marks_of: HashMap<u32, Vec<(u64, u16)>> = HashMap::new();
    for m in timeline.attempts.iter().filter(|m| m.status != 0) {
        marks_of
            .entry(m.worker)
            .or_default()
            .push((m.at_ms, m.status));
    }
    for marks in marks_of.values_mut() {
        marks.sort_by_key(|&(at_ms, _)| at_ms);
    }
    // (log index, sent on the client clock)
    let mut pairs: Vec<(usize, u64)> = Vec::new();
    for (worker, jobs) in &mut jobs_of {
        jobs.sort_unstable();
        let Some(marks) = marks_of.get(worker) else {
            continue;
        };
        let mut next = 0;
        let mut mine = Vec::new();
        let mut agree = true;
        for &(_, _, job) in jobs.iter() {
            for &i in by_job.get(&job).map_or(&[][..], Vec::as_slice) {
                match marks.get(next) {
                    Some(&(sent, status)) if status == log[i].status => mine.push((i, sent)),
                    _ => agree = false,
                }
                next += 1;
            }
        }
        if agree && next == marks.len() {
            pairs.extend(mine);
        }
    }
    let offset = pairs
        .iter()
        .map(|&(i, sent)| i128::from(log[i].at_ms) - i128::from(sent))
        .min()
        .unwrap_or(0);
    let mut out = vec![None; log.len()];
    for (i, sent) in pairs {
        let job = job_of(&log[i].path);
        let attempt = by_job
            .get(&job.unwrap_or(usize::MAX))
            .and_then(|v| v.iter().position(|&x| x == i))
            .map_or(1, |p| p + 1);
        let sent_ms = u64::try_from((i128::from(sent) + offset).max(0)).unwrap_or(0);
        out[i] = Some(Delivery {
            index: i,
            job,
            attempt,
            sent_ms,
            arrived_ms: log[i].at_ms,
        });
    }
    out
}

/// Every 429 in `log` but the forced one, with its cause ([`StrayCause`]): the upstream's
/// bucket (`burst`, `rate_per_sec`, the same tolerance as [`crate::upstream`]'s) is replayed
/// on the send times of [`deliveries`] (requests not paired at their arrival), in the order
/// they were sent.
///
/// ```
/// use allowance_testkit::job::{JobEnd, Mark};
/// use allowance_testkit::report::Timeline;
/// use allowance_testkit::scale::{stray_429s, StrayCause};
/// use allowance_testkit::scenario::Mode;
/// use allowance_testkit::upstream::{snapshot_path, SeenRequest};
/// use tower_allowance::Outcome;
///
/// // Burst 1 at 20/s: job 0 sent at 0 but delivered at 20 ms; job 1 sent on its slot, 50 ms,
/// // delivered at once: the bucket lost 20 ms of refill waiting for job 0, and says 429.
/// let seen = |at_ms, job, status| SeenRequest {
///     at_ms,
///     key: String::new(),
///     path: snapshot_path(&format!("e{job}")),
///     status,
///     worker: None,
/// };
/// let log = [seen(20, 0, 200), seen(50, 1, 429)];
/// let mark = |worker, at_ms, status| Mark { worker, at_ms, status, retry_after_ms: None };
/// let end = |w, job, at| JobEnd::new(w, at, at + 1, Outcome::Completed).timed(job, Some(at));
/// let timeline = Timeline::new(
///     Mode::Shared,
///     2,
///     vec![mark(0, 0, 200), mark(1, 50, 429)],
///     vec![end(0, 0, 0), end(1, 1, 50)],
/// );
/// let strays = stray_429s(&log, &timeline, 1, 20, None);
/// assert_eq!(strays.len(), 1);
/// let StrayCause::DeliveryJitter { late: Some(late) } = strays[0].cause else { panic!() };
/// assert_eq!((late.job, late.lag_ms()), (Some(0), 20));
/// ```
pub fn stray_429s(
    log: &[SeenRequest],
    timeline: &Timeline,
    burst: u32,
    rate_per_sec: u32,
    forced: Option<Throttled>,
) -> Vec<Stray> {
    let forced = forced_index(log, forced);
    let sent = deliveries(log, timeline);
    let interval_us = 1_000_000 / i64::from(rate_per_sec.max(1));
    let tolerance_us = interval_us / i64::try_from(crate::upstream::TOLERANCE_DIVISOR).unwrap_or(1);
    let capacity_us = i64::from(burst) * interval_us;
    let at = |i: usize| sent[i].map_or(log[i].at_ms, |d| d.sent_ms);
    // Every request that takes a token, in the order sent.
    let mut order: Vec<usize> = (0..log.len()).filter(|i| Some(*i) != forced).collect();
    order.sort_by_key(|&i| (at(i), log[i].at_ms, i));
    let mut admitted = vec![true; log.len()];
    let (mut level_us, mut last_us) = (capacity_us, 0i64);
    for &i in &order {
        let now_us = i64::try_from(at(i)).unwrap_or(i64::MAX / 2) * 1000;
        let now_us = now_us.max(last_us);
        level_us = (level_us + (now_us - last_us)).min(capacity_us);
        last_us = now_us;
        let ok = burst > 0 && level_us + tolerance_us >= interval_us;
        if ok {
            level_us -= interval_us;
        }
        admitted[i] = ok;
    }
    let depth_ms = u64::from(burst + 1) * 1000 / u64::from(rate_per_sec.max(1));
    (0..log.len())
        .filter(|&i| log[i].status == 429 && Some(i) != forced)
        .map(|i| {
            let cause = match sent[i] {
                None => StrayCause::Unpaired,
                Some(_) if !admitted[i] => StrayCause::SentEarly,
                Some(d) => StrayCause::DeliveryJitter {
                    late: sent
                        .iter()
                        .flatten()
                        .filter(|e| {
                            e.index != i
                                && e.sent_ms <= d.sent_ms
                                && e.sent_ms + depth_ms >= d.sent_ms
                        })
                        .max_by_key(|e| (e.lag_ms(), e.sent_ms))
                        .copied(),
                },
            };
            Stray {
                at_ms: log[i].at_ms,
                request: sent[i],
                cause,
            }
        })
        .collect()
}

/// Prints every stray 429 of a run on stderr, one line each, under `what`; returns how many
/// delivery jitter does not explain.
pub fn print_strays(what: &str, strays: &[Stray]) -> usize {
    if strays.is_empty() {
        eprintln!("{what}: no stray 429 (none the test did not force)");
    }
    for s in strays {
        eprintln!("{what}: stray {s}");
    }
    strays.iter().filter(|s| !s.is_jitter()).count()
}

/// The window of `times` (sorted, ms) most over what an allowance of `burst` at
/// `rate_per_sec` admits in it, each window widened by `jitter_ms` of delivery jitter:
/// `(excess, from, to)`.
///
/// ```
/// use allowance_testkit::scale::worst_window;
///
/// // A burst of 4, then one every 50 ms (20/s): never over.
/// let spaced: Vec<u64> = [0, 0, 0, 0].into_iter().chain((1..40).map(|i| i * 50)).collect();
/// assert!(worst_window(&spaced, 4, 20, 10).0 <= 0);
/// ```
pub fn worst_window(
    times: &[u64],
    burst: u64,
    rate_per_sec: u32,
    jitter_ms: u64,
) -> (i64, u64, u64) {
    let mut worst = (i64::MIN, 0, 0);
    for i in 0..times.len() {
        for j in i..times.len() {
            let (from, to) = (times[i], times[j]);
            let allowed = burst + u64::from(rate_per_sec) * (to - from + jitter_ms) / 1000;
            let seen = u64::try_from(j - i + 1).unwrap_or(u64::MAX);
            let excess = i64::try_from(seen).unwrap_or(i64::MAX)
                - i64::try_from(allowed).unwrap_or(i64::MAX);
            if excess > worst.0 {
                worst = (excess, from, to);
            }
        }
    }
    worst
}

/// The most requests of `times` (sorted, ms) within any `span_ms`.
pub fn most_within(times: &[u64], span_ms: u64) -> usize {
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t <= times[i] + span_ms)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{job::JobEnd, scenario::Mode};
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

    #[test]
    fn the_window_check_sees_a_herd() {
        // On schedule: one every 50 ms after a burst of 4.
        let spaced: Vec<u64> = [0, 0, 0, 0]
            .into_iter()
            .chain((1..40).map(|i| i * 50))
            .collect();
        assert!(worst_window(&spaced, 4, 20, 10).0 <= 0);
        // Eighteen in 15 ms, 2 s later: 14 over the allowance, 10 beyond one extra burst.
        let mut herd = spaced.clone();
        herd.extend((0..18).map(|i| 4000 + i * 15 / 17));
        assert_eq!(worst_window(&herd, 4, 20, 10).0, 14);
        assert_eq!(most_within(&herd, 20), 18);
    }

    /// Burst 2 at 20/s, one worker per job. Jobs 0 and 1 take the burst at 0; job 2 is due
    /// at 50 ms. The burst delivered late (at 30 ms, the bucket full meanwhile), the bucket
    /// sees job 2 early: jitter. Sent at 10 ms (before its slot), it is early whatever the
    /// delivery. A 429 whose send is not recorded is unexplained; the forced one is left out.
    #[test]
    fn a_stray_429_is_jitter_only_when_its_send_time_was_within_the_limit() {
        let mark = |worker, at_ms, status| crate::job::Mark {
            worker,
            at_ms,
            status,
            retry_after_ms: None,
        };
        let end = |w: u32, job: usize, at: u64| {
            JobEnd::new(w, at, at + 1, Outcome::Completed).timed(job, Some(at))
        };
        let timeline = |sends: &[u64], statuses: &[u16]| {
            let marks = (0..sends.len())
                .map(|j| mark(j as u32, sends[j], statuses[j]))
                .collect();
            let ends = (0..sends.len())
                .map(|j| end(j as u32, j, sends[j]))
                .collect();
            Timeline::new(Mode::Shared, sends.len(), marks, ends)
        };
        // Jobs 0 and 1 sent at 0, arrived at 30 (the bucket sat full meanwhile); job 2 sent
        // on its slot and delivered at once (the offset: 0 ms in transit).
        let log = [seen(30, 0, 200), seen(30, 1, 200), seen(50, 2, 429)];
        let t = timeline(&[0, 0, 50], &[200, 200, 429]);
        let strays = stray_429s(&log, &t, 2, 20, None);
        assert_eq!(strays.len(), 1);
        assert!(strays[0].is_jitter(), "{}", strays[0]);
        let StrayCause::DeliveryJitter { late: Some(late) } = strays[0].cause else {
            panic!("{:?}", strays[0]);
        };
        assert_eq!(late.lag_ms(), 30);
        assert!(matches!(late.job, Some(0 | 1)), "{late:?}");
        assert!(strays[0].to_string().contains("DELIVERY JITTER"));
        // Job 2 sent at 10 ms: the bucket has no token for it then either.
        let log = [seen(0, 0, 200), seen(0, 1, 200), seen(10, 2, 429)];
        let strays = stray_429s(&log, &timeline(&[0, 0, 10], &[200, 200, 429]), 2, 20, None);
        assert_eq!(strays[0].cause, StrayCause::SentEarly);
        assert!(strays[0].to_string().contains("SENT EARLY"));
        // No record of job 2's send: unexplained.
        let t = timeline(&[0, 0], &[200, 200]);
        let strays = stray_429s(&log, &t, 2, 20, None);
        assert_eq!(strays[0].cause, StrayCause::Unpaired);
        // The forced 429 is not a stray.
        let forced = Throttled {
            sent_at_ms: 10,
            retry_after_ms: 1000,
        };
        let t = timeline(&[0, 0, 10], &[200, 200, 429]);
        assert!(stray_429s(&log, &t, 2, 20, Some(forced)).is_empty());
        assert_eq!(forgiveness_ms(20), 5.0);
    }
}
