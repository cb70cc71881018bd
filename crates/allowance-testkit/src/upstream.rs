//! A real HTTP/1.1 throttling upstream, shaped like the odds API the seed article uses.
//!
//! [`Upstream::start`] binds `127.0.0.1:0` and serves, until [`Upstream::shutdown`] (or drop):
//!
//! - `GET /v1/events/{event_id}/odds/snapshot`: a small JSON snapshot. The API key comes in
//!   `X-API-Key`; a missing or unknown key is a 401 `{"detail": "..."}`.
//! - One token bucket per key ([`UpstreamConfig::burst`], [`UpstreamConfig::rate_per_sec`]).
//!   Over the limit: 429 with `Retry-After` as configured ([`RetryAfterMode`]) and
//!   `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Bucket`.
//! - A monthly credit quota per key ([`UpstreamConfig::quota`]): every 200 snapshot costs one
//!   credit; once they are spent, every snapshot call is a 429 *without* `Retry-After`, as the
//!   real API does (throttling and quota exhaustion share the status).
//! - `GET /v1/usage`: `{"api_credits_used", "api_credits_limit", "exceeded", "period_end_utc"}`.
//!   It costs a request (a bucket token, no credit) and can itself be throttled; it still
//!   answers once the quota is spent, so a client can find out why it is being refused.
//! - One 429 with `Retry-After` at a chosen moment, whatever the bucket says
//!   ([`Upstream::throttle_at`], `run --throttle-at MS:SECS`).
//!
//! Every attempt is logged ([`Upstream::log`]) with its time, key, path and status, so a run
//! reports what the *server* saw, not what the clients believe.
//!
//! ```
//! use allowance_testkit::upstream::{Upstream, UpstreamConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let upstream = Upstream::start(UpstreamConfig::default()).await?;
//! assert!(upstream.url().starts_with("http://127.0.0.1:"));
//! assert!(upstream.log().is_empty());
//! upstream.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # The bucket
//!
//! Independent of the library's GCRA on purpose: a classic bucket whose level is kept in
//! integer microseconds of refill time (one token = `1_000_000 / rate_per_sec` µs), starting
//! full. It admits a request up to a tenth of a token early ([`TOLERANCE_DIVISOR`]), the
//! delay-variation tolerance real limiters have: a client pacing at exactly the allowed rate
//! sees its requests arrive with a little scheduling jitter, and should not be punished for a
//! request that is a millisecond early.

use std::{
    collections::HashMap,
    convert::Infallible,
    fmt,
    net::SocketAddr,
    str::FromStr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::{TokioExecutor, TokioIo},
    server::graceful::GracefulShutdown,
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle, time::Instant};

use crate::dialect::{Answer, LimitState, ServerDialect};

mod throttle;

pub use self::throttle::{ThrottleAt, Throttled};

/// The header carrying the API key.
pub const API_KEY_HEADER: &str = "x-api-key";

/// The header a scenario uses to tell the upstream which worker sent an attempt.
pub const WORKER_HEADER: &str = "x-worker";

/// The key [`UpstreamConfig::default`] accepts.
pub const DEFAULT_KEY: &str = "sim-key";

/// A request may be admitted this fraction of a token early (1/10): see the module docs.
pub const TOLERANCE_DIVISOR: u64 = 10;

/// How long [`Upstream::shutdown`] lets open connections finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The path of one event's odds snapshot.
///
/// ```
/// assert_eq!(allowance_testkit::upstream::snapshot_path("e7"), "/v1/events/e7/odds/snapshot");
/// ```
pub fn snapshot_path(event_id: &str) -> String {
    format!("/v1/events/{event_id}/odds/snapshot")
}

/// The usage endpoint's path.
pub const USAGE_PATH: &str = "/v1/usage";

/// What a 429 for throttling says about when to come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfterMode {
    /// `Retry-After: N` (delay-seconds).
    Seconds(u64),
    /// `Retry-After` as an HTTP-date this many seconds ahead (with a matching `Date` header).
    HttpDate(u64),
    /// No `Retry-After` at all.
    Absent,
}

