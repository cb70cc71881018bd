//! Memory per idle key in a `Keyed` registry, and memory flat after eviction: 100,000 keys
//! churned through a registry of 10,000, counted by a global allocator.
//!
//! `cargo test --release -p integration-tests --test keyed_memory -- --nocapture` prints the
//! figures.

use std::time::Duration;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower_allowance::{
    keyed::{Keyed, KeyedConfig},
    Allowance, AllowanceConfig,
};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const CAPACITY: usize = 10_000;
const CHURNED: usize = 100_000;

/// Net heap bytes held now, relative to when `region` started (reallocations are already
/// in both sums).
fn live_bytes(region: &Region<'_, std::alloc::System>) -> i64 {
    let s = region.change();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64
}

/// A key like an API key (40 bytes).
fn api_key(i: usize) -> String {
    format!("sk-live-{i:032x}")
}

async fn admit_once(keyed: &Keyed, i: usize) {
    let handle = keyed.get(api_key(i)).expect("room for the key");
    handle.allowance().acquire().await.expect("admitted");
}

#[test]
fn memory_per_idle_key_and_flat_after_eviction() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        // 10/s, burst 10: a key used once is safe to evict a second later.
        let config = KeyedConfig::new(AllowanceConfig::per_second(10, 10).expect("valid"))
            .with_capacity(CAPACITY)
            .expect("valid")
            .with_idle_timeout(Duration::from_secs(3_600));
        let region = Region::new(GLOBAL);
        // For comparison: a plain allowance of the same configuration.
        let plain: Vec<Allowance> = (0..1_000)
            .map(|_| Allowance::new(config.default_config().clone()))
            .collect();
        let per_allowance = live_bytes(&region) as f64 / 1_000.0;
        drop(plain);
        let region = Region::new(GLOBAL);
        let keyed = Keyed::new(config);
        let empty = live_bytes(&region);
        for i in 0..CAPACITY {
            admit_once(&keyed, i).await;
        }
        assert_eq!(keyed.len(), CAPACITY);
        let full = live_bytes(&region);
        let per_key = (full - empty) as f64 / CAPACITY as f64;
        println!(
            "memory per idle key: {per_key:.0} bytes ({CAPACITY} keys: {} KiB); a plain Allowance: {per_allowance:.0} bytes",
            (full - empty) / 1024
        );
        assert!(per_key > 100.0, "the counter sees the allowances");

        // Churn: every batch of 10,000 new keys arrives once the previous batch is safe to
        // evict (its buckets full again); each new key at capacity evicts the settled ones.
        let mut levels = vec![];
        for batch in 1..CHURNED / CAPACITY {
            tokio::time::advance(Duration::from_secs(2)).await;
            for i in batch * CAPACITY..(batch + 1) * CAPACITY {
                admit_once(&keyed, i).await;
            }
            assert!(keyed.len() <= CAPACITY);
            levels.push(live_bytes(&region));
        }
        let stats = keyed.stats();
        assert_eq!(stats.created as usize, CHURNED);
        assert_eq!(stats.refused, 0);
        assert!(stats.evicted as usize >= CHURNED - CAPACITY, "{stats:?}");
        let max = levels.iter().copied().max().unwrap_or(0);
        let min = levels.iter().copied().min().unwrap_or(0);
        println!(
            "after churning {CHURNED} keys: {} to {} KiB live (full registry: {} KiB); {} evicted; by batch: {:?} KiB",
            min / 1024,
            max / 1024,
            full / 1024,
            stats.evicted,
            levels.iter().map(|l| l / 1024).collect::<Vec<_>>()
        );
        // Flat: never more than the full registry plus 1%. (The map keeps its table; erased
        // slots may make hashbrown double it once, about 400 KiB here, then it stays.)
        assert!(max <= full + full / 100, "{levels:?} vs {full}");
    });
}
