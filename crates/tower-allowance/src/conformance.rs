//! The conformance suite every [`Store`] must pass (feature `conformance`).
//!
//! It replays the same operations, and the same requests through the real layers, against a
//! store, and checks every answer and every instant exactly. [`MemoryStore`](crate::store::MemoryStore) passes it by
//! construction; the Redis store runs it in CI; a third-party store runs it in its own tests:
//!
//! ```
//! use tower_allowance::{conformance, store::MemoryStore};
//!
//! #[tokio::main(flavor = "current_thread", start_paused = true)]
//! async fn main() {
//!     conformance::run(|| async { MemoryStore::new() }).await;
//! }
//! ```
//!
//! # Requirements
//!
//! - Run it on a current-thread runtime with a **paused** clock (`start_paused = true`):
//!   instants are checked to the microsecond.
//! - The store must decide on tokio's clock (a test mode of a store with its own clock: the
//!   Redis store's `follow_tokio_clock`), answer [`Store::try_apply`] synchronously, and
//!   `make` must return a store with fresh state each time (a new name, say).
//!
//! Each check panics with what differed.

use std::{
    convert::Infallible,
    future::Future,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{service_fn, ServiceExt};

use crate::store::Store;
use crate::{
    error::AbandonReason,
    quota::{QuotaProbe, QuotaStatus, QuotaTrigger},
    retry::RetryConfig,
    rule::AdmitRequest,
    rule::{Admission, ClosedBy, Op, Reply},
    AcquireOptions, Allowance, AllowanceConfig, BoxError, Cost, Deadline, Limit, Outcome,
    ReplenishingBudget, RetryBudgetConfig,
};

const MS: Duration = Duration::from_millis(1);

/// Runs every check, each on a fresh store from `make`.
///
/// # Panics
///
/// When the store decides differently from the rule.
pub async fn run<F, Fut, S>(mut make: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = S>,
    S: Store,
{
    burst_then_reserved_slots(make().await).await;
    burst_one_reserves_on_whole_milliseconds(make().await).await;
    burst_one_callers_go_on_the_grid(make().await).await;
    max_wait_reserves_nothing(make().await).await;
    cooldown_then_metered_restart(make().await).await;
    cooldown_moves_waiting_callers(make().await).await;
    cooldown_never_shortens(make().await).await;
    fixed_budget_is_exact(make().await).await;
    replenishing_budget_with_folded_deposits(make().await).await;
    a_left_slot_goes_back(make().await).await;
    several_limits_and_costs(make().await).await;
    absurd_delay_closes_for_max_cooldown(make().await).await;
    fifo_through_the_admission_layer(make().await).await;
    over_budget_retry_ends_at_once_with_the_429(make().await).await;
    deadline_abandons_at_once(make().await).await;
    quota_verdict_is_shared(make().await).await;
    settled_only_when_the_rule_says(make().await).await;
    headroom_delays_the_burst_s_last(make().await).await;
    headroom_keeps_a_token_of_a_short_interval(make().await).await;
    headroom_at_burst_one_lengthens_the_interval(make().await).await;
    #[cfg(feature = "adaptive")]
    a_cut_re_times_waiting_callers(make().await).await;
}

fn allowance<S: Store>(config: AllowanceConfig, store: S) -> Allowance {
    Allowance::with_store(config, store)
}

/// The checks of the rule's mechanics use the limits as configured (`exact`); the headroom
/// kept by default is checked on its own (`headroom_*`).
fn per_second(rate: u32, burst: u32) -> AllowanceConfig {
    match AllowanceConfig::per_second(rate, burst) {
        Ok(c) => c.exact(),
        Err(e) => panic!("valid config: {e}"),
    }
}

async fn admit(a: &Allowance, req: AdmitRequest) -> Admission {
    match a.shared.apply_async(Op::Admit(req)).await {
        Ok(Reply::Admit(adm)) => adm,
        other => panic!("admit answered {other:?}"),
    }
}

/// The instant an acquire completes, or its error's abandonment reason.
async fn acquire_at(a: &Allowance, options: AcquireOptions) -> Result<Duration, AbandonReason> {
    let start = Instant::now();
    match a.acquire_with(options).await {
        Ok(()) => Ok(start.elapsed()),
        Err(e) => Err(e.abandon_reason().unwrap_or(AbandonReason::Overloaded)),
    }
}

async fn burst_then_reserved_slots<S: Store>(store: S) {
    let a = allowance(per_second(10, 3), store);
    for i in 0..3 {
        assert_eq!(
            admit(&a, AdmitRequest::first()).await,
            Admission::Admitted,
            "burst #{i}"
        );
    }
    for i in 1..=3u64 {
        let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first()).await else {
            panic!("burst spent: reserved");
        };
        assert_eq!(wait, Duration::from_millis(100 * i), "reservation #{i}");
    }
}

/// By default (headroom), burst 4 at 20/s admits 3 at once, the 4th 10 ms later, then one
/// every 50 ms: the whole burst, its last request 10 ms late, the steady rate the configured
/// one.
async fn headroom_delays_the_burst_s_last<S: Store>(store: S) {
    let config = AllowanceConfig::per_second(20, 4).expect("valid");
    let a = allowance(config, store);
    for i in 0..3 {
        let adm = admit(&a, AdmitRequest::first()).await;
        assert_eq!(adm, Admission::Admitted, "first burst #{i} of 3");
    }
    for i in 0..20u32 {
        let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first()).await else {
            panic!("3 of the burst are spent: reserved");
        };
        assert_eq!(wait, 10 * MS + 50 * MS * i, "slot #{i}");
    }
    // Once the bucket is full again, 3 at once again, the 4th 10 ms later.
    tokio::time::advance(Duration::from_secs(3)).await;
    for i in 0..3 {
        let adm = admit(&a, AdmitRequest::first()).await;
        assert_eq!(adm, Admission::Admitted, "refilled burst #{i}");
    }
    let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first()).await else {
        panic!("reserved");
    };
    assert_eq!(wait, 10 * MS);
}

