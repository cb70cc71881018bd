//! `allowance-sim serve` beyond the odds shape: each provider's dialect on successes and
//! 429s over real HTTP (read back by the matching client dialect), a rate that changes
//! during the run, and `--token-rate` (requests and tokens per key at once).

mod common;

use std::{
    process::Command,
    time::{Duration, SystemTime},
};

use allowance_testkit::{
    dialect::ServerDialect,
    tokens::TOKENS_HEADER,
    upstream::{http_client, HttpClient, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Empty;
use tower_allowance::signals::{ReadContext, Wait};

use common::{http_against_github_serve, Served};

async fn get(client: &HttpClient, url: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap) {
    let mut req = Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = client
        .request(req.body(Empty::<Bytes>::new()).expect("request"))
        .await
        .expect("response");
    (res.status(), res.headers().clone())
}

#[allow(clippy::disallowed_methods)] // the client's wall clock, as the library reads it
fn wall() -> SystemTime {
    SystemTime::now()
}

#[test]
fn serve_help_lists_the_dialects_and_the_token_rate() {
    let out = Command::new(env!("CARGO_BIN_EXE_allowance-sim"))
        .args(["serve", "--help"])
        .output()
        .expect("runs");
    let help = String::from_utf8(out.stdout).expect("utf-8");
    for word in [
        "--dialect",
        "odds",
        "ietf",
        "github",
        "openai",
        "anthropic",
        "--rate-change",
        "--token-rate",
    ] {
        assert!(help.contains(word), "{word} in {help}");
    }
}

/// Every dialect, over HTTP: a success with tokens left never asks for a wait; once the
/// bucket is spent, successes (except the odds shape, which has no reset) and 429s ask for
/// at least the time to the next token, read by the matching client dialect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dialect_on_successes_and_429s() {
    let client = http_client();
    for dialect in ServerDialect::ALL {
        let upstream = Upstream::start(UpstreamConfig::new(2, 1).with_dialect(dialect))
            .await
            .expect("binds");
        let url = upstream.snapshot_url("e1");
        let key = [(API_KEY_HEADER, DEFAULT_KEY)];
        let read = |headers: &HeaderMap| {
            dialect
                .client_dialect()
                .read(headers, &ReadContext::new(wall()))
        };
        let (status, first) = get(&client, &url, &key).await;
        assert_eq!(status, StatusCode::OK);
        let r = read(&first);
        assert_eq!(
            (r.remaining, r.wait),
            (Some(1), None),
            "{dialect}: {first:?}"
        );
        let (status, spent) = get(&client, &url, &key).await;
        assert_eq!(status, StatusCode::OK);
        let r = read(&spent);
        assert_eq!(r.remaining, Some(0), "{dialect}");
        if dialect != ServerDialect::Odds {
            let wait = r.wait.as_ref().and_then(Wait::duration);
            // About a second to the next token (1/s); whole-second resets round up. The
            // 900 ms floor holds while the second request follows the first within 100 ms
            // (one loopback round trip, about a millisecond idle: a margin of some hundred
            // times); the 3 s ceiling is a header's value, not a measured time.
            assert!(
                wait.is_some_and(|w| w >= Duration::from_millis(900) && w <= Duration::from_secs(3)),
                "{dialect}: {r:?} from {spent:?}"
            );
        }
        let (status, throttled) = get(&client, &url, &key).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{dialect}");
        assert_eq!(throttled["retry-after"], "1", "{dialect}");
        let r = read(&throttled);
        assert!(r.wait.is_some(), "{dialect}: {throttled:?}");
        upstream.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_speaks_ietf_and_changes_its_rate() {
    // The client first (it reads the system's roots): between the server's start and the
    // second request below there are only the two requests on loopback (about a millisecond
    // each on an idle machine), against the 200 ms before the rate changes, a margin of
    // some hundred times. Everything after the change is a lower bound (a late request
    // only finds more tokens at 50/s).
    let client = http_client();
    // 1/s with a burst of 1, then 50/s from 200 ms on.
    let served = Served::start(&[
        "--dialect",
        "ietf",
        "--burst",
        "1",
        "--rate",
        "1",
        "--rate-change",
        "200ms:50",
    ]);
    let url = format!("{}/v1/events/e1/odds/snapshot", served.url);
    let key = [(API_KEY_HEADER, DEFAULT_KEY)];
    let (status, headers) = get(&client, &url, &key).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["ratelimit-policy"], "\"default\";q=1;w=1");
    assert_eq!(
        get(&client, &url, &key).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // At 1/s the next token is 0.9 s away; at 50/s, from 200 ms on, 20 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, headers) = get(&client, &url, &key).await;
    assert_eq!(status, StatusCode::OK, "{headers:?}");
    assert_eq!(headers["ratelimit-policy"], "\"default\";q=50;w=1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_a_token_rate_limits_requests_and_tokens_at_once() {
    // 10 requests/s (burst 5) and 100 tokens/s (burst 100), per key.
    let served = Served::start(&["--rate", "10", "--burst", "5", "--token-rate", "100/s"]);
    let client = http_client();
    let url = format!("{}/v1/chat/completions", served.url);
    let auth = format!("Bearer {DEFAULT_KEY}");
    let ask = |tokens: &'static str| {
        let (client, url, auth) = (client.clone(), url.clone(), auth.clone());
        async move {
            get(
                &client,
                &url,
                &[("authorization", auth.as_str()), (TOKENS_HEADER, tokens)],
            )
            .await
        }
    };
    let (status, headers) = ask("60").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-ratelimit-remaining-tokens"], "40");
    // Tokens bind before requests do: 60 more do not fit, and nothing is charged. (Load-proof
    // while the two requests come within 200 ms, the time 100 tokens/s takes to refill the 20
    // missing: one loopback round trip apart, some hundred times less.)
    let (status, headers) = ask("60").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let ms: u64 = headers["retry-after-ms"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a number");
    assert!(
        (100..=200).contains(&ms),
        "about 200 ms for 20 tokens: {ms}"
    );
    assert_eq!(ask("40").await.0, StatusCode::OK);
    // A request without its cost is refused outright.
    let (status, _) = get(&client, &url, &[("authorization", auth.as_str())]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// `http --dialect`: against a GitHub-shaped upstream at 1/s, a client reading OpenAI's
/// headers (`x-ratelimit-*-requests`: none here) with its allowance set far too fast (20/s)
/// runs into 429s. Load-proof: six jobs at 20/s (burst 2) against a bucket of 2 at 1/s; to
/// see no 429 they would have to go out about a second apart, twenty times slower than the
/// allowance sends them. (The other half, a client reading GitHub's headers seeing no 429,
/// counts 429s in real time: `real_time.rs`, `serve::http_reads_the_github_dialect_and_sees_no_429`.)
#[test]
fn http_reads_the_dialect_it_is_given() {
    assert!(http_against_github_serve("openai") > 0);
}
