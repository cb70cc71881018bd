//! The lease on a paused clock: store calls per admission, the bucket's bound, FIFO, a
//! cooldown and a closure reaching the tokens, the tail given back, an outage at the share.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::time::Instant;

use super::{Lease, LeaseStore};
use crate::{
    rule::{self, Admission, AdmitRequest},
    store::{MemoryStore, Op, Params, Reply, Store, StoreError, StoreFuture},
    Allowance, AllowanceConfig,
};

fn config(rate: u32, burst: u32) -> AllowanceConfig {
    AllowanceConfig::per_second(rate, burst)
        .expect("valid")
        .exact()
}

/// `jobs` acquisitions by `workers` tasks; the instants they were admitted at, sorted.
async fn run(allowance: &Allowance, workers: usize, jobs: usize) -> Vec<Instant> {
    let times = Arc::new(Mutex::new(Vec::new()));
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(jobs));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (a, times, left) = (allowance.clone(), times.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                a.acquire().await.expect("admitted");
                times.lock().expect("lock").push(Instant::now());
                // The request's own time.
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    let mut v = times.lock().expect("lock").clone();
    v.sort();
    v
}

/// Every stretch of admissions fits the bucket: `k` admissions within `d` need
/// `k <= burst + rate * d` (each admission rounded to the millisecond grid: one more).
fn within_the_bucket(times: &[Instant], rate: u32, burst: u32) {
    for (i, a) in times.iter().enumerate() {
        for (k, b) in times[i..].iter().enumerate() {
            let d = b.duration_since(*a).as_secs_f64();
            let allowed = f64::from(burst) + f64::from(rate) * d + 1.0;
            assert!(
                (k + 1) as f64 <= allowed,
                "{} admissions in {d} s: over the bucket",
                k + 1
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn far_fewer_calls_than_admissions_and_never_over_the_bucket() {
    let store = LeaseStore::new(MemoryStore::new(), Lease::auto());
    let allowance = Allowance::with_store(config(200, 20), store.clone());
    let start = Instant::now();
    let times = run(&allowance, 16, 2_000).await;
    assert_eq!(times.len(), 2_000);
    let calls = store.lease_calls();
    // One holder at 200/s, 500 ms: leases of up to 100 tokens once the rate is measured.
    assert!(
        calls * 20 <= 2_000,
        "{calls} lease calls for 2,000 admissions"
    );
    within_the_bucket(&times, 200, 20);
    // The minimum is (2,000 - 20) / 200 = 9.9 s; stranded tokens <= 5%.
    let took = times.last().expect("some").duration_since(start);
    assert!(took <= Duration::from_millis(9_900 * 105 / 100), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn one_call_per_admission_at_a_low_rate() {
    let store = LeaseStore::new(MemoryStore::new(), Lease::auto());
    let allowance = Allowance::with_store(config(2, 1), store.clone());
    for _ in 0..10 {
        allowance.acquire().await.expect("admitted");
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    assert_eq!(store.lease_calls(), 10);
}

#[tokio::test(start_paused = true)]
async fn callers_are_admitted_in_arrival_order() {
    let store = LeaseStore::new(
        MemoryStore::new(),
        Lease::fixed(4, Duration::from_millis(100)).expect("valid"),
    );
    let allowance = Allowance::with_store(config(50, 1), store);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (a, order) = (allowance.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            a.acquire().await.expect("admitted");
            order.lock().expect("lock").push(i);
        }));
        // Each arrives before the next.
        tokio::task::yield_now().await;
    }
    for t in tasks {
        t.await.expect("caller");
    }
    assert_eq!(*order.lock().expect("lock"), (0..20).collect::<Vec<_>>());
}

fn admit(store: &impl Store, params: &Params) -> Admission {
    let op = Op(rule::Op::Admit(AdmitRequest::first()));
    match store.try_apply(Instant::now(), params, &op) {
        Some(Ok(Reply(rule::Reply::Admit(a)))) => a,
        other => panic!("admit answered {other:?}"),
    }
}

fn wait(a: Admission) -> Duration {
    match a {
        Admission::Admitted => Duration::ZERO,
        Admission::Reserved { wait, .. } => wait,
        other => panic!("not admitted: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_freezes_the_lease() {
    let c = config(100, 5);
    let params = *c.params();
    let store = LeaseStore::new(
        MemoryStore::new(),
        Lease::fixed(20, Duration::from_millis(200)).expect("valid"),
    );
    assert_eq!(wait(admit(&store, &params)), Duration::ZERO);
    assert!(store.tokens_held() > 10, "a lease of 20 is held");
    // A 429 here: a cooldown of one second.
    let defer = Op(rule::Op::Defer {
        delay_us: Some(1_000_000),
    });
    store.apply(&params, defer).await.expect("raised");
    // Not one token of the lease goes out inside the cooldown.
    for i in 0..15 {
        let w = wait(admit(&store, &params));
        assert!(
            w >= Duration::from_secs(1),
            "token #{i} inside the cooldown: {w:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_closure_drops_the_lease() {
    let c = config(100, 5);
    let params = *c.params();
    let store = LeaseStore::new(
        MemoryStore::new(),
        Lease::fixed(20, Duration::from_millis(200)).expect("valid"),
    );
    admit(&store, &params);
    let close = Op(rule::Op::Close {
        delay_us: None,
        by: rule::ClosedBy::Quota,
    });
    store.apply(&params, close).await.expect("closed");
    assert_eq!(store.tokens_held(), 0);
    let op = Op(rule::Op::Admit(AdmitRequest::first()));
    let answer = store.apply(&params, op).await.expect("answered");
    assert!(
        matches!(answer.0, rule::Reply::Admit(Admission::Closed { .. })),
        "{answer:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_unused_tail_goes_back() {
    let c = config(100, 5);
    let params = *c.params();
    let memory = Arc::new(MemoryStore::new());
    let store = LeaseStore::new(
        memory.clone(),
        Lease::fixed(20, Duration::from_millis(200)).expect("valid"),
    );
    admit(&store, &params);
    let held = store.tokens_held();
    assert!(held > 10);
    // The tokens still ahead go back: the bucket is as if only what was used was taken.
    let back = store.give_back().await.expect("given back");
    assert!(back >= 14, "{back} of {held} went back");
    let w = wait(admit(&memory, &params));
    assert!(w <= Duration::from_millis(10), "the bucket is back: {w:?}");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_holder_gives_its_tail_back() {
    let c = config(100, 5);
    let params = *c.params();
    let memory = Arc::new(MemoryStore::new());
    let store = LeaseStore::new(
        memory.clone(),
        Lease::fixed(20, Duration::from_millis(200)).expect("valid"),
    );
    admit(&store, &params);
    assert!(store.tokens_held() > 10);
    drop(store);
    let w = wait(admit(&memory, &params));
    assert!(w <= Duration::from_millis(10), "the bucket is back: {w:?}");
}

/// A store that stops answering on demand.
#[derive(Debug, Clone)]
struct Flaky {
    store: Arc<MemoryStore>,
    down: Arc<AtomicBool>,
}

impl Store for Flaky {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(StoreError::unavailable("down"))));
        }
        self.store.apply(params, op)
    }

    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        if self.down.load(Ordering::SeqCst) {
            return Some(Err(StoreError::unavailable("down")));
        }
        self.store.try_apply(now, params, op)
    }
}

#[tokio::test(start_paused = true)]
async fn an_outage_admits_at_the_share_of_the_holders() {
    let c = config(100, 5);
    let params = *c.params();
    let memory = Arc::new(MemoryStore::new());
    let down = Arc::new(AtomicBool::new(false));
    let lease = Lease::fixed(1, Duration::from_millis(200))
        .expect("valid")
        .local_fallback(true);
    let flaky = Flaky {
        store: memory.clone(),
        down: down.clone(),
    };
    let a = LeaseStore::new(flaky.clone(), lease);
    let b = LeaseStore::new(flaky, lease);
    // Every call a heartbeat: `a` hears of `b` at its next one.
    admit(&a, &params);
    admit(&b, &params);
    admit(&a, &params);
    assert_eq!(a.holders(), 2);
    down.store(true, Ordering::SeqCst);
    // `a` goes on at half the rate (two holders): 20 ms apart, no burst.
    let allowance = Allowance::with_store(c, a.clone());
    let mut times = Vec::new();
    for _ in 0..40 {
        allowance.acquire().await.expect("admitted in the outage");
        times.push(Instant::now());
    }
    let gaps: Vec<u128> = times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_millis())
        .collect();
    let tail = &gaps[gaps.len() - 10..];
    assert!(
        tail.iter().all(|g| *g >= 20),
        "at the share, no burst: {tail:?}"
    );
    // Back: the first call charges what was sent within the last burst window (50 ms:
    // two or three sends at 20 ms), so the bucket is not full again.
    down.store(false, Ordering::SeqCst);
    let mut n = 0;
    while a.in_outage() {
        allowance.acquire().await.expect("admitted");
        n += 1;
        assert!(n < 20, "rejoined within 100 ms (5 admissions at the share)");
    }
    let mut at_once = 0;
    while wait(admit(&*memory, &params)).is_zero() {
        at_once += 1;
    }
    assert!(
        at_once <= 2,
        "{at_once} admitted at once: the outage's sends were not charged"
    );
}

#[cfg(feature = "serde")]
#[tokio::test(start_paused = true)]
async fn a_file_asks_for_a_lease() {
    let spec: crate::AllowanceSpec =
        serde_json::from_str(r#"{ "rate": 100, "burst": 10, "lease": "20:200ms" }"#)
            .expect("a spec with a lease");
    let want = Lease::fixed(20, Duration::from_millis(200)).expect("valid");
    assert_eq!(spec.lease(), Some(want));
    spec.build("leased")
        .await
        .expect("built")
        .acquire()
        .await
        .expect("admitted");
    // A bare configuration has no store to lease from.
    let bare =
        serde_json::from_str::<AllowanceConfig>(r#"{ "rate": 1, "burst": 1, "lease": "auto" }"#);
    assert!(bare.is_err());
    assert!(serde_json::from_str::<crate::AllowanceSpec>(
        r#"{ "rate": 1, "burst": 1, "lease": "0:1s" }"#
    )
    .is_err());
}

/// A holder (leases of one token, local fallback) whose store went down after its first
/// admission, and a 429's cooldown of a second raised while it was down (the store did not
/// hear of it): the holder, and the switch that brings the store back.
async fn cooled_in_an_outage(c: &AllowanceConfig) -> (LeaseStore<Flaky>, Arc<AtomicBool>) {
    let params = *c.params();
    let down = Arc::new(AtomicBool::new(false));
    let lease = Lease::fixed(1, Duration::from_millis(200))
        .expect("valid")
        .local_fallback(true);
    let a = LeaseStore::new(
        Flaky {
            store: Arc::new(MemoryStore::new()),
            down: down.clone(),
        },
        lease,
    );
    admit(&a, &params);
    down.store(true, Ordering::SeqCst);
    let defer = Op(rule::Op::Defer {
        delay_us: Some(1_000_000),
    });
    assert!(a.apply(&params, defer).await.is_err());
    (a, down)
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_raised_in_an_outage_holds_here() {
    let c = config(100, 5);
    let (a, _down) = cooled_in_an_outage(&c).await;
    let allowance = Allowance::with_store(c, a);
    let start = Instant::now();
    allowance.acquire().await.expect("admitted at the share");
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

/// `clear()` lifts the cooldown and leaves the leased tokens where it moved them, as it leaves
/// every reserved slot (conservative: none goes back earlier than the store scheduled it).
#[tokio::test(start_paused = true)]
async fn clear_keeps_the_leased_tokens_where_the_cooldown_moved_them() {
    let c = config(100, 5);
    let params = *c.params();
    let store = LeaseStore::new(
        MemoryStore::new(),
        Lease::fixed(20, Duration::from_millis(200)).expect("valid"),
    );
    admit(&store, &params);
    let held = store.tokens_held();
    assert!(held > 10, "a lease of 20 is held");
    let defer = Op(rule::Op::Defer {
        delay_us: Some(1_000_000),
    });
    store.apply(&params, defer).await.expect("raised");
    store
        .apply(&params, Op(rule::Op::Clear))
        .await
        .expect("cleared");
    assert_eq!(store.tokens_held(), held, "no token dropped");
    let next = store.next_token_in().expect("a token");
    assert!(next >= Duration::from_secs(1), "{next:?}");
    assert!(wait(admit(&store, &params)) >= Duration::from_secs(1));
}

/// `clear()` lifts a cooldown raised here while the store did not answer, as it lifts the
/// store's (the old code held the lease until that cooldown's end after the clearing).
#[tokio::test(start_paused = true)]
async fn clear_lifts_a_cooldown_raised_here_in_an_outage() {
    let c = config(100, 5);
    let (a, down) = cooled_in_an_outage(&c).await;
    down.store(false, Ordering::SeqCst);
    let allowance = Allowance::with_store(c, a);
    allowance.clear().await.expect("cleared");
    let start = Instant::now();
    allowance.acquire().await.expect("admitted");
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
}

/// The share starts where the store's schedule ends, not where this holder's own tokens do:
/// the other holders' tokens granted after its last lease still go out (the old code sent
/// its first share at its own last slot, on top of the other holder's lease).
#[tokio::test(start_paused = true)]
async fn an_outage_s_share_starts_after_the_other_holders_tokens() {
    let c = config(100, 5);
    let params = *c.params();
    let down = Arc::new(AtomicBool::new(false));
    let flaky = Flaky {
        store: Arc::new(MemoryStore::new()),
        down: down.clone(),
    };
    let lease = Lease::fixed(10, Duration::from_millis(200))
        .expect("valid")
        .local_fallback(true);
    let (a, b) = (
        LeaseStore::new(flaky.clone(), lease),
        LeaseStore::new(flaky, lease),
    );
    let start = Instant::now();
    // Round robin, 10 ms slots: a's [0, 50], b's [60, 150], then (each asks for its next
    // lease as its tokens run low) a's [160, 250], b's [260, 350].
    admit(&a, &params);
    admit(&b, &params);
    for store in [&a, &b] {
        while store.lease_calls() < 2 {
            admit(store, &params);
        }
    }
    assert_eq!(a.holders(), 2);
    down.store(true, Ordering::SeqCst);
    // a spends its tokens; its next call fails; the share begins after b's.
    let op = || Op(rule::Op::Admit(AdmitRequest::first()));
    while !a.in_outage() || a.tokens_held() > 0 {
        a.apply(&params, op()).await.expect("from the lease");
    }
    a.apply(&params, op()).await.expect("at the share");
    let first = start.elapsed();
    assert!(
        first > Duration::from_millis(350),
        "the share's first admission at {first:?}, inside b's tokens"
    );
}

/// A rejoining holder marks the bucket as the fleet's fallback left it (spent at the rate
/// since its last lease, which had taken the bucket past empty) with its own first call,
/// before the other holders' calls come in: the old debit (its own sends of the last burst
/// window) left half the burst free for the first lease.
#[tokio::test(start_paused = true)]
async fn a_rejoin_empties_the_bucket_before_the_others_rejoin() {
    let c = config(100, 20);
    let params = *c.params();
    let memory = Arc::new(MemoryStore::new());
    let down = Arc::new(AtomicBool::new(false));
    let flaky = Flaky {
        store: memory.clone(),
        down: down.clone(),
    };
    let lease = |n| {
        Lease::fixed(n, Duration::from_millis(200))
            .expect("valid")
            .local_fallback(true)
    };
    let b = LeaseStore::new(flaky.clone(), lease(1));
    let a = LeaseStore::new(flaky, lease(40));
    admit(&b, &params);
    // 40 tokens: the schedule runs 400 ms ahead, past the 200 ms burst window.
    admit(&a, &params);
    assert_eq!(a.holders(), 2);
    down.store(true, Ordering::SeqCst);
    // The lease, then the share (20 ms apart) until a second has passed; b is silent here,
    // and whatever it sent is not known.
    let allowance = Allowance::with_store(c, a.clone());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        allowance.acquire().await.expect("admitted in the outage");
    }
    down.store(false, Ordering::SeqCst);
    while a.in_outage() {
        allowance.acquire().await.expect("admitted");
    }
    // The lease taken on rejoining starts after an empty bucket's next slot, 10 ms away.
    let first = a.next_token_in().expect("a lease is held");
    assert!(
        first >= Duration::from_millis(10),
        "the rejoin's lease starts {first:?} from now: the bucket was not empty"
    );
}

/// `jobs` acquisitions of class `name` by `workers` tasks, logging (class, admitted at).
#[cfg(feature = "shares")]
fn spawn_class(
    allowance: &Allowance,
    (name, workers, jobs): (&str, usize, usize),
    log: &Arc<Mutex<Vec<(String, Instant)>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    use crate::{shares::Class, AcquireOptions};
    (0..workers)
        .map(|w| {
            let (a, log, name) = (allowance.clone(), log.clone(), name.to_owned());
            let mine = (w..jobs).step_by(workers).count();
            tokio::spawn(async move {
                for _ in 0..mine {
                    let options = AcquireOptions::new().class(&Class::new(name.clone()));
                    a.acquire_with(options).await.expect("admitted");
                    log.lock()
                        .expect("lock")
                        .push((name.clone(), Instant::now()));
                }
            })
        })
        .collect()
}

/// A memory store that counts the calls it answers.
#[cfg(feature = "shares")]
#[derive(Debug, Clone, Default)]
struct Counted {
    store: Arc<MemoryStore>,
    calls: Arc<std::sync::atomic::AtomicU64>,
}

#[cfg(feature = "shares")]
impl Store for Counted {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.store.apply(params, op)
    }

    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.store.try_apply(now, params, op)
    }
}

/// With classes (feature `shares`) the shares are applied inside the lease: the classes'
/// admissions take leased tokens (far fewer store calls than admissions), in the weights'
/// proportions while they wait, within the bucket, without stranding its slots. (The old
/// code sent every classed admission to the store: one call each.)
#[cfg(feature = "shares")]
#[tokio::test(start_paused = true)]
async fn the_classes_share_the_leased_tokens_by_weight() {
    use crate::shares::Share;
    let classed = config(100, 5)
        .with_class("a", Share::weight(3).expect("valid"))
        .expect("valid")
        .with_class("b", Share::weight(1).expect("valid"))
        .expect("valid");
    let counted = Counted::default();
    let store = LeaseStore::new(counted.clone(), Lease::auto());
    let allowance = Allowance::with_store(classed, store.clone());
    let (start, log) = (Instant::now(), Arc::new(Mutex::new(Vec::new())));
    let mut tasks = spawn_class(&allowance, ("a", 20, 600), &log);
    tasks.extend(spawn_class(&allowance, ("b", 20, 600), &log));
    for t in tasks {
        t.await.expect("worker");
    }
    let log = log.lock().expect("lock").clone();
    assert_eq!(log.len(), 1_200);
    let calls = counted.calls.load(Ordering::SeqCst);
    assert!(
        calls <= 1_200 / 10,
        "{calls} store calls for 1,200 admissions"
    );
    // While both wait (a's 600 run out after 800 admissions at 3:1): 3:1, to a few
    // admissions (the turn alternates by virtual finish time; the burst went first come).
    let first: Vec<_> = log.iter().take(800).collect();
    let of_a = first.iter().filter(|(c, _)| c == "a").count();
    assert!((of_a as i64 - 600).abs() <= 8, "a: {of_a} of the first 800");
    let mut times: Vec<_> = log.iter().map(|(_, t)| *t).collect();
    times.sort();
    within_the_bucket(&times, 100, 5);
    // No slot stranded: 1,200 admissions at 100/s after a burst of 5, to a few slots.
    let last = times.last().expect("admitted").duration_since(start);
    assert!(
        last <= Duration::from_millis((1_200 - 5) * 10 + 40),
        "the last admission at {last:?}"
    );
}

/// A high class's request takes this process's next leased token, ahead of every caller
/// waiting for the next lease: behind a backlog of 400, it waits at most the slot being
/// served and the one a bulk caller already holds (two intervals, 20 ms at 100/s).
#[cfg(feature = "shares")]
#[tokio::test(start_paused = true)]
async fn a_high_request_takes_the_next_leased_token() {
    use crate::{
        shares::{Class, Share},
        AcquireOptions,
    };
    let classed = config(100, 5)
        .with_class("urgent", Share::weight(1).expect("valid").high())
        .expect("valid")
        .with_class("bulk", Share::weight(1).expect("valid"))
        .expect("valid");
    let counted = Counted::default();
    let store = LeaseStore::new(counted.clone(), Lease::auto());
    let allowance = Allowance::with_store(classed, store);
    let (start, log) = (Instant::now(), Arc::new(Mutex::new(Vec::new())));
    let bulk = spawn_class(&allowance, ("bulk", 40, 400), &log);
    let mut waits = Vec::new();
    for k in 1..=10u64 {
        tokio::time::sleep_until(start + Duration::from_millis(k * 300)).await;
        let arrived = Instant::now();
        let options = AcquireOptions::new().class(&Class::new("urgent"));
        allowance.acquire_with(options).await.expect("admitted");
        waits.push(arrived.elapsed());
    }
    for t in bulk {
        t.await.expect("worker");
    }
    let worst = *waits.iter().max().expect("waits");
    assert!(worst <= Duration::from_millis(21), "{waits:?}");
    let calls = counted.calls.load(Ordering::SeqCst);
    assert!(calls <= 410 / 5, "{calls} store calls for 410 admissions");
    // The backlog ran at the bucket's rate: 410 admissions.
    let log = log.lock().expect("lock").clone();
    let last = log.iter().map(|(_, t)| *t).max().expect("admitted");
    assert!(
        last.duration_since(start) <= Duration::from_millis((410 - 5) * 10 + 40),
        "{:?}",
        last.duration_since(start)
    );
}

/// A flood of the high class does not starve the others inside a lease either: beyond its
/// lead ([`HIGH_LEAD`](crate::rule::HIGH_LEAD) admissions) it shares by weight.
#[cfg(feature = "shares")]
#[tokio::test(start_paused = true)]
async fn a_high_flood_shares_by_weight_beyond_its_lead() {
    use crate::shares::Share;
    let classed = config(100, 5)
        .with_class("urgent", Share::weight(1).expect("valid").high())
        .expect("valid")
        .with_class("bulk", Share::weight(1).expect("valid"))
        .expect("valid");
    let counted = Counted::default();
    let store = LeaseStore::new(counted.clone(), Lease::auto());
    let allowance = Allowance::with_store(classed, store);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = spawn_class(&allowance, ("urgent", 20, 300), &log);
    tasks.extend(spawn_class(&allowance, ("bulk", 20, 300), &log));
    for t in tasks {
        t.await.expect("worker");
    }
    let log = log.lock().expect("lock").clone();
    let first: Vec<_> = log.iter().take(400).collect();
    let bulk = first.iter().filter(|(c, _)| c == "bulk").count();
    // Half of 400, less the high class's lead and the burst (taken first come, by the
    // urgent callers, spawned first): 193 here; 104 before a jump counted in this
    // process's own virtual times (the class queues' `q.local`).
    let lead = crate::rule::HIGH_LEAD as usize;
    assert!(bulk >= 200 - lead - 5, "bulk: {bulk} of the first 400");
    let calls = counted.calls.load(Ordering::SeqCst);
    assert!(calls <= 600 / 10, "{calls} store calls for 600 admissions");
}

/// A cooldown freezes a lease that classes draw on as any other: no classed admission
/// inside it.
#[cfg(feature = "shares")]
#[tokio::test(start_paused = true)]
async fn a_cooldown_freezes_the_classes_lease() {
    use crate::shares::Share;
    let classed = config(100, 5)
        .with_class("urgent", Share::weight(1).expect("valid").high())
        .expect("valid")
        .with_class("bulk", Share::weight(3).expect("valid"))
        .expect("valid");
    let store = LeaseStore::new(MemoryStore::new(), Lease::auto());
    let allowance = Allowance::with_store(classed, store.clone());
    let (start, log) = (Instant::now(), Arc::new(Mutex::new(Vec::new())));
    let mut tasks = spawn_class(&allowance, ("urgent", 4, 60), &log);
    tasks.extend(spawn_class(&allowance, ("bulk", 20, 300), &log));
    // A 429 at 1 s: a cooldown of one second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(store.tokens_held() > 0, "tokens are leased when it comes");
    let params = *allowance.config().params();
    let defer = Op(rule::Op::Defer {
        delay_us: Some(1_000_000),
    });
    store.apply(&params, defer).await.expect("raised");
    let raised = start.elapsed();
    for t in tasks {
        t.await.expect("worker");
    }
    let log = log.lock().expect("lock").clone();
    let inside: Vec<_> = (log.iter())
        .map(|(c, t)| (c, t.duration_since(start)))
        .filter(|(_, t)| *t > raised && *t < raised + Duration::from_secs(1))
        .collect();
    assert!(inside.is_empty(), "inside the cooldown: {inside:?}");
    assert_eq!(log.len(), 360);
}

/// A store whose calls hang (never answer) while `hang` is set, and that answers nothing
/// synchronously (as Redis).
#[derive(Debug, Clone)]
struct Hanging {
    store: Arc<MemoryStore>,
    hang: Arc<AtomicBool>,
}

impl Store for Hanging {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        if self.hang.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        self.store.apply(params, op)
    }
}

/// A lease call that never answers is given up after twice the call timeout: the holder
/// falls back at its share and rejoins once the store answers again (the old code waited
/// for that call for ever: no share, no rejoin).
#[tokio::test(start_paused = true)]
async fn a_lease_call_that_hangs_is_given_up() {
    let c = config(100, 5);
    let params = *c.params();
    let hang = Arc::new(AtomicBool::new(false));
    let store = Hanging {
        store: Arc::new(MemoryStore::new()),
        hang: hang.clone(),
    };
    let lease = Lease::fixed(1, Duration::from_millis(200))
        .expect("valid")
        .local_fallback(true);
    let a = LeaseStore::new(store, lease);
    let op = || Op(rule::Op::Admit(AdmitRequest::first()));
    a.apply(&params, op()).await.expect("a first lease");
    hang.store(true, Ordering::SeqCst);
    let allowance = Allowance::with_store(c, a.clone());
    let within = Duration::from_secs(5);
    for _ in 0..5 {
        tokio::time::timeout(within, allowance.acquire())
            .await
            .expect("the hanging call was given up")
            .expect("admitted at the share");
    }
    assert!(a.in_outage());
    hang.store(false, Ordering::SeqCst);
    let start = Instant::now();
    while a.in_outage() {
        tokio::time::timeout(within, allowance.acquire())
            .await
            .expect("not stuck")
            .expect("admitted");
        assert!(start.elapsed() < within, "never rejoined");
    }
}

/// A high request the lease does not answer (of cost 2: to the store) jumps the store's
/// queue: the leased tokens move two increments on, as every pending reservation does, so
/// the admissions stay within the bucket.
#[cfg(feature = "shares")]
#[tokio::test(start_paused = true)]
async fn a_jump_at_the_store_moves_the_leased_tokens() {
    use crate::{
        shares::{Class, Share},
        AcquireOptions,
    };
    let classed = config(100, 5)
        .with_class("urgent", Share::weight(1).expect("valid").high())
        .expect("valid")
        .with_class("bulk", Share::weight(1).expect("valid"))
        .expect("valid");
    let store = LeaseStore::new(
        MemoryStore::new(),
        Lease::fixed(20, Duration::from_millis(200)).expect("valid"),
    );
    let allowance = Allowance::with_store(classed, store.clone());
    let log = Arc::new(Mutex::new(Vec::new()));
    let bulk = spawn_class(&allowance, ("bulk", 10, 60), &log);
    tokio::time::sleep(Duration::from_millis(52)).await;
    assert!(store.tokens_held() > 0, "tokens are leased");
    let before = store.next_token_in().expect("a token");
    let options = AcquireOptions::new().class(&Class::new("urgent")).cost(2);
    let asked = Instant::now();
    allowance.acquire_with(options).await.expect("admitted");
    let waited = asked.elapsed();
    log.lock()
        .expect("lock")
        .push(("urgent".into(), Instant::now()));
    log.lock()
        .expect("lock")
        .push(("urgent".into(), Instant::now()));
    // It took the slot after the one being served (10 ms), not one behind the tokens.
    assert!(waited <= Duration::from_millis(10), "{waited:?}");
    let after = waited + store.next_token_in().expect("a token");
    assert!(
        after >= before + Duration::from_millis(20),
        "the leased tokens moved on: {before:?} then {after:?}"
    );
    for t in bulk {
        t.await.expect("worker");
    }
    let mut times: Vec<_> = log.lock().expect("lock").iter().map(|(_, t)| *t).collect();
    times.sort();
    within_the_bucket(&times, 100, 5);
}

/// `allowance`'s layers with retries (up to 20 attempts) over an upstream whose first eight
/// calls succeed and every later one is answered 429 (`Retry-After: 1`): the upstream's call
/// count, and the stack.
fn eight_then_429s(
    allowance: &Allowance,
) -> (
    Arc<std::sync::atomic::AtomicUsize>,
    impl tower::Service<
            http::Request<String>,
            Response = http::Response<String>,
            Error = crate::BoxError,
            Future: Send,
        > + Clone,
) {
    use http::{Response, StatusCode};
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    let upstream = tower::service_fn(move |_req: http::Request<String>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut res = Response::new(String::new());
            if n >= 8 {
                *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                res.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from_static("1"),
                );
            }
            Ok::<_, std::convert::Infallible>(res)
        }
    });
    let retry = crate::retry::RetryConfig::default()
        .with_max_attempts(20)
        .expect("valid");
    let svc = tower::ServiceBuilder::new()
        .layer(allowance.layer().with_retry(retry))
        .service(upstream);
    (calls, svc)
}

/// A replenishing retry budget earns retries from successes, which travel with the next
/// store call: under a lease, the first attempts are admitted from leased tokens and never
/// reach the store alone, so their successes go with the lease's next call (the old code
/// dropped them: the budget had only its reserve, here none, and the first retry was refused
/// as budget-exhausted after eight successes).
#[tokio::test(start_paused = true)]
async fn the_successes_a_lease_admits_earn_retries() {
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    use crate::{error::AbandonReason, Outcome, RetryBudgetConfig};

    // No reserve: every retry is earned, half a retry per success.
    let budget = crate::ReplenishingBudget::new(Duration::from_secs(60), 0, 0.5).expect("valid");
    let c = config(100, 100).with_retry_budget(RetryBudgetConfig::Replenishing(budget));
    let store = LeaseStore::new(
        MemoryStore::new(),
        Lease::fixed(4, Duration::from_millis(200)).expect("valid"),
    );
    let allowance = Allowance::with_store(c, store.clone());
    // The first eight calls succeed, every later one is answered 429 (Retry-After: 1).
    let (calls, svc) = eight_then_429s(&allowance);
    for _ in 0..8 {
        let res = svc.clone().oneshot(Request::new(String::new())).await;
        assert_eq!(res.expect("answered").status(), StatusCode::OK);
    }
    // Each admission carries the success before it; the lease calls (at the 1st, 4th and
    // 8th admissions: each when the last of its 4 tokens goes) carry 0, 3 and 4 of them,
    // the read the 8th: 8 successes, 4 retries earned.
    assert_eq!(store.lease_calls(), 3);
    let state = allowance.store_state().await.expect("state");
    assert_eq!(
        state.retries_remaining,
        Some(4),
        "8 successes earned 4 retries"
    );
    // A request answered 429 every time: its first attempt and the 4 retries earned.
    let result = svc.clone().oneshot(Request::new(String::new())).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::BudgetExhausted)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 8 + 1 + 4);
}

