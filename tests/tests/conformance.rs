//! One conformance suite (`tower-allowance-conformance`), run against every store: the
//! in-memory store and the Redis store must make the same decisions (the Redis script transcribes `tower_allowance::rule` in Lua,
//! and this is what keeps the two from drifting apart).
//!
//! Both run in virtual time (a paused tokio clock): the Redis store follows tokio's clock
//! (`RedisStore::follow_tokio_clock`), so instants are checked to the microsecond. The Redis
//! store runs twice: calling the function library (`FCALL`, Redis 7 Functions) and the script
//! (`EVALSHA`, for servers without Functions).
//!
//! And one differential property: random sequences of operations, applied at the same
//! instants to a memory store and to the Redis script, get identical replies.

use std::time::Duration;

use proptest::{
    collection::vec,
    prelude::*,
    test_runner::{Config as ProptestConfig, TestRunner},
};
use tower_allowance::{
    rule::AdmitRequest,
    rule::{
        Admission, ClosedBy, Grant, GrantRequest, Op, ProbeOutcome, Reply, ShareReply, ShareRequest,
    },
    store::{MemoryStore, Store},
    AllowanceConfig, Limit, ReplenishingBudget, RetryBudgetConfig,
};
use tower_allowance_conformance as conformance;
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
}

fn real() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn memory_store_conforms() {
    paused().block_on(conformance::run(|| async { MemoryStore::new() }));
}

/// A store connected in real time; `fresh` hands out new allowances over its connection to
/// a suite that runs in virtual time. `functions: false`: `EVALSHA`, as without Functions.
fn redis_store(functions: bool) -> (TestRedis, RedisStore) {
    real().block_on(async {
        let redis = TestRedis::start().await;
        let store = RedisStore::connect(
            redis.url(),
            &unique_name("conformance"),
            RedisStoreOptions::new(),
        )
        .await
        .expect("connect");
        assert!(store.uses_functions(), "Redis 7: the function library");
        if !functions {
            store.without_functions();
        }
        (redis, store)
    })
}

/// A new allowance's store over `base`'s connection, deciding on tokio's clock.
fn fresh(base: &RedisStore) -> RedisStore {
    let store = base
        .for_allowance(&unique_name("conformance"))
        .expect("valid name");
    store.follow_tokio_clock().expect("blocking connection");
    store
}

#[test]
fn redis_store_conforms() {
    let (_redis, base) = redis_store(true);
    paused().block_on(conformance::run(|| {
        let store = fresh(&base);
        async move { store }
    }));
}

#[test]
fn redis_store_conforms_with_the_script() {
    let (_redis, base) = redis_store(false);
    paused().block_on(conformance::run(|| {
        let store = fresh(&base);
        assert!(!store.uses_functions());
        async move { store }
    }));
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), 1u32..4, 0u64..3_000_000, proptest::option::of(0u64..2_000_000), 0u64..3)
            .prop_map(|(retry, cost, max_wait, nb, deposits)| {
                let mut r = if retry { AdmitRequest::retry() } else { AdmitRequest::first() };
                r = r.cost(cost).max_wait(Duration::from_micros(max_wait)).deposits(deposits);
                if let Some(nb) = nb { r = r.not_before(Duration::from_micros(nb)); }
                Op::Admit(r)
            }),
        3 => Just(Op::Admit(AdmitRequest::first())),
        2 => proptest::option::of(0u64..3_000_000).prop_map(|delay_us| Op::Defer { delay_us }),
        1 => (proptest::option::of(0u64..2_000_000), any::<bool>()).prop_map(|(delay_us, q)| Op::Close {
            delay_us,
            by: if q { ClosedBy::Quota } else { ClosedBy::ServerDelay },
        }),
        1 => Just(Op::Clear),
        1 => (0u64..4).prop_map(|token| Op::Lease { ttl_us: 500_000, token }),
        1 => (0u64..4, 0u8..3).prop_map(|(token, o)| Op::FinishProbe {
            token,
            outcome: match o {
                0 => ProbeOutcome::Available,
                1 => ProbeOutcome::Failed,
                _ => ProbeOutcome::Exhausted { retry_in: Duration::from_millis(700) },
            },
        }),
        1 => (0u64..3).prop_map(|deposits| Op::Read { deposits }),
        2 => (proptest::option::of(prop_oneof![Just(0u64), 0u64..3_000_000]), 0u64..2_000_000)
            .prop_map(|(delay_us, age_us)| Op::Throttle { delay_us, age_us }),
        1 => (0u64..60_000).prop_map(|rate_milli| Op::Advertise { rate_milli }),
        4 => (
            (any::<bool>(), 1u32..4, 0u64..3_000_000, 0u64..3),
            (0u8..9, 1u32..5, any::<bool>(), prop_oneof![Just(0u64), 0u64..5_000_000]),
            prop_oneof![Just(0u64), 0u64..8_000_000],
        )
            .prop_map(|((retry, cost, max_wait, deposits), (class, weight, high, start), seen)| {
                let mut r = if retry { AdmitRequest::retry() } else { AdmitRequest::first() };
                r = r.cost(cost).max_wait(Duration::from_micros(max_wait)).deposits(deposits);
                Op::Share(ShareRequest::new(r, class, weight).high(high).start(start).seen(seen))
            }),
        // Leases (op 13): tokens, a valid-until (0: none; else maybe already past), a
        // holder's window mark, a debit, the successes the holder admitted.
        3 => (0u32..30, prop_oneof![Just(0u64), 1u64..20_000_000], prop_oneof![Just(0u64), 1u64..5_000_000], 0u32..4, 0u64..6)
            .prop_map(|(n, valid_until, mark, debit, deposits)| Op::Grant(
                GrantRequest::new(n).valid_until_us(valid_until).mark(mark).debit(debit).deposits(deposits),
            )),
    ]
}

