//! `allowance-sim tokens`: jobs against an OpenAI-shaped token-limited upstream, each request
//! reserving its prompt plus `max_tokens` at admission and settled to the tokens its answer
//! used ([`tower_allowance::cost::settle`]), with one configuration whatever the provider's refund
//! rule (learned from `x-ratelimit-remaining-tokens`).
//!
//! Each job POSTs `{"prompt_tokens": P, "max_tokens": M}` (P uniform in 100..=1000, M in
//! 200..=4000, drawn from `--seed`) to `--url`; the allowance holds `--requests` and `--tokens`
//! per `--period`, both exact, the tokens settled. With `--processes N` (and `--redis URL`: one
//! allowance shared in Redis) the tool starts itself N times, each process taking every N-th
//! job with its share of the workers, and sums their reports.
//!
//! ```no_run
//! use allowance_sim::cli::{execute, Cli};
//! use clap::Parser;
//!
//! let cli = Cli::try_parse_from([
//!     "allowance-sim", "tokens", "--url", "http://127.0.0.1:8080/v1/chat/completions",
//!     "--tokens", "60000", "--requests", "100", "--period", "10s", "--jobs", "100", "--json",
//! ])?;
//! execute(cli, &mut std::io::stdout())?;
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```

use std::{
    io::Write,
    process::Stdio,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use clap::Args;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tower::{util::BoxCloneService, ServiceBuilder, ServiceExt};
use tower_allowance::{
    cost::settle::{OpenAiUsage, SettleBody, SettleLayer, Settlement, UsageReader},
    Allowance, AllowanceConfig, BoxError, Cost, Limit,
};
use tower_allowance_redis::{RedisStore, RedisStoreOptions};

/// Arguments of `tokens`.
#[derive(Clone, Debug, Args)]
pub struct TokensArgs {
    /// The upstream's URL (every job POSTs here).
    #[arg(long)]
    pub url: String,
    /// Tokens per period (the provider's limit, its burst too).
    #[arg(long)]
    pub tokens: u32,
    /// Requests per period (the provider's limit, its burst too).
    #[arg(long)]
    pub requests: u32,
    /// The period both limits count over: `10s`, `500ms`, `1m`.
    #[arg(long, value_parser = parse_period)]
    pub period: Duration,
    /// Jobs, one request each.
    #[arg(long)]
    pub jobs: usize,
    /// Concurrent workers across all processes.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// Seeds the jobs' prompt and max_tokens.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Run the workers in this many processes (with --redis: one allowance shared in Redis).
    #[arg(long, default_value_t = 1)]
    pub processes: usize,
    /// Keep the allowance in Redis at this URL.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    /// How unused reservations come back: `learned` (from the provider's remaining tokens),
    /// `all`, `none`, or a share such as `0.5`.
    #[arg(long, default_value = "learned", value_parser = parse_settlement)]
    pub settlement: Settlement,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// This process's index in a `--processes` run (set by the tool for its children).
    #[arg(long, hide = true)]
    pub process_index: Option<usize>,
    /// The Redis allowance's name (set by the tool for its children).
    #[arg(long, hide = true)]
    pub name: Option<String>,
}

/// What a run did, as its processes saw it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TokensReport {
    /// Jobs answered with a 2xx.
    pub completed: u64,
    /// Jobs the allowance gave up on (its budget, a refusal).
    pub abandoned: u64,
    /// Jobs that failed (transport, a final non-2xx answer).
    pub failed: u64,
    /// Tokens reserved at admission (prompt + max_tokens, every attempt).
    pub tokens_reserved: u64,
    /// Tokens the reservations settled to (what the answers said they used; a failure's
    /// whole reservation).
    pub tokens_settled: u64,
    /// From the first job's start to the last one's end (the longest process), seconds.
    pub makespan_s: f64,
    /// Processes.
    pub processes: usize,
    /// Workers, across processes.
    pub workers: usize,
}

fn parse_period(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid period {s:?}: use e.g. 10s, 500ms or 1m");
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(bad)
}

fn parse_settlement(s: &str) -> Result<Settlement, String> {
    match s {
        "learned" => Ok(Settlement::learned()),
        "all" => Ok(Settlement::all()),
        "none" => Ok(Settlement::none()),
        share => share
            .parse::<f64>()
            .ok()
            .filter(|v| (0.0..=1.0).contains(v))
            .map(Settlement::share)
            .ok_or_else(|| format!("invalid settlement {s:?}: learned, all, none or 0..=1")),
    }
}

/// The jobs' (prompt, max_tokens), from the seed (SplitMix64): the same in every process.
pub fn jobs(seed: u64, n: usize) -> Vec<(u32, u32)> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut uniform = |lo: u64, hi: u64| (lo + next() % (hi - lo + 1)) as u32;
    (0..n)
        .map(|_| (uniform(100, 1000), uniform(200, 4000)))
        .collect()
}

/// Runs `tokens` and writes its report.
pub fn run(args: TokensArgs, out: &mut dyn Write) -> Result<(), BoxError> {
    if args.workers == 0 || args.jobs == 0 || args.processes == 0 {
        return Err("--workers, --jobs and --processes must be at least 1".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = match (args.processes, args.process_index) {
        (1, _) | (_, Some(_)) => rt.block_on(run_here(&args))?,
        _ => rt.block_on(run_children(&args))?,
    };
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        writeln!(
            out,
            "tokens: {} completed, {} abandoned, {} failed; {} tokens reserved, {} settled; {:.1} s ({} processes, {} workers)",
            report.completed,
            report.abandoned,
            report.failed,
            report.tokens_reserved,
            report.tokens_settled,
            report.makespan_s,
            report.processes,
            report.workers
        )?;
    }
    Ok(())
}

/// The parent of a `--processes` run: starts the children, sums their reports.
async fn run_children(args: &TokensArgs) -> Result<TokensReport, BoxError> {
    let exe = std::env::current_exe()?;
    let name = format!("sim-tokens-{}-{}", std::process::id(), args.seed);
    let mut children = Vec::new();
    for i in 0..args.processes {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args(["tokens", "--url", &args.url])
            .args(["--tokens", &args.tokens.to_string()])
            .args(["--requests", &args.requests.to_string()])
            .args(["--period", &format!("{}ms", args.period.as_millis())])
            .args(["--jobs", &args.jobs.to_string()])
            .args(["--workers", &args.workers.to_string()])
            .args(["--seed", &args.seed.to_string()])
            .args(["--processes", &args.processes.to_string()])
            .args(["--process-index", &i.to_string(), "--name", &name, "--json"])
            .args(["--settlement", &settlement_arg(args.settlement)])
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if let Some(url) = &args.redis {
            cmd.args(["--redis", url]);
        }
        children.push(cmd.spawn()?);
    }
    let mut sum = TokensReport {
        processes: args.processes,
        workers: args.workers,
        ..TokensReport::default()
    };
    for child in children {
        let output = child.wait_with_output().await?;
        if !output.status.success() {
            return Err(format!("a worker process failed: {}", output.status).into());
        }
        let r: TokensReport = serde_json::from_slice(&output.stdout)?;
        sum.completed += r.completed;
        sum.abandoned += r.abandoned;
        sum.failed += r.failed;
        sum.tokens_reserved += r.tokens_reserved;
        sum.tokens_settled += r.tokens_settled;
        sum.makespan_s = sum.makespan_s.max(r.makespan_s);
    }
    Ok(sum)
}

fn settlement_arg(s: Settlement) -> String {
    match (s.is_learned(), s.share_milli()) {
        (true, _) => "learned".to_owned(),
        (false, 1000) => "all".to_owned(),
        (false, 0) => "none".to_owned(),
        (false, m) => format!("{}", m as f64 / 1000.0),
    }
}

/// The allowance: `requests` and `tokens` per period, exact, the tokens settled.
pub fn config(args: &TokensArgs) -> Result<AllowanceConfig, BoxError> {
    Ok(
        AllowanceConfig::new(args.requests, args.period, args.requests)?
            .exact()
            .with_limit(
                Limit::new(args.tokens, args.period, args.tokens)?
                    .exact()
                    .counting_cost(),
            )?
            .with_settlement(args.settlement),
    )
}

/// One process's jobs (all of them, or every N-th).
async fn run_here(args: &TokensArgs) -> Result<TokensReport, BoxError> {
    let config = config(args)?;
    let allowance = match &args.redis {
        Some(url) => {
            let name = args.name.clone().unwrap_or_else(|| "sim-tokens".to_owned());
            let store = RedisStore::connect(url, &name, RedisStoreOptions::new()).await?;
            Allowance::with_store(config, store)
        }
        None => Allowance::new(config),
    };
    let (index, of) = (args.process_index.unwrap_or(0), args.processes.max(1));
    let mine: Vec<(u32, u32)> = jobs(args.seed, args.jobs)
        .into_iter()
        .enumerate()
        .filter(|(j, _)| j % of == index)
        .map(|(_, job)| job)
        .collect();
    let workers = (args.workers / of + usize::from(index < args.workers % of)).max(1);
    let counts = Arc::new(Counts::default());
    let next = Arc::new(AtomicUsize::new(0));
    let mine = Arc::new(mine);
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let client = client.map_err(|e: hyper_util::client::legacy::Error| -> BoxError { Box::new(e) });
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let svc: Stack = BoxCloneService::new(
            ServiceBuilder::new()
                .layer(allowance.layer())
                .layer(SettleLayer::new(&allowance, OpenAiUsage::new()))
                .service(client.clone()),
        );
        let (counts, next, mine, url) =
            (counts.clone(), next.clone(), mine.clone(), args.url.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(p, m)) = mine.get(j) else { break };
                let body = format!("{{\"prompt_tokens\": {p}, \"max_tokens\": {m}}}");
                let Ok(mut req) = Request::builder()
                    .method(Method::POST)
                    .uri(&url)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(body)))
                else {
                    counts.failed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                req.extensions_mut().insert(Cost(p + m));
                counts
                    .reserved
                    .fetch_add(u64::from(p + m), Ordering::Relaxed);
                match svc.clone().oneshot(req).await {
                    Ok(resp) => {
                        let status = resp.status();
                        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
                        let used = body
                            .ok()
                            .and_then(|b: Bytes| OpenAiUsage::new().used_from_body(&b));
                        if status.is_success() {
                            counts.completed.fetch_add(1, Ordering::Relaxed);
                            let used = used.unwrap_or(p + m);
                            counts.settled.fetch_add(u64::from(used), Ordering::Relaxed);
                        } else if status == StatusCode::TOO_MANY_REQUESTS {
                            counts.abandoned.fetch_add(1, Ordering::Relaxed);
                        } else {
                            counts.failed.fetch_add(1, Ordering::Relaxed);
                            counts
                                .settled
                                .fetch_add(u64::from(p + m), Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        let abandoned = matches!(
                            tower_allowance::Outcome::of_error(&*e),
                            tower_allowance::Outcome::Abandoned { .. }
                        );
                        let n = if abandoned {
                            &counts.abandoned
                        } else {
                            &counts.failed
                        };
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let makespan = start.elapsed();
    // Give the last settlements' store calls a moment (they run off the response's path).
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(TokensReport {
        completed: counts.completed.load(Ordering::Relaxed),
        abandoned: counts.abandoned.load(Ordering::Relaxed),
        failed: counts.failed.load(Ordering::Relaxed),
        tokens_reserved: counts.reserved.load(Ordering::Relaxed),
        tokens_settled: counts.settled.load(Ordering::Relaxed),
        makespan_s: makespan.as_secs_f64(),
        processes: of,
        workers,
    })
}

/// The stack, boxed: its future named once, `Send` checked here rather than in the spawn.
type Stack = BoxCloneService<
    Request<Full<Bytes>>,
    http::Response<SettleBody<hyper::body::Incoming, OpenAiUsage>>,
    BoxError,
>;

#[derive(Debug, Default)]
struct Counts {
    completed: AtomicU64,
    abandoned: AtomicU64,
    failed: AtomicU64,
    reserved: AtomicU64,
    settled: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_drawn_in_range_from_the_seed() {
        let a = jobs(7, 500);
        assert_eq!(a, jobs(7, 500));
        assert_ne!(a, jobs(8, 500));
        assert!(a
            .iter()
            .all(|(p, m)| (100..=1000).contains(p) && (200..=4000).contains(m)));
        assert!(a.iter().any(|(p, _)| *p < 200) && a.iter().any(|(p, _)| *p > 900));
    }

    #[test]
    fn periods_and_settlements_parse() {
        assert_eq!(parse_period("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_period("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_period("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_period("0s").is_err() && parse_period("x").is_err());
        assert_eq!(parse_settlement("0.5"), Ok(Settlement::share(0.5)));
        assert!(parse_settlement("2").is_err());
        assert_eq!(settlement_arg(Settlement::share(0.25)), "0.25");
    }
}
