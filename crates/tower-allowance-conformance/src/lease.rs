//! Leases (op 13, `Op::Grant`): tokens taken from every limit in one step as that many first
//! attempts in a row would be; the tail given back; a call past its valid-until refused
//! unapplied; holders counted once per window; the successes a holder admitted recorded.

use std::time::Duration;

use tower_allowance::{
    rule::{
        lease_slots, Admission, AdmitRequest, ClosedBy, Grant, GrantRequest, Granted, Op, Reply,
    },
    store::Store,
    ReplenishingBudget, RetryBudgetConfig,
};

use crate::harness::{allowance, per_second, Direct, MS};

async fn grant(direct: &Direct, req: GrantRequest) -> Grant {
    match direct.apply(Op::Grant(req)).await {
        Ok(Reply::Grant(g)) => g,
        other => panic!("grant answered {other:?}"),
    }
}

fn granted(g: Grant) -> Granted {
    match g {
        Grant::Granted(g) => g,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// Burst 5 at 10/s: a lease of 8 is the burst now and three slots 100 ms apart; the next
/// admission is reserved after the lease, as the 9th caller's would be.
pub(crate) async fn a_lease_is_admissions_in_a_row<S: Store>(store: S) {
    let config = per_second(10, 5);
    let params = *config.params().rule();
    let (_, direct) = allowance(config, store);
    let lease = granted(grant(&direct, GrantRequest::new(8)).await);
    assert_eq!(lease.tokens, 8);
    let now = lease.now;
    let waits: Vec<u64> = lease_slots(&lease, &params)
        .iter()
        .map(|(slot, _)| (slot - now) / 1_000)
        .collect();
    assert_eq!(waits, [0, 0, 0, 0, 0, 100, 200, 300]);
    let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
        panic!("the lease spent the bucket: reserved");
    };
    assert_eq!(wait, 400 * MS);
}

/// The unused tail goes back while no later slot follows it; once one does, it does not.
pub(crate) async fn a_lease_s_tail_goes_back<S: Store>(store: S) {
    let (_, direct) = allowance(per_second(10, 5), store);
    let lease = granted(grant(&direct, GrantRequest::new(8)).await);
    let back = granted(grant(&direct, GrantRequest::new(0).back(3, &lease)).await);
    assert!(back.returned, "the tail went back");
    // 5 tokens taken: the next slot is 100 ms away, not 400.
    let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
        panic!("reserved");
    };
    assert_eq!(wait, 100 * MS);
    // Giving the same tail back again changes nothing: a reservation follows it.
    let again = granted(grant(&direct, GrantRequest::new(0).back(3, &lease)).await);
    assert!(!again.returned);
    let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
        panic!("reserved");
    };
    assert_eq!(wait, 200 * MS);
}

/// A call that reaches the store after its valid-until is refused and changes nothing.
pub(crate) async fn a_stale_lease_call_is_refused<S: Store>(store: S) {
    let (_, direct) = allowance(per_second(10, 5), store);
    let first = granted(grant(&direct, GrantRequest::new(1)).await);
    // Valid for 50 ms on the store's clock; delayed 80 ms on the way.
    let valid_until = first.now + 50_000;
    tokio::time::advance(80 * MS).await;
    let stale = grant(&direct, GrantRequest::new(4).valid_until_us(valid_until)).await;
    assert_eq!(stale, Grant::Stale);
    // The bucket holds 4 more (5 less the first): nothing was taken.
    for i in 0..4 {
        let adm = direct.admit(AdmitRequest::first()).await;
        assert_eq!(adm, Admission::Admitted, "#{i}");
    }
    // In time, it is applied.
    let fresh = grant(
        &direct,
        GrantRequest::new(1).valid_until_us(first.now + 1_000_000),
    )
    .await;
    assert!(matches!(fresh, Grant::Granted(g) if g.tokens == 1));
}

/// Holders are counted once per window: two holders, one calling twice, count two.
pub(crate) async fn holders_are_counted_per_window<S: Store>(store: S) {
    let (_, direct) = allowance(per_second(100, 10), store);
    let a = granted(grant(&direct, GrantRequest::new(1)).await);
    assert_eq!(a.holders, 1);
    let b = granted(grant(&direct, GrantRequest::new(1)).await);
    assert_eq!(b.holders, 2);
    let a2 = granted(grant(&direct, GrantRequest::new(1).mark(a.window)).await);
    assert_eq!(a2.holders, 2, "a holder already counted in this window");
    // Next window: the last one's count stands until this one's is higher.
    tokio::time::advance(Duration::from_millis(2_100)).await;
    let a3 = granted(grant(&direct, GrantRequest::new(1).mark(a.window)).await);
    assert_eq!(a3.holders, 2, "{a:?} {a3:?}");
    assert_ne!(a3.window, a.window);
    // Two windows without b: only a is left.
    tokio::time::advance(Duration::from_millis(2_100)).await;
    let a4 = granted(grant(&direct, GrantRequest::new(1).mark(a3.window)).await);
    assert_eq!(a4.holders, 1);
}