/// A retry the lease does not answer takes the successes admitted since the last lease call
/// to the store with it: a lease of 100 tokens, one lease call for the eight successes,
/// and the retries of a request answered 429 see all eight (the old code: none until the
/// next lease call, and the first retry was refused).
#[tokio::test(start_paused = true)]
async fn a_retry_carries_the_successes_the_lease_holds() {
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    use crate::{error::AbandonReason, Outcome, RetryBudgetConfig};

    let budget = crate::ReplenishingBudget::new(Duration::from_secs(60), 0, 0.5).expect("valid");
    let c = config(100, 100).with_retry_budget(RetryBudgetConfig::Replenishing(budget));
    let lease = Lease::fixed(100, Duration::from_secs(1)).expect("valid");
    let store = LeaseStore::new(MemoryStore::new(), lease);
    let allowance = Allowance::with_store(c, store.clone());
    let (calls, svc) = eight_then_429s(&allowance);
    for _ in 0..8 {
        let res = svc.clone().oneshot(Request::new(String::new())).await;
        assert_eq!(res.expect("answered").status(), StatusCode::OK);
    }
    assert_eq!(store.lease_calls(), 1, "one lease for them all");
    let result = svc.clone().oneshot(Request::new(String::new())).await;
    assert_eq!(
        Outcome::of(&result),
        Outcome::Abandoned(AbandonReason::BudgetExhausted)
    );
    // Its first attempt and the 4 retries the 8 successes earned.
    assert_eq!(calls.load(Ordering::SeqCst), 8 + 1 + 4);
}

