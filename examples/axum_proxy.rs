//! An axum app whose handler fetches from a rate-limited upstream through one shared stack
//! kept in the app's state: many concurrent inbound requests, one outbound allowance.
//!
//! `GET /odds/{event_id}` on the app fetches `/v1/events/{event_id}/odds/snapshot` from the
//! upstream. However many requests arrive at once, the upstream sees at most what the
//! allowance admits; a request that cannot be served in time gets a 503 with
//! `Retry-After`, never a silent hang.
//!
//! The 503 and its `Retry-After` come from `tower_allowance::inbound::Unavailable` (feature
//! `axum`): the allowance's own knowledge, what the abandonment knew
//! (`Abandoned::retry_after`: the end of the cooldown that held it, the upstream's wait),
//! else the shared cooldown still to run (the snapshot's `cooling_for`), or the time until
//! the allowance reopens, or, with neither, one token interval of the allowance. The demo below makes the upstream throttle: the API key is also used
//! elsewhere, so the upstream allows less than the proxy's allowance expects, answers 429
//! with `Retry-After: 7`, and the callers who cannot wait that long get a 503 with
//! `Retry-After: 7` (or 6, as the cooldown runs down) from the proxy.
//!
//! `GET /metrics` serves the allowance's metrics in the Prometheus text format: the
//! `metrics` feature of tower-allowance records them through the `metrics` facade, and the
//! recorder of `metrics-exporter-prometheus`, installed before the allowance is built,
//! renders them. The demo ends by scraping it.
//!
//! ```text
//! cargo run --example axum_proxy
//! ```

use std::time::Duration;

use allowance_testkit::upstream::{
    RetryAfterMode, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY,
};
use axum::{
    body::Body,
    extract::{Path, State},
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower::{Layer, ServiceExt};
use tower_allowance::{
    inbound::Unavailable, retry::RetryConfig, Allowance, AllowanceConfig, AllowanceLayer, BoxError,
    Deadline, Outcome,
};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// The outbound stack: Retry -> Cooldown -> Admission -> hyper's client.
type Odds = <AllowanceLayer as Layer<HttpClient>>::Service;

/// The app's state: one stack (one allowance) for every handler invocation.
///
/// Cloning the state clones the stack, which shares the allowance: no new bucket.
#[derive(Clone)]
pub(crate) struct AppState {
    odds: Odds,
    allowance: Allowance,
    upstream: String,
    key: String,
    /// How long an inbound request may wait for the upstream.
    patience: Duration,
}

/// The app, fetching from `upstream` (a base URL) with `key` through `allowance`.
pub(crate) fn app(
    upstream: String,
    key: String,
    allowance: Allowance,
    patience: Duration,
) -> Result<Router, BoxError> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let retry = RetryConfig::default().with_max_attempts(4)?;
    let odds = allowance.layer().with_retry(retry).layer(client);
    let state = AppState {
        odds,
        allowance,
        upstream,
        key,
        patience,
    };
    Ok(Router::new()
        .route("/odds/{event_id}", get(odds_snapshot))
        .with_state(state))
}

async fn odds_snapshot(State(state): State<AppState>, Path(event_id): Path<String>) -> Response {
    match fetch(&state, &event_id).await {
        Ok(response) => response,
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

async fn fetch(state: &AppState, event_id: &str) -> Result<Response, BoxError> {
    let mut request = Request::get(format!(
        "{}/v1/events/{event_id}/odds/snapshot",
        state.upstream
    ))
    .header(API_KEY_HEADER, &state.key)
    .body(Empty::<Bytes>::new())?;
    request
        .extensions_mut()
        .insert(Deadline::after(state.patience));
    let result = state.odds.clone().oneshot(request).await;
    match Outcome::of(&result) {
        Outcome::Completed => {
            let upstream = result?;
            let status = upstream.status();
            let body = upstream.into_body().collect().await?.to_bytes();
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Ok(response)
        }
        // The upstream's final answer was a failure (a 404, a 401...): pass it on.
        Outcome::Unsuccessful(status) => Ok((status, "upstream answered").into_response()),
        // Given up on (deadline, budget, quota...): tell our caller, honestly, and when to
        // come back (`tower_allowance::inbound`, feature `axum`): 503, `Retry-After`.
        Outcome::Abandoned(_) => match Unavailable::of(&result, &state.allowance) {
            Some(unavailable) => Ok(unavailable.into_response()),
            None => Err("abandoned".into()),
        },
        _ => Err(result.err().unwrap_or_else(|| "failed".into())),
    }
}

// === metrics ===

/// Installs the process's `metrics` recorder: Prometheus text, with the time admissions
/// waited as a histogram (buckets from 10 ms to 30 s) rather than a summary.
///
/// Install it before building the allowance: the allowance registers its metrics when it is
/// built, with whichever recorder is installed then.
pub(crate) fn install_prometheus() -> Result<PrometheusHandle, BoxError> {
    let waits = Matcher::Full("tower_allowance_wait_seconds".to_owned());
    let buckets = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(waits, &buckets)?
        .install_recorder()?)
}

/// `GET /metrics`: the allowance's counters and histograms, and its gauges refreshed from
/// the store at each scrape.
pub(crate) fn metrics_route(prometheus: PrometheusHandle, allowance: Allowance) -> Router {
    Router::new().route(
        "/metrics",
        get(move || async move {
            // The gauges (cooldown left, retry budget, waiting callers) are set by a read of
            // the shared state; counters and histograms are recorded as things happen.
            if let Err(e) = allowance.refresh().await {
                eprintln!("metrics: the allowance's store did not answer: {e}");
            }
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                prometheus.render(),
            )
        }),
    )
}

