//! The terminal path: a spent monthly quota, found out once, for everyone.
//!
//! The upstream's quota for our key is spent: every snapshot call is a 429 *without*
//! `Retry-After` (the real API's way: throttling and quota exhaustion share the status).
//! Backing off would not help; eight workers each polling `/v1/usage` would be another herd.
//!
//! The allowance carries one [`QuotaProbe`] (`GET /v1/usage`). The first 429 without
//! `Retry-After` triggers it, once for the whole allowance; its verdict ("exceeded", renews
//! at the end of the month) closes the allowance: waiting and new calls fail at once with
//! `Exhausted { until }`, reported as abandoned, never as success. Nothing polls.
//!
//! ```text
//! cargo run --example quota_exhausted
//! ```

use std::{
    future::Future,
    pin::Pin,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use allowance_testkit::upstream::{Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY};
use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use tower::{Layer, ServiceExt};
use tower_allowance::{
    error::Exhausted,
    quota::{QuotaProbe, QuotaStatus, QuotaTrigger},
    retry::RetryConfig,
    Allowance, AllowanceConfig, AllowanceLayer, BoxError, Outcome,
};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Asks the provider's usage endpoint whether the quota is spent, and until when.
#[derive(Clone, Debug)]
pub(crate) struct UsageProbe {
    client: HttpClient,
    url: String,
    key: String,
}

impl QuotaProbe for UsageProbe {
    fn probe(&self) -> Pin<Box<dyn Future<Output = Result<QuotaStatus, BoxError>> + Send>> {
        let this = self.clone();
        Box::pin(async move {
            let request = Request::get(&this.url)
                .header(API_KEY_HEADER, &this.key)
                .body(Empty::new())?;
            let response = this.client.request(request).await?;
            if !response.status().is_success() {
                // Throttled or broken: the allowance backs off before probing again.
                return Err(format!("usage endpoint answered {}", response.status()).into());
            }
            // Measure "until the period ends" against the provider's clock, not ours.
            let date = response
                .headers()
                .get(header::DATE)
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
                .and_then(parse_utc_midnight)
                .ok_or("usage response without a valid period_end_utc")?;
            let retry_in = end.duration_since(date).unwrap_or(Duration::ZERO);
            Ok(QuotaStatus::Exhausted { retry_in })
        })
    }
}

/// Parses `YYYY-MM-DDT00:00:00Z` (the usage endpoint's period end).
fn parse_utc_midnight(s: &str) -> Option<SystemTime> {
    let date = s.strip_suffix("T00:00:00Z")?;
    let mut parts = date.split('-').map(str::parse::<i64>);
    let (y, m, d) = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    // Days from civil (H. Hinnant).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days.checked_mul(86_400)?).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// What a run against a spent quota produced.
#[derive(Debug)]
pub(crate) struct QuotaRun {
    /// Each job's outcome.
    pub(crate) outcomes: Vec<Outcome>,
    /// When the allowance reopens by itself, from the first job's error, if it said so.
    pub(crate) reopens_in: Option<Duration>,
    /// Times the probe ran.
    pub(crate) probes: u64,
}

/// An allowance (`rate_per_sec`, bursts of 2) with the usage probe, and the stack over
/// hyper's client.
pub(crate) fn stack(
    upstream_url: &str,
    key: &str,
    rate_per_sec: u32,
) -> Result<(Allowance, <AllowanceLayer as Layer<HttpClient>>::Service), BoxError> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let probe = UsageProbe {
        client: client.clone(),
        url: format!("{upstream_url}/v1/usage"),
        key: key.to_owned(),
    };
    let allowance = Allowance::builder(AllowanceConfig::per_second(rate_per_sec, 2)?)
        .quota_probe(probe, QuotaTrigger::after_consecutive(1)?)
        .build();
    let retry = RetryConfig::default().with_max_attempts(5)?;
    let stack = allowance.layer().with_retry(retry).layer(client);
    Ok((allowance, stack))
}

/// `workers` concurrent snapshot fetches through `stack`.
pub(crate) async fn run(
    upstream_url: &str,
    key: &str,
    allowance: &Allowance,
    stack: &<AllowanceLayer as Layer<HttpClient>>::Service,
    workers: usize,
) -> Result<QuotaRun, BoxError> {
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let request = Request::get(format!("{upstream_url}/v1/events/e{worker}/odds/snapshot"))
            .header(API_KEY_HEADER, key)
            .body(Empty::<Bytes>::new())?;
        let stack = stack.clone();
        tasks.push(tokio::spawn(async move {
            let result = stack.oneshot(request).await;
            let reopens_in = result.as_ref().err().and_then(|e| {
                e.downcast_ref::<Exhausted>().and_then(|q| {
                    q.until()
                        .map(|u| u.saturating_duration_since(tokio::time::Instant::now()))
                })
            });
            (Outcome::of(&result), reopens_in)
        }));
    }
    let mut outcomes = Vec::with_capacity(workers);
    let mut reopens_in = None;
    for task in tasks {
        let (outcome, reopens) = task.await?;
        outcomes.push(outcome);
        reopens_in = reopens_in.or(reopens);
    }
    Ok(QuotaRun {
        outcomes,
        reopens_in,
        probes: allowance.quota_probes(),
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // A quota of zero credits: already spent for this month.
    let upstream = Upstream::start(UpstreamConfig::new(2, 2).with_quota(0)).await?;
    let (allowance, stack) = stack(&upstream.url(), DEFAULT_KEY, 2)?;
    println!(
        "Eight workers, one key whose monthly quota is spent ({}).\n",
        upstream.url()
    );

    let first = run(&upstream.url(), DEFAULT_KEY, &allowance, &stack, 8).await?;
    for (i, outcome) in first.outcomes.iter().enumerate() {
        println!("worker {i}: {outcome:?}");
    }
    if let Some(left) = first.reopens_in {
        println!(
            "\nthe allowance reopens by itself in {} h (at the end of the month)",
            left.as_secs() / 3600
        );
    }
    let seen_before = upstream.log().len();
    let again = run(&upstream.url(), DEFAULT_KEY, &allowance, &stack, 8).await?;
    let log = upstream.log();
    println!(
        "eight more calls: {} abandoned at once, {} new requests reached the server",
        again.outcomes.iter().filter(|o| !o.is_completed()).count(),
        log.len() - seen_before
    );
    let usage = log.iter().filter(|r| r.path == "/v1/usage").count();
    println!(
        "\nThe server saw {} snapshot attempts and {usage} /v1/usage request(s); the probe ran {} time(s).",
        log.len() - usage,
        again.probes
    );
    upstream.shutdown().await;
    Ok(())
}
