//! Workers sharing (or not sharing) an allowance, in virtual time.
//!
//! Every run goes through the real layers (`AllowanceLayer`, or a bare `tower::retry::Retry`
//! with the library's `RetryPolicy` for the naive mode) against a [`FakeUpstream`], on a
//! paused Tokio clock, so the figures are exact and repeatable.

use std::{
    collections::BTreeMap,
    fmt,
    num::NonZeroU32,
    str::FromStr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use http::Request;
use tokio::time::Instant;
use tower::{retry::Retry, ServiceBuilder, ServiceExt};
use tower_allowance::{
    error::{AbandonReason, Abandoned},
    retry::RetryConfig,
    retry::RetryPolicy,
    signals::Dialect,
    AdaptiveRate, Allowance, AllowanceConfig, BoxError, ConfigError, Deadline, OutagePolicy,
    Outcome, RetryBudgetConfig,
};

use crate::{
    dialect::ServerDialect,
    fake::{FakeConfig, FakeUpstream, Seen, VIRTUAL_MAX_DATE_SKEW},
    job::{ceil_ms, JobEnd},
    upstream::WORKER_HEADER,
};

/// The library's default outage wait (`OutagePolicy::default()`: one minute).
const DEFAULT_MAX_OUTAGE_WAIT: Duration = Duration::from_secs(60);

/// How workers coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Each worker retries on its own, honouring `Retry-After`; no shared admission. A
    /// retry budget, if given, is one pool for the group (nothing else is shared).
    Naive,
    /// One allowance for everyone: shared admission, cooldown and retry budget.
    Shared,
    /// `n` independent allowances; worker `i` uses allowance `i % n`.
    Split(usize),
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Naive => f.write_str("naive"),
            Self::Shared => f.write_str("shared"),
            Self::Split(n) => write!(f, "split:{n}"),
        }
    }
}

/// A mode that is not `naive`, `shared` or `split:N` with `N` at least 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseModeError(String);

impl fmt::Display for ParseModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid mode {:?}: expected naive, shared or split:N (N >= 1)",
            self.0
        )
    }
}

impl std::error::Error for ParseModeError {}

impl FromStr for Mode {
    type Err = ParseModeError;

    /// Parses `naive`, `shared` or `split:N`.
    ///
    /// ```
    /// use allowance_testkit::scenario::Mode;
    ///
    /// assert_eq!("split:2".parse(), Ok(Mode::Split(2)));
    /// assert!("split:0".parse::<Mode>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "naive" => Ok(Self::Naive),
            "shared" => Ok(Self::Shared),
            _ => s
                .strip_prefix("split:")
                .and_then(|n| n.parse().ok())
                .filter(|n| *n >= 1)
                .map(Self::Split)
                .ok_or_else(|| ParseModeError(s.to_owned())),
        }
    }
}

/// What an admission does when the allowance's store (Redis) does not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStoreOutage {
    /// Wait for the store (probing with backoff) up to this long, then fail
    /// ([`OutagePolicy::Wait`]). Nothing is sent without the store's admission.
    Wait(Duration),
    /// Fail at once ([`OutagePolicy::FailFast`]): the job fails with a store error.
    FailFast,
    /// Decide in each process at the rate divided by `expected_processes` while Redis does
    /// not answer (`FailurePolicy::LocalFallback` of `tower-allowance-redis`).
    LocalFallback {
        /// The processes sharing the allowance (the run's `--processes`).
        expected_processes: NonZeroU32,
    },
}

impl Default for OnStoreOutage {
    /// Wait, up to the library's default (60 s).
    fn default() -> Self {
        Self::Wait(DEFAULT_MAX_OUTAGE_WAIT)
    }
}

impl OnStoreOutage {
    /// The allowance's outage policy for this choice (the local fallback answers in the
    /// store, so the allowance keeps the default).
    pub fn outage_policy(self) -> OutagePolicy {
        match self {
            Self::Wait(max) => OutagePolicy::Wait { max },
            Self::FailFast => OutagePolicy::FailFast,
            Self::LocalFallback { .. } => OutagePolicy::default(),
        }
    }

