//! The scale-out curve (issue 15): one allowance on Redis shared by P processes, 32 workers
//! in total, 200 jobs, bursts of 4 at 20/s, for each P:
//!
//! ```text
//! allowance-sim run --real --mode shared --redis URL --processes P --workers 32 --jobs 200 \
//!     --burst 4 --rate 20 --retry-after 1 --max-attempts 10 --json
//! ```
//!
//! against a private `redis-server` whose statistics are reset before each run. Reported per
//! run: store calls per admission (the workers' own count, `store_calls`, and the server's,
//! script calls from `INFO commandstats`), the server's microseconds per admission (`usec`
//! of the script commands), 429s, the makespan against the minimum, and the load average.
//! Prints a Markdown table; with `--svg FILE` also draws calls per admission against P,
//! before (the figures in issue 15) and after.
//!
//! ```text
//! cargo build --release -p allowance-sim
//! cargo run --release -p allowance-sim --example scale_out -- --svg docs/scale-out.svg
//! ```
//!
//! `--bin PATH` names the `allowance-sim` binary (default: the one next to this example's
//! directory, `target/release/allowance-sim`); `--processes 1,2,4` the Ps; `--runs N` the
//! runs per P (the table shows each).

use std::{fmt::Write as _, path::PathBuf, process::Command};

use clap::Parser;
use serde_json::Value;
use tower_allowance::BoxError;
use tower_allowance_redis::test_util::TestRedis;

/// Calls per admission before reservations, from issue 15 (`INFO commandstats`, the same run).
const BEFORE: [(u32, f64); 4] = [(1, 1.14), (4, 3.2), (8, 6.3), (16, 10.6)];

#[derive(Debug, Parser)]
struct Args {
    /// The Ps to run.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    processes: Vec<u32>,
    /// Runs per P.
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// The `allowance-sim` binary.
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Draw the chart to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// One run's figures.
#[derive(Clone, Debug)]
struct Row {
    processes: u32,
    admissions: u64,
    store_calls: u64,
    script_calls: u64,
    script_usec: u64,
    completed: u64,
    rejected: u64,
    makespan_ms: u64,
    min_makespan_ms: u64,
    load: String,
}

impl Row {
    fn calls_per_admission(&self) -> f64 {
        self.script_calls as f64 / self.admissions.max(1) as f64
    }
}

/// `(calls, usec)` of the script commands since the last `CONFIG RESETSTAT`.
async fn script_stats(redis: &TestRedis) -> (u64, u64) {
    let info = redis.command(&["INFO", "commandstats"]).await;
    let mut total = (0, 0);
    for line in info.lines() {
        let Some(rest) = ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"]
            .iter()
            .find_map(|p| line.strip_prefix(p))
        else {
            continue;
        };
        for field in rest.split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => total.0 += v.parse::<u64>().unwrap_or(0),
                Some(("usec", v)) => total.1 += v.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

/// The 1-minute load average, as `uptime` shows it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn run_once(bin: &PathBuf, url: &str, processes: u32) -> Result<Value, BoxError> {
    let out = Command::new(bin)
        .args(["run", "--real", "--mode", "shared", "--redis", url])
        .args(["--processes", &processes.to_string()])
        .args([
            "--workers",
            "32",
            "--jobs",
            "200",
            "--burst",
            "4",
            "--rate",
            "20",
        ])
        .args(["--retry-after", "1", "--max-attempts", "10", "--json"])
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "P={processes}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let bin = match args.bin {
        Some(bin) => bin,
        None => std::env::current_exe()?
            .parent()
            .and_then(|examples| examples.parent())
            .ok_or("no directory for the binary")?
            .join("allowance-sim"),
    };
    let redis = TestRedis::start_private().await;
    let mut rows = Vec::new();
    for &p in &args.processes {
        for _ in 0..args.runs {
            assert_eq!(redis.command(&["CONFIG", "RESETSTAT"]).await.trim(), "+OK");
            let load = load();
            let report = run_once(&bin, redis.url(), p)?;
            let (script_calls, script_usec) = script_stats(&redis).await;
            let row = Row {
                processes: p,
                admissions: num(&report, "admissions"),
                store_calls: num(&report, "store_calls"),
                script_calls,
                script_usec,
                completed: num(&report, "completed"),
                rejected: num(&report, "rejected"),
                makespan_ms: num(&report, "makespan_ms"),
                min_makespan_ms: num(&report, "min_makespan_ms"),
                load,
            };
            eprintln!("{row:?}");
            rows.push(row);
        }
    }
    println!("{}", table(&rows));
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&rows))?;
    }
    Ok(())
}

fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| P | admissions | store calls (workers) | script calls (Redis) | calls / admission | before | Redis µs / admission | 429s | makespan ms (minimum) | load |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let before = BEFORE
            .iter()
            .find(|(p, _)| *p == r.processes)
            .map_or("–".to_owned(), |(_, b)| format!("{b:.2}"));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {before} | {:.1} | {} | {} (+{}) ({}) | {} |",
            r.processes,
            r.admissions,
            r.store_calls,
            r.script_calls,
            r.calls_per_admission(),
            r.script_usec as f64 / r.admissions.max(1) as f64,
            r.rejected,
            r.makespan_ms,
            r.makespan_ms.saturating_sub(r.min_makespan_ms),
            r.min_makespan_ms,
            r.load,
        );
        if r.completed != 200 {
            let _ = writeln!(
                s,
                "| | (only {} of 200 jobs completed) | | | | | | | | |",
                r.completed
            );
        }
    }
    s
}

/// Calls per admission against P (log scale), before and after.
fn svg(rows: &[Row]) -> String {
    const W: f64 = 640.0;
    const H: f64 = 400.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 40.0;
    const TOP: f64 = 50.0;
    const BOTTOM: f64 = 70.0;
    const Y_MAX: f64 = 12.0;
    let max_p = rows
        .iter()
        .map(|r| r.processes)
        .chain(BEFORE.iter().map(|(p, _)| *p))
        .max()
        .unwrap_or(1)
        .max(2);
    let log_max = f64::from(max_p).log2();
    let x = |p: u32| LEFT + f64::from(p).log2() / log_max * (W - LEFT - RIGHT);
    let y = |v: f64| TOP + (1.0 - v / Y_MAX) * (H - TOP - BOTTOM);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(
        s,
        r##"<text x="{LEFT}" y="22" font-weight="bold" font-size="14">Redis calls per admission, one allowance shared by P processes</text><text x="{LEFT}" y="38" fill="#555">32 workers in total, 200 jobs, bursts of 4 at 20/s; script calls from INFO commandstats</text>"##
    );
    // Axes, grid and ticks.
    let (x0, x1, y0, y1) = (LEFT, W - RIGHT, y(0.0), y(Y_MAX));
    for v in (0..=12).step_by(2) {
        let yy = y(f64::from(v));
        let _ = write!(
            s,
            r##"<line x1="{x0}" y1="{yy:.1}" x2="{x1}" y2="{yy:.1}" stroke="#e5e5e5"/><line x1="{:.1}" y1="{yy:.1}" x2="{x0}" y2="{yy:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"##,
            x0 - 5.0,
            x0 - 8.0,
            yy + 4.0
        );
    }
    let mut p = 1;
    while p <= max_p {
        let xx = x(p);
        let _ = write!(
            s,
            r##"<line x1="{xx:.1}" y1="{y0:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#333"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{p}</text>"##,
            y0 + 5.0,
            y0 + 19.0
        );
        p *= 2;
    }
    let _ = write!(
        s,
        r##"<line x1="{x0}" y1="{y0:.1}" x2="{x1}" y2="{y0:.1}" stroke="#333"/><line x1="{x0}" y1="{y0:.1}" x2="{x0}" y2="{y1:.1}" stroke="#333"/>"##
    );
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">processes sharing the allowance (P, log scale)</text>"#,
        (x0 + x1) / 2.0,
        y0 + 40.0
    );
    let _ = write!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">script calls per admission</text>"#,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0
    );
    // The series: before (issue 15) and after (the mean of this run's rows per P).
    let mut after: Vec<(u32, f64)> = Vec::new();
    for r in rows {
        if !after.iter().any(|(p, _)| *p == r.processes) {
            let of_p: Vec<f64> = rows
                .iter()
                .filter(|o| o.processes == r.processes)
                .map(Row::calls_per_admission)
                .collect();
            after.push((r.processes, of_p.iter().sum::<f64>() / of_p.len() as f64));
        }
    }
    // Labels above the points before, below them after (the curves meet at P = 1).
    for (points, colour, dash, label_dy) in [
        (&BEFORE[..], "#c0392b", r#" stroke-dasharray="6 4""#, -9.0),
        (&after[..], "#1f77b4", "", 18.0),
    ] {
        let path: Vec<String> = points
            .iter()
            .map(|(p, v)| format!("{:.1},{:.1}", x(*p), y(*v)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
            path.join(" ")
        );
        for (p, v) in points {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{colour}"/><text x="{:.1}" y="{:.1}" fill="{colour}" text-anchor="middle">{v:.2}</text>"#,
                x(*p),
                y(*v),
                x(*p),
                y(*v) + label_dy
            );
        }
    }
    // Legend.
    let (lx, ly) = (LEFT + 16.0, TOP + 14.0);
    let _ = write!(
        s,
        r##"<rect x="{:.1}" y="{:.1}" width="300" height="46" fill="white" stroke="#ccc"/><line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="#c0392b" stroke-width="2" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}">before: polling (issue 15's figures)</text><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#1f77b4" stroke-width="2"/><text x="{:.1}" y="{:.1}">after: reservations (measured)</text>"##,
        lx - 8.0,
        ly - 14.0,
        lx,
        lx + 30.0,
        lx + 38.0,
        ly + 4.0,
        lx,
        ly + 20.0,
        lx + 30.0,
        ly + 20.0,
        lx + 38.0,
        ly + 24.0
    );
    s.push_str("</svg>\n");
    s
}
