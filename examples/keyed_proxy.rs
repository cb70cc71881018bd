//! A multi-tenant axum proxy: each tenant has its own upstream API key, and each key its own
//! allowance, picked per request by a `KeyedLayer`.
//!
//! The upstream (`allowance_testkit::tokens`, on loopback) limits every key to 10 requests/s
//! (burst 2) and 2,000 tokens/s (burst 1,000). The proxy maps a tenant's inbound key
//! (`x-tenant-key`) to its upstream key and forwards `POST /v1/complete` with
//! `Authorization: Bearer <upstream key>` and the request's `x-token-cost`, through
//! `CostLayer` → `KeyedLayer` (keyed by `Authorization`) → hyper's client. One registry holds
//! one allowance per upstream key, named by a keyed hash of the key.
//!
//! It then measures, at the proxy's door: two quiet tenants alone (5 requests each, 200 ms
//! apart), and the same two while a third tenant floods its own key with 30 requests at once.
//! The flood waits in its own queue (about 3 s); the quiet tenants are served as fast as
//! without it; and the upstream counts no 429 on any key.
//!
//! ```text
//! cargo run --example keyed_proxy
//! ```

use std::{collections::HashMap, sync::Arc, time::Duration};

use allowance_testkit::tokens::{Rate, TokenUpstream, TokenUpstreamConfig, TOKENS_HEADER};
use axum::{
    body::Body,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
    Router,
};
use bytes::Bytes;
use http::{HeaderName, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_allowance::{
    cost::{CostLayer, CostService, FromHeader},
    keyed::{key, key::HeaderKey, Keyed, KeyedConfig, KeyedLayer, KeyedService},
    AllowanceConfig, BoxError, Deadline, Limit, Outcome,
};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;
type Outbound = CostService<KeyedService<HttpClient, HeaderKey>, FromHeader>;

/// Tenants: inbound key → upstream key.
pub(crate) const TENANTS: [(&str, &str); 3] = [
    ("tenant-flood", "sk-up-flood-1111"),
    ("tenant-a", "sk-up-a-2222"),
    ("tenant-b", "sk-up-b-3333"),
];

/// Every upstream key's limits: 10 requests/s (burst 2), 2,000 tokens/s (burst 1,000).
pub(crate) fn upstream_config() -> TokenUpstreamConfig {
    TokenUpstreamConfig::new(Rate::per_second(10, 2), Rate::per_second(2_000, 1_000))
        .with_keys(TENANTS.iter().map(|(_, up)| *up))
}

/// The registry: every upstream key gets the upstream's limits.
pub(crate) fn registry() -> Result<Keyed, BoxError> {
    let per_key = AllowanceConfig::per_second(10, 2)?
        .with_limit(Limit::per_second(2_000, 1_000)?.counting_cost())?;
    Ok(Keyed::new(KeyedConfig::new(per_key).with_capacity(1_000)?))
}

#[derive(Clone)]
struct AppState {
    outbound: Outbound,
    upstream: Arc<str>,
    tenants: Arc<HashMap<String, String>>,
}

/// The proxy app.
pub(crate) fn app(upstream: &str, keyed: Keyed) -> Router {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let outbound = ServiceBuilder::new()
        .layer(CostLayer::from_header(HeaderName::from_static(
            TOKENS_HEADER,
        )))
        .layer(KeyedLayer::new(keyed, key::authorization()))
        .service(client);
    let tenants = TENANTS
        .iter()
        .map(|(t, k)| ((*t).to_owned(), (*k).to_owned()))
        .collect();
    Router::new()
        .route("/v1/complete", post(complete))
        .with_state(AppState {
            outbound,
            upstream: upstream.into(),
            tenants: Arc::new(tenants),
        })
}

async fn complete(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let tenant = headers.get("x-tenant-key").and_then(|v| v.to_str().ok());
    let Some(upstream_key) = tenant.and_then(|t| state.tenants.get(t)) else {
        return (StatusCode::UNAUTHORIZED, "unknown tenant").into_response();
    };
    let cost = headers
        .get(TOKENS_HEADER)
        .cloned()
        .unwrap_or_else(|| http::HeaderValue::from_static("1"));
    let request = Request::post(format!("{}/v1/chat/completions", state.upstream))
        .header("authorization", format!("Bearer {upstream_key}"))
        .header(TOKENS_HEADER, cost)
        .header("idempotency-key", "proxy")
        .body(Empty::new());
    let Ok(mut request) = request else {
        return (StatusCode::BAD_REQUEST, "bad request").into_response();
    };
    request
        .extensions_mut()
        .insert(Deadline::after(Duration::from_secs(10)));
    let result = state.outbound.clone().oneshot(request).await;
    match Outcome::of(&result) {
        Outcome::Completed | Outcome::Unsuccessful(_) => match result {
            Ok(res) => {
                let status = res.status();
                match res.into_body().collect().await {
                    Ok(body) => (status, Body::from(body.to_bytes())).into_response(),
                    Err(_) => StatusCode::BAD_GATEWAY.into_response(),
                }
            }
            Err(_) => StatusCode::BAD_GATEWAY.into_response(),
        },
        Outcome::Abandoned(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("abandoned: {reason}"),
        )
            .into_response(),
        _ => StatusCode::BAD_GATEWAY.into_response(),
    }
}

/// One tenant's requests as measured at the proxy's door.
#[derive(Clone, Debug, Default)]
pub(crate) struct Measured {
    pub(crate) sent: usize,
    pub(crate) ok: usize,
    /// Latencies, in milliseconds, sorted.
    pub(crate) latency_ms: Vec<u64>,
}

impl Measured {
    pub(crate) fn max_ms(&self) -> u64 {
        self.latency_ms.last().copied().unwrap_or(0)
    }

    pub(crate) fn median_ms(&self) -> u64 {
        self.latency_ms
            .get(self.latency_ms.len() / 2)
            .copied()
            .unwrap_or(0)
    }
}

/// Sends `n` requests of `cost` tokens for `tenant`, `gap` apart (all at once when zero).
pub(crate) async fn send(
    proxy: &str,
    tenant: &'static str,
    n: usize,
    cost: u32,
    gap: Duration,
) -> Result<Measured, BoxError> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let req = Request::post(format!("{proxy}/v1/complete"))
            .header("x-tenant-key", tenant)
            .header(TOKENS_HEADER, cost)
            .body(Empty::new())?;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let res = client.request(req).await?;
            let status = res.status();
            res.into_body().collect().await?;
            let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            Ok::<_, BoxError>((status, ms))
        }));
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    let mut m = Measured {
        sent: n,
        ..Measured::default()
    };
    for t in tasks {
        let (status, ms) = t.await??;
        m.ok += usize::from(status == StatusCode::OK);
        m.latency_ms.push(ms);
    }
    m.latency_ms.sort_unstable();
    Ok(m)
}

