//! Shares of one allowance (feature `shares`): weighted fair shares and strict priority
//! between classes of callers, and how classes combine with the other features. Virtual time.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::{
    shares::{Class, Share},
    AcquireOptions, Allowance, AllowanceConfig, Attempt,
};

fn config(rate: u32, burst: u32) -> AllowanceConfig {
    AllowanceConfig::per_second(rate, burst)
        .expect("valid")
        .exact()
}

fn ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

type Log = Arc<Mutex<Vec<(String, u64)>>>;

/// `workers` tasks of class `name`, each acquiring `jobs / workers` times in a row, logging
/// (class, admitted at ms).
fn spawn_class(
    allowance: &Allowance,
    name: &str,
    workers: usize,
    jobs: usize,
    start: Instant,
    log: &Log,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..workers)
        .map(|w| {
            let (allowance, log, name) = (allowance.clone(), log.clone(), name.to_owned());
            let mine = (w..jobs).step_by(workers).count();
            tokio::spawn(async move {
                let class = Class::new(name.clone());
                for _ in 0..mine {
                    allowance
                        .acquire_with(AcquireOptions::new().class(&class))
                        .await
                        .expect("admitted");
                    log.lock().expect("ok").push((name.clone(), ms(start)));
                }
            })
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn weights_share_the_admissions_while_classes_wait_and_a_dry_class_lends_at_once() {
    // 20/s burst 4: a 3:2:1 backlog of 100 jobs each.
    let allowance = Allowance::new(
        config(20, 4)
            .with_class("a", Share::weight(3).expect("ok"))
            .expect("ok")
            .with_class("b", Share::weight(2).expect("ok"))
            .expect("ok")
            .with_class("c", Share::weight(1).expect("ok"))
            .expect("ok"),
    );
    let (start, log) = (Instant::now(), Log::default());
    let mut tasks = Vec::new();
    for name in ["a", "b", "c"] {
        tasks.extend(spawn_class(&allowance, name, 10, 100, start, &log));
    }
    for t in tasks {
        t.await.expect("ok");
    }
    let log = log.lock().expect("ok").clone();
    assert_eq!(log.len(), 300);
    // The first 6 s (123 admissions): 3:2:1, each class within the burst (4, spent at the
    // start by whoever asked first) and one admission (the turn alternates classes by
    // virtual finish time, so between classes it is off by one at most).
    let first: Vec<_> = log.iter().filter(|(_, at)| *at < 6_000).collect();
    let count = |c: &str| first.iter().filter(|(n, _)| n == c).count() as f64;
    let total = first.len() as f64;
    for (c, w) in [("a", 3.0), ("b", 2.0), ("c", 1.0)] {
        let want = total * w / 6.0;
        assert!(
            (count(c) - want).abs() <= 5.0,
            "{c}: {} of {total}, want {want}",
            count(c)
        );
    }
    // No slot wasted: 300 admissions at 20/s after a burst of 4 end at (300 - 4) / 20 s.
    let last = log.iter().map(|(_, at)| *at).max().expect("ok");
    assert_eq!(
        last,
        (300 - 4) * 50,
        "the makespan is the bucket's, to the slot"
    );
    let snap = allowance.snapshot();
    let a = snap.classes.iter().find(|c| c.name == "a").expect("ok");
    assert_eq!((a.weight, a.admitted, a.waiting), (3, 100, 0));
}

#[tokio::test(start_paused = true)]
async fn a_high_class_waits_one_interval_behind_any_backlog() {
    let allowance = Allowance::new(
        config(20, 4)
            .with_class("urgent", Share::weight(1).expect("ok").high())
            .expect("ok")
            .with_class("bulk", Share::weight(1).expect("ok"))
            .expect("ok"),
    );
    let (start, log) = (Instant::now(), Log::default());
    let bulk = spawn_class(&allowance, "bulk", 40, 400, start, &log);
    let urgent = tokio::spawn({
        let allowance = allowance.clone();
        async move {
            let mut waits = Vec::new();
            for k in 1..=20u64 {
                tokio::time::sleep_until(start + Duration::from_millis(k * 500)).await;
                let arrived = Instant::now();
                allowance
                    .acquire_with(AcquireOptions::new().class(&Class::new("urgent")))
                    .await
                    .expect("admitted");
                waits.push(arrived.elapsed());
            }
            waits
        }
    });
    let waits = urgent.await.expect("ok");
    for t in bulk {
        t.await.expect("ok");
    }
    // One interval (50 ms) behind the slot being served, at most (slots on whole ms).
    let worst = waits.iter().max().expect("ok");
    assert!(*worst <= Duration::from_millis(51), "{waits:?}");
    assert!(
        *worst >= Duration::from_millis(1),
        "a backlog was there: {waits:?}"
    );
    // The bulk backlog still ran at the bucket's rate: 420 admissions.
    let last = log
        .lock()
        .expect("ok")
        .iter()
        .map(|(_, at)| *at)
        .max()
        .expect("ok");
    assert!(last <= (420 - 4) * 50 + 1, "{last}");
}

/// The starvation bound: a flood of the high class takes at most its weighted share plus
/// [`HIGH_LEAD`](tower_allowance::rule::HIGH_LEAD) admissions while the others wait. (The
/// old code did not count a jump in the process's own virtual times: once past its lead
/// the high class queued with its share still unspent, and took 268 of the first 400.)
#[tokio::test(start_paused = true)]
async fn a_high_flood_takes_its_share_and_its_lead_no_more() {
    let allowance = Allowance::new(
        config(100, 5)
            .with_class("urgent", Share::weight(1).expect("ok").high())
            .expect("ok")
            .with_class("bulk", Share::weight(1).expect("ok"))
            .expect("ok"),
    );
    let (start, log) = (Instant::now(), Log::default());
    let mut tasks = spawn_class(&allowance, "urgent", 20, 300, start, &log);
    tasks.extend(spawn_class(&allowance, "bulk", 20, 300, start, &log));
    for t in tasks {
        t.await.expect("ok");
    }
    let log = log.lock().expect("ok").clone();
    let bulk = log.iter().take(400).filter(|(c, _)| c == "bulk").count();
    // Half of 400, less the lead and the burst (taken first come, by the urgent callers).
    let lead = tower_allowance::rule::HIGH_LEAD as usize;
    assert!(bulk >= 200 - lead - 5, "bulk: {bulk} of the first 400");
    assert!(bulk <= 200, "bulk: {bulk} of the first 400");
}

fn two_classes(rate: u32, burst: u32) -> AllowanceConfig {
    config(rate, burst)
        .with_class("a", Share::weight(1).expect("ok"))
        .expect("ok")
        .with_class("b", Share::weight(1).expect("ok"))
        .expect("ok")
}

fn of(name: &str) -> AcquireOptions {
    AcquireOptions::new().class(&Class::new(name))
}

#[tokio::test(start_paused = true)]
async fn a_caller_leaving_its_class_queue_or_its_turn_stalls_nobody() {
    // 10/s burst 1: the burst at once, then one turn at a time: the holder's slot at 100 ms.
    let allowance = Allowance::new(two_classes(10, 1));
    let start = Instant::now();
    allowance.acquire_with(of("a")).await.expect("ok");
    let spawn = |name: &'static str| {
        let a = allowance.clone();
        tokio::spawn(async move { a.acquire_with(of(name)).await.map(|()| ms(start)) })
    };
    let holder = spawn("a");
    tokio::task::yield_now().await;
    let queued = spawn("b");
    let next = spawn("a");
    let last = spawn("b");
    tokio::task::yield_now().await;
    // One leaves while queued, the turn's holder leaves before its slot.
    queued.abort();
    tokio::time::sleep(Duration::from_millis(10)).await;
    holder.abort();
    // Its slot goes back to the store (the latest), the turn to the next in line (b: a was
    // served twice already, b's place is the virtual time it began waiting at): the two
    // left are admitted on the next two slots, nobody waits for a turn that never ends.
    assert_eq!(last.await.expect("ok").expect("ok"), 100);
    assert_eq!(next.await.expect("ok").expect("ok"), 200);
    let snap = allowance.snapshot();
    assert!(snap.classes.iter().all(|c| c.waiting == 0), "{snap:?}");
}

#[tokio::test(start_paused = true)]
async fn a_deadline_passing_in_the_class_queue_fails_at_the_deadline() {
    let allowance = Allowance::new(two_classes(10, 1));
    let start = Instant::now();
    allowance.acquire_with(of("a")).await.expect("ok");
    let holder = {
        let a = allowance.clone();
        tokio::spawn(async move { a.acquire_with(of("a")).await })
    };
    tokio::task::yield_now().await;
    // Queued behind the turn (slot at 100 ms), with a deadline at 30 ms.
    let deadline = start + Duration::from_millis(30);
    let err = allowance
        .acquire_with(of("b").deadline(deadline))
        .await
        .expect_err("an error");
    assert_eq!(
        err.abandon_reason(),
        Some(tower_allowance::error::AbandonReason::Deadline)
    );
    assert_eq!(ms(start), 30, "failed at its deadline, not at the turn");
    holder.await.expect("ok").expect("ok");
    assert_eq!(ms(start), 100);
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_moves_the_turn_and_the_classes_share_after_it() {
    let allowance = Allowance::new(two_classes(10, 1));
    let (start, log) = (Instant::now(), Log::default());
    let mut tasks = spawn_class(&allowance, "a", 3, 12, start, &log);
    tasks.extend(spawn_class(&allowance, "b", 3, 12, start, &log));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(allowance
        .extend_cooldown(Duration::from_secs(1))
        .await
        .expect("ok"));
    for t in tasks {
        t.await.expect("ok");
    }
    let log = log.lock().expect("ok").clone();
    // Admitted at 0 and 100 ms; the slot reserved for 200 ms moved past the cooldown's end
    // (1.15 s); then one per interval, alternating classes.
    let times: Vec<u64> = log.iter().map(|(_, at)| *at).collect();
    assert_eq!(&times[..3], &[0, 100, 1_200], "{log:?}");
    assert_eq!(times[23], 1_200 + 21 * 100);
    let firsts: Vec<&str> = log[2..14].iter().map(|(n, _)| n.as_str()).collect();
    let a = firsts.iter().filter(|n| **n == "a").count();
    assert_eq!(a, 6, "{firsts:?}");
}

#[tokio::test(start_paused = true)]
async fn a_cost_counts_in_its_class_share() {
    // Equal weights, a costs 2: while both wait, b is admitted twice as often.
    let allowance = Allowance::new(two_classes(10, 1));
    let (start, log) = (Instant::now(), Log::default());
    let mut tasks = Vec::new();
    for (name, cost) in [("a", 2u32), ("b", 1)] {
        for _ in 0..3 {
            let (a, log) = (allowance.clone(), log.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    a.acquire_with(of(name).cost(cost)).await.expect("ok");
                    log.lock().expect("ok").push((name.to_owned(), ms(start)));
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("ok");
    }
    let log = log.lock().expect("ok").clone();
    let b = log[..30].iter().filter(|(n, _)| n == "b").count();
    assert!((19..=21).contains(&b), "b {b} of the first 30: {log:?}");
}

#[tokio::test(start_paused = true)]
async fn a_retry_keeps_its_class() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{ServiceBuilder, ServiceExt};
    let allowance = Allowance::new(two_classes(10, 1));
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = tower::service_fn({
        let calls = calls.clone();
        move |_req: http::Request<String>| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            async move {
                let status = if n == 0 { 503 } else { 200 };
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(status)
                        .body(String::new())
                        .expect("ok"),
                )
            }
        }
    });
    let svc = ServiceBuilder::new()
        .layer(allowance.layer().class("b"))
        .service(inner);
    let res = svc
        .oneshot(http::Request::new(String::new()))
        .await
        .expect("ok");
    assert_eq!(res.status(), 200);
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    // The answer says why it waited: its record (the second attempt) and its class.
    let record = res
        .extensions()
        .get::<Attempt>()
        .copied()
        .expect("a record");
    assert_eq!(record.number(), 2);
    assert_eq!(res.extensions().get::<Class>(), Some(&Class::new("b")));
    let snap = allowance.snapshot();
    let b = snap.classes.iter().find(|c| c.name == "b").expect("ok");
    let a = snap.classes.iter().find(|c| c.name == "a").expect("ok");
    assert_eq!(
        (a.admitted, b.admitted),
        (0, 2),
        "the retry was admitted as b"
    );
}

#[tokio::test(start_paused = true)]
async fn each_keyed_allowance_has_the_classes() {
    use tower_allowance::keyed::{Keyed, KeyedConfig};
    let base = config(10, 1)
        .with_class("urgent", Share::weight(1).expect("ok").high())
        .expect("ok");
    let keyed = Keyed::new(KeyedConfig::new(base));
    let allowance = keyed.get("tenant-1").expect("ok").allowance().clone();
    let start = Instant::now();
    // A backlog of the default class, then an urgent request: one interval behind the slot
    // being served.
    let bulk: Vec<_> = (0..6)
        .map(|_| {
            let a = allowance.clone();
            tokio::spawn(async move { a.acquire().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(120)).await;
    allowance.acquire_with(of("urgent")).await.expect("ok");
    assert_eq!(
        ms(start),
        220,
        "the slot after the one being served (200 ms)"
    );
    for b in bulk {
        b.await.expect("ok").expect("ok");
    }
    let names: Vec<String> = allowance
        .snapshot()
        .classes
        .iter()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(names, ["default", "urgent"]);
}

#[tokio::test(start_paused = true)]
async fn a_high_class_jumps_at_the_adaptive_rate() {
    use tower_allowance::AdaptiveRate;
    // An adaptive rate from 10/s (slow start doubles it each second): the urgent request
    // waits at most one interval at the rate of the moment (100 ms at most, in the first s).
    let allowance = Allowance::new(
        config(1000, 1)
            .with_adaptive_rate(AdaptiveRate::new(10.0, 1.0, 10.0).expect("ok"))
            .with_class("urgent", Share::weight(1).expect("ok").high())
            .expect("ok"),
    );
    let bulk: Vec<_> = (0..8)
        .map(|_| {
            let a = allowance.clone();
            tokio::spawn(async move { a.acquire().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let arrived = Instant::now();
    allowance.acquire_with(of("urgent")).await.expect("ok");
    let waited = arrived.elapsed();
    assert!(waited <= Duration::from_millis(101), "{waited:?}");
    for b in bulk {
        b.await.expect("ok").expect("ok");
    }
}

#[test]
fn classes_come_from_a_config_file() {
    let config: AllowanceConfig = serde_json::from_value(serde_json::json!({
        "rate": 20,
        "burst": 4,
        "classes": { "live": { "weight": 1, "high": true }, "prematch": { "weight": 3 } }
    }))
    .expect("a config with classes");
    let by_hand = AllowanceConfig::per_second(20, 4)
        .and_then(|c| c.with_class("live", Share::weight(1)?.high()))
        .and_then(|c| c.with_class("prematch", Share::weight(3)?))
        .expect("classes");
    assert_eq!(config, by_hand);
    let bad = serde_json::from_value::<AllowanceConfig>(serde_json::json!({
        "rate": 20, "burst": 4, "classes": { "live": { "weight": 0 } }
    }));
    assert!(bad.is_err(), "a weight of 0 is refused");
}

#[tokio::test(start_paused = true)]
async fn a_class_share_counts_settled_tokens_not_reserved_ones() {
    use std::collections::HashMap;

    use http::{Request, Response};
    use http_body_util::{BodyExt, Full};
    use tower::{service_fn, ServiceBuilder, ServiceExt};
    use tower_allowance::{
        cost::settle::{OpenAiUsage, SettleLayer, Settlement},
        Cost, Limit,
    };

    // 1,000 tokens/s (and 100 requests/s), every request reserving 100 tokens; equal weights.
    // "lean" always uses 10 of them, "full" all 100; unused tokens come back (Settlement::all).
    let config = config(100, 100)
        .with_limit(
            Limit::per_second(1_000, 1_000)
                .expect("ok")
                .exact()
                .counting_cost(),
        )
        .expect("ok")
        .with_settlement(Settlement::all())
        .with_class("lean", Share::weight(1).expect("ok"))
        .expect("ok")
        .with_class("full", Share::weight(1).expect("ok"))
        .expect("ok");
    let allowance = Allowance::new(config);
    let provider = service_fn(|req: Request<Full<bytes::Bytes>>| async move {
        let used = match Class::of(req.extensions()).map(Class::name) {
            Some("lean") => 10,
            _ => 100,
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let body = format!(r#"{{"usage":{{"total_tokens":{used}}}}}"#);
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(bytes::Bytes::from(body))))
    });
    let svc = ServiceBuilder::new()
        .layer(allowance.layer())
        .layer(SettleLayer::new(&allowance, OpenAiUsage::new()))
        .service(provider);
    let start = Instant::now();
    let end = start + Duration::from_secs(20);
    let done: Arc<Mutex<HashMap<&'static str, (u64, u64)>>> = Arc::default();
    let mut tasks = Vec::new();
    for name in ["lean", "full"] {
        for _ in 0..4 {
            let (svc, done) = (svc.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let mut req = Request::new(Full::<bytes::Bytes>::default());
                    req.extensions_mut().insert(Class::new(name));
                    req.extensions_mut().insert(Cost(100));
                    let res = svc.clone().oneshot(req).await.expect("answered");
                    res.into_body().collect().await.expect("the whole body");
                    let used = if name == "lean" { 10 } else { 100 };
                    let mut d = done.lock().expect("ok");
                    let e = d.entry(name).or_default();
                    *e = (e.0 + 1, e.1 + used);
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("ok");
    }
    let done = done.lock().expect("ok").clone();
    let ((lean_n, lean_used), (full_n, full_used)) = (done["lean"], done["full"]);
    // The tokens used, not those reserved, are shared 1:1: "lean" sends about ten times as
    // many requests. (Charged at what they reserve, they would be sent 1:1, and "full" would
    // use ten times the tokens.)
    let ratio = lean_used as f64 / full_used as f64;
    assert!(
        (0.8..=1.25).contains(&ratio),
        "used {lean_used} vs {full_used} ({lean_n} vs {full_n} requests)"
    );
    assert!(lean_n >= 8 * full_n, "{lean_n} vs {full_n} requests");
    // Nothing lost: about the tokens 20 s allow (the burst, then 1,000/s), all used.
    assert!(lean_used + full_used >= 19_000, "{lean_used} + {full_used}");
}

/// The answer names the class the request was admitted in: the one it carried, else the
/// layer's.
#[tokio::test(start_paused = true)]
async fn the_answer_names_the_class_it_was_admitted_in() {
    use tower::{Service, ServiceExt};
    let allowance = Allowance::new(two_classes(10, 4));
    let inner = tower::service_fn(|_req: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(()))
    });
    let mut svc = tower::ServiceBuilder::new()
        .layer(allowance.layer().class("b"))
        .service(inner);
    let mut named = http::Request::new(());
    named.extensions_mut().insert(Class::new("a"));
    let res = svc
        .ready()
        .await
        .expect("ready")
        .call(named)
        .await
        .expect("ok");
    assert_eq!(res.extensions().get::<Class>(), Some(&Class::new("a")));
    let res = svc
        .ready()
        .await
        .expect("ready")
        .call(http::Request::new(()))
        .await;
    let res = res.expect("ok");
    assert_eq!(res.extensions().get::<Class>(), Some(&Class::new("b")));
    let snap = allowance.snapshot();
    let admitted = |name: &str| {
        snap.classes
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.admitted)
    };
    assert_eq!((admitted("a"), admitted("b")), (Some(1), Some(1)));
}

/// Two allowances on one memory store (one per runtime, say): a high request of one that
/// jumps the queue moves the slots the other's callers wait for, as it moves its own, so the
/// bucket's bound holds across them (as across processes on Redis).
#[tokio::test(start_paused = true)]
async fn a_high_request_moves_the_waiters_of_another_allowance_on_the_same_memory_store() {
    let memory = Arc::new(tower_allowance::store::MemoryStore::new());
    let classes = || {
        config(10, 1)
            .with_class("urgent", Share::weight(1).expect("ok").high())
            .expect("ok")
            .with_class("bulk", Share::weight(1).expect("ok"))
            .expect("ok")
    };
    let one = Allowance::builder(classes()).store(memory.clone()).build();
    let other = Allowance::builder(classes()).store(memory).build();
    let start = Instant::now();
    let bulk = || AcquireOptions::new().class(&Class::new("bulk"));
    // `other`: one admitted now, two waiting for the slots at 100 and 200 ms.
    other.acquire_with(bulk()).await.expect("admitted");
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let other = other.clone();
            tokio::spawn(async move {
                other.acquire_with(bulk()).await.expect("admitted");
                ms(start)
            })
        })
        .collect();
    tokio::task::yield_now().await;
    // `one`'s urgent request jumps the queue: it takes the slot at 100 ms.
    one.acquire_with(AcquireOptions::new().class(&Class::new("urgent")))
        .await
        .expect("admitted");
    assert_eq!(ms(start), 100);
    let mut sent = Vec::new();
    for w in waiters {
        sent.push(w.await.expect("joined"));
    }
    sent.sort_unstable();
    // One admission a slot: the pending reservation moved two increments later (the rule's
    // price of a jump, `rule::shares`), none shares the urgent request's 100 ms (without the
    // event: [100, 400], two sends at 100 ms at a burst of 1).
    assert_eq!(sent, [300, 400]);
}

/// The per-class metrics (feature `metrics`): admissions, waits and the waiting gauge, each
/// labelled by allowance and class.
#[test]
fn the_class_metrics_count_admissions_waits_and_waiting_callers_per_class() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    type Samples = Vec<(String, String, DebugValue)>;
    /// Every class metric: name, class, value (of allowance "shares-metrics" only).
    fn read(snapshotter: &Snapshotter) -> Samples {
        (snapshotter.snapshot().into_vec().into_iter())
            .filter_map(|(key, _, _, value)| {
                let key = key.key();
                let label = |k: &str| {
                    key.labels()
                        .find(|l| l.key() == k)
                        .map(|l| l.value().to_owned())
                };
                (label("allowance")? == "shares-metrics").then_some((
                    key.name().to_owned(),
                    label("class")?,
                    value,
                ))
            })
            .collect()
    }
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let (mid, end) = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            // 10/s burst 1: four callers of each class, all there at the start, one slot
            // every 100 ms (0 to 700 ms).
            let allowance = Allowance::builder(two_classes(10, 1))
                .name("shares-metrics")
                .build();
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    let a = allowance.clone();
                    let name = if i % 2 == 0 { "a" } else { "b" };
                    tokio::spawn(async move { a.acquire_with(of(name)).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mid = read(&snapshotter);
            for t in tasks {
                t.await.expect("joined").expect("admitted");
            }
            (mid, read(&snapshotter))
        })
    });
    let gauge = |samples: &Samples, class: &str| -> f64 {
        let found = samples
            .iter()
            .find(|(n, c, _)| n == "tower_allowance_class_waiting" && c == class);
        match found {
            Some((_, _, DebugValue::Gauge(g))) => g.into_inner(),
            other => panic!("no waiting gauge for {class}: {other:?}"),
        }
    };
    // At 10 ms: one admitted, one holding the next slot, six queued for a turn by class.
    let (a, b) = (gauge(&mid, "a"), gauge(&mid, "b"));
    assert_eq!(a + b, 6.0, "{mid:?}");
    assert!(a >= 2.0 && b >= 2.0, "{mid:?}");
    // At the end: none waiting, four admitted in each class, one wait sample each.
    assert_eq!((gauge(&end, "a"), gauge(&end, "b")), (0.0, 0.0));
    let mut waits = Vec::new();
    for class in ["a", "b"] {
        let admitted: u64 = (mid.iter().chain(&end))
            .filter(|(n, c, _)| n == "tower_allowance_class_admitted_total" && c == class)
            .map(|(_, _, v)| match v {
                DebugValue::Counter(n) => *n,
                other => panic!("a counter: {other:?}"),
            })
            .sum();
        assert_eq!(admitted, 4, "{class}: {mid:?} then {end:?}");
        // A snapshot drains the counters and histograms: the samples are those of both.
        let mine: Vec<f64> = (mid.iter().chain(&end))
            .filter(|(n, c, _)| n == "tower_allowance_class_wait_seconds" && c == class)
            .flat_map(|(_, _, v)| match v {
                DebugValue::Histogram(h) => h.iter().map(|s| s.into_inner()).collect::<Vec<_>>(),
                other => panic!("a histogram: {other:?}"),
            })
            .collect();
        assert_eq!(mine.len(), 4, "{class}: {mine:?}");
        waits.extend(mine);
    }
    // Each waited from the start to its slot: 0, 100, ..., 700 ms.
    waits.sort_by(f64::total_cmp);
    let ms: Vec<u64> = waits.iter().map(|s| (s * 1000.0).round() as u64).collect();
    assert_eq!(ms, [0, 100, 200, 300, 400, 500, 600, 700]);
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every event about a classed admission names its class: queued in its class, waiting for
/// its slot, jumping the queue.
#[tokio::test(start_paused = true)]
async fn the_logs_name_the_class() {
    const NAME: &str = "shares-logs";
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .without_time()
        .with_target(false)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The process's default (see logs.rs); only this allowance's lines are read.
    tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
    let allowance = Allowance::builder(
        config(10, 1)
            .with_class("urgent", Share::weight(1).expect("ok").high())
            .expect("ok")
            .with_class("bulk", Share::weight(1).expect("ok"))
            .expect("ok"),
    )
    .name(NAME)
    .build();
    let bulk: Vec<_> = (0..4)
        .map(|_| {
            let a = allowance.clone();
            tokio::spawn(async move { a.acquire_with(of("bulk")).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    allowance.acquire_with(of("urgent")).await.expect("ok");
    for b in bulk {
        b.await.expect("joined").expect("admitted");
    }
    let bytes = captured.0.lock().expect("lock").clone();
    let lines: Vec<String> = String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| l.contains(NAME))
        .map(str::to_owned)
        .collect();
    let with =
        |event: &str| -> Vec<&String> { lines.iter().filter(|l| l.contains(event)).collect() };
    for (event, class) in [
        ("queued in its class", "bulk"),
        ("waiting for a slot", "bulk"),
        ("a high-priority request jumped the queue", "urgent"),
    ] {
        let found = with(event);
        assert!(!found.is_empty(), "{event}: {lines:#?}");
        let named = format!("class=\"{class}\"");
        assert!(
            found.iter().any(|l| l.contains(&named)),
            "{event} names {class}: {found:#?}"
        );
        assert!(found.iter().all(|l| l.contains("class=")), "{found:#?}");
    }
}

/// A classed caller waiting for its slot holds a reservation (one per process: the turn);
/// those queued behind it hold none. A high request that jumps comes first, and the holder's
/// reservation moves later (two increments, the rule's price of a jump); the queued caller
/// is given the turn after it.
#[tokio::test(start_paused = true)]
async fn a_classed_caller_s_reservation_moves_when_a_high_request_jumps() {
    let allowance = Allowance::new(
        config(10, 1)
            .with_class("urgent", Share::weight(1).expect("ok").high())
            .expect("ok")
            .with_class("bulk", Share::weight(1).expect("ok"))
            .expect("ok"),
    );
    let start = Instant::now();
    allowance.acquire_with(of("bulk")).await.expect("admitted");
    let spawn = || {
        let a = allowance.clone();
        tokio::spawn(async move {
            a.acquire_with(of("bulk")).await.expect("admitted");
            ms(start)
        })
    };
    let holder = spawn();
    tokio::task::yield_now().await;
    let queued = spawn();
    tokio::task::yield_now().await;
    // One holds the slot at 100 ms (the store's schedule holds it: counted admitted, with
    // the one at 0), the other waits in its class's queue.
    let bulk = |s: &tower_allowance::Snapshot| {
        let c = s.classes.iter().find(|c| c.name == "bulk").expect("ok");
        (c.admitted, c.waiting)
    };
    assert_eq!(bulk(&allowance.snapshot()), (2, 1), "one queued for a turn");
    tokio::time::sleep(Duration::from_millis(20)).await;
    allowance
        .acquire_with(of("urgent"))
        .await
        .expect("admitted");
    let urgent = ms(start);
    let (h, q) = (holder.await.expect("joined"), queued.await.expect("joined"));
    // The urgent request: one interval after it arrived (20 ms). The holder's reservation
    // moved from 100 to 300 ms (without the move: two sends 20 ms apart at a burst of 1);
    // the queued caller's turn came after it, on the next slot.
    assert_eq!((urgent, h, q), (120, 300, 400));
}
