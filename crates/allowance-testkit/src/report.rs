//! What a run reports, in virtual or real time: counts, makespan, rates and a timeline.
//!
//! A [`RunReport`] serialises (with `--json`) to one object with the keys `attempts`,
//! `rejected`, `completed`, `abandoned`, `abandoned_by_reason`, `failed`, `failed_by_cause`,
//! `makespan_ms`, `min_makespan_ms`, `last_attempt_ms`, `achieved_rate_per_sec`, the run's
//! parameters, and where they apply `first_error`, `usage_probes`, `admissions`,
//! `store_calls` and the figures of [`crate::figures::ScaleFigures`]
//! (`cancelled`, `releases`, `cooldown`, `fairness`).
//!
//! A job ends in exactly one of three ways: **completed** (a successful final response),
//! **abandoned** (the allowance gave up on it by design, with a reason: attempts, budget,
//! deadline, quota...), or **failed**, with a [`Failure`] cause: the allowance's store could
//! not decide, the transport failed, or the final response was not a success (a 401, a 404,
//! a 503 after the last attempt). A final non-2xx response is never counted as completed.
//! With `--cancel-fraction`, a fourth: **cancelled** (its caller dropped it while it waited;
//! `allowance-sim`'s `cancel` module).
//! Its [`Timeline`] feeds the ASCII and SVG pictures of `allowance-sim`'s `timeline` module.

use std::{collections::BTreeMap, time::Duration};

use crate::{
    figures::ScaleFigures,
    job::{ceil_ms, Failure, JobEnd, Mark, CANCELLED},
    scenario::{Mode, Report, Scenario},
    upstream::RateSchedule,
};

/// A stretch of time during which some lanes were told to wait (a `Retry-After`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Window {
    /// The workers that had to wait.
    pub workers: Vec<u32>,
    /// Start, ms from the start of the run.
    pub from_ms: u64,
    /// End, ms from the start of the run.
    pub to_ms: u64,
}

/// Everything needed to draw a run: one lane per worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Timeline {
    /// Number of lanes.
    pub workers: usize,
    /// Every attempt, in order.
    pub attempts: Vec<Mark>,
    /// Every job's end.
    pub ends: Vec<JobEnd>,
    /// Cooldown windows: shared ones span every lane of the allowance, a naive worker's
    /// only its own.
    pub cooldowns: Vec<Window>,
}

impl Timeline {
    /// Builds a timeline, deriving the cooldown windows from each 429's `Retry-After`: in
    /// `naive` mode a window covers the worker that got the 429, otherwise every worker
    /// sharing its allowance.
    pub fn new(mode: Mode, workers: usize, attempts: Vec<Mark>, ends: Vec<JobEnd>) -> Self {
        let lanes = u32::try_from(workers).unwrap_or(u32::MAX);
        let cooldowns = attempts
            .iter()
            .filter(|m| m.status == 429)
            .filter_map(|m| {
                let wait = m.retry_after_ms?;
                let workers = match mode {
                    Mode::Naive => vec![m.worker],
                    Mode::Shared => (0..lanes).collect(),
                    Mode::Split(n) => {
                        let n = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
                        (0..lanes).filter(|w| w % n == m.worker % n).collect()
                    }
                };
                Some(Window {
                    workers,
                    from_ms: m.at_ms,
                    to_ms: m.at_ms.saturating_add(wait),
                })
            })
            .collect();
        Self {
            workers,
            attempts,
            ends,
            cooldowns,
        }
    }

    /// Stretches where a worker had a job but had not sent its first attempt yet: queued
    /// for admission (shared and split modes), one per job that waited.
    pub fn queued(&self) -> Vec<Window> {
        self.ends
            .iter()
            .filter_map(|e| {
                let first = self
                    .attempts
                    .iter()
                    .filter(|m| m.worker == e.worker && (e.started_ms..=e.at_ms).contains(&m.at_ms))
                    .map(|m| m.at_ms)
                    .min()
                    .unwrap_or(e.at_ms);
                (first > e.started_ms).then(|| Window {
                    workers: vec![e.worker],
                    from_ms: e.started_ms,
                    to_ms: first,
                })
            })
            .collect()
    }

