//! The `allowance-sim` command line, as a library so tests can drive it in-process.
//!
//! ```
//! use allowance_sim::cli::{execute, Cli};
//! use clap::Parser;
//!
//! let cli = Cli::try_parse_from(["allowance-sim", "run", "--mode", "shared", "--virtual", "--json"])?;
//! let mut out = Vec::new();
//! execute(cli, &mut out)?;
//! let report: serde_json::Value = serde_json::from_slice(&out)?;
//! assert_eq!(report["attempts"], 8);
//! assert_eq!(report["rejected"], 0);
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use clap::{Args, Parser, Subcommand};
use tower_allowance::BoxError;

use allowance_testkit::{
    dialect::ServerDialect,
    fake::FakeConfig,
    report::RunReport,
    scale,
    scenario::{self, Adaptive, CancelFraction, Mode, OnStoreOutage, Scenario},
    tokens::{Rate, TokenUpstream, TokenUpstreamConfig, TOKENS_HEADER},
    upstream::{RateChange, RetryAfterMode, ThrottleAt, Upstream, UpstreamConfig, DEFAULT_KEY},
};

use crate::{
    adaptive, classes,
    classes::parse_duration,
    live::{self, Share, StoreChoice, Target},
    multi, rate_chart, sweep, timeline,
};

/// Lanes beyond which the ASCII timeline is left out (it would not fit a screen).
const MAX_ASCII_LANES: usize = 40;

/// The exit status and logging, as `--help` explains them (a macro, for `concat!`).
macro_rules! exit_help {
    () => {
        "Exit status:\n  0  every job completed, or was abandoned by design (attempts, budget, deadline, quota)\n  1  the run could not be made (invalid settings, Redis unreachable, a worker process crashed)\n  2  invalid command line\n  3  the run finished but jobs failed (store, transport, or a final non-2xx status),\n     or no job completed (all abandoned): the report is printed, and the cause on stderr\n\nLogging: RUST_LOG, on stderr (default: warn, so Redis outages show); e.g. RUST_LOG=tower_allowance=debug"
    };
}

/// What `--help` prints after the options: where to start, the exit status, logging.
const AFTER_HELP: &str = concat!(
    "Start here:\n  allowance-sim seed                          the seed article's table, in virtual time\n  allowance-sim run --mode naive --real       eight workers over real HTTP, each retrying alone\n  allowance-sim run --mode shared --real      the same eight sharing one allowance\n  allowance-sim serve                         the throttling upstream alone\n  allowance-sim http --url URL --header 'X-API-Key: k' --rate 2 --burst 2\n                                              the same workers against your own endpoint",
    "\n\n",
    exit_help!()
);

/// Eight workers, one API key: watch them fight over it, then share it.
///
/// Every run reports what the *server* saw: attempts, 429s, completed and abandoned jobs,
/// the makespan against the theoretical minimum, and the achieved rate.
#[derive(Debug, Parser)]
#[command(
    name = "allowance-sim",
    version,
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The seed article's table: eight workers, one key, four scenarios, in virtual time.
    Seed {
        /// Print the rows as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Any scenario against the built-in throttling upstream, in virtual or real time.
    ///
    /// The upstream and the allowance get the same --burst and --rate (a matching allowance).
    #[command(after_help = exit_help!())]
    Run(RunArgs),
    /// Run the throttling upstream alone (GET /v1/events/{id}/odds/snapshot, GET /v1/usage).
    Serve(ServeArgs),
    /// The same workers and stack against any HTTP or HTTPS endpoint: one GET per job.
    ///
    /// Counts come from the responses the workers received. `{job}` in the URL is replaced
    /// by the job's number. https trusts the system's roots, plus --ca-cert.
    #[command(after_help = exit_help!())]
    Http(HttpArgs),
    /// The coordination-efficiency sweep: naive, split:4 and shared over a grid of workers,
    /// jobs and upstream buckets (virtual time), plus shared on Redis across 4 processes
    /// (real time) with --redis. Prints a Markdown table.
    Sweep(SweepArgs),
    /// The adaptive rate's figures: an upstream at 20/s that nobody states, found from 2/s
    /// and from 200/s, followed when it drops to 10/s, adopted from an IETF policy (virtual
    /// time); with --redis, four processes on one controller against four with one each
    /// (real time). Prints a Markdown table with each run's command.
    Adaptive(AdaptiveArgs),
    /// One process of a `--processes N` run (started by the tool itself).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// Jobs against an OpenAI-shaped token-limited upstream: reserve prompt + max_tokens,
    /// settle to the tokens used (the provider's refund rule learned).
    Tokens(crate::tokens::TokensArgs),
}

/// Arguments of `sweep`.
#[derive(Clone, Debug, Args)]
pub struct SweepArgs {
    /// Also run shared on one Redis allowance across 4 processes, in real time.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    /// Real-time runs only where the theoretical minimum makespan is at most this long.
    #[arg(long, default_value = "25s", value_parser = parse_duration)]
    pub max_real: Duration,
    /// Tokens of the upstream's burst the Redis allowance keeps in reserve for delivery
    /// jitter across processes (0: exactly the upstream's bucket).
    #[arg(long, default_value_t = 1)]
    pub headroom: u32,
    /// Write the Markdown table here too.
    #[arg(long, value_name = "FILE.md")]
    pub markdown: Option<PathBuf>,
    /// Draw the chart (attempts per job, makespan / minimum) to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub svg: Option<PathBuf>,
    /// Print the rows as JSON instead.
    #[arg(long)]
    pub json: bool,
    /// A smaller grid (workers 8 and 64, 100 jobs), for a quick look.
    #[arg(long)]
    pub quick: bool,
}

