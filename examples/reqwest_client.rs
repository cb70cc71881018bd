//! Eight workers, one API key, one `reqwest::Client`: the allowance as a reqwest middleware.
//!
//! Starts `allowance-sim`'s throttling upstream on loopback (per key: bursts of 2, 2
//! requests/s, `429` with `Retry-After: 1` beyond that) and runs eight jobs with eight
//! workers sharing one `reqwest::Client`, twice, in real time:
//!
//! - **naive**: each worker's client has its own `AllowanceMiddleware` over a private,
//!   unlimited allowance: it honours `Retry-After` on its own;
//! - **shared**: every worker's client has the same `AllowanceMiddleware` (one allowance).
//!
//! and prints both runs as the *server* counted them.
//!
//! ```text
//! cargo run --example reqwest_client
//! cargo run --example reqwest_client -- --json
//! ```

use allowance_testkit::{
    report::min_makespan_ms,
    upstream::{snapshot_path, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};
use reqwest_middleware::ClientBuilder;
use serde_json::json;
use tokio::time::Instant;
use tower_allowance::{retry::RetryConfig, Allowance, AllowanceConfig, BoxError, Outcome};
use tower_allowance_reqwest::{outcome, AllowanceMiddleware};

/// One run, as the server counted it, and how each job ended.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) mode: &'static str,
    pub(crate) attempts: usize,
    pub(crate) rejected: usize,
    pub(crate) outcomes: Vec<Outcome>,
    pub(crate) makespan_ms: u64,
}

impl Row {
    pub(crate) fn completed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.is_completed()).count()
    }
}

/// Eight jobs on eight workers over one `reqwest::Client` against a fresh upstream.
pub(crate) async fn run(shared: bool) -> Result<Row, BoxError> {
    let upstream = Upstream::start(UpstreamConfig::new(2, 2)).await?;
    // One connection pool for everyone (plain HTTP to loopback: no TLS feature, see Cargo.toml).
    let client = reqwest::Client::new();
    let retry = RetryConfig::default()
        .with_max_attempts(10)?
        .with_jitter_seed(1);
    let one = Allowance::new(AllowanceConfig::per_second(2, 2)?);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let allowance = if shared {
            one.clone()
        } else {
            Allowance::new(AllowanceConfig::per_second(1_000_000, 1_000_000)?)
        };
        let client = ClientBuilder::new(client.clone())
            .with(AllowanceMiddleware::new(allowance).with_retry(retry.clone()))
            .build();
        let url = format!("{}{}", upstream.url(), snapshot_path(&format!("e{worker}")));
        tasks.push(tokio::spawn(async move {
            let result = client
                .get(url)
                .header(API_KEY_HEADER, DEFAULT_KEY)
                .send()
                .await;
            (outcome(&result), Instant::now())
        }));
    }
    let mut outcomes = Vec::new();
    let mut last = start;
    for task in tasks {
        let (outcome, at) = task.await?;
        outcomes.push(outcome);
        last = last.max(at);
    }
    let log = upstream.log();
    upstream.shutdown().await;
    Ok(Row {
        mode: if shared { "shared" } else { "naive" },
        attempts: log.len(),
        rejected: log.iter().filter(|r| r.status == 429).count(),
        outcomes,
        makespan_ms: u64::try_from((last - start).as_millis()).unwrap_or(u64::MAX),
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let json_out = std::env::args().skip(1).any(|a| a == "--json");
    let naive = run(false).await?;
    let shared = run(true).await?;
    let min = min_makespan_ms(8, 2, 2);
    if json_out {
        let rows: Vec<_> = [&naive, &shared]
            .iter()
            .map(|r| {
                json!({
                    "mode": r.mode,
                    "attempts": r.attempts,
                    "rejected": r.rejected,
                    "completed": r.completed(),
                    "abandoned": r.outcomes.len() - r.completed(),
                    "makespan_ms": r.makespan_ms,
                    "min_makespan_ms": min,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("Eight workers, one API key, one reqwest::Client (burst 2, 2 req/s upstream):\n");
    println!(
        "{:<34} {:>14} {:>14}",
        "as the server counted", "naive", "shared"
    );
    let side = |label: &str, f: &dyn Fn(&Row) -> String| {
        println!("{:<34} {:>14} {:>14}", label, f(&naive), f(&shared));
    };
    side("attempts", &|r| r.attempts.to_string());
    side("429s", &|r| r.rejected.to_string());
    side("jobs completed", &|r| r.completed().to_string());
    side("jobs not completed", &|r| {
        (r.outcomes.len() - r.completed()).to_string()
    });
    side("last job done (ms)", &|r| r.makespan_ms.to_string());
    side("theoretical minimum (ms)", &|_| min.to_string());
    for row in [&naive, &shared] {
        let others: Vec<_> = row.outcomes.iter().filter(|o| !o.is_completed()).collect();
        if !others.is_empty() {
            println!("{}: jobs that did not complete: {others:?}", row.mode);
        }
    }
    Ok(())
}
