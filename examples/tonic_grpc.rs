//! Eight workers, one API key, over gRPC: a tonic `Channel` wrapped in the allowance stack.
//!
//! Starts a tonic server on loopback whose `Quotes/Get` call is throttled per API key (a
//! token bucket: bursts of 2, 2 calls/s; beyond that `RESOURCE_EXHAUSTED` with
//! `grpc-retry-pushback-ms`, the time until the next token, per gRFC A6), then runs eight
//! jobs with eight workers sharing one `Channel`, twice, in real time:
//!
//! - **naive**: each worker honours the pushback on its own (tower's `Retry` with the
//!   library's `RetryPolicy` and `GrpcClassifier`, nothing shared);
//! - **shared**: all eight go through one [`GrpcLayer`] over one `Allowance`.
//!
//! and prints the two runs side by side as the *server* counted them, like `eight_workers`.
//!
//! ```text
//! cargo run --example tonic_grpc             # the table
//! cargo run --example tonic_grpc -- --json   # one JSON object per mode
//! ```
//!
//! No protobuf compiler is needed: the two messages are written by hand with
//! `prost::Message` (what `tonic-build` would generate from the `.proto` below), and the
//! client and server use tonic's `Grpc` directly, with `tonic_prost::ProstCodec`.
//!
//! ```text
//! package allowance.demo;
//! service Quotes { rpc Get(QuoteRequest) returns (QuoteReply); }
//! message QuoteRequest { uint32 job = 1; }
//! message QuoteReply { uint32 job = 1; string quote = 2; }
//! ```

use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use allowance_testkit::report::min_makespan_ms;
use http::{uri::PathAndQuery, Method};
use serde_json::{json, Value};
use tokio::time::Instant;
use tonic::{
    body::Body,
    client::GrpcService,
    metadata::MetadataValue,
    server::{NamedService, UnaryService},
    transport::{server::TcpIncoming, Channel, Server},
    Code, Status,
};
use tonic_prost::ProstCodec;
use tower::{retry::Retry, ServiceBuilder, ServiceExt};
use tower_allowance::{
    grpc::{GrpcClassifier, GrpcLayer},
    retry::{RetryConfig, RetryPolicy},
    Allowance, AllowanceConfig, BoxError,
};

/// The call's path.
const GET: &str = "/allowance.demo.Quotes/Get";
/// The metadata key carrying the API key the server throttles by.
const API_KEY: &str = "x-api-key";

/// `allowance.demo.QuoteRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct QuoteRequest {
    /// The job asking.
    #[prost(uint32, tag = "1")]
    pub(crate) job: u32,
}

/// `allowance.demo.QuoteReply`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct QuoteReply {
    /// The job answered.
    #[prost(uint32, tag = "1")]
    pub(crate) job: u32,
    /// The quote.
    #[prost(string, tag = "2")]
    pub(crate) quote: String,
}

// === the server ===

/// A per-key token bucket in microseconds of refill time, starting full; like
/// `allowance-sim`'s upstream it admits a call up to a tenth of a token early (scheduling
/// jitter), paid back from the next refill.
#[derive(Debug)]
struct Bucket {
    level_us: i64,
    last: Instant,
}

/// What the server counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Calls received.
    pub(crate) attempts: usize,
    /// Of those, answered `RESOURCE_EXHAUSTED`.
    pub(crate) rejected: usize,
    /// Of those, answered OK.
    pub(crate) completed: usize,
}

#[derive(Debug)]
struct Limits {
    burst: u32,
    rate_per_sec: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
    counts: Mutex<Counts>,
}

impl Limits {
    fn interval_us(&self) -> i64 {
        1_000_000 / i64::from(self.rate_per_sec.max(1))
    }

    /// Takes a token for `key`, or says how long until the next one.
    fn take(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let interval = self.interval_us();
        let capacity = i64::from(self.burst) * interval;
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            level_us: capacity,
            last: now,
        });
        let elapsed = i64::try_from((now - bucket.last).as_micros()).unwrap_or(i64::MAX);
        bucket.level_us = bucket.level_us.saturating_add(elapsed).min(capacity);
        bucket.last = now;
        if bucket.level_us + interval / 10 >= interval {
            bucket.level_us -= interval;
            Ok(())
        } else {
            let missing = u64::try_from(interval - bucket.level_us).unwrap_or(0);
            Err(Duration::from_micros(missing))
        }
    }

    fn count(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.counts.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// The `allowance.demo.Quotes` service, routed by hand (what `tonic-build` generates).
#[derive(Clone, Debug)]
pub(crate) struct Quotes {
    limits: Arc<Limits>,
}

impl NamedService for Quotes {
    const NAME: &'static str = "allowance.demo.Quotes";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<Body>> for Quotes {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let limits = self.limits.clone();
        Box::pin(async move {
            if req.uri().path() != GET {
                return Ok(Status::unimplemented(req.uri().path().to_owned()).into_http());
            }
            let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
            Ok(grpc.unary(Get(limits), req).await)
        })
    }
}

/// `Quotes/Get`: one token per call, per API key.
struct Get(Arc<Limits>);