/// Arguments of `adaptive`.
#[derive(Clone, Debug, Args)]
pub struct AdaptiveArgs {
    /// Also run four processes on one controller in Redis at this URL, and four with a
    /// controller each, in real time (about 15 s each).
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    /// Draw the adaptive rate against the upstream's for the 2/s, 200/s and rate-change runs
    /// to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub svg: Option<PathBuf>,
    /// Write the Markdown table here too.
    #[arg(long, value_name = "FILE.md")]
    pub markdown: Option<PathBuf>,
    /// Print the rows as JSON instead.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of the hidden `worker` subcommand: one process's share of a run.
///
/// The request headers and the Redis URL (which may carry keys and passwords) are not
/// arguments: with `--secrets-on-stdin` the worker reads them from standard input, as one
/// JSON object ([`multi::ChildSecrets`]), so that they never show in `ps`.
#[derive(Clone, Debug, Args)]
pub struct WorkerArgs {
    /// The URL template.
    #[arg(long)]
    pub url: String,
    /// Read the headers and the Redis URL from standard input (one JSON object).
    #[arg(long)]
    pub secrets_on_stdin: bool,
    /// The usage endpoint the allowances probe when the quota may be spent.
    #[arg(long, value_name = "URL")]
    pub usage_url: Option<String>,
    /// The workers of this process and the allowance.
    #[command(flatten)]
    pub workload: Workload,
    /// This process's first worker, globally.
    #[arg(long, default_value_t = 0)]
    pub worker_offset: usize,
    /// Workers across all processes.
    #[arg(long)]
    pub total_workers: usize,
    /// A PEM file of CA certificates to trust besides the system's roots.
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Print `progress N` lines on stderr as jobs end.
    #[arg(long)]
    pub progress: bool,
}

/// The workers and the allowance they use.
#[derive(Clone, Debug, Args)]
pub struct Workload {
    /// How workers coordinate: naive (each retries alone, honouring Retry-After), shared (one
    /// allowance), or split:N (N independent allowances).
    #[arg(long, default_value = "shared", value_name = "naive|shared|split:N")]
    pub mode: Mode,
    /// Concurrent workers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub workers: u32,
    /// Jobs in total, one request each, shared round-robin among the workers.
    #[arg(long, default_value_t = 8)]
    pub jobs: usize,
    /// Requests that may go back to back (the allowance's burst).
    #[arg(long, default_value_t = 2)]
    pub burst: u32,
    /// Requests per second (the allowance's rate).
    #[arg(long, default_value_t = 2)]
    pub rate: u32,
    /// Keep the allowance exactly at --burst and --rate: no headroom for delivery jitter
    /// (by default a burst above 1 keeps 10 ms, or half the burst's time if that is shorter:
    /// the schedule after a whole burst is that much later; at burst 1 two sends are a 50th
    /// of the interval further apart, 10 ms over Redis, and each slot is paced from the last
    /// one's actual send or answer).
    #[arg(long)]
    pub exact: bool,
    /// Attempts per job, counting the first.
    #[arg(long, default_value_t = 10)]
    pub max_attempts: u32,
    /// Retries the whole group may make; unlimited if absent. In shared and split modes it
    /// is each allowance's budget; in naive mode one pool for all the workers (nothing else
    /// is shared). Across --processes: one pool in Redis with --redis, else one per process.
    #[arg(long)]
    pub retry_budget: Option<u64>,
    /// Give up on a job that cannot finish within this long of its start (e.g. 1500ms, 2s).
    #[arg(long, value_parser = parse_duration)]
    pub deadline: Option<Duration>,
    /// Cancel this share of the jobs (0 to 1, picked by job number) at a random moment while
    /// they wait for admission, as callers that give up would (needs --real). Reported as
    /// `cancelled`, with the reserved slots they released (`releases`).
    #[arg(long, value_name = "F")]
    pub cancel_fraction: Option<CancelFraction>,
    /// Print one JSON object with the run's figures instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also draw the run to this SVG file: one lane per worker.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
    /// Keep the allowance in Redis at this URL (shared and split modes), so that every
    /// process of the run spends the same one, e.g. redis://127.0.0.1:6379/.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    /// For a rediss:// --redis URL: trust the CA certificates in this PEM file (a Redis you
    /// run with its own CA), instead of the system's roots (managed Redis services).
    #[arg(long, value_name = "FILE")]
    pub redis_ca_cert: Option<PathBuf>,
    /// --redis names the seed nodes of a Redis Cluster (URLs separated by commas).
    #[arg(long)]
    pub redis_cluster: bool,
    /// The allowance's name in Redis (letters, digits, `_.:-`; default: a fresh one per
    /// run): runs given one name share one allowance, as the processes of a rolling deploy
    /// do (the newest configuration on the name decides for all of them).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Run the workers in this many OS processes (the tool starts itself N times). With
    /// --redis they share one allowance; without, each process has its own, as separate
    /// services on one key would.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub processes: u32,
    /// What an admission does when Redis does not answer (needs --redis): wait for it
    /// (default: up to 60 s, or wait:DURATION), fail-fast (the job fails, counted as a store
    /// failure), or local-fallback (each process decides alone at the rate divided by
    /// --processes until Redis answers).
    #[arg(long, value_name = "wait|wait:DURATION|fail-fast|local-fallback")]
    pub on_store_outage: Option<OnStoreOutage>,
    /// Read this provider's rate-limit headers (the allowance's dialect); `run` also makes its
    /// upstream speak it. Default: the generic set (Retry-After, retry-after-ms, the IETF
    /// fields, X-RateLimit-*), against an upstream speaking odds.
    #[arg(long, value_parser = dialect_parser(), value_name = "DIALECT")]
    pub dialect: Option<ServerDialect>,
    /// Let the allowance's rate adapt (shared and split modes): it starts at --initial-rate,
    /// doubles every second until the first 429, then is cut by 15% on a 429 (30% when
    /// throttling persists) and grows by 1% a second, within --rate-floor..=--rate-ceiling.
    /// In `run`, --rate is then the upstream's alone.
    #[arg(long)]
    pub adaptive: bool,
    /// The adaptive rate's start, requests per second (default: --rate).
    #[arg(long, value_name = "R", requires = "adaptive")]
    pub initial_rate: Option<f64>,
    /// The adaptive rate never goes below this (default: 0.5/s, or --initial-rate if lower).
    #[arg(long, value_name = "R", requires = "adaptive")]
    pub rate_floor: Option<f64>,
    /// The adaptive rate never goes above this (default: 1000/s, or --initial-rate if
    /// higher), nor above a rate the server advertises.
    #[arg(long, value_name = "R", requires = "adaptive")]
    pub rate_ceiling: Option<f64>,
    /// Adopt the rate the server advertises (an IETF RateLimit-Policy: --dialect ietf, or the
    /// standard set) as the adaptive rate, not only cap at it.
    #[arg(long, requires = "adaptive")]
    pub adopt: bool,
    /// Classes of callers sharing the allowance (`--class`, `--window`).
    #[command(flatten)]
    pub classes: crate::classes::ClassArgs,
    /// Admit from leases of the shared bucket (real-time runs): `auto` (sized by the measured
    /// rate) or N:DURATION (N tokens per lease, the rate measured over DURATION). With
    /// --on-store-outage local-fallback, the lease holder falls back at its share (the rate
    /// divided by the holders Redis counted), not at the rate divided by --processes.
    #[arg(long, value_name = "auto|N:DURATION")]
    pub lease: Option<tower_allowance::lease::Lease>,
}

impl Workload {
    /// How this process connects to Redis (`--redis-ca-cert`, `--redis-cluster`).
    ///
    /// # Errors
    ///
    /// The CA file cannot be read.
    pub fn redis_connect(&self) -> Result<live::RedisConnect, BoxError> {
        let ca_cert = match &self.redis_ca_cert {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|e| format!("--redis-ca-cert {}: {e}", path.display()))?,
            ),
            None => None,
        };
        Ok(live::RedisConnect {
            ca_cert,
            ca_cert_path: self.redis_ca_cert.clone(),
            cluster: self.redis_cluster,
        })
    }

    /// Where the allowances live for this run (a fresh Redis name per run).
    pub fn store(&self) -> StoreChoice {
        match &self.redis {
            Some(url) => StoreChoice::Redis {
                url: url.clone(),
                name: self.name.clone().unwrap_or_else(multi::run_name),
            },
            None => StoreChoice::Memory,
        }
    }
}