    /// The same choice for a run of `processes` processes (the local fallback divides the
    /// rate by it).
    pub fn for_processes(self, processes: u32) -> Self {
        match self {
            Self::LocalFallback { .. } => Self::LocalFallback {
                expected_processes: NonZeroU32::new(processes).unwrap_or(NonZeroU32::MIN),
            },
            other => other,
        }
    }
}

impl fmt::Display for OnStoreOutage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Wait(max) if *max == DEFAULT_MAX_OUTAGE_WAIT => f.write_str("wait"),
            Self::Wait(max) => write!(f, "wait:{}ms", max.as_millis()),
            Self::FailFast => f.write_str("fail-fast"),
            Self::LocalFallback { .. } => f.write_str("local-fallback"),
        }
    }
}

impl FromStr for OnStoreOutage {
    type Err = String;

    /// Parses `wait`, `wait:DURATION` (`wait:30s`, `wait:1500ms`), `fail-fast` or
    /// `local-fallback` (for one process until [`OnStoreOutage::for_processes`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use allowance_testkit::scenario::OnStoreOutage;
    ///
    /// assert_eq!("wait".parse(), Ok(OnStoreOutage::default()));
    /// assert_eq!("wait:1500ms".parse(), Ok(OnStoreOutage::Wait(Duration::from_millis(1500))));
    /// assert_eq!("fail-fast".parse(), Ok(OnStoreOutage::FailFast));
    /// assert!("later".parse::<OnStoreOutage>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "invalid store outage policy {s:?}: use wait, wait:DURATION (e.g. wait:30s), fail-fast or local-fallback"
            )
        };
        match s {
            "wait" => Ok(Self::default()),
            "fail-fast" => Ok(Self::FailFast),
            "local-fallback" => Ok(Self::LocalFallback {
                expected_processes: NonZeroU32::MIN,
            }),
            _ => {
                let d = s.strip_prefix("wait:").ok_or_else(bad)?;
                let max = match d.strip_suffix("ms") {
                    Some(ms) => ms.parse().map(Duration::from_millis).map_err(|_| bad())?,
                    None => d
                        .strip_suffix('s')
                        .unwrap_or(d)
                        .parse::<f64>()
                        .ok()
                        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
                        .ok_or_else(bad)?,
                };
                Ok(Self::Wait(max))
            }
        }
    }
}

/// An adaptive rate for a run's allowances (`--adaptive`): see
/// [`AdaptiveRate`] for what the controller does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptive {
    /// The starting rate, requests per second.
    pub initial: f64,
    /// The rate never goes below this.
    pub floor: f64,
    /// The rate never goes above this.
    pub ceiling: f64,
    /// Adopt a rate the server advertises (an IETF `RateLimit-Policy`), not only cap at it.
    pub adopt: bool,
}

impl Adaptive {
    /// The floor when none is given: [`DEFAULT_FLOOR`], or the starting rate if lower.
    pub fn default_floor(initial: f64) -> f64 {
        DEFAULT_FLOOR.min(initial)
    }

    /// The ceiling when none is given: [`DEFAULT_CEILING`], or the starting rate if higher.
    pub fn default_ceiling(initial: f64) -> f64 {
        DEFAULT_CEILING.max(initial)
    }

    /// Starting at `initial`, with the default floor and ceiling, not adopting.
    ///
    /// ```
    /// use allowance_testkit::scenario::Adaptive;
    ///
    /// let a = Adaptive::starting_at(2.0);
    /// assert_eq!((a.floor, a.ceiling, a.adopt), (0.5, 1000.0, false));
    /// assert_eq!(Adaptive::starting_at(0.2).floor, 0.2);
    /// assert!(a.rate().is_ok());
    /// ```
    pub fn starting_at(initial: f64) -> Self {
        Self {
            initial,
            floor: Self::default_floor(initial),
            ceiling: Self::default_ceiling(initial),
            adopt: false,
        }
    }

    /// The library's configuration for it.
    ///
    /// # Errors
    ///
    /// Rates the library rejects: not finite, outside 0.001..=10,000 per second, or not
    /// ordered `floor <= initial <= ceiling`.
    pub fn rate(&self) -> Result<AdaptiveRate, ConfigError> {
        Ok(AdaptiveRate::new(self.initial, self.floor, self.ceiling)?.adopt_advertised(self.adopt))
    }
}

