//! Allowances from a configuration file: one per API, each with its store, classifier and
//! retry rules, read from `examples/allowances.toml`, built into stacks, and tried against a
//! local throttling upstream (one per API), so that it runs on any machine.
//!
//! The file is read with the `toml` crate into tower-allowance's own types (feature
//! `serde`): [`AllowanceConfig`], [`StatusClassifier`], [`RetryConfig`], and
//! tower-allowance-redis's [`RedisStoreOptions`]. Durations are written `"250ms"`, `"1h"`;
//! unknown fields and out-of-range values are refused with an error naming the field.
//!
//! ```text
//! cargo run --example config_file                            # the shipped file
//! cargo run --example config_file -- redis://127.0.0.1:6379/  # Redis at this URL
//! cargo run --example config_file -- --config my.toml        # another file
//! cargo run --example config_file -- --help
//! ```
//!
//! The Redis URL is never in the file (it may carry a password): it is the first argument,
//! or `ALLOWANCE_REDIS_URL`. The APIs the file keeps in Redis are kept there when a URL is
//! given (and then Redis must be usable: a refusal stops the run), or when a Redis answers on
//! `127.0.0.1:6379`. Otherwise the example says so, and keeps those allowances in memory for
//! this run: shared by this process's tasks only.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

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
    classify::StatusClassifier, retry::RetryConfig, Allowance, AllowanceConfig, AllowanceLayer,
    BoxError, Cost, OutagePolicy, Outcome, RetryBudgetConfig,
};
use tower_allowance_redis::{RedisStore, RedisStoreOptions};

/// The file the example reads unless told otherwise.
pub(crate) const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/allowances.toml");

/// Where a Redis is looked for when no URL is given.
const LOCAL_REDIS: &str = "redis://127.0.0.1:6379/";

/// Calls made through each API's stack, all at once.
const CALLS: usize = 6;

/// The tokens each call says it carries, for limits that count cost.
const TOKENS_PER_CALL: u32 = 1_000;

/// `--help` output.
const HELP: &str = "\
Loads the allowances in a TOML file (one per API), builds their stacks, prints a summary
and makes a few calls through each against a local throttling upstream.

Usage: config_file [REDIS_URL] [--config FILE]

  REDIS_URL      where the file's Redis-kept allowances live (default: $ALLOWANCE_REDIS_URL,
                 else redis://127.0.0.1:6379/ if it answers, else memory, said so)
  --config FILE  the file to read (default: examples/allowances.toml)
  -h, --help     print this help and run nothing
";

// === the file ===

/// The whole file: the allowances by API name.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    /// One table per API; its key is the allowance's name (its Redis key, its metrics label).
    pub(crate) apis: BTreeMap<String, Api>,
}

/// One API: its allowance, where it is kept, how responses are read, how to retry.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Api {
    pub(crate) allowance: AllowanceConfig,
    #[serde(default)]
    pub(crate) store: StoreConfig,
    #[serde(default)]
    pub(crate) classifier: StatusClassifier,
    #[serde(default)]
    pub(crate) retry: RetryConfig,
}

/// `store = "memory"` or `store = { redis = { timeout = "100ms", ... } }`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StoreConfig {
    /// In this process: its tasks share it.
    #[default]
    Memory,
    /// In Redis: every process using the same name shares it.
    Redis(RedisStoreOptions),
}

/// Reads a file's text. Errors say where (line and column) and what, naming the field.
pub(crate) fn parse(text: &str) -> Result<File, toml::de::Error> {
    toml::from_str(text)
}

// === where the Redis-kept allowances go ===

/// The Redis this run uses for the allowances the file keeps in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RedisChoice {
    /// A URL on the command line or in `ALLOWANCE_REDIS_URL`: it must work.
    Given(String),
    /// No URL given, but a Redis answers on the default port.
    Found(String),
    /// No URL given, and none answers on the default port.
    Absent,
}