/// Arguments of `run`.
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// The workers and the allowance.
    #[command(flatten)]
    pub workload: Workload,
    /// What the upstream's 429s say: N (seconds), date:N (an HTTP-date N seconds ahead;
    /// virtual runs treat it as N seconds), or none.
    #[arg(long, default_value = "1", value_parser = parse_retry_after)]
    pub retry_after: RetryAfterMode,
    /// Virtual time: an in-process upstream on a paused clock; exact and instant (default).
    #[arg(long = "virtual", conflicts_with = "real")]
    pub virtual_time: bool,
    /// Real time: an HTTP upstream on loopback, real sockets, real waits.
    #[arg(long)]
    pub real: bool,
    /// Make the upstream answer 429 with `Retry-After: SECS` once, to the first request MS ms
    /// after it starts, whatever its bucket says (needs --processes or --redis). `--json`
    /// reports `cooldown`: every other request that arrived inside those SECS, ms after the 429.
    #[arg(long, value_name = "MS:SECS")]
    pub throttle_at: Option<ThrottleAt>,
    /// The workers of each process instead of an even split, e.g. 1,31 (as many as
    /// --processes, summing to --workers). `--json` reports `fairness` across processes.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    pub workers_per_process: Option<Vec<usize>>,
    /// The upstream's monthly credits for the key (needs --real): once spent, every snapshot
    /// is a 429 without Retry-After. In shared and split modes the allowances then probe
    /// GET /v1/usage, once for the group, and close on its verdict (jobs end abandoned,
    /// quota_exhausted). `--json` reports `usage_probes`, counted by the upstream.
    #[arg(long, value_name = "N")]
    pub quota: Option<u64>,
    /// Change the upstream's rate AT into the run to RATE requests per second, e.g. 30s:10
    /// (repeatable). Virtual and real time. `--json` then says when the achieved rate
    /// settled within 15% of each new rate.
    #[arg(long = "upstream-rate-change", value_name = "AT:RATE")]
    pub upstream_rate_changes: Vec<RateChange>,
    /// Draw the adaptive rate over time against the upstream's to this SVG file (needs
    /// --adaptive, virtual time).
    #[arg(long, value_name = "FILE.svg", requires = "adaptive")]
    pub rate_chart: Option<PathBuf>,
}

impl RunArgs {
    /// The scenario: the workload against the built-in upstream, with its rate changes.
    pub fn scenario(&self) -> Scenario {
        let mut s = self.workload.scenario(self.retry_after);
        s.upstream
            .rate_changes
            .clone_from(&self.upstream_rate_changes);
        s
    }
}

/// Arguments of `serve`.
#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// Bucket capacity per key.
    #[arg(long, default_value_t = 2)]
    pub burst: u32,
    /// Refill per key, requests per second.
    #[arg(long, default_value_t = 2)]
    pub rate: u32,
    /// What 429s say: N (seconds), date:N (an HTTP-date N seconds ahead), or none.
    #[arg(long, default_value = "1", value_parser = parse_retry_after)]
    pub retry_after: RetryAfterMode,
    /// An accepted API key (repeatable).
    #[arg(long = "key", default_value = DEFAULT_KEY)]
    pub keys: Vec<String>,
    /// Monthly credits per key; once spent, every snapshot is a 429 without Retry-After.
    #[arg(long)]
    pub quota: Option<u64>,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Whose rate-limit headers the answers carry, on successes and 429s alike.
    #[arg(long, value_parser = dialect_parser(), default_value_t = ServerDialect::Odds, value_name = "DIALECT")]
    pub dialect: ServerDialect,
    /// Change the rate AT after the start to RATE requests per second, e.g. 30s:10
    /// (repeatable).
    #[arg(long = "rate-change", value_name = "AT:RATE")]
    pub rate_changes: Vec<RateChange>,
    /// Also limit tokens per key, e.g. 40000/min, 600/s or 90000 (per minute): each request
    /// declares its cost in x-token-cost and is admitted only when both its request and its
    /// token bucket hold enough (an LLM API's requests and tokens per minute). Serves any
    /// path; keys in Authorization: Bearer KEY or X-API-Key.
    #[arg(
        long,
        value_name = "N[/PERIOD]",
        value_parser = parse_token_rate,
        conflicts_with_all = ["quota", "rate_changes", "dialect", "retry_after"]
    )]
    pub token_rate: Option<TokenRate>,
    /// The token bucket's capacity (default: one period's worth, --token-rate's N).
    #[arg(long, value_name = "N", requires = "token_rate")]
    pub token_burst: Option<u64>,
}

/// Tokens per period, from `--token-rate N[/PERIOD]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenRate {
    /// Tokens per period.
    pub tokens: u64,
    /// The period.
    pub period: Duration,
}

/// Parses `N` (per minute), `N/s`, `N/min` (or `N/m`), `N/h`, `N/d`, or `N/DURATION`
/// (`N/90s`, `N/1500ms`).
fn parse_token_rate(s: &str) -> Result<TokenRate, String> {
    let bad =
        || format!("invalid token rate {s:?}: use N[/PERIOD], e.g. 40000/min, 600/s or 90000");
    let (n, period) = s.split_once('/').unwrap_or((s, "min"));
    let tokens: u64 = n.trim().parse().map_err(|_| bad())?;
    let period = match period.trim() {
        "s" | "sec" | "second" => Duration::from_secs(1),
        "m" | "min" | "minute" => Duration::from_secs(60),
        "h" | "hour" => Duration::from_secs(3_600),
        "d" | "day" => Duration::from_secs(86_400),
        other => parse_duration(other).map_err(|_| bad())?,
    };
    if tokens == 0 || period.is_zero() {
        return Err(bad());
    }
    Ok(TokenRate { tokens, period })
}

/// Arguments of `http`.
#[derive(Clone, Debug, Args)]
pub struct HttpArgs {
    /// The URL to GET, once per job; `{job}` is replaced by the job's number.
    #[arg(long)]
    pub url: String,
    /// A header for every request, as 'Name: value' (repeatable).
    #[arg(long = "header", short = 'H')]
    pub headers: Vec<String>,
    /// For https: also trust the CA certificates in this PEM file (a private CA, or a
    /// self-signed server certificate), besides the system's roots. A self-signed
    /// certificate that is CA:TRUE (`openssl req -x509` makes one by default) is refused as
    /// the server's own certificate (rustls: CaUsedAsEndEntity; curl accepts it): make it
    /// with `-addext basicConstraints=critical,CA:FALSE -addext subjectAltName=IP:...` (or
    /// DNS:...), or have a CA sign the server's certificate and pass the CA here.
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// The workers and the allowance.
    #[command(flatten)]
    pub workload: Workload,
}

