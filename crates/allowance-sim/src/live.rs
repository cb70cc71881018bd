//! Workers over real HTTP, in real time: the same stacks as [`scenario`],
//! around a pooled [`hyper_util::client::legacy::Client`].
//!
//! [`run_real`] starts an [`Upstream`] on loopback, runs the workers against it and counts
//! attempts from the *server's* log; [`run_http`] runs them against any URL, `http://` or
//! `https://`, and counts what came back. For https the system's trusted roots apply, plus
//! any CA added with [`Target::ca_cert_file`].
//!
//! ```no_run
//! use allowance_sim::live;
//! use allowance_testkit::scenario::{Mode, Scenario};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let report = live::run_real(&Scenario::seed(Mode::Shared), None).await?;
//! assert_eq!((report.attempts, report.rejected), (8, 0));
//! # Ok(())
//! # }
//! ```

use std::{
    future::Future,
    path::Path,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer},
    ClientConfig, RootCertStore,
};
use tokio::time::Instant;
use tower::{retry::Retry, util::BoxCloneService, ServiceBuilder, ServiceExt};
use tower_allowance::lease::LeaseStore;
use tower_allowance::{
    quota::{QuotaProbe, QuotaStatus, QuotaTrigger},
    retry::RetryConfig,
    retry::RetryPolicy,
    signals,
    store::MemoryStore,
    Allowance, AllowanceConfig, BoxError, Deadline,
};
use tower_allowance_redis::{FailurePolicy, RedisStore, RedisStoreOptions};

use allowance_testkit::{
    fake::FakeConfig,
    job::{Failure, JobEnd, Mark},
    report::{min_makespan_ms, RunReport, Timeline},
    scenario::{self, Mode, OnStoreOutage, Scenario},
    upstream::{
        parse_period_end, RetryAfterMode, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY,
        USAGE_PATH, WORKER_HEADER,
    },
};

use crate::cancel::{self, AttemptWatch, CancelPlan, CountReleases, ReleaseCounts};

