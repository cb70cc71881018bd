//! Allowances from a configuration file: one per API, each with its limits, classifier,
//! retry rules and store, read from `examples/allowances.toml`, built in one call each, and
//! tried against a local throttling upstream (one per API), so that it runs on any machine.
//!
//! Each `[apis.NAME]` table is a [`tower_allowance::AllowanceSpec`] (feature `serde`) whose
//! store part is tower-allowance-redis's [`StoreSpec`]: `spec.build(name)` opens the store
//! and builds the allowance, and every layer built on it (`allowance.layer()`)
//! classifies and retries as the file says. Durations are written `"250ms"`, `"1h"`; unknown
//! fields and out-of-range values are refused with an error naming the field.
//!
//! ```text
//! cargo run --example config_file                                        # the shipped file
//! ALLOWANCE_REDIS_URL=redis://127.0.0.1:6379/ cargo run --example config_file   # with Redis
//! cargo run --example config_file -- --config my.toml                    # another file
//! cargo run --example config_file -- --help
//! ```
//!
//! The shipped file keeps two APIs in Redis at `$ALLOWANCE_REDIS_URL` (`url_env`: the URL may
//! carry a password, so the file names the variable). When it is not set, the example keeps
//! those allowances in memory for this run, and says so; when it is, Redis must be usable.

use std::{collections::BTreeMap, time::Duration};

use allowance_testkit::upstream::{Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY};
use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use tower::{Layer, ServiceExt};
use tower_allowance::{
    Allowance, AllowanceConfig, AllowanceLayer, AllowanceSpec, BoxError, Cost, Outcome,
};
use tower_allowance_redis::StoreSpec;

/// The file the example reads unless told otherwise.
pub(crate) const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/allowances.toml");

/// The variable the shipped file's Redis-kept allowances read their URL from.
const REDIS_URL_VAR: &str = "ALLOWANCE_REDIS_URL";

/// Calls made through each API's stack, all at once.
const CALLS: usize = 6;

/// The tokens each call says it carries, for limits that count cost.
const TOKENS_PER_CALL: u32 = 1_000;

/// `--help` output.
const HELP: &str = "\
Loads the allowances in a TOML file (one per API), builds them, prints a summary and makes a
few calls through each one's stack against a local throttling upstream.

Usage: config_file [--config FILE]

  --config FILE  the file to read (default: examples/allowances.toml)
  -h, --help     print this help and run nothing

The Redis-kept allowances connect to the URL in $ALLOWANCE_REDIS_URL (the file names the
variable); without it they are kept in memory for this run, said so.
";

// === loading and building ===

/// The whole file: one allowance spec per API, by name.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    pub(crate) apis: BTreeMap<String, AllowanceSpec<StoreSpec>>,
}

/// Reads a file's text. Errors say where (line and column) and what, naming the field.
pub(crate) fn parse(text: &str) -> Result<File, toml::de::Error> {
    toml::from_str(text)
}

/// One API's stack: Retry → Cooldown → Admission → hyper's client.
pub(crate) type Stack = <AllowanceLayer as Layer<HttpClient>>::Service;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// One API, built.
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) allowance: Allowance,
    pub(crate) stack: Stack,
    /// Where the allowance is kept this run, in words.
    pub(crate) kept: &'static str,
}

/// Builds the allowance `name` as `spec` says, and its stack over `client`; one kept in
/// Redis is kept in memory instead when `redis` is false (no URL for this run).
///
/// # Errors
///
/// The store's: a Redis that refuses us, or that does not answer when the API's failure
/// policy is to report outages.
pub(crate) async fn build(
    name: &str,
    spec: &AllowanceSpec<StoreSpec>,
    redis: bool,
    client: HttpClient,
) -> Result<Built, BoxError> {
    let (allowance, kept) = match spec.store() {
        StoreSpec::Redis(_) if !redis => (
            Allowance::builder(spec.config().clone()).name(name).build(),
            "memory for this run: the file says Redis, but $ALLOWANCE_REDIS_URL is not set",
        ),
        StoreSpec::Redis(_) => (spec.build(name).await?, "Redis at $ALLOWANCE_REDIS_URL"),
        _ => (spec.build(name).await?, "memory (this process)"),
    };
    let stack = allowance.layer().layer(client);
    Ok(Built {
        allowance,
        stack,
        kept,
    })
}

/// What an allowance was built from, in a few lines.
pub(crate) fn summary(built: &Built) -> String {
    let config = built.allowance.config();
    let limits: Vec<String> = config
        .limits()
        .iter()
        .map(|l| format!("{} per {:?} (burst {})", l.rate(), l.period(), l.burst()))
        .collect();
    format!(
        "{}: {}\n  dialect {:?}\n  classifier {:?}; up to {} attempts a request\n  kept in: {}",
        built.allowance.name(),
        limits.join(", "),
        config.dialect(),
        config.classifier(),
        config.retry().max_attempts(),
        built.kept,
    )
}