/// The adaptive floor when none is given (0.5 requests per second, or the starting rate).
pub const DEFAULT_FLOOR: f64 = 0.5;

/// The adaptive ceiling when none is given (1,000 requests per second, or the starting rate).
pub const DEFAULT_CEILING: f64 = 1_000.0;

/// The share of jobs to cancel, from 0 to 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CancelFraction(f64);

impl CancelFraction {
    /// The share, from 0 to 1.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl std::str::FromStr for CancelFraction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().parse::<f64>() {
            Ok(f) if (0.0..=1.0).contains(&f) => Ok(Self(f)),
            _ => Err(format!(
                "invalid cancel fraction {s:?}: use a number from 0 to 1"
            )),
        }
    }
}

impl std::fmt::Display for CancelFraction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Coordination mode.
    pub mode: Mode,
    /// Concurrent workers.
    pub workers: usize,
    /// Jobs in total (one request each); worker `w` runs jobs `w`, `w + workers`, ... in turn.
    pub jobs: usize,
    /// The upstream's behaviour.
    pub upstream: FakeConfig,
    /// The allowance's burst (shared and split modes).
    pub burst: u32,
    /// The allowance's rate per second (shared and split modes).
    pub rate_per_sec: u32,
    /// Attempts per request, counting the first.
    pub max_attempts: u32,
    /// A batch retry budget for each allowance; `None` is unlimited.
    pub retry_budget: Option<u64>,
    /// A per-request deadline from the moment the job starts.
    pub deadline: Option<Duration>,
    /// Cancel this share of the jobs while they wait (real-time runs; see `allowance-sim`'s `cancel` module).
    pub cancel: Option<CancelFraction>,
    /// What an admission does when the allowance's store does not answer (Redis runs).
    pub on_store_outage: OnStoreOutage,
    /// An adaptive rate for the allowances (shared and split modes): `rate_per_sec` is then
    /// not used, `burst` is kept.
    pub adaptive: Option<Adaptive>,
    /// Which provider's headers the allowances read; `None`: the library's standard set
    /// (`Retry-After`, `retry-after-ms`, IETF, odds).
    pub dialect: Option<ServerDialect>,
    /// Keep the allowance exactly at `burst` and `rate_per_sec`, without the library's
    /// headroom for delivery jitter (`AllowanceConfig::exact`).
    pub exact: bool,
}

impl Scenario {
    /// The seed's persistent failure, as the seed runs it: an upstream that always answers
    /// 429 (with `Retry-After: 1`), 3 attempts per job, and `budget` retries for the whole
    /// group (`None`: unlimited), with the retry layer alone ([`Mode::Naive`]): no admission
    /// and no shared cooldown in front, each worker honouring `Retry-After` for its own
    /// retries, so that only the cap and the budget bound the attempts. Set `mode` for the
    /// same failure through shared admission.
    pub fn always_429(budget: Option<u64>) -> Self {
        Self {
            upstream: FakeConfig {
                always_reject: true,
                ..FakeConfig::seed()
            },
            max_attempts: 3,
            retry_budget: budget,
            ..Self::seed(Mode::Naive)
        }
    }

    /// The seed's setting: 8 workers, 8 jobs, burst 2 at 2/s on both sides, 10 attempts.
    ///
    /// Exact, as the seed's model is: its gate holds the upstream's limit to the token, and in
    /// virtual time nothing is delivered late or early (the headroom is for that).
    pub fn seed(mode: Mode) -> Self {
        Self {
            mode,
            workers: 8,
            jobs: 8,
            upstream: FakeConfig::seed(),
            burst: 2,
            rate_per_sec: 2,
            max_attempts: 10,
            retry_budget: None,
            deadline: None,
            cancel: None,
            on_store_outage: OnStoreOutage::default(),
            adaptive: None,
            dialect: None,
            exact: true,
        }
    }
}