/// Parses `N`, `date:N` or `none`.
fn parse_retry_after(s: &str) -> Result<RetryAfterMode, String> {
    let bad = || format!("invalid retry-after {s:?}: use N (seconds), date:N or none");
    match s {
        "none" | "absent" => Ok(RetryAfterMode::Absent),
        _ => match s.strip_prefix("date:") {
            Some(n) => n.parse().map(RetryAfterMode::HttpDate).map_err(|_| bad()),
            None => s.parse().map(RetryAfterMode::Seconds).map_err(|_| bad()),
        },
    }
}

impl Workload {
    /// The scenario these arguments describe, with a matching upstream.
    pub fn scenario(&self, retry_after: RetryAfterMode) -> Scenario {
        let retry_after_secs = match retry_after {
            RetryAfterMode::Seconds(n) | RetryAfterMode::HttpDate(n) => Some(n),
            RetryAfterMode::Absent => None,
        };
        Scenario {
            mode: self.mode,
            workers: self.workers as usize,
            jobs: self.jobs,
            upstream: FakeConfig {
                burst: self.burst,
                rate_per_sec: self.rate,
                retry_after_secs,
                dialect: self.dialect.unwrap_or_default(),
                ..FakeConfig::seed()
            },
            burst: self.burst,
            rate_per_sec: self.rate,
            max_attempts: self.max_attempts,
            retry_budget: self.retry_budget,
            deadline: self.deadline,
            cancel: self.cancel_fraction,
            on_store_outage: self
                .on_store_outage
                .unwrap_or_default()
                .for_processes(self.processes),
            adaptive: self.adaptive(),
            dialect: self.dialect,
            exact: self.exact,
        }
    }

    /// Refuses settings that would otherwise be ignored.
    fn check(&self) -> Result<(), BoxError> {
        if self.on_store_outage.is_some() && self.redis.is_none() {
            return Err(
                "--on-store-outage needs --redis: an allowance in memory has no outages".into(),
            );
        }
        if self.adaptive && self.mode == Mode::Naive {
            return Err(
                "--adaptive needs shared or split mode: naive workers share no allowance".into(),
            );
        }
        if let Some(adaptive) = self.adaptive() {
            adaptive
                .rate()
                .map_err(|e| format!("invalid adaptive rate: {e}"))?;
        }
        Ok(())
    }

    /// The adaptive rate these arguments ask for, with the defaults filled in.
    pub fn adaptive(&self) -> Option<Adaptive> {
        if !self.adaptive {
            return None;
        }
        let initial = self.initial_rate.unwrap_or(f64::from(self.rate));
        Some(Adaptive {
            initial,
            floor: self
                .rate_floor
                .unwrap_or_else(|| Adaptive::default_floor(initial)),
            ceiling: self
                .rate_ceiling
                .unwrap_or_else(|| Adaptive::default_ceiling(initial)),
            adopt: self.adopt,
        })
    }
}

