//! Redis failing under a running allowance: killed, hung, restarted, scripts flushed. Every
//! call answers within its timeout, as the failure policy says, and coordination resumes by
//! itself. Each test owns a private `redis-server` it can kill. Real time.

use std::{
    error::Error,
    num::NonZeroU32,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::{
    error::AcquireError,
    store::{Admit, Decision, Store, StoreError},
    Allowance, AllowanceConfig,
};
use tower_allowance_redis::{
    error::{CallError, CallErrorKind},
    test_util::{unique_name, TestRedis},
    FailurePolicy, RedisStore, RedisStoreOptions,
};

const MS: Duration = Duration::from_millis(1);
const TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling slack on a shared 2-core machine.
const SLACK: Duration = Duration::from_millis(150);
const PROBE: Duration = Duration::from_millis(100);

fn options(policy: FailurePolicy) -> RedisStoreOptions {
    RedisStoreOptions::new()
        .timeout(TIMEOUT)
        .probe_interval(PROBE)
        .failure_policy(policy)
}

fn call_error(e: &StoreError) -> CallErrorKind {
    e.source()
        .and_then(|s| s.downcast_ref::<CallError>())
        .map(CallError::kind)
        .expect("a redis store call error")
}

/// Asks until Redis answers again, bounded: coordination resumes by itself.
async fn until_redis_answers(store: &RedisStore, config: &AllowanceConfig) -> Duration {
    let started = Instant::now();
    loop {
        if store.state(config).await.is_ok() && !store.is_degraded() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "redis did not come back"
        );
        tokio::time::sleep(PROBE).await;
    }
}

#[tokio::test]
async fn fail_closed_fails_fast_then_recovers() {
    let Some(mut redis) = TestRedis::start_private().await else {
        return;
    };
    let name = unique_name("fail-closed");
    let store = RedisStore::connect(redis.url(), &name, options(FailurePolicy::FailClosed))
        .await
        .expect("connect");
    let config = AllowanceConfig::per_second(1_000, 100).expect("valid");
    let allowance = Allowance::with_store(config.clone(), store.clone());
    allowance.acquire().await.expect("redis is up");

    redis.kill();
    let mut kinds = vec![];
    for _ in 0..6 {
        let started = Instant::now();
        let err = store
            .admit(&config, Admit::first())
            .await
            .expect_err("redis is down: fail closed");
        let took = started.elapsed();
        assert!(took <= TIMEOUT + SLACK, "a call took {took:?}");
        kinds.push(call_error(&err));
    }
    eprintln!("fail-closed errors while redis is down: {kinds:?}");
    // The layers report it as the typed StoreUnavailable, also within the timeout.
    let started = Instant::now();
    let err = allowance.acquire().await.expect_err("fail closed");
    assert!(started.elapsed() <= TIMEOUT + SLACK);
    assert!(matches!(err, AcquireError::Store(_)), "{err:?}");
    assert_eq!(err.to_string(), "allowance store unavailable");
    assert!(store.is_degraded());

    redis.restart().await;
    let took = until_redis_answers(&store, &config).await;
    eprintln!("fail-closed store answered again {took:?} after the restart");
    // Coordination resumed: another process sees this one's cooldown.
    allowance.defer(1_000 * MS).await.expect("defer");
    let other = RedisStore::connect(redis.url(), &name, options(FailurePolicy::FailClosed))
        .await
        .expect("connect");
    match other.admit(&config, Admit::first()).await.expect("redis") {
        Decision::Wait { cooldown, .. } => assert!(cooldown),
        d => panic!("the shared cooldown holds: {d:?}"),
    }
}