impl RedisChoice {
    /// Given `url`, or whatever answers on `127.0.0.1:6379`.
    pub(crate) async fn choose(url: Option<String>) -> Self {
        if let Some(url) = url {
            return Self::Given(url);
        }
        let probe = tokio::net::TcpStream::connect("127.0.0.1:6379");
        match tokio::time::timeout(Duration::from_millis(500), probe).await {
            Ok(Ok(_)) => Self::Found(LOCAL_REDIS.to_owned()),
            _ => Self::Absent,
        }
    }

    fn url(&self) -> Option<&str> {
        match self {
            Self::Given(url) | Self::Found(url) => Some(url),
            Self::Absent => None,
        }
    }
}

// === building ===

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// One API's stack: Retry → Cooldown → Admission → hyper's client, read by its classifier.
pub(crate) type Stack = <AllowanceLayer<StatusClassifier> as Layer<HttpClient>>::Service;

/// One API, built.
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) name: String,
    pub(crate) allowance: Allowance,
    pub(crate) stack: Stack,
    /// Where the allowance is kept this run, in words.
    pub(crate) kept: String,
}

/// Builds `api`'s allowance (in Redis when the file says so and `redis` has a URL) and its
/// stack over `client`.
///
/// # Errors
///
/// A Redis that refuses the connection (a wrong password, a bad URL), or that does not
/// answer when the API's failure policy is to report outages.
pub(crate) async fn build(
    name: &str,
    api: &Api,
    redis: &RedisChoice,
    client: HttpClient,
) -> Result<Built, BoxError> {
    let builder = Allowance::builder(api.allowance.clone()).name(name);
    let (builder, kept) = match (&api.store, redis.url()) {
        (StoreConfig::Memory, _) => (builder, "memory (this process)".to_owned()),
        (StoreConfig::Redis(options), Some(url)) => {
            let shown = redact(url);
            let store = RedisStore::connect(url, name, options.clone())
                .await
                .map_err(|e| format!("{name}: Redis at {shown}: {e}"))?;
            let kept = if store.is_degraded() {
                format!(
                    "Redis at {shown}, NOT ANSWERING: deciding locally ({:?}) until it does",
                    options.get_failure_policy()
                )
            } else {
                format!("Redis at {shown} (key {})", store.key())
            };
            (builder.store(store), kept)
        }
        (StoreConfig::Redis(_), None) => (
            builder,
            format!(
                "memory for this run: the file says Redis, but no URL was given and none \
                 answers at {LOCAL_REDIS}"
            ),
        ),
    };
    let allowance = builder.build();
    let stack = AllowanceLayer::new(allowance.clone())
        .with_retry(api.retry.clone())
        .with_classifier(api.classifier)
        .layer(client);
    Ok(Built {
        name: name.to_owned(),
        allowance,
        stack,
        kept,
    })
}

/// What `api` says, in a few lines.
pub(crate) fn summary(built: &Built, api: &Api) -> String {
    let config = &api.allowance;
    let limits: Vec<String> = config
        .limits()
        .iter()
        .map(|l| {
            let unit = if l.counts_cost() { " cost units" } else { "" };
            format!(
                "{}{unit} per {} (burst {})",
                l.rate(),
                human(l.period()),
                l.burst()
            )
        })
        .collect();
    let readers: Vec<String> = config
        .dialect()
        .readers()
        .map(|r| format!("{r:?}"))
        .collect();
    let mut s = String::new();
    let _ = writeln!(s, "{}: {}", built.name, limits.join(", "));
    let _ = writeln!(s, "  headers read: {}", readers.join(", "));
    let budget = match config.retry_budget() {
        RetryBudgetConfig::Fixed { retries } => format!("{retries} retries in all"),
        RetryBudgetConfig::Replenishing(b) => format!(
            "{}/s, plus {} per success, over {}",
            b.min_per_sec(),
            b.ratio(),
            human(b.window())
        ),
        _ => "unlimited".to_owned(),
    };
    let outage = match config.outage_policy() {
        OutagePolicy::Wait { max } => format!("wait up to {}", human(max)),
        _ => "fail fast".to_owned(),
    };
    let _ = writeln!(
        s,
        "  retries: up to {} attempts a request; budget {budget}",
        api.retry.max_attempts()
    );
    let _ = writeln!(
        s,
        "  max cooldown {}; when the store does not answer: {outage}",
        human(config.max_cooldown())
    );
    let _ = writeln!(s, "  classifier: {:?}", api.classifier);
    let _ = write!(s, "  kept in: {}", built.kept);
    s
}

