//! A picture of an adaptive run: the rate the allowance allowed over time, against the
//! upstream's true rate and the rate the server actually served.
//!
//! One panel per run, stacked on one time scale. In each: the upstream's rate (a grey step
//! line, from its [`RateSchedule`](allowance_testkit::upstream::RateSchedule)), the allowance's adaptive
//! rate (blue, sampled every 100 ms), the achieved rate (green: 2xx answers per second at the
//! server, over a 2 s window centred on each point), and each 429 as a red tick under the
//! plot. Rates above the axis's top (a start far above the limit) are drawn at the top and
//! the panel says so.
//!
//! ```
//! use allowance_sim::rate_chart;
//! use allowance_testkit::{report::RunReport, scenario::{run_virtual, Adaptive, Mode, Scenario}};
//!
//! let s = Scenario {
//!     adaptive: Some(Adaptive::starting_at(1.0)),
//!     jobs: 20,
//!     ..Scenario::seed(Mode::Shared)
//! };
//! let report = RunReport::from_virtual(&s, &run_virtual(&s)?);
//! let chart = rate_chart::chart(&[("from 1/s", &report)]);
//! let panel = &chart.panels[0];
//! assert!(panel.series("adaptive rate (the allowance's)").is_some_and(|s| !s.is_empty()));
//! let svg = rate_chart::svg(&[("from 1/s", &report)])?;
//! assert!(svg.starts_with("<svg") && svg.contains("requests per second"));
//! # Ok::<(), tower_allowance::BoxError>(())
//! ```

use std::fmt::Write as _;

use allowance_testkit::report::RunReport;
use tower_allowance::BoxError;

use crate::chart::{fmt_tick, Chart, Colour, Panel, Series, XAxis};

/// The window the achieved rate is counted over, centred on each point (2 s).
pub const ACHIEVED_WINDOW_MS: u64 = 2_000;

/// The chart of `runs`, one panel per `(title, report)`.
pub fn chart(runs: &[(&str, &RunReport)]) -> Chart {
    let end = runs
        .iter()
        .map(|(_, r)| end_ms(r))
        .max()
        .unwrap_or(0)
        .max(1);
    // One rate scale for every panel: twice the highest upstream rate (room to see a rate
    // above it), or the highest achieved rate if more.
    let top_rate = runs
        .iter()
        .map(|(_, r)| {
            let upstream = r
                .rates
                .upstream
                .as_ref()
                .map_or(f64::from(r.rate_per_sec), |u| {
                    let most = u.changes().iter().map(|c| c.rate_per_sec).max();
                    f64::from(most.unwrap_or(0).max(u.initial()))
                });
            let achieved = achieved_series(r, end)
                .iter()
                .map(|(_, v)| *v)
                .fold(0.0, f64::max);
            (upstream * 2.0).max(achieved)
        })
        .fold(1.0, f64::max);
    let axis_top = crate::chart::axis_ticks(top_rate).0;
    let mut chart = Chart::new(XAxis::time(end));
    for (title, r) in runs {
        let mut panel = Panel::values("requests per second")
            .title(*title)
            .subtitle(summary(r))
            .y_max(top_rate);
        // The upstream's rate: a step line, to the run's own end.
        let run_end = end_ms(r).max(1);
        if let Some(up) = &r.rates.upstream {
            let mut steps = vec![(0.0, f64::from(up.initial()))];
            for c in up.changes() {
                let at = u64::try_from(c.at.as_millis()).unwrap_or(u64::MAX);
                if at > run_end {
                    break;
                }
                steps.push((at as f64, f64::from(c.rate_per_sec)));
            }
            let line = Series::steps(
                "upstream's true rate",
                Colour::DARK_GREY,
                steps,
                run_end as f64,
            );
            panel.push(line.size(3).opacity(0.8));
        }
        let achieved = as_points(&achieved_series(r, end));
        panel.push(
            Series::line("achieved (2xx per s, 2 s window)", Colour::GREEN, achieved).size(1),
        );
        let adaptive = as_points(&r.rates.adaptive);
        panel.push(Series::line(
            "adaptive rate (the allowance's)",
            Colour::BLUE,
            adaptive,
        ));
        let rejected = r.timeline.attempts.iter().filter(|m| m.status == 429);
        let ticks = rejected.map(|m| m.at_ms as f64).collect();
        panel.push(Series::ticks("a 429", Colour::RED, ticks));
        let above = r
            .rates
            .adaptive
            .iter()
            .map(|(_, v)| *v)
            .filter(|v| *v > axis_top);
        if let Some(most) = above.reduce(f64::max) {
            let note = format!("above the axis at first (up to {}/s)", fmt_tick(most));
            panel = panel.note(note, Colour::BLUE);
        }
        chart = chart.panel(panel);
    }
    chart
}

/// [`chart`] as an SVG document.
///
/// # Errors
///
/// As [`Chart::svg`].
pub fn svg(runs: &[(&str, &RunReport)]) -> Result<String, BoxError> {
    chart(runs).svg()
}

fn as_points(series: &[(u64, f64)]) -> Vec<(f64, f64)> {
    series.iter().map(|(t, v)| (*t as f64, *v)).collect()
}

/// When the run's last attempt (or its last rate sample) was, in ms.
fn end_ms(r: &RunReport) -> u64 {
    let attempts = r.timeline.attempts.iter().map(|m| m.at_ms).max();
    let samples = r.rates.adaptive.iter().map(|(t, _)| *t).max();
    attempts.max(samples).unwrap_or(0)
}

