//! The shape of real allowances, on both stores: weighted requests through the `CostLayer`
//! and several limits at once.
//!
//! Every check runs against the memory store and against the Redis script (a private
//! redis-server, the store following tokio's paused clock, as `conformance.rs` does), so the
//! two cannot drift apart on these cases either:
//!
//! - a request's cost is charged atomically on every limit, through the real layers;
//! - a cost above a burst fails at once with `TooCostly` and spends nothing;
//! - FIFO with mixed costs: a heavy request at the head is not overtaken and nothing starves;
//! - three limits (per second, per minute, per day) admit all-or-nothing, at the earliest
//!   instant all of them admit, computed exactly; a cooldown and a release move every limit;
//! - a differential property with three and four limits of mixed units, reply for reply.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{HeaderName, Request, Response};
use proptest::{
    collection::vec,
    prelude::*,
    test_runner::{Config as ProptestConfig, TestRunner},
};
use tokio::time::Instant;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_allowance::{
    cost::CostLayer,
    error::AbandonReason,
    rule::AdmitRequest,
    rule::{Admission, Op, Reply},
    store::{MemoryStore, Store},
    AcquireOptions, Allowance, AllowanceConfig, Limit, Outcome,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

const MS: Duration = Duration::from_millis(1);

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

/// A connected Redis store (in real time); `fresh` hands out stores over its connection that
/// decide on tokio's (paused) clock.
fn redis_base() -> (TestRedis, RedisStore) {
    real().block_on(async {
        let redis = TestRedis::start().await;
        let store =
            RedisStore::connect(redis.url(), &unique_name("shape"), RedisStoreOptions::new())
                .await
                .expect("connect");
        (redis, store)
    })
}

fn fresh(base: &RedisStore) -> RedisStore {
    let store = base
        .for_allowance(&unique_name("shape"))
        .expect("valid name");
    store.follow_tokio_clock().expect("blocking connection");
    store
}

/// Runs every check on stores from `make`, on a paused clock.
fn run_all<S: Store>(make: impl Fn() -> S) {
    // Each store is made inside the runtime, so that it starts on the paused clock.
    let rt = paused();
    rt.block_on(async { cost_is_charged_on_every_limit_through_the_layer(make()).await });
    rt.block_on(async { too_costly_fails_at_once_and_spends_nothing(make()).await });
    rt.block_on(async { fifo_with_mixed_costs_nothing_starves(make()).await });
    rt.block_on(async { three_limits_all_or_nothing_at_the_earliest_common_instant(make()).await });
    rt.block_on(async { a_cooldown_and_a_release_move_every_limit(make()).await });
    rt.block_on(async { concurrent_weighted_callers_never_exceed_any_limit(make()).await });
}

#[test]
fn memory_store() {
    run_all(MemoryStore::new);
}

#[test]
fn redis_store() {
    let (_redis, base) = redis_base();
    run_all(|| fresh(&base));
}

fn admit<S: Store>(store: &S, config: &AllowanceConfig, req: AdmitRequest) -> Admission {
    let reply = store.try_apply(Instant::now(), config.params(), &Op::Admit(req).into());
    match reply.map(|r| r.map(Reply::from)) {
        Some(Ok(Reply::Admit(a))) => a,
        other => panic!("admit answered {other:?}"),
    }
}

fn wait_of(a: Admission) -> Duration {
    match a {
        Admission::Admitted => Duration::ZERO,
        Admission::Reserved { wait, .. } => wait,
        other => panic!("expected an admission, got {other:?}"),
    }
}

/// A service recording when each request reached it and with which cost header.
type Seen = Arc<Mutex<Vec<(Duration, u32, usize)>>>;

fn recording(
    start: Instant,
    seen: Seen,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send {
    service_fn(move |req: Request<String>| {
        let cost = req
            .headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let id = req.body().parse().unwrap_or(usize::MAX);
        if let Ok(mut seen) = seen.lock() {
            seen.push((start.elapsed(), cost, id));
        }
        async { Ok(Response::new(String::new())) }
    })
}

fn costed(id: usize, cost: u32) -> Request<String> {
    Request::builder()
        .header("x-cost", cost.to_string())
        .body(id.to_string())
        .expect("request")
}

fn tokens_config() -> AllowanceConfig {
    // 20 requests/s (burst 5) and 1,000 tokens/s (burst 1,000).
    // Exact: the slots below are the rule's on the limits as configured (no headroom).
    AllowanceConfig::per_second(20, 5)
        .map(AllowanceConfig::exact)
        .and_then(|c| c.with_limit(Limit::per_second(1_000, 1_000)?.counting_cost()))
        .expect("valid")
}

async fn cost_is_charged_on_every_limit_through_the_layer<S: Store>(store: S) {
    let allowance = Allowance::with_store(tokens_config(), store);
    let start = Instant::now();
    let seen: Seen = Arc::default();
    let svc = ServiceBuilder::new()
        .layer(CostLayer::from_header(HeaderName::from_static("x-cost")))
        .layer(allowance.layer())
        .service(recording(start, seen.clone()));
    // 400 + 500 fit the token burst; then 300 waits for 200 tokens (200 ms). Then seven
    // requests of cost 0 (one request each, no token): they queue behind the 300 (FIFO), and
    // from the sixth request in 200 ms on the request limit (burst 5, one per 50 ms) binds.
    let costs = [400, 500, 300, 0, 0, 0, 0, 0, 0, 0];
    let mut tasks = vec![];
    for (i, cost) in costs.into_iter().enumerate() {
        let svc = svc.clone();
        tasks.push(tokio::spawn(svc.oneshot(costed(i, cost))));
        tokio::task::yield_now().await;
    }
    for t in tasks {
        let result = t.await.expect("task");
        assert!(
            Outcome::of(&result).is_completed(),
            "{:?}",
            Outcome::of(&result)
        );
    }
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let at: Vec<(u128, usize)> = seen.iter().map(|(t, _, id)| (t.as_millis(), *id)).collect();
    assert_eq!(
        at,
        [
            (0, 0),
            (0, 1),
            (200, 2),
            (200, 3),
            (200, 4),
            (200, 5),
            (200, 6),
            (250, 7),
            (300, 8),
            (350, 9)
        ]
    );
}

async fn too_costly_fails_at_once_and_spends_nothing<S: Store>(store: S) {
    let config = tokens_config();
    let allowance = Allowance::with_store(config.clone(), store);
    let start = Instant::now();
    let seen: Seen = Arc::default();
    let svc = ServiceBuilder::new()
        .layer(CostLayer::from_header(HeaderName::from_static("x-cost")))
        .layer(allowance.layer())
        .service(recording(start, seen.clone()));
    let result = svc.clone().oneshot(costed(0, 1_001)).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::TooCostly)
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "at once");
    assert!(
        seen.lock().map(|s| s.is_empty()).unwrap_or(false),
        "never sent"
    );
    assert_eq!(
        allowance.snapshot().abandoned.get(AbandonReason::TooCostly),
        1
    );
    // Nothing was spent: the whole token burst and the whole request burst are there.
    let result = svc.oneshot(costed(1, 1_000)).await;
    assert!(Outcome::of(&result).is_completed());
    assert_eq!(start.elapsed(), Duration::ZERO);
    // The tokens are spent now: a token waits a millisecond, longer than this deadline. The
    // refusal charges no request either.
    let soon = || Instant::now() + Duration::from_micros(500);
    let refused = allowance
        .acquire_with(AcquireOptions::new().cost(1).deadline(soon()))
        .await;
    assert_eq!(
        refused.err().and_then(|e| e.abandon_reason()),
        Some(AbandonReason::Deadline)
    );
    for i in 0..4 {
        let ok = allowance
            .acquire_with(AcquireOptions::new().cost(0).deadline(soon()))
            .await;
        assert!(ok.is_ok(), "request #{i}: 4 of the burst of 5 are left");
    }
    let fifth = allowance
        .acquire_with(AcquireOptions::new().cost(0).deadline(soon()))
        .await;
    assert!(fifth.is_err(), "the request burst is spent");
    assert_eq!(start.elapsed(), Duration::ZERO);
}

