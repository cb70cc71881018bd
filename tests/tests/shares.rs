//! Shares of one allowance (feature `shares`): weighted fair shares and strict priority
//! between classes of callers, and how classes combine with the other features. Virtual time.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::{
    shares::{Class, Share},
    AcquireOptions, Allowance, AllowanceConfig,
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
                    log.lock().unwrap().push((name.clone(), ms(start)));
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
            .with_class("a", Share::weight(3).unwrap())
            .unwrap()
            .with_class("b", Share::weight(2).unwrap())
            .unwrap()
            .with_class("c", Share::weight(1).unwrap())
            .unwrap(),
    );
    let (start, log) = (Instant::now(), Log::default());
    let mut tasks = Vec::new();
    for name in ["a", "b", "c"] {
        tasks.extend(spawn_class(&allowance, name, 10, 100, start, &log));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap().clone();
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
    let last = log.iter().map(|(_, at)| *at).max().unwrap();
    assert_eq!(
        last,
        (300 - 4) * 50,
        "the makespan is the bucket's, to the slot"
    );
    let snap = allowance.snapshot();
    let a = snap.classes.iter().find(|c| c.name == "a").unwrap();
    assert_eq!((a.weight, a.admitted, a.waiting), (3, 100, 0));
}

#[tokio::test(start_paused = true)]
async fn a_high_class_waits_one_interval_behind_any_backlog() {
    let allowance = Allowance::new(
        config(20, 4)
            .with_class("urgent", Share::weight(1).unwrap().high())
            .unwrap()
            .with_class("bulk", Share::weight(1).unwrap())
            .unwrap(),
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
    let waits = urgent.await.unwrap();
    for t in bulk {
        t.await.unwrap();
    }
    // One interval (50 ms) behind the slot being served, at most (slots on whole ms).
    let worst = waits.iter().max().unwrap();
    assert!(*worst <= Duration::from_millis(51), "{waits:?}");
    assert!(
        *worst >= Duration::from_millis(1),
        "a backlog was there: {waits:?}"
    );
    // The bulk backlog still ran at the bucket's rate: 420 admissions.
    let last = log.lock().unwrap().iter().map(|(_, at)| *at).max().unwrap();
    assert!(last <= (420 - 4) * 50 + 1, "{last}");
}
