//! One name, the newest configuration: the store's name is the allowance's; a process joining
//! a name with another configuration takes it over for every process on it (a rolling deploy),
//! downgrades included; a process that pins its configuration is refused instead, naming
//! both in the units configured; the version is asked once per process however many callers
//! decide at once. Real time, a private server.

use std::{error::Error, time::Duration};

use tower_allowance::{
    error::AcquireError,
    rule::{Admission, AdmitRequest, Op, Reply},
    store::{Store, StoreErrorKind},
    Allowance, AllowanceConfig,
};
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

/// How many of `n` admissions in a row this store admits at once (not reserved), deciding
/// with `config` as far as the process knows.
async fn admitted_at_once(store: &RedisStore, config: &AllowanceConfig, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let reply = store
            .apply(
                config.params(),
                Op::Admit(AdmitRequest::first().max_wait(Duration::ZERO)).into(),
            )
            .await;
        match reply.expect("redis").into() {
            Reply::Admit(Admission::Admitted) => admitted += 1,
            Reply::Admit(_) => {}
            other => panic!("{other:?}"),
        }
    }
    admitted
}

#[tokio::test]
async fn the_newest_configuration_decides_for_every_process_on_the_name() {
    let redis = TestRedis::start().await;
    let name = unique_name("rollout");
    // Old processes: 1/s, burst 1. A new one joins at 1000/s, burst 5000; then a downgrade.
    let slow = AllowanceConfig::per_second(1, 1).expect("valid").exact();
    let fast = AllowanceConfig::per_second(1000, 5000)
        .expect("valid")
        .exact();
    let old = store(&redis, &name).await;
    assert_eq!(admitted_at_once(&old, &slow, 1).await, 1);

    let new = store(&redis, &name).await;
    // Joining is never refused; from its first decision on, its configuration decides...
    assert!(admitted_at_once(&new, &fast, 50).await >= 49);
    // ...for the old process too, which still passes its own (1/s) parameters: at 1/s none
    // more would be admitted at once.
    assert!(admitted_at_once(&old, &slow, 50).await >= 49, "adopted");

    // A downgrade (a provider lowered the tier): the lower limit holds from the takeover on,
    // for the process that ran the higher one too.
    let lower = store(&redis, &name).await;
    let _ = admitted_at_once(&lower, &slow, 3).await;
    // At 1/s, burst 1, at most one more token comes in a second; at 1000/s, 100 would.
    let after = admitted_at_once(&new, &fast, 50).await + admitted_at_once(&old, &slow, 50).await;
    assert!(after <= 2, "the downgrade holds: {after} admitted");
    let stored = redis.command(&["HGET", new.key(), "k"]).await;
    assert!(
        stored.contains(";1,1000000,1000000,0,"),
        "the configuration in force is kept in the state hash, field k: {stored}"
    );
}

#[tokio::test]
async fn a_pinned_process_is_refused_naming_both_configurations_in_their_units() {
    let redis = TestRedis::start().await;
    let name = unique_name("pinned");
    let pinned = RedisStore::connect(
        redis.url(),
        &name,
        RedisStoreOptions::new().pin_config(true),
    )
    .await
    .expect("connect");
    let first = Allowance::with_store(per_second(4), pinned);
    first
        .acquire()
        .await
        .expect("the first sets the configuration");

    let same = Allowance::with_store(per_second(4), store(&redis, &name).await);
    same.acquire().await.expect("the same configuration joins");
    first
        .acquire()
        .await
        .expect("the same configuration, newer: no refusal");

    let other = Allowance::with_store(per_second(40), store(&redis, &name).await);
    other
        .acquire()
        .await
        .expect("a newer configuration takes over");
    let err = first.acquire().await.expect_err("pinned to the older one");
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
    assert!(why.contains("4/s, burst 4"), "{why}");
    assert!(why.contains("40/s, burst 4"), "{why}");
    assert!(!why.contains("us,"), "no internal units: {why}");
    other.acquire().await.expect("the newest goes on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_is_asked_once_however_many_callers_decide_at_once() {
    let redis = TestRedis::start_private().await;
    let name = unique_name("herd");
    let allowance = Allowance::with_store(per_second(1000), store(&redis, &name).await);
    redis.command(&["CONFIG", "RESETSTAT"]).await;
    let workers: Vec<_> = (0..32)
        .map(|_| {
            let a = allowance.clone();
            tokio::spawn(async move { a.acquire().await.map(drop) })
        })
        .collect();
    for w in workers {
        w.await.expect("joined").expect("admitted");
    }
    let client = redis::Client::open(redis.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let calls = |cmd: &str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // The script reads TIME once per call too: the check is what is left.
    let checks = calls("time") - calls("fcall") - calls("evalsha");
    assert_eq!(checks, 1, "one check for 32 workers: {stats}");
    // No separate configuration pipeline: the configuration travels with each call.
    assert_eq!(calls("set") + calls("get"), 0, "{stats}");
}
