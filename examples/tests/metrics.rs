//! The axum proxy's `/metrics` during a throttled run, checked against what the throttling
//! upstream itself saw (its log). The example is compiled in as a module: what is tested is
//! what a reader runs.
//!
//! Its own test binary, because it installs the process's global `metrics` recorder.

#[path = "../axum_proxy.rs"]
#[allow(dead_code)]
mod axum_proxy;

use std::{collections::BTreeMap, time::Duration};

use allowance_testkit::upstream::{Upstream, UpstreamConfig, DEFAULT_KEY};
use http::StatusCode;
use tower_allowance::{error::AbandonReason, Allowance, AllowanceConfig};

/// The allowance's name: every sample checked carries it.
const NAME: &str = "odds-metrics-test";

/// One sample of the Prometheus text format: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The samples of `text` (label values here contain no `,`, `"` or `}`).
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a value");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("key=value");
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            Sample {
                name: name.to_owned(),
                labels,
                value: value.parse().expect("a number"),
            }
        })
        .collect()
}

/// The sum of `name`'s samples for this allowance whose labels include `with`.
fn total(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> u64 {
    let sum: f64 = samples
        .iter()
        .filter(|s| s.name == name && s.labels.get("allowance").map(String::as_str) == Some(NAME))
        .filter(|s| {
            with.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum();
    sum as u64
}

/// The upstream throttles (burst 2 at 2/s, `Retry-After: 1`) while the proxy's allowance
/// expects 2/s with bursts of 4, and callers wait at most 2.2 s. Ten requests at once: four
/// go at once (two answered 429), the others reserve slots that the cooldown moves 1 s later,
/// and those that would pass their deadline are abandoned. `/metrics` must say exactly what
/// the upstream saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_counts_what_the_upstream_saw() {
    let prometheus = axum_proxy::install_prometheus().expect("the only recorder");
    let upstream = Upstream::start(UpstreamConfig::new(2, 2))
        .await
        .expect("binds");
    let allowance = Allowance::builder(AllowanceConfig::per_second(2, 4).expect("valid"))
        .name(NAME)
        .build();
    let router = axum_proxy::app(
        upstream.url(),
        DEFAULT_KEY.to_owned(),
        allowance.clone(),
        Duration::from_millis(2_200),
    )
    .expect("valid")
    .merge(axum_proxy::metrics_route(prometheus, allowance.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("bound");
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let answers = axum_proxy::inbound(addr, 10).await.expect("inbound");
    let text = axum_proxy::scrape(addr).await.expect("scrapes");
    let log = upstream.log();
    server.abort();
    upstream.shutdown().await;
    let samples = parse(&text);

    // What the upstream saw.
    let ok = log.iter().filter(|r| r.status == 200).count() as u64;
    let throttled = log.iter().filter(|r| r.status == 429).count() as u64;
    assert_eq!(ok + throttled, log.len() as u64, "{log:?}");
    assert!(throttled > 0, "a throttled run: {log:?}");
    // Every inbound request was served (the upstream's 200) or abandoned (the proxy's 503).
    let served = answers.iter().filter(|(s, _)| *s == StatusCode::OK).count() as u64;
    assert_eq!(served, ok, "{answers:?}");
    let refused = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::SERVICE_UNAVAILABLE)
        .count() as u64;
    assert_eq!(served + refused, 10, "{answers:?}");

    // Admissions: every admitted attempt reached the upstream, and nothing else did.
    let admissions = "tower_allowance_admissions_total";
    let now = total(&samples, admissions, &[("waited", "false")]);
    let waited = total(&samples, admissions, &[("waited", "true")]);
    assert_eq!(now + waited, log.len() as u64, "{text}\n{log:?}");
    // Counts and order, nothing that load can move: the burst's first admissions went at
    // once (a full bucket admits without waiting, however loaded the machine), at most the
    // burst of them; everything the upstream saw after the cooldown the first 429 raised
    // (1 s) had waited for it, and an admission of the first wave may have waited too (the
    // burst's headroom, a few ms), so the waits are at least the late ones.
    let first_429 = log.iter().position(|r| r.status == 429).expect("a 429");
    let cooldown_end = log[first_429].at_ms + 1_000;
    let late = log.iter().filter(|r| r.at_ms >= cooldown_end).count() as u64;
    assert!((1..=4).contains(&now), "{text}\n{log:?}");
    assert!(waited >= late, "{text}\n{log:?}");
    assert!(late > 0, "some went after the cooldown: {log:?}");
    // The waits histogram has one sample per admission that waited, each at least the
    // cooldown's remainder (the slots were reserved before the 429s and moved by 1 s).
    assert_eq!(
        total(&samples, "tower_allowance_wait_seconds_count", &[]),
        waited
    );
    let wait_sum = samples
        .iter()
        .find(|s| {
            s.name == "tower_allowance_wait_seconds_sum"
                && s.labels.get("allowance").map(String::as_str) == Some(NAME)
        })
        .map(|s| s.value)
        .expect("a sum");
    assert!(wait_sum >= waited as f64 * 0.9, "{wait_sum} s for {waited}");

    // Throttling responses, by status: the upstream's 429s, and no other status.
    let by_status = "tower_allowance_throttled_responses_total";
    assert_eq!(total(&samples, by_status, &[("status", "429")]), throttled);
    assert_eq!(total(&samples, by_status, &[]), throttled, "{text}");

    // Abandonments: every inbound request the upstream did not serve, all for their deadline
    // (the 429s' retries and the moved slots could not come in time).
    let abandoned = "tower_allowance_abandoned_total";
    assert_eq!(total(&samples, abandoned, &[]), 10 - ok, "{text}\n{log:?}");
    assert_eq!(
        total(&samples, abandoned, &[("reason", "deadline")]),
        10 - ok,
        "{text}"
    );
    let snapshot = allowance.snapshot();
    assert_eq!(snapshot.abandoned.get(AbandonReason::Deadline), 10 - ok);
    assert_eq!((snapshot.admitted, snapshot.waited), (now + waited, waited));

    // Gauges, refreshed by the scrape: nobody waits any more.
    assert_eq!(total(&samples, "tower_allowance_waiting", &[]), 0, "{text}");
    assert!(
        samples
            .iter()
            .any(|s| s.name == "tower_allowance_cooldown_remaining_seconds"),
        "{text}"
    );
}