/// A change of the upstream's rate during a run: from `at` (since the upstream started) on,
/// its buckets refill `rate_per_sec`. The burst stays; the tokens a bucket holds stay (a
/// level of 1.5 tokens is still 1.5 tokens at the new rate).
///
/// Parsed from `AT:RATE`, e.g. `30s:10` or `1500ms:4`:
///
/// ```
/// use std::time::Duration;
/// use allowance_testkit::upstream::RateChange;
///
/// let change: RateChange = "30s:10".parse()?;
/// assert_eq!(change, RateChange { at: Duration::from_secs(30), rate_per_sec: 10 });
/// assert_eq!(change.to_string(), "30000ms:10");
/// assert!("30s".parse::<RateChange>().is_err());
/// assert!("30s:0".parse::<RateChange>().is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RateChange {
    /// When, since the upstream started.
    pub at: Duration,
    /// The new rate, requests per second (at least 1).
    pub rate_per_sec: u32,
}

impl FromStr for RateChange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("invalid rate change {s:?}: use AT:RATE, e.g. 30s:10 or 1500ms:4");
        let (at, rate) = s.split_once(':').ok_or_else(bad)?;
        let at = match at.trim().strip_suffix("ms") {
            Some(ms) => ms
                .trim()
                .parse()
                .map(Duration::from_millis)
                .map_err(|_| bad())?,
            None => {
                let secs: f64 = at
                    .trim()
                    .strip_suffix('s')
                    .unwrap_or(at.trim())
                    .parse()
                    .map_err(|_| bad())?;
                Duration::try_from_secs_f64(secs).map_err(|_| bad())?
            }
        };
        let rate_per_sec: u32 = rate.trim().parse().map_err(|_| bad())?;
        if rate_per_sec == 0 {
            return Err(bad());
        }
        Ok(Self { at, rate_per_sec })
    }
}

impl fmt::Display for RateChange {
    /// `AT:RATE` with the time in whole milliseconds, as [`FromStr`] reads it back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms:{}", self.at.as_millis(), self.rate_per_sec)
    }
}

/// An upstream's rate over time: a starting rate and [`RateChange`]s, in time order.
///
/// ```
/// use std::time::Duration;
/// use allowance_testkit::upstream::{RateChange, RateSchedule};
///
/// let s = RateSchedule::new(20, &["30s:10".parse()?, "10s:40".parse()?]);
/// assert_eq!(s.rate_at(Duration::from_secs(5)), 20);
/// assert_eq!(s.rate_at(Duration::from_secs(10)), 40);
/// assert_eq!(s.rate_at(Duration::from_secs(90)), 10);
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateSchedule {
    initial: u32,
    changes: Vec<RateChange>,
}

impl RateSchedule {
    /// `initial` requests per second (0 is treated as 1), then `changes` (sorted here).
    pub fn new(initial: u32, changes: &[RateChange]) -> Self {
        let mut changes = changes.to_vec();
        changes.sort();
        Self {
            initial: initial.max(1),
            changes,
        }
    }

    /// The rate in force `elapsed` after the start (a change applies from its instant on).
    pub fn rate_at(&self, elapsed: Duration) -> u32 {
        self.changes
            .iter()
            .take_while(|c| c.at <= elapsed)
            .last()
            .map_or(self.initial, |c| c.rate_per_sec.max(1))
    }

    /// The starting rate.
    pub fn initial(&self) -> u32 {
        self.initial
    }

    /// The changes, in time order.
    pub fn changes(&self) -> &[RateChange] {
        &self.changes
    }

    /// The changes after `from` and at or before `to`, in time order.
    pub fn changes_between(
        &self,
        from: Duration,
        to: Duration,
    ) -> impl Iterator<Item = &RateChange> + '_ {
        self.changes
            .iter()
            .filter(move |c| c.at > from && c.at <= to)
    }
}

