//! A bounded soak over real HTTP and real time: 200 tasks share one allowance against the
//! `allowance-sim` upstream, with random deadlines and cancellations, for 15 s.
//!
//! The upstream's own log must show no 429 (coordination never overshoots) and no window
//! over the allowance; memory must stay flat.
//!
//! Real sockets add delivery jitter: two requests admitted one interval apart can reach the
//! server a few milliseconds closer together than that (one task was scheduled late). So
//! the upstream's bucket keeps two tokens of headroom over the allowance, and windows on the
//! server's clock are checked against the allowance widened by `JITTER_MS`.
//!
//! No 429 is tolerated. Should one come, every 429 is printed with its cause
//! (`allowance_testkit::scale::stray_429s`: each call has its own event id, so the upstream's log
//! pairs with the moment each attempt was sent): DELIVERY JITTER when the upstream's bucket,
//! fed the send times, admits it (naming the request longest in transit before it), SENT
//! EARLY when it does not.
//!
//! A real-time experiment (`--features experiments`, tests/README.md): `cargo test -p
//! integration-tests --features experiments --test soak`.

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use allowance_testkit::{
    job::{JobEnd, Mark},
    report::Timeline,
    scale::{job_of, print_strays, stray_429s},
    scenario::Mode,
    upstream::{http_client, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};
use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_allowance::{Allowance, AllowanceConfig, Deadline, Outcome};

const TASKS: usize = 200;
const RUN: Duration = Duration::from_secs(15);
const BURST: u32 = 10;
const RATE: u32 = 50;
/// Delivery jitter tolerated between admission and arrival, in ms.
const JITTER_MS: u64 = 10;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_200_tasks_real_http() {
    let upstream = Upstream::start(UpstreamConfig::new(BURST + 2, RATE))
        .await
        .expect("upstream");
    let allowance = Allowance::new(
        AllowanceConfig::per_second(RATE, BURST)
            .expect("valid")
            .with_max_waiters(TASKS),
    );
    let client = http_client();
    let start = Instant::now();
    // Every attempt as it is sent (admitted) and answered: (call, sent ms, status).
    let sends: Arc<Mutex<Vec<(usize, u64, u16)>>> = Arc::default();
    let sent = {
        let sends = sends.clone();
        tower::service_fn(move |req: Request<Empty<Bytes>>| {
            let call = job_of(req.uri().path()).unwrap_or(usize::MAX);
            let at_ms = start.elapsed().as_millis() as u64;
            let (response, sends) = (client.request(req), sends.clone());
            async move {
                let response = response.await;
                let status = response.as_ref().map_or(0, |r| r.status().as_u16());
                sends.lock().expect("lock").push((call, at_ms, status));
                response.map(|r| r.map(|_| ()))
            }
        })
    };
    let stack = ServiceBuilder::new().layer(allowance.layer()).service(sent);
    // One event id per call, so that the upstream's log says which call each attempt was.
    let calls = Arc::new(AtomicUsize::new(0));
    let completed = Arc::new(AtomicU64::new(0));
    let abandoned = Arc::new(AtomicU64::new(0));
    let cancelled = Arc::new(AtomicU64::new(0));
    let rss_start = rss_kib();
    let mut rss_mid = 0;

    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (stack, calls, upstream_url) = (stack.clone(), calls.clone(), upstream.url());
        let (completed, abandoned, cancelled) =
            (completed.clone(), abandoned.clone(), cancelled.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng =
                0x9e37_79b9_7f4a_7c15u64 ^ (task as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            while start.elapsed() < RUN {
                let call = calls.fetch_add(1, Ordering::Relaxed);
                let url = format!("{upstream_url}/v1/events/e{call}/odds/snapshot");
                let mut req = Request::get(&url)
                    .header(API_KEY_HEADER, DEFAULT_KEY)
                    .body(Empty::<Bytes>::new())
                    .expect("request");
                req.extensions_mut()
                    .insert(Deadline::after(Duration::from_millis(100 + next() % 4_000)));
                let call = stack.clone().oneshot(req);
                // One call in five is cancelled at a random moment.
                let gave_up = if next() % 5 == 0 {
                    let patience = Duration::from_millis(next() % 2_000);
                    match tokio::time::timeout(patience, call).await {
                        Ok(result) => count(&result, &completed, &abandoned),
                        Err(_) => {
                            cancelled.fetch_add(1, Ordering::Relaxed);
                            false
                        }
                    }
                } else {
                    count(&call.await, &completed, &abandoned)
                };
                if gave_up {
                    // The job was given up (its deadline could not be met, which is known at
                    // once with a long queue): the task's next job comes along a little
                    // later, as jobs do, rather than in a loop that never yields.
                    tokio::time::sleep(Duration::from_millis(next() % 50)).await;
                }
            }
        }));
    }
    tokio::time::sleep(RUN / 3).await;
    rss_mid = rss_mid.max(rss_kib());
    for t in tasks {
        t.await.expect("task");
    }
    let rss_end = rss_kib();
    let log = upstream.log();
    upstream.shutdown().await;

    let rejected = log.iter().filter(|s| s.status == 429).count();
    // Every 429 with its cause: each call a lane of its own in the clients' record.
    let sends = sends.lock().expect("lock").clone();
    let marks = sends
        .iter()
        .map(|&(call, at_ms, status)| Mark {
            worker: call as u32,
            at_ms,
            status,
            retry_after_ms: None,
        })
        .collect();
    let mut first_sent = std::collections::BTreeMap::new();
    for &(call, at_ms, _) in &sends {
        first_sent.entry(call).or_insert(at_ms);
    }
    let ends = first_sent
        .iter()
        .map(|(&call, &at_ms)| {
            JobEnd::new(call as u32, at_ms, at_ms, Outcome::Completed).timed(call, Some(at_ms))
        })
        .collect();
    let timeline = Timeline::new(Mode::Shared, first_sent.len(), marks, ends);
    print_strays("soak", &stray_429s(&log, &timeline, BURST + 2, RATE, None));
    // The server's own view: no window over the allowance (widened by the jitter).
    let mut times: Vec<u64> = log.iter().map(|s| s.at_ms).collect();
    times.sort_unstable();
    let interval_ms = 1_000 / u64::from(RATE);
    let mut worst_excess = 0i64;
    let mut j = 0;
    for i in 0..times.len() {
        // Windows starting at each arrival, up to 2 s long.
        while j < times.len() && times[j] <= times[i] + 2_000 {
            j += 1;
        }
        for k in i..j {
            let w = times[k] - times[i];
            let bound = u64::from(BURST) + (w + JITTER_MS) / interval_ms;
            worst_excess = worst_excess.max((k - i + 1) as i64 - bound as i64);
        }
    }
    let (c, a, x) = (
        completed.load(Ordering::Relaxed),
        abandoned.load(Ordering::Relaxed),
        cancelled.load(Ordering::Relaxed),
    );
    eprintln!(
        "soak: {} attempts seen by the server, {rejected} 429s, worst window excess {worst_excess}; \
         {c} completed, {a} abandoned, {x} cancelled; RSS {rss_start} KiB at start, {rss_mid} KiB \
         at {:?}, {rss_end} KiB at end; {} waiting",
        log.len(),
        RUN / 3,
        allowance.snapshot().waiting,
    );
    assert_eq!(rejected, 0, "coordination let a 429 through");
    assert!(
        worst_excess <= 0,
        "a window exceeded the allowance by {worst_excess}"
    );
    assert!(
        c >= u64::from(RATE) * RUN.as_secs() * 9 / 10,
        "throughput held: {c}"
    );
    assert!(a > 0 && x > 0, "deadlines and cancellations were exercised");
    assert_eq!(allowance.snapshot().waiting, 0);
    assert!(
        rss_end < rss_mid + 16 * 1024,
        "memory grew from {rss_mid} KiB to {rss_end} KiB"
    );
}

fn count(
    result: &Result<http::Response<()>, tower_allowance::BoxError>,
    completed: &AtomicU64,
    abandoned: &AtomicU64,
) -> bool {
    match Outcome::of(result) {
        Outcome::Completed => {
            completed.fetch_add(1, Ordering::Relaxed);
            false
        }
        Outcome::Abandoned(_) => {
            abandoned.fetch_add(1, Ordering::Relaxed);
            true
        }
        other => panic!(
            "unexpected {other:?}: {:?}",
            result
                .as_ref()
                .map(|r| r.status())
                .map_err(ToString::to_string)
        ),
    }
}