/// A debit charges tokens sent during an outage as if admitted now.
pub(crate) async fn a_debit_charges_the_bucket<S: Store>(store: S) {
    let (_, direct) = allowance(per_second(10, 5), store);
    granted(grant(&direct, GrantRequest::new(0).debit(5)).await);
    let Admission::Reserved { wait, .. } = direct.admit(AdmitRequest::first()).await else {
        panic!("the debit emptied the bucket: reserved");
    };
    assert_eq!(wait, 100 * MS);
}

/// Rejoining after an outage charges what the fleet may have sent meanwhile at the fallback's
/// pace, whether or not the other holders' calls have come in: from the holder's last lease
/// on, the schedule moved at the pace (as far ahead of the clock as it stood then), capped
/// at an empty bucket as of now; the tokens asked for are then spaced at the share.
pub(crate) async fn a_rejoin_charges_the_outage_and_spaces_the_tokens<S: Store>(store: S) {
    let config = per_second(10, 5);
    let params = *config.params().rule();
    let (_, direct) = allowance(config, store);
    let last = granted(grant(&direct, GrantRequest::new(2)).await);
    // 200 ms ahead after that lease; three seconds later, still.
    tokio::time::advance(Duration::from_secs(3)).await;
    let req = GrantRequest::new(4).rejoin(&last).spaced(300_000, 0);
    let lease = granted(grant(&direct, req).await);
    assert_eq!(lease.tat[0], lease.now + 200_000, "charged to 200 ms ahead");
    let waits: Vec<u64> = lease_slots(&lease, &params)
        .iter()
        .map(|(slot, _)| (slot - lease.now) / 1_000)
        .collect();
    assert_eq!(waits, [0, 300, 600, 900], "spaced at the share");
    // The lease ran 1 s ahead: charged again, it is capped at an empty bucket.
    tokio::time::advance(Duration::from_millis(1_200)).await;
    let again = granted(grant(&direct, GrantRequest::new(0).rejoin(&lease)).await);
    assert_eq!(again.end_tat[0], again.now + 500_000, "empty as of now");
}

/// Each limit is charged at the pace (the slowest limit's rate): a limit of 10/s is
/// charged three tokens it refilled long ago, a limit of 60/min the same three (3 s of it).
pub(crate) async fn a_rejoin_charges_every_limit_at_the_pace<S: Store>(store: S) {
    let minute = match tower_allowance::Limit::per_minute(60, 60) {
        Ok(l) => l.exact(),
        Err(e) => panic!("valid limit: {e}"),
    };
    let config = match per_second(10, 5).with_limit(minute) {
        Ok(c) => c,
        Err(e) => panic!("valid config: {e}"),
    };
    let (_, direct) = allowance(config, store);
    let last = granted(grant(&direct, GrantRequest::new(2)).await);
    tokio::time::advance(Duration::from_secs(3)).await;
    let after = granted(grant(&direct, GrantRequest::new(0).rejoin(&last)).await);
    // 10/s: the same three tokens, 300 ms of its schedule, long past: still full.
    assert_eq!(after.end_tat[0], last.end_tat[0] + 300_000);
    assert!(after.end_tat[0] < after.now, "the fast limit is full");
    // 60/min: 2 s + 3 s x (1 s / 1 s): three tokens charged.
    assert_eq!(after.end_tat[1], last.end_tat[1] + 3_000_000);
}

/// A grant records the successes it carries for a replenishing retry budget, whatever its
/// tokens' answer (some, none asked, or denied as a first attempt would be), but not when
/// refused as stale: that call applies nothing.
pub(crate) async fn a_grant_records_its_deposits_unless_stale<S: Store>(store: S) {
    // A reserve of 10 retries, one more per five successes.
    let budget = match ReplenishingBudget::new(Duration::from_secs(10), 1, 0.2) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let config =
        per_second(1_000, 1_000).with_retry_budget(RetryBudgetConfig::Replenishing(budget));
    let (_, direct) = allowance(config, store);
    assert_eq!(direct.state().await.retries_remaining, Some(10));
    let lease = granted(grant(&direct, GrantRequest::new(2).deposits(50)).await);
    assert_eq!(lease.tokens, 2);
    assert_eq!(
        direct.state().await.retries_remaining,
        Some(20),
        "50 successes: 10 retries"
    );
    granted(grant(&direct, GrantRequest::new(0).deposits(5)).await);
    assert_eq!(
        direct.state().await.retries_remaining,
        Some(21),
        "none asked: recorded"
    );
    // Valid for 50 ms on the store's clock; delayed 80 ms on the way.
    tokio::time::advance(80 * MS).await;
    let stale = GrantRequest::new(1)
        .deposits(50)
        .valid_until_us(lease.now + 50_000);
    assert_eq!(grant(&direct, stale).await, Grant::Stale);
    assert_eq!(
        direct.state().await.retries_remaining,
        Some(21),
        "stale: nothing recorded"
    );
    let close = Op::Close {
        delay_us: Some(1_000_000),
        by: ClosedBy::Quota,
    };
    assert!(matches!(direct.apply(close).await, Ok(Reply::Changed(_))));
    let denied = grant(&direct, GrantRequest::new(1).deposits(10)).await;
    assert!(
        matches!(denied, Grant::Denied(Admission::Closed { .. })),
        "{denied:?}"
    );
    assert_eq!(
        direct.state().await.retries_remaining,
        Some(23),
        "denied: recorded"
    );
}
