//! The token buckets: bursts, reserved slots (on whole milliseconds), waits that reserve
//! nothing, slots given back, the headroom kept by default, several limits and costs.

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
    error::AbandonReason, rule::Admission, rule::AdmitRequest, store::Store, AcquireOptions,
    AllowanceConfig, Cost, Limit, Outcome,
};

use crate::harness::{acquire_at, allowance, ok_service, per_second, LayerService, MS};

pub(crate) async fn burst_then_reserved_slots<S: Store>(store: S) {
    let (_, direct) = allowance(per_second(10, 3), store);
    for i in 0..3 {
        assert_eq!(
            direct.admit(AdmitRequest::first()).await,
            Admission::Admitted,
            "burst #{i}"
        );
    }
    for i in 1..=3u64 {
        let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
            panic!("burst spent: reserved");
        };
        assert_eq!(wait, Duration::from_millis(100 * i), "reservation #{i}");
    }
}

/// By default (headroom), burst 4 at 20/s admits 3 at once, the 4th 10 ms later, then one
/// every 50 ms: the whole burst, its last request 10 ms late, the steady rate the configured
/// one.
pub(crate) async fn headroom_delays_the_burst_s_last<S: Store>(store: S) {
    let config = AllowanceConfig::per_second(20, 4).expect("valid");
    let (_, direct) = allowance(config, store);
    for i in 0..3 {
        let adm = direct.admit(AdmitRequest::first()).await;
        assert_eq!(adm, Admission::Admitted, "first burst #{i} of 3");
    }
    for i in 0..20u32 {
        let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
            panic!("3 of the burst are spent: reserved");
        };
        assert_eq!(wait, 10 * MS + 50 * MS * i, "slot #{i}");
    }
    // Once the bucket is full again, 3 at once again, the 4th 10 ms later.
    tokio::time::advance(Duration::from_secs(3)).await;
    for i in 0..3 {
        let adm = direct.admit(AdmitRequest::first()).await;
        assert_eq!(adm, Admission::Admitted, "refilled burst #{i}");
    }
    let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
        panic!("reserved");
    };
    assert_eq!(wait, 10 * MS);
}

/// Where the burst is shorter than 20 ms, the headroom is half of it, once: 1,000/s, burst 10
/// (5 ms of headroom), admits 5 at once, the 6th 1 ms later, then one every millisecond (the
/// configured rate: the tolerance stays whole, so the slot grid costs nothing).
pub(crate) async fn headroom_at_a_short_interval_is_half_the_burst<S: Store>(store: S) {
    let (_, direct) = allowance(
        AllowanceConfig::per_second(1_000, 10).expect("valid"),
        store,
    );
    for i in 0..5 {
        let adm = direct.admit(AdmitRequest::first()).await;
        assert_eq!(adm, Admission::Admitted, "burst #{i} of 5");
    }
    for i in 0..20u32 {
        let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
            panic!("reserved");
        };
        assert_eq!(wait, MS + MS * i, "slot #{i}");
    }
}

/// By default (headroom), burst 1 at 20/s admits one every 51 ms: a 50th of the interval
/// between two sends (every admission at burst 1 finds its bucket full).
pub(crate) async fn headroom_at_burst_one_is_a_50th_of_the_interval<S: Store>(store: S) {
    let (_, direct) = allowance(AllowanceConfig::per_second(20, 1).expect("valid"), store);
    assert_eq!(
        direct.admit(AdmitRequest::first()).await,
        Admission::Admitted
    );
    for i in 1..=10u32 {
        let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
            panic!("reserved");
        };
        assert_eq!(wait, 51 * MS * i, "slot #{i}");
    }
}

/// 300/s in bursts of 1, whose interval is no whole millisecond (3,333.3 µs, 3,334 rounded
/// up): reserved slots fall on whole milliseconds and the schedule advances from the rounded
/// slot, so waiting callers are spaced by 4 ms, never closer than the interval: a sender's
/// timer fires on whole milliseconds, and a limiter with less tolerance than that refuses a
/// request sent 3 ms after the one before (`rule::schedule`). The price: 250/s, not 300/s.
pub(crate) async fn burst_one_reserves_on_whole_milliseconds<S: Store>(store: S) {
    let (_, direct) = allowance(per_second(300, 1), store);
    assert_eq!(
        direct.admit(AdmitRequest::first()).await,
        Admission::Admitted
    );
    for k in 1..300u32 {
        let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
            panic!("reservation #{k}: reserved");
        };
        assert_eq!(wait, 4 * MS * k, "reservation #{k}");
    }
}

/// And through the admission's waits: 64 callers sharing 400 admissions at 300/s, burst 1,
/// finish on the last slot, 399 × 4 ms = 1,596 ms (the rate's minimum is 1,330 ms).
pub(crate) async fn burst_one_callers_go_on_the_grid<S: Store>(store: S) {
    let (a, _) = allowance(per_second(300, 1), store);
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

pub(crate) async fn max_wait_reserves_nothing<S: Store>(store: S) {
    let (_, direct) = allowance(per_second(10, 1), store);
    assert_eq!(
        direct.admit(AdmitRequest::first()).await,
        Admission::Admitted
    );
    let refused = direct.admit(AdmitRequest::first().max_wait(50 * MS)).await;
    assert_eq!(
        refused,
        Admission::Refused {
            wait: 100 * MS,
            cooldown: None
        }
    );
    // Nothing was spent: the next slot is still 100 ms away.
    let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
        panic!("reserved");
    };
    assert_eq!(wait, 100 * MS);
}

pub(crate) async fn a_left_slot_goes_back<S: Store>(store: S) {
    let (a, direct) = allowance(per_second(10, 1), store);
    assert_eq!(
        direct.admit(AdmitRequest::first()).await,
        Admission::Admitted
    );
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

pub(crate) async fn several_limits_and_costs<S: Store>(store: S) {
    // 60 requests/min (burst 10) and 1,000 tokens/min (burst 1,000).
    let config = AllowanceConfig::per_minute(60, 10)
        .map(AllowanceConfig::exact)
        .and_then(|c| c.with_limit(Limit::per_minute(1_000, 1_000)?.counting_cost()))
        .expect("valid");
    let (a, direct) = allowance(config, store);
    assert_eq!(
        direct.admit(AdmitRequest::first().cost(600)).await,
        Admission::Admitted
    );
    let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first().cost(500)).await
    else {
        panic!("reserved until 100 tokens accrue");
    };
    assert_eq!(wait, Duration::from_secs(6));
    let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first().cost(1)).await else {
        panic!("FIFO: behind the heavy one");
    };
    assert_eq!(wait, Duration::from_millis(6_060));
    assert_eq!(
        direct.admit(AdmitRequest::first().cost(1_001)).await,
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