impl UnaryService<QuoteRequest> for Get {
    type Response = QuoteReply;
    type Future = BoxFuture<Result<tonic::Response<QuoteReply>, Status>>;

    fn call(&mut self, request: tonic::Request<QuoteRequest>) -> Self::Future {
        let limits = self.0.clone();
        Box::pin(async move {
            let key = request
                .metadata()
                .get(API_KEY)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("anonymous")
                .to_owned();
            limits.count(|c| c.attempts += 1);
            match limits.take(&key, Instant::now()) {
                Ok(()) => {
                    limits.count(|c| c.completed += 1);
                    let job = request.into_inner().job;
                    Ok(tonic::Response::new(QuoteReply {
                        job,
                        quote: format!("quote #{job}"),
                    }))
                }
                Err(wait) => {
                    limits.count(|c| c.rejected += 1);
                    let mut status = Status::resource_exhausted("rate limit exceeded for key");
                    let ms = wait.as_millis().max(1).to_string();
                    if let Ok(value) = MetadataValue::try_from(ms) {
                        status
                            .metadata_mut()
                            .insert("grpc-retry-pushback-ms", value);
                    }
                    Err(status)
                }
            }
        })
    }
}

/// A running server: its address and its counts.
pub(crate) struct QuoteServer {
    addr: SocketAddr,
    limits: Arc<Limits>,
    task: tokio::task::JoinHandle<()>,
}

impl QuoteServer {
    /// Starts the server on a free loopback port.
    pub(crate) async fn start(burst: u32, rate_per_sec: u32) -> Result<Self, BoxError> {
        let incoming = TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = incoming.local_addr()?;
        let limits = Arc::new(Limits {
            burst,
            rate_per_sec,
            buckets: Mutex::default(),
            counts: Mutex::default(),
        });
        let service = Quotes {
            limits: limits.clone(),
        };
        let task = tokio::spawn(async move {
            if let Err(e) = Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                eprintln!("server stopped: {e}");
            }
        });
        Ok(Self { addr, limits, task })
    }

    /// What the server counted so far; the counts start again from zero.
    pub(crate) fn take_counts(&self) -> Counts {
        std::mem::take(
            &mut self
                .limits
                .counts
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Forgets every key's bucket (each run starts with full buckets).
    pub(crate) fn reset_buckets(&self) {
        self.limits
            .buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

impl Drop for QuoteServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// === the workers ===

/// How the eight workers retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Each worker honours the pushback alone.
    Naive,
    /// One allowance for all of them.
    Shared,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Naive => "naive",
            Mode::Shared => "shared",
        }
    }
}

/// One run's row, as the server counted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) mode: Mode,
    pub(crate) counts: Counts,
    /// Jobs that ended without a reply (the client's count).
    pub(crate) abandoned: usize,
    /// Why, by gRPC code, for the jobs that did not complete.
    pub(crate) failures: Vec<Code>,
    /// From the start to the last job's end.
    pub(crate) makespan_ms: u64,
    pub(crate) min_makespan_ms: u64,
}

/// The scenario: the server's limit, and the jobs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scenario {
    pub(crate) burst: u32,
    pub(crate) rate_per_sec: u32,
    pub(crate) workers: u32,
    pub(crate) jobs: u32,
    pub(crate) max_attempts: u32,
}

impl Scenario {
    /// The seed's numbers: eight workers, eight jobs, bursts of 2 at 2/s, ten attempts.
    pub(crate) const SEED: Self = Self {
        burst: 2,
        rate_per_sec: 2,
        workers: 8,
        jobs: 8,
        max_attempts: 10,
    };
}

/// gRPC calls are POSTs: these ones are idempotent reads, so they may be replayed.
fn retry_config(s: &Scenario) -> Result<RetryConfig, BoxError> {
    Ok(RetryConfig::default()
        .with_max_attempts(s.max_attempts)?
        .with_replayable_methods([Method::POST])
        .with_jitter_seed(1))
}

/// Runs one mode against `server`, over one `Channel` to it.
pub(crate) async fn run(server: &QuoteServer, s: Scenario, mode: Mode) -> Result<Row, BoxError> {
    server.reset_buckets();
    server.take_counts();
    let channel = Channel::from_shared(format!("http://{}", server.addr))?
        .connect()
        .await?;
    let retry = retry_config(&s)?;
    let start = Instant::now();
    let ends = match mode {
        Mode::Naive => {
            // Its own retry loop honouring the pushback, and nothing shared: a private,
            // unlimited allowance that only serves the policy's bookkeeping.
            let own = Allowance::new(AllowanceConfig::per_second(1_000_000, 1_000_000)?);
            let policy = RetryPolicy::new(own)
                .with_config(retry)
                .with_classifier(GrpcClassifier::new());
            let prepare = policy.clone();
            let stack = ServiceBuilder::new()
                // Under tower's `Retry`, the policy prepares each body for a replay.
                .map_request(move |req| prepare.prepare(req))
                .service(Retry::new(policy, channel.map_err(BoxError::from)));
            workers(stack, &s).await?
        }
        Mode::Shared => {
            let allowance = Allowance::new(AllowanceConfig::per_second(s.rate_per_sec, s.burst)?);
            let stack = ServiceBuilder::new()
                .layer(GrpcLayer::new(allowance).with_retry(retry))
                .service(channel);
            workers(stack, &s).await?
        }
    };
    let counts = server.take_counts();
    let failures: Vec<Code> = ends.iter().filter_map(|(end, _)| end.err()).collect();
    let makespan = ends.iter().map(|(_, at)| *at).max().unwrap_or(start) - start;
    Ok(Row {
        mode,
        counts,
        abandoned: failures.len(),
        failures,
        makespan_ms: u64::try_from(makespan.as_millis()).unwrap_or(u64::MAX),
        min_makespan_ms: min_makespan_ms(s.jobs as usize, s.burst, s.rate_per_sec),
    })
}

