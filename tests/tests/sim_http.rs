//! The main job over real HTTP, in real time, on loopback: eight workers each retrying
//! alone make the server see a herd of attempts and 429s; one shared allowance makes it see
//! exactly one attempt per job. Counts come from the server's own log.

use allowance_sim::live::{self, Target};
use allowance_testkit::{
    scenario::{Mode, Scenario},
    upstream::{RetryAfterMode, Upstream, UpstreamConfig, API_KEY_HEADER, DEFAULT_KEY},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_workers_herd_over_real_http() {
    let report = live::run_real(&Scenario::seed(Mode::Naive), None)
        .await
        .expect("runs");
    assert_eq!(report.counted_by, "server");
    assert_eq!(report.completed, 8, "{report:?}");
    assert!(
        report.attempts >= 16,
        "server saw {} attempts",
        report.attempts
    );
    assert!(report.rejected >= 8, "server sent {} 429s", report.rejected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shared_allowance_sends_exactly_one_attempt_per_job() {
    let report = live::run_real(&Scenario::seed(Mode::Shared), None)
        .await
        .expect("runs");
    assert_eq!(report.counted_by, "server");
    assert_eq!(report.completed, 8, "{report:?}");
    assert_eq!((report.attempts, report.rejected), (8, 0), "{report:?}");
    // Paced by the allowance: no faster than the theoretical minimum.
    assert_eq!(report.min_makespan_ms, 3000);
    assert!(report.makespan_ms >= 2900, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_runner_against_a_running_upstream_counts_what_the_server_saw() {
    // A faster upstream keeps this short: burst 2 at 10/s, eight jobs in about 0.6 s.
    let upstream = Upstream::start(UpstreamConfig::new(2, 10))
        .await
        .expect("binds");
    let s = Scenario {
        burst: 2,
        rate_per_sec: 10,
        ..Scenario::seed(Mode::Shared)
    };
    let target = Target::new(upstream.snapshot_url("e{job}"))
        .header(API_KEY_HEADER, DEFAULT_KEY)
        .expect("valid header");
    let report = live::run_http(&s, &target, None).await.expect("runs");
    let log = upstream.log();
    upstream.shutdown().await;

    assert_eq!(report.counted_by, "client");
    assert_eq!(
        (report.attempts, report.rejected, report.completed),
        (8, 0, 8)
    );
    // The client's view and the server's agree.
    assert_eq!(log.len(), 8);
    assert!(log.iter().all(|r| r.status == 200 && r.key == DEFAULT_KEY));
    let mut paths: Vec<_> = log.iter().map(|r| r.path.clone()).collect();
    paths.sort();
    assert_eq!(paths[0], "/v1/events/e0/odds/snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_date_retry_after_is_honoured() {
    // The same herd when Retry-After is an HTTP-date one second ahead (with a Date header).
    let report = live::run_real(
        &Scenario::seed(Mode::Naive),
        Some(RetryAfterMode::HttpDate(1)),
    )
    .await
    .expect("runs");
    assert_eq!(report.completed, 8, "{report:?}");
    assert!(report.rejected >= 6, "{report:?}");
    // Every retry waited for the date. The date names the whole second after the 429's
    // (whole-second) `Date`; read on the same clock within that second, the wait ends at the
    // instant it names (refined by the local clock, as resets are): more than nothing, at most
    // a second. A worker's next attempt came no earlier than that instant (2 ms for the
    // marks' whole milliseconds and the worker's own reading of the date).
    let marks = &report.timeline.attempts;
    for (i, m) in marks.iter().enumerate().filter(|(_, m)| m.status == 429) {
        let wait = m.retry_after_ms.expect("a date");
        assert!((1..=1000).contains(&wait), "{m:?}");
        if let Some(next) = marks[i + 1..].iter().find(|n| n.worker == m.worker) {
            assert!(next.at_ms + 2 >= m.at_ms + wait, "{m:?} then {next:?}");
        }
    }
}