/// A store that answers at once while up and fails in the background while `down` is set
/// (as Redis does when it stops answering).
#[derive(Debug, Clone)]
struct Remote {
    store: Arc<MemoryStore>,
    down: Arc<AtomicBool>,
}

impl Store for Remote {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(StoreError::unavailable("down"))));
        }
        self.store.apply(params, op)
    }

    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        if self.down.load(Ordering::SeqCst) {
            return None;
        }
        self.store.try_apply(now, params, op)
    }
}

/// The successes a lease admits go with its next call; a call that fails keeps them for the
/// one after (the caller told the error keeps its own), and the holder's drop sends what is
/// left: each counted once.
#[tokio::test(start_paused = true)]
async fn a_failed_lease_call_keeps_its_successes_for_the_next() {
    // One retry per success, no reserve: the retries left are the successes recorded.
    let budget = crate::ReplenishingBudget::new(Duration::from_secs(60), 0, 1.0).expect("valid");
    let c = config(100, 100).with_retry_budget(crate::RetryBudgetConfig::Replenishing(budget));
    let params = *c.params();
    let memory = Arc::new(MemoryStore::new());
    let down = Arc::new(AtomicBool::new(false));
    let remote = Remote {
        store: memory.clone(),
        down: down.clone(),
    };
    let store = LeaseStore::new(
        remote,
        Lease::fixed(2, Duration::from_millis(200)).expect("valid"),
    );
    let admit = |deposits| Op(rule::Op::Admit(AdmitRequest::first().deposits(deposits)));
    let recorded =
        || match memory.try_apply(Instant::now(), &params, &Op(rule::Op::Read { deposits: 0 })) {
            Some(Ok(Reply(rule::Reply::State(s)))) => s.retries_remaining,
            other => panic!("read answered {other:?}"),
        };
    let admitted = |r: Result<Reply, StoreError>| {
        assert!(
            matches!(r, Ok(Reply(rule::Reply::Admit(Admission::Admitted)))),
            "{r:?}"
        );
    };
    // A lease of 2: both admissions from it, their 1 + 2 successes held here.
    admitted(store.apply(&params, admit(1)).await);
    admitted(store.apply(&params, admit(2)).await);
    assert_eq!((store.lease_calls(), recorded()), (1, Some(0)));
    // The next lease call carries the 3 and fails: kept. Its caller is told the error and
    // keeps its own 4 (the allowance sends them again).
    down.store(true, Ordering::SeqCst);
    assert!(store.apply(&params, admit(4)).await.is_err());
    assert_eq!((store.lease_calls(), recorded()), (2, Some(0)));
    down.store(false, Ordering::SeqCst);
    admitted(store.apply(&params, admit(4)).await);
    assert_eq!((store.lease_calls(), recorded()), (3, Some(3)));
    // The holder goes with no tail to give back (its last token's slot is now): a call for
    // the last 4 alone.
    drop(store);
    assert_eq!(recorded(), Some(7));
}