/// What a run produced, from the server's log and the callers' outcomes.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    /// Attempts the server saw.
    pub attempts: usize,
    /// Of those, 429s.
    pub rejected: usize,
    /// Jobs that completed with a final response.
    pub completed: usize,
    /// Jobs abandoned, by reason.
    pub abandoned: BTreeMap<&'static str, usize>,
    /// Jobs that failed otherwise.
    pub failed: usize,
    /// Time of the last attempt the server saw, in ms from the start.
    pub last_attempt_ms: u64,
    /// Time until the last job finished, in ms, rounded up.
    pub makespan_ms: u64,
    /// Every attempt the server saw.
    pub timeline: Vec<Seen>,
    /// How and when each job ended, by worker.
    pub ends: Vec<JobEnd>,
    /// Adaptive runs: the rate the allowances allowed (summed over them), sampled every
    /// [`RATE_SAMPLE_EVERY`], as (ms from the start, requests per second).
    pub rate_samples: Vec<(u64, f64)>,
    /// Adaptive runs: each allowance's adaptive rate at the end, requests per second.
    pub final_rates: Vec<f64>,
}

impl Report {
    /// Jobs abandoned for any reason.
    pub fn abandoned_total(&self) -> usize {
        self.abandoned.values().sum()
    }

    /// The times of all attempts, in ms.
    pub fn attempt_times_ms(&self) -> Vec<u64> {
        self.timeline.iter().map(|s| s.at_ms).collect()
    }
}

/// The allowance configuration a scenario's workers share: its burst and rate, its batch
/// retry budget, and room in the queue for every worker.
///
/// # Errors
///
/// A configuration the library rejects (a zero rate or burst).
pub fn allowance_config(s: &Scenario) -> Result<AllowanceConfig, BoxError> {
    let budget = s
        .retry_budget
        .map_or(RetryBudgetConfig::Unlimited, RetryBudgetConfig::fixed);
    let mut config = AllowanceConfig::per_second(s.rate_per_sec, s.burst)?
        .with_retry_budget(budget)
        .with_max_waiters(s.workers.max(1))
        .with_outage_policy(s.on_store_outage.outage_policy());
    if s.exact {
        config = config.exact();
    }
    if let Some(adaptive) = &s.adaptive {
        config = config.with_adaptive_rate(adaptive.rate()?);
    }
    // Without `--dialect`: every standard and common header shape, against an upstream
    // speaking the odds API's.
    config = config.with_dialect(
        s.dialect
            .map_or(Dialect::generic(), ServerDialect::client_dialect),
    );
    Ok(config)
}

/// How often an adaptive run samples its allowances' rate (100 ms).
pub const RATE_SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The adaptive rates of `allowances` now, requests per second (0 for one whose store does
/// not answer).
pub async fn adaptive_rates(allowances: &[Allowance]) -> Vec<f64> {
    let mut rates = Vec::with_capacity(allowances.len());
    for a in allowances {
        let milli = a.store_state().await.map_or(0, |st| st.rate_milli);
        rates.push(milli as f64 / 1000.0);
    }
    rates
}

/// Samples the summed adaptive rate of `allowances` every [`RATE_SAMPLE_EVERY`] into
/// `samples` (ms since `start`, requests per second) until aborted.
pub fn sample_rates(
    allowances: Vec<Allowance>,
    start: Instant,
    samples: Arc<Mutex<Vec<(u64, f64)>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RATE_SAMPLE_EVERY);
        loop {
            tick.tick().await;
            let at = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            let rate: f64 = adaptive_rates(&allowances).await.iter().sum();
            samples
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((at, rate));
        }
    })
}

/// The allowance naive workers share when the group has a retry budget: the budget (one pool
/// for the group, as in the seed's scenario 4b) and nothing else. Its rate is far above any
/// upstream's (a million per second, bursts of a million), so it never paces anyone: each
/// worker still retries on its own, honouring `Retry-After`, and only the budget is common.
/// Only the workers' retries go through its admission layer ([`retries_through`]): each
/// spends from it when the policy decides on it, and one it refuses is not sent.
/// `None` without a budget.
///
/// # Errors
///
/// None in practice (the configuration is fixed); typed for the library's validation.
pub fn naive_budget_config(s: &Scenario) -> Result<Option<AllowanceConfig>, BoxError> {
    let Some(budget) = s.retry_budget else {
        return Ok(None);
    };
    Ok(Some(
        AllowanceConfig::per_second(1_000_000, 1_000_000)?
            .with_retry_budget(RetryBudgetConfig::fixed(budget))
            .with_max_waiters(s.workers.max(1))
            .with_outage_policy(s.on_store_outage.outage_policy()),
    ))
}