async fn fifo_with_mixed_costs_nothing_starves<S: Store>(store: S) {
    // 100 tokens/s, burst 100; the request limit never binds.
    let config = AllowanceConfig::per_second(10_000, 10_000)
        .and_then(|c| c.with_limit(Limit::per_second(100, 100)?.counting_cost()))
        .expect("valid");
    let allowance = Allowance::with_store(config, store);
    let start = Instant::now();
    let seen: Seen = Arc::default();
    let svc = ServiceBuilder::new()
        .layer(CostLayer::from_header(HeaderName::from_static("x-cost")))
        .layer(allowance.layer())
        .service(recording(start, seen.clone()));
    let mut tasks = vec![];
    // 60 tokens now: 40 left. Then a heavy request of 100 at the head: it waits 600 ms.
    tasks.push(tokio::spawn(svc.clone().oneshot(costed(0, 60))));
    tokio::task::yield_now().await;
    tasks.push(tokio::spawn(svc.clone().oneshot(costed(1, 100))));
    tokio::task::yield_now().await;
    // A steady stream of light requests (10 tokens each, every 50 ms) follows. Each would fit
    // in the tokens already there, yet none overtakes the heavy one; and the heavy one is not
    // starved by them.
    for i in 2..22 {
        tasks.push(tokio::spawn(svc.clone().oneshot(costed(i, 10))));
        tokio::time::sleep(50 * MS).await;
    }
    for t in tasks {
        assert!(Outcome::of(&t.await.expect("task")).is_completed());
    }
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let order: Vec<usize> = seen.iter().map(|(_, _, id)| *id).collect();
    assert_eq!(
        order,
        (0..22).collect::<Vec<_>>(),
        "admitted in arrival order"
    );
    let heavy = seen.iter().find(|s| s.2 == 1).map(|s| s.0);
    assert_eq!(heavy, Some(600 * MS), "the heavy request at 600 ms exactly");
    // The light ones queue behind it, 100 ms apart (10 tokens at 100/s), with no gap.
    let light: Vec<u128> = seen.iter().skip(2).map(|s| s.0.as_millis()).collect();
    let want: Vec<u128> = (0..20).map(|i| 700 + 100 * i).collect();
    assert_eq!(light, want);
}