/// Runs the parsed command, writing its report to `out`.
///
/// # Errors
///
/// Invalid settings, a port that cannot be bound, a URL that does not parse, or `out`
/// failing.
pub fn execute(cli: Cli, out: &mut dyn Write) -> Result<(), BoxError> {
    let workload = match &cli.command {
        Command::Run(a) => Some(&a.workload),
        Command::Http(a) => Some(&a.workload),
        Command::Worker(a) => Some(&a.workload),
        _ => None,
    };
    if let Some(w) = workload {
        live::set_redis_connect(w.redis_connect()?);
        live::set_lease(w.lease);
    }
    match cli.command {
        Command::Seed { json } => seed(json, out),
        Command::Run(args) if !args.workload.classes.classes.is_empty() && args.virtual_time => {
            // `--virtual`: one process on a paused clock, the in-process upstream.
            let s = args.scenario();
            if args.workload.processes > 1 || args.workload.redis.is_some() {
                return Err("--processes and --redis need real time: drop --virtual".into());
            }
            let (report, rejected) = classes::execute_virtual(&s, &args.workload.classes)?;
            if !args.workload.json {
                writeln!(
                    out,
                    "upstream (virtual time): burst {} at {}/s, {rejected} 429s",
                    s.burst, s.rate_per_sec
                )?;
            }
            classes_out(&args.workload, &classes::ClassOutcome::Report(report), out)
        }
        Command::Run(args) if !args.workload.classes.classes.is_empty() => {
            // Real time against the built-in upstream on loopback, as `run --real`.
            let s = args.scenario();
            let up = real_runtime()?;
            let upstream = up.block_on(Upstream::start(upstream_config(&s, &args)))?;
            let key = allowance_testkit::upstream::API_KEY_HEADER;
            let target = Target::new(upstream.snapshot_url("e{job}"))
                .header_line(&format!("{key}: {DEFAULT_KEY}"))?;
            let store = args.workload.store();
            let processes = args.workload.processes as usize;
            let outcome = classes::execute(&s, &args.workload.classes, &target, &store, processes)?;
            let rejected = upstream.log().iter().filter(|r| r.status == 429).count();
            if !args.workload.json {
                writeln!(
                    out,
                    "upstream: burst {} at {}/s, {rejected} 429s",
                    s.burst, s.rate_per_sec
                )?;
            }
            classes_out(&args.workload, &outcome, out)
        }
        Command::Run(args) => {
            let s = args.scenario();
            let report = run_report(&args, on_a_terminal())?;
            let what = if args.real {
                "real time, over HTTP on loopback"
            } else {
                "virtual time, in-process upstream"
            };
            let changes: String = s
                .upstream
                .rate_changes
                .iter()
                .map(|c| format!(", {}/s from {} ms", c.rate_per_sec, c.at.as_millis()))
                .collect();
            let upstream = format!(
                "upstream: burst {} at {}/s{changes}, speaking {}, 429s with {}",
                s.burst,
                s.rate_per_sec,
                s.upstream.dialect,
                describe_retry_after(args.retry_after)
            );
            if let Some(path) = &args.rate_chart {
                let title = match &s.adaptive {
                    Some(a) => format!("from {}/s", a.initial),
                    None => report.scenario.clone(),
                };
                std::fs::write(path, rate_chart::svg(&[(&title, &report)])?)?;
            }
            print_report(&report, &args.workload, what, &upstream, out)
        }
        Command::Http(args) if !args.workload.classes.classes.is_empty() => {
            let s = args.workload.scenario(RetryAfterMode::Absent);
            let mut target = Target::new(args.url.clone());
            for line in &args.headers {
                target = target.header_line(line)?;
            }
            let store = args.workload.store();
            let processes = args.workload.processes as usize;
            classes_out(
                &args.workload,
                &classes::execute(&s, &args.workload.classes, &target, &store, processes)?,
                out,
            )
        }
        Command::Http(args) => {
            args.workload.check()?;
            let s = args.workload.scenario(RetryAfterMode::Absent);
            let mut target = Target::new(args.url.clone());
            for line in &args.headers {
                target = target.header_line(line)?;
            }
            if let Some(path) = &args.ca_cert {
                target = target.ca_cert_file(path)?;
            }
            let rt = real_runtime()?;
            let progress = Progress::maybe(&rt, &s, on_a_terminal());
            let counter = progress.as_ref().map(|p| p.done.clone());
            let report = if args.workload.processes > 1 || args.workload.redis.is_some() {
                let spawn = multi::Spawn {
                    ca_cert: args.ca_cert.clone(),
                    progress: counter,
                    usage_url: None,
                    workers_per_process: None,
                };
                rt.block_on(multi::run_processes_with(
                    &std::env::current_exe()?,
                    &s,
                    &args.url,
                    &args.headers,
                    &args.workload.store(),
                    args.workload.processes as usize,
                    &spawn,
                ))
            } else {
                rt.block_on(live::run_http(&s, &target, counter))
            };
            drop(progress);
            let upstream = format!("target: GET {}", args.url);
            print_report(
                &report?,
                &args.workload,
                "real time, counted from the responses received",
                &upstream,
                out,
            )
        }
        Command::Serve(args) => serve(args, out),
        Command::Adaptive(args) => {
            let mut experiments = adaptive::virtual_experiments();
            if let Some(url) = &args.redis {
                experiments.extend(adaptive::redis_experiments(url));
            }
            let progress = SweepProgress::maybe(experiments.len(), on_a_terminal());
            let mut rows = Vec::with_capacity(experiments.len());
            for e in &experiments {
                progress.starting(e.name);
                rows.push(adaptive::AdaptiveRow::of(e, run_experiment(e)?));
            }
            drop(progress);
            let table = adaptive::markdown(&rows);
            if let Some(path) = &args.markdown {
                std::fs::write(path, &table)?;
            }
            if let Some(path) = &args.svg {
                let charted: Vec<(&str, &RunReport)> = rows
                    .iter()
                    .zip(&experiments)
                    .filter(|(_, e)| e.charted)
                    .map(|(row, _)| (row.name.as_str(), &row.report))
                    .collect();
                std::fs::write(path, rate_chart::svg(&charted)?)?;
            }
            if args.json {
                writeln!(out, "{}", serde_json::to_string(&rows)?)?;
            } else {
                write!(out, "{table}")?;
            }
            Ok(())
        }
        Command::Sweep(args) => {
            let grid = if args.quick {
                sweep::Grid {
                    workers: vec![8, 64],
                    jobs: vec![100],
                    ..sweep::Grid::default()
                }
            } else {
                sweep::Grid::default()
            };
            let max_ms = u64::try_from(args.max_real.as_millis()).unwrap_or(u64::MAX);
            let redis_runs = match &args.redis {
                Some(_) => sweep::RedisRuns::UpTo {
                    max_real_ms: max_ms,
                    headroom: args.headroom,
                },
                None => sweep::RedisRuns::NotRequested,
            };
            let planned = sweep::planned_runs(&grid, args.redis.as_ref().map(|_| max_ms));
            let progress = SweepProgress::maybe(planned, on_a_terminal());
            let mut starting = |what: &str| progress.starting(what);
            let mut rows = sweep::run_virtual_grid_with(&grid, &mut starting)?;
            if let Some(url) = &args.redis {
                let rt = real_runtime()?;
                rows.extend(rt.block_on(sweep::run_redis_grid(
                    &std::env::current_exe()?,
                    &grid,
                    url,
                    (max_ms, args.headroom),
                    &mut starting,
                ))?);
            }
            drop(progress);
            rows.sort_by_key(|r| (r.burst, r.rate_per_sec, r.jobs, r.workers));
            let table = sweep::markdown(&rows);
            if let Some(path) = &args.markdown {
                std::fs::write(path, &table)?;
            }
            if let Some(path) = &args.svg {
                std::fs::write(path, sweep::svg(&rows, redis_runs)?)?;
            }
            if args.json {
                writeln!(out, "{}", serde_json::to_string(&rows)?)?;
            } else {
                write!(out, "{table}")?;
            }
            Ok(())
        }
        Command::Worker(args) => {
            let s = args.workload.scenario(RetryAfterMode::Absent);
            let secrets = if args.secrets_on_stdin {
                multi::ChildSecrets::read(std::io::stdin().lock())?
            } else {
                multi::ChildSecrets::default()
            };
            let mut target = Target::new(args.url.clone());
            for line in &secrets.headers {
                target = target.header_line(line)?;
            }
            if let Some(path) = &args.ca_cert {
                target = target.ca_cert_file(path)?;
            }
            if let Some(url) = &args.usage_url {
                target = target.usage_probe(url.clone());
            }
            let store = match secrets.redis_url.as_ref().or(args.workload.redis.as_ref()) {
                Some(url) => StoreChoice::Redis {
                    url: url.clone(),
                    name: args
                        .workload
                        .name
                        .clone()
                        .unwrap_or_else(|| "sim".to_owned()),
                },
                None => StoreChoice::Memory,
            };
            let share = Share {
                offset: args.worker_offset,
                total_workers: args.total_workers,
            };
            let rt = real_runtime()?;
            let line = rt.block_on(async {
                let done = args.progress.then(|| Arc::new(AtomicUsize::new(0)));
                let _lines = done.clone().map(multi::ProgressLines::start);
                multi::run_child(&s, &target, &store, share, done).await
            })?;
            writeln!(out, "{line}")?;
            Ok(())
        }
        Command::Tokens(args) => crate::tokens::run(args, out),
    }
}

/// Prints a class run's report (or a worker process's records).
fn classes_out(
    workload: &Workload,
    outcome: &classes::ClassOutcome,
    out: &mut dyn Write,
) -> Result<(), BoxError> {
    match outcome {
        classes::ClassOutcome::Part(line) => writeln!(out, "{line}")?,
        classes::ClassOutcome::Report(report) => {
            if let Some(path) = &workload.timeline {
                std::fs::write(path, classes::svg(report)?)?;
            }
            if workload.json {
                writeln!(out, "{}", classes::json(report)?)?;
            } else {
                write!(out, "{}", classes::table(report))?;
            }
        }
    }
    Ok(())
}

/// Runs one of `allowance-sim adaptive`'s experiments (real-time runs spawn this executable
/// as their worker processes).
///
/// # Errors
///
/// As `allowance-sim run`.
pub fn run_experiment(experiment: &adaptive::Experiment) -> Result<RunReport, BoxError> {
    let argv = ["allowance-sim", "run"]
        .into_iter()
        .map(str::to_owned)
        .chain(experiment.args.iter().cloned());
    match Cli::try_parse_from(argv)?.command {
        Command::Run(args) => run_report(&args, false),
        _ => Err("not a run".into()),
    }
}

