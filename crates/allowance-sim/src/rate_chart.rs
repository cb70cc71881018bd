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
//! let svg = rate_chart::svg(&[("from 1/s", &report)]);
//! assert!(svg.starts_with("<svg") && svg.contains("requests per second"));
//! # Ok::<(), tower_allowance::BoxError>(())
//! ```

use std::fmt::Write as _;

use allowance_testkit::report::RunReport;

use crate::sweep::axis_ticks;

const LEFT: f64 = 70.0;
const WIDTH: f64 = 740.0;
const PANEL_H: f64 = 170.0;
const HEAD: f64 = 40.0;
const FOOT: f64 = 40.0;
const LEGEND_H: f64 = 30.0;

const UPSTREAM: &str = "#555555";
const ADAPTIVE: &str = "#1f77b4";
const ACHIEVED: &str = "#2e9e44";
const REJECTED: &str = "#d62728";

/// The window the achieved rate is counted over, centred on each point (2 s).
pub const ACHIEVED_WINDOW_MS: u64 = 2_000;

/// The chart of `runs`, one panel per `(title, report)`.
pub fn svg(runs: &[(&str, &RunReport)]) -> String {
    let end = runs
        .iter()
        .map(|(_, r)| end_ms(r))
        .max()
        .unwrap_or(0)
        .max(1);
    let x = |ms: u64| LEFT + ms.min(end) as f64 * WIDTH / end as f64;
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
    let (axis_top, step) = axis_ticks(top_rate);
    let panel_total = HEAD + PANEL_H + FOOT;
    let width = LEFT + WIDTH + 30.0;
    let height = LEGEND_H + panel_total * runs.len() as f64 + 10.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>
<g font-size="12">
<line x1="{a0}" y1="16" x2="{a1}" y2="16" stroke="{UPSTREAM}" stroke-width="3"/><text x="{a2}" y="20">upstream's true rate</text>
<line x1="{b0}" y1="16" x2="{b1}" y2="16" stroke="{ADAPTIVE}" stroke-width="2"/><text x="{b2}" y="20">adaptive rate (the allowance's)</text>
<line x1="{c0}" y1="16" x2="{c1}" y2="16" stroke="{ACHIEVED}" stroke-width="1.5"/><text x="{c2}" y="20">achieved (2xx per s, 2 s window)</text>
<line x1="{d0}" y1="10" x2="{d0}" y2="22" stroke="{REJECTED}" stroke-width="1.5"/><text x="{d2}" y="20">a 429</text>
</g>"##,
        a0 = LEFT,
        a1 = LEFT + 22.0,
        a2 = LEFT + 28.0,
        b0 = LEFT + 165.0,
        b1 = LEFT + 187.0,
        b2 = LEFT + 193.0,
        c0 = LEFT + 385.0,
        c1 = LEFT + 407.0,
        c2 = LEFT + 413.0,
        d0 = LEFT + 630.0,
        d2 = LEFT + 638.0,
    );
    let tick_ms = [1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 300_000]
        .into_iter()
        .find(|t| end / t <= 12)
        .unwrap_or(600_000);

    for (i, (title, r)) in runs.iter().enumerate() {
        let top = LEGEND_H + panel_total * i as f64 + HEAD;
        let base = top + PANEL_H;
        let y = |v: f64| base - PANEL_H * v.clamp(0.0, axis_top) / axis_top;
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="{:.1}" font-weight="bold" font-size="13">{}</text><text x="{LEFT}" y="{:.1}" fill="#444" font-size="11">{}</text>"##,
            top - 22.0,
            escape(title),
            top - 8.0,
            escape(&summary(r))
        );
        // Rate gridlines, ticks and labels.
        let steps = (axis_top / step).round() as usize;
        for k in 0..=steps {
            let v = step * k as f64;
            let ty = y(v);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#e4e4e4"/><line x1="{:.1}" y1="{ty:.1}" x2="{LEFT}" y2="{ty:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{}</text>"##,
                LEFT + WIDTH,
                LEFT - 4.0,
                LEFT - 6.0,
                ty + 4.0,
                fmt_rate(v)
            );
        }
        // Time ticks and labels.
        let mut t = 0;
        while t <= end {
            let tx = x(t);
            let _ = writeln!(
                s,
                r##"<line x1="{tx:.1}" y1="{base:.1}" x2="{tx:.1}" y2="{:.1}" stroke="#333"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#444" font-size="11">{}</text>"##,
                base + 4.0,
                base + 16.0,
                t / 1000
            );
            t += tick_ms;
        }
        // Axes and their titles.
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{top:.1}" x2="{LEFT}" y2="{base:.1}" stroke="#333"/><line x1="{LEFT}" y1="{base:.1}" x2="{:.1}" y2="{base:.1}" stroke="#333"/><text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle" fill="#444" font-size="11">requests per second</text><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#444" font-size="11">seconds since the start</text>"##,
            LEFT + WIDTH,
            LEFT - 40.0,
            (top + base) / 2.0,
            LEFT + WIDTH / 2.0,
            base + 30.0
        );
        // The 429s, as ticks just above the time axis.
        for m in r.timeline.attempts.iter().filter(|m| m.status == 429) {
            let tx = x(m.at_ms);
            let _ = writeln!(
                s,
                r#"<line x1="{tx:.1}" y1="{:.1}" x2="{tx:.1}" y2="{:.1}" stroke="{REJECTED}" stroke-width="1"/>"#,
                base - 10.0,
                base
            );
        }
        // The upstream's rate: a step line, to the run's own end.
        let run_end = end_ms(r).max(1);
        if let Some(up) = &r.rates.upstream {
            let mut d = format!("M{:.1},{:.1}", x(0), y(f64::from(up.initial())));
            for c in up.changes() {
                let at = u64::try_from(c.at.as_millis()).unwrap_or(u64::MAX);
                if at > run_end {
                    break;
                }
                let _ = write!(d, " H{:.1} V{:.1}", x(at), y(f64::from(c.rate_per_sec)));
            }
            let _ = write!(d, " H{:.1}", x(run_end));
            let _ = writeln!(
                s,
                r#"<path d="{d}" fill="none" stroke="{UPSTREAM}" stroke-width="3" stroke-opacity="0.8"/>"#
            );
        }
        let achieved = achieved_series(r, end);
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{ACHIEVED}" stroke-width="1.5"/>"#,
            points(&achieved, &x, &y)
        );
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{ADAPTIVE}" stroke-width="2"/>"#,
            points(&r.rates.adaptive, &x, &y)
        );
        let above: Vec<f64> = r
            .rates
            .adaptive
            .iter()
            .map(|(_, v)| *v)
            .filter(|v| *v > axis_top)
            .collect();
        if let Some(most) = above.iter().copied().reduce(f64::max) {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="{ADAPTIVE}" font-size="11">above the axis at first (up to {}/s)</text>"#,
                LEFT + WIDTH - 4.0,
                top + 12.0,
                fmt_rate(most)
            );
        }
    }
    s.push_str("</svg>\n");
    s
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

fn points(series: &[(u64, f64)], x: &impl Fn(u64) -> f64, y: &impl Fn(f64) -> f64) -> String {
    let mut out = String::new();
    for (t, v) in series {
        let _ = write!(out, "{:.1},{:.1} ", x(*t), y(*v));
    }
    out.trim_end().to_owned()
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

fn fmt_rate(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let svg = svg(&[("from 200/s", &r)]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        // The upstream's step: 20/s until 5 s, then 10/s.
        assert!(svg.contains(" H"), "{svg}");
        assert_eq!(
            svg.matches(&format!("stroke=\"{REJECTED}\" stroke-width=\"1\""))
                .count(),
            1
        );
        assert!(svg.contains("above the axis at first (up to 200/s)"));
        assert!(svg.contains("seconds since the start"));
        assert!(svg.contains(">from 200/s<"));
        assert!(svg.contains("101 attempts, 1 × 429"));
    }
}