/// The client every worker's stack wraps: HTTP/1.1, pooled, `http://` and `https://`.
pub type HttpsClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// A new [`HttpsClient`] trusting the operating system's roots plus `extra_roots`.
///
/// System certificates that cannot be read or parsed are skipped (a machine without any
/// still reaches `http://` URLs and servers whose CA is in `extra_roots`). TLS is rustls
/// with the `ring` provider, TLS 1.2 and 1.3.
///
/// # Errors
///
/// An extra root that is not a usable CA certificate.
pub fn https_client(extra_roots: &[CertificateDer<'static>]) -> Result<HttpsClient, BoxError> {
    client_trusting(true, extra_roots)
}

/// A new [`HttpsClient`] trusting `extra_roots`, and the operating system's roots too when
/// `system_roots`. Reading and parsing the system's roots takes milliseconds (3–16 ms per
/// process measured on a loaded 2-core machine, in every child of a `--processes` run, before
/// its first request), wasted for a run that never makes a TLS connection.
fn client_trusting(
    system_roots: bool,
    extra_roots: &[CertificateDer<'static>],
) -> Result<HttpsClient, BoxError> {
    let mut roots = RootCertStore::empty();
    if system_roots {
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    }
    for cert in extra_roots {
        roots
            .add(cert.clone())
            .map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// Now on the wall clock, in µs since the Unix epoch: the one clock a parent and its children
/// share. Read once per process, where its times start; `None` before 1970.
#[allow(clippy::disallowed_methods)] // the wall clock, to put several processes on one clock
pub fn wall_clock_us() -> Option<u64> {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    u64::try_from(since.as_micros()).ok()
}

/// Where the workers send their GETs.
#[derive(Clone, Debug)]
pub struct Target {
    url: String,
    headers: HeaderMap,
    worker_header: bool,
    extra_roots: Arc<Vec<CertificateDer<'static>>>,
    usage_url: Option<String>,
}

impl Target {
    /// One GET per job to `url`; `{job}` in it is replaced by the job's number.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            headers: HeaderMap::new(),
            worker_header: false,
            extra_roots: Arc::default(),
            usage_url: None,
        }
    }

    /// Gives the run's allowances (shared and split modes) a quota probe: when a 429 without
    /// `Retry-After` arrives, one `GET usage_url` (with the target's headers) for the whole
    /// allowance, across processes on Redis, reads `exceeded` and `period_end_utc` in the
    /// upstream's `/v1/usage` format; an exhausted quota closes the allowance until then.
    pub fn usage_probe(mut self, usage_url: impl Into<String>) -> Self {
        self.usage_url = Some(usage_url.into());
        self
    }

    /// The usage endpoint the allowances probe, if any.
    pub fn usage_url(&self) -> Option<&str> {
        self.usage_url.as_deref()
    }

    /// Also trusts the CA certificates in the PEM file at `path` for `https://` URLs, on top
    /// of the system's roots (a private CA, or a self-signed server certificate).
    ///
    /// # Errors
    ///
    /// The file cannot be read, holds no PEM certificate, or a certificate in it is not
    /// usable as a root.
    pub fn ca_cert_file(mut self, path: &Path) -> Result<Self, BoxError> {
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("CA file {shown}: {e}"))?;
        if certs.is_empty() {
            return Err(format!("CA file {shown}: no PEM certificate in the file").into());
        }
        // Fail here, once, rather than on every job.
        let mut check = RootCertStore::empty();
        for cert in &certs {
            check
                .add(cert.clone())
                .map_err(|e| format!("CA file {shown}: not a usable CA certificate: {e}"))?;
        }
        Arc::make_mut(&mut self.extra_roots).extend(certs);
        Ok(self)
    }

    /// A client for this target: [`https_client`] with the target's extra roots. When
    /// neither the target's URL nor its usage URL is `https://`, the system's roots are not
    /// loaded (no TLS connection will need them; see [`https_client`]).
    ///
    /// # Errors
    ///
    /// As [`https_client`].
    pub fn client(&self) -> Result<HttpsClient, BoxError> {
        client_trusting(self.uses_tls(), &self.extra_roots)
    }

    /// Whether the target's URL or its usage URL is `https://`.
    fn uses_tls(&self) -> bool {
        let tls = |url: &str| {
            url.trim_start()
                .get(..8)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
        };
        tls(&self.url) || self.usage_url.as_deref().is_some_and(tls)
    }

    /// Snapshots of events `e0`, `e1`, ... from `upstream`, with `key`, telling it which
    /// worker sent each attempt (the `x-worker` header) so its log can be drawn by lane.
    ///
    /// # Errors
    ///
    /// A key that is not a valid header value.
    pub fn upstream(upstream: &Upstream, key: &str) -> Result<Self, BoxError> {
        let mut target = Self::new(upstream.snapshot_url("e{job}")).header(API_KEY_HEADER, key)?;
        target.worker_header = true;
        Ok(target)
    }

    /// Adds a header to every request.
    ///
    /// # Errors
    ///
    /// An invalid header name or value.
    pub fn header(mut self, name: &str, value: &str) -> Result<Self, BoxError> {
        let name = HeaderName::from_bytes(name.trim().as_bytes())?;
        let mut value = HeaderValue::from_str(value.trim())?;
        // Headers often carry keys: never shown by `Debug`.
        value.set_sensitive(true);
        self.headers.append(name, value);
        Ok(self)
    }

    /// Adds a header given as `"Name: value"`.
    ///
    /// # Errors
    ///
    /// No colon, or an invalid name or value.
    pub fn header_line(self, line: &str) -> Result<Self, BoxError> {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("header {line:?} is not of the form 'Name: value'"))?;
        self.header(name, value)
    }

    /// The URL of one job.
    pub fn url_for(&self, job: usize) -> String {
        self.url.replace("{job}", &job.to_string())
    }

    pub(crate) fn request(
        &self,
        job: usize,
        worker: u32,
    ) -> Result<Request<Empty<Bytes>>, BoxError> {
        let mut req = Request::get(self.url_for(job)).body(Empty::new())?;
        req.headers_mut().extend(self.headers.clone());
        req.extensions_mut().insert(Worker(worker));
        if self.worker_header {
            req.headers_mut().insert(WORKER_HEADER, worker.into());
        }
        Ok(req)
    }
}