/// A class's admission a lease answers carries its inner request's successes to the lease
/// like a plain one (`admit_now` is handed the inner request).
#[cfg(feature = "shares")]
#[tokio::test(start_paused = true)]
async fn a_classed_admission_s_successes_go_with_the_lease() {
    use crate::shares::Share;

    let budget = crate::ReplenishingBudget::new(Duration::from_secs(60), 0, 1.0).expect("valid");
    let c = config(100, 100)
        .with_retry_budget(crate::RetryBudgetConfig::Replenishing(budget))
        .with_class("bulk", Share::weight(1).expect("valid"))
        .expect("valid");
    let params = *c.params();
    let memory = Arc::new(MemoryStore::new());
    let store = LeaseStore::new(
        memory.clone(),
        Lease::fixed(4, Duration::from_millis(200)).expect("valid"),
    );
    for deposits in [3, 2] {
        let req = rule::ShareRequest::new(AdmitRequest::first().deposits(deposits), 0, 1);
        let answer = store.apply(&params, Op(rule::Op::Share(req))).await;
        assert!(
            matches!(
                answer,
                Ok(Reply(rule::Reply::Share(rule::ShareReply {
                    admission: Admission::Admitted,
                    ..
                })))
            ),
            "{answer:?}"
        );
    }
    assert_eq!(store.lease_calls(), 1);
    // The holder goes (its tokens' slots are now: no tail): a call for the 5 alone.
    drop(store);
    let read = memory.try_apply(Instant::now(), &params, &Op(rule::Op::Read { deposits: 0 }));
    let Some(Ok(Reply(rule::Reply::State(state)))) = read else {
        panic!("read answered {read:?}");
    };
    assert_eq!(state.retries_remaining, Some(5));
}

