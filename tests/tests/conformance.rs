//! One conformance suite, run against every store: the in-memory store and the Redis store
//! must make the same decisions (the Redis scripts re-implement `tower_allowance`'s pure
//! algorithm in Lua, and this is what keeps the two from drifting apart).
//!
//! Real time, not paused: Redis keeps its own clock. Every wait a store returns is checked to
//! be at most the exact value and at least the exact value minus a small margin for the time
//! that passed between the calls.
//!
//! And one differential property: random sequences of decisions, replayed at exact instants
//! against the memory store (on a paused clock) and the Redis scripts (on a test clock passed
//! instead of `TIME`), must get identical answers, durations included, to the microsecond.

use std::{future::Future, sync::Arc, time::Duration};

use proptest::{
    collection::vec,
    prelude::*,
    test_runner::{Config as ProptestConfig, TestRunner},
};
use tower_allowance::{
    store::{Admit, Decision, MemoryStore, Store},
    AllowanceConfig, ReplenishingBudget, RetryBudgetConfig,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

type DynStore = Arc<dyn Store>;

const MS: Duration = Duration::from_millis(1);

/// Runs every check, each on a fresh store from `make`.
async fn conformance<F, Fut>(make: F, margin: Duration)
where
    F: Fn() -> Fut,
    Fut: Future<Output = DynStore>,
{
    burst_then_wait(&*make().await, margin).await;
    cooldown_blocks_then_metered_restart(&*make().await, margin).await;
    defer_never_shortens(&*make().await, margin).await;
    fixed_budget_is_exact(&*make().await).await;
    exhausted_budget_consumes_no_token(&*make().await).await;
    replenishing_budget_floor_ratio_and_expiry(&*make().await).await;
    unlimited_budget_reads_as_none(&*make().await).await;
}

async fn admit(store: &dyn Store, config: &AllowanceConfig, ask: Admit) -> Decision {
    store.admit(config, ask).await.expect("store answers")
}

fn assert_near(got: Duration, exact: Duration, margin: Duration, what: &str) {
    assert!(
        got <= exact && got + margin >= exact,
        "{what}: {got:?} not within {margin:?} below {exact:?}"
    );
}

/// Burst, then a wait of one interval; waiting that long admits again.
async fn burst_then_wait(store: &dyn Store, margin: Duration) {
    let config = AllowanceConfig::per_second(10, 3).expect("valid"); // 100 ms interval
    let mut next = vec![];
    for _ in 0..3 {
        match admit(store, &config, Admit::first()).await {
            Decision::Admitted { next_in } => next.push(next_in),
            other => panic!("burst of 3 must be admitted, got {other:?}"),
        }
    }
    assert_eq!(next[..2], [Duration::ZERO, Duration::ZERO]);
    assert_near(next[2], 100 * MS, margin, "next_in after the burst");
    let Decision::Wait { wait, cooldown } = admit(store, &config, Admit::first()).await else {
        panic!("burst spent: must wait");
    };
    assert!(!cooldown);
    assert_near(wait, 100 * MS, margin, "wait after the burst");
    tokio::time::sleep(wait).await;
    assert!(matches!(
        admit(store, &config, Admit::first()).await,
        Decision::Admitted { .. }
    ));
    // And right after, the bucket is empty again.
    assert!(matches!(
        admit(store, &config, Admit::first()).await,
        Decision::Wait {
            cooldown: false,
            ..
        }
    ));
}

/// A cooldown refuses everyone until its deadline; afterwards only the burst is admitted.
async fn cooldown_blocks_then_metered_restart(store: &dyn Store, margin: Duration) {
    let config = AllowanceConfig::per_second(10, 2).expect("valid");
    let deferred = store.defer(&config, 300 * MS).await.expect("defer");
    assert!(deferred.extended);
    assert_near(deferred.blocked_for, 300 * MS, margin, "blocked_for");
    let Decision::Wait { wait, cooldown } = admit(store, &config, Admit::first()).await else {
        panic!("cooling down: must wait");
    };
    assert!(cooldown, "the wait is the cooldown");
    assert_near(wait, 300 * MS, margin, "cooldown wait");
    // A retry asks the budget first (unlimited here), then waits for the cooldown as well.
    assert!(matches!(
        admit(store, &config, Admit::retry()).await,
        Decision::Wait { cooldown: true, .. }
    ));
    tokio::time::sleep(wait).await;
    let mut admitted = 0;
    for _ in 0..8 {
        match admit(store, &config, Admit::first()).await {
            Decision::Admitted { .. } => admitted += 1,
            Decision::Wait { cooldown, .. } => assert!(!cooldown, "cooldown is over"),
            Decision::BudgetExhausted => panic!("first attempts never spend budget"),
        }
    }
    assert_eq!(admitted, 2, "the restart is metered: burst of 2");
}

/// Deferring only ever moves the deadline later.
async fn defer_never_shortens(store: &dyn Store, margin: Duration) {
    let config = AllowanceConfig::per_second(10, 2).expect("valid");
    let first = store.defer(&config, 2_000 * MS).await.expect("defer");
    assert!(first.extended);
    let shorter = store.defer(&config, 500 * MS).await.expect("defer");
    assert!(!shorter.extended, "a shorter delay changes nothing");
    assert_near(
        shorter.blocked_for,
        2_000 * MS,
        margin,
        "unchanged deadline",
    );
    let state = store.state(&config).await.expect("state");
    assert_near(state.blocked_for, 2_000 * MS, margin, "state blocked_for");
    let longer = store.defer(&config, 3_000 * MS).await.expect("defer");
    assert!(longer.extended);
    assert_near(longer.blocked_for, 3_000 * MS, margin, "extended deadline");
    assert!(
        !store
            .defer(&config, Duration::ZERO)
            .await
            .expect("defer")
            .extended
    );
}

/// A fixed budget of K admits exactly K retries; first attempts never spend it.
async fn fixed_budget_is_exact(store: &dyn Store) {
    let config = AllowanceConfig::per_second(1_000, 1_000)
        .expect("valid")
        .with_retry_budget(RetryBudgetConfig::fixed(4));
    assert_eq!(
        store.state(&config).await.expect("state").retries_remaining,
        Some(4)
    );
    let mut spent = 0;
    for _ in 0..10 {
        match admit(store, &config, Admit::retry()).await {
            Decision::Admitted { .. } => spent += 1,
            Decision::BudgetExhausted => {}
            Decision::Wait { .. } => panic!("tokens are plentiful"),
        }
    }
    assert_eq!(spent, 4);
    assert!(matches!(
        admit(store, &config, Admit::first()).await,
        Decision::Admitted { .. }
    ));
    assert_eq!(
        store.state(&config).await.expect("state").retries_remaining,
        Some(0)
    );
}

/// A refused retry takes no token: the budget is checked before the bucket.
async fn exhausted_budget_consumes_no_token(store: &dyn Store) {
    let config = AllowanceConfig::per_second(1, 1)
        .expect("valid")
        .with_retry_budget(RetryBudgetConfig::fixed(0));
    assert_eq!(
        admit(store, &config, Admit::retry()).await,
        Decision::BudgetExhausted
    );
    assert!(matches!(
        admit(store, &config, Admit::first()).await,
        Decision::Admitted { .. }
    ));
    // The one token went to the first attempt; a retry is still refused by the budget
    // (checked first), not told to wait.
    assert_eq!(
        admit(store, &config, Admit::retry()).await,
        Decision::BudgetExhausted
    );
    assert!(matches!(
        admit(store, &config, Admit::first()).await,
        Decision::Wait { .. }
    ));
}

/// The floor, the ratio of successes, and expiry after the window.
async fn replenishing_budget_floor_ratio_and_expiry(store: &dyn Store) {
    // 500 ms window (50 ms slots), 20 retries/s floor -> 10; 20% of successes.
    let budget = ReplenishingBudget::new(500 * MS, 20, 0.2).expect("valid");
    let config = AllowanceConfig::per_second(100_000, 1_000)
        .expect("valid")
        .with_retry_budget(RetryBudgetConfig::Replenishing(budget));
    let remaining = |store: &dyn Store| {
        let f = store.state(&config);
        async move { f.await.expect("state").retries_remaining }
    };
    assert_eq!(remaining(store).await, Some(10));
    for _ in 0..50 {
        store.deposit(&config).await.expect("deposit");
    }
    assert_eq!(remaining(store).await, Some(20));
    let mut spent = 0;
    while let Decision::Admitted { .. } = admit(store, &config, Admit::retry()).await {
        spent += 1;
        assert!(spent <= 20, "overdrawn");
    }
    assert_eq!(spent, 20);
    assert_eq!(remaining(store).await, Some(0));
    // Deposits and withdrawals expire with the window: the floor is back.
    tokio::time::sleep(600 * MS).await;
    assert_eq!(remaining(store).await, Some(10));
}

async fn unlimited_budget_reads_as_none(store: &dyn Store) {
    let config = AllowanceConfig::per_second(10, 1).expect("valid");
    let state = store.state(&config).await.expect("state");
    assert_eq!(state.retries_remaining, None);
    assert_eq!(state.blocked_for, Duration::ZERO);
    assert!(matches!(
        admit(store, &config, Admit::retry()).await,
        Decision::Admitted { .. }
    ));
}

#[tokio::test]
async fn memory_store_conforms() {
    conformance(
        || async { Arc::new(MemoryStore::new()) as DynStore },
        20 * MS,
    )
    .await;
}

#[tokio::test]
async fn redis_store_conforms() {
    let Some(redis) = TestRedis::start().await else {
        return;
    };
    let url = redis.url().to_owned();
    conformance(
        || {
            let url = url.clone();
            async move {
                let store = RedisStore::connect(
                    &url,
                    &unique_name("conformance"),
                    RedisStoreOptions::new(),
                )
                .await
                .expect("connect");
                Arc::new(store) as DynStore
            }
        },
        50 * MS,
    )
    .await;
}

#[derive(Clone, Debug)]
enum Op {
    Admit,
    Retry,
    Defer(u64),
    Deposit,
    State,
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Admit),
        3 => Just(Op::Retry),
        1 => (0u64..3_000_000).prop_map(Op::Defer),
        2 => Just(Op::Deposit),
        1 => Just(Op::State),
        4 => (0u64..700_000).prop_map(Op::Advance),
    ]
}

