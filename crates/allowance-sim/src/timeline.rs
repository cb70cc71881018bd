//! Pictures of runs: a compact ASCII timeline for the terminal and an SVG for people.
//!
//! One lane per worker; a mark per attempt (`o` / green for 2xx, `x` / red for 429, `!` /
//! grey for anything else), an `A` / black cross where a job was abandoned, and the cooldown
//! windows (a 429's `Retry-After`) shaded: `-` in ASCII, amber in SVG; time spent queued for
//! the shared allowance before a job's first attempt is `.` in ASCII, blue in SVG. In ASCII,
//! a cell where several attempts of one lane fall shows their number (`2`–`9`, `+` for ten
//! or more) instead of one mark.
//!
//! ```
//! use allowance_sim::timeline;
//! use allowance_testkit::{report::RunReport, scenario::{run_virtual, Mode, Scenario}};
//!
//! let s = Scenario::seed(Mode::Shared);
//! let report = RunReport::from_virtual(&s, &run_virtual(&s)?);
//! let ascii = timeline::ascii(&report.timeline, 0, 40);
//! assert_eq!(ascii.lines().filter(|l| l.starts_with("w")).count(), 8);
//! assert!(!ascii.contains('x')); // no 429s
//! let chart = timeline::chart(&[("shared", &report)]);
//! assert_eq!(chart.panels[0].series("200").map(|s| s.len()), Some(8)); // a dot per attempt
//! assert!(timeline::svg(&[("shared", &report)])?.starts_with("<svg"));
//! # Ok::<(), tower_allowance::BoxError>(())
//! ```

use std::fmt::Write as _;

use allowance_testkit::report::{RunReport, Timeline, Window};
use tower_allowance::BoxError;

use crate::chart::{Chart, Colour, Panel, Series, Span, XAxis};

/// Legend for [`ascii`].
pub const ASCII_LEGEND: &str = "o 200   x 429   ! other/error   A abandoned   - told to wait (Retry-After)   . queued for the allowance\n2-9 that many attempts in one cell (+ for ten or more), whatever their statuses";

/// The mark for `n` attempts sharing a cell: their number, `+` beyond nine.
fn count_glyph(n: u32) -> char {
    char::from_digit(n, 10).filter(|_| n <= 9).unwrap_or('+')
}

fn glyph_rank(c: char) -> u8 {
    match c {
        'A' => 5,
        'x' => 4,
        '!' => 3,
        'o' => 2,
        '-' | '.' => 1,
        _ => 0,
    }
}

fn status_glyph(status: u16) -> char {
    match status {
        200..=299 => 'o',
        429 => 'x',
        _ => '!',
    }
}

/// Draws `timeline` in `cols` columns (at least 10) spanning `0..=end_ms` (the timeline's own
/// end when `end_ms` is 0, so several runs can share one scale).
pub fn ascii(timeline: &Timeline, end_ms: u64, cols: usize) -> String {
    let cols = cols.max(10);
    let end = if end_ms == 0 {
        timeline.end_ms().max(1)
    } else {
        end_ms
    };
    let last = u64::try_from(cols - 1).unwrap_or(u64::MAX);
    let col = |ms: u64| usize::try_from(ms.min(end) * last / end).unwrap_or(cols - 1);
    let mut lanes = vec![vec![' '; cols]; timeline.workers];
    let mut put = |worker: u32, c: usize, glyph: char| {
        if let Some(cell) = lanes
            .get_mut(worker as usize)
            .and_then(|lane| lane.get_mut(c))
        {
            if glyph_rank(glyph) > glyph_rank(*cell) {
                *cell = glyph;
            }
        }
    };
    for w in &timeline.cooldowns {
        for &worker in &w.workers {
            for c in col(w.from_ms)..=col(w.to_ms) {
                put(worker, c, '-');
            }
        }
    }
    for w in timeline.queued() {
        for &worker in &w.workers {
            for c in col(w.from_ms)..=col(w.to_ms) {
                put(worker, c, '.');
            }
        }
    }
    let mut counts = vec![vec![0u32; cols]; timeline.workers];
    for m in &timeline.attempts {
        let c = col(m.at_ms);
        put(m.worker, c, status_glyph(m.status));
        if let Some(n) = counts
            .get_mut(m.worker as usize)
            .and_then(|lane| lane.get_mut(c))
        {
            *n += 1;
        }
    }
    for (lane, counts) in lanes.iter_mut().zip(&counts) {
        for (cell, &n) in lane.iter_mut().zip(counts) {
            if n > 1 {
                *cell = count_glyph(n);
            }
        }
    }
    // An abandonment is shown over everything, the count included: the job's last attempt
    // usually shares its cell.
    for e in timeline.ends.iter().filter(|e| e.is_abandoned()) {
        if let Some(cell) = lanes
            .get_mut(e.worker as usize)
            .and_then(|lane| lane.get_mut(col(e.at_ms)))
        {
            *cell = 'A';
        }
    }

    let mut out = String::new();
    // A tick per second (or per 2, 5, 10, ... seconds when long).
    let step = [
        1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000, 600_000,
    ]
    .into_iter()
    .find(|step| end / step <= 10)
    .unwrap_or(3_600_000);
    let mut axis = vec![' '; cols];
    let mut labels = vec![' '; cols + 8];
    let mut t = 0;
    while t <= end {
        let c = col(t);
        axis[c] = '|';
        for (i, ch) in format!("{}s", t / 1000).chars().enumerate() {
            if let Some(cell) = labels.get_mut(c + i) {
                *cell = ch;
            }
        }
        t += step;
    }
    let _ = writeln!(
        out,
        "{:<6}{}",
        "",
        labels.iter().collect::<String>().trim_end()
    );
    let _ = writeln!(out, "{:<6}{}", "", axis.iter().collect::<String>());
    for (i, lane) in lanes.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:<6}{}",
            format!("w{i}"),
            lane.iter().collect::<String>().trim_end()
        );
    }
    out
}