/// Which worker a request belongs to, for the client-side log.
#[derive(Clone, Copy, Debug)]
struct Worker(u32);

type Svc = BoxCloneService<Request<Empty<Bytes>>, Response<Bytes>, BoxError>;

fn ms_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The client, reading each body to the end and logging each attempt as it comes back.
fn observed(client: HttpsClient, marks: Arc<Mutex<Vec<Mark>>>, start: Instant) -> Svc {
    Svc::new(tower::service_fn(move |req: Request<Empty<Bytes>>| {
        let client = client.clone();
        let marks = marks.clone();
        async move {
            let worker = req.extensions().get::<Worker>().map_or(0, |w| w.0);
            let at_ms = ms_since(start);
            let watch = req.extensions().get::<AttemptWatch>().cloned();
            let _sending = watch.map(|w| Sending::new(w, at_ms));
            let record = |status: u16, headers: Option<&HeaderMap>| {
                let retry_after_ms = headers
                    .and_then(|h| signals::retry_after(h).ok().flatten())
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                marks
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Mark {
                        worker,
                        at_ms,
                        status,
                        retry_after_ms,
                    });
            };
            match client.request(req).await {
                Ok(res) => {
                    let (parts, body) = res.into_parts();
                    record(parts.status.as_u16(), Some(&parts.headers));
                    let body = body.collect().await?.to_bytes();
                    Ok(Response::from_parts(parts, body))
                }
                Err(e) => {
                    record(0, None);
                    Err(BoxError::from(e))
                }
            }
        }
    }))
}

/// Marks a job's attempt as on its way for as long as it is (see [`crate::cancel`]).
struct Sending(AttemptWatch);

impl Sending {
    fn new(watch: AttemptWatch, at_ms: u64) -> Self {
        watch.sending(at_ms);
        Self(watch)
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.answered();
    }
}

/// How this process connects to Redis, as the command line says (`--redis-ca-cert`,
/// `--redis-cluster`); set once, before a run, by [`set_redis_connect`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisConnect {
    /// PEM: the CA certificates a `rediss://` server's certificate must chain to (default: the
    /// system's roots).
    pub ca_cert: Option<Vec<u8>>,
    /// Where `ca_cert` was read from (passed on to worker processes).
    pub ca_cert_path: Option<std::path::PathBuf>,
    /// The URL is a comma-separated list of a Redis Cluster's seed nodes.
    pub cluster: bool,
}

static REDIS_CONNECT: std::sync::OnceLock<RedisConnect> = std::sync::OnceLock::new();

/// Sets how this process connects to Redis (the first call wins).
pub fn set_redis_connect(connect: RedisConnect) {
    let _ = REDIS_CONNECT.set(connect);
}

/// How this process connects to Redis ([`set_redis_connect`], or the defaults).
pub fn redis_connect() -> RedisConnect {
    REDIS_CONNECT.get().cloned().unwrap_or_default()
}

static LEASE: std::sync::OnceLock<Option<tower_allowance::lease::Lease>> =
    std::sync::OnceLock::new();

/// Sets the lease this process's allowances admit from (`--lease`; the first call wins).
pub fn set_lease(lease: Option<tower_allowance::lease::Lease>) {
    let _ = LEASE.set(lease);
}

/// The lease of [`set_lease`], if any.
pub fn lease() -> Option<tower_allowance::lease::Lease> {
    LEASE.get().copied().flatten()
}