fn any_config() -> impl Strategy<Value = AllowanceConfig> {
    let budget = prop_oneof![
        Just(RetryBudgetConfig::Unlimited),
        (0u64..6).prop_map(RetryBudgetConfig::fixed),
        (10u64..3_000, 0u32..20, 0u32..2_000).prop_map(|(window_ms, floor, per_mille)| {
            let window = Duration::from_millis(window_ms);
            let ratio = f64::from(per_mille) / 1000.0;
            RetryBudgetConfig::Replenishing(
                ReplenishingBudget::new(window, floor, ratio).expect("valid budget"),
            )
        }),
    ];
    (1u32..50, 1u32..6, budget).prop_map(|(rate, burst, budget)| {
        AllowanceConfig::per_second(rate, burst)
            .expect("valid")
            .with_retry_budget(budget)
    })
}

#[test]
fn redis_scripts_decide_exactly_as_the_memory_store() {
    let real = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let paused = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let Some(redis) = real.block_on(TestRedis::start()) else {
        return;
    };
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (any_config(), vec(op(), 1..60));
    let result = runner.run(&strategy, |(config, ops)| {
        let shared = real.block_on(RedisStore::connect(
            redis.url(),
            &unique_name("differential"),
            RedisStoreOptions::new(),
        ));
        let shared = shared.expect("connect");
        shared.set_test_clock(Some(Duration::ZERO));
        let memory = paused.block_on(async { MemoryStore::new() });
        let mut now = Duration::ZERO;
        for (i, op) in ops.iter().enumerate() {
            let (m, r) = match op {
                Op::Advance(us) => {
                    now += Duration::from_micros(*us);
                    paused.block_on(tokio::time::advance(Duration::from_micros(*us)));
                    shared.set_test_clock(Some(now));
                    continue;
                }
                Op::Admit | Op::Retry => {
                    let ask = if matches!(op, Op::Retry) {
                        Admit::retry()
                    } else {
                        Admit::first()
                    };
                    let m = paused.block_on(async { memory.admit(&config, ask).await });
                    let r = real.block_on(shared.admit(&config, ask));
                    (
                        format!("{:?}", m.expect("memory")),
                        format!("{:?}", r.expect("redis")),
                    )
                }
                Op::Defer(us) => {
                    let delay = Duration::from_micros(*us);
                    let m = paused.block_on(async { memory.defer(&config, delay).await });
                    let r = real.block_on(shared.defer(&config, delay));
                    (
                        format!("{:?}", m.expect("memory")),
                        format!("{:?}", r.expect("redis")),
                    )
                }
                Op::Deposit => {
                    let m = paused.block_on(async { memory.deposit(&config).await });
                    let r = real.block_on(shared.deposit(&config));
                    (
                        format!("{:?}", m.expect("memory")),
                        format!("{:?}", r.expect("redis")),
                    )
                }
                Op::State => {
                    let m = paused.block_on(async { memory.state(&config).await });
                    let r = real.block_on(shared.state(&config));
                    (
                        format!("{:?}", m.expect("memory")),
                        format!("{:?}", r.expect("redis")),
                    )
                }
            };
            prop_assert_eq!(m, r, "op {} ({:?}) at {:?}", i, op, now);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("redis and memory stores disagree: {e}");
    }
}
