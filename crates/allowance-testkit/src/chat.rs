//! An OpenAI-shaped token-limited upstream: a strict token bucket, as a provider's TPM limiter
//! is (the Rust twin of the acceptance fixture `token_upstream.py`, same wire format).
//!
//! POST any path with a JSON body `{"prompt_tokens": P, "max_tokens": M}`. At admission the
//! request is charged `P + M` tokens (what the provider reserves) and one request; if either
//! bucket lacks it: 429 with `Retry-After` (whole seconds until enough) and nothing charged.
//! Admitted: 200 with `{"usage": {"prompt_tokens": P, "completion_tokens": C, "total_tokens":
//! P + C}}`, `C` drawn deterministically in `[M/8, M/2]` from the request's own numbers; the
//! configured share of the unused reservation (`M - C`) goes back to the bucket when the answer
//! is sent. Every answer carries `x-ratelimit-limit-tokens`, `x-ratelimit-remaining-tokens`
//! (after this request's charge and refund), `x-ratelimit-limit-requests` and
//! `x-ratelimit-remaining-requests`. A malformed body gets 400 and is charged nothing.
//!
//! ```
//! use std::time::Duration;
//! use allowance_testkit::chat::{ChatUpstream, ChatUpstreamConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! // 60,000 tokens and 100 requests per 10 s; unused reservations never come back.
//! let config = ChatUpstreamConfig::new(60_000, 100, Duration::from_secs(10)).refund(0.0);
//! let upstream = ChatUpstream::start(config).await?;
//! assert!(upstream.url().starts_with("http://127.0.0.1:"));
//! assert_eq!(upstream.counts().ok, 0);
//! upstream.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle, time::Instant};

/// The upstream's limits and refund rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChatUpstreamConfig {
    /// Tokens per period (the bucket holds as many).
    pub tokens: u64,
    /// Requests per period (the bucket holds as many).
    pub requests: u64,
    /// The period.
    pub period: Duration,
    /// The share of the unused reservation given back (0: none, 1: all).
    pub refund: f64,
}

impl ChatUpstreamConfig {
    /// `tokens` and `requests` per `period`, refunding the whole unused reservation.
    pub fn new(tokens: u64, requests: u64, period: Duration) -> Self {
        Self {
            tokens,
            requests,
            period,
            refund: 1.0,
        }
    }

    /// Gives back this share (clamped to 0..=1) of each unused reservation.
    pub fn refund(mut self, share: f64) -> Self {
        self.refund = if share.is_nan() {
            0.0
        } else {
            share.clamp(0.0, 1.0)
        };
        self
    }
}

/// What the upstream counted (the fixture's counts line).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ChatCounts {
    /// Answered 200.
    pub ok: u64,
    /// 429s for lack of tokens.
    pub rejected_tokens: u64,
    /// 429s for lack of requests.
    pub rejected_requests: u64,
    /// Tokens charged at admission.
    pub charged: u64,
    /// Tokens the answers used.
    pub used: u64,
    /// Tokens given back.
    pub refunded: u64,
    /// Malformed requests.
    pub bad: u64,
    /// From the first request to the last one admitted, seconds.
    pub elapsed_s: f64,
}

impl ChatCounts {
    /// The share of the token capacity used: `(charged - refunded) / (limit + rate x elapsed)`.
    pub fn utilisation(&self, config: &ChatUpstreamConfig) -> f64 {
        let rate = config.tokens as f64 / config.period.as_secs_f64();
        let capacity = config.tokens as f64 + rate * self.elapsed_s;
        (self.charged.saturating_sub(self.refunded)) as f64 / capacity
    }
}

struct Buckets {
    tokens: f64,
    requests: f64,
    last: Instant,
    first: Option<Instant>,
    last_ok: Option<Instant>,
    counts: ChatCounts,
}