/// Where the interval is 10 ms or less, the headroom keeps one token back: 100/s, burst 5,
/// admits 4 at once, then one every 10 ms.
async fn headroom_keeps_a_token_of_a_short_interval<S: Store>(store: S) {
    let a = allowance(AllowanceConfig::per_second(100, 5).expect("valid"), store);
    for i in 0..4 {
        let adm = admit(&a, AdmitRequest::first()).await;
        assert_eq!(adm, Admission::Admitted, "burst #{i} of 4");
    }
    let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first()).await else {
        panic!("reserved");
    };
    assert_eq!(wait, 10 * MS);
}

/// By default (headroom), burst 1 at 20/s admits one every 75 ms (50% longer than 50 ms).
async fn headroom_at_burst_one_lengthens_the_interval<S: Store>(store: S) {
    let a = allowance(AllowanceConfig::per_second(20, 1).expect("valid"), store);
    assert_eq!(admit(&a, AdmitRequest::first()).await, Admission::Admitted);
    for i in 1..=10u32 {
        let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first()).await else {
            panic!("reserved");
        };
        assert_eq!(wait, 75 * MS * i, "slot #{i}");
    }
}

/// 300/s in bursts of 1, whose interval is no whole millisecond (3,333.3 µs, 3,334 rounded
/// up): reserved slots fall on whole milliseconds and the schedule advances from the rounded
/// slot, so waiting callers are spaced by 4 ms, never closer than the interval: a sender's
/// timer fires on whole milliseconds, and a limiter with less tolerance than that refuses a
/// request sent 3 ms after the one before (`rule::schedule`). The price: 250/s, not 300/s.
async fn burst_one_reserves_on_whole_milliseconds<S: Store>(store: S) {
    let a = allowance(per_second(300, 1), store);
    assert_eq!(admit(&a, AdmitRequest::first()).await, Admission::Admitted);
    for k in 1..300u32 {
        let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first()).await else {
            panic!("reservation #{k}: reserved");
        };
        assert_eq!(wait, 4 * MS * k, "reservation #{k}");
    }
}

