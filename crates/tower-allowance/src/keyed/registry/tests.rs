use std::time::Duration;

use super::*;
use crate::{classify::StatusClassifier, AcquireOptions, Limit, RetryBudgetConfig};

fn per_second(rate: u32, burst: u32) -> AllowanceConfig {
    AllowanceConfig::per_second(rate, burst).expect("valid")
}

/// Whether the registry would evict `key` now.
fn evictable(keyed: &Keyed, key: &str) -> bool {
    let map = keyed.inner.read();
    let entry = map.get(key.as_bytes()).expect("live");
    keyed.inner.evictable(entry, Instant::now())
}

/// An entry holds exactly the handles [`own_sharers`] counted on the default configuration,
/// whatever the key's own: fewer would let a clone go unseen, more would keep every key
/// for good.
#[tokio::test(start_paused = true)]
async fn an_entry_holds_what_own_sharers_counted_whatever_its_configuration() {
    let overrides = [
        per_second(1, 1)
            .with_limit(Limit::per_day(3, 3).expect("valid"))
            .expect("valid"),
        per_second(5, 5).with_retry_budget(RetryBudgetConfig::fixed(2)),
        per_second(5, 5)
            .with_max_cooldown(Duration::from_secs(1))
            .expect("valid"),
        per_second(5, 5).with_classifier(StatusClassifier::default().throttled([420])),
        per_second(5, 5).with_retry(RetryConfig::default()),
    ];
    let mut config = KeyedConfig::new(per_second(10, 10));
    for (i, c) in overrides.into_iter().enumerate() {
        config = config.with_override(format!("k{i}"), c);
    }
    let keyed = Keyed::new(config);
    for key in ["default", "k0", "k1", "k2", "k3", "k4"] {
        let entry = keyed.inner.lookup(key.as_bytes()).expect("live");
        assert_eq!(entry.allowance.sharers(), keyed.inner.own_sharers, "{key}");
        drop(entry);
        assert!(evictable(&keyed, key), "{key}: nothing else holds it");
    }
}

/// Every holder of the allowance's state outside the registry keeps the key: a clone, and
/// an admission not yet started (`acquire_owned`, holding the state, not the entry).
#[tokio::test(start_paused = true)]
async fn a_clone_or_an_owned_acquire_keeps_the_key_until_dropped() {
    let keyed = Keyed::new(KeyedConfig::new(per_second(100, 100)));
    let clone = keyed.get("k").expect("live").allowance().clone();
    assert!(!evictable(&keyed, "k"), "a clone");
    let acquire = clone.acquire_owned(AcquireOptions::new());
    drop(clone);
    assert!(!evictable(&keyed, "k"), "an owned acquire");
    drop(acquire);
    assert!(evictable(&keyed, "k"));
}