    /// The last moment anything happened, in ms.
    pub fn end_ms(&self) -> u64 {
        let attempts = self.attempts.iter().map(|m| m.at_ms);
        let ends = self.ends.iter().map(|e| e.at_ms);
        let cooldowns = self.cooldowns.iter().map(|w| w.to_ms);
        attempts.chain(ends).chain(cooldowns).max().unwrap_or(0)
    }
}

/// One run's figures.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RunReport {
    /// The mode: `naive`, `shared` or `split:N`.
    pub scenario: String,
    /// `virtual` or `real`.
    pub clock: &'static str,
    /// Who counted the attempts: `server` (its own log) or `client` (what came back).
    pub counted_by: &'static str,
    /// Concurrent workers.
    pub workers: usize,
    /// Jobs in total.
    pub jobs: usize,
    /// The allowance's (and, for runs against our upstream, the server's) burst.
    pub burst: u32,
    /// The allowance's rate per second.
    pub rate_per_sec: u32,
    /// Attempts the server saw.
    pub attempts: usize,
    /// Of those, 429s.
    pub rejected: usize,
    /// Jobs that completed with a final response.
    pub completed: usize,
    /// Jobs abandoned, for any reason.
    pub abandoned: usize,
    /// Jobs abandoned, by reason.
    pub abandoned_by_reason: BTreeMap<&'static str, usize>,
    /// Jobs that failed: neither completed nor abandoned (see [`Failure`]).
    pub failed: usize,
    /// Failed jobs by cause: `store`, `transport`, `status_NNN` (a final non-2xx status).
    pub failed_by_cause: BTreeMap<String, usize>,
    /// The first failed job's error, with its causes (e.g. a TLS certificate the client
    /// does not trust, or `final status 503`); absent when nothing failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// `/v1/usage` requests the upstream served (counted by the server), for runs against
    /// the built-in upstream with a quota.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_probes: Option<usize>,
    /// Admissions the run's allowances made (first attempts and retries), for runs whose
    /// workers share allowances.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admissions: Option<u64>,
    /// Calls the run's Redis stores made (the sum of `RedisStore::round_trips()` over every
    /// process, without the script load at connect), with `--redis`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_calls: Option<u64>,
    /// Cancellations, releases, a forced cooldown's reach, fairness across processes.
    #[serde(flatten)]
    pub scale: ScaleFigures,
    /// Until the last job finished, in ms, rounded up (as the minimum is).
    pub makespan_ms: u64,
    /// The theoretical minimum makespan for this many jobs at this allowance:
    /// `(jobs - burst) * interval`, at least 0, rounded up to a whole ms (see
    /// [`min_makespan_ms`]).
    pub min_makespan_ms: u64,
    /// Time of the last attempt, in ms from the start.
    pub last_attempt_ms: u64,
    /// Successful attempts per second after the initial burst (successes beyond `burst`
    /// over the time from the first success to the last); 0 when there were too few.
    pub achieved_rate_per_sec: f64,
    /// Adaptive runs and runs whose upstream changes its rate: successes per second over the
    /// end of the run, `achieved_over_ms` long (see [`achieved_rate`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub achieved_rate: Option<f64>,
    /// The window `achieved_rate` is measured over: the last 30 s of the run, or its last
    /// half when it lasted less than a minute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub achieved_over_ms: Option<u64>,
    /// Adaptive runs: the rate the group's controllers allowed at the end, requests per
    /// second: the one shared controller's rate, or the sum over independent ones (split
    /// allowances, processes each with its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_rate: Option<f64>,
    /// Adaptive runs: each allowance's rate at the end, as each process read it (on Redis,
    /// one shared controller read by every process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_rates: Option<Vec<f64>>,
    /// Runs whose upstream changes its rate: each change, and how long after it the
    /// achieved rate settled within 15% of the new rate for good, over 10 s stretches (see
    /// [`settled_after_ms`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_changes: Option<Vec<ChangeSettled>>,
    /// The run drawn as lanes (not serialised).
    #[serde(skip)]
    pub timeline: Timeline,
    /// Adaptive runs: the rate the allowances allowed over time, and the upstream's (not
    /// serialised; drawn by `allowance-sim`'s `rate_chart::svg`).
    #[serde(skip)]
    pub rates: RateTrace,
}