/// And through the admission's waits: 64 callers sharing 400 admissions at 300/s, burst 1,
/// finish on the last slot, 399 × 4 ms = 1,596 ms (the rate's minimum is 1,330 ms).
async fn burst_one_callers_go_on_the_grid<S: Store>(store: S) {
    let a = allowance(per_second(300, 1), store);
    let left = Arc::new(AtomicUsize::new(400));
    let start = Instant::now();
    let mut tasks = vec![];
    for _ in 0..64 {
        let (a, left) = (a.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            let mut last = Duration::ZERO;
            while left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                if let Err(e) = a.acquire().await {
                    panic!("acquire: {e}");
                }
                last = start.elapsed();
            }
            last
        }));
    }
    let mut makespan = Duration::ZERO;
    for t in tasks {
        makespan = makespan.max(t.await.unwrap_or_default());
    }
    assert_eq!(makespan, 399 * 4 * MS, "400 admissions at 300/s, burst 1");
}

async fn max_wait_reserves_nothing<S: Store>(store: S) {
    let a = allowance(per_second(10, 1), store);
    assert_eq!(admit(&a, AdmitRequest::first()).await, Admission::Admitted);
    let refused = admit(&a, AdmitRequest::first().max_wait(50 * MS)).await;
    assert_eq!(
        refused,
        Admission::Refused {
            wait: 100 * MS,
            cooldown: false
        }
    );
    // Nothing was spent: the next slot is still 100 ms away.
    let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first()).await else {
        panic!("reserved");
    };
    assert_eq!(wait, 100 * MS);
}

async fn cooldown_then_metered_restart<S: Store>(store: S) {
    let a = allowance(per_second(10, 2), store);
    let d = a.raise_cooldown(300 * MS).await.expect("defer");
    assert!(d.extended);
    assert_eq!(d.blocked_for, 300 * MS);
    let mut at = vec![];
    for _ in 0..5 {
        match admit(&a, AdmitRequest::first()).await {
            Admission::Reserved { wait, .. } => at.push(wait.as_millis()),
            other => panic!("cooling down: reserved after it, got {other:?}"),
        }
    }
    assert_eq!(at, [300, 300, 400, 500, 600], "the restart is metered");
    let state = a.store_state().await.expect("state");
    assert_eq!(state.blocked_for, 300 * MS);
}

async fn cooldown_moves_waiting_callers<S: Store>(store: S) {
    let a = allowance(per_second(2, 2), store);
    let mut waiting = vec![];
    for _ in 0..6 {
        let a = a.clone();
        waiting.push(tokio::spawn(async move {
            acquire_at(&a, AcquireOptions::new()).await
        }));
    }
    tokio::time::sleep(200 * MS).await;
    // A server asks everyone to wait 1 s: the pending slots (500 ms to 2 s) move by the
    // second added, in order and keeping their spacing (see `rule::cooldown_shift`).
    a.raise_cooldown(Duration::from_secs(1))
        .await
        .expect("defer");
    let mut at = vec![];
    for w in waiting {
        at.push(w.await.expect("task").expect("admitted").as_millis());
    }
    assert_eq!(at, [0, 0, 1500, 2000, 2500, 3000]);
}

/// A throttling response cuts an adaptive rate and re-times the callers waiting on slots
/// reserved at the old rate (see `rule::Stretch`): each keeps its place, and the queue goes
/// out at the new rate, whichever process holds the slots.
#[cfg(feature = "adaptive")]
async fn a_cut_re_times_waiting_callers<S: Store>(store: S) {
    // 10/s (initial = ceiling: the slow start is capped from the first second), burst 2.
    let adaptive = crate::AdaptiveRate::new(10.0, 0.5, 10.0).expect("valid");
    let a = allowance(per_second(10, 2).with_adaptive_rate(adaptive), store);
    let mut waiting = vec![];
    for _ in 0..6 {
        let a = a.clone();
        waiting.push(tokio::spawn(async move {
            acquire_at(&a, AcquireOptions::new()).await
        }));
    }
    tokio::time::sleep(150 * MS).await;
    // A 429 without a delay, to a request sent now: cut to 8.5/s. The slots still ahead
    // (200, 300, 400 ms) are 0.5, 1.5 and 2.5 intervals of 10/s after the cut, now of 8.5/s.
    let op = Op::Throttle {
        delay_us: Some(0),
        age_us: 0,
    };
    let Ok(Reply::Defer(d)) = a.shared.apply_async(op).await else {
        panic!("a throttle's reply");
    };
    assert!(d.event.is_some(), "the re-timing is an event");
    a.shared.after_defer(Instant::now(), &d, None);
    let mut at = vec![];
    for w in waiting {
        at.push(w.await.expect("task").expect("admitted").as_micros());
    }
    // 150 + 50 / 0.85, + 150 / 0.85, + 250 / 0.85 ms, on the timer's millisecond.
    assert_eq!(
        at.iter().map(|us| us.div_ceil(1_000)).collect::<Vec<_>>(),
        [0, 0, 100, 209, 327, 445]
    );
    // Cut to 8.5/s at 150 ms, grown by 1% of that a second until the read at 445 ms.
    assert_eq!(a.store_state().await.expect("state").rate_milli, 8_525);
}

