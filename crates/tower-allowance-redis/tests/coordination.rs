//! Several "processes" (separate `RedisStore` connections) sharing one allowance on a private
//! `redis-server`: exact budget under concurrency, a cooldown seen by everyone, one round
//! trip per admission, TTLs on every key, names that cannot escape their hash tag, and no
//! password in Debug output or errors. Real time.

use std::{error::Error, time::Duration};

use tokio::time::Instant;
use tower_allowance::{
    rule::{Admission, Op, Reply},
    rule::{AdmitRequest, StoreState},
    store::Store,
    Allowance, AllowanceConfig, ReplenishingBudget, RetryBudgetConfig,
};
use tower_allowance_redis::{
    error::ConnectErrorKind,
    test_util::{unique_name, TestRedis},
    FailurePolicy, RedisStore, RedisStoreOptions,
};

const MS: Duration = Duration::from_millis(1);

/// Room for scheduling on an upper bound of a measured time: `tight` in the real-time runner
/// (`--features experiments`, tests/README.md), 5 s more in the default suite, where a
/// verdict must not depend on machine load. Lower bounds need none: load only delays.
fn slack(tight: Duration) -> Duration {
    if cfg!(feature = "experiments") {
        tight
    } else {
        tight + Duration::from_secs(5)
    }
}

async fn connect(redis: &TestRedis, name: &str) -> RedisStore {
    RedisStore::connect(redis.url(), name, RedisStoreOptions::new())
        .await
        .expect("connect")
}

async fn admit(store: &RedisStore, config: &AllowanceConfig, req: AdmitRequest) -> Admission {
    let reply = store.apply(config.params(), Op::Admit(req).into()).await;
    match reply.expect("redis").into() {
        Reply::Admit(a) => a,
        other => panic!("{other:?}"),
    }
}

async fn state(store: &RedisStore, config: &AllowanceConfig) -> StoreState {
    let reply = store
        .apply(config.params(), Op::Read { deposits: 0 }.into())
        .await;
    match reply.expect("redis").into() {
        Reply::State(s) => s,
        other => panic!("{other:?}"),
    }
}

