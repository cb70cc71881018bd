//! One allowance shared by many processes (issue 15): `--processes P` runs of the
//! `allowance-sim` binary's worker processes, on a private `redis-server`, against the
//! built-in upstream, bursts of 4 at 20/s on both sides. The runs go through the library
//! entry `run --real --processes P --redis URL` uses (`live::counted_by_upstream`,
//! `multi::run_processes_with`, `scale::add_upstream_figures`), so that the test has the
//! upstream's own log beside the report.
//!
//! - A cooldown one process learns (the upstream answers 429 with `Retry-After: 1` once, at a
//!   chosen moment: `--throttle-at`) is honoured by the waiters of every other process within
//!   10 ms of the response: the upstream's own log shows no request inside the cooldown later
//!   than that. Four processes with an allowance each show requests inside it: the check sees
//!   what it is for.
//! - Unequal processes (31 workers and 1, `--workers-per-process 31,1`): jobs are served in
//!   the order they arrived, within one interval (arrival on the clients' clocks put on one
//!   clock, service order from the upstream's log), and the 1-worker process waits about as
//!   long as the other.
//! - Callers that give up while they wait (`--cancel-fraction`): their jobs are reported as
//!   cancelled, never reach the upstream, and each gives its slot back.
//!
//! # Stray 429s
//!
//! Every 429 a test did not force is printed on stderr with its cause
//! (`allowance_testkit::scale::stray_429s`), from the upstream's log (each request's arrival and
//! status) and the clients' records (when each attempt was sent, put on the upstream's clock
//! by the run's fastest delivery):
//!
//! - DELIVERY JITTER: the upstream's own bucket (same burst, rate and 1/10-token
//!   forgiveness), fed every request at the moment it was *sent*, admits it. The allowance
//!   kept the limit; the requests' transit times differed (typically one that reached the
//!   upstream late while its bucket was full, so the bucket lost that refill: the line names
//!   the request longest in transit before it). Printed, not a failure.
//! - SENT EARLY: the bucket rejects it at its send time too; or UNEXPLAINED: its send is not
//!   in the clients' records. Either fails the test.
//!
//! At 200/s the upstream is twice the allowance: there even a jitter 429 fails (as before).
//! Real-time experiments (`--features experiments`, tests/README.md): one at a time.

use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use allowance_sim::{
    live::{self, StoreChoice},
    multi::{run_name, run_processes, run_processes_with, split_workers, Spawn},
};
use allowance_testkit::{
    report::RunReport,
    scale::{add_upstream_figures, cooldown_reach, print_strays, stray_429s, PROPAGATION_BOUND_MS},
    scenario::{Mode, Scenario},
    upstream::{
        SeenRequest, ThrottleAt, Throttled, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY,
    },
};
use tower_allowance_redis::test_util::TestRedis;

/// One real-time run at a time: each runs several processes on a small machine, and the
/// upstream forgives only 5 ms of delivery jitter.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The allowance's interval at 20/s, ms.
const INTERVAL_MS: u64 = 50;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_allowance-sim"))
}

/// The allowance's and the upstream's bucket: bursts of 4 at 20/s.
const BURST: u32 = 4;
const RATE: u32 = 20;

/// `run --real --mode shared --burst 4 --rate 20 --retry-after 1 --max-attempts 10` with
/// `workers` and `jobs` (and `edit` for the rest).
fn scenario(workers: usize, jobs: usize, edit: impl FnOnce(&mut Scenario)) -> Scenario {
    let mut s = Scenario {
        workers,
        jobs,
        burst: BURST,
        rate_per_sec: RATE,
        max_attempts: 10,
        ..Scenario::seed(Mode::Shared)
    };
    edit(&mut s);
    s
}

/// The upstream's log and its forced 429.
type Seen = (Vec<SeenRequest>, Option<Throttled>);

/// A run and what the upstream saw.
struct Run {
    report: RunReport,
    log: Vec<SeenRequest>,
    throttled: Option<Throttled>,
}