/// In an outage, with the lease's last tokens expired but not yet dropped, an admission
/// asked as the allowance asks (`try_apply`, then `apply`) is answered once: the old
/// `try_apply` took a slot of the share, dropped it (a sleep is `apply`'s), and `apply`
/// took the next one, counting the admission's successes twice (and its send twice in the
/// rejoin's debit).
#[tokio::test(start_paused = true)]
async fn an_admission_asked_twice_in_an_outage_is_answered_once() {
    let budget = crate::ReplenishingBudget::new(Duration::from_secs(60), 0, 1.0).expect("valid");
    let c = config(100, 100).with_retry_budget(crate::RetryBudgetConfig::Replenishing(budget));
    let params = *c.params();
    let memory = Arc::new(MemoryStore::new());
    let down = Arc::new(AtomicBool::new(false));
    let flaky = Flaky {
        store: memory.clone(),
        down: down.clone(),
    };
    let lease = Lease::fixed(8, Duration::from_millis(200))
        .expect("valid")
        .local_fallback(true);
    let store = LeaseStore::new(flaky, lease);
    // As the allowance asks.
    let ask = |deposits: u64| {
        let store = store.clone();
        async move {
            let op = Op(rule::Op::Admit(AdmitRequest::first().deposits(deposits)));
            let reply = match store.try_apply(Instant::now(), &params, &op) {
                Some(reply) => reply,
                None => store.apply(&params, op).await,
            };
            assert!(
                matches!(reply, Ok(Reply(rule::Reply::Admit(Admission::Admitted)))),
                "{reply:?}"
            );
        }
    };
    for _ in 0..6 {
        ask(0).await;
    }
    // The 7th token leaves one: the next lease call fails, the outage begins.
    down.store(true, Ordering::SeqCst);
    ask(0).await;
    assert!(store.in_outage());
    assert_eq!(store.tokens_held(), 1);
    // Its slot passes: the next admission is the share's.
    tokio::time::advance(Duration::from_millis(10)).await;
    ask(1).await;
    // Back after the rejoin's probe interval: the rejoin carries that one success.
    down.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_millis(100)).await;
    ask(0).await;
    assert!(!store.in_outage());
    let read = memory.try_apply(Instant::now(), &params, &Op(rule::Op::Read { deposits: 0 }));
    let Some(Ok(Reply(rule::Reply::State(state)))) = read else {
        panic!("read answered {read:?}");
    };
    assert_eq!(
        state.retries_remaining,
        Some(1),
        "one success, counted once"
    );
}

