//! An upstream shaped like an LLM API: requests per period *and* tokens per period at once,
//! per key, each request declaring its token cost in a header.
//!
//! [`TokenUpstream::start`] binds `127.0.0.1:0` and serves any path. A request must carry its
//! key (`Authorization: Bearer KEY`, or `X-API-Key: KEY`) and its cost ([`TOKENS_HEADER`]).
//! It is admitted when both of its key's buckets hold enough (one request, `cost` tokens),
//! and charged on both at once; otherwise it is a 429 with `Retry-After` (whole seconds,
//! rounded up) and `retry-after-ms`, and charged nothing. Answers carry
//! `x-ratelimit-remaining-requests` and `x-ratelimit-remaining-tokens`. Every attempt is
//! logged ([`TokenUpstream::log`]), so a run reports what the *server* saw.
//!
//! ```
//! use std::time::Duration;
//! use allowance_testkit::tokens::{Rate, TokenUpstream, TokenUpstreamConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! // 60 requests and 6,000 tokens per second (bursts of 10 and 6,000), for one key.
//! let config = TokenUpstreamConfig::new(Rate::per_second(60, 10), Rate::per_second(6_000, 6_000))
//!     .with_keys(["sk-demo"]);
//! let upstream = TokenUpstream::start(config).await?;
//! assert!(upstream.url().starts_with("http://127.0.0.1:"));
//! upstream.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # The buckets
//!
//! Independent of the library's GCRA on purpose: two classic buckets per key, full at start,
//! refilled continuously, levels kept as `f64` units. A request up to
//! [`TokenUpstreamConfig::tolerance`] early is admitted (the level may dip below zero by that
//! much refill, paid back later): requests scheduled at the exact rate reach the server with
//! some jitter, and one delayed a little must not make the next one look early. Real limiters
//! are at least this lenient.

use std::{
    collections::HashMap,
    fmt,
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle, time::Instant};

use crate::upstream::{json, serve_http};

/// The request header carrying its token cost (a decimal integer).
pub const TOKENS_HEADER: &str = "x-token-cost";

/// Units per period, at most `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Units per period (0 is treated as 1).
    pub rate: u64,
    /// The period.
    pub period: Duration,
    /// Units that may go at once: the bucket's capacity.
    pub burst: u64,
}

impl Rate {
    /// `rate` per second, bursts of `burst`.
    pub fn per_second(rate: u64, burst: u64) -> Self {
        Self {
            rate,
            period: Duration::from_secs(1),
            burst,
        }
    }

    /// `rate` per minute, bursts of `burst`.
    pub fn per_minute(rate: u64, burst: u64) -> Self {
        Self {
            rate,
            period: Duration::from_secs(60),
            burst,
        }
    }

    /// Units per second.
    pub fn per_sec(&self) -> f64 {
        self.rate.max(1) as f64 / self.period.as_secs_f64().max(1e-9)
    }

    /// The least time `units` take at this rate beyond the burst, in whole milliseconds
    /// (rounded up): `(units - burst) / rate`.
    pub fn min_time_ms(&self, units: u64) -> u64 {
        let over = units.saturating_sub(self.burst) as f64;
        (over / self.per_sec() * 1_000.0).ceil() as u64
    }
}

/// How the token upstream throttles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenUpstreamConfig {
    /// Requests per period, per key.
    pub requests: Rate,
    /// Tokens per period, per key.
    pub tokens: Rate,
    /// The accepted keys.
    pub keys: Vec<String>,
    /// How early a request may be and still be admitted (default 50 ms): see the module docs.
    pub tolerance: Duration,
}