/// Connects the Redis store `name` at `url` as [`redis_connect`] says: one server or a
/// cluster's seed nodes (comma-separated), the CA to trust for `rediss://`.
///
/// # Errors
///
/// The store's [`ConnectError`](tower_allowance_redis::error::ConnectError).
pub async fn connect_redis(
    url: &str,
    name: &str,
    mut options: RedisStoreOptions,
) -> Result<RedisStore, BoxError> {
    let connect = redis_connect();
    if let Some(pem) = connect.ca_cert {
        options = options.tls_ca_cert(pem);
    }
    let store = if connect.cluster {
        RedisStore::connect_cluster(url.split(',').map(str::trim), name, options).await?
    } else {
        RedisStore::connect(url, name, options).await?
    };
    Ok(store)
}

/// [`connect_redis`], waiting out an unreachable Redis as the run's outage policy says: under
/// `wait:D` a process started while Redis is paused (or restarting) keeps trying for up to D,
/// as its admissions would, rather than exiting; a refusal (a wrong password, a missing
/// permission) fails at once.
///
/// # Errors
///
/// As [`connect_redis`], once the policy's wait is over (at once under `fail-fast`).
pub async fn connect_waiting(
    url: &str,
    name: &str,
    options: RedisStoreOptions,
    policy: OnStoreOutage,
) -> Result<RedisStore, BoxError> {
    let deadline = match policy {
        OnStoreOutage::Wait(d) => tokio::time::Instant::now() + d,
        _ => tokio::time::Instant::now(),
    };
    loop {
        match connect_redis(url, name, options.clone()).await {
            Err(e) if unreachable(&*e) && tokio::time::Instant::now() < deadline => {
                use std::io::Write as _;
                let _ = writeln!(
                    std::io::stderr(),
                    "redis is unreachable ({e}); waiting for it"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            other => return other,
        }
    }
}

fn unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<tower_allowance_redis::error::ConnectError>()
        .is_some_and(|c| c.kind() == tower_allowance_redis::error::ConnectErrorKind::Unreachable)
}

/// Where a run's allowances live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StoreChoice {
    /// In this process's memory: each process has its own allowance.
    #[default]
    Memory,
    /// In Redis at `url`, under the allowance name `name` (`name-1`, `name-2`, ... for the
    /// further allowances of `split:N`): every process using the same name shares it.
    Redis {
        /// The Redis URL.
        url: String,
        /// The allowance's name (letters, digits, `_.:-`).
        name: String,
    },
}

/// Which part of a run this process takes: the workers `offset..offset + s.workers` of
/// `total_workers`, each running the jobs `worker, worker + total_workers, ...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// The first worker's global number.
    pub offset: usize,
    /// Workers across all processes.
    pub total_workers: usize,
}

impl Share {
    /// The whole run in this process.
    pub fn whole(s: &Scenario) -> Self {
        Self {
            offset: 0,
            total_workers: s.workers,
        }
    }
}

/// The allowances of one process's run, and the Redis stores behind them (for counting
/// their calls).
struct Allowances {
    /// Shared and split modes: the allowances the workers use, round-robin. Naive mode: the
    /// group's retry-budget pool, if any.
    all: Vec<Allowance>,
    /// Each Redis store with its call count right after connecting.
    stores: Vec<(RedisStore, u64)>,
    /// Releases of reserved slots, over every allowance.
    releases: Arc<ReleaseCounts>,
}

