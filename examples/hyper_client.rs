//! The allowance stack around `hyper_util`'s pooled client: fetch odds snapshots for several
//! events at once, through one shared allowance.
//!
//! `AllowanceLayer` wraps `hyper_util::client::legacy::Client` directly (it is a
//! `tower::Service`); every concurrent fetch goes through a clone of the same stack, so the
//! bucket, the cooldown and the retry budget are shared. Against an upstream allowing
//! bursts of 2 and 2 requests/s, six concurrent fetches make exactly six requests, none
//! rejected:
//!
//! ```text
//! cargo run --example hyper_client
//! ```

use std::time::Duration;

use allowance_testkit::upstream::{Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_allowance::{
    retry::RetryConfig, Allowance, AllowanceConfig, AllowanceLayer, BoxError, Outcome,
    RetryBudgetConfig,
};

/// The client every request goes through: pooled HTTP/1.1, no TLS.
pub(crate) type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// The whole stack: Retry -> Cooldown -> Admission -> hyper's client.
pub(crate) type Stack = <AllowanceLayer as Layer<HttpClient>>::Service;

/// One allowance for one API key, and the stack over a fresh client.
pub(crate) fn stack(rate_per_sec: u32, burst: u32) -> Result<(Allowance, Stack), BoxError> {
    let allowance = Allowance::new(
        AllowanceConfig::per_second(rate_per_sec, burst)?
            .with_retry_budget(RetryBudgetConfig::fixed(8)),
    );
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let retry = RetryConfig::default().with_max_attempts(5)?;
    let stack = allowance.layer().with_retry(retry).layer(client);
    Ok((allowance, stack))
}

/// One fetched snapshot.
#[derive(Debug)]
pub(crate) struct Fetched {
    pub(crate) event_id: String,
    pub(crate) outcome: Outcome,
    pub(crate) status: Option<u16>,
    pub(crate) body: Bytes,
    pub(crate) after: Duration,
}

/// Fetches every event's snapshot concurrently through clones of one `stack`.
pub(crate) async fn fetch_snapshots(
    stack: &Stack,
    base_url: &str,
    key: &str,
    events: &[&str],
) -> Result<Vec<Fetched>, BoxError> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for event_id in events {
        let request = Request::get(format!("{base_url}/v1/events/{event_id}/odds/snapshot"))
            .header(API_KEY_HEADER, key)
            .body(Empty::<Bytes>::new())?;
        let stack = stack.clone();
        let event_id = (*event_id).to_owned();
        tasks.push(tokio::spawn(async move {
            let result = stack.oneshot(request).await;
            let outcome = Outcome::of(&result);
            let (status, body) = match result {
                Ok(res) => {
                    let (parts, body) = res.into_parts();
                    (
                        Some(parts.status.as_u16()),
                        body.collect().await?.to_bytes(),
                    )
                }
                Err(_) => (None, Bytes::new()),
            };
            Ok::<_, BoxError>(Fetched {
                event_id,
                outcome,
                status,
                body,
                after: start.elapsed(),
            })
        }));
    }
    let mut fetched = Vec::with_capacity(tasks.len());
    for task in tasks {
        fetched.push(task.await??);
    }
    Ok(fetched)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let upstream = Upstream::start(UpstreamConfig::new(2, 2)).await?;
    let (allowance, stack) = stack(2, 2)?;
    let events = ["e1", "e2", "e3", "e4", "e5", "e6"];
    println!(
        "Fetching {} snapshots at once from {} (burst 2, 2 req/s), one shared allowance:\n",
        events.len(),
        upstream.url()
    );
    for f in fetch_snapshots(&stack, &upstream.url(), DEFAULT_KEY, &events).await? {
        println!(
            "{:<4} {:?} status {:?} after {:>4} ms, {} bytes",
            f.event_id,
            f.outcome,
            f.status,
            f.after.as_millis(),
            f.body.len()
        );
    }
    let log = upstream.log();
    let rejected = log.iter().filter(|r| r.status == 429).count();
    println!(
        "\nThe server saw {} requests, {} of them 429; the allowance admitted {}.",
        log.len(),
        rejected,
        allowance.snapshot().admitted
    );
    upstream.shutdown().await;
    Ok(())
}
