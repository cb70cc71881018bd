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
//! let svg = timeline::svg(&[("shared", &report)]);
//! assert!(svg.starts_with("<svg"));
//! # Ok::<(), tower_allowance::BoxError>(())
//! ```

use std::fmt::Write as _;

use allowance_testkit::report::{RunReport, Timeline};

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

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// An SVG with one panel per `(title, report)`, stacked, on one time scale.
pub fn svg(runs: &[(&str, &RunReport)]) -> String {
    const LEFT: f64 = 76.0;
    const WIDTH: f64 = 760.0;
    const LANE: f64 = 18.0;
    const HEAD: f64 = 34.0;
    const GAP: f64 = 26.0;
    let end = runs
        .iter()
        .map(|(_, r)| r.timeline.end_ms())
        .max()
        .unwrap_or(0)
        .max(1);
    let end_f = end as f64;
    let x = |ms: u64| LEFT + ms.min(end) as f64 * WIDTH / end_f;
    let heights: Vec<f64> = runs
        .iter()
        .map(|(_, r)| HEAD + r.timeline.workers as f64 * LANE + GAP)
        .collect();
    let legend_h = 30.0;
    let total_h = legend_h + heights.iter().sum::<f64>() + 10.0;
    let total_w = LEFT + WIDTH + 24.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" viewBox="0 0 {total_w} {total_h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>
<g font-size="12">
<circle cx="{l}" cy="16" r="5" fill="#2e9e44"/><text x="{a}" y="20">200</text>
<circle cx="{b}" cy="16" r="5" fill="#d62728"/><text x="{c}" y="20">429</text>
<circle cx="{d}" cy="16" r="5" fill="#7f7f7f"/><text x="{e}" y="20">other / error</text>
<path d="M{f0},11 l10,10 M{f0},21 l10,-10" stroke="#000" stroke-width="2"/><text x="{g}" y="20">abandoned</text>
<rect x="{h}" y="10" width="18" height="12" fill="#f5b700" fill-opacity="0.3"/><text x="{i}" y="20">told to wait (Retry-After)</text>
<rect x="{j}" y="10" width="18" height="12" fill="#1f77b4" fill-opacity="0.2"/><text x="{k}" y="20">queued for the allowance</text>
</g>"##,
        l = LEFT + 5.0,
        a = LEFT + 14.0,
        b = LEFT + 60.0,
        c = LEFT + 69.0,
        d = LEFT + 115.0,
        e = LEFT + 124.0,
        f0 = LEFT + 215.0,
        g = LEFT + 231.0,
        h = LEFT + 310.0,
        i = LEFT + 333.0,
        j = LEFT + 500.0,
        k = LEFT + 523.0,
    );
    let step = [500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000]
        .into_iter()
        .find(|step| end / step <= 12)
        .unwrap_or(600_000);

    let mut top = legend_h;
    for ((title, r), h) in runs.iter().zip(&heights) {
        let t = &r.timeline;
        let lanes_top = top + HEAD;
        let lanes_h = t.workers as f64 * LANE;
        let summary = format!(
            "{title}: {} attempts, {} × 429, {} completed, {} abandoned, done at {} ms",
            r.attempts, r.rejected, r.completed, r.abandoned, r.makespan_ms
        );
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="{}" font-weight="bold" font-size="13">{}</text>"#,
            top + 16.0,
            escape(&summary)
        );
        for i in 0..t.workers {
            let y = lanes_top + i as f64 * LANE;
            let fill = if i % 2 == 0 { "#f4f6f8" } else { "#ffffff" };
            let _ = writeln!(
                s,
                r##"<rect x="{LEFT}" y="{y}" width="{WIDTH}" height="{LANE}" fill="{fill}"/><text x="{}" y="{}" text-anchor="end" fill="#444">worker {i}</text>"##,
                LEFT - 6.0,
                y + 13.0
            );
        }
        for w in &t.cooldowns {
            for &worker in &w.workers {
                let y = lanes_top + f64::from(worker) * LANE;
                let _ = writeln!(
                    s,
                    r##"<rect x="{:.1}" y="{y}" width="{:.1}" height="{LANE}" fill="#f5b700" fill-opacity="0.22"/>"##,
                    x(w.from_ms),
                    (x(w.to_ms) - x(w.from_ms)).max(1.0)
                );
            }
        }
        for w in t.queued() {
            for &worker in &w.workers {
                let y = lanes_top + f64::from(worker) * LANE + 4.0;
                let _ = writeln!(
                    s,
                    r##"<rect x="{:.1}" y="{y}" width="{:.1}" height="{}" fill="#1f77b4" fill-opacity="0.2"/>"##,
                    x(w.from_ms),
                    (x(w.to_ms) - x(w.from_ms)).max(1.0),
                    LANE - 8.0
                );
            }
        }
        // Time axis under the lanes.
        let axis_y = lanes_top + lanes_h;
        let mut tick = 0;
        while tick <= end {
            let tx = x(tick);
            let _ = writeln!(
                s,
                r##"<line x1="{tx:.1}" y1="{lanes_top}" x2="{tx:.1}" y2="{:.1}" stroke="#ccc" stroke-width="0.5"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#666" font-size="10">{}s</text>"##,
                axis_y + 3.0,
                axis_y + 14.0,
                format_secs(tick)
            );
            tick += step;
        }
        for m in &t.attempts {
            let fill = match m.status {
                200..=299 => "#2e9e44",
                429 => "#d62728",
                _ => "#7f7f7f",
            };
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4.5" fill="{fill}" fill-opacity="0.85"><title>worker {} at {} ms: {}</title></circle>"#,
                x(m.at_ms),
                lanes_top + f64::from(m.worker) * LANE + LANE / 2.0,
                m.worker,
                m.at_ms,
                m.status
            );
        }
        for e in t.ends.iter().filter(|e| e.is_abandoned()) {
            let cx = x(e.at_ms);
            let cy = lanes_top + f64::from(e.worker) * LANE + LANE / 2.0;
            let _ = writeln!(
                s,
                r##"<path d="M{:.1},{:.1} l10,10 M{:.1},{:.1} l10,-10" stroke="#000" stroke-width="2"><title>abandoned: {}</title></path>"##,
                cx - 5.0,
                cy - 5.0,
                cx - 5.0,
                cy + 5.0,
                e.outcome
            );
        }
        top += h;
    }
    s.push_str("</svg>\n");
    s
}

fn format_secs(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        (ms / 1000).to_string()
    } else {
        format!("{:.1}", ms as f64 / 1000.0)
    }
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
