//! Sixteen workers share one LLM API key limited in requests *and* tokens at once.
//!
//! Starts an upstream shaped like an LLM API on loopback (`allowance_testkit::tokens`: per key,
//! requests per second and tokens per second, each request's token count in `x-token-cost`,
//! `429` with `Retry-After` beyond either limit), then runs the same jobs (random token costs,
//! fixed seed) with 16 workers twice:
//!
//! - **naive**: each worker honours `Retry-After` on its own (tower's `Retry` with the
//!   library's `RetryPolicy`), nothing shared;
//! - **shared**: every worker goes through one `CostLayer` (the cost from `x-token-cost`) and
//!   one `AllowanceLayer` over one allowance with both limits: requests/s and tokens/s
//!   ([`Limit::counting_cost`]).
//!
//! It prints what the *server* counted: attempts, 429s, completed jobs, tokens served, the
//! makespan against the least the limits allow, and the token rate achieved after the burst.
//! The limits are per second so that a run takes seconds: an LLM API's per-minute limits
//! are the same shape sixty times slower (`AllowanceConfig::per_minute(rpm, ..)` with
//! `Limit::per_minute(tpm, ..).counting_cost()`).
//!
//! Then **reserve, then settle** (`tower_allowance::cost::settle`): against an OpenAI-shaped upstream
//! (`allowance_testkit::chat`: it charges prompt + `max_tokens` at admission and reports the
//! `usage` in each answer), each request reserves the same at admission and a `SettleLayer`
//! settles it to the usage its answer reports, with one configuration whether the upstream
//! gives unused reservations back or not (the rule is learned from its
//! `x-ratelimit-remaining-tokens`).
//!
//! ```text
//! cargo run --example llm_tokens              # a table
//! cargo run --example llm_tokens -- --json    # one JSON object per mode
//! ```

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use allowance_testkit::tokens::{
    Rate, TokenSummary, TokenUpstream, TokenUpstreamConfig, TOKENS_HEADER,
};
use bytes::Bytes;
use http::{HeaderName, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use serde_json::{json, Value};
use tokio::time::Instant;
use tower::{retry::Retry, Service, ServiceBuilder, ServiceExt};
use tower_allowance::{
    cost::CostLayer,
    retry::{RetryConfig, RetryPolicy},
    Allowance, AllowanceConfig, BoxError, Limit, Outcome,
};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// The API key every worker shares.
pub(crate) const KEY: &str = "sk-shared-demo";

/// One run's shape.
#[derive(Clone, Debug)]
pub(crate) struct Demo {
    /// Concurrent workers.
    pub(crate) workers: usize,
    /// Jobs, one request each.
    pub(crate) jobs: usize,
    /// Requests per second (and burst) of the key.
    pub(crate) requests: Rate,
    /// Tokens per second (and burst) of the key.
    pub(crate) tokens: Rate,
    /// Each job costs between these many tokens (inclusive).
    pub(crate) cost_range: (u32, u32),
    /// Seeds the job costs.
    pub(crate) seed: u64,
}

impl Default for Demo {
    /// 16 workers, 48 jobs of 100 to 900 tokens; 60 requests/s (burst 10) and 10,000
    /// tokens/s (burst 2,000): about 2.2 s at best.
    fn default() -> Self {
        Self {
            workers: 16,
            jobs: 48,
            requests: Rate::per_second(60, 10),
            tokens: Rate::per_second(10_000, 2_000),
            cost_range: (100, 900),
            seed: 42,
        }
    }
}

impl Demo {
    /// The upstream's configuration.
    pub(crate) fn upstream(&self) -> TokenUpstreamConfig {
        TokenUpstreamConfig::new(self.requests, self.tokens).with_keys([KEY])
    }

    /// The shared allowance's configuration: the same two limits, per second.
    pub(crate) fn allowance(&self) -> Result<AllowanceConfig, BoxError> {
        let u32_of = |n: u64| u32::try_from(n).map_err(|_| "limit too large");
        Ok(
            AllowanceConfig::per_second(u32_of(self.requests.rate)?, u32_of(self.requests.burst)?)?
                .with_limit(
                    Limit::per_second(u32_of(self.tokens.rate)?, u32_of(self.tokens.burst)?)?
                        .counting_cost(),
                )?,
        )
    }

    /// The jobs' token costs (a fixed xorshift sequence: every run is the same).
    pub(crate) fn costs(&self) -> Vec<u32> {
        let (lo, hi) = self.cost_range;
        let span = u64::from(hi.saturating_sub(lo)) + 1;
        let mut x = self.seed.max(1);
        (0..self.jobs)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                lo + u32::try_from(x % span).unwrap_or(0)
            })
            .collect()
    }
}

