//! The seed article's figures, reproduced through the real layers in virtual time.

use allowance_testkit::scenario::{abandoned, run, seed_table, seed_table_text, Mode, Scenario};
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

/// Rows 4a and 4b run as the seed runs them: the retry layer alone (`tower::retry::Retry`
/// with the library's `RetryPolicy`), no admission and no shared cooldown in front. Only the
/// cap of 3 attempts bounds them here.
#[tokio::test(start_paused = true)]
async fn scenario_4_per_request_cap_without_budget() {
    let r = run(&Scenario::always_429(None)).await.expect("runs");
    assert_eq!((r.attempts, r.abandoned_total(), r.completed), (24, 8, 0));
    assert_eq!(abandoned(&r, AbandonReason::MaxAttempts), 8);
    // Every worker honours Retry-After: 1 on its own, and they all retry together.
    assert_eq!(
        r.attempt_times_ms(),
        [[0; 8], [1000; 8], [2000; 8]].concat()
    );
    assert_eq!(r.last_attempt_ms, 2000);
}

/// A shared budget of 4 bounds the whole group with the retry layer alone: the policy spends
/// it when it decides to retry, and a retry it refuses is not sent.
#[tokio::test(start_paused = true)]
async fn scenario_4_shared_budget_bounds_the_group() {
    let r = run(&Scenario::always_429(Some(4))).await.expect("runs");
    assert_eq!((r.attempts, r.abandoned_total(), r.completed), (12, 8, 0));
    // The budget goes in the order the 429s arrive: four workers retry once, then meet the
    // empty budget; the other four meet it at once.
    assert_eq!(abandoned(&r, AbandonReason::BudgetExhausted), 8);
    assert_eq!(
        r.attempt_times_ms(),
        [[0; 8].as_slice(), &[1000; 4]].concat()
    );
    assert_eq!(r.last_attempt_ms, 1000);
}

/// The same failure through one shared allowance (admission, cooldown, budget): the budget
/// bounds it the same, and every retry waits for its slot behind the cooldown.
#[tokio::test(start_paused = true)]
async fn scenario_4_budget_holds_through_shared_admission() {
    let s = Scenario {
        mode: Mode::Shared,
        ..Scenario::always_429(Some(4))
    };
    let r = run(&s).await.expect("runs");
    assert_eq!((r.attempts, r.abandoned_total(), r.completed), (12, 8, 0));
    assert!(r.last_attempt_ms > 1000, "{}", r.last_attempt_ms);
}

#[tokio::test(start_paused = true)]
async fn scenario_4_budget_holds_for_split_too() {
    // Two allowances with a budget of 2 each: still 8 + 4 attempts in total.
    let s = Scenario {
        mode: Mode::Split(2),
        ..Scenario::always_429(Some(2))
    };
    let r = run(&s).await.expect("runs");
    assert_eq!((r.attempts, r.abandoned_total()), (12, 8));
}

/// One table everywhere: the README shows exactly the seed table the code prints (the
/// `eight_workers` example and `allowance-sim seed` print it with `seed_table_text` too).
#[test]
fn the_readme_shows_the_seed_table_the_code_prints() {
    let readme = include_str!("../../README.md");
    let printed = seed_table_text(&seed_table());
    assert!(
        readme.contains(&format!("```text\n{printed}```\n")),
        "README.md's seed table is not what the code prints; replace it with:\n{printed}"
    );
}