/// The achieved rate every 200 ms: 2xx answers in a window of [`ACHIEVED_WINDOW_MS`] centred
/// on each point (`(t - 1 s, t + 1 s]`), per second; windows cut by the start or the end
/// are scaled to their part.
pub fn achieved_series(r: &RunReport, end: u64) -> Vec<(u64, f64)> {
    let mut ok: Vec<u64> = r
        .timeline
        .attempts
        .iter()
        .filter(|m| (200..300).contains(&m.status))
        .map(|m| m.at_ms)
        .collect();
    ok.sort_unstable();
    let last = ok.last().copied().unwrap_or(0).min(end);
    let half = ACHIEVED_WINDOW_MS / 2;
    (0..=last / 200)
        .map(|i| {
            let t = i * 200;
            let (a, b) = (t.saturating_sub(half), (t + half).min(last));
            let n = ok.partition_point(|x| *x <= b) - ok.partition_point(|x| *x <= a);
            let span = (b - a).max(1);
            (t, n as f64 * 1000.0 / span as f64)
        })
        .collect()
}

fn summary(r: &RunReport) -> String {
    let mut out = format!(
        "{} attempts, {} × 429, {} completed",
        r.attempts, r.rejected, r.completed
    );
    if let (Some(rate), Some(over)) = (r.achieved_rate, r.achieved_over_ms) {
        let _ = write!(out, ", {rate:.1}/s over the last {} s", over / 1000);
    }
    if let Some(rate) = r.final_rate {
        let _ = write!(out, ", final rate {rate:.1}/s");
    }
    for c in r.rate_changes.iter().flatten() {
        if let Some(ms) = c.settled_after_ms {
            let _ = write!(
                out,
                ", settled at {}/s {:.1} s after the change",
                c.rate_per_sec,
                ms as f64 / 1000.0
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::{Series, Shape};
    use allowance_testkit::{
        job::Mark,
        report::{RateTrace, Timeline},
        scenario::{Mode, Scenario},
        upstream::RateSchedule,
    };
    use std::time::Duration;

    fn report(attempts: Vec<Mark>, adaptive: Vec<(u64, f64)>) -> RunReport {
        let s = Scenario::seed(Mode::Shared);
        let timeline = Timeline::new(Mode::Shared, 8, attempts, Vec::new());
        let mut r = RunReport::new(&s, "virtual", "server", timeline, Duration::from_secs(10));
        r.rates = RateTrace {
            adaptive,
            upstream: Some(RateSchedule::new(20, &["5s:10".parse().expect("valid")])),
        };
        r
    }

    fn ok(at_ms: u64) -> Mark {
        Mark {
            worker: 0,
            at_ms,
            status: 200,
            retry_after_ms: None,
        }
    }

    #[test]
    fn achieved_counts_successes_around_each_point() {
        // 10/s for 10 s.
        let r = report((1..=100).map(|i| ok(i * 100)).collect(), Vec::new());
        let series = achieved_series(&r, 10_000);
        let at = |t: u64| series.iter().find(|(x, _)| *x == t).map(|(_, v)| *v);
        assert_eq!(at(5_000), Some(10.0));
        // At the start the window is cut to 0..=1 s: 10 answers in it, still 10/s.
        assert_eq!(at(0), Some(10.0));
        assert_eq!(at(200), Some(10.0));
    }

    #[test]
    fn draws_every_series_with_axes_and_a_clipped_start() {
        let mut attempts: Vec<Mark> = (1..=100).map(|i| ok(i * 100)).collect();
        attempts.push(Mark {
            status: 429,
            ..ok(2_050)
        });
        let r = report(attempts, vec![(0, 200.0), (5_000, 20.0), (10_000, 10.0)]);
        let chart = chart(&[("from 200/s", &r)]);
        let panel = &chart.panels[0];
        assert_eq!(panel.title, "from 200/s");
        let subtitle = panel.subtitle.as_deref().unwrap_or_default();
        assert!(subtitle.starts_with("101 attempts, 1 × 429"), "{subtitle}");
        // The upstream's step: 20/s until 5 s, then 10/s, to the run's end.
        let upstream = panel.series("upstream's true rate").map(|s| &s.shape);
        let steps = vec![(0.0, 20.0), (5_000.0, 10.0)];
        assert_eq!(
            upstream,
            Some(&Shape::Steps {
                points: steps,
                until: 10_000.0
            })
        );
        let adaptive = panel.series("adaptive rate (the allowance's)");
        assert_eq!(adaptive.map(Series::len), Some(3));
        // 0 to 10 s every 200 ms.
        let achieved = panel.series("achieved (2xx per s, 2 s window)");
        assert_eq!(achieved.map(Series::len), Some(51));
        let rejected = panel.series("a 429").map(|s| &s.shape);
        assert_eq!(rejected, Some(&Shape::Ticks(vec![2_050.0])));
        // One axis for all: twice the upstream's highest rate; 200/s is above it.
        assert_eq!(panel.y_ticks(), (40.0, 10.0));
        let note = panel.note.as_ref().map(|(n, _)| n.as_str());
        assert_eq!(note, Some("above the axis at first (up to 200/s)"));
        let svg = svg(&[("from 200/s", &r)]).expect("drawn");
        for text in [
            "seconds since the start",
            "requests per second",
            "from 200/s",
        ] {
            assert!(svg.contains(text), "{text}");
        }
    }
}