/// Microseconds between tokens at `rate_per_sec` (0 is treated as 1).
pub(crate) fn interval_us(rate_per_sec: u32) -> u64 {
    1_000_000 / u64::from(rate_per_sec.max(1))
}

/// A level kept in microseconds of refill time at `from_us` per token, as the same number
/// of tokens at `to_us` per token (rounded down: never more tokens than there were).
pub(crate) fn rescale_level(level_us: i64, from_us: u64, to_us: u64) -> i64 {
    let scaled = i128::from(level_us) * i128::from(to_us) / i128::from(from_us.max(1));
    i64::try_from(scaled).unwrap_or(if scaled < 0 { i64::MIN } else { i64::MAX })
}

/// How the upstream throttles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Bucket capacity per key (requests that may arrive back to back).
    pub burst: u32,
    /// Refill per key, in requests per second (0 is treated as 1).
    pub rate_per_sec: u32,
    /// What a throttling 429 says about when to retry.
    pub retry_after: RetryAfterMode,
    /// The accepted API keys.
    pub keys: Vec<String>,
    /// Monthly credits per key (one per 200 snapshot); `None` is unlimited.
    pub quota: Option<u64>,
    /// Whose rate-limit headers the answers carry (default: the odds API's).
    pub dialect: ServerDialect,
    /// Changes of the rate during the run, from the upstream's start.
    pub rate_changes: Vec<RateChange>,
}

impl Default for UpstreamConfig {
    /// The seed's server: burst 2, 2 requests/s, `Retry-After: 1`, one key
    /// ([`DEFAULT_KEY`]), no quota.
    fn default() -> Self {
        Self::new(2, 2)
    }
}

impl UpstreamConfig {
    /// A bucket of `burst` refilling `rate_per_sec`, `Retry-After: 1`, key [`DEFAULT_KEY`],
    /// no quota.
    pub fn new(burst: u32, rate_per_sec: u32) -> Self {
        Self {
            burst,
            rate_per_sec,
            retry_after: RetryAfterMode::Seconds(1),
            keys: vec![DEFAULT_KEY.to_owned()],
            quota: None,
            dialect: ServerDialect::default(),
            rate_changes: Vec::new(),
        }
    }

    /// Speaks `dialect`: see [`ServerDialect::headers`] for what each answer carries.
    pub fn with_dialect(mut self, dialect: ServerDialect) -> Self {
        self.dialect = dialect;
        self
    }

    /// Changes the rate during the run (each change from its time since the start on).
    pub fn with_rate_changes(mut self, changes: &[RateChange]) -> Self {
        self.rate_changes = changes.to_vec();
        self
    }

    /// The rate over time: [`UpstreamConfig::rate_per_sec`], then the changes.
    pub fn schedule(&self) -> RateSchedule {
        RateSchedule::new(self.rate_per_sec, &self.rate_changes)
    }

    /// Sets the `Retry-After` mode.
    pub fn with_retry_after(mut self, mode: RetryAfterMode) -> Self {
        self.retry_after = mode;
        self
    }

    /// Replaces the accepted keys.
    pub fn with_keys<I, K>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        self.keys = keys.into_iter().map(Into::into).collect();
        self
    }

    /// Sets a monthly credit quota per key.
    pub fn with_quota(mut self, credits: u64) -> Self {
        self.quota = Some(credits);
        self
    }
}

/// One attempt the upstream saw.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SeenRequest {
    /// Milliseconds since the upstream started.
    pub at_ms: u64,
    /// The `X-API-Key` sent (empty when missing).
    pub key: String,
    /// The request path (without query).
    pub path: String,
    /// The status returned.
    pub status: u16,
    /// The worker that sent it, from the `x-worker` header, when given.
    pub worker: Option<u32>,
}