struct Shared {
    config: ChatUpstreamConfig,
    state: Mutex<Buckets>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Buckets> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The running upstream (see the [module docs](self)).
#[derive(Debug)]
pub struct ChatUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ChatUpstream {
    /// Starts serving on `127.0.0.1:0` (a free port), both buckets full.
    ///
    /// # Errors
    ///
    /// Binding the listener failed.
    pub async fn start(config: ChatUpstreamConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(Buckets {
                tokens: config.tokens as f64,
                requests: config.requests as f64,
                last: Instant::now(),
                first: None,
                last_ok: None,
                counts: ChatCounts::default(),
            }),
        });
        let (stop, mut stopped) = oneshot::channel::<()>();
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let shared = serving.clone();
                        let service = service_fn(move |req: Request<Incoming>| {
                            let shared = shared.clone();
                            async move { Ok::<_, Infallible>(answer(&shared, req).await) }
                        });
                        tokio::spawn(async move {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                    _ = &mut stopped => break,
                }
            }
        });
        Ok(Self {
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The base URL (any path answers), like `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its configuration.
    pub fn config(&self) -> &ChatUpstreamConfig {
        &self.shared.config
    }

    /// What it counted so far.
    pub fn counts(&self) -> ChatCounts {
        let b = self.shared.lock();
        let mut counts = b.counts;
        if let (Some(first), Some(last)) = (b.first, b.last_ok) {
            counts.elapsed_s = last.saturating_duration_since(first).as_secs_f64();
        }
        counts
    }

    /// Stops accepting and waits for the server task.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ChatUpstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The completion an answer reports: in `[M/8, M/2]`, from the request's own numbers.
pub fn completion(prompt: u64, max_tokens: u64) -> u64 {
    let lo = max_tokens / 8;
    let hi = lo.max(max_tokens / 2);
    lo + (prompt * 7919 + max_tokens * 104_729) % (hi - lo + 1)
}

async fn answer(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let parsed = body.ok().and_then(|b| {
        let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
        Some((
            v.get("prompt_tokens")?.as_u64()?,
            v.get("max_tokens")?.as_u64()?,
        ))
    });
    let config = shared.config;
    let period = config.period.as_secs_f64().max(1e-9);
    let (trate, rrate) = (
        config.tokens as f64 / period,
        config.requests as f64 / period,
    );
    let mut b = shared.lock();
    let now = Instant::now();
    let dt = now.saturating_duration_since(b.last).as_secs_f64();
    b.tokens = (b.tokens + dt * trate).min(config.tokens as f64);
    b.requests = (b.requests + dt * rrate).min(config.requests as f64);
    b.last = now;
    b.first.get_or_insert(now);
    let Some((p, m)) = parsed else {
        b.counts.bad += 1;
        return respond(
            StatusCode::BAD_REQUEST,
            &[],
            r#"{"error":"body must be {prompt_tokens, max_tokens}"}"#.to_owned(),
        );
    };
    let need = (p + m) as f64;
    let common = [
        ("x-ratelimit-limit-tokens", config.tokens.to_string()),
        ("x-ratelimit-limit-requests", config.requests.to_string()),
    ];
    if b.requests < 1.0 || b.tokens < need {
        let short_t = (need - b.tokens).max(0.0) / trate;
        let short_r = (1.0 - b.requests).max(0.0) / rrate;
        if b.requests < 1.0 {
            b.counts.rejected_requests += 1;
        } else {
            b.counts.rejected_tokens += 1;
        }
        let wait = short_t.max(short_r).ceil().max(1.0);
        let headers = [
            common[0].clone(),
            common[1].clone(),
            ("retry-after", format!("{wait:.0}")),
            (
                "x-ratelimit-remaining-tokens",
                format!("{}", b.tokens.floor()),
            ),
            (
                "x-ratelimit-remaining-requests",
                format!("{}", b.requests.floor()),
            ),
        ];
        return respond(
            StatusCode::TOO_MANY_REQUESTS,
            &headers,
            r#"{"error":{"type":"rate_limit_exceeded"}}"#.to_owned(),
        );
    }
    b.tokens -= need;
    b.requests -= 1.0;
    b.last_ok = Some(now);
    let c = completion(p, m);
    b.counts.ok += 1;
    b.counts.charged += p + m;
    b.counts.used += p + c;
    let back = ((m - c) as f64 * config.refund).floor();
    if back > 0.0 {
        b.tokens = (b.tokens + back).min(config.tokens as f64);
        b.counts.refunded += back as u64;
    }
    let headers = [
        common[0].clone(),
        common[1].clone(),
        (
            "x-ratelimit-remaining-tokens",
            format!("{}", b.tokens.floor()),
        ),
        (
            "x-ratelimit-remaining-requests",
            format!("{}", b.requests.floor()),
        ),
    ];
    let body = serde_json::json!({
        "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    });
    respond(StatusCode::OK, &headers, body.to_string())
}

fn respond(
    status: StatusCode,
    headers: &[(&'static str, String)],
    body: String,
) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(*name, v);
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_fall_in_the_documented_range() {
        for (p, m) in [(100, 200), (1000, 4000), (555, 1234), (0, 0), (7, 9)] {
            let c = completion(p, m);
            assert!(c >= m / 8 && c <= (m / 8).max(m / 2), "{p} {m}: {c}");
        }
        // The fixture's own numbers (token_upstream.py).
        assert_eq!(completion(100, 200), 25 + (100 * 7919 + 200 * 104_729) % 76);
    }
}