/// As `run --real --processes P --redis URL [--throttle-at ...]` runs `s`: an upstream of
/// bursts of 4 at 20/s (`Retry-After: 1`), counted by it, the figures of
/// `scale::add_upstream_figures`; with its log.
async fn run_on_redis(
    redis: &TestRedis,
    s: &Scenario,
    processes: usize,
    throttle: Option<ThrottleAt>,
    spawn: Spawn,
) -> Run {
    let store = StoreChoice::Redis {
        url: redis.url().to_owned(),
        name: run_name(),
    };
    let seen: Arc<Mutex<Option<Seen>>> = Arc::default();
    let keep = seen.clone();
    let report = live::counted_by_upstream(UpstreamConfig::new(BURST, RATE), |upstream| {
        let (s, store, spawn) = (s.clone(), store.clone(), spawn.clone());
        async move {
            if let Some(throttle) = throttle {
                upstream.throttle_at(throttle);
            }
            let headers = [format!("{API_KEY_HEADER}: {DEFAULT_KEY}")];
            let template = upstream.snapshot_url("e{job}");
            let mut report =
                run_processes_with(exe(), &s, &template, &headers, &store, processes, &spawn)
                    .await?;
            let split = split_workers(s.workers, processes, spawn.workers_per_process.as_deref());
            add_upstream_figures(&mut report, &upstream, &split);
            *keep.lock().expect("lock") = Some((upstream.log(), upstream.throttled()));
            Ok(report)
        }
    })
    .await
    .expect("the run completes");
    let (log, throttled) = seen
        .lock()
        .expect("lock")
        .take()
        .expect("the upstream's log");
    Run {
        report,
        log,
        throttled,
    }
}

/// Prints every 429 of `run` but the forced one with its cause; the number that delivery
/// jitter does not explain.
fn strays(what: &str, run: &Run, burst: u32, rate: u32) -> usize {
    let strays = stray_429s(&run.log, &run.report.timeline, burst, rate, run.throttled);
    print_strays(what, &strays)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooldown_reaches_the_waiters_of_every_process_within_10_ms() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start_private().await;
    // 1.5 s in, 32 workers have been queueing for a second: 28 hold reserved slots.
    let throttle = ThrottleAt {
        after: Duration::from_millis(1500),
        retry_after_secs: 1,
    };
    let run = run_on_redis(
        &redis,
        &scenario(32, 100, |_| {}),
        4,
        Some(throttle),
        Spawn::default(),
    )
    .await;
    let report = &run.report;
    let cooldown = report
        .scale
        .cooldown
        .as_ref()
        .expect("the forced 429 was sent");
    let inside = &cooldown.inside_after_ms;
    eprintln!(
        "429 with Retry-After: 1 at {} ms; one Redis allowance for 4 processes: other requests inside the cooldown at {inside:?} ms after it; {} attempts, {} 429s (others at {:?} ms), makespan {} ms (minimum {})",
        cooldown.sent_at_ms,
        report.attempts,
        report.rejected,
        cooldown.other_429s_at_ms,
        report.makespan_ms,
        report.min_makespan_ms
    );
    let early = strays("a cooldown's reach", &run, BURST, RATE);
    let late: Vec<&u64> = inside
        .iter()
        .filter(|ms| **ms > PROPAGATION_BOUND_MS)
        .collect();
    assert!(
        late.is_empty(),
        "requests inside the cooldown more than 10 ms after the 429: {late:?} ms after it"
    );
    assert_eq!(report.completed, 100, "{report:?}");
    // The 429 came while jobs were waiting, and every other 429 is delivery jitter (printed
    // above with the request that caused it). Each such 429 before the forced one held the
    // group for its 1 s `Retry-After`, so the forced one comes that much later: its known
    // price, added to the bound.
    let jitter_before = cooldown
        .other_429s_at_ms
        .iter()
        .filter(|at| **at < cooldown.sent_at_ms)
        .count() as u64;
    assert!(
        cooldown.sent_at_ms < 2000 + 1000 * jitter_before,
        "{cooldown:?}"
    );
    assert_eq!(early, 0, "429s not explained by delivery jitter (above)");
}