fn three_limits() -> AllowanceConfig {
    // 10/s (burst 10), 30/min (burst 15), 40/day (burst 20), exact (no headroom).
    AllowanceConfig::per_second(10, 10)
        .map(AllowanceConfig::exact)
        .and_then(|c| c.with_limit(Limit::per_minute(30, 15)?.exact()))
        .and_then(|c| c.with_limit(Limit::per_day(40, 20)?.exact()))
        .expect("valid")
}

async fn three_limits_all_or_nothing_at_the_earliest_common_instant<S: Store>(store: S) {
    let config = three_limits();
    for i in 0..10 {
        assert_eq!(
            admit(&store, &config, AdmitRequest::first()),
            Admission::Admitted,
            "burst #{i}"
        );
    }
    // The per-second limit is spent: 100 ms. A caller that will not wait is refused, and
    // nothing is charged on any limit.
    assert_eq!(
        admit(&store, &config, AdmitRequest::first().max_wait(50 * MS)),
        Admission::Refused {
            wait: 100 * MS,
            cooldown: None
        }
    );
    // 5 more: the per-second limit's schedule (100 ms apart) and the per-minute one's burst
    // (15) agree.
    let waits: Vec<u128> = (0..5)
        .map(|_| wait_of(admit(&store, &config, AdmitRequest::first())).as_millis())
        .collect();
    assert_eq!(waits, [100, 200, 300, 400, 500]);
    // Now the per-minute burst is spent: 2 s per request, from the schedule's start.
    let next = wait_of(admit(&store, &config, AdmitRequest::first()));
    assert_eq!(next, Duration::from_secs(2), "the per-minute limit binds");
    // A refusal by one limit charges none: the next caller gets the very next slot.
    assert!(matches!(
        admit(
            &store,
            &config,
            AdmitRequest::first().max_wait(Duration::from_secs(3))
        ),
        Admission::Refused { .. }
    ));
    assert_eq!(
        wait_of(admit(&store, &config, AdmitRequest::first())),
        Duration::from_secs(4)
    );
    // 17 admitted of a day's burst of 20: three more (every 2 s), then the per-day limit
    // binds: its interval is 86,400 s / 40 = 2,160 s, from 17 burst units ahead.
    for i in 0..3 {
        let w = wait_of(admit(&store, &config, AdmitRequest::first()));
        assert_eq!(w, Duration::from_secs(6 + 2 * i));
    }
    let day = wait_of(admit(&store, &config, AdmitRequest::first()));
    assert_eq!(day, Duration::from_secs(2_160), "the per-day limit binds");
}

