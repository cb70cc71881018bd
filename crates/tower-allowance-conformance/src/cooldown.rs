//! The shared cooldown: a metered restart, waiting callers moved in order, a deadline that
//! never shortens, a delay beyond `max_cooldown` that closes the allowance, and an adaptive
//! rate's cut re-timing the slots reserved at the old rate.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use http::Request;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_allowance::{
    error::AbandonReason,
    retry::RetryConfig,
    rule::{Admission, AdmitRequest, ClosedBy, Op, Reply},
    store::Store,
    AcquireOptions, AdaptiveRate, Deadline, Outcome,
};

use crate::harness::{acquire_at, allowance, per_second, raise, throttling, LayerService, MS};

pub(crate) async fn cooldown_then_metered_restart<S: Store>(store: S) {
    let (a, direct) = allowance(per_second(10, 2), store);
    let raised = raise(&a, &direct, 300 * MS).await;
    assert!(raised.changed);
    assert_eq!(raised.state.blocked_for, 300 * MS);
    let mut at = vec![];
    for _ in 0..5 {
        match direct.admit(AdmitRequest::first()).await {
            Admission::Reserved { wait, .. } => at.push(wait.as_millis()),
            other => panic!("cooling down: reserved after it, got {other:?}"),
        }
    }
    assert_eq!(at, [300, 300, 400, 500, 600], "the restart is metered");
    let state = a.store_state().await.expect("state");
    assert_eq!(state.blocked_for, 300 * MS);
}

pub(crate) async fn cooldown_moves_waiting_callers<S: Store>(store: S) {
    let (a, _) = allowance(per_second(2, 2), store);
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
    a.extend_cooldown(Duration::from_secs(1))
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
pub(crate) async fn a_cut_re_times_waiting_callers<S: Store>(store: S) {
    // 10/s (initial = ceiling: the slow start is capped from the first second), burst 2.
    let adaptive = AdaptiveRate::new(10.0, 0.5, 10.0).expect("valid");
    let (a, direct) = allowance(per_second(10, 2).with_adaptive_rate(adaptive), store);
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
    let Ok(Reply::Defer(d)) = direct.apply(op).await else {
        panic!("a throttle's reply");
    };
    let Some(event) = d.event else {
        panic!("the re-timing is an event");
    };
    // The cut reaches the callers waiting here as it reaches every process's.
    direct.deliver(event);
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

pub(crate) async fn cooldown_never_shortens<S: Store>(store: S) {
    let (a, direct) = allowance(per_second(2, 2), store);
    assert!(raise(&a, &direct, 5 * 1000 * MS).await.changed);
    tokio::time::advance(100 * MS).await;
    let raised = raise(&a, &direct, Duration::from_secs(1)).await;
    assert!(!raised.changed);
    assert_eq!(raised.state.blocked_for, 4900 * MS);
    tokio::time::advance(900 * MS).await;
    let raised = raise(&a, &direct, Duration::from_secs(8)).await;
    assert!(raised.changed);
    assert_eq!(raised.state.blocked_for, Duration::from_secs(8));
}

pub(crate) async fn absurd_delay_closes_for_max_cooldown<S: Store>(store: S) {
    const ABSURD: &str = "99999999999999999999";
    const MAX: Duration = Duration::from_secs(60);
    let config = per_second(2, 2).with_max_cooldown(MAX).expect("valid");
    let (a, direct) = allowance(config, store);
    let closed_for = |d| Admission::Closed {
        until: Some(d),
        by: ClosedBy::ServerDelay,
    };
    // The burst spent, a caller waits for its slot when a server asks for 400 days (beyond
    // a year: a delay that cannot be trusted, bounded by max_cooldown).
    for _ in 0..2 {
        assert_eq!(
            direct.admit(AdmitRequest::first()).await,
            Admission::Admitted
        );
    }
    let later = Instant::now() + Duration::from_secs(10);
    let waiter = tokio::spawn(a.acquire_owned(AcquireOptions::new().deadline(later)));
    tokio::task::yield_now().await;
    let raised = raise(&a, &direct, Duration::from_secs(400 * 86_400)).await;
    assert!(raised.changed);
    assert_eq!(
        (raised.state.closed, raised.state.closed_by),
        (Some(Some(MAX)), Some(ClosedBy::ServerDelay)),
        "closed for exactly max_cooldown"
    );
    let waited = waiter
        .await
        .expect("joined")
        .map_err(|e| e.abandon_reason());
    assert_eq!(
        waited,
        Err(Some(AbandonReason::CooldownTooLong)),
        "the waiter"
    );
    assert_eq!(direct.admit(AdmitRequest::first()).await, closed_for(MAX));
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
    assert_eq!(direct.admit(AdmitRequest::first()).await, closed_for(MS));
    tokio::time::advance(MS).await;
    for _ in 0..2 {
        assert_eq!(
            direct.admit(AdmitRequest::first()).await,
            Admission::Admitted
        );
    }
    let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
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
    assert_eq!(direct.admit(AdmitRequest::first()).await, closed_for(MAX));
    a.clear().await.expect("clear");
    assert!(matches!(
        direct.admit(AdmitRequest::first()).await,
        Admission::Admitted | Admission::Reserved { .. }
    ));
    // A valid delay beyond max_cooldown (an hour, stated): closed until its end, never
    // shortened to max_cooldown.
    let raised = raise(&a, &direct, Duration::from_secs(3_600)).await;
    assert_eq!(raised.state.closed, Some(Some(Duration::from_secs(3_600))));
}