async fn cooldown_never_shortens<S: Store>(store: S) {
    let a = allowance(per_second(2, 2), store);
    assert!(
        a.raise_cooldown(5 * 1000 * MS)
            .await
            .expect("defer")
            .extended
    );
    tokio::time::advance(100 * MS).await;
    let d = a
        .raise_cooldown(Duration::from_secs(1))
        .await
        .expect("defer");
    assert!(!d.extended);
    assert_eq!(d.blocked_for, 4900 * MS);
    tokio::time::advance(900 * MS).await;
    let d = a
        .raise_cooldown(Duration::from_secs(8))
        .await
        .expect("defer");
    assert!(d.extended);
    assert_eq!(d.blocked_for, Duration::from_secs(8));
}

async fn fixed_budget_is_exact<S: Store>(store: S) {
    let a = allowance(
        per_second(1_000, 1_000).with_retry_budget(RetryBudgetConfig::fixed(4)),
        store,
    );
    let mut spent = 0;
    for _ in 0..10 {
        match admit(&a, AdmitRequest::retry()).await {
            Admission::Admitted => spent += 1,
            Admission::BudgetExhausted => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(spent, 4);
    // The refused retries took no token: 996 of the burst are left.
    let mut left = 0;
    while admit(&a, AdmitRequest::first().max_wait(Duration::ZERO)).await == Admission::Admitted {
        left += 1;
    }
    assert_eq!(left, 996);
    assert_eq!(
        a.store_state().await.expect("state").retries_remaining,
        Some(0)
    );
    // An operator's `clear()` gives the budget back, as a fresh state has it.
    a.clear().await.expect("clear");
    assert_eq!(
        a.store_state().await.expect("state").retries_remaining,
        Some(4)
    );
    // The bucket is empty (the loop above drained it): a slot, not a refusal.
    let retry = admit(&a, AdmitRequest::retry()).await;
    assert!(
        matches!(retry, Admission::Admitted | Admission::Reserved { .. }),
        "a retry from the budget cleared: {retry:?}"
    );
}

async fn replenishing_budget_with_folded_deposits<S: Store>(store: S) {
    let budget = match ReplenishingBudget::new(Duration::from_secs(10), 1, 0.2) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let a = allowance(
        per_second(1_000, 1_000).with_retry_budget(RetryBudgetConfig::Replenishing(budget)),
        store,
    );
    assert_eq!(
        a.store_state().await.expect("state").retries_remaining,
        Some(10)
    );
    assert_eq!(
        admit(&a, AdmitRequest::first().deposits(50)).await,
        Admission::Admitted
    );
    assert_eq!(
        a.store_state().await.expect("state").retries_remaining,
        Some(20)
    );
    for _ in 0..20 {
        assert_eq!(admit(&a, AdmitRequest::retry()).await, Admission::Admitted);
    }
    assert_eq!(
        admit(&a, AdmitRequest::retry()).await,
        Admission::BudgetExhausted
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        a.store_state().await.expect("state").retries_remaining,
        Some(10),
        "the window passed: the floor is back"
    );
}

async fn a_left_slot_goes_back<S: Store>(store: S) {
    let a = allowance(per_second(10, 1), store);
    assert_eq!(admit(&a, AdmitRequest::first()).await, Admission::Admitted);
    // A caller that gives up before its slot gives it back (it is the latest).
    let early = tokio::time::timeout(50 * MS, a.acquire()).await;
    assert!(early.is_err(), "timed out");
    let at = acquire_at(&a, AcquireOptions::new())
        .await
        .expect("admitted");
    assert_eq!(
        at,
        50 * MS,
        "the next caller got the released slot (at 100 ms)"
    );
}

async fn several_limits_and_costs<S: Store>(store: S) {
    // 60 requests/min (burst 10) and 1,000 tokens/min (burst 1,000).
    let config = AllowanceConfig::per_minute(60, 10)
        .map(AllowanceConfig::exact)
        .and_then(|c| c.with_limit(Limit::per_minute(1_000, 1_000)?.counting_cost()))
        .expect("valid");
    let a = allowance(config, store);
    assert_eq!(
        admit(&a, AdmitRequest::first().cost(600)).await,
        Admission::Admitted
    );
    let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first().cost(500)).await else {
        panic!("reserved until 100 tokens accrue");
    };
    assert_eq!(wait, Duration::from_secs(6));
    let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first().cost(1)).await else {
        panic!("FIFO: behind the heavy one");
    };
    assert_eq!(wait, Duration::from_millis(6_060));
    assert_eq!(
        admit(&a, AdmitRequest::first().cost(1_001)).await,
        Admission::TooCostly
    );
    let res = acquire_at(&a, AcquireOptions::new().cost(5_000)).await;
    assert_eq!(res, Err(AbandonReason::TooCostly));
    // Through the layer, the `Cost` extension charges the request.
    let svc = a.layer().layer_service(ok_service());
    let mut req = Request::new(String::new());
    req.extensions_mut().insert(Cost(2_000));
    let result = svc.oneshot(req).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::TooCostly)
    );
}

