//! The fallback's switch-over events: one WARN when Redis fails, one INFO when it is back.
//! In its own test binary: `tracing`'s per-callsite interest cache is process-wide, and
//! other tests hitting the same callsites without a subscriber would race with this one.

use std::{
    num::NonZeroU32,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::{
    rule::AdmitRequest,
    rule::{Admission, Op, Reply},
    store::{Store, StoreError},
    AllowanceConfig,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    FailurePolicy, RedisStore, RedisStoreOptions,
};

const PROBE: Duration = Duration::from_millis(100);

fn options(policy: FailurePolicy) -> RedisStoreOptions {
    RedisStoreOptions::new()
        .timeout(Duration::from_millis(200))
        .probe_interval(PROBE)
        .failure_policy(policy)
}

async fn admit(store: &RedisStore, config: &AllowanceConfig) -> Result<Admission, StoreError> {
    let op = Op::Admit(AdmitRequest::first()).into();
    match store.apply(config.params(), op).await?.into() {
        Reply::Admit(a) => Ok(a),
        other => panic!("{other:?}"),
    }
}

async fn until_redis_answers(store: &RedisStore, config: &AllowanceConfig) {
    let started = Instant::now();
    loop {
        let read = (store.apply(config.params(), Op::Read { deposits: 0 }.into())).await;
        if read.is_ok() && !store.is_degraded() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "redis did not come back"
        );
        tokio::time::sleep(PROBE).await;
    }
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
    let mut redis = TestRedis::start_private().await;
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
    admit(&store, &config).await.expect("up");
    assert_eq!(events.count(tracing::Level::WARN), 0);

    redis.kill();
    for _ in 0..5 {
        let decision = admit(&store, &config).await;
        assert!(matches!(decision, Ok(Admission::Admitted)), "{decision:?}");
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