/// What the server counted in one run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    pub(crate) mode: &'static str,
    pub(crate) attempts: usize,
    pub(crate) rejected: usize,
    pub(crate) completed: usize,
    pub(crate) tokens: u64,
    pub(crate) makespan_ms: u64,
    pub(crate) min_makespan_ms: u64,
    /// Tokens served beyond the burst, per second of the run.
    pub(crate) token_rate_per_sec: f64,
    /// The token limit, per second.
    pub(crate) token_limit_per_sec: f64,
}

impl Row {
    pub(crate) fn json(&self) -> Value {
        json!({
            "mode": self.mode,
            "attempts": self.attempts,
            "rejected": self.rejected,
            "completed": self.completed,
            "tokens": self.tokens,
            "makespan_ms": self.makespan_ms,
            "min_makespan_ms": self.min_makespan_ms,
            "token_rate_per_sec": (self.token_rate_per_sec * 10.0).round() / 10.0,
            "token_limit_per_sec": self.token_limit_per_sec,
        })
    }
}

fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Runs the jobs with `demo.workers` workers against a fresh upstream.
pub(crate) async fn run(demo: &Demo, shared: bool) -> Result<Row, BoxError> {
    let upstream = TokenUpstream::start(demo.upstream()).await?;
    let costs = Arc::new(demo.costs());
    let client = http_client();
    let retry = RetryConfig::default().with_max_attempts(5)?;
    let allowance = Allowance::new(demo.allowance()?);
    let url = format!("{}/v1/chat/completions", upstream.url());
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = Vec::with_capacity(demo.workers);
    for _ in 0..demo.workers {
        let jobs = Jobs {
            costs: costs.clone(),
            next: next.clone(),
            url: url.clone(),
        };
        workers.push(if shared {
            let svc = ServiceBuilder::new()
                .layer(CostLayer::from_header(HeaderName::from_static(
                    TOKENS_HEADER,
                )))
                .layer(allowance.layer().with_retry(retry.clone()))
                .service(client.clone());
            tokio::spawn(work(svc, jobs))
        } else {
            // Its own retry loop honouring Retry-After; its own allowance (as if it held the
            // key alone) only meters its own retries.
            let own = Allowance::new(demo.allowance()?);
            let inner = client.clone().map_err(BoxError::from);
            let svc = Retry::new(RetryPolicy::new(own).with_config(retry.clone()), inner);
            tokio::spawn(work(svc, jobs))
        });
    }
    for w in workers {
        w.await??;
    }
    let makespan_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    let TokenSummary {
        attempts,
        rejected,
        completed,
        tokens,
    } = upstream.summary(None);
    upstream.shutdown().await;
    let after_burst = tokens.saturating_sub(demo.tokens.burst) as f64;
    Ok(Row {
        mode: if shared { "shared" } else { "naive" },
        attempts,
        rejected,
        completed,
        tokens,
        makespan_ms,
        min_makespan_ms: demo.upstream().min_makespan_ms(&costs),
        token_rate_per_sec: after_burst * 1_000.0 / makespan_ms.max(1) as f64,
        token_limit_per_sec: demo.tokens.per_sec(),
    })
}

/// The job queue the workers share.
struct Jobs {
    costs: Arc<Vec<u32>>,
    next: Arc<AtomicUsize>,
    url: String,
}

