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
//!
//! Every 429 is printed with its cause (`allowance_testkit::scale::stray_429s`): delivery jitter
//! (the upstream's bucket fed the send times admits the request) is named and not counted;
//! every other 429 counts against the one burst a state loss may cost.
//!
//! A real-time experiment (`--features experiments`, tests/README.md); the window check
//! itself is tested on fixed data in `allowance_testkit::scale` (the_window_check_sees_a_herd).

use std::{path::Path, time::Duration};

use allowance_sim::{
    live::StoreChoice,
    multi::{run_name, run_processes},
};
use allowance_testkit::{
    scale::{most_within, print_strays, stray_429s, worst_window},
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_do_not_herd_after_a_quick_redis_restart() {
    let mut redis = TestRedis::start_private().await;
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
    let (excess, from, to) = worst_window(&times, u64::from(BURST), RATE, JITTER_MS);
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
    let strays = stray_429s(&log, &report.timeline, BURST, RATE, None);
    let early = print_strays("restart herd", &strays);
    assert_eq!(report.failed, 0, "{:?}", report.first_error);
    assert_eq!(report.completed, JOBS);
    // No herd: at most one burst beyond the allowance in any window, and as many 429s.
    assert!(
        excess <= i64::from(BURST),
        "the window {from}..{to} ms is {excess} over the allowance (bound: one burst, {BURST})"
    );
    // At most one burst of 429s that delivery jitter does not explain (printed above).
    assert!(
        early <= BURST as usize,
        "{early} 429s not explained by delivery jitter (of {} at {rejected:?} ms)",
        rejected.len()
    );
}
