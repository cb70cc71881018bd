//! A Redis restart while reservations are pending (issue 15): 4 processes x 8 workers share
//! one allowance (bursts of 4 at 20/s, the upstream's own bucket) over real HTTP; once every
//! worker is queueing (28 hold reserved slots, up to 1.4 s ahead), the test kills the private
//! `redis-server` (`SIGKILL`) and starts it again on the same port 300 ms later, empty.
//!
//! The holders of the lost state's slots must not all go out at once. The upstream's own
//! log is checked window by window: no window holds more requests than the allowance admits
//! in it plus one burst (the bound for one state loss), and at most one burst of 429s.
//! Before state generations the holders kept slots the fresh state did not know, the first
//! 429 raised a cooldown, and every holder inside it went out at its end together (18
//! requests in 15 ms; RELIABILITY.md).

use std::{path::Path, time::Duration};

use allowance_sim::{
    live::StoreChoice,
    multi::{run_name, run_processes},
    scenario::{Mode, Scenario},
    upstream::{Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};
use tokio::time::Instant;
use tower_allowance_redis::test_util::TestRedis;

const PROCESSES: usize = 4;
const WORKERS: usize = 32;
const JOBS: usize = 160;
const BURST: u32 = 4;
const RATE: u32 = 20;
/// The kill comes once the upstream has seen this many requests (about 1.8 s in).
const KILL_AFTER: usize = 40;
/// How long Redis stays down.
const DOWN: Duration = Duration::from_millis(300);
/// Delivery jitter forgiven when counting a window (a request admitted at `t` can arrive a
/// few ms late, and the one after it on time), as in the fault soak.
const JITTER_MS: u64 = 10;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_allowance-sim"))
}

/// The window of `times` (sorted, ms) most over `burst + rate * length`: (excess, from, to).
fn worst_window(times: &[u64], burst: u64) -> (i64, u64, u64) {
    let mut worst = (i64::MIN, 0, 0);
    for i in 0..times.len() {
        for j in i..times.len() {
            let (from, to) = (times[i], times[j]);
            let allowed = burst + u64::from(RATE) * (to - from + JITTER_MS) / 1000;
            let seen = u64::try_from(j - i + 1).unwrap_or(u64::MAX);
            let excess = i64::try_from(seen).unwrap_or(i64::MAX)
                - i64::try_from(allowed).unwrap_or(i64::MAX);
            if excess > worst.0 {
                worst = (excess, from, to);
            }
        }
    }
    worst
}

/// The most requests of `times` (sorted, ms) within any `span_ms`.
fn most_within(times: &[u64], span_ms: u64) -> usize {
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t <= times[i] + span_ms)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn the_window_check_sees_a_herd() {
    // On schedule: one every 50 ms after a burst of 4.
    let spaced: Vec<u64> = [0, 0, 0, 0]
        .into_iter()
        .chain((1..40).map(|i| i * 50))
        .collect();
    assert!(worst_window(&spaced, u64::from(BURST)).0 <= 0);
    // Eighteen in 15 ms, 2 s later: 14 over the allowance, 10 beyond one extra burst.
    let mut herd = spaced.clone();
    herd.extend((0..18).map(|i| 4000 + i * 15 / 17));
    assert_eq!(worst_window(&herd, u64::from(BURST)).0, 14);
    assert_eq!(most_within(&herd, 20), 18);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_do_not_herd_after_a_quick_redis_restart() {
    let Some(mut redis) = TestRedis::start_private().await else {
        return;
    };
    let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
        .await
        .expect("upstream");
    let s = Scenario {
        workers: WORKERS,
        jobs: JOBS,
        burst: BURST,
        rate_per_sec: RATE,
        max_attempts: 10,
        ..Scenario::seed(Mode::Shared)
    };
    let store = StoreChoice::Redis {
        url: redis.url().to_owned(),
        name: run_name(),
    };
    let template = upstream.snapshot_url("e{job}");
    let headers = [format!("{API_KEY_HEADER}: {DEFAULT_KEY}")];
    let run = tokio::spawn(async move {
        run_processes(exe(), &s, &template, &headers, &store, PROCESSES).await
    });
    // The kill comes when the upstream has seen enough (every worker queueing by then).
    while upstream.log().len() < KILL_AFTER {
        assert!(!run.is_finished(), "the run ended before the kill");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed_at_ms = upstream.log().last().map_or(0, |r| r.at_ms);
    let down = Instant::now();
    redis.kill();
    tokio::time::sleep(DOWN).await;
    redis.restart().await;
    let down_ms = down.elapsed().as_millis();
    let report = run.await.expect("joined").expect("the run completes");
    let log = upstream.log();
    upstream.shutdown().await;

    let mut times: Vec<u64> = log.iter().map(|r| r.at_ms).collect();
    times.sort_unstable();
    let rejected: Vec<u64> = log
        .iter()
        .filter(|r| r.status == 429)
        .map(|r| r.at_ms)
        .collect();
    let (excess, from, to) = worst_window(&times, u64::from(BURST));
    let after: Vec<u64> = times
        .iter()
        .copied()
        .filter(|t| *t >= killed_at_ms)
        .collect();
    eprintln!(
        "kill at {killed_at_ms} ms, Redis back {down_ms} ms later: {} completed, {} failed; upstream: {} attempts, 429s at {rejected:?} ms; worst window {from}..{to} ms, {excess} over the allowance; the most requests within any 20 ms after the kill: {}; makespan {} ms (minimum {})",
        report.completed,
        report.failed,
        log.len(),
        most_within(&after, 20),
        report.makespan_ms,
        report.min_makespan_ms,
    );
    assert_eq!(report.failed, 0, "{:?}", report.first_error);
    assert_eq!(report.completed, JOBS);
    // No herd: at most one burst beyond the allowance in any window, and as many 429s.
    assert!(
        excess <= i64::from(BURST),
        "the window {from}..{to} ms is {excess} over the allowance (bound: one burst, {BURST})"
    );
    assert!(
        rejected.len() <= BURST as usize,
        "{} 429s at {rejected:?} ms",
        rejected.len()
    );
}