/// The chart of `runs`: one panel per `(title, report)`, stacked, on one time scale; one
/// lane per worker.
pub fn chart(runs: &[(&str, &RunReport)]) -> Chart {
    let end = runs.iter().map(|(_, r)| r.timeline.end_ms()).max();
    let mut chart = Chart::new(XAxis::time(end.unwrap_or(0)));
    for (title, r) in runs {
        let t = &r.timeline;
        let lanes = (0..t.workers).map(|i| format!("worker {i}")).collect();
        let mut panel = Panel::lanes(lanes).title(format!(
            "{title}: {} attempts, {} × 429, {} completed, {} abandoned, done at {} ms",
            r.attempts, r.rejected, r.completed, r.abandoned, r.makespan_ms
        ));
        let told = spans(&t.cooldowns);
        panel.push(Series::spans("told to wait (Retry-After)", Colour::AMBER, told).opacity(0.22));
        let queued = Series::spans("queued for the allowance", Colour::BLUE, spans(&t.queued()));
        panel.push(queued.size(4));
        // A dot per attempt, one series per status class (`status_glyph`'s three).
        let classes = [
            ("200", Colour::GREEN, 'o'),
            ("429", Colour::RED, 'x'),
            ("other / error", Colour::GREY, '!'),
        ];
        for (label, colour, glyph) in classes {
            let marks = t
                .attempts
                .iter()
                .filter(|m| status_glyph(m.status) == glyph);
            let dots = marks.map(|m| (ms(m.at_ms), f64::from(m.worker))).collect();
            panel.push(Series::dots(label, colour, dots).opacity(0.85));
        }
        let ends = t.ends.iter().filter(|e| e.is_abandoned());
        let crosses = ends.map(|e| (ms(e.at_ms), f64::from(e.worker))).collect();
        panel.push(Series::crosses("abandoned", Colour::BLACK, crosses));
        chart = chart.panel(panel);
    }
    chart
}

/// A span in each lane of a window.
fn spans(windows: &[Window]) -> Vec<Span> {
    let lanes = |w: &Window| -> Vec<Span> {
        let lane = |k: &u32| Span::in_lane(ms(w.from_ms), ms(w.to_ms), *k as usize);
        w.workers.iter().map(lane).collect()
    };
    windows.iter().flat_map(lanes).collect()
}

fn ms(ms: u64) -> f64 {
    ms as f64
}

/// [`chart`] as an SVG document.
///
/// # Errors
///
/// As [`Chart::svg`].
pub fn svg(runs: &[(&str, &RunReport)]) -> Result<String, BoxError> {
    chart(runs).svg()
}

#[cfg(test)]
mod tests {
    use super::*;
    use allowance_testkit::{
        job::{JobEnd, Mark},
        scenario::Mode,
    };

    #[test]
    fn ascii_marks_by_outcome_and_shades_cooldowns() {
        let attempts = vec![
            Mark {
                worker: 0,
                at_ms: 0,
                status: 200,
                retry_after_ms: None,
            },
            Mark {
                worker: 1,
                at_ms: 0,
                status: 429,
                retry_after_ms: Some(1000),
            },
            Mark {
                worker: 1,
                at_ms: 1000,
                status: 429,
                retry_after_ms: Some(1000),
            },
        ];
        let ends = vec![JobEnd {
            worker: 1,
            started_ms: 0,
            at_ms: 1000,
            outcome: "max_attempts",
            failure: None,
            job: None,
            first_attempt_ms: None,
        }];
        let t = Timeline::new(Mode::Naive, 2, attempts, ends);
        let out = ascii(&t, 2000, 21);
        let lanes: Vec<&str> = out.lines().skip(2).collect();
        assert_eq!(lanes[0], "w0    o");
        // x at 0, shaded to 1 s where it was abandoned, shaded again to 2 s.
        assert_eq!(lanes[1], "w1    x---------A----------");
    }

    fn mark(worker: u32, at_ms: u64, status: u16) -> Mark {
        Mark {
            worker,
            at_ms,
            status,
            retry_after_ms: None,
        }
    }

    #[test]
    fn ascii_counts_attempts_sharing_a_cell() {
        // 10 columns over 0..=900 ms: 100 ms per cell.
        let mut attempts = vec![mark(0, 0, 200), mark(0, 10, 429), mark(0, 20, 200)];
        attempts.extend((0..12).map(|i| mark(1, 500 + i, 429)));
        attempts.extend([mark(1, 900, 200), mark(2, 300, 200), mark(2, 330, 503)]);
        let t = Timeline::new(Mode::Shared, 3, attempts, Vec::new());
        let out = ascii(&t, 900, 10);
        let lanes: Vec<&str> = out.lines().skip(2).collect();
        assert_eq!(lanes[0], "w0    3");
        assert_eq!(lanes[1], "w1         +   o");
        assert_eq!(lanes[2], "w2       2");
        assert!(ASCII_LEGEND.contains("2-9 that many attempts in one cell"));
    }
}