/// Makes the run `args` describe and returns its report (what `run` prints), showing
/// progress on stderr for real-time runs when `terminal`.
///
/// # Errors
///
/// Invalid or contradictory settings, or the run failing (as [`execute`]).
pub fn run_report(args: &RunArgs, terminal: bool) -> Result<RunReport, BoxError> {
    args.workload.check()?;
    let s = args.scenario();
    let spread = args.workload.processes > 1 || args.workload.redis.is_some();
    if spread && !args.real {
        return Err("--processes and --redis need real time: add --real".into());
    }
    if args.rate_chart.is_some() && args.real {
        return Err("--rate-chart needs virtual time (drop --real)".into());
    }
    if args.quota.is_some() && !args.real {
        return Err("--quota needs real time (the usage endpoint is HTTP): add --real".into());
    }
    args.check_scale(spread)?;
    if spread {
        let rt = real_runtime()?;
        let progress = Progress::maybe(&rt, &s, terminal);
        let spawn = multi::Spawn {
            ca_cert: None,
            progress: progress.as_ref().map(|p| p.done.clone()),
            usage_url: None,
            workers_per_process: args.workers_per_process.clone(),
        };
        let report = rt.block_on(run_real_spread(&s, args, &spawn));
        drop(progress);
        report
    } else if args.real {
        let rt = real_runtime()?;
        let progress = Progress::maybe(&rt, &s, terminal);
        let counter = progress.as_ref().map(|p| p.done.clone());
        let report = rt.block_on(live::run_real_on(upstream_config(&s, args), &s, counter));
        drop(progress);
        report
    } else {
        Ok(RunReport::from_virtual(&s, &scenario::run_virtual(&s)?))
    }
}

/// The upstream `run --real` starts: the scenario's bucket, `--retry-after`, `--quota`.
fn upstream_config(s: &Scenario, args: &RunArgs) -> UpstreamConfig {
    let mut config = live::upstream_config(&s.upstream);
    config.retry_after = args.retry_after;
    config.quota = args.quota;
    config
}

/// `run --real` over several processes and/or a Redis allowance: starts the upstream here,
/// the workers in child processes, and counts attempts from the upstream's log.
async fn run_real_spread(
    s: &Scenario,
    args: &RunArgs,
    spawn: &multi::Spawn,
) -> Result<RunReport, BoxError> {
    let config = upstream_config(s, args);
    let quota = config.quota.is_some();
    live::counted_by_upstream(config, |upstream| async move {
        let spawn = multi::Spawn {
            usage_url: quota.then(|| upstream.usage_url()),
            ..spawn.clone()
        };
        let spawn = &spawn;
        let headers = [format!(
            "{}: {DEFAULT_KEY}",
            allowance_testkit::upstream::API_KEY_HEADER
        )];
        if let Some(throttle) = args.throttle_at {
            upstream.throttle_at(throttle);
        }
        let mut report = multi::run_processes_with(
            &std::env::current_exe()?,
            s,
            &upstream.snapshot_url("e{job}"),
            &headers,
            &args.workload.store(),
            args.workload.processes as usize,
            spawn,
        )
        .await?;
        let split = multi::split_workers(
            s.workers,
            args.workload.processes as usize,
            spawn.workers_per_process.as_deref(),
        );
        scale::add_upstream_figures(&mut report, &upstream, &split);
        Ok(report)
    })
    .await
}

/// Parses `args` (the first being the program name) and runs them, as the binary does.
///
/// # Errors
///
/// Arguments that do not parse (with clap's message), or as [`execute`].
pub fn run_args<I, T>(args: I, out: &mut dyn Write) -> Result<(), BoxError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    execute(cli, out)
}

/// Whether progress may be drawn: stdout (the report) and stderr (the bar) both on a terminal.
fn on_a_terminal() -> bool {
    std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

fn real_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

fn describe_retry_after(mode: RetryAfterMode) -> String {
    match mode {
        RetryAfterMode::Seconds(n) => format!("Retry-After: {n}"),
        RetryAfterMode::HttpDate(n) => format!("an HTTP-date Retry-After {n} s ahead"),
        RetryAfterMode::Absent => "no Retry-After".to_owned(),
    }
}

fn seed(json: bool, out: &mut dyn Write) -> Result<(), BoxError> {
    let rows = scenario::seed_table();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "Eight workers share one key (upstream: burst 2, 2 req/s, 429 with Retry-After: 1), virtual time.\n\
         Rows 1, 4a and 4b: each worker's retry layer alone, no gate; 4a and 4b: the upstream always answers 429.\n"
    )?;
    write!(out, "{}", scenario::seed_table_text(&rows))?;
    Ok(())
}

fn print_report(
    report: &RunReport,
    w: &Workload,
    clock: &str,
    upstream: &str,
    out: &mut dyn Write,
) -> Result<(), BoxError> {
    if let Some(path) = &w.timeline {
        let title = format!(
            "{} ({} workers, {} jobs)",
            report.scenario, w.workers, w.jobs
        );
        std::fs::write(path, timeline::svg(&[(&title, report)])?)?;
    }
    if w.json {
        writeln!(out, "{}", serde_json::to_string(report)?)?;
        out.flush()?;
        return JobsFailed::check(report);
    }
    writeln!(
        out,
        "{} workers, {} jobs, mode {}; allowance: burst {} at {}/s; {}; {}\n",
        w.workers, w.jobs, report.scenario, report.burst, report.rate_per_sec, upstream, clock
    )?;
    writeln!(out, "{}", RunReport::header())?;
    writeln!(out, "{}", report.row())?;
    if report.abandoned > 0 {
        let reasons: Vec<String> = report
            .abandoned_by_reason
            .iter()
            .map(|(reason, n)| format!("{reason}: {n}"))
            .collect();
        writeln!(out, "abandoned by reason: {}", reasons.join(", "))?;
    }
    scale::print_figures(report, out)?;
    if report.failed > 0 {
        let causes: Vec<String> = report
            .failed_by_cause
            .iter()
            .map(|(cause, n)| format!("{cause}: {n}"))
            .collect();
        writeln!(out, "failed by cause: {}", causes.join(", "))?;
        let first = report.first_error.as_deref().unwrap_or("not reported");
        writeln!(out, "failed: {} (first error: {first})", report.failed)?;
    }
    writeln!(
        out,
        "attempts and 429s counted by the {}",
        report.counted_by
    )?;
    if let (Some(rate), Some(over)) = (report.achieved_rate, report.achieved_over_ms) {
        writeln!(
            out,
            "achieved: {rate:.2}/s over the last {:.1} s",
            over as f64 / 1000.0
        )?;
    }
    if let Some(rate) = report.final_rate {
        let each: Vec<String> = report
            .controller_rates
            .iter()
            .flatten()
            .map(|r| format!("{r:.2}"))
            .collect();
        writeln!(
            out,
            "adaptive rate at the end: {rate:.2}/s (each controller as read: {})",
            each.join(", ")
        )?;
    }
    for c in report.rate_changes.iter().flatten() {
        let settled = c.settled_after_ms.map_or("never settled".to_owned(), |ms| {
            format!("settled within 15% after {ms} ms")
        });
        writeln!(
            out,
            "upstream {}/s from {} ms: {settled}",
            c.rate_per_sec, c.at_ms
        )?;
    }
    if report.timeline.workers <= MAX_ASCII_LANES {
        writeln!(out, "\n{}", timeline::ascii(&report.timeline, 0, 64))?;
        writeln!(out, "{}", timeline::ASCII_LEGEND)?;
    }
    if let Some(path) = &w.timeline {
        writeln!(out, "timeline written to {}", path.display())?;
    }
    out.flush()?;
    JobsFailed::check(report)
}

