//! Connections: a store over a `ConnectionManager` the application brought (and keeps using),
//! and a hundred allowances over one connection: the server sees one connection for the
//! commands and one subscribed to all hundred channels, whatever the number of allowances.

mod support;

use redis::aio::ConnectionManager;
use tower_allowance::{Allowance, AllowanceConfig};
use tower_allowance_redis::{
    error::CallErrorKind,
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

const ALLOWANCES: usize = 100;

/// The server's clients other than the inspecting one: `(subscriptions, last command)`.
async fn clients(inspector: &redis::Client) -> Vec<(usize, String)> {
    let mut conn = inspector
        .get_multiplexed_async_connection()
        .await
        .expect("inspection connection");
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut conn)
        .await
        .expect("CLIENT ID");
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("CLIENT LIST");
    let field = |line: &str, name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name).map(str::to_owned))
            .unwrap_or_default()
    };
    list.lines()
        .filter(|l| field(l, "id=") != me.to_string())
        .map(|l| (field(l, "sub=").parse().unwrap_or(0), field(l, "cmd=")))
        .collect()
}

/// A hundred allowances from `first`, each admitted once; then the server must see exactly
/// two connections: the commands' and the events'.
async fn hundred_allowances_over(first: RedisStore, inspector: &redis::Client) {
    let config = AllowanceConfig::per_second(5, 1).expect("valid");
    let mut allowances = vec![Allowance::with_store(config.clone(), first.clone())];
    for _ in 1..ALLOWANCES {
        let store = first.for_allowance(&unique_name("many")).expect("valid");
        allowances.push(Allowance::with_store(config.clone(), store));
    }
    for allowance in &allowances {
        allowance.acquire().await.expect("admitted");
    }
    assert_eq!(
        first.round_trips(),
        1 + ALLOWANCES as u64,
        "one preload for all, then one call per admission"
    );
    support::eventually("every allowance's channel subscribed", || async {
        clients(inspector)
            .await
            .iter()
            .any(|(sub, _)| *sub == ALLOWANCES)
    })
    .await;
    let mut seen = clients(inspector).await;
    seen.sort();
    eprintln!("connections at the server besides ours: {seen:?}");
    assert_eq!(
        seen.len(),
        2,
        "one command connection and one subscription for {ALLOWANCES} allowances: {seen:?}"
    );
    assert_eq!(seen[0], (0, "fcall".to_owned()), "the command connection");
    assert_eq!(seen[1].0, ALLOWANCES, "the subscription");
}

#[tokio::test]
async fn a_hundred_allowances_share_one_connection() {
    let redis = TestRedis::start_private().await;
    let first = RedisStore::connect(redis.url(), &unique_name("many"), RedisStoreOptions::new())
        .await
        .expect("connect");
    let inspector = redis::Client::open(redis.url()).expect("client");
    hundred_allowances_over(first, &inspector).await;
}

#[tokio::test]
async fn a_hundred_allowances_over_the_applications_connection() {
    let redis = TestRedis::start_private().await;
    let client = redis::Client::open(redis.url()).expect("client");
    let mut conn = ConnectionManager::new(client.clone())
        .await
        .expect("the application's connection");
    let first = RedisStore::from_connection(
        conn.clone(),
        Some(client.clone()),
        &unique_name("many"),
        RedisStoreOptions::new(),
    )
    .await
    .expect("store");
    assert!(!first.is_cluster());
    assert!(
        format!("{first:?}").contains(&redis.url()[..redis.url().len() - 1]),
        "{first:?}"
    );
    hundred_allowances_over(first, &client).await;
    // The application's own commands share it.
    redis::cmd("SET")
        .arg("app:key")
        .arg("v")
        .exec_async(&mut conn)
        .await
        .expect("SET");
    let got: String = redis::cmd("GET")
        .arg("app:key")
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(got, "v");
}

#[tokio::test]
async fn events_reach_a_holder_over_the_applications_connection() {
    let redis = TestRedis::start().await;
    let name = unique_name("byo-events");
    let client = redis::Client::open(redis.url()).expect("client");
    let conn = ConnectionManager::new(client.clone())
        .await
        .expect("connection");
    let b =
        RedisStore::from_connection(conn, Some(client.clone()), &name, RedisStoreOptions::new())
            .await
            .expect("B over the application's connection");
    let a = RedisStore::connect(redis.url(), &name, RedisStoreOptions::new())
        .await
        .expect("A");
    support::a_cooldown_moves_a_slot_held_elsewhere(a, b, &client).await;
}

#[tokio::test]
async fn without_an_events_client_the_store_still_decides() {
    let redis = TestRedis::start().await;
    let client = redis::Client::open(redis.url()).expect("client");
    let conn = ConnectionManager::new(client).await.expect("connection");
    let store = RedisStore::from_connection(
        conn,
        None,
        &unique_name("no-events"),
        RedisStoreOptions::new(),
    )
    .await
    .expect("store");
    let allowance = Allowance::with_store(
        AllowanceConfig::per_second(10, 1).expect("valid"),
        store.clone(),
    );
    allowance.acquire().await.expect("admitted");
    allowance.acquire().await.expect("admitted");
    assert_eq!(allowance.snapshot().waited, 1);
    assert!(format!("{store:?}").contains("brought by the caller"));
    // No client to open the test clock's blocking connection with: a clear refusal.
    let err = store.follow_tokio_clock().expect_err("no events client");
    assert_eq!(err.kind(), CallErrorKind::Refused);
}