async fn absurd_delay_closes_for_max_cooldown<S: Store>(store: S) {
    const ABSURD: &str = "99999999999999999999";
    const MAX: Duration = Duration::from_secs(60);
    let config = per_second(2, 2).with_max_cooldown(MAX).expect("valid");
    let a = allowance(config, store);
    let closed_for = |d| Admission::Closed {
        until: Some(d),
        by: ClosedBy::ServerDelay,
    };
    // The burst spent, a caller waits for its slot when a server asks for an hour.
    for _ in 0..2 {
        assert_eq!(admit(&a, AdmitRequest::first()).await, Admission::Admitted);
    }
    let later = Instant::now() + Duration::from_secs(10);
    let waiter = tokio::spawn(a.acquire_owned(AcquireOptions::new().deadline(later)));
    tokio::task::yield_now().await;
    let d = a
        .raise_cooldown(Duration::from_secs(3_600))
        .await
        .expect("defer");
    assert_eq!(d.closed, Some(Some(MAX)), "closed for exactly max_cooldown");
    let waited = waiter
        .await
        .expect("joined")
        .map_err(|e| e.abandon_reason());
    assert_eq!(
        waited,
        Err(Some(AbandonReason::CooldownTooLong)),
        "the waiter"
    );
    assert_eq!(admit(&a, AdmitRequest::first()).await, closed_for(MAX));
    // Every caller refused by the closure says so, whatever its own deadline or retry.
    for options in [
        AcquireOptions::new(),
        AcquireOptions::new().deadline(Instant::now()),
        AcquireOptions::new().deadline(later),
        AcquireOptions::new().retry(true),
    ] {
        let res = acquire_at(&a, options).await;
        assert_eq!(res, Err(AbandonReason::CooldownTooLong), "{options:?}");
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let retry = RetryConfig::default().with_max_attempts(1).expect("valid");
    let svc = a
        .layer()
        .with_retry(retry)
        .layer_service(throttling(ABSURD, calls.clone()));
    let result = svc.clone().oneshot(Request::new(String::new())).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::CooldownTooLong)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "refused before sending");
    assert!(a.snapshot().closed.is_some(), "visible in the snapshot");
    // It reopens by itself at exactly max_cooldown, metered: the burst, then the rate.
    tokio::time::advance(MAX - MS).await;
    assert_eq!(admit(&a, AdmitRequest::first()).await, closed_for(MS));
    tokio::time::advance(MS).await;
    for _ in 0..2 {
        assert_eq!(admit(&a, AdmitRequest::first()).await, Admission::Admitted);
    }
    let Admission::Reserved { wait, .. } = admit(&a, AdmitRequest::first()).await else {
        panic!("the burst is spent: reserved");
    };
    assert_eq!(wait, 500 * MS);
    // The server says so again (an absurd 429, to a request on its last attempt with a
    // deadline): closed again, for max_cooldown from the response.
    let mut req = Request::new(String::new());
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(10)));
    let result = svc.oneshot(req).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::CooldownTooLong)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(admit(&a, AdmitRequest::first()).await, closed_for(MAX));
    a.clear().await.expect("clear");
    assert!(matches!(
        admit(&a, AdmitRequest::first()).await,
        Admission::Admitted | Admission::Reserved { .. }
    ));
}