/// The same at 200/s, through the library: holders' slots 5 ms apart, so a cooldown that
/// took more than 10 ms to reach a process would let its next holder through. The upstream
/// is twice as large as the allowance, so that only the forced 429 raises a cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_200_per_second_no_holder_goes_later_than_10_ms_into_the_cooldown() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start_private().await;
    let upstream = Upstream::start(UpstreamConfig::new(16, 400))
        .await
        .expect("upstream");
    upstream.throttle_at(ThrottleAt {
        after: Duration::from_millis(1500),
        retry_after_secs: 1,
    });
    let s = Scenario {
        workers: 32,
        jobs: 600,
        burst: 4,
        rate_per_sec: 200,
        ..Scenario::seed(Mode::Shared)
    };
    let store = StoreChoice::Redis {
        url: redis.url().to_owned(),
        name: run_name(),
    };
    let headers = [format!("{API_KEY_HEADER}: {DEFAULT_KEY}")];
    let template = upstream.snapshot_url("e{job}");
    let report = run_processes(exe(), &s, &template, &headers, &store, 4)
        .await
        .expect("runs");
    let (log, throttled) = (upstream.log(), upstream.throttled());
    upstream.shutdown().await;
    let reach = cooldown_reach(&log, throttled.expect("the 429 was sent"));
    let rejected = log.iter().filter(|r| r.status == 429).count();
    eprintln!(
        "200/s, 4 processes: 429 at {} ms; other requests inside the cooldown at {:?} ms after it; the last before it {:?} ms before, the first after it {:?} ms after; {} completed, {rejected} 429s",
        reach.sent_at_ms,
        reach.inside_after_ms,
        reach.last_before_ms,
        reach.first_after_ms,
        report.completed
    );
    // Every 429 but the forced one, with its cause; the upstream is twice the allowance
    // (bursts of 16 at 400/s), so that not even delivery jitter explains one: any fails.
    let stray = stray_429s(&log, &report.timeline, 16, 400, throttled);
    print_strays("200/s", &stray);
    assert_eq!(reach.late(PROPAGATION_BOUND_MS), 0, "{reach:?}");
    // Holders were due right after the 429 (one every 5 ms), and resumed after it.
    assert!(reach.last_before_ms.is_some_and(|ms| ms <= 10), "{reach:?}");
    assert!(
        reach.first_after_ms.is_some_and(|ms| ms <= 1020),
        "{reach:?}"
    );
    assert_eq!(rejected, 1, "only the forced 429 (the others above)");
    assert!(stray.is_empty());
    assert_eq!(report.completed, 600);
}