async fn a_cooldown_and_a_release_move_every_limit<S: Store>(store: S) {
    // Requests: 10/s burst 1 (exact: no headroom); tokens: 100/s burst 100.
    let config = AllowanceConfig::per_second(10, 1)
        .map(AllowanceConfig::exact)
        .and_then(|c| c.with_limit(Limit::per_second(100, 100)?.counting_cost()))
        .expect("valid");
    let allowance = Allowance::with_store(config.clone(), store);
    assert!(allowance
        .acquire_with(AcquireOptions::new().cost(100))
        .await
        .is_ok());
    let start = Instant::now();
    // Three callers wait: both limits are spent.
    let mut waiting = vec![];
    for cost in [50, 50, 10] {
        let a = allowance.clone();
        waiting.push(tokio::spawn(async move {
            a.acquire_with(AcquireOptions::new().cost(cost))
                .await
                .map(|()| start.elapsed())
        }));
        tokio::task::yield_now().await;
    }
    // Slots: 500 ms (tokens), 1,000 ms (tokens), 1,100 ms (tokens: 10 more; requests fine).
    tokio::time::sleep(100 * MS).await;
    // A server asks for 1 s: every pending slot moves past it, on both limits, in order.
    let extended = allowance
        .extend_cooldown(Duration::from_secs(1))
        .await
        .expect("defer");
    assert!(extended);
    let mut at = vec![];
    for w in waiting {
        at.push(w.await.expect("task").expect("admitted").as_millis());
    }
    assert_eq!(at, [1_500, 2_000, 2_100], "translated by the added second");
    // A caller that leaves before its slot gives it back on every limit.
    let early = tokio::time::timeout(
        10 * MS,
        allowance.acquire_with(AcquireOptions::new().cost(100)),
    )
    .await;
    assert!(early.is_err(), "left before its slot");
    let t = Instant::now();
    allowance
        .acquire_with(AcquireOptions::new().cost(100))
        .await
        .expect("admitted");
    assert_eq!(
        t.elapsed() + 10 * MS,
        Duration::from_secs(1),
        "the released slot (tokens and request) went to the next caller"
    );
}