fn ok_service() -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send {
    service_fn(|_req: Request<String>| async { Ok(Response::new(String::new())) })
}

/// A service that answers 429 with `Retry-After`, counting calls.
fn throttling(
    retry_after: &'static str,
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send {
    service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut res = Response::new(String::new());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static(retry_after),
            );
            Ok(res)
        }
    })
}

async fn fifo_through_the_admission_layer<S: Store>(store: S) {
    let a = allowance(per_second(100, 1), store);
    let order = Arc::new(Mutex::new(vec![]));
    let mut tasks = vec![];
    for i in 0..20 {
        let svc = crate::admission::AdmissionLayer::new(a.clone()).layer_service(ok_service());
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

async fn over_budget_retry_ends_at_once_with_the_429<S: Store>(store: S) {
    let a = allowance(
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

async fn deadline_abandons_at_once<S: Store>(store: S) {
    let a = allowance(per_second(2, 2), store);
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

#[derive(Debug)]
struct SpentQuota(Arc<AtomicUsize>);

impl QuotaProbe for SpentQuota {
    fn probe(
        &self,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<QuotaStatus, BoxError>> + Send>> {
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
async fn quota_verdict_is_shared<S: Store>(store: S) {
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

/// `ServiceExt::layer`-like helper.
trait LayerService<S> {
    type Service;
    fn layer_service(&self, inner: S) -> Self::Service;
}

impl<L: tower::Layer<S>, S> LayerService<S> for L {
    type Service = L::Service;
    fn layer_service(&self, inner: S) -> Self::Service {
        self.layer(inner)
    }
}

/// A store says its state is settled ([`Store::is_settled`]) only when the rule does: never
/// while a bucket refills, a 429's cooldown runs or a fixed budget is spent from. (A store
/// that cannot tell without I/O says `false` throughout, and passes.)
async fn settled_only_when_the_rule_says<S: Store>(store: S) {
    let a = allowance(
        per_second(10, 2).with_retry_budget(RetryBudgetConfig::fixed(1)),
        store,
    );
    let says = |a: &Allowance| a.is_settled(Instant::now());
    assert_eq!(admit(&a, AdmitRequest::first()).await, Admission::Admitted);
    tokio::time::advance(99 * MS).await;
    assert!(!says(&a), "a token short");
    tokio::time::advance(MS).await;
    let full = says(&a);
    // A 429 asking for 5 s, through the stack.
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = a
        .layer()
        .with_retry(RetryConfig::default().with_max_attempts(1).expect("valid"))
        .layer_service(throttling("5", calls));
    let _ = svc.oneshot(Request::new(String::new())).await;
    tokio::time::advance(Duration::from_secs(5) - MS).await;
    assert!(!says(&a), "cooling down");
    tokio::time::advance(MS).await;
    let cooled = says(&a);
    assert_eq!(
        full, cooled,
        "a store that can tell says so both times the state is settled"
    );
    assert_eq!(
        admit(&a, AdmitRequest::retry()).await,
        Admission::Admitted,
        "the one retry"
    );
    tokio::time::advance(Duration::from_secs(86_400)).await;
    assert!(!says(&a), "the fixed budget was spent from");
}