/// The check sees what it is for: four processes with an allowance each (an upstream four
/// times as large, so that they do not overrun it), the same forced 429: the three processes
/// that did not get it go on sending inside the cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_shared_store_the_other_processes_send_inside_the_cooldown() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let upstream = Upstream::start(UpstreamConfig::new(16, 80))
        .await
        .expect("upstream");
    upstream.throttle_at(ThrottleAt {
        after: Duration::from_millis(1000),
        retry_after_secs: 1,
    });
    let s = Scenario {
        workers: 32,
        jobs: 200,
        burst: 4,
        rate_per_sec: 20,
        ..Scenario::seed(Mode::Shared)
    };
    let headers = [format!("{API_KEY_HEADER}: {DEFAULT_KEY}")];
    let template = upstream.snapshot_url("e{job}");
    run_processes(exe(), &s, &template, &headers, &StoreChoice::Memory, 4)
        .await
        .expect("runs");
    let (log, throttled) = (upstream.log(), upstream.throttled());
    upstream.shutdown().await;
    let throttled = throttled.expect("the 429 was sent");
    let reach = cooldown_reach(&log, throttled);
    eprintln!(
        "one allowance per process: {} other requests inside the cooldown, {} later than 10 ms",
        reach.inside_after_ms.len(),
        reach.late(PROPAGATION_BOUND_MS)
    );
    // Three processes at 20/s each for a second.
    assert!(reach.late(PROPAGATION_BOUND_MS) >= 30, "{reach:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unequal_processes_are_served_in_arrival_order_and_none_starves() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start_private().await;
    // Ten jobs for the lone worker: enough of them arrive once the queue is full even when
    // its process happens to start first and takes the first few before the other is up.
    let jobs = 320;
    // The 31 first: the lone worker arrives when the queue is full, and each of its jobs
    // must wait its turn (started first, it would take the burst before anyone came).
    let spawn = Spawn {
        workers_per_process: Some(vec![31, 1]),
        ..Spawn::default()
    };
    let run = run_on_redis(&redis, &scenario(32, jobs, |_| {}), 2, None, spawn).await;
    let report = &run.report;
    let f = report.scale.fairness.as_ref().expect("fairness figures");
    eprintln!(
        "31 + 1 workers, {jobs} jobs: {} attempts, {} 429s, makespan {} ms (minimum {}); fairness {f:?}",
        report.attempts, report.rejected, report.makespan_ms, report.min_makespan_ms
    );
    let early = strays("31 + 1 workers", &run, BURST, RATE);
    assert_eq!(report.completed, jobs, "{report:?}");
    assert_eq!(early, 0, "429s not explained by delivery jitter (above)");
    // Arrival order within one interval: no job served ahead of one that arrived more than
    // an interval before it.
    let inversion = f.max_inversion_ms;
    assert!(
        inversion <= INTERVAL_MS,
        "a job was served before one that arrived {inversion} ms earlier"
    );
    assert_eq!(f.overtaking, 0, "{f:?}");
    // Each worker waits for every other worker's turn: 32 x 50 ms less the burst.
    let (many, lone) = (&f.processes[0], &f.processes[1]);
    assert!(
        lone.jobs >= 4,
        "too few jobs of the lone worker to compare: {f:?}"
    );
    // No starvation: the lone worker does not wait longer than the others (it may wait less
    // on average when some of its few jobs arrived before the queue built up; nobody is
    // served out of arrival order, checked above).
    assert!(
        lone.mean_wait_ms <= many.mean_wait_ms * 1.25,
        "the 1-worker process waits {} ms on average, the 31-worker one {} ms",
        lone.mean_wait_ms,
        many.mean_wait_ms
    );
    assert!(
        lone.max_wait_ms as f64 <= many.max_wait_ms as f64 * 1.25,
        "the 1-worker process waited up to {} ms, the 31-worker one up to {} ms",
        lone.max_wait_ms,
        many.max_wait_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_are_reported_as_cancelled_and_give_their_slots_back() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start_private().await;
    let jobs = 100;
    let s = scenario(32, jobs, |s| {
        s.cancel = Some("0.2".parse().expect("a fraction"));
    });
    let run = run_on_redis(&redis, &s, 4, None, Spawn::default()).await;
    let report = &run.report;
    eprintln!("cancel 0.2 of {jobs} jobs: {report:?}");
    let early = strays("cancelled waiters", &run, BURST, RATE);
    let cancelled = report.scale.cancelled.expect("cancelled jobs counted");
    let completed = report.completed;
    assert!(cancelled >= 5, "{report:?}");
    assert_eq!(cancelled + completed, jobs, "{report:?}");
    assert_eq!(report.abandoned, 0, "{report:?}");
    assert_eq!(report.failed, 0, "{report:?}");
    // Counted by the upstream: only the completed jobs reached it (one attempt each, and
    // one more per 429, every one of them delivery jitter: printed above).
    assert_eq!(report.counted_by, "server");
    assert_eq!(early, 0, "429s not explained by delivery jitter (above)");
    assert_eq!(report.attempts, completed + report.rejected, "{report:?}");
    // A cancelled waiter holding a reserved slot gives it back (one still asking the store
    // has none yet): the store takes back only those still the latest.
    let releases = report.scale.releases.expect("releases counted");
    let (made, taken_back) = (releases.made, releases.taken_back);
    let cancelled = cancelled as u64;
    assert!(
        made <= cancelled && made * 10 >= cancelled * 9,
        "{made} releases for {cancelled} cancelled waiters"
    );
    assert!(taken_back <= made);
}
