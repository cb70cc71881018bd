//! The cooldown across processes, through the layers: process A's request gets
//! `429 Retry-After: 2`; process B (its own connection, its own `Allowance`, the same name)
//! is held until that deadline, although B never saw a 429. Real time, real Redis.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_allowance::{retry::RetryConfig, Allowance, AllowanceConfig, Outcome};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

#[tokio::test]
async fn retry_after_seen_by_one_process_holds_the_other() {
    let redis = TestRedis::start().await;
    let name = unique_name("retry-after");
    let config = AllowanceConfig::per_second(10, 2).expect("valid");
    let process = |store: RedisStore| {
        (Allowance::with_store(config.clone(), store))
            .layer()
            .with_retry(RetryConfig::default().with_max_attempts(1).expect("valid"))
    };
    let connect = || RedisStore::connect(redis.url(), &name, RedisStoreOptions::new());
    let a = process(connect().await.expect("connect A"));
    let b = process(connect().await.expect("connect B"));

    // A: the upstream throttles it with Retry-After: 2.
    let throttled = integration_tests::throttling(Some("2"));
    let a_result = ServiceBuilder::new()
        .layer(a)
        .service(throttled.service.clone())
        .oneshot(Request::new(String::new()))
        .await;
    assert_eq!(throttled.calls(), 1);
    let a_response = a_result.as_ref().expect("a 429 response");
    assert_eq!(a_response.status(), StatusCode::TOO_MANY_REQUESTS);
    let deferred_at = Instant::now();

    // B: a healthy upstream, but the shared cooldown holds B's first request until A's
    // deadline. It asks Redis once, sleeps the returned wait, then is admitted.
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let ok = service_fn(move |_req: Request<String>| {
        let seen = seen.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(String::from("odds")))
        }
    });
    let b_result = ServiceBuilder::new()
        .layer(b)
        .service(ok)
        .oneshot(Request::new(String::new()))
        .await;
    let waited = deferred_at.elapsed();
    assert!(Outcome::of(&b_result).is_completed(), "{b_result:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    eprintln!("B's request was sent {waited:?} after A's Retry-After: 2");
    assert!(
        waited >= Duration::from_millis(1_950) && waited <= Duration::from_millis(2_300),
        "B waited {waited:?}, want ~2 s"
    );
}
