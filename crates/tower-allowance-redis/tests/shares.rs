//! Shares of one allowance on Redis (feature `shares` of tower-allowance): still one store
//! call per admission with classes, a high one included, for two allowances (two processes'
//! worth) sharing one Redis allowance. Real time, a private server; counted with
//! `INFO commandstats`, as `../shared/acceptance/22-shares` counts.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use tower_allowance::{
    shares::{Class, Share},
    AcquireOptions, Allowance, AllowanceConfig,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

/// The calls of `cmd` in an `INFO commandstats` reply.
fn calls(stats: &str, cmd: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The script calls `redis` answered (since the last `CONFIG RESETSTAT`), and the stats.
async fn store_calls(redis: &TestRedis) -> (u64, String) {
    let client = redis::Client::open(redis.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let n = calls(&stats, "fcall") + calls(&stats, "evalsha") + calls(&stats, "eval");
    (n, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_store_call_per_classed_admission_across_two_allowances() {
    let redis = TestRedis::start_private().await;
    let name = unique_name("shares-calls");
    // 400/s, burst 4: weights 2:1 and a high class, every caller waiting its turn.
    let config = || -> AllowanceConfig {
        AllowanceConfig::per_second(400, 4)
            .and_then(|c| c.with_class("bulk", Share::weight(2)?))
            .and_then(|c| c.with_class("batch", Share::weight(1)?))
            .and_then(|c| c.with_class("urgent", Share::weight(1)?.high()))
            .expect("classes")
    };
    let mut allowances = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect(redis.url(), &name, RedisStoreOptions::new())
            .await
            .expect("connect");
        allowances.push(Allowance::with_store(config(), store));
    }
    // Each store's first call loads nothing more: warm both up, then count from zero.
    for a in &allowances {
        a.acquire().await.expect("admitted");
    }
    redis.command(&["CONFIG", "RESETSTAT"]).await;
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    // Per allowance: 12 bulk and 6 batch workers of 10 admissions each, and one urgent caller
    // of 10: 380 admissions in all.
    for allowance in &allowances {
        for (class, workers) in [("bulk", 12), ("batch", 6), ("urgent", 1)] {
            for _ in 0..workers {
                let (a, admitted) = (allowance.clone(), admitted.clone());
                tasks.push(tokio::spawn(async move {
                    let class = Class::new(class);
                    for _ in 0..10 {
                        a.acquire_with(AcquireOptions::new().class(&class))
                            .await
                            .expect("admitted");
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
    }
    for t in tasks {
        t.await.expect("joined");
    }
    let (store_calls, stats) = store_calls(&redis).await;
    let admissions = admitted.load(Ordering::Relaxed);
    assert_eq!(admissions, 380);
    let per = store_calls as f64 / admissions as f64;
    eprintln!(
        "{store_calls} store calls for {admissions} classed admissions: {per:.3} per admission"
    );
    assert!(per <= 1.05, "{per:.3} calls per admission: {stats}");
    // Every class was admitted in both allowances.
    for a in &allowances {
        let snap = a.snapshot();
        for c in &snap.classes {
            let want = match c.name.as_str() {
                "bulk" => 120,
                "batch" => 60,
                "urgent" => 10,
                _ => 1,
            };
            assert_eq!(c.admitted, want, "{snap:?}");
        }
    }
}

/// With leases, the classes share the leased tokens (feature `lease`): two allowances (two
/// processes' worth) on one Redis allowance, weights 3:1 in each, far fewer store calls than
/// admissions, and the weights held in each process while both its classes wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_classes_share_by_weight_in_far_fewer_store_calls() {
    use tower_allowance::lease::{Lease, LeaseStore};
    let redis = TestRedis::start_private().await;
    let name = unique_name("shares-lease");
    let config = || -> AllowanceConfig {
        AllowanceConfig::per_second(400, 4)
            .and_then(|c| c.with_class("bulk", Share::weight(3)?))
            .and_then(|c| c.with_class("batch", Share::weight(1)?))
            .expect("classes")
    };
    let mut allowances = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect(redis.url(), &name, RedisStoreOptions::new())
            .await
            .expect("connect");
        allowances.push(Allowance::with_store(
            config(),
            LeaseStore::new(store, Lease::auto()),
        ));
    }
    redis.command(&["CONFIG", "RESETSTAT"]).await;
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // Per allowance: 10 workers of each class, 30 admissions each: 1,200 in all.
    for (pi, allowance) in allowances.iter().enumerate() {
        for class in ["bulk", "batch"] {
            for _ in 0..10 {
                let (a, log) = (allowance.clone(), log.clone());
                tasks.push(tokio::spawn(async move {
                    let class = Class::new(class);
                    for _ in 0..30 {
                        a.acquire_with(AcquireOptions::new().class(&class))
                            .await
                            .expect("admitted");
                        log.lock()
                            .expect("lock")
                            .push(format!("{}{}", class.name(), pi));
                    }
                }));
            }
        }
    }
    for t in tasks {
        t.await.expect("joined");
    }
    let (store_calls, stats) = store_calls(&redis).await;
    let log = log.lock().expect("lock").clone();
    assert_eq!(log.len(), 1_200);
    let per = store_calls as f64 / 1_200.0;
    eprintln!(
        "{store_calls} store calls for 1,200 leased classed admissions: {per:.3} per admission"
    );
    assert!(per <= 0.2, "{per:.3} calls per admission: {stats}");
    // Each process shares its own tokens: 3:1 while both its classes wait (its first 400;
    // the two processes' leases follow their own rates, not each other's).
    for p in ["0", "1"] {
        let mine: Vec<_> = log.iter().filter(|c| c.ends_with(p)).take(400).collect();
        let bulk = mine.iter().filter(|c| c.starts_with("bulk")).count();
        assert!(
            (bulk as i64 - 300).abs() <= 8,
            "process {p}: bulk {bulk} of its first 400"
        );
    }
}
