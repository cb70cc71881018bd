//! An in-process upstream `Service` with its own token bucket.
//!
//! Deliberately independent of the library's GCRA: a classic bucket of fractional tokens
//! kept in integer microseconds, like the seed article's `Bucket` class. Every attempt it
//! sees is logged with the (virtual) time, so reports give the server's view.

use std::{
    convert::Infallible,
    future::{ready, Ready},
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::Service;

/// The header a scenario uses to tell the upstream which worker sent an attempt.
pub const WORKER_HEADER: &str = "x-worker";

/// How the fake upstream throttles.
#[derive(Clone, Debug)]
pub struct FakeConfig {
    /// Bucket capacity.
    pub burst: u32,
    /// Refill, in requests per second.
    pub rate_per_sec: u32,
    /// `Retry-After` seconds on a 429; `None` sends no header.
    pub retry_after_secs: Option<u64>,
    /// Reject everything (the seed's persistent-failure case).
    pub always_reject: bool,
}

impl FakeConfig {
    /// The seed's server: burst 2, 2 per second, `Retry-After: 1`.
    pub fn seed() -> Self {
        Self {
            burst: 2,
            rate_per_sec: 2,
            retry_after_secs: Some(1),
            always_reject: false,
        }
    }
}

/// One attempt the upstream saw.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Seen {
    /// Milliseconds since the upstream was created.
    pub at_ms: u64,
    /// The worker that sent it (from [`WORKER_HEADER`]), if given.
    pub worker: Option<u32>,
    /// The status returned.
    pub status: u16,
}

#[derive(Debug)]
struct State {
    start: Instant,
    /// Tokens, in microseconds of refill time (one token = `interval_us`).
    level_us: u64,
    last: Instant,
    log: Vec<Seen>,
}

/// The fake upstream. Clones share one bucket and one log.
#[derive(Clone, Debug)]
pub struct FakeUpstream {
    config: FakeConfig,
    interval_us: u64,
    state: Arc<Mutex<State>>,
}

impl FakeUpstream {
    /// A fresh upstream with a full bucket, starting its clock now.
    pub fn new(config: FakeConfig) -> Self {
        let now = Instant::now();
        let interval_us = 1_000_000 / u64::from(config.rate_per_sec.max(1));
        let level_us = u64::from(config.burst) * interval_us;
        Self {
            config,
            interval_us,
            state: Arc::new(Mutex::new(State {
                start: now,
                level_us,
                last: now,
                log: Vec::new(),
            })),
        }
    }

    /// Every attempt seen so far, in order.
    pub fn log(&self) -> Vec<Seen> {
        self.lock().log.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a token if one is there; returns the status and remaining whole tokens.
    fn take(&self, worker: Option<u32>) -> (StatusCode, u64) {
        let now = Instant::now();
        let mut s = self.lock();
        let capacity = u64::from(self.config.burst) * self.interval_us;
        let elapsed =
            u64::try_from(now.saturating_duration_since(s.last).as_micros()).unwrap_or(u64::MAX);
        s.level_us = s.level_us.saturating_add(elapsed).min(capacity);
        s.last = now;
        let ok = !self.config.always_reject && s.level_us >= self.interval_us;
        if ok {
            s.level_us -= self.interval_us;
        }
        let status = if ok {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        let at_ms =
            u64::try_from(now.saturating_duration_since(s.start).as_millis()).unwrap_or(u64::MAX);
        s.log.push(Seen {
            at_ms,
            worker,
            status: status.as_u16(),
        });
        (status, s.level_us / self.interval_us)
    }
}

impl<B> Service<Request<B>> for FakeUpstream {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let worker = req
            .headers()
            .get(WORKER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let (status, remaining) = self.take(worker);
        let body = if status == StatusCode::OK {
            r#"{"bookmakers":[]}"#.to_owned()
        } else {
            r#"{"detail":"Synthetic throttle"}"#.to_owned()
        };
        let mut res = Response::new(body);
        *res.status_mut() = status;
        let headers = res.headers_mut();
        headers.insert("x-ratelimit-limit", self.config.burst.into());
        headers.insert("x-ratelimit-remaining", remaining.into());
        headers.insert(
            "x-ratelimit-bucket",
            http::HeaderValue::from_static("snapshot"),
        );
        if status == StatusCode::TOO_MANY_REQUESTS {
            if let Some(secs) = self.config.retry_after_secs {
                headers.insert(http::header::RETRY_AFTER, secs.into());
            }
        }
        ready(Ok(res))
    }
}

/// Time between tokens of a bucket refilling `rate_per_sec`.
pub fn interval(rate_per_sec: u32) -> Duration {
    Duration::from_micros(1_000_000 / u64::from(rate_per_sec.max(1)))
}