/// Each job's end: its reply's job number, or the code it failed with, and when.
type Ends = Vec<(Result<u32, Code>, Instant)>;

/// `s.workers` workers, each with a clone of `stack` (one channel), sharing `s.jobs` jobs.
async fn workers<T>(stack: T, s: &Scenario) -> Result<Ends, BoxError>
where
    T: GrpcService<Body> + Clone + Send + 'static,
    T::Future: Send,
    T::ResponseBody: Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    let mut tasks = Vec::new();
    for worker in 0..s.workers {
        let mut client = tonic::client::Grpc::new(stack.clone());
        let (jobs, workers) = (s.jobs, s.workers);
        tasks.push(tokio::spawn(async move {
            let mut ends = Vec::new();
            for job in (worker..jobs).step_by(workers as usize) {
                let end = call(&mut client, job).await;
                ends.push((end, Instant::now()));
            }
            ends
        }));
    }
    let mut ends = Vec::new();
    for task in tasks {
        ends.extend(task.await?);
    }
    Ok(ends)
}

/// One job: one `Quotes/Get` call (retried by the stack).
async fn call<T>(client: &mut tonic::client::Grpc<T>, job: u32) -> Result<u32, Code>
where
    T: GrpcService<Body>,
    T::ResponseBody: Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(e.into().to_string()).code())?;
    let mut request = tonic::Request::new(QuoteRequest { job });
    request
        .metadata_mut()
        .insert(API_KEY, MetadataValue::from_static("demo-key"));
    let reply: tonic::Response<QuoteReply> = client
        .unary(
            request,
            PathAndQuery::from_static(GET),
            ProstCodec::default(),
        )
        .await
        .map_err(|status| status.code())?;
    Ok(reply.into_inner().job)
}

/// One row as JSON, with the keys the acceptance script reads.
pub(crate) fn json_row(row: &Row) -> Value {
    json!({
        "mode": row.mode.name(),
        "attempts": row.counts.attempts,
        "rejected": row.counts.rejected,
        "completed": row.counts.completed,
        "abandoned": row.abandoned,
        "makespan_ms": row.makespan_ms,
        "min_makespan_ms": row.min_makespan_ms,
    })
}

fn main() -> Result<(), BoxError> {
    let mut json_out = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--json" => json_out = true,
            "-h" | "--help" => {
                println!("Usage: cargo run --example tonic_grpc [-- --json]");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let s = Scenario::SEED;
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let server = QuoteServer::start(s.burst, s.rate_per_sec).await?;
        let naive = run(&server, s, Mode::Naive).await?;
        let shared = run(&server, s, Mode::Shared).await?;
        Ok::<_, BoxError>([naive, shared])
    })?;
    if json_out {
        let rows: Vec<Value> = rows.iter().map(json_row).collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let [naive, shared] = &rows;
    println!(
        "Eight workers share one API key over gRPC: a tonic server on loopback allowing, per\n\
         key, bursts of {} and {} calls/s, RESOURCE_EXHAUSTED with grpc-retry-pushback-ms\n\
         beyond that. {} jobs on one tonic Channel, run twice:\n",
        s.burst, s.rate_per_sec, s.jobs
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "as the server counted", "naive", "shared"
    );
    let side = |label: &str, f: fn(&Row) -> String| {
        println!("{:<34} {:>14} {:>14}", label, f(naive), f(shared));
    };
    side("attempts", |r| r.counts.attempts.to_string());
    side("RESOURCE_EXHAUSTED", |r| r.counts.rejected.to_string());
    side("jobs completed", |r| r.counts.completed.to_string());
    side("jobs abandoned", |r| r.abandoned.to_string());
    side("last job done (ms)", |r| r.makespan_ms.to_string());
    side("theoretical minimum (ms)", |r| {
        r.min_makespan_ms.to_string()
    });
    for row in &rows {
        if !row.failures.is_empty() {
            println!(
                "{} ended without a reply: {:?}",
                row.mode.name(),
                row.failures
            );
        }
    }
    println!(
        "\nEach naive worker honoured the server's pushback, and the server still answered\n\
         {} calls RESOURCE_EXHAUSTED. The shared allowance sent {} calls for {} jobs, {} refused.",
        naive.counts.rejected, shared.counts.attempts, s.jobs, shared.counts.rejected
    );
    Ok(())
}
