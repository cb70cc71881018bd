//! One configuration: every layer on an allowance classifies and retries as the allowance's
//! configuration says, unless that layer overrides it; an override stays with its layer.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use http::{HeaderValue, Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{retry::RetryLayer, service_fn, Layer, Service, ServiceExt};

use tower_allowance::{
    classify::{Classification, Classified, StatusClassifier},
    cooldown::CooldownLayer,
    error::AbandonReason,
    retry::{RetryConfig, RetryPolicy},
    Allowance, AllowanceConfig, BoxError, Outcome,
};

/// GitHub's secondary limit: a 403 with `Retry-After: 5` (a failure to the default
/// classifier).
fn forbidden() -> Response<&'static str> {
    let mut res = Response::new("secondary rate limit");
    *res.status_mut() = StatusCode::FORBIDDEN;
    res.headers_mut()
        .insert("retry-after", HeaderValue::from_static("5"));
    res.headers_mut()
        .insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
    res
}

/// An allowance whose configuration calls a 403 throttling and allows 2 attempts a request.
fn configured() -> Allowance {
    let config = AllowanceConfig::per_second(10, 10)
        .expect("valid")
        .with_classifier(StatusClassifier::default().throttled([403, 429]))
        .with_retry(RetryConfig::default().with_max_attempts(2).expect("valid"));
    Allowance::new(config)
}

/// An upstream that always answers [`forbidden`], and counts the attempts.
fn upstream() -> (
    Arc<AtomicUsize>,
    impl Service<Request<()>, Response = Response<&'static str>, Error = BoxError> + Clone,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let svc = service_fn(move |_req: Request<()>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, BoxError>(forbidden()) }
    });
    (calls, svc)
}

fn class<B>(res: &Response<B>) -> Option<Classification> {
    res.extensions().get::<Classified>().map(|c| c.class)
}

#[tokio::test(start_paused = true)]
async fn a_layer_without_a_classifier_uses_the_allowances() {
    // The cooldown layer alone: the 403 raises the shared cooldown for its 5 s.
    let allowance = configured();
    let (_, up) = upstream();
    let res = CooldownLayer::new(allowance.clone())
        .layer(up)
        .oneshot(Request::new(()))
        .await
        .expect("answered");
    assert_eq!(class(&res), Some(Classification::Throttled));
    assert_eq!(
        allowance.snapshot().cooling_for,
        Some(Duration::from_secs(5))
    );

    // The whole stack: throttling, so retried after the cooldown, up to the allowance's 2
    // attempts, then abandoned (never passed off as a final answer).
    let allowance = configured();
    let (calls, up) = upstream();
    let started = Instant::now();
    let result = allowance.layer().layer(up).oneshot(Request::new(())).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::MaxAttempts)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "after the cooldown"
    );
    assert_eq!(allowance.snapshot().admitted, 2);

    // The retry policy alone, under tower's RetryLayer: it retries the 403 too.
    let (calls, up) = upstream();
    let _ = RetryLayer::new(RetryPolicy::new(configured()))
        .layer(up)
        .oneshot(Request::new(()))
        .await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn an_override_wins_for_its_layer_alone() {
    let allowance = configured();

    // A classifier override: the 403 is a plain failure here, and cools nothing down.
    let (calls, up) = upstream();
    let result = allowance
        .layer()
        .with_classifier(StatusClassifier::default())
        .layer(up.clone())
        .oneshot(Request::new(()))
        .await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Unsuccessful(StatusCode::FORBIDDEN)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let res = CooldownLayer::new(allowance.clone())
        .with_classifier(StatusClassifier::default())
        .layer(up.clone())
        .oneshot(Request::new(()))
        .await
        .expect("answered");
    assert_eq!(class(&res), Some(Classification::Failure));
    assert_eq!(allowance.snapshot().cooling_for, None);

    // A retry override: one attempt, whatever the allowance allows; the answer is
    // throttling (the allowance's classifier), so it is abandoned, not final.
    let (calls, up) = upstream();
    let result = allowance
        .layer()
        .with_retry(RetryConfig::default().with_max_attempts(1).expect("valid"))
        .layer(up)
        .oneshot(Request::new(()))
        .await;
    assert!(matches!(Outcome::of(&result), Outcome::Abandoned(_)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        allowance.snapshot().cooling_for,
        Some(Duration::from_secs(5))
    );

    // The overrides stayed with their layers: a new layer on the allowance inherits again
    // (2 attempts, the second after the 5 s cooldown).
    let (calls, up) = upstream();
    let policy = RetryPolicy::new(allowance.clone())
        .with_config(RetryConfig::default().with_max_attempts(3).expect("valid"));
    assert!(
        format!("{policy:?}").contains("max_attempts: 3"),
        "{policy:?}"
    );
    let _ = allowance.layer().layer(up).oneshot(Request::new(())).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
