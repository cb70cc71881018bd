//! A retry is admitted by the admission layer under the `Retry`, like any attempt: each retry
//! spends the shared budget once, and one the budget refuses is not sent, whether or not the
//! policy is told the admission layer is there. The retry layer alone spends no budget: it
//! bounds the attempts by `max_attempts` only.

use std::sync::{Arc, Mutex, PoisonError};

use http::{HeaderValue, Request, Response, StatusCode};
use std::time::Duration;

use tokio::time::Instant;
use tower::{retry::Retry, service_fn, util::BoxCloneService, Layer, ServiceExt};

use tower_allowance::{
    admission::AdmissionLayer,
    error::AbandonReason,
    retry::{RetryConfig, RetryPolicy},
    Allowance, AllowanceConfig, BoxError, Outcome, RetryBudgetConfig,
};

type Svc = BoxCloneService<Request<String>, Response<String>, BoxError>;

#[derive(Clone, Copy, Debug)]
enum Stack {
    /// `Retry` → `Admission` → upstream, on the same allowance.
    Admission,
    /// The same, the policy told of the admission layer (`RetryPolicy::over_admission`).
    AdmissionOver,
    /// `Retry` → upstream: the retry layer alone.
    Alone,
}

/// An upstream that always answers 429 with `Retry-After: 1`, logging when each attempt
/// arrived (ms since `start`).
fn always_429(start: Instant, log: Arc<Mutex<Vec<u64>>>) -> Svc {
    Svc::new(service_fn(move |_req: Request<String>| {
        let log = log.clone();
        async move {
            let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            log.lock().unwrap_or_else(PoisonError::into_inner).push(ms);
            let mut res = Response::new(String::new());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            Ok::<_, BoxError>(res)
        }
    }))
}

/// What eight concurrent requests, 3 attempts each, against [`always_429`] produced.
struct Run {
    /// When each attempt arrived, ms, in order.
    attempts: Vec<u64>,
    outcomes: Vec<Outcome>,
    allowance: Allowance,
}

/// Eight requests, 3 attempts each, through `stack` over one allowance that paces nobody
/// (1,000 per second, and bursts of 10,000: a retry's slot reserved a second ahead leaves
/// the burst for the first attempts) and whose budget is `budget` retries.
async fn eight_requests(stack: Stack, budget: u64) -> Run {
    let allowance = Allowance::new(
        AllowanceConfig::per_second(1_000, 10_000)
            .expect("valid")
            .with_retry_budget(RetryBudgetConfig::fixed(budget)),
    );
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let upstream = always_429(start, log.clone());
    let policy = RetryPolicy::new(allowance.clone()).with_config(
        RetryConfig::default()
            .with_max_attempts(3)
            .expect("valid")
            .with_jitter_seed(1),
    );
    let admission = AdmissionLayer::new(allowance.clone());
    let service = match stack {
        Stack::Admission => Svc::new(Retry::new(policy, admission.layer(upstream))),
        Stack::AdmissionOver => Svc::new(Retry::new(
            policy.over_admission(),
            admission.layer(upstream),
        )),
        Stack::Alone => Svc::new(Retry::new(policy, upstream)),
    };
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(
                async move { Outcome::of(&service.oneshot(Request::new(String::new())).await) },
            )
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("no panic"));
    }
    let attempts = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
    Run {
        attempts,
        outcomes,
        allowance,
    }
}

