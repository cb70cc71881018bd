//! Reserve, then settle (feature `settle`) on every store: random sequences of admissions
//! (classed or not, feature `shares`), settlements (with and without the provider's readings,
//! of a class or not, the provider refilling faster than the bucket or not), releases and cooldowns, applied at the same instants to the memory
//! store and to the Redis function and script, get identical replies (the settlement's events
//! included, and the classes' virtual times each class admission returns, which settlements
//! move) — `rule/settle.rs` and `lua/settle.lua` decide alike.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use proptest::{
    collection::vec,
    prelude::*,
    test_runner::{Config as ProptestConfig, TestRunner},
};
use tower_allowance::{
    cost::settle::Settlement,
    rule::{settle::Settle, Admission, AdmitRequest, Op, Reply, ShareReply, ShareRequest},
    store::{MemoryStore, Store},
    AllowanceConfig, Limit,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

fn runtime(paused: bool) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(paused)
        .build()
        .expect("runtime")
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u32..700, 0u64..2_000_000).prop_map(|(cost, max_wait)| {
            Op::Admit(AdmitRequest::first().cost(cost).max_wait(Duration::from_micros(max_wait)))
        }),
        // A class's admission (feature `shares`), high or not.
        3 => (1u32..700, 0u64..2_000_000, 0u8..3, 1u32..4, any::<bool>()).prop_map(
            |(cost, max_wait, class, weight, high)| {
                let admit = AdmitRequest::first().cost(cost).max_wait(Duration::from_micros(max_wait));
                Op::Share(ShareRequest::new(admit, class, weight).high(high))
            }
        ),
        5 => (1u32..700, 0u32..900, proptest::option::of((900u64..1_100, 0u64..1_100)), 0u64..400_000, class(), 0u32..40_000)
            .prop_map(|(reserved, used, reading, ago, (class, weight), excess)| {
                let mut s = Settle::used(reserved, used)
                    .sent(Duration::from_micros(ago))
                    .class(class, weight)
                    .refill_excess(excess);
                if let Some((limit, remaining)) = reading {
                    s = s.observed(limit, remaining);
                }
                Op::Settle(s)
            }),
        1 => (1u32..700, class()).prop_map(|(r, (class, weight))| Op::Settle(Settle::refused(r).class(class, weight))),
        1 => proptest::option::of(0u64..1_000_000).prop_map(|delay_us| Op::Defer { delay_us }),
        1 => (0u64..3).prop_map(|deposits| Op::Read { deposits }),
    ]
}

/// A settlement's class: none (weight 0), or one of three at weight 1 to 3.
fn class() -> impl Strategy<Value = (u8, u32)> {
    prop_oneof![Just((0, 0)), (0u8..3, 1u32..4)]
}

fn config() -> impl Strategy<Value = AllowanceConfig> {
    (0u8..4, 1u32..20, any::<bool>()).prop_map(|(rule, rps, second_cost)| {
        let settlement = match rule {
            0 => Settlement::learned(),
            1 => Settlement::all(),
            2 => Settlement::none(),
            _ => Settlement::share(0.4).learning(),
        };
        let mut config = AllowanceConfig::per_second(rps, rps)
            .expect("valid")
            .with_limit(
                Limit::per_second(1_000, 1_000)
                    .expect("valid")
                    .exact()
                    .counting_cost(),
            )
            .expect("two limits");
        if second_cost {
            config = config
                .with_limit(
                    Limit::per_minute(20_000, 5_000)
                        .expect("valid")
                        .counting_cost(),
                )
                .expect("three limits");
        }
        config.with_settlement(settlement)
    })
}

fn differential(functions: bool) {
    let (_redis, base) = runtime(false).block_on(async {
        let redis = TestRedis::start().await;
        let store = RedisStore::connect(
            redis.url(),
            &unique_name("settle"),
            RedisStoreOptions::new(),
        )
        .await
        .expect("connect");
        if !functions {
            store.without_functions();
        }
        (redis, store)
    });
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (config(), vec((0u64..300_000, op(), any::<bool>()), 1..100));
    runner
        .run(&strategy, |(config, ops)| {
            runtime(true).block_on(async {
                let redis = base
                    .for_allowance(&unique_name("settle"))
                    .expect("valid name");
                redis.follow_tokio_clock().expect("blocking connection");
                let memory = MemoryStore::new();
                let params = config.params();
                let mut last = None;
                for (i, (gap, op, release)) in ops.into_iter().enumerate() {
                    tokio::time::advance(Duration::from_micros(gap)).await;
                    let op = match (release, last.take()) {
                        (true, Some(r)) => Op::Release(r),
                        _ => op,
                    };
                    let now = tokio::time::Instant::now();
                    let want: Reply = memory
                        .try_apply(now, params, &op.into())
                        .expect("sync")
                        .expect("memory")
                        .into();
                    let got: Reply = redis
                        .try_apply(now, params, &op.into())
                        .expect("sync")
                        .expect("redis")
                        .into();
                    prop_assert_eq!(got, want, "op #{} {:?}", i, op);
                    if let (Reply::Settled(s), Op::Settle(op)) = (got, op) {
                        let n = usize::from(s.moved != 0) + 2 * usize::from(s.event.is_some());
                        SEEN[n].fetch_add(1, Ordering::Relaxed);
                        // A class moved (the next class admission's reply shows where).
                        if op.class_of().1 > 0 && op.class_units(s.moved) != 0 {
                            SEEN[2].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if let Reply::Admit(Admission::Reserved { reservation, .. })
                    | Reply::Share(ShareReply {
                        admission: Admission::Reserved { reservation, .. },
                        ..
                    }) = got
                    {
                        last = Some(reservation);
                    }
                }
                Ok(())
            })
        })
        .expect("identical replies");
    // The sequences reached every case: nothing moved, a credit or debit, a class moved, a
    // holder's event.
    let seen = SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|n| *n > 0), "{seen:?}");
}

/// Settlements seen: [nothing moved, moved, a class moved, moved with an event].
static SEEN: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// The Redis function settles exactly as the memory store, reply for reply.
#[test]
fn redis_function_settles_exactly_as_the_memory_store() {
    differential(true);
}

/// And so does the script (`EVALSHA`).
#[test]
fn redis_script_settles_exactly_as_the_memory_store() {
    differential(false);
}
