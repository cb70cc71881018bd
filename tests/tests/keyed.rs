//! Keyed allowances: one allowance per key through `KeyedLayer`, per-key overrides, and a
//! bounded registry whose eviction never lets more through than keeping would have.
//!
//! In virtual time on memory stores; the Redis tests (real time, a private redis-server)
//! check that no key material reaches Redis (`KEYS`, `MONITOR`) and that a shared store's
//! state survives an eviction.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{Request, Response, StatusCode};
use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, TestRunner},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    time::Instant,
};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_allowance::{
    error::AbandonReason,
    keyed::{key, KeySecret, Keyed, KeyedConfig, KeyedError, KeyedLayer, SharedStores},
    retry::RetryConfig,
    AcquireOptions, Allowance, AllowanceConfig, Deadline, Limit, Outcome, RetryBudgetConfig,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

const MS: Duration = Duration::from_millis(1);

// Exact (no headroom): the registry's timings below are the limits' as configured.
fn per_second(rate: u32, burst: u32) -> AllowanceConfig {
    AllowanceConfig::per_second(rate, burst)
        .expect("valid")
        .exact()
}

fn ok() -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send {
    service_fn(|_req: Request<String>| async { Ok(Response::new(String::new())) })
}

fn keyed_request(key: &str) -> Request<String> {
    Request::builder()
        .header("x-api-key", key)
        .body(String::new())
        .expect("request")
}

/// Admitted now, without waiting.
async fn now_or_never(keyed: &Keyed, key: &str) -> bool {
    let handle = keyed.get(key).expect("allowance");
    let options = AcquireOptions::new().deadline(Instant::now() + Duration::from_micros(1));
    handle.allowance().acquire_with(options).await.is_ok()
}

#[tokio::test(start_paused = true)]
async fn each_key_has_its_own_allowance_and_a_flood_on_one_does_not_slow_another() {
    let keyed = Keyed::new(KeyedConfig::new(per_second(2, 2)));
    let svc = ServiceBuilder::new()
        .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
        .service(ok());
    let start = Instant::now();
    let mut flood = vec![];
    for _ in 0..10 {
        flood.push(tokio::spawn(svc.clone().oneshot(keyed_request("noisy"))));
    }
    tokio::task::yield_now().await;
    // The quiet tenant's two requests go at once, while the noisy one's queue takes 4 s.
    for _ in 0..2 {
        let r = svc.clone().oneshot(keyed_request("quiet")).await;
        assert!(Outcome::of(&r).is_completed());
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
    for f in flood {
        assert!(Outcome::of(&f.await.expect("task")).is_completed());
    }
    assert_eq!(start.elapsed(), Duration::from_secs(4));
    assert_eq!(
        keyed
            .get("noisy")
            .expect("live")
            .allowance()
            .snapshot()
            .admitted,
        10
    );
    assert_eq!(
        keyed
            .get("quiet")
            .expect("live")
            .allowance()
            .snapshot()
            .admitted,
        2
    );
    assert_eq!(keyed.stats().created, 2);
}

#[tokio::test(start_paused = true)]
async fn overrides_no_key_and_names() {
    let keyed =
        Keyed::builder(KeyedConfig::new(per_second(1, 1)).with_override("big", per_second(100, 5)))
            .secret(KeySecret::new([9; 32]))
            .name_prefix("tenants")
            .build()
            .expect("valid");
    assert_eq!(
        keyed.get("big").expect("live").allowance().config().burst(),
        5
    );
    assert_eq!(
        keyed
            .get("small")
            .expect("live")
            .allowance()
            .config()
            .burst(),
        1
    );
    let name = keyed.get("big").expect("live").name().to_owned();
    assert_eq!(name, keyed.name_of("big"));
    assert!(
        name.starts_with("tenants:") && !name.contains("big"),
        "{name}"
    );
    let debug = format!("{keyed:?} {:?} {:?}", keyed.config(), keyed.get("big"));
    assert!(
        !debug.contains("big\"") && !debug.contains("small"),
        "{debug}"
    );

    let svc = KeyedLayer::new(keyed, key::api_key());
    let result = tower::Layer::layer(&svc, ok())
        .oneshot(Request::new(String::new()))
        .await;
    let err = result.expect_err("no key: an error");
    assert!(
        matches!(err.downcast_ref::<KeyedError>(), Some(KeyedError::NoKey)),
        "{err}"
    );
    // A shared store without a secret cannot derive names every process agrees on.
    let no_secret = Keyed::builder(KeyedConfig::new(per_second(1, 1)))
        .stores(SharedStores(tower_allowance::keyed::MemoryStores))
        .build();
    assert!(no_secret.is_err());
}

/// When each request reached a [`recording`] server, by key.
type Seen = Arc<Mutex<Vec<(String, Instant)>>>;

/// A server that records when each request reaches it and answers 200, or a 429 with the
/// `Retry-After` the request carries in `x-answer-retry-after`.
fn recording(
    seen: Seen,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send {
    service_fn(move |req: Request<String>| {
        let seen = seen.clone();
        async move {
            let key = req
                .headers()
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            seen.lock().expect("seen").push((key, Instant::now()));
            let mut res = Response::new(String::new());
            if let Some(secs) = req.headers().get("x-answer-retry-after") {
                *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                res.headers_mut().insert("retry-after", secs.clone());
            }
            Ok(res)
        }
    })
}

/// A POST on `key`, answered with a 429 and `Retry-After: {secs}` when `throttled` is set.
/// A POST is not replayed: the 429 comes back to the caller, and no retry holds the allowance.
fn post(key: &str, throttled: Option<u64>) -> Request<String> {
    let mut req = Request::builder()
        .method(http::Method::POST)
        .header("x-api-key", key);
    if let Some(secs) = throttled {
        req = req.header("x-answer-retry-after", secs.to_string());
    }
    req.body(String::new()).expect("request")
}

/// When the server saw `key`'s requests, from `start`.
fn times(seen: &Seen, key: &str, start: Instant) -> Vec<Duration> {
    seen.lock()
        .expect("seen")
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, at)| at.duration_since(start))
        .collect()
}

/// A keyed registry that evicts as eagerly as it may: no idle time, a sweep whenever asked.
fn eager(config: AllowanceConfig) -> Keyed {
    Keyed::new(
        KeyedConfig::new(config)
            .with_idle_timeout(Duration::ZERO)
            .with_retry(RetryConfig::default()),
    )
}

/// Two sweeps: the first starts a generation, the second evicts what was unused since.
fn sweep(keyed: &Keyed) -> usize {
    keyed.evict_idle() + keyed.evict_idle()
}

#[tokio::test(start_paused = true)]
async fn refilled_and_idle_is_evicted_and_memory_is_given_back() {
    let keyed = eager(per_second(10, 5));
    for _ in 0..5 {
        assert!(now_or_never(&keyed, "a").await);
    }
    assert_eq!(sweep(&keyed), 0, "the bucket is empty");
    tokio::time::advance(499 * MS).await;
    assert_eq!(sweep(&keyed), 0, "one token short");
    tokio::time::advance(MS).await;
    assert_eq!(
        sweep(&keyed),
        1,
        "5 tokens at 10/s: full again after 500 ms"
    );
    assert!(keyed.is_empty());
    assert_eq!(keyed.stats().evicted, 1);
}

#[tokio::test(start_paused = true)]
async fn never_evicted_while_a_request_waits_for_its_slot() {
    let keyed = eager(per_second(1, 1));
    let svc = ServiceBuilder::new()
        .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
        .service(ok());
    let start = Instant::now();
    assert!(Outcome::of(&svc.clone().oneshot(keyed_request("k")).await).is_completed());
    let waiting = tokio::spawn(svc.clone().oneshot(keyed_request("k")));
    tokio::time::sleep(500 * MS).await;
    // Evicting now would let a new allowance hand the reserved slot out again.
    assert_eq!(sweep(&keyed), 0);
    assert!(
        !now_or_never(&keyed, "k").await,
        "the same allowance: no token"
    );
    assert!(Outcome::of(&waiting.await.expect("task")).is_completed());
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_per_day_limit_keeps_its_allowance_for_a_day() {
    let config = per_second(10, 10)
        .with_limit(Limit::per_day(3, 3).expect("valid").exact())
        .expect("valid");
    let keyed = eager(config);
    for _ in 0..3 {
        assert!(now_or_never(&keyed, "k").await);
    }
    assert!(!now_or_never(&keyed, "k").await, "the day's 3 are spent");
    tokio::time::advance(Duration::from_secs(3_600)).await;
    assert_eq!(sweep(&keyed), 0, "a fresh allowance would hand out 3 more");
    assert!(!now_or_never(&keyed, "k").await);
    // 3 per day with a burst of 3: full a day after the last admission.
    tokio::time::advance(Duration::from_secs(86_400 - 3_600)).await;
    assert_eq!(sweep(&keyed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_and_a_closure_keep_the_allowance() {
    let keyed = eager(per_second(100, 100));
    keyed
        .get("cool")
        .expect("live")
        .allowance()
        .extend_cooldown(Duration::from_secs(30))
        .await
        .expect("defer");
    let closing = per_second(100, 100)
        .with_max_cooldown(Duration::from_secs(60))
        .expect("valid");
    let keyed2 = eager(closing);
    let closed = keyed2.get("closed").expect("live");
    closed
        .allowance()
        .extend_cooldown(Duration::from_secs(86_400 * 400))
        .await
        .expect("defer");
    assert!(closed.allowance().snapshot().closed.is_some(), "closed");
    drop(closed);
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(sweep(&keyed), 0, "still cooling down");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(sweep(&keyed), 1, "the cooldown is over and the bucket full");
    assert_eq!(sweep(&keyed2), 0, "closed for max_cooldown");
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(sweep(&keyed2), 1, "reopened by itself, the bucket full");
}

/// The cooldowns and closures of responses (a 429's `Retry-After`, one beyond `max_cooldown`,
/// a success saying the quota is spent) keep the allowance as `extend_cooldown()`'s do.
#[tokio::test(start_paused = true)]
async fn a_cooldown_or_a_closure_from_a_response_keeps_the_allowance() {
    // The IETF fields below are read by the dialects that name them, not the standard one.
    let config = per_second(100, 100)
        .with_max_cooldown(Duration::from_secs(60))
        .expect("valid")
        .with_dialect(tower_allowance::signals::Dialect::generic());
    let keyed = eager(config);
    let seen = Seen::default();
    let svc = ServiceBuilder::new()
        .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
        .service(recording(seen.clone()));
    // A 429 asking for 30 s: a cooldown.
    let throttled = svc.clone().oneshot(post("cool", Some(30))).await;
    assert!(!Outcome::of(&throttled).is_completed());
    // A 429 asking for 400 days, beyond a year (not to be trusted): a closure, for
    // max_cooldown. (A valid delay beyond max_cooldown closes until its end.)
    let closing = svc.clone().oneshot(post("closed", Some(34_560_000))).await;
    assert!(!Outcome::of(&closing).is_completed());
    assert!(
        keyed
            .get("closed")
            .expect("live")
            .allowance()
            .store_state()
            .await
            .expect("state")
            .closed
            .is_some(),
        "closed"
    );
    // A success saying none is left until a reset 30 s away: a cooldown too.
    let spent = service_fn(|_req: Request<String>| async {
        let mut res = Response::new(String::new());
        res.headers_mut()
            .insert("ratelimit-remaining", http::HeaderValue::from_static("0"));
        res.headers_mut()
            .insert("ratelimit-reset", http::HeaderValue::from_static("30"));
        Ok::<_, Infallible>(res)
    });
    let spent = ServiceBuilder::new()
        .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
        .service(spent);
    assert!(Outcome::of(&spent.oneshot(keyed_request("spent")).await).is_completed());

    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(sweep(&keyed), 0, "cooling down, or closed");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        sweep(&keyed),
        2,
        "both cooldowns are over and the buckets full"
    );
    tokio::time::advance(Duration::from_secs(28)).await;
    assert_eq!(sweep(&keyed), 0, "still closed (for max_cooldown)");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(sweep(&keyed), 1, "reopened by itself, the bucket full");
}

/// The first case: a 429 with `Retry-After: 30`, a sweep 2 s later, and the next
/// request on the key must still wait out the 30 s (a new allowance would send it at once).
#[tokio::test(start_paused = true)]
async fn a_429s_cooldown_outlives_a_sweep() {
    let keyed = eager(per_second(10, 10));
    let seen = Seen::default();
    let svc = ServiceBuilder::new()
        .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
        .service(recording(seen.clone()));
    let start = Instant::now();
    let throttled = svc.clone().oneshot(post("k", Some(30))).await;
    assert!(!Outcome::of(&throttled).is_completed());
    // Nothing holds the allowance now, and its bucket is full again.
    tokio::time::advance(Duration::from_secs(2)).await;
    let evicted = sweep(&keyed);
    let next = svc.clone().oneshot(post("k", None)).await;
    assert!(Outcome::of(&next).is_completed());
    assert_eq!(
        times(&seen, "k", start),
        [Duration::ZERO, Duration::from_secs(30)],
        "the second request waits for the server's 30 s"
    );
    assert_eq!(evicted, 0, "a cooling allowance is kept");
}

/// The second case: default settings, a registry of one key. A 429 with
/// `Retry-After: 300` on A is not forgotten when B arrives: B is refused (the registry is
/// full of an allowance it cannot evict), and A's next request waits out the 300 s.
#[tokio::test(start_paused = true)]
async fn a_full_registry_never_evicts_a_cooldown_for_a_new_key() {
    let keyed = Keyed::new(
        KeyedConfig::new(per_second(10, 10))
            .with_capacity(1)
            .expect("valid"),
    );
    let seen = Seen::default();
    let svc = ServiceBuilder::new()
        .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
        .service(recording(seen.clone()));
    let start = Instant::now();
    let throttled = svc.clone().oneshot(post("a", Some(300))).await;
    assert!(!Outcome::of(&throttled).is_completed());
    tokio::time::advance(Duration::from_secs(2)).await;
    let b = svc.clone().oneshot(post("b", None)).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let a = svc.clone().oneshot(post("a", None)).await;
    assert!(Outcome::of(&a).is_completed());
    assert_eq!(
        times(&seen, "a", start),
        [Duration::ZERO, Duration::from_secs(300)],
        "A's next request waits for the server's 300 s"
    );
    let err = b.expect_err("the registry is full");
    assert!(
        matches!(err.downcast_ref::<KeyedError>(), Some(KeyedError::Full(_))),
        "{err}"
    );
    assert!(times(&seen, "b", start).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_fixed_retry_budget_spent_from_is_never_evicted() {
    let config = per_second(100, 100).with_retry_budget(RetryBudgetConfig::fixed(3));
    let keyed = eager(config);
    let k = keyed.get("k").expect("live");
    k.allowance()
        .acquire_with(AcquireOptions::new().retry(true))
        .await
        .expect("a retry");
    assert_eq!(
        k.allowance()
            .store_state()
            .await
            .expect("state")
            .retries_remaining,
        Some(2)
    );
    drop(k);
    tokio::time::advance(Duration::from_secs(86_400 * 30)).await;
    assert_eq!(
        sweep(&keyed),
        0,
        "a fresh budget would have 3 retries again"
    );
    let k = keyed.get("k").expect("live");
    assert_eq!(
        k.allowance()
            .store_state()
            .await
            .expect("state")
            .retries_remaining,
        Some(2)
    );
    // An unspent one is evicted like any other.
    let keyed = eager(per_second(100, 100).with_retry_budget(RetryBudgetConfig::fixed(3)));
    assert!(now_or_never(&keyed, "k").await);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(sweep(&keyed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_replenishing_budget_is_kept_until_its_window_forgets_the_last_retry() {
    let budget =
        tower_allowance::ReplenishingBudget::new(Duration::from_secs(10), 1, 0.1).expect("valid");
    let keyed =
        eager(per_second(100, 100).with_retry_budget(RetryBudgetConfig::Replenishing(budget)));
    let k = keyed.get("k").expect("live");
    for _ in 0..10 {
        k.allowance()
            .acquire_with(AcquireOptions::new().retry(true))
            .await
            .expect("the window's 10 retries");
    }
    drop(k);
    // A fresh budget would have 10 retries at once: keep it while the old one has fewer.
    tokio::time::advance(Duration::from_secs(10) - MS).await;
    assert_eq!(sweep(&keyed), 0, "the window still counts them");
    // The window (ten slots of 1 s) has forgotten the slot they were spent in: evicted.
    tokio::time::advance(MS).await;
    assert_eq!(sweep(&keyed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_held_handle_keeps_its_allowance() {
    let keyed = eager(per_second(100, 100));
    let handle = keyed.get("k").expect("live");
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(sweep(&keyed), 0);
    drop(handle);
    assert_eq!(sweep(&keyed), 1);
}

/// Issue 28, bug 1: an `Allowance` cloned out of a handle into a plain layer is the key's
/// allowance as long as it lives. At 1/s burst 1, the clone's send and the keyed layer's
/// are a second apart, whatever sweeps ran while the clone sat idle (evicting it would give
/// the keyed layer a fresh allowance and a second send at 0 s).
#[tokio::test(start_paused = true)]
async fn a_cloned_allowance_keeps_its_key_alive() {
    let keyed = eager(per_second(1, 1));
    let seen = Seen::default();
    let clone = keyed.get("k").expect("live").allowance().clone();
    let plain = ServiceBuilder::new()
        .layer(clone.layer())
        .service(recording(seen.clone()));
    let svc = ServiceBuilder::new()
        .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
        .service(recording(seen.clone()));
    let start = Instant::now();
    // The clone is idle and its bucket full, but it lives: no sweep may evict the key.
    let evicted = sweep(&keyed);
    assert!(Outcome::of(&plain.clone().oneshot(post("k", None)).await).is_completed());
    assert!(Outcome::of(&svc.clone().oneshot(post("k", None)).await).is_completed());
    assert_eq!(
        times(&seen, "k", start),
        [Duration::ZERO, Duration::from_secs(1)],
        "one allowance for the key: the keyed layer's send waits for the clone's token"
    );
    assert_eq!(evicted, 0, "the clone holds the key");
    assert_eq!(keyed.stats().created, 1);
    // Once the clone and the layer built from it are gone, the key goes like any other.
    drop((plain, clone));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(sweep(&keyed), 1);
}

/// Issue 28, bug 1, with a cooldown: a 429 with `Retry-After: 30` raised through a clone
/// holds the keyed layer's next request on that key for 30 s, even if sweeps ran while the
/// clone sat idle before it.
#[tokio::test(start_paused = true)]
async fn a_cooldown_raised_through_a_clone_holds_the_keyed_layer() {
    let keyed = eager(per_second(10, 10));
    let seen = Seen::default();
    let clone = keyed.get("k").expect("live").allowance().clone();
    let plain = ServiceBuilder::new()
        .layer(clone.layer())
        .service(recording(seen.clone()));
    let svc = ServiceBuilder::new()
        .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
        .service(recording(seen.clone()));
    let start = Instant::now();
    let evicted = sweep(&keyed);
    let throttled = plain.clone().oneshot(post("k", Some(30))).await;
    assert!(!Outcome::of(&throttled).is_completed());
    let next = svc.clone().oneshot(post("k", None)).await;
    assert!(Outcome::of(&next).is_completed());
    assert_eq!(
        times(&seen, "k", start),
        [Duration::ZERO, Duration::from_secs(30)],
        "the keyed layer waits out the cooldown the clone raised"
    );
    assert_eq!(evicted, 0, "the clone holds the key");
    // Dropped during the cooldown, the clone leaves the key to the cooldown's own rule.
    drop((plain, clone));
    assert_eq!(
        sweep(&keyed),
        0,
        "cooling down (the request at 30 s took a token)"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(sweep(&keyed), 1, "the cooldown is over and the bucket full");
}

/// A full registry whose keys are all held by clones refuses a new key rather than evict
/// one of them, and takes it once a clone is gone.
#[tokio::test(start_paused = true)]
async fn a_full_registry_never_evicts_a_key_held_by_a_clone() {
    let keyed = Keyed::new(
        KeyedConfig::new(per_second(1, 1))
            .with_capacity(2)
            .expect("valid"),
    );
    let a = keyed.get("a").expect("live").allowance().clone();
    let b = keyed.get("b").expect("live").allowance().clone();
    // Both idle, both buckets full: only the clones keep them.
    tokio::time::advance(Duration::from_secs(10)).await;
    let full = keyed.get("c").expect_err("full of held keys");
    assert!(matches!(full, KeyedError::Full(_)), "{full}");
    assert_eq!(keyed.stats().evicted, 0);
    // a's clone is still the key's allowance: its token is the registry's.
    a.acquire().await.expect("a's token");
    assert!(
        !now_or_never(&keyed, "a").await,
        "the same allowance: no token"
    );
    drop(b);
    // After the refusal, new keys wait out a short back-off before the next scan.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(now_or_never(&keyed, "c").await);
    assert_eq!(keyed.stats().evicted, 1, "b, and only b");
    assert!(now_or_never(&keyed, "a").await, "a's bucket is full again");
    assert_eq!(a.snapshot().admitted, 2, "the registry's a is the clone's");
}

#[tokio::test(start_paused = true)]
async fn a_full_registry_refuses_new_keys_until_one_is_safe_to_evict() {
    let keyed = Keyed::new(
        KeyedConfig::new(per_second(1, 1))
            .with_capacity(2)
            .expect("valid"),
    );
    assert!(now_or_never(&keyed, "a").await);
    assert!(now_or_never(&keyed, "b").await);
    let full = keyed.get("c").expect_err("full");
    assert!(
        matches!(full, KeyedError::Full(f) if f.capacity() == 2),
        "{full}"
    );
    assert_eq!(keyed.stats().refused, 1);
    // Through the layer: the request fails at once, typed.
    let svc = KeyedLayer::new(keyed.clone(), key::api_key());
    let result = tower::Layer::layer(&svc, ok())
        .oneshot(keyed_request("c"))
        .await;
    let err = result.expect_err("full");
    assert!(matches!(
        err.downcast_ref::<KeyedError>(),
        Some(KeyedError::Full(_))
    ));
    // One second later both buckets are full again: a new key evicts them (no idle wait).
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(now_or_never(&keyed, "c").await);
    assert!(keyed.len() <= 2);
    assert!(keyed.stats().evicted >= 1);
}

/// One step of the differential property.
#[derive(Clone, Debug)]
enum Step {
    /// Acquire on key `k`, not waiting; a retry when `retry`.
    Acquire { k: u8, retry: bool, cost: u32 },
    /// A server's cooldown on key `k`.
    Defer { k: u8, secs: u64 },
    /// A request on key `k` through the stack, not waiting, answered with a 429 and
    /// `Retry-After: {secs}` when admitted.
    Throttled { k: u8, secs: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0u8..4, any::<bool>(), 0u32..30).prop_map(|(k, retry, cost)| Step::Acquire { k, retry, cost }),
        1 => (0u8..4, 1u64..5).prop_map(|(k, secs)| Step::Defer { k, secs }),
        1 => (0u8..4, 1u64..5).prop_map(|(k, secs)| Step::Throttled { k, secs }),
    ]
}

/// The invariant behind every rule above: a registry that evicts as eagerly as it may
/// admits exactly what one allowance per key kept forever admits, step for step.
#[test]
fn eager_eviction_admits_exactly_what_never_evicting_does() {
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        proptest::collection::vec((0u64..1_500, step()), 1..150),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(steps, fixed)| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("runtime");
            rt.block_on(async {
                // (A replenishing budget is left out: a fresh one restarts its window's slots
                // at its creation, so it may refuse a retry the old one would admit; stricter,
                // never looser. See the test below.)
                let budget = if fixed {
                    RetryBudgetConfig::fixed(2)
                } else {
                    RetryBudgetConfig::Unlimited
                };
                let config = AllowanceConfig::per_second(4, 2)
                    .and_then(|c| c.with_limit(Limit::per_second(40, 40)?.counting_cost()))
                    .expect("valid")
                    .with_retry_budget(budget);
                let keyed = eager(config.clone());
                let mut kept: HashMap<u8, Allowance> = HashMap::new();
                for (i, (gap_ms, step)) in steps.into_iter().enumerate() {
                    tokio::time::advance(Duration::from_millis(gap_ms)).await;
                    sweep(&keyed);
                    match step {
                        Step::Acquire { k, retry, cost } => {
                            let options = AcquireOptions::new()
                                .retry(retry)
                                .cost(cost)
                                .deadline(Instant::now() + Duration::from_micros(1));
                            let key = format!("k{k}");
                            let plain = kept
                                .entry(k)
                                .or_insert_with(|| Allowance::new(config.clone()));
                            let want = plain
                                .acquire_with(options)
                                .await
                                .map_err(|e| e.abandon_reason());
                            let handle = keyed.get(&key).expect("capacity");
                            let got = handle
                                .allowance()
                                .acquire_with(options)
                                .await
                                .map_err(|e| e.abandon_reason());
                            prop_assert_eq!(got, want, "step #{} on {}", i, key);
                        }
                        Step::Defer { k, secs } => {
                            let plain = kept
                                .entry(k)
                                .or_insert_with(|| Allowance::new(config.clone()));
                            plain
                                .extend_cooldown(Duration::from_secs(secs))
                                .await
                                .expect("defer");
                            let handle = keyed.get(format!("k{k}")).expect("capacity");
                            handle
                                .allowance()
                                .extend_cooldown(Duration::from_secs(secs))
                                .await
                                .expect("defer");
                        }
                        Step::Throttled { k, secs } => {
                            let plain = kept
                                .entry(k)
                                .or_insert_with(|| Allowance::new(config.clone()));
                            let request = || {
                                let mut req = post(&format!("k{k}"), Some(secs));
                                req.extensions_mut()
                                    .insert(Deadline(Instant::now() + Duration::from_micros(1)));
                                req
                            };
                            let want = ServiceBuilder::new()
                                .layer(plain.layer())
                                .service(recording(Seen::default()))
                                .oneshot(request())
                                .await;
                            let got = ServiceBuilder::new()
                                .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
                                .service(recording(Seen::default()))
                                .oneshot(request())
                                .await;
                            prop_assert_eq!(
                                Outcome::of(&got),
                                Outcome::of(&want),
                                "step #{} on k{}",
                                i,
                                k
                            );
                        }
                    }
                }
                Ok(())
            })
        })
        .expect("eviction never changes a decision");
}

// === Redis ===

fn real() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

const SECRET_KEYS: [&str; 3] = [
    "sk-live-TENANTA-4242",
    "sk-live-TENANTB-7777",
    "Bearer tok-TENANTC-9999",
];

/// Streams `MONITOR` output until `stop` is told, and returns it.
async fn monitor(
    url: &str,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> String {
    let addr = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    stream.write_all(b"MONITOR\r\n").await.expect("monitor");
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    let n = stream.read(&mut buf).await.expect("+OK");
    out.extend_from_slice(&buf[..n]);
    let _ = ready.send(());
    loop {
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            },
            _ = &mut stop => {
                // Drain what is already there.
                while let Ok(Ok(n)) = tokio::time::timeout(100 * MS, stream.read(&mut buf)).await {
                    if n == 0 { break; }
                    out.extend_from_slice(&buf[..n]);
                }
                break;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn no_key_material_reaches_redis() {
    real().block_on(async {
        let redis = TestRedis::start_private().await;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let url = redis.url().to_owned();
        let watching = tokio::spawn(async move { monitor(&url, stop_rx, ready_tx).await });
        ready_rx.await.expect("monitoring");

        let base = RedisStore::connect(
            redis.url(),
            &unique_name("tenants"),
            RedisStoreOptions::new(),
        )
        .await
        .expect("connect");
        let keyed = Keyed::builder(
            KeyedConfig::new(per_second(50, 2)).with_override(SECRET_KEYS[0], per_second(100, 3)),
        )
        .secret(KeySecret::derive(b"the proxy's secret, 32 bytes long").expect("valid"))
        .name_prefix("tenants")
        .stores(SharedStores(move |name: &str| base.for_allowance(name)))
        .build()
        .expect("valid");
        let svc = ServiceBuilder::new()
            .layer(KeyedLayer::new(keyed.clone(), key::authorization()))
            .service(service_fn(|_req: Request<String>| async {
                let mut res = Response::new(String::new());
                *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                res.headers_mut()
                    .insert("retry-after", http::HeaderValue::from_static("0"));
                Ok::<_, Infallible>(res)
            }));
        for k in SECRET_KEYS {
            for _ in 0..3 {
                let req = Request::builder()
                    .header("authorization", k)
                    .body(String::new())
                    .expect("request");
                let _ = svc.clone().oneshot(req).await;
            }
        }
        // A cooldown and a clear too (they publish events on the key's channel).
        let h = keyed.get(SECRET_KEYS[1]).expect("live");
        h.allowance()
            .extend_cooldown(Duration::from_millis(200))
            .await
            .expect("defer");
        h.allowance().clear().await.expect("clear");

        let keys = redis.command(&["KEYS", "*"]).await;
        let _ = stop_tx.send(());
        let monitored = watching.await.expect("monitor task");

        for k in SECRET_KEYS {
            let name = keyed.name_of(k);
            assert!(keys.contains(&name), "{name} in KEYS: {keys}");
            assert!(monitored.contains(&name), "the monitor saw the calls");
            for part in [k, &k[3..], "TENANT"] {
                assert!(
                    !keys.contains(part),
                    "key material {part:?} in KEYS: {keys}"
                );
                assert!(
                    !monitored.contains(part),
                    "key material {part:?} in MONITOR output"
                );
            }
        }
        assert!(
            monitored.contains("FCALL") || monitored.contains("fcall"),
            "{monitored}"
        );
    });
}

#[test]
fn a_shared_store_keeps_the_state_across_an_eviction() {
    real().block_on(async {
        let redis = TestRedis::start().await;
        let base = RedisStore::connect(
            redis.url(),
            &unique_name("tenants"),
            RedisStoreOptions::new(),
        )
        .await
        .expect("connect");
        let config = per_second(1, 1).with_retry_budget(RetryBudgetConfig::fixed(1));
        let keyed = Keyed::builder(KeyedConfig::new(config).with_idle_timeout(Duration::ZERO))
            // A secret of its own: names no earlier run on a shared server used.
            .secret(KeySecret::derive(unique_name("secret").as_bytes()).expect("valid"))
            .name_prefix("evict")
            .stores(SharedStores(move |name: &str| base.for_allowance(name)))
            .build()
            .expect("valid");
        let k = keyed.get("k").expect("live");
        k.allowance()
            .acquire_with(AcquireOptions::new().retry(true))
            .await
            .expect("the one retry");
        drop(k);
        // Nothing in this process holds it: a shared store's allowance is evicted at once...
        assert_eq!(sweep(&keyed), 1);
        assert!(keyed.is_empty());
        // ...and the next handle finds the state in Redis: no token, no retry left.
        let k = keyed.get("k").expect("live");
        let state = k.allowance().store_state().await.expect("state");
        assert_eq!(state.retries_remaining, Some(0));
        let soon = AcquireOptions::new().deadline(Instant::now() + 100 * MS);
        let refused = k.allowance().acquire_with(soon).await;
        assert_eq!(
            refused.err().and_then(|e| e.abandon_reason()),
            Some(AbandonReason::Deadline)
        );
        drop(k);

        // A 429's cooldown, raised through the stack, survives the eviction the same way.
        let svc = ServiceBuilder::new()
            .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
            .service(recording(Seen::default()));
        let throttled = svc.clone().oneshot(post("c", Some(30))).await;
        assert_eq!(
            throttled.ok().map(|r| r.status()),
            Some(StatusCode::TOO_MANY_REQUESTS)
        );
        assert_eq!(sweep(&keyed), 2, "nothing holds either allowance");
        let c = keyed.get("c").expect("live");
        let state = c.allowance().store_state().await.expect("state");
        assert!(
            state.blocked_for > Duration::from_secs(29),
            "the cooldown is in Redis: {state:?}"
        );
    });
}

/// Issue 28, bug 1, on a shared store: a clone keeps its key in the registry there too (the
/// clone's waiters and the cooldown it knows of are this process's), its 429's cooldown, in
/// Redis, holds the keyed layer's request, and once the clone is gone the key is evicted at
/// once with the cooldown kept in Redis.
#[test]
fn a_clone_keeps_its_key_on_a_shared_store_too() {
    real().block_on(async {
        let redis = TestRedis::start().await;
        let base = RedisStore::connect(
            redis.url(),
            &unique_name("tenants"),
            RedisStoreOptions::new(),
        )
        .await
        .expect("connect");
        let keyed =
            Keyed::builder(KeyedConfig::new(per_second(10, 10)).with_idle_timeout(Duration::ZERO))
                .secret(KeySecret::derive(unique_name("secret").as_bytes()).expect("valid"))
                .name_prefix("clone")
                .stores(SharedStores(move |name: &str| base.for_allowance(name)))
                .build()
                .expect("valid");
        let seen = Seen::default();
        let clone = keyed.get("k").expect("live").allowance().clone();
        let plain = ServiceBuilder::new()
            .layer(clone.layer())
            .service(recording(seen.clone()));
        assert_eq!(sweep(&keyed), 0, "the clone holds the key");
        let throttled = plain.clone().oneshot(post("k", Some(30))).await;
        assert_eq!(
            throttled.ok().map(|r| r.status()),
            Some(StatusCode::TOO_MANY_REQUESTS)
        );
        let svc = ServiceBuilder::new()
            .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
            .service(recording(seen.clone()));
        let mut req = post("k", None);
        req.extensions_mut()
            .insert(Deadline(Instant::now() + Duration::from_secs(1)));
        let held = svc.clone().oneshot(req).await;
        assert_eq!(
            Outcome::of(&held),
            Outcome::Abandoned(AbandonReason::Deadline),
            "the 30 s cooldown is beyond the request's deadline"
        );
        assert_eq!(seen.lock().expect("seen").len(), 1, "only the clone's 429");
        assert_eq!(keyed.stats().created, 1);
        drop((plain, clone));
        assert_eq!(
            sweep(&keyed),
            1,
            "nothing holds it now: the state is in Redis"
        );
        let k = keyed.get("k").expect("live");
        let state = k.allowance().store_state().await.expect("state");
        assert!(
            state.blocked_for > Duration::from_secs(25),
            "the cooldown is in Redis: {state:?}"
        );
    });
}

/// Outage × keyed: a keyed registry over a Redis that stops. With `OutagePolicy::FailFast`
/// every key's request fails at once as a store failure (nothing reaches the upstream
/// without its admission, an existing key and a new one alike); once Redis is back, both
/// keys are admitted again through the same registry.
#[test]
fn a_keyed_registry_over_a_stopped_redis_fails_fast_and_recovers() {
    real().block_on(async {
        let mut redis = TestRedis::start_private().await;
        let base = RedisStore::connect(
            redis.url(),
            &unique_name("outage"),
            RedisStoreOptions::new().connect_timeout(Duration::from_secs(2)),
        )
        .await
        .expect("connect");
        let config =
            per_second(100, 100).with_outage_policy(tower_allowance::OutagePolicy::FailFast);
        let keyed = Keyed::builder(KeyedConfig::new(config))
            .secret(KeySecret::derive(unique_name("secret").as_bytes()).expect("valid"))
            .name_prefix("outage")
            .stores(SharedStores(move |name: &str| base.for_allowance(name)))
            .build()
            .expect("valid");
        let seen = Seen::default();
        let svc = ServiceBuilder::new()
            .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
            .service(recording(seen.clone()));
        let ok = svc.clone().oneshot(keyed_request("a")).await;
        assert_eq!(Outcome::of(&ok), Outcome::Completed);

        redis.kill();
        for key in ["a", "b"] {
            // Fail fast: at most the 2 s connect timeout (a default `Wait` policy would hold
            // it for 60 s); 10 s leaves a margin of 8 s for load.
            let asked = Instant::now();
            let refused = svc.clone().oneshot(keyed_request(key)).await;
            assert_eq!(
                Outcome::of(&refused),
                Outcome::Failed,
                "{key}: a store failure"
            );
            assert!(
                asked.elapsed() < Duration::from_secs(10),
                "{key}: {:?}",
                asked.elapsed()
            );
        }
        assert_eq!(
            seen.lock().expect("seen").len(),
            1,
            "nothing sent without admission"
        );

        redis.restart().await;
        // The store reconnects by itself; a lower bound only (load can only make it later).
        let started = Instant::now();
        for key in ["a", "b"] {
            loop {
                let result = svc.clone().oneshot(keyed_request(key)).await;
                if Outcome::of(&result) == Outcome::Completed {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "{key}: not admitted again within a minute of the restart"
                );
                tokio::time::sleep(100 * MS).await;
            }
        }
        let sent: Vec<String> = seen
            .lock()
            .expect("seen")
            .iter()
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(sent, ["a", "a", "b"]);
    });
}