/// An allowance for a virtual run: the scenario's, trusting the fake upstream's `Date`
/// however far virtual time has run ahead of the wall clock.
fn allowance_for(s: &Scenario) -> Result<Allowance, BoxError> {
    Ok(Allowance::new(
        allowance_config(s)?.with_max_date_skew(VIRTUAL_MAX_DATE_SKEW),
    ))
}

/// A naive worker's own allowance: the policy's bookkeeping at the scenario's rate, with an
/// unlimited budget (the group's budget, if any, is the pool of [`naive_budget_config`]).
///
/// # Errors
///
/// A configuration the library rejects.
pub fn naive_own_allowance(s: &Scenario) -> Result<Allowance, BoxError> {
    Ok(Allowance::new(allowance_config(&naive_own(s))?))
}

/// The scenario of a naive worker's own allowance: no budget, no adaptive rate.
fn naive_own(s: &Scenario) -> Scenario {
    Scenario {
        retry_budget: None,
        adaptive: None,
        ..s.clone()
    }
}

type Svc = tower::util::BoxCloneService<Request<String>, http::Response<String>, BoxError>;

/// Naive mode's group budget: retries go through the pool's admission layer, which spends
/// the pool's budget for each (and refuses one it cannot fund: not sent); first attempts go
/// straight to `inner`. The pool is a budget, not a limiter: a retry's slot is reserved no
/// earlier than its server's `Retry-After`, and a first attempt queued behind that slot
/// would wait out another worker's 429. Under a `Retry` whose policy is told of the admission
/// layer ([`RetryPolicy::over_admission`]), each retry is decided and funded at once, and
/// waits out its own `Retry-After` for its slot.
pub fn retries_through<B, RB>(
    pool: &Allowance,
    inner: tower::util::BoxCloneService<Request<B>, http::Response<RB>, BoxError>,
) -> tower::util::BoxCloneService<Request<B>, http::Response<RB>, BoxError>
where
    B: Send + 'static,
    RB: Send + 'static,
{
    let admitted = tower::util::BoxCloneService::new(tower::Layer::layer(
        &tower_allowance::admission::AdmissionLayer::new(pool.clone()),
        inner.clone(),
    ));
    tower::util::BoxCloneService::new(tower::service_fn(move |req: Request<B>| {
        let retry = (req.extensions().get::<tower_allowance::Attempt>())
            .is_some_and(tower_allowance::Attempt::is_retry);
        let svc = if retry {
            admitted.clone()
        } else {
            inner.clone()
        };
        svc.oneshot(req)
    }))
}

/// Naive mode with one attempt per job: tower's `Retry` does not consult the policy for a
/// request it will not retry, so a final 429 or 503 would read as a final failure, where
/// the shared and split stacks (their cooldown layer) report it abandoned at `max_attempts`.
/// Marked here the same way (as `allowance-sim`'s real runs do), so that one situation reads
/// the same in every mode.
pub fn final_throttle_abandoned<Req, B>(
    svc: tower::util::BoxCloneService<Req, http::Response<B>, BoxError>,
    max_attempts: u32,
) -> tower::util::BoxCloneService<Req, http::Response<B>, BoxError>
where
    Req: 'static,
    B: Send + 'static,
{
    if max_attempts > 1 {
        return svc;
    }
    tower::util::BoxCloneService::new(svc.map_response(|mut res: http::Response<B>| {
        let throttled = matches!(
            res.status(),
            http::StatusCode::TOO_MANY_REQUESTS | http::StatusCode::SERVICE_UNAVAILABLE
        );
        if throttled && res.extensions().get::<Abandoned>().is_none() {
            res.extensions_mut()
                .insert(Abandoned::new(AbandonReason::MaxAttempts));
        }
        res
    }))
}