// === calling ===

/// What a few calls through one stack came to.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Calls {
    pub(crate) completed: usize,
    /// Abandoned, unsuccessful or failed, with what happened.
    pub(crate) other: Vec<String>,
    pub(crate) admitted: u64,
    pub(crate) waited: u64,
    /// What the upstream saw: attempts, and of those throttled.
    pub(crate) upstream_attempts: usize,
    pub(crate) upstream_throttled: usize,
    pub(crate) elapsed: Duration,
}

/// The local stand-in for an API: a throttling upstream as fast as the allowance's main
/// limit (rounded up to whole requests a second), with its burst.
pub(crate) fn stand_in(config: &AllowanceConfig) -> UpstreamConfig {
    let main = &config.limits()[0];
    let per_sec = f64::from(main.rate()) / main.period().as_secs_f64();
    let per_sec = u32::try_from(per_sec.ceil() as u64)
        .unwrap_or(u32::MAX)
        .max(1);
    UpstreamConfig::new(main.burst(), per_sec)
}

/// Makes [`CALLS`] calls at once through `built`'s stack to a local stand-in for its API.
pub(crate) async fn call(built: &Built) -> Result<Calls, BoxError> {
    let config = built.allowance.config();
    let upstream = Upstream::start(stand_in(config)).await?;
    let counts_cost = config.limits().iter().any(|l| l.counts_cost());
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let mut request = Request::get(upstream.snapshot_url(&format!("e{i}")))
            .header(API_KEY_HEADER, DEFAULT_KEY)
            .body(Empty::<Bytes>::new())?;
        if counts_cost {
            request.extensions_mut().insert(Cost(TOKENS_PER_CALL));
        }
        let stack = built.stack.clone();
        tasks.push(tokio::spawn(async move {
            let result = stack.oneshot(request).await;
            match Outcome::of(&result) {
                Outcome::Completed => None,
                outcome => Some(format!("{outcome:?}")),
            }
        }));
    }
    let mut calls = Calls::default();
    for task in tasks {
        match task.await? {
            None => calls.completed += 1,
            Some(other) => calls.other.push(other),
        }
    }
    calls.elapsed = started.elapsed();
    let log = upstream.log();
    upstream.shutdown().await;
    let snapshot = built.allowance.snapshot();
    calls.admitted = snapshot.admitted;
    calls.waited = snapshot.waited;
    calls.upstream_attempts = log.len();
    calls.upstream_throttled = log.iter().filter(|r| r.status == 429).count();
    Ok(calls)
}

// === main ===

/// The command line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Args {
    Help,
    Run { config: String },
}

/// Reads the arguments (without the program name).
pub(crate) fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut config = SHIPPED.to_owned();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Args::Help),
            "--config" => config = args.next().ok_or("--config needs a FILE")?.clone(),
            other => return Err(format!("unexpected argument {other}")),
        }
    }
    Ok(Args::Run { config })
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse_args(&args) {
        Ok(Args::Help) => print!("{HELP}"),
        Ok(Args::Run { config }) => {
            if let Err(e) = run(&config).await {
                // A file's errors span lines (where, and what): printed as written.
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprint!("{e}\n\n{HELP}");
            std::process::exit(2);
        }
    }
}

/// Loads the file at `path`, builds its allowances and calls through each.
async fn run(path: &str) -> Result<(), BoxError> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let file = parse(&text).map_err(|e| format!("{path}: {e}"))?;
    let redis = std::env::var_os(REDIS_URL_VAR).is_some();

    println!("{} allowances from {path}:\n", file.apis.len());
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut built = Vec::new();
    for (name, spec) in &file.apis {
        let b = build(name, spec, redis, client.clone())
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        println!("{}\n", summary(&b));
        built.push(b);
    }

    println!(
        "{CALLS} calls at once through each stack, to a local upstream as fast as the API's \
         main limit\n(calls to a limit that counts cost carry {TOKENS_PER_CALL} tokens each):\n"
    );
    for b in &built {
        let c = call(b).await?;
        println!(
            "{:<8} {} completed in {:.2} s; admitted {} ({} after waiting for their slot); \
             the upstream saw {} attempts, {} throttled{}",
            b.allowance.name(),
            c.completed,
            c.elapsed.as_secs_f64(),
            c.admitted,
            c.waited,
            c.upstream_attempts,
            c.upstream_throttled,
            if c.other.is_empty() {
                String::new()
            } else {
                format!("; not completed: {}", c.other.join(", "))
            }
        );
    }
    Ok(())
}