#[tokio::test(start_paused = true)]
async fn a_shared_budget_bounds_the_retries_under_either_stack() {
    for stack in [Stack::Admission, Stack::AdmissionOver] {
        let run = eight_requests(stack, 4).await;
        // Eight first attempts, then the four retries the budget funds, each after its own
        // Retry-After: the four refused ones were never sent.
        assert_eq!(
            run.attempts,
            [[0; 8].as_slice(), &[1000; 4]].concat(),
            "{stack:?}"
        );
        assert!(
            run.outcomes
                .iter()
                .all(|o| *o == Outcome::Abandoned(AbandonReason::BudgetExhausted)),
            "{stack:?}: {:?}",
            run.outcomes
        );
        let snapshot = run.allowance.snapshot();
        assert_eq!(snapshot.retries_spent, 4, "{stack:?}");
        assert_eq!(
            snapshot.abandoned.get(AbandonReason::BudgetExhausted),
            8,
            "{stack:?}: each refusal counted once"
        );
        let state = run.allowance.store_state().await.expect("memory store");
        assert_eq!(state.retries_remaining, Some(0), "{stack:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn each_retry_spends_the_budget_exactly_once_under_either_stack() {
    for stack in [Stack::Admission, Stack::AdmissionOver] {
        // Budget to spare: every request makes its 3 attempts, 16 retries in all.
        let run = eight_requests(stack, 100).await;
        assert_eq!(
            run.attempts,
            [[0; 8], [1000; 8], [2000; 8]].concat(),
            "{stack:?}"
        );
        assert!(run
            .outcomes
            .iter()
            .all(|o| *o == Outcome::Abandoned(AbandonReason::MaxAttempts)));
        assert_eq!(run.allowance.snapshot().retries_spent, 16, "{stack:?}");
        let state = run.allowance.store_state().await.expect("memory store");
        assert_eq!(state.retries_remaining, Some(100 - 16), "{stack:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_retry_layer_alone_is_bounded_by_max_attempts_only() {
    // A budget of 1: nothing under the `Retry` spends it, so every request makes its three
    // attempts, each after its own Retry-After.
    let run = eight_requests(Stack::Alone, 1).await;
    assert_eq!(run.attempts, [[0; 8], [1000; 8], [2000; 8]].concat());
    assert!(run
        .outcomes
        .iter()
        .all(|o| *o == Outcome::Abandoned(AbandonReason::MaxAttempts)));
    assert_eq!(run.allowance.snapshot().retries_spent, 0);
    let state = run.allowance.store_state().await.expect("memory store");
    assert_eq!(state.retries_remaining, Some(1), "the budget untouched");
}

/// Told of the admission layer under it, the policy leaves the server's wait to admission: the
/// retry's slot is reserved when the retry is decided, ahead of a caller who arrives during
/// the cooldown. Not told, it sleeps the wait first, and the retry queues behind that caller.
#[tokio::test(start_paused = true)]
async fn over_admission_a_retry_keeps_its_place_ahead_of_later_arrivals() {
    for over in [true, false] {
        let allowance = Allowance::new(
            AllowanceConfig::per_second(10, 1)
                .expect("valid")
                .exact()
                .with_retry_budget(RetryBudgetConfig::fixed(10)),
        );
        let start = Instant::now();
        let log = Arc::new(Mutex::new(Vec::new()));
        let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let upstream = Svc::new(service_fn({
            let log = log.clone();
            move |req: Request<String>| {
                let log = log.clone();
                let throttle = first.swap(false, std::sync::atomic::Ordering::SeqCst);
                async move {
                    let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
                    (log.lock().unwrap_or_else(PoisonError::into_inner))
                        .push((ms, req.into_body()));
                    let mut res = Response::new(String::new());
                    if throttle {
                        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                        res.headers_mut()
                            .insert("retry-after", HeaderValue::from_static("1"));
                    }
                    Ok::<_, BoxError>(res)
                }
            }
        }));
        let policy = RetryPolicy::new(allowance.clone())
            .with_config(RetryConfig::default().with_jitter_seed(1));
        let policy = if over {
            policy.over_admission()
        } else {
            policy
        };
        let stack = Svc::new(Retry::new(
            policy,
            tower_allowance::cooldown::CooldownLayer::new(allowance.clone())
                .layer(AdmissionLayer::new(allowance.clone()).layer(upstream)),
        ));
        let retried = tokio::spawn(stack.clone().oneshot(Request::new("retried".into())));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let later = stack.oneshot(Request::new("later".into())).await;
        assert!(Outcome::of(&later).is_completed());
        assert!(Outcome::of(&retried.await.expect("no panic")).is_completed());
        let seen = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let (a, b) = if over {
            ("retried", "later")
        } else {
            ("later", "retried")
        };
        assert_eq!(
            seen,
            [(0, "retried".into()), (1000, a.into()), (1100, b.into())],
            "over_admission: {over}"
        );
    }
}

/// An abandonment is counted where it is marked: a transport error the policy will not retry
/// (here, a retry would pass the deadline) stays the request's answer, `Failed`, and is not
/// counted as abandoned (a layer above that makes it a verdict of its own, gRPC's deadline,
/// counts that one, once).
#[tokio::test(start_paused = true)]
async fn an_error_not_retried_is_not_counted_abandoned() {
    let allowance = Allowance::new(AllowanceConfig::per_second(10, 10).expect("valid"));
    let failing = Svc::new(service_fn(|_req: Request<String>| async {
        Err::<Response<String>, BoxError>("connection reset".into())
    }));
    let policy = RetryPolicy::new(allowance.clone()).with_config(
        RetryConfig::default()
            .with_transport_errors(true)
            .with_jitter_seed(1),
    );
    let stack = Retry::new(
        policy,
        AdmissionLayer::new(allowance.clone()).layer(failing),
    );
    let mut req = Request::new(String::new());
    // Too close for any backoff: the retry would pass it.
    req.extensions_mut()
        .insert(tower_allowance::Deadline::after(Duration::from_micros(1)));
    let result = stack.oneshot(req).await;
    assert_eq!(Outcome::of(&result), Outcome::Failed);
    assert_eq!(
        allowance.snapshot().abandoned.get(AbandonReason::Deadline),
        0
    );
}