/// `2592000s` as `30days`, `3600s` as `1h`, `1.5s` as `1500ms`.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_nanos() != 0 || s == 0 {
        format!("{}ms", d.as_millis())
    } else if s.is_multiple_of(86_400) {
        format!("{}days", s / 86_400)
    } else if s.is_multiple_of(3_600) {
        format!("{}h", s / 3_600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// `redis://user:secret@host/` as `redis://***@host/`: a URL may carry a password.
fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
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

/// The local stand-in for `api`: a throttling upstream as fast as the API's main limit
/// (rounded up to whole requests a second), with its burst.
pub(crate) fn stand_in(api: &Api) -> UpstreamConfig {
    let main = &api.allowance.limits()[0];
    let per_sec = f64::from(main.rate()) / main.period().as_secs_f64();
    let per_sec = u32::try_from(per_sec.ceil() as u64)
        .unwrap_or(u32::MAX)
        .max(1);
    UpstreamConfig::new(main.burst(), per_sec)
}

/// Makes [`CALLS`] calls at once through `built`'s stack to a local stand-in for `api`.
pub(crate) async fn call(built: &Built, api: &Api) -> Result<Calls, BoxError> {
    let upstream = Upstream::start(stand_in(api)).await?;
    let counts_cost = api.allowance.limits().iter().any(|l| l.counts_cost());
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
    Run {
        config: String,
        redis: Option<String>,
    },
}

/// Reads the arguments (without the program name); `env_redis` is `ALLOWANCE_REDIS_URL`.
pub(crate) fn parse_args(args: &[String], env_redis: Option<String>) -> Result<Args, String> {
    let mut config = SHIPPED.to_owned();
    let mut redis = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Args::Help),
            "--config" => {
                config = args.next().ok_or("--config needs a FILE")?.clone();
            }
            other if other.starts_with('-') => return Err(format!("unknown option {other}")),
            url if redis.is_none() => redis = Some(url.to_owned()),
            extra => return Err(format!("unexpected argument {extra}")),
        }
    }
    Ok(Args::Run {
        config,
        redis: redis.or(env_redis),
    })
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env_redis = std::env::var("ALLOWANCE_REDIS_URL").ok();
    match parse_args(&args, env_redis) {
        Ok(Args::Help) => print!("{HELP}"),
        Ok(Args::Run { config, redis }) => {
            if let Err(e) = run(&config, redis).await {
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
async fn run(path: &str, redis: Option<String>) -> Result<(), BoxError> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let file = parse(&text).map_err(|e| format!("{path}: {e}"))?;

    let redis = RedisChoice::choose(redis).await;
    match &redis {
        RedisChoice::Given(url) => println!("Redis: {} (given)", redact(url)),
        RedisChoice::Found(url) => println!("Redis: {url} (found answering, no URL given)"),
        RedisChoice::Absent => println!(
            "Redis: none. No URL was given (argument or ALLOWANCE_REDIS_URL) and nothing \
             answers at {LOCAL_REDIS}:\nthe allowances the file keeps in Redis are kept in \
             memory for this run, shared by this process only."
        ),
    }
    println!("\n{} allowances from {path}:\n", file.apis.len());

    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut built = Vec::new();
    for (name, api) in &file.apis {
        let b = build(name, api, &redis, client.clone()).await?;
        println!("{}\n", summary(&b, api));
        built.push((b, api));
    }

    println!(
        "{CALLS} calls at once through each stack, to a local upstream as fast as the API's \
         main limit\n(calls to a limit that counts cost carry {TOKENS_PER_CALL} tokens each):\n"
    );
    for (b, api) in &built {
        let c = call(b, api).await?;
        println!(
            "{:<8} {} completed in {:.2} s; admitted {} ({} after waiting for their slot); \
             the upstream saw {} attempts, {} throttled{}",
            b.name,
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