/// Histograms are drained into their buckets at each scrape; between scrapes, this keeps
/// what they hold bounded (the exporter leaves it to the application).
pub(crate) fn spawn_upkeep(prometheus: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            prometheus.run_upkeep();
        }
    })
}

/// `GET http://{addr}/metrics`, as Prometheus would scrape it.
pub(crate) async fn scrape(addr: std::net::SocketAddr) -> Result<String, BoxError> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let res = client
        .get(format!("http://{addr}/metrics").parse()?)
        .await?;
    let body = res.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8(body.to_vec())?)
}

// === inbound ===

/// Sends `n` inbound requests at once to the proxy at `addr`: each one's status and
/// `Retry-After`, in order.
pub(crate) async fn inbound(
    addr: std::net::SocketAddr,
    n: usize,
) -> Result<Vec<(StatusCode, Option<u64>)>, BoxError> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut tasks = Vec::new();
    for i in 0..n {
        let client = client.clone();
        let uri = format!("http://{addr}/odds/e{i}");
        tasks.push(tokio::spawn(async move {
            let res = client.get(uri.parse()?).await?;
            let retry_after = res
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            Ok::<_, BoxError>((res.status(), retry_after))
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await??);
    }
    Ok(answers)
}

/// The upstream of the demo: per key, bursts of 2 at 1 request/s, and `429` with
/// `Retry-After: 7` beyond that.
pub(crate) fn throttling_upstream() -> UpstreamConfig {
    UpstreamConfig::new(2, 1).with_retry_after(RetryAfterMode::Seconds(7))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // First the recorder, then the allowance, whose metrics carry its name.
    let prometheus = install_prometheus()?;
    let upkeep = spawn_upkeep(prometheus.clone());
    // The key is shared with another app, so the upstream allows less than this proxy's
    // allowance expects: it will throttle during the run.
    let upstream = Upstream::start(throttling_upstream()).await?;
    let allowance = Allowance::builder(AllowanceConfig::per_second(4, 4)?)
        .name("odds")
        .build();
    let router = app(
        upstream.url(),
        DEFAULT_KEY.to_owned(),
        allowance.clone(),
        Duration::from_secs(2),
    )?
    .merge(metrics_route(prometheus, allowance.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    println!(
        "proxy on http://{addr} (allowance: 4 req/s, callers wait up to 2 s)\n\
         metrics on http://{addr}/metrics\n\
         upstream {} (burst 2, 1 req/s, 429 with Retry-After: 7 beyond that)\n",
        upstream.url()
    );

    // Eight inbound requests at once.
    for (i, (status, retry_after)) in inbound(addr, 8).await?.into_iter().enumerate() {
        match retry_after {
            Some(secs) => println!("inbound /odds/e{i}: {status}, Retry-After: {secs}"),
            None => println!("inbound /odds/e{i}: {status}"),
        }
    }
    let log = upstream.log();
    let snapshot = allowance.snapshot();
    println!(
        "\nThe upstream saw {} requests, {} of them 429 (Retry-After: 7). The shared cooldown\n\
         has {:?} left, which is what the 503s' Retry-After says: come back when the\n\
         upstream will take the call, not a guess.",
        log.len(),
        log.iter().filter(|r| r.status == 429).count(),
        snapshot.cooling_for.unwrap_or_default()
    );
    println!("\nGET /metrics (the allowance's samples that are not zero):");
    for line in scrape(addr).await?.lines() {
        let sample = line.starts_with("tower_allowance_") && !line.contains("_bucket{");
        if sample && !line.ends_with(" 0") {
            println!("  {line}");
        }
    }
    upkeep.abort();
    server.abort();
    upstream.shutdown().await;
    Ok(())
}
