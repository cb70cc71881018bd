//! Requests through the real layers: admission in arrival order, a retry over budget ending
//! at once with the 429 it got, a deadline the server's wait would pass abandoning at once.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_allowance::{
    admission::AdmissionLayer, error::AbandonReason, store::Store, Deadline, Outcome,
    RetryBudgetConfig,
};

use crate::harness::{allowance, ok_service, per_second, throttling, LayerService};

pub(crate) async fn fifo_through_the_admission_layer<S: Store>(store: S) {
    let (a, _) = allowance(per_second(100, 1), store);
    let order = Arc::new(Mutex::new(vec![]));
    let mut tasks = vec![];
    for i in 0..20 {
        let svc = AdmissionLayer::new(a.clone()).layer_service(ok_service());
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let _ = svc.oneshot(Request::new(String::new())).await;
            order.lock().map(|mut o| o.push(i)).ok();
        }));
        // Arrivals in a known order.
        tokio::task::yield_now().await;
    }
    for t in tasks {
        t.await.expect("task");
    }
    let order = order.lock().map(|o| o.clone()).unwrap_or_default();
    assert_eq!(
        order,
        (0..20).collect::<Vec<_>>(),
        "admitted in arrival order"
    );
}

pub(crate) async fn over_budget_retry_ends_at_once_with_the_429<S: Store>(store: S) {
    let (a, _) = allowance(
        per_second(2, 2).with_retry_budget(RetryBudgetConfig::fixed(0)),
        store,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = a.layer().layer_service(throttling("1", calls.clone()));
    let start = Instant::now();
    let result = svc.oneshot(Request::new(String::new())).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::BudgetExhausted)
    );
    assert_eq!(
        result.as_ref().map(Response::status).ok(),
        Some(StatusCode::TOO_MANY_REQUESTS),
        "it ends with the 429 it got"
    );
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "at once, not after Retry-After"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

pub(crate) async fn deadline_abandons_at_once<S: Store>(store: S) {
    let (a, _) = allowance(per_second(2, 2), store);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = a.layer().layer_service(throttling("30", calls.clone()));
    let mut req = Request::new(String::new());
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(10)));
    let start = Instant::now();
    let result = svc.oneshot(req).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::Deadline)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
