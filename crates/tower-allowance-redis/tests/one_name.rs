//! One name, one configuration: the store's name is the allowance's; a process joining a
//! name with another configuration is refused, naming both, while the first goes on; an
//! operator's `clear()` lets the next process set a new one. Real time, a private server.

use std::error::Error;

use tower_allowance::{error::AcquireError, store::StoreErrorKind, Allowance, AllowanceConfig};
use tower_allowance_redis::{
    error::{CallError, CallErrorKind},
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

async fn store(redis: &TestRedis, name: &str) -> RedisStore {
    RedisStore::connect(redis.url(), name, RedisStoreOptions::new())
        .await
        .expect("connect")
}

fn per_second(rate: u32) -> AllowanceConfig {
    AllowanceConfig::per_second(rate, 4).expect("valid")
}

#[tokio::test]
async fn the_allowance_takes_the_stores_name() {
    let redis = TestRedis::start().await;
    let name = unique_name("odds-api");
    let allowance = Allowance::with_store(per_second(4), store(&redis, &name).await);
    assert_eq!(allowance.name(), name);
    let named = Allowance::builder(per_second(4))
        .name("mine")
        .store(store(&redis, &name).await)
        .build();
    assert_eq!(named.name(), "mine", "the builder's name wins");
}

#[tokio::test]
async fn a_process_joining_with_another_configuration_is_refused_naming_both() {
    let redis = TestRedis::start().await;
    let name = unique_name("one-config");
    let first = Allowance::with_store(per_second(4), store(&redis, &name).await);
    first
        .acquire()
        .await
        .expect("the first sets the configuration");

    let same = Allowance::with_store(per_second(4), store(&redis, &name).await);
    same.acquire().await.expect("the same configuration joins");

    let other = Allowance::with_store(per_second(40), store(&redis, &name).await);
    let err = other.acquire().await.expect_err("another configuration");
    let AcquireError::Store(unavailable) = &err else {
        panic!("{err:?}");
    };
    let store_error = unavailable.store_error();
    assert_eq!(
        store_error.kind(),
        StoreErrorKind::Rejected,
        "{store_error:?}"
    );
    let call = store_error
        .source()
        .and_then(|s| s.downcast_ref::<CallError>())
        .expect("a CallError");
    assert_eq!(call.kind(), CallErrorKind::ConfigMismatch);
    let why = call.source().map(ToString::to_string).unwrap_or_default();
    // 4/s is an interval of 250,000 us; 40/s of 25,000 us.
    assert!(why.contains("every 25000us"), "{why}");
    assert!(why.contains("every 250000us"), "{why}");
    first.acquire().await.expect("the first goes on");

    // An operator clears it: the next process to decide sets its configuration.
    other.clear().await.expect("clear");
    other.acquire().await.expect("the new configuration");
}