/// What the run measured.
#[derive(Debug)]
pub(crate) struct Report {
    /// The quiet tenants alone, then during the flood.
    pub(crate) quiet_alone: Vec<Measured>,
    pub(crate) quiet_during_flood: Vec<Measured>,
    pub(crate) flood: Measured,
    /// Per upstream key: (attempts, 429s), as the upstream counted.
    pub(crate) per_key: Vec<(&'static str, usize, usize)>,
    pub(crate) live_allowances: usize,
}

/// Starts the upstream and the proxy, runs both measurements, stops everything.
pub(crate) async fn run() -> Result<Report, BoxError> {
    let upstream = TokenUpstream::start(upstream_config()).await?;
    let keyed = registry()?;
    let router = app(&upstream.url(), keyed.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let proxy = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let gap = Duration::from_millis(200);
    let quiet = |tenant| send(&proxy, tenant, 5, 200, gap);
    let (a, b) = tokio::join!(quiet("tenant-a"), quiet("tenant-b"));
    let quiet_alone = vec![a?, b?];
    // The upstream's buckets are per key; wait for the quiet keys' to refill anyway.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (flood, a, b) = tokio::join!(
        send(&proxy, "tenant-flood", 30, 100, Duration::ZERO),
        async {
            // Let the flood reach the proxy first.
            tokio::time::sleep(Duration::from_millis(50)).await;
            quiet("tenant-a").await
        },
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            quiet("tenant-b").await
        },
    );
    let quiet_during_flood = vec![a?, b?];
    let flood = flood?;
    let per_key = TENANTS
        .iter()
        .map(|(tenant, key)| {
            let s = upstream.summary(Some(key));
            (*tenant, s.attempts, s.rejected)
        })
        .collect();
    server.abort();
    upstream.shutdown().await;
    Ok(Report {
        quiet_alone,
        quiet_during_flood,
        flood,
        per_key,
        live_allowances: keyed.len(),
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    println!(
        "Three tenants, each with its own upstream key limited to 10 requests/s (burst 2) and"
    );
    println!("2,000 tokens/s; one proxy, one allowance per key. Measuring (about 4 s)...\n");
    let r = run().await?;
    println!(
        "{:<28} {:>6} {:>6} {:>12} {:>12}",
        "at the proxy's door", "sent", "200s", "median ms", "max ms"
    );
    let row = |label: String, m: &Measured| {
        println!(
            "{:<28} {:>6} {:>6} {:>12} {:>12}",
            label,
            m.sent,
            m.ok,
            m.median_ms(),
            m.max_ms()
        );
    };
    for (m, name) in r.quiet_alone.iter().zip(["tenant-a", "tenant-b"]) {
        row(format!("{name}, alone"), m);
    }
    row("tenant-flood, 30 at once".to_owned(), &r.flood);
    for (m, name) in r.quiet_during_flood.iter().zip(["tenant-a", "tenant-b"]) {
        row(format!("{name}, during the flood"), m);
    }
    println!("\nAs the upstream counted:");
    for (tenant, attempts, rejected) in &r.per_key {
        println!("  {tenant:<14} {attempts:>3} requests, {rejected} of them 429");
    }
    println!(
        "\nThe flood waited in its own key's queue; the other tenants did not notice. {} allowances live.",
        r.live_allowances
    );
    Ok(())
}
