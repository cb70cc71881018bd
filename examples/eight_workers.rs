//! Eight workers, one API key: the problem and the fix, over real sockets.
//!
//! Starts a throttling HTTP upstream on loopback (per key: bursts of 2, 2 requests/s, and
//! `429` with `Retry-After: 1` beyond that), then runs eight jobs with eight workers twice,
//! in real time:
//!
//! - **naive**: each worker honours `Retry-After` on its own (a `tower::retry::Retry` with
//!   the library's `RetryPolicy`, nothing shared);
//! - **shared**: all eight go through one `AllowanceLayer` over one `Allowance`.
//!
//! It prints the two runs side by side as the *server* counted them, an ASCII timeline of
//! each, the seed article's table (its scenarios as it runs them, in virtual time, exact:
//! the same text as `allowance-sim seed` and the README), and writes `eight_workers.svg`.
//!
//! ```text
//! cargo run --example eight_workers               # tables, timelines, eight_workers.svg
//! cargo run --example eight_workers -- --json     # the rows as a JSON array
//! cargo run --example eight_workers -- --svg docs/eight_workers.svg
//! cargo run --example eight_workers -- --help     # this, and nothing run
//! ```

use allowance_sim::{live, timeline};
use allowance_testkit::{
    report::RunReport,
    scenario::{seed_table, seed_table_text, Mode, Scenario},
};
use serde_json::{json, Value};

/// `--help` output.
pub(crate) const USAGE: &str = "\
Eight workers share one API key: naive vs one shared allowance, over real HTTP (about 6 s).

Usage: cargo run --example eight_workers [-- OPTIONS]

Options:
  --json        print the rows (real runs and the seed article's table) as a JSON array
  --svg PATH    write the timeline picture to PATH (default: eight_workers.svg)
  -h, --help    print this help and run nothing
";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Args {
    /// Print [`USAGE`] and stop.
    Help,
    /// Run both scenarios.
    Run {
        /// JSON rows instead of tables.
        json: bool,
        /// Where the SVG goes.
        svg_path: String,
    },
}

/// Parses the arguments after the program name.
pub(crate) fn parse_args(args: &[String]) -> Result<Args, String> {
    let (mut json, mut svg_path) = (false, "eight_workers.svg".to_owned());
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Args::Help),
            "--json" => json = true,
            "--svg" => {
                svg_path = args
                    .next()
                    .ok_or("--svg needs a path, e.g. --svg docs/eight_workers.svg")?
                    .clone();
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args::Run { json, svg_path })
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (json_out, svg_path) = match parse_args(&args) {
        Ok(Args::Help) => {
            print!("{USAGE}");
            return Ok(());
        }
        Ok(Args::Run { json, svg_path }) => (json, svg_path),
        Err(e) => {
            eprint!("eight_workers: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };

    if !json_out {
        println!("Eight workers share one API key. The upstream is a real HTTP server on loopback");
        println!(
            "allowing, per key, bursts of 2 and 2 requests/s; beyond that it answers 429 with"
        );
        println!("Retry-After: 1. Eight jobs, one request each, run twice (about 3 s each)...\n");
    }
    let rt = tokio::runtime::Runtime::new()?;
    let naive = rt.block_on(live::run_real(&Scenario::seed(Mode::Naive), None))?;
    let shared = rt.block_on(live::run_real(&Scenario::seed(Mode::Shared), None))?;
    // The seed article's table runs on its own paused-clock runtime.
    let seed = seed_table();

    let svg = timeline::svg(&[
        ("naive: each worker retries alone", &naive),
        ("shared: one allowance", &shared),
    ])?;
    std::fs::write(&svg_path, svg)?;

    if json_out {
        let mut rows: Vec<Value> = vec![
            real_row("naive: each worker retries alone (real HTTP)", &naive),
            real_row("shared: one allowance (real HTTP)", &shared),
        ];
        rows.extend(seed.iter().map(|r| {
            json!({
                "scenario": r.scenario,
                "clock": "virtual",
                "attempts": r.attempts,
                "rejected": r.rejected,
                "completed": r.completed,
                "abandoned": r.abandoned,
                "last_attempt_ms": r.last_attempt_ms,
            })
        }));
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }

    println!(
        "{:<34} {:>14} {:>14}",
        "as the server counted", "naive", "shared"
    );
    let side = |label: &str, f: fn(&RunReport) -> String| {
        println!("{:<34} {:>14} {:>14}", label, f(&naive), f(&shared));
    };
    side("attempts", |r| r.attempts.to_string());
    side("429s", |r| r.rejected.to_string());
    side("jobs completed", |r| r.completed.to_string());
    side("jobs abandoned", |r| r.abandoned.to_string());
    side("last job done (ms)", |r| r.makespan_ms.to_string());
    side("theoretical minimum (ms)", |r| {
        r.min_makespan_ms.to_string()
    });
    side("2xx per second after the burst", |r| {
        format!("{:.2}", r.achieved_rate_per_sec)
    });

    let end = naive.timeline.end_ms().max(shared.timeline.end_ms());
    println!("\nnaive: each worker honours Retry-After on its own");
    print!("{}", timeline::ascii(&naive.timeline, end, 64));
    println!("\nshared: one allowance admits every attempt, first tries and retries alike");
    print!("{}", timeline::ascii(&shared.timeline, end, 64));
    println!("\n{}", timeline::ASCII_LEGEND);

    println!(
        "\nEvery naive worker did the polite thing, and the server still saw {} attempts and {} 429s",
        naive.attempts, naive.rejected
    );
    println!("for 8 jobs: one worker waiting does not make the other seven wait, and workers told");
    println!("to wait the same second wake up together and collide again.");
    println!(
        "One shared allowance sent {} attempts, {} rejected, and finished in {} ms, against a",
        shared.attempts, shared.rejected, shared.makespan_ms
    );
    println!(
        "theoretical minimum of {} ms: no faster than the limit allows, and no slower.",
        shared.min_makespan_ms
    );

    println!(
        "\nThe seed article's table, run as the seed runs it, in virtual time (exact, instant):"
    );
    println!("rows 1, 4a and 4b with the retry layer alone (no gate), 2 and 3 through one and two");
    println!("allowances; 4a and 4b against an upstream that always answers 429.\n");
    print!("{}", seed_table_text(&seed));
    println!("\nTimeline picture written to {svg_path}");
    Ok(())
}

fn real_row(scenario: &str, r: &RunReport) -> Value {
    json!({
        "scenario": scenario,
        "clock": "real",
        "attempts": r.attempts,
        "rejected": r.rejected,
        "completed": r.completed,
        "abandoned": r.abandoned,
        "last_attempt_ms": r.last_attempt_ms,
        "makespan_ms": r.makespan_ms,
        "min_makespan_ms": r.min_makespan_ms,
    })
}
