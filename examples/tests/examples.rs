//! Each example's main logic, run against the throttling upstream (or its in-process
//! provider): the examples are compiled into this test as modules, so what is tested is
//! exactly what a reader runs.

#[path = "../hyper_client.rs"]
#[allow(dead_code)]
mod hyper_client;

#[path = "../axum_proxy.rs"]
#[allow(dead_code)]
mod axum_proxy;

#[path = "../quota_exhausted.rs"]
#[allow(dead_code)]
mod quota_exhausted;

#[path = "../custom_classifier.rs"]
#[allow(dead_code)]
mod custom_classifier;

#[path = "../eight_workers.rs"]
#[allow(dead_code)]
mod eight_workers;

#[path = "../reqwest_client.rs"]
#[allow(dead_code)]
mod reqwest_client;

#[path = "../tonic_grpc.rs"]
#[allow(dead_code)]
mod tonic_grpc;

use std::time::Duration;

use allowance_testkit::upstream::{Upstream, UpstreamConfig, DEFAULT_KEY};
use axum::body::Body;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_allowance::{error::AbandonReason, Allowance, AllowanceConfig, Outcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_client_shares_one_allowance_across_concurrent_fetches() {
    // Burst 2 at 10/s: six fetches take about 0.4 s. The upstream holds one token more than
    // the allowance (bursts of 3 at 10/s), so that a 429 would take two requests reaching it
    // 110 ms closer together than they were sent (one interval and the 10 ms it forgives),
    // where loopback delivery varies by milliseconds even on a loaded machine; fetched all
    // at once, three of the six would still be refused.
    let upstream = Upstream::start(UpstreamConfig::new(3, 10))
        .await
        .expect("binds");
    let (allowance, stack) = hyper_client::stack(10, 2).expect("valid");
    let events = ["e1", "e2", "e3", "e4", "e5", "e6"];
    let fetched = hyper_client::fetch_snapshots(&stack, &upstream.url(), DEFAULT_KEY, &events)
        .await
        .expect("fetches");
    let log = upstream.log();
    upstream.shutdown().await;

    assert_eq!(fetched.len(), 6);
    for f in &fetched {
        assert_eq!(
            (f.outcome, f.status),
            (Outcome::Completed, Some(200)),
            "{f:?}"
        );
        let body = std::str::from_utf8(&f.body).expect("utf-8");
        assert!(
            body.contains(&format!("\"event_id\":\"{}\"", f.event_id)),
            "{body}"
        );
    }
    assert_eq!(log.len(), 6, "{log:?}");
    assert!(log.iter().all(|r| r.status == 200), "{log:?}");
    assert_eq!(allowance.snapshot().admitted, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_proxy_many_inbound_one_outbound_allowance() {
    // One token of headroom at the upstream (bursts of 3 against the allowance's 2, both at
    // 10/s): no 429 unless delivery varied by more than 110 ms (see the hyper client's test);
    // eight sent at once, five would be refused.
    let upstream = Upstream::start(UpstreamConfig::new(3, 10))
        .await
        .expect("binds");
    let allowance = Allowance::new(AllowanceConfig::per_second(10, 2).expect("valid"));
    let app = axum_proxy::app(
        upstream.url(),
        DEFAULT_KEY.to_owned(),
        allowance.clone(),
        Duration::from_secs(5),
    )
    .expect("valid");

    // Eight inbound requests at once, each served by a clone of the same router and state.
    let mut inbound = Vec::new();
    for i in 0..8 {
        let app = app.clone();
        inbound.push(tokio::spawn(async move {
            let req = Request::get(format!("/odds/e{i}"))
                .body(Body::empty())
                .expect("request");
            app.oneshot(req).await.expect("infallible").status()
        }));
    }
    for task in inbound {
        assert_eq!(task.await.expect("joins"), StatusCode::OK);
    }
    let log = upstream.log();
    upstream.shutdown().await;
    assert_eq!(log.len(), 8, "{log:?}");
    assert!(log.iter().all(|r| r.status == 200), "{log:?}");
    assert_eq!(allowance.snapshot().admitted, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_proxy_answers_503_when_the_wait_would_pass_its_patience() {
    let upstream = Upstream::start(UpstreamConfig::new(1, 1))
        .await
        .expect("binds");
    let allowance = Allowance::new(AllowanceConfig::per_second(1, 1).expect("valid"));
    // 100 ms of patience at one request per second: the second caller cannot be served (its
    // wait is about 1 s; it would take a 900 ms delay between the two calls, against the
    // milliseconds they take, to bring it under the patience).
    let app = axum_proxy::app(
        upstream.url(),
        DEFAULT_KEY.to_owned(),
        allowance,
        Duration::from_millis(100),
    )
    .expect("valid");
    let get = |i: u32| {
        let app = app.clone();
        async move {
            let req = Request::get(format!("/odds/e{i}"))
                .body(Body::empty())
                .expect("request");
            app.oneshot(req).await.expect("infallible")
        }
    };
    assert_eq!(get(1).await.status(), StatusCode::OK);
    let refused = get(2).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key("retry-after"));
    let log = upstream.log();
    upstream.shutdown().await;
    // The refused request never reached the upstream.
    assert_eq!(log.len(), 1, "{log:?}");
}

#[tokio::test(start_paused = true)]
async fn custom_classifier_retries_only_the_marked_503() {
    use custom_classifier::{demo, Summary, ThrottleHeader};

    let custom = demo(ThrottleHeader).await.expect("runs");
    assert_eq!(
        custom,
        Summary {
            // One marked 503, then a 200 after its Retry-After; maintenance once, as is:
            // a final failure, never reported as completed.
            provider_calls: (2, 1),
            throttled: (Outcome::Completed, 200, 2000),
            maintenance: (Outcome::Unsuccessful(StatusCode::SERVICE_UNAVAILABLE), 503),
        }
    );

    let default = demo(tower_allowance::classify::StatusClassifier::default())
        .await
        .expect("runs");
    // The default rule retries maintenance until max_attempts: three calls, abandoned.
    assert_eq!(default.provider_calls.1, 3);
    assert_eq!(
        default.maintenance.0,
        Outcome::Abandoned(AbandonReason::MaxAttempts)
    );
    assert_eq!(
        custom_classifier::describe(custom.maintenance.0),
        "ended unsuccessfully (503 Service Unavailable)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_exhausted_one_probe_no_polling_all_abandoned() {
    let upstream = Upstream::start(UpstreamConfig::new(2, 2).with_quota(0))
        .await
        .expect("binds");
    let url = upstream.url();
    let (allowance, stack) = quota_exhausted::stack(&url, DEFAULT_KEY, 2).expect("valid");

    let first = quota_exhausted::run(&url, DEFAULT_KEY, &allowance, &stack, 8)
        .await
        .expect("runs");
    assert_eq!(
        first.outcomes,
        vec![Outcome::Abandoned(AbandonReason::QuotaExhausted); 8],
        "all eight abandoned for the quota, none successful"
    );
    assert_eq!(first.probes, 1);
    // Until the end of the month (at most 31 days), measured on the server's clock.
    let left = first.reopens_in.expect("the error says when");
    assert!(left > Duration::ZERO && left <= Duration::from_secs(31 * 86_400));

    // After the verdict nothing reaches the server: new calls fail at once.
    let seen = upstream.log();
    let again = quota_exhausted::run(&url, DEFAULT_KEY, &allowance, &stack, 8)
        .await
        .expect("runs");
    assert_eq!(
        again.outcomes,
        vec![Outcome::Abandoned(AbandonReason::QuotaExhausted); 8]
    );
    let log = upstream.log();
    upstream.shutdown().await;
    assert_eq!(log, seen, "no request after the verdict");
    let usage: Vec<_> = log.iter().filter(|r| r.path == "/v1/usage").collect();
    assert_eq!(usage.len(), 1, "exactly one /v1/usage request: {log:?}");
    assert_eq!(usage[0].status, 200);
    // The snapshot attempts before the verdict: the allowance's burst, no more.
    let snapshots = log.len() - 1;
    assert!((1..=2).contains(&snapshots), "{log:?}");
    assert!(log
        .iter()
        .filter(|r| r.path != "/v1/usage")
        .all(|r| r.status == 429));
    assert_eq!(again.probes, 1, "the probe did not run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_quota_probe_backs_off_instead_of_looping() {
    // A bucket of zero: every call is throttled, /v1/usage included (with Retry-After), and
    // the quota is spent (snapshots: 429 without Retry-After).
    let upstream = Upstream::start(UpstreamConfig::new(0, 2).with_quota(0))
        .await
        .expect("binds");
    let url = upstream.url();
    let (allowance, stack) = quota_exhausted::stack(&url, DEFAULT_KEY, 20).expect("valid");
    let start = tokio::time::Instant::now();
    let run = quota_exhausted::run(&url, DEFAULT_KEY, &allowance, &stack, 8)
        .await
        .expect("runs");
    let elapsed = start.elapsed();
    let log = upstream.log();
    upstream.shutdown().await;

    // No verdict could be had, so the jobs ran out of attempts: abandoned, never successful.
    assert_eq!(
        run.outcomes,
        vec![Outcome::Abandoned(AbandonReason::MaxAttempts); 8],
        "{log:?}"
    );
    let usage = log.iter().filter(|r| r.path == "/v1/usage").count();
    let snapshots = log.len() - usage;
    assert_eq!(snapshots, 8 * 5, "five attempts each");
    // The probe backs off 1 s, 2 s, 4 s, ... after each failure: one probe, plus one per
    // backoff step that fits in the run, however many 429s arrived meanwhile.
    let steps = 1 + (elapsed.as_secs_f64() + 1.0).log2().floor() as usize;
    assert!(
        (1..=steps).contains(&usage),
        "{usage} usage probes in {elapsed:?}"
    );
    assert_eq!(allowance.quota_probes(), usage as u64);
}

/// `cargo run --example eight_workers -- --help` prints help and runs nothing; `--json` and
/// `--svg PATH` still run it; anything else is refused rather than ignored.
#[test]
fn eight_workers_help_runs_nothing() {
    use eight_workers::{parse_args, Args, USAGE};
    let args = |list: &[&str]| -> Vec<String> { list.iter().map(|a| (*a).to_owned()).collect() };
    assert_eq!(parse_args(&args(&["--help"])), Ok(Args::Help));
    assert_eq!(parse_args(&args(&["--json", "-h"])), Ok(Args::Help));
    assert_eq!(
        parse_args(&args(&["--json"])),
        Ok(Args::Run {
            json: true,
            svg_path: "eight_workers.svg".to_owned()
        })
    );
    assert_eq!(
        parse_args(&args(&["--svg", "docs/x.svg"])),
        Ok(Args::Run {
            json: false,
            svg_path: "docs/x.svg".to_owned()
        })
    );
    assert!(parse_args(&args(&["--svg"])).is_err());
    assert!(parse_args(&args(&["--jsn"])).is_err());
    for option in ["--json", "--svg PATH", "--help"] {
        assert!(USAGE.contains(option), "{USAGE}");
    }
}

/// Over gRPC (tonic), as the server counted: eight workers that each honour the pushback
/// still get RESOURCE_EXHAUSTED; one shared allowance sends one call per job and is never
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_grpc_shared_sends_one_call_per_job_and_is_never_refused() {
    // No RESOURCE_EXHAUSTED in real time, against a server whose bucket matches the
    // allowance (the seed's 2 at 2/s): its bucket starts at the first call, so the burst's
    // delivery costs it nothing, and a refusal would take two consecutive calls reaching it
    // 50 ms (a tenth of the 500 ms interval, what it forgives) closer together than the
    // allowance sent them, against loopback's variation of milliseconds: a margin of some
    // ten times or more even on a loaded machine.
    use tonic_grpc::{json_row, run, Mode, QuoteServer, Scenario};

    let s = Scenario::SEED;
    let server = QuoteServer::start(s.burst, s.rate_per_sec)
        .await
        .expect("binds");
    let naive = run(&server, s, Mode::Naive).await.expect("runs");
    let shared = run(&server, s, Mode::Shared).await.expect("runs");
    let jobs = s.jobs as usize;

    assert!(naive.counts.rejected > 0, "{naive:?}");
    assert_eq!(
        naive.counts.attempts,
        naive.counts.rejected + naive.counts.completed
    );
    assert_eq!(
        (
            shared.counts.attempts,
            shared.counts.rejected,
            shared.counts.completed
        ),
        (jobs, 0, jobs),
        "{shared:?}"
    );
    assert_eq!(shared.abandoned, 0);
    // No faster than the limit allows.
    assert!(shared.makespan_ms >= shared.min_makespan_ms, "{shared:?}");
    let row = json_row(&shared);
    for key in [
        "mode",
        "attempts",
        "rejected",
        "completed",
        "abandoned",
        "makespan_ms",
        "min_makespan_ms",
    ] {
        assert!(row.get(key).is_some(), "{key} in {row}");
    }
    assert_eq!(row["mode"], "shared");
}

/// reqwest through the middleware, as the server counted: naive workers still collide with
/// 429s, one shared allowance sends one request per job and gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_client_shared_middleware_gets_no_429() {
    // No 429 in real time against the seed's upstream (2 at 2/s, what the allowance allows):
    // a 429 would take the first burst to reach the upstream 50 ms later than the requests
    // after it (the upstream forgives a tenth of the 500 ms interval, and its bucket waits
    // full meanwhile), or two requests 50 ms closer together than sent; loopback delivery
    // varies by milliseconds, connection set-up included: a margin of ten times or more.
    let naive = reqwest_client::run(false).await.expect("runs");
    let shared = reqwest_client::run(true).await.expect("runs");
    assert!(naive.rejected > 0, "{naive:?}");
    assert_eq!((shared.attempts, shared.rejected), (8, 0), "{shared:?}");
    assert_eq!(shared.completed(), 8, "{shared:?}");
}

/// The upstream throttles during the run (`Retry-After: 7`): callers that cannot wait that
/// long get a 503 whose `Retry-After` is the shared cooldown still to run, 6 or 7 seconds,
/// not a made-up value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_proxy_answers_503_with_the_shared_cooldown_as_retry_after() {
    let upstream = Upstream::start(axum_proxy::throttling_upstream())
        .await
        .expect("binds");
    let allowance = Allowance::new(AllowanceConfig::per_second(4, 4).expect("valid"));
    let app = axum_proxy::app(
        upstream.url(),
        DEFAULT_KEY.to_owned(),
        allowance.clone(),
        Duration::from_secs(2),
    )
    .expect("valid");
    let mut inbound = Vec::new();
    for i in 0..8 {
        let app = app.clone();
        inbound.push(tokio::spawn(async move {
            let req = Request::get(format!("/odds/e{i}"))
                .body(Body::empty())
                .expect("request");
            app.oneshot(req).await.expect("infallible")
        }));
    }
    let mut answers = Vec::new();
    let mut said = Vec::new();
    for task in inbound {
        let (parts, body) = task.await.expect("joins").into_parts();
        let text = axum::body::to_bytes(body, 1 << 16).await.expect("a body");
        said.push(format!(
            "{} {:?}",
            parts.status,
            String::from_utf8_lossy(&text)
        ));
        answers.push(axum::response::Response::from_parts(parts, Body::empty()));
    }
    let log = upstream.log();
    upstream.shutdown().await;

    assert!(
        log.iter().any(|r| r.status == 429),
        "the upstream throttled: {log:?}"
    );
    let ok = answers
        .iter()
        .filter(|r| r.status() == StatusCode::OK)
        .count();
    let refused: Vec<u64> = answers
        .iter()
        .filter(|r| r.status() == StatusCode::SERVICE_UNAVAILABLE)
        .map(|r| {
            r.headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .expect("every 503 says when to come back")
        })
        .collect();
    assert_eq!(ok + refused.len(), 8, "200 or 503, nothing else");
    assert!(!refused.is_empty());
    // Taken from the cooldown the upstream's Retry-After: 7 raised, as it runs down: 6 or 7
    // while the 503s come within a second of the 429 (eight requests on loopback, some
    // milliseconds: a margin of a hundred times), above 5 s at the end.
    let log_line =
        |r: &allowance_testkit::upstream::SeenRequest| format!("{} at {} ms", r.status, r.at_ms);
    assert!(
        refused.iter().all(|s| (6..=7).contains(s)),
        "{refused:?}; answers {said:?}; upstream saw {:?}",
        log.iter().map(log_line).collect::<Vec<_>>()
    );
    let cooling = allowance.snapshot().cooling_for.expect("cooling down");
    assert!(cooling > Duration::from_secs(5), "{cooling:?}");
}