/// Runs one scenario on the current (paused-clock) runtime.
///
/// # Errors
///
/// A configuration the library rejects.
pub async fn run(s: &Scenario) -> Result<Report, BoxError> {
    let upstream = FakeUpstream::new(s.upstream.clone());
    let start = Instant::now();
    let retry = RetryConfig::default()
        .with_max_attempts(s.max_attempts)?
        .with_jitter_seed(1);
    let mut tasks = Vec::with_capacity(s.workers);

    let allowances: Vec<Allowance> = match s.mode {
        Mode::Naive => naive_budget_config(s)?
            .map(Allowance::new)
            .into_iter()
            .collect(),
        Mode::Shared => vec![allowance_for(s)?],
        Mode::Split(n) => (0..n.max(1))
            .map(|_| allowance_for(s))
            .collect::<Result<_, _>>()?,
    };
    let adaptive = s.adaptive.is_some() && s.mode != Mode::Naive;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = adaptive.then(|| sample_rates(allowances.clone(), start, samples.clone()));

    for worker in 0..s.workers {
        let upstream = upstream.clone();
        let deadline = s.deadline;
        let jobs = s.jobs;
        let workers = s.workers;
        let worker_id = u32::try_from(worker).unwrap_or(u32::MAX);
        // Each worker builds its stack once; jobs reuse it.
        let service = match s.mode {
            // Its own retry loop, the retry layer alone: no admission, no shared cooldown.
            Mode::Naive => {
                let upstream = ServiceExt::<Request<String>>::map_err(upstream, BoxError::from);
                let svc = match allowances.first() {
                    // The group's budget: every worker's retries are admitted by the one
                    // pool, which spends it, and one it refuses is not sent.
                    Some(pool) => Svc::new(Retry::new(
                        RetryPolicy::new(pool.clone())
                            .with_config(retry.clone())
                            .over_admission(),
                        retries_through(pool, Svc::new(upstream)),
                    )),
                    // Nothing shared: the retry layer alone, bounded by `max_attempts` (a
                    // private allowance serves only the policy's configuration).
                    None => Svc::new(Retry::new(
                        RetryPolicy::new(allowance_for(&naive_own(s))?).with_config(retry.clone()),
                        upstream,
                    )),
                };
                final_throttle_abandoned(svc, s.max_attempts)
            }
            Mode::Shared | Mode::Split(_) => {
                let allowance = allowances[worker % allowances.len()].clone();
                Svc::new(
                    ServiceBuilder::new()
                        .layer(allowance.layer().with_retry(retry.clone()))
                        .service(upstream),
                )
            }
        };
        tasks.push(tokio::spawn(async move {
            let mut outcomes: Vec<(Outcome, Instant, Instant)> = Vec::new();
            for _job in (worker..jobs).step_by(workers) {
                let started = Instant::now();
                let mut req = Request::new(String::new());
                req.headers_mut().insert(WORKER_HEADER, worker_id.into());
                if let Some(d) = deadline {
                    req.extensions_mut().insert(Deadline::after(d));
                }
                let result = service.clone().oneshot(req).await;
                outcomes.push((Outcome::of(&result), started, Instant::now()));
            }
            (worker_id, outcomes, Instant::now())
        }));
    }

    let mut report = Report {
        attempts: 0,
        rejected: 0,
        completed: 0,
        abandoned: BTreeMap::new(),
        failed: 0,
        last_attempt_ms: 0,
        makespan_ms: 0,
        timeline: Vec::new(),
        ends: Vec::new(),
        rate_samples: Vec::new(),
        final_rates: Vec::new(),
    };
    let mut finished = start;
    for task in tasks {
        let (worker, outcomes, done) = task.await?;
        finished = finished.max(done);
        for (outcome, started, at) in outcomes {
            let ms =
                |t: Instant| u64::try_from(t.duration_since(start).as_millis()).unwrap_or(u64::MAX);
            report
                .ends
                .push(JobEnd::new(worker, ms(started), ms(at), outcome));
            match outcome {
                Outcome::Completed => report.completed += 1,
                Outcome::Abandoned(reason) => {
                    *report.abandoned.entry(reason.as_str()).or_default() += 1
                }
                _ => report.failed += 1,
            }
        }
    }
    if let Some(sampler) = sampler {
        sampler.abort();
        report.final_rates = adaptive_rates(&allowances).await;
        report.rate_samples =
            std::mem::take(&mut *samples.lock().unwrap_or_else(PoisonError::into_inner));
    }
    report.timeline = upstream.log();
    report.attempts = report.timeline.len();
    report.rejected = report.timeline.iter().filter(|s| s.status == 429).count();
    report.last_attempt_ms = report.timeline.last().map_or(0, |s| s.at_ms);
    report.makespan_ms = ceil_ms(finished.duration_since(start));
    Ok(report)
}