async fn concurrent_weighted_callers_never_exceed_any_limit<S: Store>(store: S) {
    // 50 requests/s (burst 10) and 2,000 tokens/s (burst 2,000), 60 callers at once.
    let config = AllowanceConfig::per_second(50, 10)
        .and_then(|c| c.with_limit(Limit::per_second(2_000, 2_000)?.counting_cost()))
        .expect("valid");
    let allowance = Allowance::with_store(config, store);
    let start = Instant::now();
    let mut tasks = vec![];
    for i in 0..60u32 {
        let a = allowance.clone();
        let cost = 1 + (i * 37) % 300;
        tasks.push(tokio::spawn(async move {
            a.acquire_with(AcquireOptions::new().cost(cost))
                .await
                .map(|()| (start.elapsed(), cost))
        }));
    }
    let mut admitted = vec![];
    for t in tasks {
        admitted.push(t.await.expect("task").expect("admitted"));
    }
    admitted.sort();
    // Within any window from the start, neither limit's bound is exceeded.
    let (mut requests, mut tokens) = (0u64, 0u64);
    for (at, cost) in &admitted {
        requests += 1;
        tokens += u64::from(*cost);
        let us = at.as_micros() as u64;
        assert!(requests <= 10 + us * 50 / 1_000_000, "requests at {at:?}");
        assert!(tokens <= 2_000 + us * 2_000 / 1_000_000, "tokens at {at:?}");
    }
    // And the run took the minimum the binding limit allows (to the millisecond grid).
    let total: u64 = admitted.iter().map(|(_, c)| u64::from(*c)).sum();
    let by_tokens = (total - 2_000) * 1_000 / 2_000;
    let by_requests = (60 - 10) * 20;
    let last = admitted
        .last()
        .map(|(t, _)| t.as_millis() as u64)
        .unwrap_or(0);
    assert!(
        last >= by_tokens.max(by_requests),
        "{last} >= {by_tokens}/{by_requests}"
    );
    assert!(
        last <= by_tokens.max(by_requests) + 20,
        "close to the minimum: {last} ms for {by_tokens}/{by_requests}"
    );
}

// === Differential property: three and four limits ===

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), 0u32..40, 0u64..3_000_000, proptest::option::of(0u64..2_000_000))
            .prop_map(|(retry, cost, max_wait, nb)| {
                let mut r = if retry { AdmitRequest::retry() } else { AdmitRequest::first() };
                r = r.cost(cost).max_wait(Duration::from_micros(max_wait));
                if let Some(nb) = nb { r = r.not_before(Duration::from_micros(nb)); }
                Op::Admit(r)
            }),
        3 => (0u32..40).prop_map(|c| Op::Admit(AdmitRequest::first().cost(c))),
        2 => proptest::option::of(0u64..3_000_000).prop_map(|delay_us| Op::Defer { delay_us }),
        1 => Just(Op::Clear),
        1 => (0u64..3).prop_map(|deposits| Op::Read { deposits }),
    ]
}

fn many_limits() -> impl Strategy<Value = AllowanceConfig> {
    (1u32..30, 1u32..8, 3usize..=4, any::<[bool; 3]>(), 1u64..5).prop_map(
        |(rate, burst, n, units, retries)| {
            let mut config = AllowanceConfig::per_second(rate, burst)
                .expect("valid")
                .with_retry_budget(tower_allowance::RetryBudgetConfig::fixed(retries))
                .with_max_cooldown(Duration::from_millis(2_500))
                .expect("valid");
            let extra = [
                Limit::per_second(rate * 20, 40).expect("valid"),
                Limit::per_minute(rate * 40, burst * 4).expect("valid"),
                Limit::new(rate * 3, Duration::from_secs(2), burst + 30).expect("valid"),
            ];
            for (l, cost) in extra.into_iter().zip(units).take(n - 1) {
                let l = if cost { l.counting_cost() } else { l };
                config = config.with_limit(l).expect("at most four limits");
            }
            config
        },
    )
}

/// With three and four limits of mixed units, the Redis script decides exactly as the memory
/// store, reply for reply, to the microsecond (costs up to and beyond some bursts included).
#[test]
fn redis_script_decides_several_limits_exactly_as_the_memory_store() {
    let (_redis, base) = redis_base();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        many_limits(),
        vec((0u64..300_000, op(), any::<bool>()), 1..100),
    );
    runner
        .run(&strategy, |(config, ops)| {
            let rt = paused();
            rt.block_on(async {
                let redis = fresh(&base);
                let memory = MemoryStore::new();
                let params = config.params();
                let mut last = None;
                for (i, (gap, op, release)) in ops.into_iter().enumerate() {
                    tokio::time::advance(Duration::from_micros(gap)).await;
                    let op = match (release, last.take()) {
                        (true, Some(r)) => Op::Release(r),
                        _ => op,
                    };
                    let now = Instant::now();
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
                }
                Ok(())
            })
        })
        .expect("identical replies");
}
