//! The throttling upstream over real HTTP: routes, keys, the bucket's headers, the three
//! `Retry-After` modes, the quota and `/v1/usage`, the log, and a clean stop.

use std::time::Duration;

use allowance_testkit::upstream::{
    http_client, HttpClient, RetryAfterMode, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY,
};
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use serde_json::Value;

struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

async fn get(client: &HttpClient, url: String, key: Option<&str>) -> Got {
    let mut req = Request::get(url);
    if let Some(key) = key {
        req = req.header(API_KEY_HEADER, key);
    }
    let res = client
        .request(req.body(Empty::<Bytes>::new()).expect("request"))
        .await
        .expect("response");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: serde_json::from_slice(&body).expect("JSON body"),
    }
}

fn header<'a>(got: &'a Got, name: &str) -> Option<&'a str> {
    got.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_routes_bucket_headers_and_log() {
    let upstream = Upstream::start(UpstreamConfig::new(2, 1).with_keys(["a", "b"]))
        .await
        .expect("binds");
    let client = http_client();
    let snap = |event: &str| upstream.snapshot_url(event);

    let missing = get(&client, snap("e1"), None).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert!(missing.body["detail"]
        .as_str()
        .expect("detail")
        .contains("X-API-Key"));
    let unknown = get(&client, snap("e1"), Some("zzz")).await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
    let nowhere = get(&client, format!("{}/v2/else", upstream.url()), Some("a")).await;
    assert_eq!(nowhere.status, StatusCode::NOT_FOUND);

    // Key "a": a burst of two, then 429 with Retry-After: 1 and the rate-limit headers.
    let first = get(&client, snap("e1"), Some("a")).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body["event_id"], "e1");
    assert_eq!(header(&first, "x-ratelimit-limit"), Some("2"));
    assert_eq!(header(&first, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(header(&first, "x-ratelimit-bucket"), Some("odds"));
    assert_eq!(
        get(&client, snap("e2"), Some("a")).await.status,
        StatusCode::OK
    );
    let third = get(&client, snap("e3"), Some("a")).await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&third, "retry-after"), Some("1"));
    assert_eq!(header(&third, "x-ratelimit-remaining"), Some("0"));
    assert!(third.body["detail"].is_string());
    // Key "b" has a bucket of its own.
    assert_eq!(
        get(&client, snap("e1"), Some("b")).await.status,
        StatusCode::OK
    );

    let log = upstream.log();
    let statuses: Vec<(String, u16)> = log.iter().map(|r| (r.key.clone(), r.status)).collect();
    assert_eq!(
        statuses,
        [
            (String::new(), 401),
            ("zzz".to_owned(), 401),
            ("a".to_owned(), 404),
            ("a".to_owned(), 200),
            ("a".to_owned(), 200),
            ("a".to_owned(), 429),
            ("b".to_owned(), 200),
        ]
    );
    assert_eq!(log[3].path, "/v1/events/e1/odds/snapshot");
    assert!(log.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));

    // A clean stop: the port no longer accepts connections.
    let addr = upstream.addr();
    upstream.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_as_http_date_or_absent() {
    for (mode, check) in [
        (RetryAfterMode::HttpDate(3), "date"),
        (RetryAfterMode::Absent, "absent"),
        (RetryAfterMode::Seconds(7), "seconds"),
    ] {
        let upstream = Upstream::start(UpstreamConfig::new(1, 1).with_retry_after(mode))
            .await
            .expect("binds");
        let client = http_client();
        get(&client, upstream.snapshot_url("e1"), Some(DEFAULT_KEY)).await;
        let throttled = get(&client, upstream.snapshot_url("e1"), Some(DEFAULT_KEY)).await;
        upstream.shutdown().await;
        assert_eq!(throttled.status, StatusCode::TOO_MANY_REQUESTS);
        // What the library reads from it.
        let delay = tower_allowance::signals::retry_after(&throttled.headers).expect("valid");
        match check {
            "date" => {
                let value = header(&throttled, "retry-after").expect("present");
                assert!(value.ends_with(" GMT"), "{value}");
                // Three seconds after the whole-second `Date`, read within its second on
                // the same clock: at most 3 s, more than 2 s.
                let d = delay.expect("a delay");
                assert!(
                    d > Duration::from_secs(2) && d <= Duration::from_secs(3),
                    "{d:?}"
                );
            }
            "absent" => assert_eq!(delay, None),
            _ => assert_eq!(delay, Some(Duration::from_secs(7))),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_then_429_without_retry_after_and_usage_still_answers() {
    let upstream = Upstream::start(UpstreamConfig::new(10, 10).with_quota(2))
        .await
        .expect("binds");
    let client = http_client();
    let usage_url = format!("{}/v1/usage", upstream.url());

    let usage = get(&client, usage_url.clone(), Some(DEFAULT_KEY)).await;
    assert_eq!(usage.status, StatusCode::OK);
    assert_eq!(usage.body["api_credits_used"], 0);
    assert_eq!(usage.body["api_credits_limit"], 2);
    assert_eq!(usage.body["exceeded"], false);
    let end = usage.body["period_end_utc"].as_str().expect("string");
    assert!(end.ends_with("-01T00:00:00Z"), "{end}");

    for _ in 0..2 {
        let ok = get(&client, upstream.snapshot_url("e1"), Some(DEFAULT_KEY)).await;
        assert_eq!(ok.status, StatusCode::OK);
    }
    let spent = get(&client, upstream.snapshot_url("e1"), Some(DEFAULT_KEY)).await;
    assert_eq!(spent.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(!spent.headers.contains_key("retry-after"));
    assert_eq!(header(&spent, "x-requests-remaining"), Some("0"));

    let usage = get(&client, usage_url, Some(DEFAULT_KEY)).await;
    assert_eq!(usage.status, StatusCode::OK);
    assert_eq!(usage.body["api_credits_used"], 2);
    assert_eq!(usage.body["exceeded"], true);
    assert_eq!(upstream.credits_used(DEFAULT_KEY), Some(2));
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_costs_a_request_and_can_be_throttled() {
    let upstream = Upstream::start(UpstreamConfig::new(1, 1))
        .await
        .expect("binds");
    let client = http_client();
    let usage_url = format!("{}/v1/usage", upstream.url());
    assert_eq!(
        get(&client, usage_url.clone(), Some(DEFAULT_KEY))
            .await
            .status,
        StatusCode::OK
    );
    let throttled = get(&client, usage_url, Some(DEFAULT_KEY)).await;
    assert_eq!(throttled.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&throttled, "retry-after"), Some("1"));
    upstream.shutdown().await;
}
