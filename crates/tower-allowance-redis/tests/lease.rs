//! Leases on Redis (op 13): a lease call delayed past its valid-until (a frozen server) is
//! refused when it finally runs, taking nothing; a cooldown raised by another process reaches
//! every token of a lease at once. Real time, private `redis-server`s.

use std::time::Duration;

use tokio::time::Instant;
use tower_allowance::{
    lease::{Lease, LeaseStore},
    rule::{Admission, AdmitRequest, Grant, GrantRequest, Op, Reply},
    store::Store,
    AllowanceConfig,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

async fn connect(redis: &TestRedis, name: &str, timeout: Duration) -> RedisStore {
    RedisStore::connect(redis.url(), name, RedisStoreOptions::new().timeout(timeout))
        .await
        .expect("connect")
}

async fn apply(store: &impl Store, config: &AllowanceConfig, op: Op) -> Reply {
    store
        .apply(config.params(), op.into())
        .await
        .expect("redis")
        .into()
}

fn config() -> AllowanceConfig {
    AllowanceConfig::per_second(10, 5).expect("valid").exact()
}

#[tokio::test]
async fn a_lease_call_delayed_past_its_valid_until_takes_nothing() {
    let mut redis = TestRedis::start_private().await;
    let name = unique_name("lease-stale");
    let config = config();
    let store = connect(&redis, &name, Duration::from_secs(30)).await;
    // The store's clock, from a first lease of one token.
    let Reply::Grant(Grant::Granted(first)) =
        apply(&store, &config, Op::Grant(GrantRequest::new(1))).await
    else {
        panic!("a lease");
    };
    // A call valid for 50 ms, held 250 ms by a frozen server (a partition that delays it):
    // it runs when the server wakes, long after its caller would have given up.
    redis.freeze();
    let req = GrantRequest::new(4).valid_until_us(first.now + 50_000);
    let call = {
        let (store, config) = (store.clone(), config.clone());
        tokio::spawn(async move { apply(&store, &config, Op::Grant(req)).await })
    };
    tokio::time::sleep(Duration::from_millis(250)).await;
    redis.thaw();
    assert_eq!(call.await.expect("call"), Reply::Grant(Grant::Stale));
    // Nothing was taken: the 4 tokens the bucket still holds are there (the 250 ms
    // refilled at least 2 of the one taken and more: at least the 4 the stale call asked for).
    for i in 0..4 {
        let Reply::Admit(a) = apply(&store, &config, Op::Admit(AdmitRequest::first())).await else {
            panic!("admit");
        };
        assert_eq!(a, Admission::Admitted, "#{i}");
    }
}

#[tokio::test]
async fn a_cooldown_from_another_process_freezes_every_token_of_a_lease() {
    let redis = TestRedis::start().await;
    let name = unique_name("lease-cool");
    let config = AllowanceConfig::per_second(100, 10).expect("valid").exact();
    let a = LeaseStore::new(
        connect(&redis, &name, Duration::from_secs(2)).await,
        Lease::fixed(30, Duration::from_millis(500)).expect("valid"),
    );
    // `a` listens for events as an allowance over it does.
    let allowance = tower_allowance::Allowance::with_store(config.clone(), a.clone());
    allowance.acquire().await.expect("admitted");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let held = a.tokens_held();
    assert!(held >= 20, "a lease is held: {held}");
    // Another process raises a 2 s cooldown.
    let b = connect(&redis, &name, Duration::from_secs(2)).await;
    let raised = Instant::now();
    apply(
        &b,
        &config,
        Op::Defer {
            delay_us: Some(2_000_000),
        },
    )
    .await;
    // The event reaches `a` (within milliseconds; 5 s allowed under any load) and moves
    // every token of its lease past the cooldown's end at once: none dropped, none early.
    let deadline = raised + Duration::from_secs(5);
    while a
        .next_token_in()
        .is_none_or(|d| d < Duration::from_millis(1_800))
    {
        assert!(
            Instant::now() < deadline,
            "the event never reached the lease"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(a.tokens_held(), held, "every token kept, moved");
    let calls = a.lease_calls();
    for i in 0..10 {
        let Reply::Admit(Admission::Reserved { wait, .. }) = apply(
            &a,
            &config,
            Op::Admit(AdmitRequest::first().max_wait(Duration::from_secs(10))),
        )
        .await
        else {
            panic!("token #{i}: reserved after the cooldown");
        };
        assert!(
            Instant::now() + wait >= raised + Duration::from_millis(1_900),
            "token #{i}"
        );
    }
    assert_eq!(a.lease_calls(), calls, "the moved lease served them");
}

/// The script's rejoin (`lua/grant.lua`, as `rule/grant.rs`): the bucket charged with what
/// the fleet may have sent at the pace since the holder's last lease (at most an empty
/// bucket as of now), then the tokens spaced at the share. Exact: the server's clock, read
/// once per call, decides both.
#[tokio::test]
async fn a_rejoin_charges_the_outage_and_spaces_the_tokens_on_redis() {
    let redis = TestRedis::start_private().await;
    let name = unique_name("lease-rejoin");
    let config = config();
    let store = connect(&redis, &name, Duration::from_secs(30)).await;
    let Reply::Grant(Grant::Granted(last)) =
        apply(&store, &config, Op::Grant(GrantRequest::new(2))).await
    else {
        panic!("a lease");
    };
    // The schedule stood 200 ms ahead after that lease (2 tokens at 10/s): at the pace it
    // still does, whenever the rejoin comes (here 600 ms later, its bucket refilled).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let req = GrantRequest::new(4).rejoin(&last).spaced(300_000, 0);
    let Reply::Grant(Grant::Granted(lease)) = apply(&store, &config, Op::Grant(req)).await else {
        panic!("a lease");
    };
    assert_eq!(lease.tat[0], lease.now + 200_000, "charged to 200 ms ahead");
    let params = *config.params().rule();
    let waits: Vec<u64> = tower_allowance::rule::lease_slots(&lease, &params)
        .iter()
        .map(|(slot, _)| (slot - lease.now) / 1_000)
        .collect();
    // Burst 5 with 2 spent: the first now, then 300 ms apart.
    assert_eq!(waits, [0, 300, 600, 900], "spaced at the share");
    // A long outage: capped at an empty bucket (500 ms ahead), never beyond.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let Reply::Grant(Grant::Granted(again)) = apply(
        &store,
        &config,
        Op::Grant(GrantRequest::new(0).rejoin(&lease)),
    )
    .await
    else {
        panic!("a lease");
    };
    assert_eq!(again.end_tat[0], again.now + 500_000, "empty as of now");
}