#[tokio::test]
async fn a_hung_redis_times_out() {
    let Some(mut redis) = TestRedis::start_private().await else {
        return;
    };
    let store = RedisStore::connect(
        redis.url(),
        &unique_name("hung"),
        options(FailurePolicy::FailClosed),
    )
    .await
    .expect("connect");
    let config = AllowanceConfig::per_second(1_000, 100).expect("valid");
    store.admit(&config, Admit::first()).await.expect("up");
    redis.freeze();
    let started = Instant::now();
    let err = store
        .admit(&config, Admit::first())
        .await
        .expect_err("no answer");
    let took = started.elapsed();
    redis.thaw();
    assert_eq!(call_error(&err), CallErrorKind::Timeout);
    assert!(
        took >= TIMEOUT && took <= TIMEOUT + SLACK,
        "timed out after {took:?}"
    );
    until_redis_answers(&store, &config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fallback_keeps_admitting_at_the_divided_rate() {
    let Some(mut redis) = TestRedis::start_private().await else {
        return;
    };
    // 20/s shared by 2 expected processes: the fallback admits 10/s, burst 1.
    let config = AllowanceConfig::per_second(20, 2).expect("valid");
    let policy = FailurePolicy::LocalFallback {
        expected_processes: NonZeroU32::new(2).expect("non-zero"),
    };
    let name = unique_name("fallback");
    let store = RedisStore::connect(redis.url(), &name, options(policy))
        .await
        .expect("connect");
    let allowance = Allowance::with_store(config.clone(), store.clone());
    allowance.acquire().await.expect("redis is up");
    assert!(!store.is_degraded());

    redis.kill();
    let started = Instant::now();
    const N: u32 = 10;
    for _ in 0..N {
        let one = Instant::now();
        allowance.acquire().await.expect("the fallback admits");
        assert!(one.elapsed() <= 100 * MS + TIMEOUT + SLACK, "no hang");
    }
    let took = started.elapsed();
    assert!(store.is_degraded());
    // The first fallback admission may take the whole burst of 1 at once; the other N-1
    // wait one fallback interval (100 ms) each: never faster than the divided rate.
    eprintln!("{N} fallback admissions in {took:?} (10/s expected)");
    assert!(
        took >= 100 * MS * (N - 1) - 20 * MS,
        "faster than the fallback: {took:?}"
    );
    assert!(
        took <= 100 * MS * N + TIMEOUT + 4 * SLACK,
        "slower than the fallback: {took:?}"
    );

    redis.restart().await;
    let took = until_redis_answers(&store, &config).await;
    eprintln!("fallback store back on redis {took:?} after the restart");
    // Coordination resumed: decisions are shared again (state written to Redis), and the
    // probe that found Redis back reloaded the scripts the restart lost: one round trip.
    let before = store.round_trips();
    allowance.acquire().await.expect("admitted");
    assert_eq!(store.round_trips() - before, 1);
    assert!(redis.command(&["EXISTS", store.key()]).await.ends_with('1'));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_is_invisible() {
    let Some(redis) = TestRedis::start_private().await else {
        return;
    };
    let store = RedisStore::connect(
        redis.url(),
        &unique_name("flush"),
        options(FailurePolicy::FailClosed),
    )
    .await
    .expect("connect");
    let config = AllowanceConfig::per_second(100_000, 10_000).expect("valid");

    // One flush, counted: EVALSHA -> NOSCRIPT, SCRIPT LOAD, EVALSHA; then one again.
    store.admit(&config, Admit::first()).await.expect("up");
    assert_eq!(redis.command(&["SCRIPT", "FLUSH"]).await, "+OK");
    let before = store.round_trips();
    store
        .admit(&config, Admit::first())
        .await
        .expect("reloaded transparently");
    assert_eq!(store.round_trips() - before, 3);
    let before = store.round_trips();
    store.admit(&config, Admit::first()).await.expect("up");
    assert_eq!(store.round_trips() - before, 1);

    // Flushes racing with 16 tasks admitting through an allowance: no caller sees an error.
    let allowance = Allowance::with_store(config.clone(), store.clone());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let allowance = allowance.clone();
        tasks.spawn(async move {
            for _ in 0..50 {
                allowance
                    .acquire()
                    .await
                    .expect("no error reaches the caller");
            }
        });
    }
    // A flush every 10 ms while they run (pacing the fault, not waiting for anything).
    let mut flushes = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while !tasks.is_empty() {
        tick.tick().await;
        assert_eq!(redis.command(&["SCRIPT", "FLUSH"]).await, "+OK");
        flushes += 1;
        while let Some(done) = tasks.try_join_next() {
            done.expect("task");
        }
    }
    eprintln!(
        "800 admissions with {flushes} SCRIPT FLUSHes: {} round trips",
        store.round_trips()
    );
    assert!(flushes > 1);
    assert_eq!(allowance.snapshot().admitted, 800);
    assert!(!store.is_degraded());
}

/// Records this crate's events (level only), for the switch-over warnings.
#[derive(Default)]
struct Events(Mutex<Vec<tracing::Level>>);

impl Events {
    fn count(&self, level: tracing::Level) -> usize {
        let events = self.0.lock().expect("lock");
        events.iter().filter(|l| **l == level).count()
    }
}

impl tracing::Subscriber for Events {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("tower_allowance_redis")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        self.0.lock().expect("lock").push(*event.metadata().level());
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test(flavor = "current_thread")]
async fn switching_to_the_fallback_warns_once_and_back_informs_once() {
    let Some(mut redis) = TestRedis::start_private().await else {
        return;
    };
    let events = Arc::new(Events::default());
    // This thread runs the whole test (and the store's background probes).
    let _guard = tracing::subscriber::set_default(events.clone());
    let policy = FailurePolicy::LocalFallback {
        expected_processes: NonZeroU32::new(2).expect("non-zero"),
    };
    let store = RedisStore::connect(redis.url(), &unique_name("warn"), options(policy))
        .await
        .expect("connect");
    let config = AllowanceConfig::per_second(1_000, 100).expect("valid");
    store.admit(&config, Admit::first()).await.expect("up");
    assert_eq!(events.count(tracing::Level::WARN), 0);

    redis.kill();
    for _ in 0..5 {
        let decision = store.admit(&config, Admit::first()).await;
        assert!(
            matches!(decision, Ok(Decision::Admitted { .. })),
            "{decision:?}"
        );
    }
    assert_eq!(
        events.count(tracing::Level::WARN),
        1,
        "one warning per switch"
    );

    redis.restart().await;
    until_redis_answers(&store, &config).await;
    assert_eq!(events.count(tracing::Level::INFO), 1, "one event when back");
    assert_eq!(events.count(tracing::Level::WARN), 1);
}

#[tokio::test]
async fn the_fallback_honours_a_cooldown_raised_before_the_outage() {
    let Some(mut redis) = TestRedis::start_private().await else {
        return;
    };
    let policy = FailurePolicy::LocalFallback {
        expected_processes: NonZeroU32::new(4).expect("non-zero"),
    };
    let store = RedisStore::connect(redis.url(), &unique_name("fb-cooldown"), options(policy))
        .await
        .expect("connect");
    let config = AllowanceConfig::per_second(100, 10).expect("valid");
    let deferred = store.defer(&config, 2_000 * MS).await.expect("redis is up");
    assert!(deferred.extended);
    redis.kill();
    match store
        .admit(&config, Admit::first())
        .await
        .expect("fallback")
    {
        Decision::Wait { wait, cooldown } => {
            assert!(cooldown, "the local fallback knows the shared cooldown");
            assert!(wait > 1_500 * MS && wait <= 2_000 * MS, "{wait:?}");
        }
        d => panic!("admitted during a cooldown: {d:?}"),
    }
    assert!(store.is_degraded());
}