/// The rates of a run over time: what the adaptive allowances allowed, against the upstream.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RateTrace {
    /// (ms from the start, requests per second) the allowances allowed, summed over them.
    pub adaptive: Vec<(u64, f64)>,
    /// The upstream's true rate over time, when known.
    pub upstream: Option<RateSchedule>,
}

/// One change of the upstream's rate, and when the run followed it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChangeSettled {
    /// When the upstream changed its rate, ms from the start.
    pub at_ms: u64,
    /// The new rate, requests per second.
    pub rate_per_sec: u32,
    /// How long after the change the achieved rate settled within [`SETTLE_BAND`] of the new
    /// rate for good; `None` if it never did.
    pub settled_after_ms: Option<u64>,
}

/// How far from a target an achieved rate may be and count as settled (15%).
pub const SETTLE_BAND: f64 = 0.15;

/// The stretch the achieved rate is counted over when judging whether it settled (10 s):
/// long enough that one probe of an adaptive rate (a 429, its one-second shared cooldown and
/// the cut after it: about a second of lost throughput) leaves a steady rate within the
/// band. Over 5 s stretches every probe, every 15 to 20 s for as long as the run lasts,
/// would count as a departure.
pub const SETTLE_WINDOW_MS: u64 = 10_000;

/// How often a stretch starts when judging whether the rate settled (every 100 ms).
pub const SETTLE_STEP_MS: u64 = 100;

/// Successes per second over the end of a run: over the last 30 s before the last success,
/// or the last half of the run (from 0 to the last success) when that is shorter. Returns the
/// rate (two decimals) and the window in ms; `None` without successes.
///
/// ```
/// use allowance_testkit::report::achieved_rate;
///
/// // One success every 50 ms for a minute: 20/s over the last 30 s.
/// let times: Vec<u64> = (1..=1200).map(|i| i * 50).collect();
/// assert_eq!(achieved_rate(&times), Some((20.0, 30_000)));
/// // Ten seconds: over the last 5 s.
/// assert_eq!(achieved_rate(&times[..200]), Some((20.0, 5_000)));
/// assert_eq!(achieved_rate(&[]), None);
/// ```
pub fn achieved_rate(success_ms: &[u64]) -> Option<(f64, u64)> {
    let end = *success_ms.iter().max()?;
    let window = (end / 2).min(30_000);
    if window == 0 {
        return None;
    }
    let n = success_ms.iter().filter(|t| **t > end - window).count();
    let rate = n as f64 * 1000.0 / window as f64;
    Some(((rate * 100.0).round() / 100.0, window))
}

/// When the achieved rate settled within [`SETTLE_BAND`] of `rate` for good, in ms after
/// `from_ms`: the earliest time `T` (on a [`SETTLE_STEP_MS`] grid from `from_ms`) such that
/// every [`SETTLE_WINDOW_MS`] stretch `(t, t + 10 s]` starting at or after `T` and ending by
/// `until_ms` holds that rate of successes, within the band. `None` if it never settled, or
/// if `from_ms..until_ms` is shorter than one stretch.
///
/// A stretch averages: one that starts with up to 1.5 s without successes and goes on at
/// the target rate is within the band, so `T` may come up to 1.5 s before the rate is back.
///
/// ```
/// use allowance_testkit::report::settled_after_ms;
///
/// // 20/s until 30 s, nothing for 3 s, then 10/s: the stretches from 31.5 s on hold 8.5/s
/// // or more.
/// let mut times: Vec<u64> = (1..=600).map(|i| i * 50).collect();
/// times.extend((1..=570).map(|i| 33_000 + i * 100));
/// assert_eq!(settled_after_ms(&times, 10.0, 30_000, 90_000), Some(1_500));
/// assert_eq!(settled_after_ms(&times, 20.0, 30_000, 90_000), None);
/// ```
pub fn settled_after_ms(success_ms: &[u64], rate: f64, from_ms: u64, until_ms: u64) -> Option<u64> {
    let (lo, hi) = (rate * (1.0 - SETTLE_BAND), rate * (1.0 + SETTLE_BAND));
    let mut sorted = success_ms.to_vec();
    sorted.sort_unstable();
    // Successes in (t, t + window], per second.
    let in_band = |t: u64| {
        let n = sorted.partition_point(|x| *x <= t + SETTLE_WINDOW_MS)
            - sorted.partition_point(|x| *x <= t);
        let r = n as f64 * 1000.0 / SETTLE_WINDOW_MS as f64;
        (lo..=hi).contains(&r)
    };
    let last = until_ms.checked_sub(SETTLE_WINDOW_MS)?;
    if last < from_ms {
        return None;
    }
    let mut settled = None;
    let mut t = from_ms;
    while t <= last {
        match (in_band(t), settled) {
            (true, None) => settled = Some(t),
            (false, _) => settled = None,
            _ => {}
        }
        t += SETTLE_STEP_MS;
    }
    settled.map(|t| t - from_ms)
}

