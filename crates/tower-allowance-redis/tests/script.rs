//! The script the tests run is the script that ships: the files in `src/`, read here at test
//! time and assembled in the order `scripts.rs` documents, hash to the SHA the store calls,
//! and that is the one script a server holds after the store has decided both on `TIME`
//! (production: the clock argument is "none") and on tokio's clock (`follow_tokio_clock`).

use redis::{aio::MultiplexedConnection, Script};
use tower_allowance::{
    rule::{
        ADDITIVE_INCREASE_PERIOD_US, BUDGET_SLOTS, CUT_PER_MILLE, EVENT_WORDS, FAST_CUT_PER_MILLE,
        FAST_CUT_WINDOW_US, MAX_DELAY_US, MAX_LIMITS, PENDING_GRACE_US, ROUND_GRACE_US,
        SLOT_GRANULARITY_US, SLOW_START_DOUBLING_US,
    },
    Allowance, AllowanceConfig,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

/// The files of the script, in the documented order (after the generated constants).
const FILES: [&str; 9] = [
    "src/lua/now.lua",
    "src/lua/state.lua",
    "src/lua/budget.lua",
    "src/lua/clock.lua",
    "src/lua/adaptive.lua",
    "src/lua/cooldown.lua",
    "src/lua/gcra.lua",
    "src/lua/probe.lua",
    "src/apply.lua",
];

/// The generated constants, as `scripts.rs` documents them.
fn constants() -> String {
    format!(
        "local MAX_LIMITS = {MAX_LIMITS}\nlocal BUDGET_SLOTS = {BUDGET_SLOTS}\n\
         local MAX_DELAY_US = {MAX_DELAY_US}\nlocal PENDING_GRACE_US = {PENDING_GRACE_US}\n\
         local EVENT_WORDS = {EVENT_WORDS}\nlocal SLOT_GRANULARITY_US = {SLOT_GRANULARITY_US}\n\
         local SLOW_START_DOUBLING_US = {SLOW_START_DOUBLING_US}\n\
         local ADDITIVE_INCREASE_PERIOD_US = {ADDITIVE_INCREASE_PERIOD_US}\n\
         local CUT_PER_MILLE = {CUT_PER_MILLE}\nlocal FAST_CUT_PER_MILLE = {FAST_CUT_PER_MILLE}\n\
         local FAST_CUT_WINDOW_US = {FAST_CUT_WINDOW_US}\nlocal FOREVER = -1\n\
         local ROUND_GRACE_US = {ROUND_GRACE_US}\n"
    )
}

/// The shipped source, from the files on disk now (not as compiled in).
fn shipped_source() -> String {
    let mut source = constants();
    for file in FILES {
        let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        source.push_str(&text);
    }
    source
}

/// `SCRIPT EXISTS sha`.
async fn exists(conn: &mut MultiplexedConnection, sha: &str) -> bool {
    let found: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(sha)
        .query_async(conn)
        .await
        .expect("SCRIPT EXISTS");
    found == [true]
}

async fn flush(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(conn)
        .await
        .expect("SCRIPT FLUSH");
}

/// The last clock reading the script stored for `store`'s allowance (`sn`, microseconds).
async fn last_clock(conn: &mut MultiplexedConnection, store: &RedisStore) -> u64 {
    redis::cmd("HGET")
        .arg(store.key())
        .arg("sn")
        .query_async(conn)
        .await
        .expect("HGET sn")
}

/// The server's `TIME`, in microseconds.
async fn server_time(conn: &mut MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1_000_000 + us
}

#[test]
fn the_shipped_files_are_the_documented_ones() {
    let source = shipped_source();
    // One clock for every build: the test-only variant is gone, and the clock is read from
    // the argument production leaves at "none".
    assert!(!std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/lua/clock_test.lua"
    ))
    .exists());
    assert!(source.contains("local now = tonumber(ARGV[2])"));
    assert!(source.contains("redis.call('TIME')"));
    assert!(source.contains("redis.replicate_commands()"));
}

#[tokio::test]
async fn the_server_holds_exactly_the_shipped_script() {
    let redis = TestRedis::start().await;
    let client = redis::Client::open(redis.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("inspection connection");
    let sha = Script::new(&shipped_source()).get_hash().to_owned();
    flush(&mut conn).await;
    assert!(!exists(&mut conn, &sha).await);

    // Connecting loads the script: the one whose SHA the server computes from what it got.
    let store = RedisStore::connect(
        redis.url(),
        &unique_name("script"),
        RedisStoreOptions::new(),
    )
    .await
    .expect("connect");
    assert_eq!(store.script_sha(), sha);
    assert!(exists(&mut conn, &sha).await, "the server lacks {sha}");

    // Production: the clock argument is "none", so the script decides on the server's TIME.
    let config = AllowanceConfig::per_second(10, 5).expect("valid");
    let allowance = Allowance::with_store(config.clone(), store.clone());
    allowance.acquire().await.expect("admitted");
    let (sn, time) = (
        last_clock(&mut conn, &store).await,
        server_time(&mut conn).await,
    );
    assert!(
        sn <= time && time - sn < 60_000_000,
        "decided at {sn}, TIME is {time}"
    );

    // Following tokio's clock: the same script, reloaded after a flush (NOSCRIPT), decides on
    // the clock argument (microseconds since following began), not on TIME.
    flush(&mut conn).await;
    let follower = store
        .for_allowance(&unique_name("script"))
        .expect("valid name");
    follower.follow_tokio_clock().expect("blocking connection");
    assert_eq!(follower.script_sha(), sha);
    Allowance::with_store(config, follower.clone())
        .acquire()
        .await
        .expect("admitted");
    assert!(
        exists(&mut conn, &sha).await,
        "the test clock's calls loaded another script than {sha}"
    );
    let sn = last_clock(&mut conn, &follower).await;
    assert!(sn < 60_000_000, "decided at {sn}: TIME, not the test clock");
}