/// A per-key token bucket in integer microseconds of refill time.
///
/// The level may dip below zero by at most the tolerance: an early admission is paid back
/// out of the next refill, so the sustained rate never exceeds the rate in force. When the
/// rate changes ([`RateSchedule`]), the level keeps its tokens at the new interval.
#[derive(Debug)]
struct Bucket {
    level_us: i64,
    last: Instant,
    /// Microseconds per token at the rate in force since `last`.
    interval_us: u64,
}

/// What a bucket says after a request: whether it was admitted, the whole tokens left, the
/// time until the next whole token (zero while some are left), and the rate in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Taken {
    ok: bool,
    remaining: u64,
    next_token: Duration,
    rate_per_sec: u32,
}

impl Bucket {
    fn full(config: &UpstreamConfig, now: Instant) -> Self {
        let interval_us = interval_us(config.rate_per_sec);
        Self {
            level_us: capacity_us(config.burst, interval_us),
            last: now,
            interval_us,
        }
    }

    /// Refills by `elapsed` at the current interval, up to the burst.
    fn refill(&mut self, burst: u32, elapsed: Duration) {
        let elapsed = i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX);
        self.level_us = self
            .level_us
            .saturating_add(elapsed)
            .min(capacity_us(burst, self.interval_us));
    }

    /// Refills up to `now` (through any rate change since the last request; `start` is when
    /// the schedule began), then takes a token if one is (almost) there.
    fn take(
        &mut self,
        config: &UpstreamConfig,
        schedule: &RateSchedule,
        start: Instant,
        now: Instant,
    ) -> Taken {
        // Requests read the clock before taking the lock: one may arrive here "before" the
        // last one. It counts as at the same instant.
        let now = now.max(self.last);
        let from = self.last.saturating_duration_since(start);
        let to = now.saturating_duration_since(start);
        let mut at = from;
        for change in schedule.changes_between(from, to) {
            self.refill(config.burst, change.at - at);
            let interval = interval_us(change.rate_per_sec);
            self.level_us = rescale_level(self.level_us, self.interval_us, interval);
            self.interval_us = interval;
            at = change.at;
        }
        self.refill(config.burst, to - at);
        self.last = now;
        let interval = i64::try_from(self.interval_us).unwrap_or(i64::MAX);
        let tolerance = interval / i64::try_from(TOLERANCE_DIVISOR).unwrap_or(1);
        let ok = config.burst > 0 && self.level_us.saturating_add(tolerance) >= interval;
        if ok {
            self.level_us -= interval;
        }
        let remaining = u64::try_from(self.level_us.max(0) / interval).unwrap_or(0);
        let short_us = if remaining == 0 {
            u64::try_from(interval - self.level_us.max(0)).unwrap_or(0)
        } else {
            0
        };
        Taken {
            ok,
            remaining,
            next_token: Duration::from_micros(short_us),
            rate_per_sec: schedule.rate_at(to),
        }
    }
}

fn capacity_us(burst: u32, interval_us: u64) -> i64 {
    i64::from(burst).saturating_mul(i64::try_from(interval_us).unwrap_or(i64::MAX))
}

#[derive(Debug)]
struct KeyState {
    bucket: Bucket,
    credits_used: u64,
}

#[derive(Debug)]
struct State {
    keys: HashMap<String, KeyState>,
    log: Vec<SeenRequest>,
    /// One 429 at a chosen moment ([`Upstream::throttle_at`]).
    forced: throttle::Forced,
}

