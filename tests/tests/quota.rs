//! The quota-exhausted terminal path, in virtual time against an in-process upstream.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use http::Request;
use integration_tests::throttling;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_allowance::{
    error::{AbandonReason, Exhausted},
    quota::{QuotaProbe, QuotaStatus, QuotaTrigger},
    retry::RetryConfig,
    Allowance, AllowanceConfig, BoxError, Outcome,
};

/// A probe that answers a fixed status after a short (virtual) round trip, counting calls.
#[derive(Debug, Clone)]
struct FixedProbe {
    answer: Result<QuotaStatus, &'static str>,
    calls: Arc<AtomicUsize>,
}

impl QuotaProbe for FixedProbe {
    fn probe(&self) -> Pin<Box<dyn Future<Output = Result<QuotaStatus, BoxError>> + Send>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = self.answer;
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            answer.map_err(BoxError::from)
        })
    }
}

fn allowance_with(probe: FixedProbe) -> Allowance {
    Allowance::builder(AllowanceConfig::per_second(2, 2).expect("valid"))
        .quota_probe(probe, QuotaTrigger::after_consecutive(2).expect("valid"))
        .build()
}

#[tokio::test(start_paused = true)]
async fn exhausted_quota_probes_once_and_abandons_every_job() {
    let calls = Arc::new(AtomicUsize::new(0));
    let probe = FixedProbe {
        answer: Ok(QuotaStatus::Exhausted {
            retry_in: Duration::from_secs(3600),
        }),
        calls: calls.clone(),
    };
    let allowance = allowance_with(probe);
    // Quota spent: every call is 429 without Retry-After.
    let upstream = throttling(None);
    let svc = ServiceBuilder::new()
        .layer(
            allowance
                .layer()
                .with_retry(RetryConfig::default().with_max_attempts(10).expect("valid")),
        )
        .service(upstream.service.clone());
    let start = Instant::now();
    let jobs: Vec<_> = (0..8)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(
                async move { Outcome::of(&svc.oneshot(Request::new(String::new())).await) },
            )
        })
        .collect();
    let mut outcomes = Vec::new();
    for j in jobs {
        outcomes.push(j.await.expect("job"));
    }
    assert!(
        outcomes
            .iter()
            .all(|o| *o == Outcome::Abandoned(AbandonReason::QuotaExhausted)),
        "{outcomes:?}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one probe for the whole allowance"
    );
    let seen_at_verdict = upstream.calls();
    // Nothing polls afterwards: new calls fail at once, without reaching the upstream.
    tokio::time::advance(Duration::from_secs(600)).await;
    let err = svc
        .clone()
        .oneshot(Request::new(String::new()))
        .await
        .expect_err("closed");
    let closed = err.downcast_ref::<Exhausted>().expect("typed");
    assert!(closed.until().is_some_and(|u| u > Instant::now()));
    assert_eq!(
        closed.reason(),
        tower_allowance::error::AbandonReason::QuotaExhausted
    );
    let snapshot = allowance.snapshot();
    assert!(snapshot.closed.is_some(), "visible in the snapshot");
    assert_eq!(upstream.calls(), seen_at_verdict);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(start.elapsed() < Duration::from_secs(3600));
    assert_eq!(allowance.quota_probes(), 1);

    // It reopens when an operator clears it: calls reach the upstream again (and, since the
    // quota is still spent there, the probe closes it again, once).
    allowance.clear().await.expect("clear");
    let result = svc.oneshot(Request::new(String::new())).await;
    assert!(upstream.calls() > seen_at_verdict);
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::QuotaExhausted)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failing_probe_is_not_retried_in_a_loop() {
    let calls = Arc::new(AtomicUsize::new(0));
    let probe = FixedProbe {
        answer: Err("usage endpoint throttled too"),
        calls: calls.clone(),
    };
    let allowance = allowance_with(probe);
    let upstream = throttling(None);
    let svc = ServiceBuilder::new()
        .layer(
            allowance.layer().with_retry(
                RetryConfig::default()
                    .with_max_attempts(20)
                    .expect("valid")
                    .with_backoff(Duration::from_millis(100), Duration::from_millis(200))
                    .expect("valid"),
            ),
        )
        .service(upstream.service.clone());
    let start = Instant::now();
    let jobs: Vec<_> = (0..8)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(
                async move { Outcome::of(&svc.oneshot(Request::new(String::new())).await) },
            )
        })
        .collect();
    for j in jobs {
        // The jobs end by their attempt cap, not by the (unknown) quota.
        assert_eq!(
            j.await.expect("job"),
            Outcome::Abandoned(AbandonReason::MaxAttempts)
        );
    }
    let elapsed = start.elapsed().as_secs_f64();
    let probes = calls.load(Ordering::SeqCst);
    // 160 throttled responses over `elapsed` seconds; probes back off 1 s, 2 s, 4 s, ...
    // so at most log2(elapsed) + 2 of them, never one per response.
    let bound = elapsed.log2().max(0.0) as usize + 2;
    assert!(
        probes >= 1 && probes <= bound,
        "{probes} probes in {elapsed} s"
    );
}
