//! The script the tests run is the script that ships: the files in `src/`, read here at test
//! time and assembled in the order `scripts.rs` documents, are the body of the function
//! library a server holds after the store has decided both on `TIME` (production: the clock
//! argument is "none") and on tokio's clock (`follow_tokio_clock`), and of the script (its SHA
//! is the one the store calls) used where the server has no Functions.

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
const FILES: [&str; 10] = [
    "src/lua/now.lua",
    "src/lua/state.lua",
    "src/lua/budget.lua",
    "src/lua/clock.lua",
    "src/lua/adaptive.lua",
    "src/lua/cooldown.lua",
    "src/lua/settle.lua",
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

/// The shipped body, from the files on disk now (not as compiled in).
fn shipped_body() -> String {
    let mut source = constants();
    for file in FILES {
        let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        source.push_str(&text);
    }
    source
}

/// The shipped script (`EVALSHA`): the body, then a call of `apply`.
fn shipped_source() -> String {
    format!(
        "{}if redis.replicate_commands then redis.replicate_commands() end\n\
         return apply(KEYS, ARGV)\n",
        shipped_body()
    )
}

/// The code of the library `name` as the server holds it, if it does.
async fn library_code(conn: &mut MultiplexedConnection, name: &str) -> Option<String> {
    let list: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(name)
        .arg("WITHCODE")
        .query_async(conn)
        .await
        .expect("FUNCTION LIST");
    // [[library_name, name, engine, LUA, functions, [...], library_code, code]]
    let redis::Value::Array(libraries) = list else {
        return None;
    };
    libraries.into_iter().find_map(|library| {
        let fields = match library {
            redis::Value::Array(f) => f,
            redis::Value::Map(m) => m.into_iter().flat_map(|(k, v)| [k, v]).collect(),
            _ => return None,
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let named = fields.chunks(2).any(|kv| {
            text(&kv[0]).as_deref() == Some("library_name") && text(&kv[1]).as_deref() == Some(name)
        });
        let code = fields
            .chunks(2)
            .find(|kv| text(&kv[0]).as_deref() == Some("library_code"))
            .and_then(|kv| text(&kv[1]));
        named.then_some(code).flatten()
    })
}

async fn flush_functions(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(conn)
        .await
        .expect("FUNCTION FLUSH");
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

/// The last clock reading the script stored for `store`'s allowance (`sn`, microseconds: the
/// sixth of the doubles packed in the hash's field `b`).
async fn last_clock(conn: &mut MultiplexedConnection, store: &RedisStore) -> u64 {
    let packed: Vec<u8> = redis::cmd("HGET")
        .arg(store.key())
        .arg("b")
        .query_async(conn)
        .await
        .expect("HGET b");
    let sn: [u8; 8] = packed[40..48].try_into().expect("13 doubles");
    f64::from_le_bytes(sn) as u64
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
    assert!(source.contains("now = tonumber(args[2])"));
    assert!(source.contains("redis.call('TIME')"));
    assert!(source.contains("redis.replicate_commands()"));
}

#[tokio::test]
async fn the_server_holds_exactly_the_shipped_library() {
    let redis = TestRedis::start().await;
    let client = redis::Client::open(redis.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("inspection connection");
    let body = shipped_body();
    let name = format!("tower_allowance_{}", &Script::new(&body).get_hash()[..16]);
    flush_functions(&mut conn).await;
    flush(&mut conn).await;

    // Connecting loads the library: the shipped body, registering `apply` under its name.
    let store = RedisStore::connect(
        redis.url(),
        &unique_name("script"),
        RedisStoreOptions::new(),
    )
    .await
    .expect("connect");
    assert!(store.uses_functions());
    assert_eq!(store.function_name(), name);
    let code = library_code(&mut conn, &name)
        .await
        .expect("the library is loaded");
    assert_eq!(
        code,
        format!("#!lua name={name}\n{body}redis.register_function('{name}', apply)\n")
    );
    let sha = Script::new(&shipped_source()).get_hash().to_owned();
    assert_eq!(store.script_sha(), sha);
    assert!(
        !exists(&mut conn, &sha).await,
        "no script where the library serves"
    );

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

    // Following tokio's clock: the same library, loaded again after a flush, decides on the
    // clock argument (microseconds since following began), not on TIME.
    flush_functions(&mut conn).await;
    let follower = store
        .for_allowance(&unique_name("script"))
        .expect("valid name");
    follower.follow_tokio_clock().expect("blocking connection");
    Allowance::with_store(config.clone(), follower.clone())
        .acquire()
        .await
        .expect("admitted");
    assert_eq!(library_code(&mut conn, &name).await, Some(code));
    let sn = last_clock(&mut conn, &follower).await;
    assert!(sn < 60_000_000, "decided at {sn}: TIME, not the test clock");

    // Flushed again, in production: loaded again within the call, still one round trip's
    // worth of calls plus the reload.
    flush_functions(&mut conn).await;
    let before = store.round_trips();
    allowance
        .acquire()
        .await
        .expect("admitted after FUNCTION FLUSH");
    assert_eq!(
        store.round_trips() - before,
        3,
        "FCALL, FUNCTION LOAD, FCALL"
    );
    assert!(store.uses_functions());
}

#[tokio::test]
async fn without_functions_the_script_is_the_shipped_one() {
    let redis = TestRedis::start().await;
    let client = redis::Client::open(redis.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("inspection connection");
    let sha = Script::new(&shipped_source()).get_hash().to_owned();
    flush(&mut conn).await;
    let store = RedisStore::connect(
        redis.url(),
        &unique_name("script"),
        RedisStoreOptions::new(),
    )
    .await
    .expect("connect");
    store.without_functions();
    assert_eq!(store.script_sha(), sha);

    // The script is loaded on the first call (NOSCRIPT, then SCRIPT LOAD), and decides on TIME.
    let config = AllowanceConfig::per_second(10, 5).expect("valid");
    Allowance::with_store(config.clone(), store.clone())
        .acquire()
        .await
        .expect("admitted");
    assert!(exists(&mut conn, &sha).await, "the server lacks {sha}");
    let (sn, time) = (
        last_clock(&mut conn, &store).await,
        server_time(&mut conn).await,
    );
    assert!(
        sn <= time && time - sn < 60_000_000,
        "decided at {sn}, TIME is {time}"
    );

    // Following tokio's clock, after a flush: the same script again.
    flush(&mut conn).await;
    let follower = store
        .for_allowance(&unique_name("script"))
        .expect("valid name");
    assert!(!follower.uses_functions(), "shared over the connection");
    follower.follow_tokio_clock().expect("blocking connection");
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

/// A server whose ACL refuses Functions (`-@scripting +eval* +script*`, or Redis before 7):
/// the store loads the script instead and decides the same.
#[tokio::test]
async fn a_server_refusing_functions_gets_the_script() {
    let redis = TestRedis::start_private().await;
    let ok = redis
        .command(&[
            "ACL",
            "SETUSER",
            "nofn",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-function",
            "-fcall",
            "-fcall_ro",
        ])
        .await;
    assert!(ok.starts_with("+OK"), "ACL SETUSER: {ok}");
    let url = redis.url().replacen("redis://", "redis://nofn:pw@", 1);
    let store = RedisStore::connect(&url, &unique_name("nofn"), RedisStoreOptions::new())
        .await
        .expect("connect: the script instead of the library");
    assert!(!store.uses_functions());
    let config = AllowanceConfig::per_second(10, 2).expect("valid");
    let allowance = Allowance::with_store(config, store.clone());
    for _ in 0..2 {
        allowance.acquire().await.expect("admitted");
    }
    assert_eq!(
        store.round_trips(),
        4,
        "FUNCTION LOAD refused, SCRIPT LOAD, two EVALSHA"
    );
}
