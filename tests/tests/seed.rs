//! The seed article's figures, reproduced through the real layers in virtual time.

use allowance_sim::scenario::{abandoned, run, Mode, Scenario};
use tower_allowance::error::AbandonReason;

#[tokio::test(start_paused = true)]
async fn scenario_1_each_worker_retries_alone() {
    let r = run(&Scenario::seed(Mode::Naive)).await.expect("runs");
    assert_eq!((r.attempts, r.rejected, r.completed), (20, 12, 8));
    assert_eq!(r.last_attempt_ms, 3000);
}

#[tokio::test(start_paused = true)]
async fn scenario_2_one_shared_allowance() {
    let r = run(&Scenario::seed(Mode::Shared)).await.expect("runs");
    assert_eq!((r.attempts, r.rejected, r.completed), (8, 0, 8));
    assert_eq!(
        r.attempt_times_ms(),
        [0, 0, 500, 1000, 1500, 2000, 2500, 3000]
    );
}

/// The seed's JS model (a polling gate) counts 14 attempts and 6 rejections here; the
/// library reserves slots instead of polling, and after each cooldown the two allowances'
/// waiting callers restart one retry less eagerly: 13 and 5. The point stands: two
/// allowances on one key keep exceeding the key's limit.
#[tokio::test(start_paused = true)]
async fn scenario_3_two_independent_allowances() {
    let r = run(&Scenario::seed(Mode::Split(2))).await.expect("runs");
    assert_eq!((r.attempts, r.rejected, r.completed), (13, 5, 8));
}

#[tokio::test(start_paused = true)]
async fn scenario_4_per_request_cap_without_budget() {
    let r = run(&Scenario::always_429(None)).await.expect("runs");
    assert_eq!((r.attempts, r.abandoned_total(), r.completed), (24, 8, 0));
    assert_eq!(abandoned(&r, AbandonReason::MaxAttempts), 8);
}

#[tokio::test(start_paused = true)]
async fn scenario_4_shared_budget_bounds_the_group() {
    let r = run(&Scenario::always_429(Some(4))).await.expect("runs");
    assert_eq!((r.attempts, r.abandoned_total(), r.completed), (12, 8, 0));
    // The budget is spent when a retry reserves its slot, in the order the 429s arrive: one
    // early worker's second retry is funded before a late worker's first, and that worker
    // then stops at its cap of 3 attempts.
    assert_eq!(abandoned(&r, AbandonReason::BudgetExhausted), 7);
    assert_eq!(abandoned(&r, AbandonReason::MaxAttempts), 1);
}

#[tokio::test(start_paused = true)]
async fn scenario_4_budget_holds_for_naive_split_too() {
    // Two allowances with a budget of 2 each: still 8 + 4 attempts in total.
    let s = Scenario {
        mode: Mode::Split(2),
        ..Scenario::always_429(Some(2))
    };
    let r = run(&s).await.expect("runs");
    assert_eq!((r.attempts, r.abandoned_total()), (12, 8));
}