/// One worker: takes the next job until none is left.
async fn work<S, RB>(svc: S, jobs: Jobs) -> Result<(), BoxError>
where
    S: Service<Request<Empty<Bytes>>, Response = http::Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    RB: axum::body::HttpBody, // (http_body::Body, as axum re-exports it)
    RB::Error: Into<BoxError>,
{
    loop {
        let job = jobs.next.fetch_add(1, Ordering::Relaxed);
        let Some(cost) = jobs.costs.get(job) else {
            return Ok(());
        };
        let req = Request::post(&jobs.url)
            .header("authorization", format!("Bearer {KEY}"))
            .header(TOKENS_HEADER, cost.to_string())
            .header("idempotency-key", format!("job-{job}"))
            .body(Empty::new())?;
        let result = svc.clone().oneshot(req).await.map_err(Into::into);
        if let Outcome::Failed = Outcome::of(&result) {
            return result.map(|_| ());
        }
        if let Ok(res) = result {
            // Read the body: the connection goes back to the pool.
            res.into_body().collect().await.map_err(Into::into)?;
        }
    }
}

/// `--help` output.
pub(crate) const USAGE: &str = "\
Sixteen workers share one LLM API key limited in requests and tokens per second:
naive vs one shared allowance with both limits, over real HTTP (about 5 s).

Usage: cargo run --example llm_tokens [-- OPTIONS]

Options:
  --json        print one JSON object per mode (an array)
  -h, --help    print this help and run nothing
";

fn main() -> Result<(), BoxError> {
    let mut json_out = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--json" => json_out = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(());
            }
            other => {
                eprint!("llm_tokens: unknown argument {other:?}\n\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let demo = Demo::default();
    let rt = tokio::runtime::Runtime::new()?;
    if !json_out {
        let costs = demo.costs();
        println!(
            "{} workers, {} jobs of {} to {} tokens ({} in all). The upstream allows, per key,",
            demo.workers,
            demo.jobs,
            demo.cost_range.0,
            demo.cost_range.1,
            costs.iter().map(|c| u64::from(*c)).sum::<u64>()
        );
        println!(
            "{} requests/s (burst {}) and {} tokens/s (burst {}) at once; beyond either, 429.\n",
            demo.requests.rate, demo.requests.burst, demo.tokens.rate, demo.tokens.burst
        );
    }
    let naive = rt.block_on(run(&demo, false))?;
    let shared = rt.block_on(run(&demo, true))?;
    let settle = Settled::default();
    let refunding = rt.block_on(settled(&settle, 1.0))?;
    let keeping = rt.block_on(settled(&settle, 0.0))?;
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!([
                naive.json(),
                shared.json(),
                refunding.json(),
                keeping.json()
            ]))?
        );
        return Ok(());
    }
    println!(
        "{:<34} {:>10} {:>10}",
        "as the server counted", "naive", "shared"
    );
    let side = |label: &str, f: &dyn Fn(&Row) -> String| {
        println!("{:<34} {:>10} {:>10}", label, f(&naive), f(&shared));
    };
    side("attempts", &|r| r.attempts.to_string());
    side("429s", &|r| r.rejected.to_string());
    side("jobs completed", &|r| r.completed.to_string());
    side("tokens served", &|r| r.tokens.to_string());
    side("makespan (ms)", &|r| r.makespan_ms.to_string());
    side("least the limits allow (ms)", &|r| {
        r.min_makespan_ms.to_string()
    });
    side("tokens/s after the burst", &|r| {
        format!("{:.0}", r.token_rate_per_sec)
    });
    println!(
        "\nThe shared allowance charged each request its tokens and one request, on both limits at"
    );
    println!(
        "once: {} 429s, {:.1}% of the token limit sustained.",
        shared.rejected,
        100.0 * shared.token_rate_per_sec / shared.token_limit_per_sec
    );
    println!(
        "\nReserve, then settle: {} jobs reserving prompt + max_tokens ({} tokens/s, burst {}),",
        settle.jobs, settle.tokens, settle.tokens
    );
    println!(
        "settled to the usage each answer reports; one configuration (the refund rule learned).\n"
    );
    println!(
        "{:<34} {:>10} {:>10}",
        "as the server counted", "refunds", "keeps"
    );
    let both = |label: &str, f: &dyn Fn(&SettledRow) -> String| {
        println!("{:<34} {:>10} {:>10}", label, f(&refunding), f(&keeping));
    };
    both("429s", &|r| r.rejected.to_string());
    both("jobs completed", &|r| r.completed.to_string());
    both("token capacity used (%)", &|r| {
        format!("{:.1}", 100.0 * r.utilisation)
    });
    both("share learned (of 1)", &|r| format!("{:.2}", r.share));
    Ok(())
}