impl TokenUpstreamConfig {
    /// Both limits, one key (`"sk-sim"`), 50 ms of tolerance.
    pub fn new(requests: Rate, tokens: Rate) -> Self {
        Self {
            requests,
            tokens,
            keys: vec!["sk-sim".to_owned()],
            tolerance: Duration::from_millis(50),
        }
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

    /// Sets the tolerance.
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The least time a run of requests with these token `costs` can take on one key, in
    /// milliseconds: whichever limit binds.
    pub fn min_makespan_ms(&self, costs: &[u32]) -> u64 {
        let tokens: u64 = costs.iter().map(|c| u64::from(*c)).sum();
        self.tokens
            .min_time_ms(tokens)
            .max(self.requests.min_time_ms(costs.len() as u64))
    }
}

/// One attempt the token upstream saw.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TokenRequest {
    /// Milliseconds since the upstream started.
    pub at_ms: u64,
    /// The key sent (empty when missing).
    pub key: String,
    /// The token cost declared.
    pub tokens: u64,
    /// The status returned.
    pub status: u16,
}

/// What a log says, for one key or all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TokenSummary {
    /// Attempts seen.
    pub attempts: usize,
    /// Of those, 429s.
    pub rejected: usize,
    /// Of those, 200s.
    pub completed: usize,
    /// Tokens of the 200s.
    pub tokens: u64,
}

impl TokenSummary {
    /// Sums up `log`, for `key` only when given.
    pub fn of(log: &[TokenRequest], key: Option<&str>) -> Self {
        let mut s = Self::default();
        for r in log.iter().filter(|r| key.is_none_or(|k| r.key == k)) {
            s.attempts += 1;
            match r.status {
                429 => s.rejected += 1,
                200 => {
                    s.completed += 1;
                    s.tokens += r.tokens;
                }
                _ => {}
            }
        }
        s
    }
}

#[derive(Debug)]
struct Bucket {
    level: f64,
}

impl Bucket {
    fn full(rate: &Rate) -> Self {
        Self {
            level: rate.burst as f64,
        }
    }

    fn refill(&mut self, rate: &Rate, elapsed: Duration) {
        self.level = (self.level + elapsed.as_secs_f64() * rate.per_sec()).min(rate.burst as f64);
    }

    /// Whether `units` fit, allowing `tolerance` of refill ahead.
    fn fits(&self, rate: &Rate, units: f64, tolerance: Duration) -> bool {
        self.level + tolerance.as_secs_f64() * rate.per_sec() >= units
    }

    /// Time until `units` fit without tolerance.
    fn wait_for(&self, rate: &Rate, units: f64) -> Duration {
        let short = (units - self.level).max(0.0);
        Duration::from_secs_f64(short / rate.per_sec())
    }
}

#[derive(Debug)]
struct Account {
    requests: Bucket,
    tokens: Bucket,
    last: Instant,
}

#[derive(Debug)]
struct State {
    accounts: HashMap<String, Account>,
    log: Vec<TokenRequest>,
}

#[derive(Debug)]
struct Shared {
    config: TokenUpstreamConfig,
    start: Instant,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running token upstream. Dropping it stops accepting connections;
/// [`TokenUpstream::shutdown`] also waits for open connections to close.
pub struct TokenUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for TokenUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenUpstream")
            .field("addr", &self.addr)
            .field("requests", &self.shared.config.requests)
            .field("tokens", &self.shared.config.tokens)
            .finish_non_exhaustive()
    }
}

// === impl TokenUpstream ===

