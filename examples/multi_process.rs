//! Going multi-process: four OS processes share one API key.
//!
//! Starts the throttling upstream on loopback (bursts of 4, 40 requests/s), then runs 32
//! workers and 96 jobs spread over four processes twice: first with one allowance per
//! process (what four services with their own in-memory gates amount to), then with one
//! allowance kept in Redis that all four processes spend. The server counts.
//!
//! ```text
//! cargo run --example multi_process [REDIS_URL]    # default redis://127.0.0.1:6379/
//! ```
//!
//! The example starts itself as the worker processes (`multi_process worker ...`); the API key
//! and the Redis URL reach them on standard input, never on their command lines.

use std::io::Write;

use allowance_sim::{
    cli::run_args,
    live::{counted_by_upstream, StoreChoice},
    multi::{run_name, run_processes},
};
use allowance_testkit::{
    report::RunReport,
    scenario::{Mode, Scenario},
    upstream::{UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};
use tower_allowance::BoxError;

const PROCESSES: usize = 4;

async fn run(store: &StoreChoice) -> Result<RunReport, BoxError> {
    let s = Scenario {
        workers: 32,
        jobs: 96,
        // The upstream's rate; one token of its burst kept as headroom for delivery jitter.
        burst: 3,
        rate_per_sec: 40,
        ..Scenario::seed(Mode::Shared)
    };
    counted_by_upstream(UpstreamConfig::new(4, 40), |upstream| async move {
        let headers = [format!("{API_KEY_HEADER}: {DEFAULT_KEY}")];
        let exe = std::env::current_exe()?;
        let template = upstream.snapshot_url("e{job}");
        run_processes(&exe, &s, &template, &headers, store, PROCESSES).await
    })
    .await
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "worker") {
        // A child: run this process's share and print it for the parent.
        let mut out = std::io::stdout().lock();
        run_args(
            std::iter::once("allowance-sim".to_owned()).chain(args[1..].iter().cloned()),
            &mut out,
        )?;
        out.flush()?;
        return Ok(());
    }
    let url = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "Four processes x eight workers, 96 jobs, one API key (upstream: bursts of 4, 40/s).\n"
    );
    let memory = rt.block_on(run(&StoreChoice::Memory))?;
    let redis = rt
        .block_on(run(&StoreChoice::Redis {
            url: url.clone(),
            name: run_name(),
        }))
        .map_err(|e| format!("Redis at {url}: {e} (pass another URL as the first argument)"))?;
    println!("{}", RunReport::header());
    println!("{}", memory.row());
    println!("{}", redis.row());
    println!(
        "\nWith an allowance per process, each process admits its own burst and its own rate:\n\
         the server saw {} attempts and {} 429s for 96 jobs. One allowance in Redis, decided\n\
         atomically on the server's clock, kept all four processes to the key's limit: {} attempts,\n\
         {} 429s, done in {} ms against a theoretical minimum of {} ms.",
        memory.attempts, memory.rejected, redis.attempts, redis.rejected, redis.makespan_ms, redis.min_makespan_ms
    );
    if let (Some(calls), Some(admissions)) = (redis.store_calls, redis.admissions) {
        println!(
            "Redis calls: {calls} for {admissions} admissions across the four processes \
             (one per admission: a waiting admission reserves its slot in the same call)."
        );
    }
    Ok(())
}