fn any_config() -> impl Strategy<Value = AllowanceConfig> {
    (
        1u32..40,
        1u32..6,
        0u8..3,
        0u64..5,
        any::<bool>(),
        1u64..5,
        0u8..3,
    )
        .prop_map(|(rate, burst, budget, retries, two, window_s, adaptive)| {
            let budget = match budget {
                0 => RetryBudgetConfig::Unlimited,
                1 => RetryBudgetConfig::fixed(retries),
                _ => RetryBudgetConfig::Replenishing(
                    ReplenishingBudget::new(Duration::from_secs(window_s), 1, 0.5).expect("valid"),
                ),
            };
            let mut config = AllowanceConfig::per_second(rate, burst)
                .expect("valid")
                .with_retry_budget(budget)
                .with_max_cooldown(Duration::from_millis(2_500))
                .expect("valid");
            if two {
                config = config
                    .with_limit(
                        Limit::per_second(rate * 3, burst + 2)
                            .expect("valid")
                            .counting_cost(),
                    )
                    .expect("two limits");
            }
            if adaptive > 0 {
                let a = tower_allowance::AdaptiveRate::new(f64::from(rate), 0.5, 200.0)
                    .expect("valid")
                    .adopt_advertised(adaptive == 2);
                config = config.with_adaptive_rate(a);
            }
            config
        })
}

/// The Redis function decides exactly as the memory store, reply for reply, to the
/// microsecond.
#[test]
fn redis_function_decides_exactly_as_the_memory_store() {
    differential(true);
}

/// And so does the script (`EVALSHA`).
#[test]
fn redis_script_decides_exactly_as_the_memory_store() {
    differential(false);
}

fn differential(functions: bool) {
    let (_redis, base) = redis_store(functions);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        any_config(),
        vec((0u64..400_000, op(), any::<bool>()), 1..120),
    );
    runner
        .run(&strategy, |(config, ops)| {
            let rt = paused();
            rt.block_on(async {
                let redis = fresh(&base);
                let memory = MemoryStore::new();
                let params = config.params();
                let mut last = None;
                let mut last_lease: Option<tower_allowance::rule::Granted> = None;
                for (i, (gap, op, release)) in ops.into_iter().enumerate() {
                    tokio::time::advance(Duration::from_micros(gap)).await;
                    let op = match (release, last.take(), op, last_lease) {
                        // A lease call giving back part of the last lease's tail.
                        (true, _, Op::Grant(req), Some(g)) => {
                            Op::Grant(req.back(g.tokens.div_ceil(2), &g))
                        }
                        (true, Some(r), _, _) => Op::Release(r),
                        (_, _, op, _) => op,
                    };
                    let now = tokio::time::Instant::now();
                    let want = memory
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
                    if let Reply::Admit(Admission::Reserved { reservation, .. }) = got {
                        last = Some(reservation);
                    }
                    if let Reply::Share(ShareReply {
                        admission: Admission::Reserved { reservation, .. },
                        ..
                    }) = got
                    {
                        last = Some(reservation);
                    }
                    if let Reply::Grant(Grant::Granted(g)) = got {
                        last_lease = Some(g);
                    }
                }
                Ok(())
            })
        })
        .expect("identical replies");
}
