//! The retry budget: a fixed budget spent exactly (and given back by `clear`), a
//! replenishing one fed by successes and forgetting them after its window.

use std::time::Duration;

use tower_allowance::{
    rule::{Admission, AdmitRequest},
    store::Store,
    ReplenishingBudget, RetryBudgetConfig,
};

use crate::harness::{allowance, per_second};

pub(crate) async fn fixed_budget_is_exact<S: Store>(store: S) {
    let (a, direct) = allowance(
        per_second(1_000, 1_000).with_retry_budget(RetryBudgetConfig::fixed(4)),
        store,
    );
    let mut spent = 0;
    for _ in 0..10 {
        match direct.admit(AdmitRequest::retry()).await {
            Admission::Admitted => spent += 1,
            Admission::BudgetExhausted => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(spent, 4);
    // The refused retries took no token: 996 of the burst are left.
    let mut left = 0;
    while direct
        .admit(AdmitRequest::first().max_wait(Duration::ZERO))
        .await
        == Admission::Admitted
    {
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
    let retry = direct.admit(AdmitRequest::retry()).await;
    assert!(
        matches!(retry, Admission::Admitted | Admission::Reserved { .. }),
        "a retry from the budget cleared: {retry:?}"
    );
}

pub(crate) async fn replenishing_budget_with_folded_deposits<S: Store>(store: S) {
    let budget = match ReplenishingBudget::new(Duration::from_secs(10), 1, 0.2) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let (a, direct) = allowance(
        per_second(1_000, 1_000).with_retry_budget(RetryBudgetConfig::Replenishing(budget)),
        store,
    );
    assert_eq!(
        a.store_state().await.expect("state").retries_remaining,
        Some(10)
    );
    assert_eq!(
        direct.admit(AdmitRequest::first().deposits(50)).await,
        Admission::Admitted
    );
    assert_eq!(
        a.store_state().await.expect("state").retries_remaining,
        Some(20)
    );
    for _ in 0..20 {
        assert_eq!(
            direct.admit(AdmitRequest::retry()).await,
            Admission::Admitted
        );
    }
    assert_eq!(
        direct.admit(AdmitRequest::retry()).await,
        Admission::BudgetExhausted
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        a.store_state().await.expect("state").retries_remaining,
        Some(10),
        "the window passed: the floor is back"
    );
}
