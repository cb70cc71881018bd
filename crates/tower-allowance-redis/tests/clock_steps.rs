//! Steps of the Redis host's clock (issue 10, point 2). The script decides on the server's
//! `TIME` and stores absolute instants; when an operation finds the clock earlier than the
//! last one the key saw, it moves every stored instant back by the difference (`rebase` in
//! `lua/clock.lua`, `rule::rebase` in Rust), so no wait grows by the step. What it cannot see
//! is the time that passed between the key's last operation before the step and its first
//! after: that gap counts as no time, so a wait can grow by it (at most one interval for an
//! allowance in use; the outstanding wait, for a key that sat idle). Here the test clock
//! (`follow_tokio_clock`, virtual time) steps back one hour:
//!
//! - a cooldown raised before the step ends when it should, within one interval;
//! - after an idle spell, the wait outstanding at the last operation starts over: bounded;
//! - reservations made before the step are released (the last one) or lost boundedly (one
//!   slot, when later ones were made), and the Lua replies equal `rule::apply`'s, step
//!   included;
//! - a run across the step takes at most one interval longer than without it.
//!
//! And forward: what a forward step does (documented by the last test).

mod support;

use std::time::Duration;

use tokio::time::Instant;
use tower_allowance::{
    rule::AdmitRequest,
    rule::{self, Admission, Op, Reply, State},
    store::Store,
    Allowance, AllowanceConfig,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

use support::MS;

const HOUR: Duration = Duration::from_secs(3600);

/// A store connected on real time, for allowances deciding on the paused test clock.
fn base() -> (TestRedis, RedisStore) {
    support::real().block_on(async {
        let redis = TestRedis::start().await;
        let store =
            RedisStore::connect(redis.url(), &unique_name("steps"), RedisStoreOptions::new())
                .await
                .expect("connect");
        (redis, store)
    })
}

#[test]
fn a_cooldown_raised_before_a_backward_step_ends_on_time() {
    let (_redis, base) = base();
    support::paused().block_on(async {
        let store = support::fresh(&base);
        // Ten hours of clock, so that it can step back one.
        tokio::time::advance(10 * HOUR).await;
        let allowance = Allowance::with_store(
            AllowanceConfig::per_second(2, 1).expect("valid").exact(),
            store.clone(),
        );
        allowance.acquire().await.expect("admitted");
        let raised = Instant::now();
        allowance.extend_cooldown(2_000 * MS).await.expect("defer");
        // The allowance is in use: its key sees an operation now and then (here a state
        // read 400 ms in), and the clock steps back an hour 100 ms after that.
        tokio::time::advance(400 * MS).await;
        let state = allowance.store_state().await.expect("state");
        assert_eq!(state.blocked_for, 1_600 * MS);
        tokio::time::advance(100 * MS).await;
        store.step_clock_back(HOUR);

        let state = allowance.store_state().await.expect("state");
        // Not an hour and 1.5 s: the 100 ms since the last operation are not seen.
        assert_eq!(
            state.blocked_for,
            1_600 * MS,
            "the cooldown did not grow by the step"
        );
        allowance
            .acquire()
            .await
            .expect("admitted after the cooldown");
        let ended = raised.elapsed();
        assert!(
            ended >= 2_000 * MS && ended <= 2_500 * MS,
            "the cooldown ended {ended:?} after it was raised, want 2 s (within one interval)"
        );
    });
}

/// The bound for a key nobody touched for a while before the step: the wait outstanding
/// at its last operation starts over, never more (here a 2 s cooldown, 1.5 s quiet, then the
/// step: 2 s again from the step, 3.5 s in all instead of 2 s, and not an hour).
#[test]
fn after_an_idle_spell_a_backward_step_restarts_the_outstanding_wait() {
    let (_redis, base) = base();
    support::paused().block_on(async {
        let store = support::fresh(&base);
        tokio::time::advance(10 * HOUR).await;
        let allowance = Allowance::with_store(
            AllowanceConfig::per_second(2, 1).expect("valid").exact(),
            store.clone(),
        );
        let raised = Instant::now();
        allowance.extend_cooldown(2_000 * MS).await.expect("defer");
        tokio::time::advance(1_500 * MS).await;
        store.step_clock_back(HOUR);
        let state = allowance.store_state().await.expect("state");
        assert_eq!(state.blocked_for, 2_000 * MS, "as at the last operation");
        allowance
            .acquire()
            .await
            .expect("admitted after the cooldown");
        assert_eq!(raised.elapsed(), 3_500 * MS);
    });
}

#[test]
fn reservations_across_a_backward_step_are_released_or_lost_boundedly() {
    let (_redis, base) = base();
    support::paused().block_on(async {
        let store = support::fresh(&base);
        let config = AllowanceConfig::per_second(2, 1).expect("valid").exact();
        let params = config.params();
        // The rule, applied on the same clock: the script must answer exactly as it does.
        let mut rule_state = State::default();
        let mut now_us: u64 = 0;
        let mut apply = |op: Op, now_us: u64| {
            let got: Reply = store
                .try_apply(Instant::now(), params, &op.into())
                .expect("answered synchronously")
                .expect("redis")
                .into();
            let want = rule::apply(&mut rule_state, now_us, params.rule(), &op);
            assert_eq!(got, want, "{op:?} at {now_us} µs");
            got
        };
        let reserved = |reply: Reply| match reply {
            Reply::Admit(Admission::Reserved { wait, reservation }) => (wait, reservation),
            other => panic!("reserved, got {other:?}"),
        };
        let admit = Op::Admit(AdmitRequest::first().max_wait(HOUR));
        let hour_us = 3_600_000_000;

        tokio::time::advance(10 * HOUR).await;
        now_us += 10 * hour_us;
        assert_eq!(apply(admit, now_us), Reply::Admit(Admission::Admitted));
        let (wait1, r1) = reserved(apply(admit, now_us));
        let (wait2, r2) = reserved(apply(admit, now_us));
        assert_eq!((wait1, wait2), (500 * MS, 1_000 * MS));

        tokio::time::advance(100 * MS).await;
        now_us += 100_000;
        store.step_clock_back(HOUR);
        now_us -= hour_us;

        // The last reservation, made before the step, is taken back after it...
        assert_eq!(
            apply(Op::Release(r2), now_us),
            Reply::Release { released: true }
        );
        // ... so the next caller gets that slot: 1 s ahead as the store sees it (the 100 ms
        // between the last operation and the step are not seen), not an hour more.
        let (wait3, _r3) = reserved(apply(admit, now_us));
        assert_eq!(wait3, 1_000 * MS);
        // An earlier one cannot be (a later slot was handed out since): one slot lost, as
        // without a step.
        assert_eq!(
            apply(Op::Release(r1), now_us),
            Reply::Release { released: false }
        );
        let (wait4, _r4) = reserved(apply(admit, now_us));
        assert_eq!(wait4, 1_500 * MS);

        // A 3 s cooldown; 1 s later, just after an operation, a second step back: the
        // cooldown has its 2 s left.
        apply(
            Op::Defer {
                delay_us: Some(3_000_000),
            },
            now_us,
        );
        tokio::time::advance(1_000 * MS).await;
        now_us += 1_000_000;
        apply(Op::Read { deposits: 0 }, now_us);
        store.step_clock_back(HOUR);
        now_us -= hour_us;
        match apply(Op::Read { deposits: 0 }, now_us) {
            Reply::State(s) => assert_eq!(s.blocked_for, 2_000 * MS),
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn no_wait_grows_by_a_backward_step() {
    let (_redis, base) = base();
    support::paused().block_on(async {
        let store = support::fresh(&base);
        tokio::time::advance(10 * HOUR).await;
        let allowance = Allowance::with_store(
            AllowanceConfig::per_second(2, 1).expect("valid").exact(),
            store.clone(),
        );
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..6 {
            let allowance = allowance.clone();
            tasks.spawn(async move {
                let mut waits = vec![];
                for _ in 0..2 {
                    let asked = Instant::now();
                    allowance.acquire().await.expect("admitted");
                    waits.push(asked.elapsed());
                }
                waits
            });
        }
        // Mid-run, with slots reserved and held: the clock steps back an hour.
        tokio::time::sleep(2_200 * MS).await;
        store.step_clock_back(HOUR);
        let mut longest = Duration::ZERO;
        while let Some(waits) = tasks.join_next().await {
            longest = longest.max(waits.expect("task").into_iter().max().unwrap_or_default());
        }
        let took = started.elapsed();
        // 12 admissions at 2/s, burst 1: the last at 5.5 s without a step; with it, at most
        // one interval later (the time between the key's operations around the step).
        assert!(
            took >= 5_500 * MS && took <= 6_000 * MS,
            "the run took {took:?}, want 5.5 s (+ at most one interval)"
        );
        assert!(longest <= 6_000 * MS, "a wait of {longest:?}");
    });
}

/// A forward step is not detected (the clock may have been slow): the store sees time pass.
/// Cooldowns end early by the step and the bucket refills, so one burst can go out at once;
/// slots already reserved are kept by their holders, on their own clocks. The rate holds
/// again from there.
#[test]
fn a_forward_step_ends_cooldowns_early_and_refills_one_burst() {
    let (_redis, base) = base();
    support::paused().block_on(async {
        let store = support::fresh(&base);
        let config = AllowanceConfig::per_second(2, 2).expect("valid").exact();
        let allowance = Allowance::with_store(config, store.clone());
        allowance.acquire().await.expect("admitted");
        allowance.acquire().await.expect("admitted");
        allowance.extend_cooldown(10_000 * MS).await.expect("defer");
        let raised = Instant::now();
        // A holder with a slot at the cooldown's end.
        let holder = {
            let allowance = allowance.clone();
            tokio::spawn(async move {
                allowance.acquire().await.expect("admitted");
                Instant::now()
            })
        };
        support::eventually("the holder holds", || async {
            tokio::task::yield_now().await;
            allowance.snapshot().waiting == 1
        })
        .await;

        store.step_clock_forward(HOUR);
        let state = allowance.store_state().await.expect("state");
        assert_eq!(
            state.blocked_for,
            Duration::ZERO,
            "the cooldown is over for the store"
        );
        // One burst (2) at once, then the rate.
        let after_step = Instant::now();
        allowance.acquire().await.expect("admitted");
        allowance.acquire().await.expect("admitted");
        assert_eq!(after_step.elapsed(), Duration::ZERO, "a refilled burst");
        allowance.acquire().await.expect("admitted");
        assert_eq!(after_step.elapsed(), 500 * MS, "then the rate");
        // The holder keeps its slot at the cooldown's end, on this process's clock.
        let held_until = holder.await.expect("holder");
        assert_eq!(held_until.saturating_duration_since(raised), 10_000 * MS);
    });
}