impl TokenUpstream {
    /// Starts serving on `127.0.0.1:0` (a free port).
    ///
    /// # Errors
    ///
    /// Binding the listener failed.
    pub async fn start(config: TokenUpstreamConfig) -> std::io::Result<Self> {
        Self::start_on(config, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts serving on `addr` (`allowance-sim serve --token-rate`).
    ///
    /// # Errors
    ///
    /// Binding the listener failed.
    pub async fn start_on(config: TokenUpstreamConfig, addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let now = Instant::now();
        let accounts = config
            .keys
            .iter()
            .map(|k| {
                let account = Account {
                    requests: Bucket::full(&config.requests),
                    tokens: Bucket::full(&config.tokens),
                    last: now,
                };
                (k.clone(), account)
            })
            .collect();
        let shared = Arc::new(Shared {
            config,
            start: now,
            state: Mutex::new(State {
                accounts,
                log: Vec::new(),
            }),
        });
        let (stop, stopped) = oneshot::channel();
        let serving = shared.clone();
        let task = tokio::spawn(serve_http(
            listener,
            move |req: &Request<Incoming>| handle(&serving, req),
            stopped,
        ));
        Ok(Self {
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The base URL, like `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its configuration.
    pub fn config(&self) -> &TokenUpstreamConfig {
        &self.shared.config
    }

    /// Every attempt seen so far, in order.
    pub fn log(&self) -> Vec<TokenRequest> {
        self.shared.lock().log.clone()
    }

    /// The log summed up, for `key` only when given.
    pub fn summary(&self, key: Option<&str>) -> TokenSummary {
        TokenSummary::of(&self.shared.lock().log, key)
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

impl Drop for TokenUpstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(
        status,
        serde_json::json!({ "error": { "message": message } }).to_string(),
    )
}

/// The key: `Authorization: Bearer KEY` or `X-API-Key: KEY`.
fn key_of<B>(req: &Request<B>) -> Option<String> {
    let headers = req.headers();
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        let v = v.to_str().ok()?;
        return Some(v.strip_prefix("Bearer ").unwrap_or(v).trim().to_owned());
    }
    Some(headers.get("x-api-key")?.to_str().ok()?.trim().to_owned())
}

fn handle(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let now = Instant::now();
    let key = key_of(req);
    let tokens = req
        .headers()
        .get(TOKENS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let mut state = shared.lock();
    let response = respond(&shared.config, &mut state, key.as_deref(), tokens, now);
    let at_ms =
        u64::try_from(now.saturating_duration_since(shared.start).as_millis()).unwrap_or(u64::MAX);
    state.log.push(TokenRequest {
        at_ms,
        key: key.unwrap_or_default(),
        tokens: tokens.unwrap_or(0),
        status: response.status().as_u16(),
    });
    response
}

fn respond(
    config: &TokenUpstreamConfig,
    state: &mut State,
    key: Option<&str>,
    tokens: Option<u64>,
    now: Instant,
) -> Response<Full<Bytes>> {
    let Some(key) = key else {
        return error(StatusCode::UNAUTHORIZED, "missing API key");
    };
    let Some(account) = state.accounts.get_mut(key) else {
        return error(StatusCode::UNAUTHORIZED, "invalid API key");
    };
    let Some(tokens) = tokens else {
        return error(
            StatusCode::BAD_REQUEST,
            "missing x-token-cost: how many tokens the request may use",
        );
    };
    let elapsed = now.saturating_duration_since(account.last);
    account.last = now;
    account.requests.refill(&config.requests, elapsed);
    account.tokens.refill(&config.tokens, elapsed);
    let units = tokens as f64;
    if units > config.tokens.burst as f64 {
        return error(StatusCode::BAD_REQUEST, "more tokens than the limit allows");
    }
    let fits = account
        .requests
        .fits(&config.requests, 1.0, config.tolerance)
        && account.tokens.fits(&config.tokens, units, config.tolerance);
    let mut res = if fits {
        account.requests.level -= 1.0;
        account.tokens.level -= units;
        json(
            StatusCode::OK,
            serde_json::json!({ "usage": { "total_tokens": tokens } }).to_string(),
        )
    } else {
        let wait = account
            .requests
            .wait_for(&config.requests, 1.0)
            .max(account.tokens.wait_for(&config.tokens, units));
        let mut res = error(StatusCode::TOO_MANY_REQUESTS, "rate limit reached");
        let ms = wait.as_millis().max(1);
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let headers = res.headers_mut();
        headers.insert(header::RETRY_AFTER, secs.max(1).into());
        if let Ok(v) = HeaderValue::from_str(&ms.to_string()) {
            headers.insert("retry-after-ms", v);
        }
        res
    };
    let headers = res.headers_mut();
    let whole = |level: f64| level.max(0.0).floor() as u64;
    headers.insert(
        "x-ratelimit-remaining-requests",
        whole(account.requests.level).into(),
    );
    headers.insert(
        "x-ratelimit-remaining-tokens",
        whole(account.tokens.level).into(),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> TokenUpstreamConfig {
        TokenUpstreamConfig::new(Rate::per_second(10, 2), Rate::per_second(100, 100))
            .with_tolerance(Duration::ZERO)
    }

    fn fresh(config: &TokenUpstreamConfig, now: Instant) -> State {
        State {
            accounts: HashMap::from([(
                "k".to_owned(),
                Account {
                    requests: Bucket::full(&config.requests),
                    tokens: Bucket::full(&config.tokens),
                    last: now,
                },
            )]),
            log: Vec::new(),
        }
    }

    fn status(config: &TokenUpstreamConfig, s: &mut State, tokens: u64, now: Instant) -> u16 {
        respond(config, s, Some("k"), Some(tokens), now)
            .status()
            .as_u16()
    }

    #[tokio::test(start_paused = true)]
    async fn both_limits_all_or_nothing() {
        let c = config();
        let t0 = Instant::now();
        let mut s = fresh(&c, t0);
        assert_eq!(status(&c, &mut s, 60, t0), 200);
        // 50 tokens do not fit (40 left): refused, and no request is charged either.
        let res = respond(&c, &mut s, Some("k"), Some(50), t0);
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after-ms"], "100");
        assert_eq!(res.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            status(&c, &mut s, 40, t0),
            200,
            "the request burst was kept"
        );
        // Requests: the burst of 2 is spent; 100 ms later one more, with 10 tokens.
        assert_eq!(status(&c, &mut s, 0, t0), 429);
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(status(&c, &mut s, 10, t1), 200);
        assert_eq!(status(&c, &mut s, 1_000, t1), 400, "never fits");
        assert_eq!(respond(&c, &mut s, None, Some(1), t1).status(), 401);
        assert_eq!(respond(&c, &mut s, Some("k"), None, t1).status(), 400);
    }

    #[tokio::test(start_paused = true)]
    async fn tolerance_admits_a_little_early() {
        let c = config().with_tolerance(Duration::from_millis(20));
        let t0 = Instant::now();
        let mut s = fresh(&c, t0);
        assert_eq!(status(&c, &mut s, 100, t0), 200);
        // 10 tokens take 100 ms; 81 ms is within 20 ms of it.
        assert_eq!(status(&c, &mut s, 10, t0 + Duration::from_millis(79)), 429);
        assert_eq!(status(&c, &mut s, 10, t0 + Duration::from_millis(81)), 200);
    }

    #[test]
    fn minimum_makespan_takes_the_binding_limit() {
        let c = config();
        // 12 requests: (12 - 2) / 10 per s = 1 s; 300 tokens: (300 - 100) / 100 = 2 s.
        assert_eq!(c.min_makespan_ms(&[25; 12]), 2_000);
        assert_eq!(c.min_makespan_ms(&[1; 12]), 1_000);
        assert_eq!(c.min_makespan_ms(&[]), 0);
        let log = vec![
            TokenRequest {
                at_ms: 0,
                key: "a".into(),
                tokens: 5,
                status: 200,
            },
            TokenRequest {
                at_ms: 1,
                key: "a".into(),
                tokens: 7,
                status: 429,
            },
            TokenRequest {
                at_ms: 2,
                key: "b".into(),
                tokens: 9,
                status: 200,
            },
        ];
        assert_eq!(
            TokenSummary::of(&log, Some("a")),
            TokenSummary {
                attempts: 2,
                rejected: 1,
                completed: 1,
                tokens: 5
            }
        );
        assert_eq!(TokenSummary::of(&log, None).tokens, 14);
    }
}