/// Runs a scenario on a fresh current-thread runtime with a paused clock.
///
/// # Errors
///
/// A configuration the library rejects.
pub fn run_virtual(s: &Scenario) -> Result<Report, BoxError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?
        .block_on(run(s))
}

/// One row of the seed's table.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SeedRow {
    /// Which scenario.
    pub scenario: &'static str,
    /// Attempts the server saw.
    pub attempts: usize,
    /// 429s.
    pub rejected: usize,
    /// Jobs completed.
    pub completed: usize,
    /// Jobs abandoned.
    pub abandoned: usize,
    /// Time of the last attempt, ms.
    pub last_attempt_ms: u64,
}

impl SeedRow {
    fn new(scenario: &'static str, r: &Report) -> Self {
        Self {
            scenario,
            attempts: r.attempts,
            rejected: r.rejected,
            completed: r.completed,
            abandoned: r.abandoned_total(),
            last_attempt_ms: r.last_attempt_ms,
        }
    }
}

/// The seed's scenarios 1–4, by name.
pub fn seed_scenarios() -> Vec<(&'static str, Scenario)> {
    vec![
        (
            "1 naive: each worker retries alone",
            Scenario::seed(Mode::Naive),
        ),
        ("2 shared: one allowance", Scenario::seed(Mode::Shared)),
        ("3 split: two allowances", Scenario::seed(Mode::Split(2))),
        (
            "4a always 429, 3 attempts, no budget",
            Scenario::always_429(None),
        ),
        (
            "4b always 429, 3 attempts, budget 4",
            Scenario::always_429(Some(4)),
        ),
    ]
}

/// The seed's table, run through the real layers in virtual time.
///
/// # Panics
///
/// Only if the built-in scenarios were invalid (they are fixed and tested).
pub fn seed_table() -> Vec<SeedRow> {
    seed_scenarios()
        .iter()
        .map(|(name, s)| {
            let report = run_virtual(s).expect("built-in scenarios are valid");
            SeedRow::new(name, &report)
        })
        .collect()
}

/// The seed's table as text, a header line then one line per row: what the
/// `eight_workers` example and `allowance-sim seed` print, and the README shows (a test
/// holds the README to it).
///
/// ```
/// use allowance_testkit::scenario::{seed_table_text, SeedRow};
///
/// let row = SeedRow {
///     scenario: "2 shared: one allowance",
///     attempts: 8,
///     rejected: 0,
///     completed: 8,
///     abandoned: 0,
///     last_attempt_ms: 3000,
/// };
/// let text = seed_table_text(&[row]);
/// assert_eq!(text.lines().count(), 2);
/// assert!(text.ends_with("2 shared: one allowance                         8        0         8         0            3000\n"));
/// ```
pub fn seed_table_text(rows: &[SeedRow]) -> String {
    let mut text = format!(
        "{:<40} {:>8} {:>8} {:>9} {:>9} {:>15}\n",
        "scenario", "attempts", "rejected", "completed", "abandoned", "last attempt ms"
    );
    for r in rows {
        text.push_str(&format!(
            "{:<40} {:>8} {:>8} {:>9} {:>9} {:>15}\n",
            r.scenario, r.attempts, r.rejected, r.completed, r.abandoned, r.last_attempt_ms
        ));
    }
    text
}

/// Shorthand for the abandonment count of one reason.
pub fn abandoned(report: &Report, reason: AbandonReason) -> usize {
    report.abandoned.get(reason.as_str()).copied().unwrap_or(0)
}