/// A run that finished, report printed, with jobs that failed (neither completed nor
/// abandoned), or with no job completed: the binary prints it on stderr and exits with
/// [`EXIT_JOBS_FAILED`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobsFailed {
    /// Jobs that failed.
    pub failed: usize,
    /// Jobs in the run.
    pub jobs: usize,
    /// `cause: n` for each cause, comma-separated.
    pub causes: String,
    /// The first failed job's error, if known.
    pub first_error: Option<String>,
}

impl JobsFailed {
    /// `Err` when `report` has failed jobs.
    fn check(report: &RunReport) -> Result<(), BoxError> {
        if report.failed == 0 {
            // Every job abandoned (a server answering 503 every time, say) is not a run
            // that worked, whatever the reasons: no job completed.
            let ended = report
                .jobs
                .saturating_sub(report.scale.cancelled.unwrap_or(0));
            if report.completed > 0 || ended == 0 {
                return Ok(());
            }
            let reasons: Vec<String> = report
                .abandoned_by_reason
                .iter()
                .map(|(reason, n)| format!("abandoned {reason}: {n}"))
                .collect();
            return Err(Box::new(Self {
                failed: 0,
                jobs: report.jobs,
                causes: reasons.join(", "),
                first_error: None,
            }));
        }
        let causes: Vec<String> = report
            .failed_by_cause
            .iter()
            .map(|(cause, n)| format!("{cause}: {n}"))
            .collect();
        Err(Box::new(Self {
            failed: report.failed,
            jobs: report.jobs,
            causes: causes.join(", "),
            first_error: report.first_error.clone(),
        }))
    }
}

impl std::fmt::Display for JobsFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.failed == 0 {
            return write!(f, "no job of {} completed ({})", self.jobs, self.causes);
        }
        write!(
            f,
            "{} of {} jobs failed ({}); first: {}",
            self.failed,
            self.jobs,
            self.causes,
            self.first_error.as_deref().unwrap_or("not reported")
        )
    }
}

impl std::error::Error for JobsFailed {}

/// Exit status: every job completed or was abandoned by design.
pub const EXIT_OK: u8 = 0;
/// Exit status: the run could not be made (an invalid setting, an unreachable Redis, a
/// worker process that crashed...).
pub const EXIT_ERROR: u8 = 1;
/// Exit status: the command line does not parse (clap's own status).
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the run finished and its report was printed, but some jobs failed (store,
/// transport, or a final non-2xx status), or none completed (every one abandoned); the
/// first cause is printed on stderr.
pub const EXIT_JOBS_FAILED: u8 = 3;

/// The error and every cause under it, one after the other (`a: b: c`), so that the reason
/// at the bottom (`WRONGPASS`, `NOPERM`, `UnknownIssuer`) is printed, not only the top line;
/// a cause whose text its parent already shows is not repeated.
///
/// ```
/// use allowance_sim::cli::error_chain;
///
/// #[derive(Debug)]
/// struct Refused(std::io::Error);
/// impl std::fmt::Display for Refused {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("redis refused the connection")
///     }
/// }
/// impl std::error::Error for Refused {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
/// let e = Refused(std::io::Error::other("WRONGPASS invalid username-password pair"));
/// assert_eq!(
///     error_chain(&e),
///     "redis refused the connection: WRONGPASS invalid username-password pair"
/// );
/// ```
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let line = c.to_string();
        if !line.is_empty() && !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        cause = c.source();
    }
    text
}

/// The exit status for what [`execute`] or [`run_args`] returned.
///
/// ```
/// use allowance_sim::cli::{exit_status, EXIT_ERROR, EXIT_OK};
///
/// assert_eq!(exit_status(&Ok(())), EXIT_OK);
/// assert_eq!(exit_status(&Err("no such file".into())), EXIT_ERROR);
/// ```
pub fn exit_status(result: &Result<(), BoxError>) -> u8 {
    match result {
        Ok(()) => EXIT_OK,
        Err(e) if e.is::<JobsFailed>() => EXIT_JOBS_FAILED,
        Err(e) if e.is::<clap::Error>() => EXIT_USAGE,
        Err(_) => EXIT_ERROR,
    }
}

fn serve(args: ServeArgs, out: &mut dyn Write) -> Result<(), BoxError> {
    if let Some(tokens) = args.token_rate {
        return serve_tokens(&args, tokens, out);
    }
    let config = UpstreamConfig {
        burst: args.burst,
        rate_per_sec: args.rate,
        retry_after: args.retry_after,
        keys: args.keys.clone(),
        quota: args.quota,
        dialect: args.dialect,
        rate_changes: args.rate_changes.clone(),
    };
    let changes: String = config
        .schedule()
        .changes()
        .iter()
        .map(|c| format!(", {}/s from {} ms", c.rate_per_sec, c.at.as_millis()))
        .collect();
    let rt = real_runtime()?;
    rt.block_on(async {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], args.port));
        let upstream = Upstream::start_on(config, addr).await?;
        writeln!(out, "{}", upstream.url())?;
        out.flush()?;
        // The URL is what scripts read; if they stop reading after it, keep serving.
        let _ = writeln!(
            out,
            "serving: burst {} at {}/s per key{changes}, {} headers, 429s with {}, keys {:?}{}; Ctrl-C to stop",
            args.burst,
            args.rate,
            args.dialect,
            describe_retry_after(args.retry_after),
            args.keys,
            args.quota
                .map_or(String::new(), |q| format!(", quota {q} credits")),
        );
        let _ = writeln!(
            out,
            "try: curl -i -H 'X-API-Key: {}' {}",
            args.keys.first().map_or(DEFAULT_KEY, String::as_str),
            upstream.snapshot_url("e1")
        );
        let _ = out.flush();
        tokio::signal::ctrl_c().await?;
        let log = upstream.log();
        upstream.shutdown().await;
        let rejected = log.iter().filter(|r| r.status == 429).count();
        let _ = writeln!(
            out,
            "stopped: saw {} requests, {} of them 429",
            log.len(),
            rejected
        );
        Ok(())
    })
}

