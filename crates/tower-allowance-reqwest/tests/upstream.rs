//! Over real HTTP against `allowance-sim`'s throttling upstream (what `allowance-sim serve`
//! runs): eight workers on one reqwest client, counted by the server.

use std::time::Duration;

use allowance_testkit::upstream::{
    snapshot_path, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY,
};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tower_allowance::{
    error::AbandonReason, retry::RetryConfig, Allowance, AllowanceConfig, Deadline, Outcome,
};
use tower_allowance_reqwest::{outcome, AllowanceMiddleware};

/// What the server saw: attempts and 429s; and how the eight jobs ended.
#[derive(Debug)]
struct Run {
    attempts: usize,
    rejected: usize,
    outcomes: Vec<Outcome>,
}

fn retry() -> RetryConfig {
    RetryConfig::default()
        .with_max_attempts(10)
        .expect("valid")
        .with_jitter_seed(1)
}

/// Eight jobs, eight workers, one `reqwest::Client` (one connection pool). `shared`: one
/// middleware over one allowance; otherwise each worker has its own middleware over a
/// private allowance of its own (it honours `Retry-After` alone).
async fn eight_workers(shared: bool) -> Run {
    let upstream = Upstream::start(UpstreamConfig::new(2, 2))
        .await
        .expect("binds");
    let client = reqwest::Client::new();
    let one = Allowance::new(AllowanceConfig::per_second(2, 2).expect("valid"));
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let allowance = if shared {
            one.clone()
        } else {
            Allowance::new(AllowanceConfig::per_second(1_000_000, 1_000_000).expect("valid"))
        };
        let client: ClientWithMiddleware = ClientBuilder::new(client.clone())
            .with(AllowanceMiddleware::new(allowance).with_retry(retry()))
            .build();
        let url = format!("{}{}", upstream.url(), snapshot_path(&format!("e{worker}")));
        tasks.push(tokio::spawn(async move {
            let result = client
                .get(url)
                .header(API_KEY_HEADER, DEFAULT_KEY)
                .send()
                .await;
            outcome(&result)
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("joins"));
    }
    let log = upstream.log();
    upstream.shutdown().await;
    Run {
        attempts: log.len(),
        rejected: log.iter().filter(|r| r.status == 429).count(),
        outcomes,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_on_one_client_naive_vs_shared() {
    let naive = eight_workers(false).await;
    let shared = eight_workers(true).await;

    // Each naive worker honours Retry-After alone: the server still sees 429s.
    assert!(naive.rejected > 0, "{naive:?}");
    // One allowance: one attempt per job, never refused, every job completed.
    assert_eq!((shared.attempts, shared.rejected), (8, 0), "{shared:?}");
    assert_eq!(shared.outcomes, vec![Outcome::Completed; 8]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_is_sent_once_and_its_429_comes_back_marked() {
    // A bucket of zero: every call is answered 429 with Retry-After: 1.
    let upstream = Upstream::start(UpstreamConfig::new(0, 1))
        .await
        .expect("binds");
    let allowance = Allowance::new(AllowanceConfig::per_second(10, 10).expect("valid"));
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(AllowanceMiddleware::new(allowance.clone()).with_retry(retry()))
        .build();
    let url = format!("{}{}", upstream.url(), snapshot_path("e1"));
    let result = client
        .get(&url)
        .header(API_KEY_HEADER, DEFAULT_KEY)
        .body(reqwest::Body::wrap(String::from("a streamed body")))
        .send()
        .await;
    let log = upstream.log();
    upstream.shutdown().await;

    assert_eq!(log.len(), 1, "sent once: {log:?}");
    assert_eq!(result.as_ref().map(|r| r.status().as_u16()).ok(), Some(429));
    assert_eq!(
        outcome(&result),
        Outcome::Abandoned(AbandonReason::NotReplayable)
    );
    let snapshot = allowance.snapshot();
    assert_eq!(snapshot.abandoned.get(AbandonReason::NotReplayable), 1);
    // The 429 still cooled the allowance down for everyone.
    assert!(snapshot.cooling_for.is_some(), "{snapshot:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_in_the_chain_extensions_is_honoured() {
    let upstream = Upstream::start(UpstreamConfig::new(1, 1))
        .await
        .expect("binds");
    let allowance = Allowance::new(AllowanceConfig::per_second(1, 1).expect("valid"));
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(AllowanceMiddleware::new(allowance).with_retry(retry()))
        .build();
    let url = format!("{}{}", upstream.url(), snapshot_path("e1"));
    let get = || {
        client
            .get(&url)
            .header(API_KEY_HEADER, DEFAULT_KEY)
            .with_extension(Deadline::after(Duration::from_millis(100)))
            .send()
    };
    assert_eq!(outcome(&get().await), Outcome::Completed);
    // The next slot is a second away: abandoned at once, nothing sent.
    assert_eq!(
        outcome(&get().await),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
    let log = upstream.log();
    upstream.shutdown().await;
    assert_eq!(log.len(), 1, "{log:?}");
}

/// Each answer says why it waited, through the middleware too: a response that queued for
/// its slot carries the attempt record (`Attempt::queued`, `Attempt::number`) in its
/// extensions; one that went at once carries none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_says_how_long_it_queued() {
    let upstream = Upstream::start(UpstreamConfig::new(100, 100))
        .await
        .expect("binds");
    // One request a second, no burst: the second waits about a second for its slot.
    let allowance = Allowance::new(AllowanceConfig::per_second(1, 1).expect("valid").exact());
    let client: ClientWithMiddleware = ClientBuilder::new(reqwest::Client::new())
        .with(AllowanceMiddleware::new(allowance))
        .build();
    let url = format!("{}{}", upstream.url(), snapshot_path("q"));
    let get = || client.get(&url).header(API_KEY_HEADER, DEFAULT_KEY).send();
    let first = get().await.expect("ok");
    assert!(first
        .extensions()
        .get::<tower_allowance::Attempt>()
        .is_none());
    let second = get().await.expect("ok");
    let record = second
        .extensions()
        .get::<tower_allowance::Attempt>()
        .copied()
        .expect("a record: it waited");
    upstream.shutdown().await;
    assert_eq!(record.number(), 1);
    // The rate held it, no cooldown: the record says which.
    assert_eq!(record.cooled(), Duration::ZERO);
    assert_eq!(record.cooldowns(), 0);
    // Load only delays the first request's end, shortening the second's wait: a lower bound
    // with 300 ms of margin under the second.
    assert!(record.queued() >= Duration::from_millis(700), "{record:?}");
    // A timer fires late under load: the upper bound has 5 s of slack (tests/README.md).
    assert!(
        record.queued() <= Duration::from_millis(6_000),
        "{record:?}"
    );
}