/// A store that fails every call at once, without I/O.
#[derive(Debug, Clone)]
struct Failing;

impl Store for Failing {
    fn apply(&self, _: &Params, _: Op) -> StoreFuture<Reply> {
        Box::pin(std::future::ready(Err(StoreError::unavailable("down"))))
    }

    fn try_apply(&self, _: Instant, _: &Params, _: &Op) -> Option<Result<Reply, StoreError>> {
        Some(Err(StoreError::unavailable("down")))
    }
}

/// A lease call that fails without I/O (no local fallback) fails the admission that made it
/// (the old code queued it after the call was over: it waited for ever).
#[tokio::test(start_paused = true)]
async fn a_lease_call_failing_at_once_fails_its_admission() {
    let store = LeaseStore::new(Failing, Lease::auto());
    let allowance = Allowance::with_store(config(100, 5), store.clone());
    let acquired = tokio::time::timeout(Duration::from_secs(60), allowance.acquire()).await;
    assert!(
        matches!(acquired, Ok(Err(_))),
        "the admission ends, failed: {acquired:?}"
    );
}

/// A high request within its lead, in a process that holds no token within two intervals,
/// goes to the store and jumps its queue (the slot after the one being served; the other
/// process's leased tokens move on): it does not wait behind the tokens leased to others
/// (the old code: up to a lease of 50, 500 ms). Two holders on one bucket, all within it.
#[cfg(feature = "shares")]
#[tokio::test(start_paused = true)]
async fn a_high_request_without_a_near_token_jumps_at_the_store() {
    use crate::{
        shares::{Class, Share},
        AcquireOptions,
    };
    let classed = || {
        config(100, 5)
            .with_class("urgent", Share::weight(1).expect("valid").high())
            .expect("valid")
            .with_class("bulk", Share::weight(1).expect("valid"))
            .expect("valid")
    };
    let memory = Arc::new(MemoryStore::new());
    let fifty = Lease::fixed(50, Duration::from_secs(1)).expect("valid");
    let a = Allowance::with_store(classed(), LeaseStore::new(memory.clone(), fifty));
    let b = Allowance::with_store(classed(), LeaseStore::new(memory, Lease::auto()));
    let (start, log) = (Instant::now(), Arc::new(Mutex::new(Vec::new())));
    let bulk = spawn_class(&a, ("bulk", 40, 400), &log);
    let mut waits = Vec::new();
    for k in 1..=8u64 {
        tokio::time::sleep_until(start + Duration::from_millis(k * 400)).await;
        let asked = Instant::now();
        let options = AcquireOptions::new().class(&Class::new("urgent"));
        b.acquire_with(options).await.expect("admitted");
        waits.push(asked.elapsed());
        log.lock()
            .expect("lock")
            .push(("urgent".into(), Instant::now()));
    }
    for t in bulk {
        t.await.expect("worker");
    }
    let worst = *waits.iter().max().expect("waits");
    assert!(worst <= Duration::from_millis(21), "{waits:?}");
    let mut times: Vec<_> = log.lock().expect("lock").iter().map(|(_, t)| *t).collect();
    times.sort();
    assert_eq!(times.len(), 408);
    within_the_bucket(&times, 100, 5);
}
