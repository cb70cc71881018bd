//! An in-process upstream `Service` with its own token bucket.
//!
//! Deliberately independent of the library's GCRA: a classic bucket of fractional tokens
//! kept in integer microseconds, like the seed article's `Bucket` class. Every attempt it
//! sees is logged with the (virtual) time, so reports give the server's view.
//!
//! Its answers carry the rate-limit headers of [`FakeConfig::dialect`] (see
//! [`ServerDialect::headers`]), measured on a server clock that starts at the wall clock,
//! rounded down to a whole second, and then follows the (virtual) Tokio clock: absolute
//! resets and `Date` agree with each other however fast virtual time runs, and a run rounds
//! them the same way every time. Virtual runs soon leave the wall clock behind, so their
//! allowances trust any `Date` ([`VIRTUAL_MAX_DATE_SKEW`]). Its rate may change during the
//! run ([`FakeConfig::rate_changes`]).

use std::{
    convert::Infallible,
    future::{ready, Ready},
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::Service;

use crate::{
    dialect::{Answer, LimitState, ServerDialect},
    upstream::{
        advertised_limit, interval_us, rescale_level, wall_clock, RateChange, RateSchedule,
        WORKER_HEADER,
    },
};

/// How far a `Date` may be from the wall clock and still be trusted, for allowances in
/// virtual time (a year): the fake upstream's clock follows virtual time, which runs far
/// ahead of the wall clock the library reads (see the module docs).
pub const VIRTUAL_MAX_DATE_SKEW: Duration = Duration::from_secs(365 * 86_400);

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
    /// Whose rate-limit headers the answers carry (default: the odds API's).
    pub dialect: ServerDialect,
    /// Changes of the rate during the run, from the upstream's creation.
    pub rate_changes: Vec<RateChange>,
}

impl FakeConfig {
    /// The seed's server: burst 2, 2 per second, `Retry-After: 1`.
    pub fn seed() -> Self {
        Self {
            burst: 2,
            rate_per_sec: 2,
            retry_after_secs: Some(1),
            always_reject: false,
            dialect: ServerDialect::Odds,
            rate_changes: Vec::new(),
        }
    }

    /// The rate over time: [`FakeConfig::rate_per_sec`], then the changes.
    pub fn schedule(&self) -> RateSchedule {
        RateSchedule::new(self.rate_per_sec, &self.rate_changes)
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
    /// Microseconds per token at the rate in force since `last`.
    interval_us: u64,
    last: Instant,
    log: Vec<Seen>,
}

/// What the bucket said to one attempt.
struct Taken {
    status: StatusCode,
    remaining: u64,
    next_token: Duration,
    rate_per_sec: u32,
    /// Time since the upstream was created.
    elapsed: Duration,
}

/// The fake upstream. Clones share one bucket and one log.
#[derive(Clone, Debug)]
pub struct FakeUpstream {
    config: FakeConfig,
    schedule: Arc<RateSchedule>,
    /// The server's wall clock when it was created.
    wall_start: SystemTime,
    state: Arc<Mutex<State>>,
}

impl FakeUpstream {
    /// A fresh upstream with a full bucket, starting its clock now.
    pub fn new(config: FakeConfig) -> Self {
        let now = Instant::now();
        let interval_us = interval_us(config.rate_per_sec);
        let level_us = u64::from(config.burst) * interval_us;
        let wall = wall_clock();
        let whole = wall
            .duration_since(UNIX_EPOCH)
            .map_or(Duration::ZERO, |d| Duration::from_secs(d.as_secs()));
        Self {
            schedule: Arc::new(config.schedule()),
            config,
            wall_start: UNIX_EPOCH + whole,
            state: Arc::new(Mutex::new(State {
                start: now,
                level_us,
                interval_us,
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

    /// Takes a token if one is there (after refilling through any rate change since the
    /// last attempt).
    fn take(&self, worker: Option<u32>) -> Taken {
        let mut s = self.lock();
        // Never before the last attempt (clones may be called from several threads).
        let now = Instant::now().max(s.last);
        let burst = u64::from(self.config.burst);
        let from = s.last.saturating_duration_since(s.start);
        let to = now.saturating_duration_since(s.start);
        let refill = |s: &mut State, d: Duration| {
            let d = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            s.level_us = s.level_us.saturating_add(d).min(burst * s.interval_us);
        };
        let mut at = from;
        for change in self.schedule.changes_between(from, to) {
            refill(&mut s, change.at - at);
            let interval = interval_us(change.rate_per_sec);
            let level = i64::try_from(s.level_us).unwrap_or(i64::MAX);
            s.level_us = u64::try_from(rescale_level(level, s.interval_us, interval)).unwrap_or(0);
            s.interval_us = interval;
            at = change.at;
        }
        refill(&mut s, to - at);
        s.last = now;
        let interval = s.interval_us;
        let ok = !self.config.always_reject && s.level_us >= interval;
        if ok {
            s.level_us -= interval;
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
        let remaining = s.level_us / interval;
        let next_token = if remaining == 0 {
            Duration::from_micros(interval - s.level_us)
        } else {
            Duration::ZERO
        };
        Taken {
            status,
            remaining,
            next_token,
            rate_per_sec: self.schedule.rate_at(to),
            elapsed: to,
        }
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
        let taken = self.take(worker);
        let status = taken.status;
        let body = if status == StatusCode::OK {
            r#"{"bookmakers":[]}"#.to_owned()
        } else {
            r#"{"detail":"Synthetic throttle"}"#.to_owned()
        };
        let mut res = Response::new(body);
        *res.status_mut() = status;
        let limits = LimitState {
            limit: advertised_limit(self.config.dialect, self.config.burst, taken.rate_per_sec),
            window: Duration::from_secs(1),
            remaining: taken.remaining,
            next_token: taken.next_token,
            now: self.wall_start + taken.elapsed,
        };
        let answer = if status == StatusCode::OK {
            Answer::Success
        } else {
            Answer::Throttled {
                retry_after: self.config.retry_after_secs,
            }
        };
        *res.headers_mut() = self.config.dialect.headers(&limits, answer);
        ready(Ok(res))
    }
}

/// Time between tokens of a bucket refilling `rate_per_sec`.
pub fn interval(rate_per_sec: u32) -> Duration {
    Duration::from_micros(interval_us(rate_per_sec))
}