/// The whole chain of an error, for checks on what it says.
fn chain(e: &(dyn Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_budget_is_exact_across_connections_and_tasks() {
    let redis = TestRedis::start().await;
    const K: u64 = 25;
    const STORES: usize = 3;
    const TASKS_PER_STORE: usize = 32;
    let name = unique_name("budget");
    // Plenty of tokens: only the budget limits.
    let config = AllowanceConfig::per_second(1_000_000, 100_000)
        .expect("valid")
        .with_retry_budget(RetryBudgetConfig::fixed(K));
    let mut stores = vec![];
    for _ in 0..STORES {
        stores.push(connect(&redis, &name).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for store in &stores {
        for _ in 0..TASKS_PER_STORE {
            let (store, config) = (store.clone(), config.clone());
            tasks.spawn(async move {
                let (mut admitted, mut refused) = (0u64, 0u64);
                // Each task tries several times, so tasks race for the last units.
                for _ in 0..4 {
                    match admit(&store, &config, AdmitRequest::retry()).await {
                        Admission::Admitted => admitted += 1,
                        Admission::BudgetExhausted => refused += 1,
                        other => panic!("tokens are plentiful: {other:?}"),
                    }
                }
                (admitted, refused)
            });
        }
    }
    let (mut admitted, mut refused) = (0, 0);
    while let Some(result) = tasks.join_next().await {
        let (a, r) = result.expect("task");
        admitted += a;
        refused += r;
    }
    let asked = (STORES * TASKS_PER_STORE * 4) as u64;
    eprintln!(
        "{asked} retries asked by {STORES} connections: {admitted} admitted, {refused} refused"
    );
    assert_eq!(admitted, K, "exactly the budget is spent");
    assert_eq!(refused, asked - K);
    assert_eq!(state(&stores[0], &config).await.retries_remaining, Some(0));
}

#[tokio::test]
async fn a_cooldown_raised_by_one_process_holds_another() {
    let redis = TestRedis::start().await;
    let name = unique_name("cooldown");
    let config = AllowanceConfig::per_second(10, 2).expect("valid");
    // Two processes' views: separate connections, separate allowances, one name.
    let a = Allowance::with_store(config.clone(), connect(&redis, &name).await);
    let b_store = connect(&redis, &name).await;
    let b = Allowance::with_store(config.clone(), b_store.clone());

    // From before the defer: the cooldown runs 2 s from a moment after this one, so B's
    // wait is at least 2 s whatever the load (the 50 ms is the two clocks' granularity).
    let started = Instant::now();
    assert!(
        a.extend_cooldown(2_000 * MS).await.expect("defer"),
        "extended"
    );
    // B asks the store once, is given a slot at the cooldown's end, and sleeps until it.
    let round_trips = b_store.round_trips();
    b.acquire().await.expect("admitted after the cooldown");
    let waited = started.elapsed();
    eprintln!("B waited {waited:?} for A's 2 s cooldown");
    assert!(
        waited >= 1_950 * MS && waited <= 2_000 * MS + slack(300 * MS),
        "B waited {waited:?}, want ~2 s"
    );
    // One reservation, no polling, no catch-up read: B decided only once its event
    // subscription was up, so it cannot have missed an event.
    let calls = b_store.round_trips() - round_trips;
    assert_eq!(calls, 1, "{calls} calls: one reservation, no polling");
    // A shorter Retry-After seen by B does not shorten the deadline A raised later.
    a.extend_cooldown(1_000 * MS).await.expect("defer");
    assert!(
        !b.extend_cooldown(100 * MS).await.expect("defer"),
        "not extended"
    );
    // What is left of A's 1 s: more than B's 100 ms unless B's call took 900 ms (the runner
    // asks for the three calls within 200 ms).
    let left = if cfg!(feature = "experiments") {
        800 * MS
    } else {
        100 * MS
    };
    let blocked_for = b
        .refresh()
        .await
        .expect("read")
        .cooling_for
        .unwrap_or_default();
    assert!(blocked_for > left, "{blocked_for:?}");
}

#[tokio::test]
async fn steady_state_admission_is_one_round_trip() {
    let redis = TestRedis::start().await;
    let store = connect(&redis, &unique_name("rtt")).await;
    assert_eq!(store.round_trips(), 1, "connect preloads the script once");
    let config = AllowanceConfig::per_second(100_000, 1_000).expect("valid");
    // Through the store...
    for i in 0..50 {
        let before = store.round_trips();
        let decision = admit(&store, &config, AdmitRequest::first()).await;
        assert_eq!(decision, Admission::Admitted, "{i}");
        assert_eq!(store.round_trips() - before, 1);
    }
    // ...and through an allowance, as the layers use it.
    let allowance = Allowance::with_store(config, store.clone());
    let before = store.round_trips();
    for _ in 0..200 {
        allowance.acquire().await.expect("admitted");
    }
    assert_eq!(store.round_trips() - before, 200);

    // A waiting caller is given its slot and sleeps until it: one round trip per admission,
    // waiting or not.
    let counting = connect(&redis, &unique_name("rtt-wait2")).await;
    let slow = Allowance::with_store(
        AllowanceConfig::per_second(20, 1).expect("valid"),
        counting.clone(),
    );
    let before = counting.round_trips();
    for _ in 0..6 {
        slow.acquire().await.expect("admitted");
    }
    let spent = counting.round_trips() - before;
    eprintln!("6 metered admissions (50 ms apart): {spent} round trips");
    assert_eq!(spent, 6, "{spent} round trips: polling?");
}

/// The number of subscribers of `channel` on `redis`.
async fn subscribers(redis: &TestRedis, channel: &str) -> i64 {
    let reply = redis.command(&["PUBSUB", "NUMSUB", channel]).await;
    // `*2 $len channel :n`: the count is the last line.
    parse_int(reply.lines().last().unwrap_or_default())
}

/// A TCP proxy to `to` on a free loopback port that holds each connection `delay` before
/// forwarding it: a subscription that comes up late.
async fn slow_proxy(to: String, delay: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Ok(mut server) = tokio::net::TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    format!("redis://{addr}/")
}

/// A store's first operation waits for its event subscription: whatever it reserves then
/// hears every later event, so no catch-up read is ever needed, however late the
/// subscription comes up. The regression: a reservation made before the subscription was up
/// cost a catch-up read when it came (7 round trips for 6 admissions in 15 runs of 50).
/// Here the subscription goes through a proxy that holds it 300 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_decision_waits_for_the_subscription() {
    let redis = TestRedis::start().await;
    let name = unique_name("gate");
    // One request per 2 s: B's reserved slot is 2 s after its burst, time enough for A's
    // defer to land before it however loaded the machine.
    let config = AllowanceConfig::new(1, 2_000 * MS, 1).expect("valid");
    // The other process, ready before B starts (only its defer is timed below).
    let a = Allowance::with_store(config.clone(), connect(&redis, &name).await);
    let server = redis
        .url()
        .trim_start_matches("redis://")
        .trim_end_matches('/');
    let events = slow_proxy(server.to_owned(), 300 * MS).await;
    let client = redis::Client::open(redis.url()).expect("url");
    let conn = redis::aio::ConnectionManager::new(client)
        .await
        .expect("connection");
    // A connect timeout far above the proxy's hold: the gate never gives up here.
    let options = RedisStoreOptions::new().connect_timeout(Duration::from_secs(30));
    let b_store = RedisStore::from_connection(
        conn,
        Some(redis::Client::open(events).expect("url")),
        &name,
        options,
    )
    .await
    .expect("store");
    let channel = b_store.channel().to_owned();
    let b = Allowance::with_store(config.clone(), b_store.clone());
    let before = b_store.round_trips();
    // At once: the burst, then a reserved slot 2 s later.
    let started = Instant::now();
    b.acquire().await.expect("the burst");
    assert!(
        subscribers(&redis, &channel).await >= 1,
        "B decided {:?} after it was made, before it could hear events",
        started.elapsed()
    );
    let holder = {
        let b = b.clone();
        tokio::spawn(async move {
            b.acquire().await.expect("admitted");
            Instant::now()
        })
    };
    while b.snapshot().waiting == 0 {
        tokio::task::yield_now().await;
    }
    // Another process raises a 4 s cooldown: it reaches B's holder by the event alone.
    let raised = Instant::now();
    assert!(a.extend_cooldown(4_000 * MS).await.expect("defer"));
    let sent = holder.await.expect("holder task");
    assert!(
        sent.saturating_duration_since(raised) >= 3_950 * MS,
        "B's holder went out {:?} into the 4 s cooldown",
        sent.saturating_duration_since(raised)
    );
    assert_eq!(
        b_store.round_trips() - before,
        2,
        "the burst and the reservation: no catch-up read"
    );
}

#[tokio::test]
async fn every_key_has_a_ttl_and_there_are_two_keys() {
    let redis = TestRedis::start().await;
    let name = unique_name("ttl");
    let store = RedisStore::connect(
        redis.url(),
        &name,
        RedisStoreOptions::new().idle_ttl(Duration::from_secs(10)),
    )
    .await
    .expect("connect");
    assert_eq!(store.key(), format!("ta:{{{name}}}:s"));
    let pttl_args = ["PTTL", store.key()];
    let pttl = || redis.command(&pttl_args);
    assert_eq!(pttl().await, ":-2", "no key before the first write");

    let config = AllowanceConfig::per_second(10, 1).expect("valid").exact();
    admit(&store, &config, AdmitRequest::first()).await;
    let ttl = parse_int(&pttl().await);
    assert!(ttl > 0 && ttl <= 10_100, "admission: PTTL {ttl}");

    store
        .apply(
            config.params(),
            Op::Defer {
                delay_us: Some(60_000_000),
            }
            .into(),
        )
        .await
        .expect("redis");
    let ttl = parse_int(&pttl().await);
    assert!(
        ttl > 69_000 && ttl <= 70_000,
        "cooldown of 60 s: PTTL {ttl}"
    );

    // A replenishing budget keeps its window; a second allowance on the same server.
    let budget_store = RedisStore::connect(
        redis.url(),
        &unique_name("ttl-budget"),
        RedisStoreOptions::new().idle_ttl(Duration::ZERO),
    )
    .await
    .expect("connect");
    let budget = ReplenishingBudget::new(Duration::from_secs(30), 1, 0.1).expect("valid");
    let config = config.with_retry_budget(RetryBudgetConfig::Replenishing(budget));
    budget_store
        .apply(config.params(), Op::Read { deposits: 1 }.into())
        .await
        .expect("redis");
    let ttl = parse_int(&redis.command(&["PTTL", budget_store.key()]).await);
    assert!(ttl > 29_000 && ttl <= 30_000, "30 s window: PTTL {ttl}");

    // Nothing else was written for either allowance, whatever the traffic: the state, with
    // the configuration in force inside it.
    for _ in 0..20 {
        admit(&store, &config, AdmitRequest::retry()).await;
    }
    let keys = redis.command(&["KEYS", &format!("ta:{{{name}}}*")]).await;
    assert!(
        keys.starts_with("*1\r\n") && keys.contains("}:s"),
        "the state alone, the configuration in force inside it (field k): {keys}"
    );
    let k = redis.command(&["HEXISTS", store.key(), "k"]).await;
    assert_eq!(
        k, ":1",
        "the configuration lives (and expires) with the state"
    );
}

fn parse_int(reply: &str) -> i64 {
    reply
        .strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not an integer reply: {reply:?}"))
}

#[tokio::test]
async fn names_that_could_escape_the_hash_tag_are_refused() {
    // Refused before any connection is made: the URL does not even need a server.
    for bad in [
        "a}b",
        "a b",
        "{x}",
        "a\u{7}b",
        "a\nb",
        "",
        "ta:{other}:s",
        "ünï",
    ] {
        let err = RedisStore::connect("redis://127.0.0.1:1/", bad, RedisStoreOptions::new())
            .await
            .expect_err(bad);
        assert_eq!(err.kind(), ConnectErrorKind::InvalidName, "{bad:?}");
        assert!(chain(&err).contains("invalid allowance name"), "{err}");
    }
}

#[tokio::test]
async fn the_password_never_shows() {
    let redis = TestRedis::start_private().await;
    // The private server has no password, so AUTH with one fails: an error path that
    // has the URL in hand.
    let url = redis
        .url()
        .replacen("redis://", "redis://user:hunter2-secret@", 1);
    // Long enough that a loaded machine still sees the refusal, not a timeout.
    let options = RedisStoreOptions::new().connect_timeout(5_000 * MS);
    let err = RedisStore::connect(&url, "pw", options.clone())
        .await
        .expect_err("authentication fails");
    assert_eq!(err.kind(), ConnectErrorKind::Refused, "{}", chain(&err));
    let text = format!("{} / {err:?}", chain(&err));
    assert!(!text.contains("hunter2"), "{text}");

    // A refusal is never masked by the local fallback.
    let fallback = options
        .clone()
        .failure_policy(FailurePolicy::LocalFallback {
            expected_processes: std::num::NonZeroU32::MIN,
        });
    let err = RedisStore::connect(&url, "pw", fallback)
        .await
        .expect_err("a wrong password is not an outage");
    assert_eq!(err.kind(), ConnectErrorKind::Refused);
    assert!(!format!("{} / {err:?}", chain(&err)).contains("hunter2"));
    // A server that is not there: the fallback store starts without it; its Debug is clean.
    let down = "redis://user:hunter2-secret@127.0.0.1:1/";
    let fallback = options.failure_policy(FailurePolicy::LocalFallback {
        expected_processes: std::num::NonZeroU32::MIN,
    });
    let store = RedisStore::connect(down, "pw", fallback)
        .await
        .expect("a fallback store starts without redis");
    let debug = format!("{store:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(debug.contains("user:***@127.0.0.1"), "{debug}");
    let allowance = Allowance::with_store(AllowanceConfig::per_second(1, 1).expect("valid"), store);
    assert!(!format!("{allowance:?}").contains("hunter2"));
}