impl Allowances {
    async fn new(
        s: &Scenario,
        store: &StoreChoice,
        probe: Option<UsageProbe>,
    ) -> Result<Self, BoxError> {
        let mut this = Self {
            all: Vec::new(),
            stores: Vec::new(),
            releases: Arc::default(),
        };
        // Each allowance with the suffix of its name: the first of a run has the run's name
        // (in Redis, shared by every process), the others `-1`, `-2`..., a naive pool `-budget`.
        let configs: Vec<(AllowanceConfig, Option<String>)> = match s.mode {
            Mode::Naive => scenario::naive_budget_config(s)?
                .map(|c| vec![(c, Some("budget".to_owned()))])
                .unwrap_or_default(),
            Mode::Shared => vec![(scenario::allowance_config(s)?, None)],
            Mode::Split(n) => {
                let config = scenario::allowance_config(s)?;
                (0..n.max(1))
                    .map(|i| (config.clone(), (i > 0).then(|| i.to_string())))
                    .collect()
            }
        };
        for (config, suffix) in configs {
            let base = match store {
                StoreChoice::Redis { name, .. } => name.as_str(),
                StoreChoice::Memory => "sim",
            };
            let name = match suffix {
                Some(suffix) => format!("{base}-{suffix}"),
                None => base.to_owned(),
            };
            let redis = match store {
                StoreChoice::Memory => None,
                StoreChoice::Redis { url, .. } => {
                    let options = match s.on_store_outage {
                        // A lease holder falls back itself, at its share of the holders.
                        OnStoreOutage::LocalFallback { .. } if lease().is_some() => {
                            RedisStoreOptions::new()
                        }
                        OnStoreOutage::LocalFallback { expected_processes } => {
                            RedisStoreOptions::new()
                                .failure_policy(FailurePolicy::LocalFallback { expected_processes })
                        }
                        _ => RedisStoreOptions::new(),
                    };
                    let store = connect_waiting(url, &name, options, s.on_store_outage).await?;
                    this.stores.push((store.clone(), store.round_trips()));
                    Some(store)
                }
            };
            let mut builder = Allowance::builder(config).name(name);
            if let (Some(probe), false) = (&probe, s.mode == Mode::Naive) {
                builder = builder.quota_probe(probe.clone(), QuotaTrigger::after_consecutive(1)?);
            }
            let fallback = matches!(s.on_store_outage, OnStoreOutage::LocalFallback { .. });
            builder = match (redis, lease()) {
                (Some(store), Some(lease)) => builder.store(CountReleases::new(
                    LeaseStore::new(store, lease.local_fallback(fallback)),
                    this.releases.clone(),
                )),
                (None, Some(lease)) => builder.store(CountReleases::new(
                    LeaseStore::new(MemoryStore::new(), lease),
                    this.releases.clone(),
                )),
                (Some(store), None) => {
                    builder.store(CountReleases::new(store, this.releases.clone()))
                }
                (None, None) => builder.store(CountReleases::new(
                    MemoryStore::new(),
                    this.releases.clone(),
                )),
            };
            this.all.push(builder.build());
        }
        Ok(this)
    }

    /// Admissions made so far, over every allowance.
    fn admissions(&self) -> u64 {
        self.all.iter().map(|a| a.snapshot().admitted).sum()
    }

    /// Redis calls made since connecting, over every store; `None` without Redis.
    fn store_calls(&self) -> Option<u64> {
        (!self.stores.is_empty()).then(|| {
            self.stores
                .iter()
                .map(|(store, at_connect)| store.round_trips().saturating_sub(*at_connect))
                .sum()
        })
    }
}

/// The quota probe of [`Target::usage_probe`]: `GET /v1/usage` with the target's headers.
#[derive(Clone)]
struct UsageProbe {
    client: HttpsClient,
    url: String,
    headers: HeaderMap,
}

