//! Workers over real HTTP, in real time: the same stacks as [`scenario`](crate::scenario),
//! around a pooled [`hyper_util::client::legacy::Client`].
//!
//! [`run_real`] starts an [`Upstream`] on loopback, runs the workers against it and counts
//! attempts from the *server's* log; [`run_http`] runs them against any URL, `http://` or
//! `https://`, and counts what came back. For https the system's trusted roots apply, plus
//! any CA added with [`Target::ca_cert_file`].
//!
//! ```no_run
//! use allowance_sim::{live, scenario::{Mode, Scenario}};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let report = live::run_real(&Scenario::seed(Mode::Shared), None).await?;
//! assert_eq!((report.attempts, report.rejected), (8, 0));
//! # Ok(())
//! # }
//! ```

use std::{
    path::Path,
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
use tower_allowance::{
    headers, retry::RetryConfig, retry::RetryPolicy, Allowance, AllowanceLayer, BoxError, Deadline,
    Outcome,
};
use tower_allowance_redis::{RedisStore, RedisStoreOptions};

use crate::{
    fake::{FakeConfig, WORKER_HEADER},
    report::{JobEnd, Mark, RunReport, Timeline},
    scenario::{Mode, Scenario},
    upstream::{RetryAfterMode, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};

/// A plain HTTP/1.1 client, pooled, without TLS.
pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// A new [`HttpClient`].
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

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
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
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

/// Where the workers send their GETs.
#[derive(Clone, Debug)]
pub struct Target {
    url: String,
    headers: HeaderMap,
    worker_header: bool,
    extra_roots: Arc<Vec<CertificateDer<'static>>>,
}

impl Target {
    /// One GET per job to `url`; `{job}` in it is replaced by the job's number.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            headers: HeaderMap::new(),
            worker_header: false,
            extra_roots: Arc::default(),
        }
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

    /// A client for this target: [`https_client`] with the target's extra roots.
    ///
    /// # Errors
    ///
    /// As [`https_client`].
    pub fn client(&self) -> Result<HttpsClient, BoxError> {
        https_client(&self.extra_roots)
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
        let value = HeaderValue::from_str(value.trim())?;
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

    fn request(&self, job: usize, worker: u32) -> Result<Request<Empty<Bytes>>, BoxError> {
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
            let record = |status: u16, headers: Option<&HeaderMap>| {
                let retry_after_ms = headers
                    .and_then(|h| headers::retry_after(h).ok().flatten())
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

async fn allowance_for(
    s: &Scenario,
    store: &StoreChoice,
    index: usize,
) -> Result<Allowance, BoxError> {
    let config = crate::scenario::allowance_config(s)?;
    Ok(match store {
        StoreChoice::Memory => Allowance::new(config),
        StoreChoice::Redis { url, name } => {
            let name = if index == 0 {
                name.clone()
            } else {
                format!("{name}-{index}")
            };
            let store = RedisStore::connect(url, &name, RedisStoreOptions::new()).await?;
            Allowance::with_store(config, store)
        }
    })
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
    let allowances: Vec<Allowance> = match s.mode {
        Mode::Naive => Vec::new(),
        Mode::Shared => vec![allowance_for(s, store, 0).await?],
        Mode::Split(n) => {
            let mut all = Vec::with_capacity(n.max(1));
            for i in 0..n.max(1) {
                all.push(allowance_for(s, store, i).await?);
            }
            all
        }
    };
    let client = target.client()?;
    let marks = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let inner = observed(client, marks.clone(), start);

    let mut tasks = Vec::with_capacity(s.workers);
    for local in 0..s.workers {
        let worker = share.offset + local;
        let worker_id = u32::try_from(worker).unwrap_or(u32::MAX);
        let service = match s.mode {
            // Its own retry loop honouring Retry-After, and nothing shared.
            Mode::Naive => Svc::new(Retry::new(
                RetryPolicy::new(
                    allowance_for(s, &StoreChoice::Memory, 0).await?,
                    retry.clone(),
                ),
                inner.clone(),
            )),
            Mode::Shared | Mode::Split(_) => Svc::new(
                ServiceBuilder::new()
                    .layer(AllowanceLayer::new(
                        allowances[worker % allowances.len()].clone(),
                        retry.clone(),
                    ))
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
                let result = service.clone().oneshot(req).await;
                let outcome = Outcome::of(&result);
                if let (Outcome::Failed, Err(e), None) = (outcome, &result, &first_error) {
                    first_error = Some(error_chain(e.as_ref()));
                }
                ends.push(JobEnd::new(worker_id, started_ms, ms_since(start), outcome));
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
    Ok(report)
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

/// The [`UpstreamConfig`] matching a scenario's [`FakeConfig`]: same bucket and
/// `Retry-After` seconds; `always_reject` becomes a spent quota (429s without `Retry-After`).
pub fn upstream_config(fake: &FakeConfig) -> UpstreamConfig {
    let retry_after = fake
        .retry_after_secs
        .map_or(RetryAfterMode::Absent, RetryAfterMode::Seconds);
    let config = UpstreamConfig::new(fake.burst, fake.rate_per_sec).with_retry_after(retry_after);
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
    counted_by_upstream(config, |upstream| async move {
        let target = Target::upstream(&upstream, DEFAULT_KEY)?;
        run_http(s, &target, progress).await
    })
    .await
}

/// Starts an [`Upstream`] with `config`, runs `run` against it, stops it, and replaces the
/// report's attempt and 429 counts with the upstream's own (`counted_by: "server"`).
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
    report.counted_by = "server";
    report.attempts = seen.len();
    report.rejected = seen.iter().filter(|r| r.status == 429).count();
    Ok(report)
}

/// How long a real run of `s` should take at least, for deciding whether to show progress.
pub fn expected_duration(s: &Scenario) -> Duration {
    Duration::from_millis(crate::report::min_makespan_ms(
        s.jobs,
        s.burst,
        s.rate_per_sec,
    ))
}