/// The reserve-then-settle run's shape.
#[derive(Clone, Debug)]
pub(crate) struct Settled {
    pub(crate) workers: usize,
    pub(crate) jobs: usize,
    /// Tokens per second, and the burst.
    pub(crate) tokens: u32,
    /// Requests per second, and the burst.
    pub(crate) requests: u32,
}

impl Default for Settled {
    /// 16 workers, 40 jobs (prompt 100 to 1,000, max_tokens 200 to 4,000); 30,000 tokens and
    /// 100 requests per second: a few seconds. (The allowance's bucket counts 34 µs a token,
    /// 2% slower than the upstream's 33.3: the share learned leaves that out.)
    fn default() -> Self {
        Self {
            workers: 16,
            jobs: 40,
            tokens: 30_000,
            requests: 100,
        }
    }
}

/// What the OpenAI-shaped upstream counted.
#[derive(Clone, Debug)]
pub(crate) struct SettledRow {
    pub(crate) refund: f64,
    pub(crate) rejected: u64,
    pub(crate) completed: u64,
    pub(crate) utilisation: f64,
    /// The share of unused tokens the allowance learned comes back.
    pub(crate) share: f64,
}

impl SettledRow {
    pub(crate) fn json(&self) -> Value {
        json!({
            "mode": "settled",
            "refund": self.refund,
            "rejected": self.rejected,
            "completed": self.completed,
            "utilisation": (self.utilisation * 1000.0).round() / 1000.0,
            "share_learned": self.share,
        })
    }
}

/// Jobs against an upstream giving back `refund` of each unused reservation, reserving prompt
/// + max_tokens and settled to the usage reported (`Settlement::learned()`).
pub(crate) async fn settled(demo: &Settled, refund: f64) -> Result<SettledRow, BoxError> {
    use allowance_testkit::chat::{ChatUpstream, ChatUpstreamConfig};
    use http_body_util::Full;
    use tower_allowance::{
        cost::settle::{OpenAiUsage, SettleLayer, Settlement},
        Cost,
    };

    let period = std::time::Duration::from_secs(1);
    let upstream = ChatUpstream::start(
        ChatUpstreamConfig::new(demo.tokens.into(), demo.requests.into(), period).refund(refund),
    )
    .await?;
    let config = AllowanceConfig::per_second(demo.requests, demo.requests)?
        .exact()
        .with_limit(
            Limit::per_second(demo.tokens, demo.tokens)?
                .exact()
                .counting_cost(),
        )?
        .with_settlement(Settlement::learned());
    let allowance = Allowance::new(config);
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let url = format!("{}/v1/chat/completions", upstream.url());
    // Prompt 100..=1000 and max_tokens 200..=4000, a fixed xorshift sequence.
    let mut x = 7u64;
    let mut draw = |lo: u32, hi: u32| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        lo + u32::try_from(x % u64::from(hi - lo + 1)).unwrap_or(0)
    };
    let jobs: Vec<(u32, u32)> = (0..demo.jobs)
        .map(|_| (draw(100, 1000), draw(200, 4000)))
        .collect();
    let jobs = Arc::new(jobs);
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    let settle = SettleLayer::new(&allowance, OpenAiUsage::new());
    for _ in 0..demo.workers {
        let svc = ServiceBuilder::new()
            .layer(allowance.layer())
            .layer(settle.clone())
            .service(client.clone());
        let (jobs, next, url) = (jobs.clone(), next.clone(), url.clone());
        workers.push(tokio::spawn(async move {
            while let Some(&(p, m)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                let body = format!("{{\"prompt_tokens\": {p}, \"max_tokens\": {m}}}");
                let Ok(mut req) = Request::post(&url).body(Full::new(Bytes::from(body))) else {
                    continue;
                };
                // The reservation: what the provider charges at admission.
                req.extensions_mut().insert(Cost(p + m));
                if let Ok(res) = svc.clone().oneshot(req).await {
                    // Reading the body to its end settles the reservation to its usage.
                    let _ = res.into_body().collect().await;
                }
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let counts = upstream.counts();
    let share = settle.share();
    let row = SettledRow {
        refund,
        rejected: counts.rejected_tokens + counts.rejected_requests,
        completed: counts.ok,
        utilisation: counts.utilisation(upstream.config()),
        share,
    };
    upstream.shutdown().await;
    Ok(row)
}