impl std::fmt::Debug for UsageProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageProbe")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl QuotaProbe for UsageProbe {
    fn probe(&self) -> Pin<Box<dyn Future<Output = Result<QuotaStatus, BoxError>> + Send>> {
        let this = self.clone();
        Box::pin(async move {
            let mut request = Request::get(&this.url).body(Empty::new())?;
            request.headers_mut().extend(this.headers.clone());
            let response = this.client.request(request).await?;
            if !response.status().is_success() {
                // Throttled or broken: the allowance backs off before probing again.
                return Err(format!("usage endpoint answered {}", response.status()).into());
            }
            // "Until the period ends" is measured against the upstream's clock, not ours.
            let date = response
                .headers()
                .get(http::header::DATE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| httpdate::parse_http_date(v).ok())
                .ok_or("usage response without a valid Date")?;
            let body = response.into_body().collect().await?.to_bytes();
            let usage: serde_json::Value = serde_json::from_slice(&body)?;
            if usage["exceeded"] != true {
                return Ok(QuotaStatus::Available);
            }
            let end = usage["period_end_utc"]
                .as_str()
                .and_then(parse_period_end)
                .ok_or("usage response without a valid period_end_utc")?;
            let retry_in = end.duration_since(date).unwrap_or(Duration::ZERO);
            Ok(QuotaStatus::Exhausted { retry_in })
        })
    }
}

/// Runs `s`'s workers against `target` in real time; attempts are counted as the client
/// saw them (`counted_by: "client"`). `s.upstream` is not used.
///
/// `progress`, if given, is incremented as each job ends.
///
/// # Errors
///
/// A configuration the library rejects, or a URL that does not parse.
pub async fn run_http(
    s: &Scenario,
    target: &Target,
    progress: Option<Arc<AtomicUsize>>,
) -> Result<RunReport, BoxError> {
    run_http_with(s, target, progress, &StoreChoice::Memory, Share::whole(s)).await
}