#[derive(Debug)]
struct Shared {
    config: UpstreamConfig,
    schedule: RateSchedule,
    start: Instant,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running upstream. Dropping it stops accepting connections; [`Upstream::shutdown`] also
/// waits for open connections to close.
pub struct Upstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("addr", &self.addr)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

// === impl Upstream ===

impl Upstream {
    /// Starts serving on `127.0.0.1:0` (a free port).
    ///
    /// # Errors
    ///
    /// Binding the listener failed.
    pub async fn start(config: UpstreamConfig) -> std::io::Result<Upstream> {
        Self::start_on(config, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts serving on `addr`.
    ///
    /// # Errors
    ///
    /// Binding the listener failed.
    pub async fn start_on(config: UpstreamConfig, addr: SocketAddr) -> std::io::Result<Upstream> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let now = Instant::now();
        let keys = config
            .keys
            .iter()
            .map(|k| {
                let state = KeyState {
                    bucket: Bucket::full(&config, now),
                    credits_used: 0,
                };
                (k.clone(), state)
            })
            .collect();
        let shared = Arc::new(Shared {
            schedule: config.schedule(),
            config,
            start: now,
            state: Mutex::new(State {
                keys,
                log: Vec::new(),
                forced: throttle::Forced::default(),
            }),
        });
        let (stop, stopped) = oneshot::channel();
        let serving = shared.clone();
        let task = tokio::spawn(serve_http(
            listener,
            move |req: &Request<Incoming>| handle(&serving, req),
            stopped,
        ));
        Ok(Upstream {
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, like `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL of one event's snapshot.
    pub fn snapshot_url(&self, event_id: &str) -> String {
        format!("{}{}", self.url(), snapshot_path(event_id))
    }

    /// The URL of the usage endpoint.
    pub fn usage_url(&self) -> String {
        format!("{}{USAGE_PATH}", self.url())
    }

    /// Its configuration.
    pub fn config(&self) -> &UpstreamConfig {
        &self.shared.config
    }

    /// Every attempt seen so far, in order.
    pub fn log(&self) -> Vec<SeenRequest> {
        self.shared.lock().log.clone()
    }

    /// Asks for a cooldown once: the first snapshot request `throttle.after` the upstream's
    /// start (or now, if that has passed) is answered 429 with `Retry-After:
    /// throttle.retry_after_secs`, whatever the bucket says; the requests after it are
    /// answered by the bucket as usual. [`Upstream::throttled`] then says when it was sent.
    pub fn throttle_at(&self, throttle: ThrottleAt) {
        let at = self.shared.start + throttle.after;
        self.shared.lock().forced.arm(at, throttle.retry_after_secs);
    }

    /// When the 429 of [`Upstream::throttle_at`] was sent, if it has been.
    pub fn throttled(&self) -> Option<Throttled> {
        self.shared.lock().forced.fired(self.shared.start)
    }

    /// Credits `key` has spent, if it is a known key.
    pub fn credits_used(&self, key: &str) -> Option<u64> {
        self.shared.lock().keys.get(key).map(|k| k.credits_used)
    }

    /// Stops accepting, lets open connections finish (for up to two seconds), and returns
    /// once the server task is done.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves HTTP/1.1 on `listener` with `handle` until `stopped` fires, then lets open
/// connections finish (for up to [`SHUTDOWN_GRACE`]). Both test servers run on it.
pub(crate) async fn serve_http<H>(
    listener: TcpListener,
    handle: H,
    mut stopped: oneshot::Receiver<()>,
) where
    H: Fn(&Request<Incoming>) -> Response<Full<Bytes>> + Clone + Send + Sync + 'static,
{
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let handle = handle.clone();
                    let service = service_fn(move |req| {
                        let res = handle(&req);
                        async move { Ok::<_, Infallible>(res) }
                    });
                    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        // A client hanging up mid-request is not the upstream's problem.
                        let _ = conn.await;
                    });
                }
                // Out of descriptors or similar: back off a little rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = &mut stopped => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

// === request handling ===

/// A JSON response with `status`.
pub(crate) fn json(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

fn detail(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(status, serde_json::json!({ "detail": message }).to_string())
}

enum Route {
    Snapshot(String),
    Usage,
}

fn route(path: &str) -> Option<Route> {
    if path == USAGE_PATH {
        return Some(Route::Usage);
    }
    let id = path
        .strip_prefix("/v1/events/")?
        .strip_suffix("/odds/snapshot")?;
    (!id.is_empty() && !id.contains('/')).then(|| Route::Snapshot(id.to_owned()))
}

fn handle(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let now = Instant::now();
    let key = req
        .headers()
        .get(API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let worker = req
        .headers()
        .get(WORKER_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let path = req.uri().path().to_owned();

    let mut state = shared.lock();
    let response = respond(shared, &mut state, req.method(), &path, key.as_deref(), now);
    let at_ms =
        u64::try_from(now.saturating_duration_since(shared.start).as_millis()).unwrap_or(u64::MAX);
    state.log.push(SeenRequest {
        at_ms,
        key: key.unwrap_or_default(),
        path,
        status: response.status().as_u16(),
        worker,
    });
    response
}

fn respond(
    shared: &Shared,
    state: &mut State,
    method: &Method,
    path: &str,
    key: Option<&str>,
    now: Instant,
) -> Response<Full<Bytes>> {
    let config = &shared.config;
    let Some(route) = route(path) else {
        return detail(StatusCode::NOT_FOUND, "Not Found");
    };
    if method != Method::GET {
        return detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    }
    let Some(key) = key else {
        return detail(
            StatusCode::UNAUTHORIZED,
            "Missing API key: send it in the X-API-Key header",
        );
    };
    let Some(account) = state.keys.get_mut(key) else {
        return detail(StatusCode::UNAUTHORIZED, "Invalid API key");
    };
    let exhausted = config.quota.is_some_and(|q| account.credits_used >= q);

    if exhausted && matches!(route, Route::Snapshot(_)) {
        // Quota exhaustion: no token taken, and no Retry-After, since waiting won't help.
        let mut res = detail(
            StatusCode::TOO_MANY_REQUESTS,
            "Monthly usage credits exhausted: see /v1/usage",
        );
        quota_headers(&mut res, config, account.credits_used);
        return res;
    }

    // One wall-clock read per answer, for every absolute time it carries.
    let wall = wall_clock();
    if let (Route::Snapshot(_), Some(secs)) = (&route, state.forced.check(now)) {
        // The forced 429: no token taken, whatever the bucket holds.
        let mut res = detail(
            StatusCode::TOO_MANY_REQUESTS,
            "Rate limit exceeded: cool down",
        );
        retry_after(&mut res, RetryAfterMode::Seconds(secs), wall);
        return res;
    }
    let taken = account
        .bucket
        .take(config, &shared.schedule, shared.start, now);
    let mut res = if !taken.ok {
        let mut res = detail(
            StatusCode::TOO_MANY_REQUESTS,
            "Rate limit exceeded: slow down",
        );
        retry_after(&mut res, config.retry_after, wall);
        res
    } else {
        match route {
            Route::Snapshot(event_id) => {
                account.credits_used += 1;
                let body = serde_json::json!({
                    "event_id": event_id,
                    "bookmakers": [
                        { "key": "sim", "markets": [ { "key": "h2h", "outcomes": [
                            { "name": "home", "price": 1.91 },
                            { "name": "away", "price": 1.95 }
                        ] } ] }
                    ]
                });
                json(StatusCode::OK, body.to_string())
            }
            Route::Usage => {
                let body = serde_json::json!({
                    "api_credits_used": account.credits_used,
                    "api_credits_limit": config.quota,
                    "exceeded": exhausted,
                    "period_end_utc": period_end_utc(wall),
                });
                json(StatusCode::OK, body.to_string())
            }
        }
    };
    let limits = LimitState {
        limit: advertised_limit(config.dialect, config.burst, taken.rate_per_sec),
        window: Duration::from_secs(1),
        remaining: taken.remaining,
        next_token: taken.next_token,
        now: wall,
    };
    let answer = if taken.ok {
        Answer::Success
    } else {
        // `Retry-After` itself was written above, in the configured mode.
        Answer::Throttled { retry_after: None }
    };
    let dialect_headers = config.dialect.headers(&limits, answer);
    res.headers_mut().extend(dialect_headers);
    quota_headers(&mut res, config, account.credits_used);
    res
}

/// The limit an upstream with `burst` at `rate_per_sec` states, per one-second window: the
/// odds API's shape says its bucket's capacity (as it always has); the others state the
/// sustained rate, so that `limit / window` is the rate a client may adopt.
pub fn advertised_limit(dialect: ServerDialect, burst: u32, rate_per_sec: u32) -> u64 {
    match dialect {
        ServerDialect::Odds => u64::from(burst),
        _ => u64::from(rate_per_sec.max(1)),
    }
}

fn quota_headers(res: &mut Response<Full<Bytes>>, config: &UpstreamConfig, used: u64) {
    if let Some(quota) = config.quota {
        let headers = res.headers_mut();
        headers.insert("x-requests-used", used.into());
        headers.insert("x-requests-remaining", quota.saturating_sub(used).into());
    }
}

fn retry_after(res: &mut Response<Full<Bytes>>, mode: RetryAfterMode, now: SystemTime) {
    match mode {
        RetryAfterMode::Seconds(secs) => {
            res.headers_mut().insert(header::RETRY_AFTER, secs.into());
        }
        RetryAfterMode::HttpDate(ahead) => {
            // `Date` comes from the same wall-clock reading: both name whole seconds, so the
            // date is `ahead` seconds after `Date`'s second, and `ahead - 1` to `ahead`
            // seconds after the reading (what a client refining it by its clock waits).
            let at = now + Duration::from_secs(ahead);
            for (name, t) in [(header::DATE, now), (header::RETRY_AFTER, at)] {
                if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(t)) {
                    res.headers_mut().insert(name, v);
                }
            }
        }
        RetryAfterMode::Absent => {}
    }
}

/// The upstream's only wall-clock read, for HTTP-dates, the dialects' absolute resets and the
/// quota period: everything else (the buckets, the log) runs on `tokio::time`.
#[allow(clippy::disallowed_methods)]
pub(crate) fn wall_clock() -> SystemTime {
    SystemTime::now()
}

/// The first instant of the next calendar month (UTC) after `now`, as RFC 3339.
fn period_end_utc(now: SystemTime) -> String {
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let (year, month, _day) = civil_from_days(days);
    let (year, month) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    format!("{year:04}-{month:02}-01T00:00:00Z")
}

/// Parses a `period_end_utc` as `/v1/usage` writes it (`YYYY-MM-DDT00:00:00Z`).
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use allowance_testkit::upstream::parse_period_end;
///
/// assert_eq!(parse_period_end("2025-01-01T00:00:00Z"), Some(UNIX_EPOCH + Duration::from_secs(1_735_689_600)));
/// assert_eq!(parse_period_end("2025-01-01"), None);
/// ```
pub fn parse_period_end(s: &str) -> Option<SystemTime> {
    let date = s.strip_suffix("T00:00:00Z")?;
    let mut parts = date.split('-').map(str::parse::<i64>);
    let (y, m, d) = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    if parts.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let secs = u64::try_from(days_from_civil(y, m, d).checked_mul(86_400)?).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// (year, month, day) to days since 1970-01-01, proleptic Gregorian (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

/// A plain HTTP/1.1 client, pooled, without TLS: what a test needs to talk to the loopback
/// upstreams ([`Upstream`], [`crate::tokens::TokenUpstream`]).
pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// A new [`HttpClient`].
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(route("/v1/usage"), Some(Route::Usage)));
        assert!(
            matches!(route("/v1/events/abc/odds/snapshot"), Some(Route::Snapshot(id)) if id == "abc")
        );
        assert!(route("/v1/events//odds/snapshot").is_none());
        assert!(route("/v1/events/a/b/odds/snapshot").is_none());
        assert!(route("/").is_none());
    }

    #[test]
    fn calendar() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        let dec = UNIX_EPOCH + Duration::from_secs(1_734_000_000); // 2024-12-12
        assert_eq!(period_end_utc(dec), "2025-01-01T00:00:00Z");
        let feb = UNIX_EPOCH + Duration::from_secs(19_782 * 86_400);
        assert_eq!(period_end_utc(feb), "2024-03-01T00:00:00Z");
        // What `period_end_utc` writes, `parse_period_end` reads back.
        for days in [0, 19_782, 20_000, 40_000] {
            let t = UNIX_EPOCH + Duration::from_secs(days * 86_400);
            let end = parse_period_end(&period_end_utc(t)).expect("parses");
            assert_eq!(
                period_end_utc(end - Duration::from_secs(1)),
                period_end_utc(t)
            );
            assert!(end > t);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_refills_in_integer_steps_with_a_small_tolerance() {
        let config = UpstreamConfig::new(2, 2);
        let schedule = config.schedule();
        let t0 = Instant::now();
        let take = |b: &mut Bucket, t: Instant| {
            let taken = b.take(&config, &schedule, t0, t);
            (taken.ok, taken.remaining)
        };
        let mut b = Bucket::full(&config, t0);
        assert_eq!(take(&mut b, t0), (true, 1));
        assert_eq!(take(&mut b, t0), (true, 0));
        assert_eq!(take(&mut b, t0), (false, 0));
        // 449 ms is more than a tenth of a token short: refused.
        assert!(!take(&mut b, t0 + Duration::from_millis(449)).0);
        // 450 ms: within a tenth of a token, admitted, and paid back out of the next refill.
        let mut b = Bucket::full(&config, t0);
        take(&mut b, t0);
        take(&mut b, t0);
        assert!(take(&mut b, t0 + Duration::from_millis(450)).0);
        assert!(!take(&mut b, t0 + Duration::from_millis(899)).0);
        assert!(take(&mut b, t0 + Duration::from_millis(950)).0);
        // A long pause refills only up to the burst.
        let mut b = Bucket::full(&config, t0);
        let later = t0 + Duration::from_secs(60);
        assert_eq!(take(&mut b, later), (true, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_read_the_clock_earlier_counts_as_the_last_instant() {
        // Handlers read the clock before the lock: a request may reach the bucket with an
        // instant before the last one's (on a multi-threaded runtime).
        let config =
            UpstreamConfig::new(1, 10).with_rate_changes(&["60ms:20".parse().expect("valid")]);
        let schedule = config.schedule();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut b = Bucket::full(&config, t0);
        assert!(b.take(&config, &schedule, t0, at(100)).ok);
        let late = b.take(&config, &schedule, t0, at(50));
        assert!(!late.ok);
        assert_eq!(
            (late.rate_per_sec, late.next_token),
            (20, Duration::from_millis(50))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_change_keeps_the_tokens_and_refills_at_the_new_rate() {
        // 2/s (500 ms a token), then 4/s (250 ms) from 250 ms on.
        let config =
            UpstreamConfig::new(2, 2).with_rate_changes(&["250ms:4".parse().expect("valid")]);
        let schedule = config.schedule();
        let t0 = Instant::now();
        let mut b = Bucket::full(&config, t0);
        b.take(&config, &schedule, t0, t0);
        let spent = b.take(&config, &schedule, t0, t0);
        assert_eq!(
            (spent.remaining, spent.next_token),
            (0, Duration::from_millis(500))
        );
        // At 250 ms half a token has come in (125 ms at 4/s), then 100 more ms plus a tenth
        // of a token's tolerance (25 ms) make one: admitted at 350 ms, not at 349.
        let mut early = Bucket::full(&config, t0);
        early.take(&config, &schedule, t0, t0);
        early.take(&config, &schedule, t0, t0);
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(!early.take(&config, &schedule, t0, at(349)).ok);
        let taken = b.take(&config, &schedule, t0, at(350));
        assert!(taken.ok);
        assert_eq!(taken.rate_per_sec, 4);
        // Without the change, 350 ms is far short of a token.
        let plain = UpstreamConfig::new(2, 2);
        let mut c = Bucket::full(&plain, t0);
        c.take(&plain, &plain.schedule(), t0, t0);
        c.take(&plain, &plain.schedule(), t0, t0);
        assert!(!c.take(&plain, &plain.schedule(), t0, at(350)).ok);
    }
}