/// `serve --token-rate`: the [`TokenUpstream`], limiting requests (`--rate`, `--burst`, per
/// second) and tokens at once, per key.
fn serve_tokens(args: &ServeArgs, tokens: TokenRate, out: &mut dyn Write) -> Result<(), BoxError> {
    let requests = Rate::per_second(u64::from(args.rate), u64::from(args.burst));
    let tokens = Rate {
        rate: tokens.tokens,
        period: tokens.period,
        burst: args.token_burst.unwrap_or(tokens.tokens),
    };
    let config = TokenUpstreamConfig::new(requests, tokens).with_keys(args.keys.clone());
    let rt = real_runtime()?;
    rt.block_on(async {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], args.port));
        let upstream = TokenUpstream::start_on(config, addr).await?;
        writeln!(out, "{}", upstream.url())?;
        out.flush()?;
        let _ = writeln!(
            out,
            "serving any path: burst {} at {}/s requests and {} tokens per {} ms (burst {}) per key, cost in {TOKENS_HEADER}, keys {:?}; Ctrl-C to stop",
            args.burst,
            args.rate,
            tokens.rate,
            tokens.period.as_millis(),
            tokens.burst,
            args.keys,
        );
        let _ = writeln!(
            out,
            "try: curl -i -H 'Authorization: Bearer {}' -H '{TOKENS_HEADER}: 100' {}/v1/chat/completions",
            args.keys.first().map_or(DEFAULT_KEY, String::as_str),
            upstream.url()
        );
        let _ = out.flush();
        tokio::signal::ctrl_c().await?;
        let seen = upstream.summary(None);
        upstream.shutdown().await;
        let _ = writeln!(
            out,
            "stopped: saw {} requests, {} of them 429, {} tokens served",
            seen.attempts, seen.rejected, seen.tokens
        );
        Ok(())
    })
}

/// A progress bar on stderr, for real-time runs on a terminal that will take more than a
/// couple of seconds. Stops (and clears itself) on drop.
struct Progress {
    done: Arc<AtomicUsize>,
    bar: indicatif::ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    fn maybe(rt: &tokio::runtime::Runtime, s: &Scenario, terminal: bool) -> Option<Self> {
        if !terminal || live::expected_duration(s) < Duration::from_secs(2) {
            return None;
        }
        let total = u64::try_from(s.jobs).unwrap_or(u64::MAX);
        let style = indicatif::ProgressStyle::with_template(
            "{spinner} [{bar:30}] {pos}/{len} jobs done, {elapsed}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("#>-");
        let bar = indicatif::ProgressBar::new(total).with_style(style);
        let done = Arc::new(AtomicUsize::new(0));
        let (counter, shown) = (done.clone(), bar.clone());
        let task = rt.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let n = counter.load(Ordering::Relaxed);
                shown.set_position(u64::try_from(n).unwrap_or(u64::MAX));
            }
        });
        Some(Self { done, bar, task })
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

/// A progress bar for `sweep` on a terminal: one step per run, the current run as its
/// message. Clears itself on drop.
struct SweepProgress {
    bar: Option<indicatif::ProgressBar>,
    started: std::cell::Cell<u64>,
}

impl SweepProgress {
    fn maybe(runs: usize, terminal: bool) -> Self {
        let bar = terminal.then(|| {
            let style = indicatif::ProgressStyle::with_template(
                "{spinner} [{bar:30}] {pos}/{len} runs, {elapsed}: {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("#>-");
            let bar = indicatif::ProgressBar::new(u64::try_from(runs).unwrap_or(u64::MAX))
                .with_style(style);
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Self {
            bar,
            started: std::cell::Cell::new(0),
        }
    }

    /// A run is starting: the ones before it are done.
    fn starting(&self, what: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(self.started.get());
            bar.set_message(what.to_owned());
        }
        self.started.set(self.started.get() + 1);
    }
}

impl Drop for SweepProgress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress").finish_non_exhaustive()
    }
}

// === issue 15: measuring one allowance across processes ===

impl RunArgs {
    /// Refuses `--throttle-at`, `--workers-per-process` and `--cancel-fraction` where they
    /// would be ignored, and a split that does not match `--processes` and `--workers`.
    fn check_scale(&self, spread: bool) -> Result<(), BoxError> {
        if self.workload.cancel_fraction.is_some() && !self.real {
            return Err("--cancel-fraction needs real time: add --real".into());
        }
        if self.throttle_at.is_some() && !spread {
            return Err(
                "--throttle-at measures a cooldown across processes: add --processes N (and --redis URL to share one allowance)"
                    .into(),
            );
        }
        if let Some(split) = &self.workers_per_process {
            let (processes, workers) = (
                self.workload.processes as usize,
                self.workload.workers as usize,
            );
            if split.len() != processes
                || split.iter().sum::<usize>() != workers
                || split.contains(&0)
            {
                return Err(format!(
                    "--workers-per-process {} must list {processes} numbers (--processes), each at least 1, summing to {workers} (--workers)",
                    split.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
                )
                .into());
            }
        }
        Ok(())
    }
}

/// The command line's `--dialect`: `[possible values: odds, ietf, github, openai, anthropic]`
/// with each one's headers in `--help`.
fn dialect_parser() -> impl clap::builder::TypedValueParser<Value = ServerDialect> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

    let values = ServerDialect::ALL.map(|dialect| {
        let help = match dialect {
            ServerDialect::Odds => "x-ratelimit-limit/-remaining/-bucket, Retry-After (no reset)",
            ServerDialect::Ietf => {
                "RateLimit-Policy: \"default\";q=N;w=1 and RateLimit: \"default\";r=N;t=S"
            }
            ServerDialect::Github => {
                "x-ratelimit-limit/-remaining/-used/-reset (epoch seconds), Date"
            }
            ServerDialect::OpenAi => {
                "x-ratelimit-limit/-remaining/-reset-requests (Go durations: 20ms, 1s)"
            }
            ServerDialect::Anthropic => {
                "anthropic-ratelimit-requests-limit/-remaining/-reset (RFC 3339), Date"
            }
        };
        PossibleValue::new(dialect.name()).help(help)
    });
    PossibleValuesParser::new(values).try_map(|name| name.parse::<ServerDialect>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_experiments_parse() {
        let runs = adaptive::redis_experiments("redis://:secret@127.0.0.1:6379/");
        for e in adaptive::virtual_experiments().iter().chain(&runs) {
            let argv = ["allowance-sim", "run"]
                .into_iter()
                .map(str::to_owned)
                .chain(e.args.iter().cloned());
            assert!(Cli::try_parse_from(argv).is_ok(), "{}", e.command());
        }
    }

    #[test]
    fn parses_durations_and_retry_after() {
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_retry_after("3"), Ok(RetryAfterMode::Seconds(3)));
        assert_eq!(parse_retry_after("date:2"), Ok(RetryAfterMode::HttpDate(2)));
        assert_eq!(parse_retry_after("none"), Ok(RetryAfterMode::Absent));
        assert!(parse_retry_after("later").is_err());
    }

    #[test]
    fn help_reads_well() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("allowance-sim seed"));
    }
}