/// [`run_http`] with the allowances in `store`, running `share` of a larger run (the part of
/// one process of a multi-process run; see [`crate::multi`]).
///
/// # Errors
///
/// As [`run_http`], or a Redis that cannot be reached.
pub async fn run_http_with(
    s: &Scenario,
    target: &Target,
    progress: Option<Arc<AtomicUsize>>,
    store: &StoreChoice,
    share: Share,
) -> Result<RunReport, BoxError> {
    // Fail early on a bad URL rather than once per job.
    target.request(0, 0)?;
    let retry = RetryConfig::default()
        .with_max_attempts(s.max_attempts)?
        .with_jitter_seed(1);
    let client = target.client()?;
    let probe = target.usage_url.as_ref().map(|url| UsageProbe {
        client: client.clone(),
        url: url.clone(),
        headers: target.headers.clone(),
    });
    let allowances = Allowances::new(s, store, probe).await?;
    let marks = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let started_unix_us = wall_clock_us();
    let inner = observed(client, marks.clone(), start);
    // A waiting job is cancelled within about the time a job waits: every worker's turn.
    let cancel = s.cancel.map(|fraction| {
        let rate = f64::from(s.rate_per_sec.max(1));
        let turn = Duration::from_secs_f64(share.total_workers as f64 / rate);
        CancelPlan::new(fraction, turn)
    });

    let mut tasks = Vec::with_capacity(s.workers);
    for local in 0..s.workers {
        let worker = share.offset + local;
        let worker_id = u32::try_from(worker).unwrap_or(u32::MAX);
        let service = match s.mode {
            // Its own retry loop honouring Retry-After, and nothing shared.
            // With a group budget, the pool: its admission layer holds each retry to the
            // pool's verdict. Else a private allowance for the policy's bookkeeping.
            Mode::Naive => {
                let svc = match allowances.all.first() {
                    Some(pool) => Svc::new(Retry::new(
                        RetryPolicy::new(pool.clone())
                            .with_config(retry.clone())
                            .over_admission(),
                        scenario::retries_through(pool, inner.clone()),
                    )),
                    None => Svc::new(Retry::new(
                        RetryPolicy::new(scenario::naive_own_allowance(s)?)
                            .with_config(retry.clone()),
                        inner.clone(),
                    )),
                };
                scenario::final_throttle_abandoned(svc, s.max_attempts)
            }
            Mode::Shared | Mode::Split(_) => Svc::new(
                ServiceBuilder::new()
                    .layer(
                        (allowances.all[worker % allowances.all.len()])
                            .layer()
                            .with_retry(retry.clone()),
                    )
                    .service(inner.clone()),
            ),
        };
        let target = target.clone();
        let (jobs, workers, deadline) = (s.jobs, share.total_workers.max(1), s.deadline);
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let mut ends = Vec::new();
            let mut first_error = None;
            for job in (worker..jobs).step_by(workers) {
                let started_ms = ms_since(start);
                let mut req = target.request(job, worker_id)?;
                if let Some(d) = deadline {
                    req.extensions_mut().insert(Deadline::after(d));
                }
                let watch = AttemptWatch::default();
                req.extensions_mut().insert(watch.clone());
                let cancel_after = cancel.and_then(|plan| plan.for_job(job));
                let call = service.clone().oneshot(req);
                let end = match cancel::unless_cancelled(call, cancel_after, &watch).await {
                    Some(result) => {
                        let end = JobEnd::of(worker_id, started_ms, ms_since(start), &result);
                        if first_error.is_none() {
                            first_error = failure_text(&end, &result);
                        }
                        end
                    }
                    None => JobEnd::cancelled(worker_id, started_ms, ms_since(start)),
                };
                ends.push(end.timed(job, watch.first_sent_ms()));
                if let Some(p) = &progress {
                    p.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, BoxError>((ends, first_error))
        }));
    }
    let mut ends = Vec::with_capacity(s.jobs);
    let mut first_error = None;
    for task in tasks {
        let (part, error) = task.await??;
        ends.extend(part);
        first_error = first_error.or(error);
    }
    let makespan = start.elapsed();
    let mut attempts = std::mem::take(&mut *marks.lock().unwrap_or_else(PoisonError::into_inner));
    attempts.sort_by_key(|m| m.at_ms);
    let timeline = Timeline::new(s.mode, s.workers, attempts, ends);
    let mut report = RunReport::new(s, "real", "client", timeline, makespan);
    report.first_error = first_error;
    if !allowances.all.is_empty() {
        report.admissions = Some(allowances.admissions());
    }
    if s.adaptive.is_some() && s.mode != Mode::Naive {
        let rates = scenario::adaptive_rates(&allowances.all).await;
        let sum = rates.iter().sum();
        report = report.with_final_rates(rates, sum);
    }
    report.store_calls = allowances.store_calls();
    report.scale.releases = Some(allowances.releases.get());
    report.scale.started_unix_us = started_unix_us;
    Ok(report)
}

/// What a failed job's end says about why: its final status, or its error with the causes.
fn failure_text<B>(end: &JobEnd, result: &Result<Response<B>, BoxError>) -> Option<String> {
    match (end.failure?, result) {
        (Failure::Status(status), _) => Some(format!("final status {status}")),
        (_, Err(e)) => Some(error_chain(e.as_ref())),
        (cause, Ok(_)) => Some(format!("failed ({cause})")),
    }
}

/// `e` and its sources, as `outer: inner: root`, leaving out a source whose text the error
/// before it already shows.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// The [`UpstreamConfig`] matching a scenario's [`FakeConfig`]: same bucket, rate changes,
/// dialect and `Retry-After` seconds; `always_reject` becomes a spent quota (429s without
/// `Retry-After`).
pub fn upstream_config(fake: &FakeConfig) -> UpstreamConfig {
    let retry_after = fake
        .retry_after_secs
        .map_or(RetryAfterMode::Absent, RetryAfterMode::Seconds);
    let config = UpstreamConfig::new(fake.burst, fake.rate_per_sec)
        .with_retry_after(retry_after)
        .with_dialect(fake.dialect)
        .with_rate_changes(&fake.rate_changes);
    if fake.always_reject {
        config.with_quota(0)
    } else {
        config
    }
}

