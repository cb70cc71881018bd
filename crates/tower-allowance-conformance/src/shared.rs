//! What the store shares and says of its state: a quota probe's verdict reaching every
//! holder of the state, and `is_settled` only when the rule says so.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use http::{Request, Response, StatusCode};
use tower::{service_fn, ServiceExt};
use tower_allowance::{
    error::AbandonReason,
    quota::{QuotaProbe, QuotaStatus, QuotaTrigger},
    retry::RetryConfig,
    rule::{Admission, AdmitRequest},
    store::Store,
    AcquireOptions, Allowance, BoxError, RetryBudgetConfig,
};

use crate::harness::{acquire_at, allowance, per_second, throttling, LayerService, MS};

/// A quota probe that finds the quota spent for an hour, counting its calls.
#[derive(Debug)]
struct SpentQuota(Arc<AtomicUsize>);

impl QuotaProbe for SpentQuota {
    fn probe(&self) -> Pin<Box<dyn Future<Output = Result<QuotaStatus, BoxError>> + Send>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            Ok(QuotaStatus::Exhausted {
                retry_in: Duration::from_secs(3_600),
            })
        })
    }
}

/// Two allowances over one state (two processes): one probe for both, and the verdict
/// closes both.
pub(crate) async fn quota_verdict_is_shared<S: Store>(store: S) {
    let store = Arc::new(store);
    let probes = Arc::new(AtomicUsize::new(0));
    let make = |store: Arc<S>| {
        let trigger = QuotaTrigger::after_consecutive(1).expect("valid");
        Allowance::builder(per_second(10, 10))
            .store(store)
            .quota_probe(SpentQuota(probes.clone()), trigger)
            .build()
    };
    let (a, b) = (make(store.clone()), make(store));
    let no_retry = RetryConfig::default().with_max_attempts(1).expect("valid");
    let quota_429 = service_fn(|_req: Request<String>| async {
        let mut res = Response::new(String::new());
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        Ok::<_, Infallible>(res)
    });
    // Throttling without Retry-After, in both: the trigger fires in both.
    for x in [&a, &b] {
        let svc = x
            .layer()
            .with_retry(no_retry.clone())
            .layer_service(quota_429);
        let _ = svc.oneshot(Request::new(String::new())).await;
    }
    // Let the probes (spawned tasks) run.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(10 * MS).await;
    assert_eq!(probes.load(Ordering::SeqCst), 1, "one probe for the group");
    for x in [&a, &b] {
        assert_eq!(
            acquire_at(x, AcquireOptions::new()).await,
            Err(AbandonReason::QuotaExhausted),
            "closed for every holder of the state"
        );
    }
    assert_eq!(b.store_state().await.expect("state").probes, 1);
}

/// A store says its state is settled ([`Store::is_settled`]) only when the rule does: never
/// while a bucket refills, a 429's cooldown runs or a fixed budget is spent from. (A store
/// that cannot tell without I/O says `false` throughout, and passes.)
pub(crate) async fn settled_only_when_the_rule_says<S: Store>(store: S) {
    let (a, direct) = allowance(
        per_second(10, 2).with_retry_budget(RetryBudgetConfig::fixed(1)),
        store,
    );
    assert_eq!(
        direct.admit(AdmitRequest::first()).await,
        Admission::Admitted
    );
    tokio::time::advance(99 * MS).await;
    assert!(!direct.is_settled(), "a token short");
    tokio::time::advance(MS).await;
    let full = direct.is_settled();
    // A 429 asking for 5 s, through the stack.
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = a
        .layer()
        .with_retry(RetryConfig::default().with_max_attempts(1).expect("valid"))
        .layer_service(throttling("5", calls));
    let _ = svc.oneshot(Request::new(String::new())).await;
    tokio::time::advance(Duration::from_secs(5) - MS).await;
    assert!(!direct.is_settled(), "cooling down");
    tokio::time::advance(MS).await;
    let cooled = direct.is_settled();
    assert_eq!(
        full, cooled,
        "a store that can tell says so both times the state is settled"
    );
    assert_eq!(
        direct.admit(AdmitRequest::retry()).await,
        Admission::Admitted,
        "the one retry"
    );
    tokio::time::advance(Duration::from_secs(86_400)).await;
    assert!(!direct.is_settled(), "the fixed budget was spent from");
}