impl RunReport {
    /// A report from the attempts and job ends of a run of `s` that took `makespan`.
    pub fn new(
        s: &Scenario,
        clock: &'static str,
        counted_by: &'static str,
        timeline: Timeline,
        makespan: Duration,
    ) -> Self {
        let mut abandoned_by_reason = BTreeMap::new();
        let mut failed_by_cause = BTreeMap::new();
        let (mut completed, mut failed, mut cancelled) = (0, 0, 0);
        for end in &timeline.ends {
            match end.outcome {
                "completed" => completed += 1,
                CANCELLED => cancelled += 1,
                "failed" => {
                    failed += 1;
                    let cause = end.failure.unwrap_or(Failure::Transport);
                    *failed_by_cause.entry(cause.to_string()).or_default() += 1;
                }
                reason => *abandoned_by_reason.entry(reason).or_default() += 1,
            }
        }
        let ok: Vec<u64> = timeline
            .attempts
            .iter()
            .filter(|m| (200..300).contains(&m.status))
            .map(|m| m.at_ms)
            .collect();
        let span_ms = match (ok.iter().min(), ok.iter().max()) {
            (Some(first), Some(last)) => last - first,
            _ => 0,
        };
        let beyond_burst = ok.len().saturating_sub(s.burst as usize);
        let achieved_rate_per_sec = if span_ms > 0 && beyond_burst > 0 {
            // Exact enough: counts and spans are far below 2^52.
            let rate = beyond_burst as f64 * 1000.0 / span_ms as f64;
            (rate * 100.0).round() / 100.0
        } else {
            0.0
        };
        Self {
            scenario: s.mode.to_string(),
            clock,
            counted_by,
            workers: s.workers,
            jobs: s.jobs,
            burst: s.burst,
            rate_per_sec: s.rate_per_sec,
            attempts: timeline.attempts.len(),
            rejected: timeline.attempts.iter().filter(|m| m.status == 429).count(),
            completed,
            abandoned: abandoned_by_reason.values().sum(),
            abandoned_by_reason,
            failed,
            failed_by_cause,
            first_error: None,
            usage_probes: None,
            admissions: None,
            store_calls: None,
            scale: ScaleFigures {
                cancelled: (s.cancel.is_some() || cancelled > 0).then_some(cancelled),
                ..ScaleFigures::default()
            },
            makespan_ms: ceil_ms(makespan),
            min_makespan_ms: min_makespan_ms(s.jobs, s.burst, s.rate_per_sec),
            last_attempt_ms: timeline.attempts.iter().map(|m| m.at_ms).max().unwrap_or(0),
            achieved_rate_per_sec,
            achieved_rate: None,
            achieved_over_ms: None,
            final_rate: None,
            controller_rates: None,
            rate_changes: None,
            timeline,
            rates: RateTrace::default(),
        }
        .with_rate_figures(s, &ok)
    }