/// Starts an [`Upstream`] for `s` on loopback (with `retry_after` if given, else
/// `s.upstream`'s seconds), runs the workers against it over real HTTP, stops it, and
/// reports the attempts and 429s from the server's own log (`counted_by: "server"`).
///
/// # Errors
///
/// The upstream could not bind, or as [`run_http`].
pub async fn run_real(
    s: &Scenario,
    retry_after: Option<RetryAfterMode>,
) -> Result<RunReport, BoxError> {
    run_real_with_progress(s, retry_after, None).await
}

/// [`run_real`] with a job counter for progress display.
///
/// # Errors
///
/// As [`run_real`].
pub async fn run_real_with_progress(
    s: &Scenario,
    retry_after: Option<RetryAfterMode>,
    progress: Option<Arc<AtomicUsize>>,
) -> Result<RunReport, BoxError> {
    let mut config = upstream_config(&s.upstream);
    if let Some(mode) = retry_after {
        config.retry_after = mode;
    }
    run_real_on(config, s, progress).await
}

/// Starts an [`Upstream`] with `config`, runs `s`'s workers in this process against it over
/// real HTTP, and reports from the server's log. With a quota in `config`, the allowances
/// probe the upstream's `/v1/usage` ([`Target::usage_probe`]).
///
/// # Errors
///
/// As [`run_real`].
pub async fn run_real_on(
    config: UpstreamConfig,
    s: &Scenario,
    progress: Option<Arc<AtomicUsize>>,
) -> Result<RunReport, BoxError> {
    let quota = config.quota.is_some();
    counted_by_upstream(config, |upstream| async move {
        let mut target = Target::upstream(&upstream, DEFAULT_KEY)?;
        if quota {
            target = target.usage_probe(upstream.usage_url());
        }
        run_http(s, &target, progress).await
    })
    .await
}

/// Starts an [`Upstream`] with `config`, runs `run` against it, stops it, and replaces the
/// report's attempt and 429 counts with the upstream's own (`counted_by: "server"`): the
/// snapshot requests it saw, and apart from them the `/v1/usage` requests it served
/// (`usage_probes`).
///
/// # Errors
///
/// The upstream could not bind, or `run` failed.
pub async fn counted_by_upstream<F, Fut>(
    config: UpstreamConfig,
    run: F,
) -> Result<RunReport, BoxError>
where
    F: FnOnce(Arc<Upstream>) -> Fut,
    Fut: std::future::Future<Output = Result<RunReport, BoxError>>,
{
    let upstream = Arc::new(Upstream::start(config).await?);
    let result = run(upstream.clone()).await;
    let seen = upstream.log();
    if let Ok(upstream) = Arc::try_unwrap(upstream) {
        upstream.shutdown().await;
    }
    let mut report = result?;
    let (usage, snapshots): (Vec<_>, Vec<_>) = seen.iter().partition(|r| r.path == USAGE_PATH);
    report.counted_by = "server";
    report.attempts = snapshots.len();
    report.rejected = snapshots.iter().filter(|r| r.status == 429).count();
    report.usage_probes = Some(usage.len());
    Ok(report)
}

/// How long a real run of `s` should take at least, for deciding whether to show progress.
pub fn expected_duration(s: &Scenario) -> Duration {
    Duration::from_millis(min_makespan_ms(s.jobs, s.burst, s.rate_per_sec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_roots_are_loaded_only_for_tls() {
        assert!(!Target::new("http://127.0.0.1:1/{job}").uses_tls());
        assert!(Target::new("HTTPS://api.example/{job}").uses_tls());
        assert!(Target::new("http://127.0.0.1:1/{job}")
            .usage_probe("https://api.example/v1/usage")
            .uses_tls());
        assert!(!Target::new("http://127.0.0.1:1/{job}")
            .usage_probe("http://127.0.0.1:1/v1/usage")
            .uses_tls());
        assert!(!Target::new("htt").uses_tls());
    }
}
