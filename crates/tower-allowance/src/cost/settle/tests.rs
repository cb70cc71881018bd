//! The settle layer with the others, in virtual time: retries, cancellations, the adaptive
//! rate, bodies read to their end or dropped.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{service_fn, ServiceBuilder, ServiceExt};

use super::{OpenAiUsage, SettleLayer, Settlement};
use crate::{retry::RetryConfig, Allowance, AllowanceConfig, Cost, Limit};

/// 10 requests/s and 1,000 tokens/s with bursts of 1,000, exact, settling as told.
fn config(settlement: Settlement) -> AllowanceConfig {
    AllowanceConfig::per_second(10, 10)
        .and_then(|c| {
            c.exact()
                .with_limit(Limit::per_second(1_000, 1_000)?.exact().counting_cost())
        })
        .expect("valid")
        .with_settlement(settlement)
}

const USAGE_100: &str =
    r#"{"usage":{"prompt_tokens":40,"completion_tokens":60,"total_tokens":100}}"#;

fn request(cost: u32) -> Request<Full<bytes::Bytes>> {
    let mut req = Request::new(Full::default());
    req.extensions_mut().insert(Cost(cost));
    req
}

/// How long a fresh request of `cost` waits for admission now.
async fn wait_for(allowance: &Allowance, cost: u32) -> Duration {
    let start = Instant::now();
    allowance
        .acquire_with(crate::AcquireOptions::new().cost(cost))
        .await
        .expect("admitted");
    start.elapsed()
}

#[tokio::test(start_paused = true)]
async fn a_retry_reserves_again_and_a_throttled_attempt_settles_to_nothing() {
    let allowance = Allowance::new(config(Settlement::all()));
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = {
        let calls = calls.clone();
        service_fn(move |_req: Request<Full<bytes::Bytes>>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut res =
                    Response::new(Full::new(bytes::Bytes::from_static(USAGE_100.as_bytes())));
                if n == 0 {
                    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    res.headers_mut().insert(
                        http::header::RETRY_AFTER,
                        http::HeaderValue::from_static("1"),
                    );
                }
                Ok::<_, Infallible>(res)
            }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(allowance.layer())
        .layer(SettleLayer::new(&allowance, OpenAiUsage::new()))
        .service(inner);
    let res = svc.oneshot(request(1_000)).await.expect("answered");
    assert_eq!(res.status(), StatusCode::OK);
    res.into_body().collect().await.expect("whole body");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one retry");
    // The 429's 1,000 came back; the retry's 1,000 settled to 100: 900 back. The next 1,000
    // waits for 100 tokens (100 ms), not for the two reservations (2 s).
    assert_eq!(
        wait_for(&allowance, 1_000).await,
        Duration::from_millis(100)
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_or_failed_attempt_keeps_its_reservation() {
    let allowance = Allowance::new(config(Settlement::all()));
    let once = RetryConfig::default().with_max_attempts(1).expect("valid");
    let slow = service_fn(|_req: Request<Full<bytes::Bytes>>| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, Infallible>(Response::new(Full::new(bytes::Bytes::from_static(
            USAGE_100.as_bytes(),
        ))))
    });
    let svc = ServiceBuilder::new()
        .layer(allowance.layer().with_retry(once))
        .layer(SettleLayer::new(&allowance, OpenAiUsage::new()))
        .service(slow);
    // Sent, then dropped before its answer: the provider may have charged it.
    let cancelled = tokio::time::timeout(Duration::from_millis(10), svc.oneshot(request(1_000)));
    assert!(cancelled.await.is_err(), "cancelled");
    // Nothing came back: the next 1,000 wait a whole second (less the 10 ms passed).
    assert_eq!(
        wait_for(&allowance, 1_000).await,
        Duration::from_millis(990)
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_early_settles_with_what_it_said() {
    let allowance = Allowance::new(config(Settlement::all()));
    let inner = service_fn(|_req: Request<Full<bytes::Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(bytes::Bytes::from_static(
            USAGE_100.as_bytes(),
        ))))
    });
    let svc = ServiceBuilder::new()
        .layer(allowance.layer())
        .layer(SettleLayer::new(&allowance, OpenAiUsage::new()).max_body(1_024))
        .service(inner);
    // Never read: the usage is unknown, the whole reservation stays charged.
    drop(svc.clone().oneshot(request(500)).await.expect("answered"));
    // Read to its end: 400 of its 500 come back.
    let res = svc.oneshot(request(500)).await.expect("answered");
    res.into_body().collect().await.expect("whole body");
    // 500 + 100 charged: the next 1,000 wait 600 ms.
    assert_eq!(
        wait_for(&allowance, 1_000).await,
        Duration::from_millis(600)
    );
}

#[tokio::test(start_paused = true)]
async fn the_adaptive_rate_keeps_working_with_settlements() {
    #[cfg(feature = "adaptive")]
    let config = config(Settlement::all())
        .with_adaptive_rate(crate::AdaptiveRate::new(10.0, 1.0, 20.0).expect("valid"));
    #[cfg(not(feature = "adaptive"))]
    let config = config(Settlement::all());
    let allowance = Allowance::new(config);
    let layer = SettleLayer::new(&allowance, OpenAiUsage::new());
    let inner = service_fn(|_req: Request<Full<bytes::Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(bytes::Bytes::from_static(
            USAGE_100.as_bytes(),
        ))))
    });
    let svc = ServiceBuilder::new()
        .layer(allowance.layer())
        .layer(layer.clone())
        .service(inner);
    for _ in 0..3 {
        let res = svc.clone().oneshot(request(1_000)).await.expect("answered");
        res.into_body().collect().await.expect("whole body");
    }
    assert!((layer.share() - 1.0).abs() < f64::EPSILON);
    // Three of 1,000 each used 100: 300 charged in all (plus what refilled meanwhile).
    assert!(wait_for(&allowance, 1_000).await <= Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn a_credit_moves_the_callers_of_another_allowance_on_the_same_memory_store() {
    // Two allowances (one per runtime, say) on one memory store: a settlement in one moves
    // the caller waiting in the other earlier, as a cooldown would reach it.
    let memory = Arc::new(crate::store::MemoryStore::new());
    let one = Allowance::builder(config(Settlement::all()))
        .store(memory.clone())
        .build();
    let other = Allowance::builder(config(Settlement::all()))
        .store(memory)
        .build();
    let answers = service_fn(|_req: Request<Full<bytes::Bytes>>| async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, Infallible>(Response::new(Full::new(bytes::Bytes::from_static(
            USAGE_100.as_bytes(),
        ))))
    });
    let svc = ServiceBuilder::new()
        .layer(one.layer())
        .layer(SettleLayer::new(&one, OpenAiUsage::new()))
        .service(answers);
    // 900 reserved in `one` (answered 10 ms later, 100 used); `other`'s 900 wait for it.
    let sent = tokio::spawn(async move {
        let res = svc.oneshot(request(900)).await.expect("answered");
        res.into_body().collect().await.expect("whole body");
    });
    tokio::task::yield_now().await;
    let waited = wait_for(&other, 900).await;
    sent.await.expect("joined");
    // 800 came back at 10 ms: the waiter goes then, not at 800 ms.
    assert_eq!(waited, Duration::from_millis(10));
}