    /// Fills in the figures of adaptive runs and of runs whose upstream changes its rate:
    /// the achieved rate at the end, and when the run followed each change.
    fn with_rate_figures(mut self, s: &Scenario, ok: &[u64]) -> Self {
        let adaptive = s.adaptive.is_some() && s.mode != Mode::Naive;
        let schedule = s.upstream.schedule();
        if !adaptive && schedule.changes().is_empty() {
            return self;
        }
        if let Some((rate, window)) = achieved_rate(ok) {
            self.achieved_rate = Some(rate);
            self.achieved_over_ms = Some(window);
        }
        if !schedule.changes().is_empty() {
            let end = ok.iter().max().copied().unwrap_or(0);
            let changes = schedule.changes();
            let settled = changes
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let at_ms = u64::try_from(c.at.as_millis()).unwrap_or(u64::MAX);
                    let until = changes.get(i + 1).map_or(end, |next| {
                        u64::try_from(next.at.as_millis()).unwrap_or(u64::MAX)
                    });
                    ChangeSettled {
                        at_ms,
                        rate_per_sec: c.rate_per_sec,
                        settled_after_ms: settled_after_ms(
                            ok,
                            f64::from(c.rate_per_sec),
                            at_ms,
                            until.min(end),
                        ),
                    }
                })
                .collect();
            self.rate_changes = Some(settled);
        }
        self.rates.upstream = Some(schedule);
        self
    }

    /// Records the adaptive controllers' rates at the end: `rates` as each process read its
    /// allowances, and `final_rate`, the sum over distinct controllers.
    pub fn with_final_rates(mut self, rates: Vec<f64>, final_rate: f64) -> Self {
        self.final_rate = Some((final_rate * 1000.0).round() / 1000.0);
        self.controller_rates = Some(rates);
        self
    }

    /// A report from a virtual-time [`Report`] of `s`.
    pub fn from_virtual(s: &Scenario, r: &Report) -> Self {
        let retry_after_ms = s.upstream.retry_after_secs.map(|secs| secs * 1000);
        let attempts = r
            .timeline
            .iter()
            .map(|seen| Mark {
                worker: seen.worker.unwrap_or(0),
                at_ms: seen.at_ms,
                status: seen.status,
                retry_after_ms: (seen.status == 429).then_some(retry_after_ms).flatten(),
            })
            .collect();
        let timeline = Timeline::new(s.mode, s.workers, attempts, r.ends.clone());
        let mut report = Self::new(
            s,
            "virtual",
            "server",
            timeline,
            Duration::from_millis(r.makespan_ms),
        );
        if !r.final_rates.is_empty() {
            let sum = r.final_rates.iter().sum();
            report = report.with_final_rates(r.final_rates.clone(), sum);
            report.rates.adaptive = r.rate_samples.clone();
        }
        report
    }

    /// One line of figures for a table.
    pub fn row(&self) -> String {
        format!(
            "{:<16} {:>8} {:>8} {:>9} {:>9} {:>6} {:>11} {:>11} {:>9}",
            self.scenario,
            self.attempts,
            self.rejected,
            self.completed,
            self.abandoned,
            self.failed,
            self.makespan_ms,
            self.min_makespan_ms,
            format!("{:.2}/s", self.achieved_rate_per_sec),
        )
    }

    /// The header matching [`RunReport::row`].
    pub fn header() -> String {
        format!(
            "{:<16} {:>8} {:>8} {:>9} {:>9} {:>6} {:>11} {:>11} {:>9}",
            "mode",
            "attempts",
            "429s",
            "completed",
            "abandoned",
            "failed",
            "makespan ms",
            "minimum ms",
            "rate"
        )
    }
}

/// The theoretical minimum makespan, in ms, for `jobs` one-request jobs at `rate_per_sec`
/// with bursts of `burst`: the first `burst` go at once, then one per interval.
///
/// Rounded up, never down: no run can finish before it, so a run that matches it exactly
/// is at the minimum, not "faster than possible". A rate of 0 counts as 1 per second.
///
/// ```
/// use allowance_testkit::report::min_makespan_ms;
///
/// assert_eq!(min_makespan_ms(8, 2, 2), 3000);
/// assert_eq!(min_makespan_ms(1, 2, 2), 0);
/// assert_eq!(min_makespan_ms(2, 1, 3), 334); // one interval of 333.3 ms
/// ```
pub fn min_makespan_ms(jobs: usize, burst: u32, rate_per_sec: u32) -> u64 {
    let after_burst = u128::try_from(jobs.saturating_sub(burst as usize)).unwrap_or(u128::MAX);
    let rate = u128::from(rate_per_sec.max(1));
    // after_burst <= usize::MAX, so the product cannot overflow u128.
    let ms = (after_burst * 1000).div_ceil(rate);
    u64::try_from(ms).unwrap_or(u64::MAX)
}
