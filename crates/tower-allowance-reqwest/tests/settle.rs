//! Reserve, then settle through reqwest (feature `settle`): each request reserves prompt +
//! `max_tokens` and is settled, as the caller reads the body, to the usage the OpenAI-shaped
//! upstream reports; the caller still gets the whole body and the response's URL.
#![cfg(feature = "settle")]

use std::time::Duration;

use tokio::time::Instant;

use allowance_testkit::chat::{ChatUpstream, ChatUpstreamConfig};
use reqwest_middleware::ClientBuilder;
use tower_allowance::{
    cost::settle::{OpenAiUsage, Settlement},
    Allowance, AllowanceConfig, Cost, Limit,
};
use tower_allowance_reqwest::AllowanceMiddleware;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_answer_settles_as_its_body_is_read() {
    // 1,000 tokens per second (burst 1,000), refunding every unused reservation.
    let upstream = ChatUpstream::start(ChatUpstreamConfig::new(1_000, 100, Duration::from_secs(1)))
        .await
        .expect("upstream");
    let config = AllowanceConfig::per_second(100, 100)
        .expect("valid")
        .exact()
        .with_limit(
            Limit::per_second(1_000, 1_000)
                .expect("valid")
                .exact()
                .counting_cost(),
        )
        .expect("two limits")
        .with_settlement(Settlement::learned());
    let allowance = Allowance::new(config);
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            AllowanceMiddleware::new(allowance.clone())
                .with_settlement(&allowance, OpenAiUsage::new()),
        )
        .build();
    let url = format!("{}/v1/chat/completions", upstream.url());
    let start = Instant::now();
    // Five requests reserving 900 each (1,000 tokens/s): without settling, 3.6 s; each uses
    // 100 + at most 400, so settled they take about 2 s at most.
    for _ in 0..5 {
        let answer = client
            .post(&url)
            .body(r#"{"prompt_tokens": 100, "max_tokens": 800}"#)
            .with_extension(Cost(900))
            .send()
            .await
            .expect("sent");
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.url().as_str(),
            url,
            "the caller's response keeps its URL"
        );
        let body = answer.text().await.expect("the body, whole");
        assert!(body.contains("\"total_tokens\""), "{body}");
    }
    let counts = upstream.counts();
    assert_eq!(
        counts.rejected_tokens + counts.rejected_requests,
        0,
        "{counts:?}"
    );
    assert_eq!(counts.ok, 5);
    assert!(
        start.elapsed() < Duration::from_millis(3_000),
        "{:?}",
        start.elapsed()
    );
    upstream.shutdown().await;
}
