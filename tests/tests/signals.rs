//! Providers' signals through the real cooldown layer: each dialect's headers move the shared
//! state as documented (virtual time, memory store), and an adaptive rate, shared by every
//! caller, finds a limit nobody states.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime},
};

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_allowance::{
    cooldown::CooldownLayer, retry::RetryConfig, signals::Dialect, AdaptiveRate, Allowance,
    AllowanceConfig, Outcome,
};

fn allowance(dialect: Dialect) -> Allowance {
    Allowance::new(
        AllowanceConfig::per_second(10, 5)
            .expect("valid")
            .with_dialect(dialect),
    )
}

#[allow(clippy::disallowed_methods)] // fixtures are dated around the wall clock on purpose
fn wall() -> SystemTime {
    SystemTime::now()
}

async fn observe(allowance: &Allowance, status: u16, headers: &[(&str, String)]) {
    let mut res = Response::new(());
    *res.status_mut() = StatusCode::from_u16(status).expect("status");
    for (k, v) in headers {
        res.headers_mut().append(
            http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    let svc = ServiceBuilder::new()
        .layer(CooldownLayer::new(allowance.clone()))
        .service_fn(move |_r: Request<()>| {
            let mut r = Response::new(());
            *r.status_mut() = res.status();
            *r.headers_mut() = res.headers().clone();
            async move { Ok::<_, Infallible>(r) }
        });
    svc.oneshot(Request::new(())).await.expect("passed through");
}

async fn blocked_for(allowance: &Allowance) -> Duration {
    allowance.store_state().await.expect("state").blocked_for
}

fn secs(d: Duration) -> u64 {
    (d.as_millis() as u64).div_ceil(1000)
}

#[tokio::test(start_paused = true)]
async fn github_remaining_zero_on_a_success_waits_for_the_reset() {
    let a = allowance(Dialect::github());
    let reset = wall() + Duration::from_secs(40);
    let epoch = reset
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    observe(
        &a,
        200,
        &[
            ("x-ratelimit-limit", "5000".into()),
            ("x-ratelimit-remaining", "0".into()),
            ("x-ratelimit-reset", epoch.to_string()),
            ("date", httpdate::fmt_http_date(wall())),
        ],
    )
    .await;
    let b = secs(blocked_for(&a).await);
    assert!((38..=41).contains(&b), "cooldown until the reset: {b} s");
    let seen = a.snapshot().rate_limit.expect("observed");
    assert_eq!((seen.limit, seen.remaining), (Some(5000), Some(0)));
}

#[tokio::test(start_paused = true)]
async fn a_positive_remaining_never_grants_or_blocks_anything() {
    let a = allowance(Dialect::github());
    for _ in 0..3 {
        observe(
            &a,
            200,
            &[
                ("x-ratelimit-remaining", "1".into()),
                ("x-ratelimit-reset", "9999999999".into()),
            ],
        )
        .await;
    }
    assert_eq!(blocked_for(&a).await, Duration::ZERO);
    // And it reserves nothing: the burst is still the configured one (5).
    for _ in 0..5 {
        a.acquire().await.expect("burst");
    }
    let start = Instant::now();
    a.acquire().await.expect("metered");
    assert_eq!(start.elapsed(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn openai_durations_and_retry_after_ms() {
    let a = allowance(Dialect::openai());
    observe(
        &a,
        429,
        &[
            ("x-ratelimit-remaining-requests", "0".into()),
            ("x-ratelimit-reset-requests", "6m0s".into()),
        ],
    )
    .await;
    assert_eq!(blocked_for(&a).await, Duration::from_secs(360));
    let a = allowance(Dialect::standard());
    observe(&a, 429, &[("retry-after-ms", "1500".into())]).await;
    assert_eq!(blocked_for(&a).await, Duration::from_millis(1500));
}

#[tokio::test(start_paused = true)]
async fn anthropic_rfc3339_reset() {
    let a = allowance(Dialect::anthropic());
    let reset = wall() + Duration::from_secs(20);
    let epoch = reset
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    // RFC 3339 from epoch seconds (UTC), without a date library.
    let (days, rem) = (epoch / 86_400, epoch % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let stamp = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    observe(
        &a,
        429,
        &[
            ("anthropic-ratelimit-requests-remaining", "0".into()),
            ("anthropic-ratelimit-requests-reset", stamp),
        ],
    )
    .await;
    let b = secs(blocked_for(&a).await);
    assert!((18..=21).contains(&b), "{b} s");
}

/// Howard Hinnant's days-to-civil (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[tokio::test(start_paused = true)]
async fn ietf_ratelimit_fields() {
    let a = allowance(Dialect::ietf());
    observe(
        &a,
        429,
        &[
            ("ratelimit-policy", "\"default\";q=100;w=60".into()),
            ("ratelimit", "\"default\";r=0;t=30".into()),
        ],
    )
    .await;
    assert_eq!(blocked_for(&a).await, Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn absurd_reset_values_close_the_allowance_visibly() {
    let a = allowance(Dialect::openai());
    observe(
        &a,
        429,
        &[
            ("x-ratelimit-remaining-requests", "0".into()),
            ("x-ratelimit-reset-requests", "100000h".into()),
        ],
    )
    .await;
    let state = a.store_state().await.expect("state");
    assert_eq!(
        state.blocked_for,
        Duration::ZERO,
        "never a 11-year cooldown"
    );
    assert_eq!(
        state.closed,
        Some(Some(Duration::from_secs(3600))),
        "closed for max_cooldown, visibly"
    );
    assert!(a.snapshot().closed.is_some());
}

/// A fake upstream: a token bucket (burst 4) at a rate that may change, answering 429 with
/// `Retry-After: 1` beyond it, counting what it sees.
#[derive(Clone)]
struct Bucket {
    inner: Arc<Mutex<(f64, Instant)>>,
    rate: Arc<AtomicU64>,
    seen: Arc<AtomicU64>,
    rejected: Arc<AtomicU64>,
}

impl Bucket {
    fn new(rate: u64) -> Self {
        Self {
            inner: Arc::new(Mutex::new((4.0, Instant::now()))),
            rate: Arc::new(AtomicU64::new(rate)),
            seen: Arc::default(),
            rejected: Arc::default(),
        }
    }

    fn take(&self) -> bool {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let mut g = self.inner.lock().expect("lock");
        let now = Instant::now();
        let rate = self.rate.load(Ordering::Relaxed) as f64;
        g.0 = (g.0 + (now - g.1).as_secs_f64() * rate).min(4.0);
        g.1 = now;
        // A tenth of a token of tolerance, as real limiters have.
        if g.0 >= 0.9 {
            g.0 -= 1.0;
            true
        } else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// From far below and from far above, an adaptive allowance settles near a limit nobody
/// states, with few 429s, and every caller shares the one rate.
#[tokio::test(start_paused = true)]
async fn an_adaptive_rate_finds_an_unknown_limit() {
    for initial in [2.0, 200.0] {
        let upstream = Bucket::new(20);
        let allowance = Allowance::new(
            AllowanceConfig::per_second(20, 4)
                .expect("valid")
                .with_adaptive_rate(AdaptiveRate::new(initial, 0.5, 500.0).expect("valid")),
        );
        let up = upstream.clone();
        let svc = ServiceBuilder::new()
            .layer(
                allowance
                    .layer()
                    .with_retry(RetryConfig::default().with_max_attempts(10).expect("valid")),
            )
            .service_fn(move |_r: Request<String>| {
                let ok = up.take();
                async move {
                    let mut res = Response::new(String::new());
                    if !ok {
                        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                        res.headers_mut()
                            .insert("retry-after", http::HeaderValue::from_static("1"));
                    }
                    Ok::<_, Infallible>(res)
                }
            });
        let start = Instant::now();
        let completed = Arc::new(Mutex::new(Vec::new()));
        let mut workers = vec![];
        for _ in 0..8 {
            let (svc, completed) = (svc.clone(), completed.clone());
            workers.push(tokio::spawn(async move {
                for _ in 0..150 {
                    let r = svc.clone().oneshot(Request::new(String::new())).await;
                    if Outcome::of(&r) == Outcome::Completed {
                        completed.lock().expect("lock").push(start.elapsed());
                    }
                }
            }));
        }
        for w in workers {
            w.await.expect("worker");
        }
        let done = completed.lock().expect("lock").clone();
        let end = *done.iter().max().expect("some");
        let last30 = done
            .iter()
            .filter(|t| **t > end - Duration::from_secs(30))
            .count();
        let achieved = last30 as f64 / 30.0;
        let (seen, rejected) = (
            upstream.seen.load(Ordering::Relaxed),
            upstream.rejected.load(Ordering::Relaxed),
        );
        let rate =
            f64::from(allowance.store_state().await.expect("state").rate_milli as u32) / 1000.0;
        eprintln!(
            "from {initial}/s: {} completed, {seen} attempts, {rejected} 429s, achieved {achieved:.1}/s over the last 30 s, final rate {rate:.1}/s",
            done.len()
        );
        assert_eq!(done.len(), 1200);
        assert!(rejected * 20 <= seen, "429s {rejected} > 5% of {seen}");
        assert!(
            (0.85 * 20.0..=20.0).contains(&achieved),
            "achieved {achieved}/s over the last 30 s"
        );
        assert!((17.0..=24.0).contains(&rate), "final rate {rate}");
    }
}

/// "One cut per round" counts from when a request was *sent*, not from when it was queued:
/// a request that waited in the admission queue across a cut and was then throttled is
/// news (the cut rate is still too high), so it cuts again.
#[tokio::test(start_paused = true)]
async fn a_request_queued_before_a_cut_but_sent_after_it_cuts_again() {
    let allowance = Allowance::new(
        AllowanceConfig::per_second(10, 1)
            .expect("valid")
            .with_adaptive_rate(AdaptiveRate::new(10.0, 0.5, 100.0).expect("valid")),
    );
    let svc = ServiceBuilder::new()
        .layer(
            allowance
                .layer()
                .with_retry(RetryConfig::default().with_max_attempts(1).expect("valid")),
        )
        .service_fn(|_r: Request<String>| async {
            let mut res = Response::new(String::new());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            Ok::<_, Infallible>(res)
        });
    // The slow start begins at the first admission; let a second pass so that its start is
    // not the store's time zero.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rate = |a: &Allowance| {
        let a = a.clone();
        async move { a.store_state().await.expect("state").rate_milli }
    };
    // A is admitted at once; B queues behind it (burst 1 at 10/s: its slot is 100 ms later).
    let a = tokio::spawn(svc.clone().oneshot(Request::new(String::new())));
    tokio::task::yield_now().await;
    let b = tokio::spawn(svc.clone().oneshot(Request::new(String::new())));
    let (a, b) = (a.await.expect("a"), b.await.expect("b"));
    assert_eq!(a.expect("429").status(), 429);
    assert_eq!(b.expect("429").status(), 429);
    // A's 429 cut 10/s to 8.5/s, and B's slot with it (re-timed: 117.6 ms after A, one
    // interval of 8.5/s); B, sent then, cut again, fast: x0.7 of 8.5/s plus the 117.6 ms of
    // additive increase (1% of 8.5/s per second) = 5.957/s. Had B counted as sent when it
    // queued, before the cut, the rate would have stayed near 8.5/s.
    assert_eq!(rate(&allowance).await, 5_957);
}

/// `now` as epoch seconds.
fn epoch(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

fn cooling(a: &Allowance) -> Option<Duration> {
    a.snapshot().cooling_for
}

/// Asserts a cooldown until the epoch second `reset`, read from a response that arrived
/// between the wall times `before` and `after`: its whole-second `Date` is refined by the
/// local clock, so the wait is the reset minus the arrival (to the millisecond).
fn assert_until(
    got: Option<Duration>,
    reset: u64,
    before: SystemTime,
    after: SystemTime,
    what: &str,
) {
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(reset);
    let from = |t: SystemTime| at.duration_since(t).unwrap_or_default();
    let (least, most) = (from(after), from(before) + Duration::from_millis(1));
    let got = got.unwrap_or_else(|| panic!("{what}: no cooldown"));
    assert!(
        (least..=most).contains(&got),
        "{what}: {got:?} not in {least:?}..={most:?}"
    );
}

/// A success saying the allowance is spent until a reset cools it down until the reset,
/// whatever `Retry-After` (or `retry-after-ms`) it also carries: one longer than the reset
/// used to wipe it (issue 20).
#[tokio::test(start_paused = true)]
async fn a_spent_success_waits_for_its_reset_whatever_its_retry_after() {
    let thirty = Some(Duration::from_secs(30));
    for ra in [60u64, 5] {
        let now = wall();
        let a = allowance(Dialect::github());
        observe(
            &a,
            200,
            &[
                ("date", httpdate::fmt_http_date(now)),
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", (epoch(now) + 30).to_string()),
                ("retry-after", ra.to_string()),
            ],
        )
        .await;
        let what = format!("github, retry-after {ra}");
        assert_until(cooling(&a), epoch(now) + 30, now, wall(), &what);
        let a = allowance(Dialect::ietf());
        observe(
            &a,
            200,
            &[
                ("ratelimit", "\"d\";r=0;t=30".into()),
                ("retry-after", ra.to_string()),
            ],
        )
        .await;
        assert_eq!(cooling(&a), thirty, "ietf, retry-after {ra}");
        let a = allowance(Dialect::openai());
        observe(
            &a,
            200,
            &[
                ("x-ratelimit-remaining-requests", "0".into()),
                ("x-ratelimit-reset-requests", "30s".into()),
                ("retry-after-ms", (ra * 1000).to_string()),
            ],
        )
        .await;
        assert_eq!(cooling(&a), thirty, "openai, retry-after-ms {ra}000");
    }
    // A `Retry-After` alone on a success is still no wait.
    let a = allowance(Dialect::github());
    observe(&a, 200, &[("retry-after", "60".into())]).await;
    assert_eq!(cooling(&a), None);
}

/// On a throttling response `Retry-After` takes precedence over the IETF fields' reset (as the
/// draft says); against any other reset the longest wait wins.
#[tokio::test(start_paused = true)]
async fn a_throttling_response_combines_its_waits_by_one_rule() {
    for (ra, want) in [("5", 5), ("60", 60)] {
        let a = allowance(Dialect::ietf());
        observe(
            &a,
            429,
            &[
                ("ratelimit", "\"d\";r=0;t=30".into()),
                ("retry-after", ra.into()),
            ],
        )
        .await;
        assert_eq!(cooling(&a), Some(Duration::from_secs(want)), "ietf {ra}");
        let now = wall();
        let a = allowance(Dialect::github());
        observe(
            &a,
            429,
            &[
                ("date", httpdate::fmt_http_date(now)),
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", (epoch(now) + 30).to_string()),
                ("retry-after", ra.into()),
            ],
        )
        .await;
        if want > 30 {
            assert_eq!(cooling(&a), Some(Duration::from_secs(want)), "github {ra}");
        } else {
            assert_until(
                cooling(&a),
                epoch(now) + 30,
                now,
                wall(),
                &format!("github {ra}"),
            );
        }
    }
}

/// An upstream, boxed.
type Upstream = tower::util::BoxCloneService<Request<String>, Response<String>, Infallible>;

/// When each request reached an upstream, from its start.
type Arrivals = Arc<Mutex<Vec<Duration>>>;

/// An upstream answering `first` once, then 200s, recording when each request arrived.
fn once_then_ok(first: Response<String>) -> (Upstream, Arrivals) {
    let start = Instant::now();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let seen = sent.clone();
    let first = Arc::new(Mutex::new(Some(first)));
    let svc = tower::service_fn(move |_r: Request<String>| {
        seen.lock().expect("lock").push(start.elapsed());
        let res = first.lock().expect("lock").take().unwrap_or_default();
        async move { Ok::<_, Infallible>(res) }
    });
    (tower::util::BoxCloneService::new(svc), sent)
}

fn response(status: u16, headers: &[(&str, String)]) -> Response<String> {
    let mut res = Response::new(String::new());
    *res.status_mut() = StatusCode::from_u16(status).expect("status");
    for (k, v) in headers {
        res.headers_mut().append(
            http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    res
}

/// GitHub's limits answer "403 or 429": with the GitHub dialect a 403 carrying its rate-limit
/// signals (a secondary limit's `retry-after`, a primary limit's spent remaining and reset) is
/// throttling: it cools the allowance down and is retried after the wait. A plain 403, or a
/// 403 with another dialect, stays a final 403.
#[tokio::test(start_paused = true)]
async fn github_403_rate_limits_throttle_and_plain_403s_do_not() {
    let now = wall();
    // GitHub's documented headers: a secondary limit, then a spent primary limit.
    let secondary = vec![
        ("retry-after", "60".to_string()),
        ("x-ratelimit-limit", "5000".into()),
        ("x-ratelimit-remaining", "4987".into()),
        ("x-ratelimit-used", "13".into()),
        ("x-ratelimit-reset", (epoch(now) + 3000).to_string()),
        ("x-ratelimit-resource", "core".into()),
    ];
    let primary = vec![
        ("date", httpdate::fmt_http_date(now)),
        ("x-ratelimit-limit", "60".into()),
        ("x-ratelimit-remaining", "0".into()),
        ("x-ratelimit-used", "60".into()),
        ("x-ratelimit-reset", (epoch(now) + 30).to_string()),
        ("x-ratelimit-resource", "core".into()),
    ];
    for (headers, wait) in [(secondary, 60), (primary, 30)] {
        let a = allowance(Dialect::github());
        let (upstream, sent) = once_then_ok(response(403, &headers));
        let svc = ServiceBuilder::new().layer(a.layer()).service(upstream);
        let before = wall();
        let result = svc.oneshot(Request::new(String::new())).await;
        assert_eq!(
            Outcome::of(&result),
            Outcome::Completed,
            "retried, {wait} s"
        );
        let sent = sent.lock().expect("lock").clone();
        assert_eq!((sent.len(), sent[0]), (2, Duration::ZERO));
        if wait == 60 {
            assert_eq!(sent[1], Duration::from_secs(60), "retry-after");
        } else {
            // The reset, an epoch second, from the response's arrival.
            assert_until(Some(sent[1]), epoch(now) + 30, before, wall(), "reset");
        }
        assert_eq!(a.snapshot().retries_spent, 1);
    }
    // Plain 403s: no signals, signals that do not parse, or not the GitHub dialect.
    let plain: [(Dialect, Vec<(&str, String)>); 3] = [
        (
            Dialect::github(),
            vec![("x-ratelimit-remaining", "56".into())],
        ),
        (Dialect::github(), vec![("retry-after", "later".into())]),
        (Dialect::standard(), vec![("retry-after", "60".into())]),
    ];
    for (dialect, headers) in plain {
        let a = allowance(dialect);
        let (upstream, sent) = once_then_ok(response(403, &headers));
        let svc = ServiceBuilder::new().layer(a.layer()).service(upstream);
        let result = svc.oneshot(Request::new(String::new())).await;
        assert_eq!(
            Outcome::of(&result),
            Outcome::Unsuccessful(StatusCode::FORBIDDEN),
            "{headers:?}"
        );
        assert_eq!(sent.lock().expect("lock").len(), 1);
        assert_eq!(cooling(&a), None);
    }
}

/// Epoch milliseconds where epoch seconds are expected are milliseconds: a reset 30 s ahead,
/// not a wait of millennia that closes the allowance. A legacy `RateLimit-Reset` sent as an
/// epoch is an epoch.
#[tokio::test(start_paused = true)]
async fn epoch_milliseconds_and_epoch_legacy_resets_are_read_as_such() {
    let now = wall();
    let ms = (epoch(now) + 30) * 1000;
    let cases = [
        (
            Dialect::x_ratelimit(),
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            ms,
        ),
        (
            Dialect::github(),
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            ms,
        ),
        (
            Dialect::ietf(),
            "ratelimit-remaining",
            "ratelimit-reset",
            ms,
        ),
        (
            Dialect::ietf(),
            "ratelimit-remaining",
            "ratelimit-reset",
            ms / 1000,
        ),
    ];
    for (dialect, remaining, reset, value) in cases {
        let a = allowance(dialect);
        observe(
            &a,
            200,
            &[
                ("date", httpdate::fmt_http_date(now)),
                (remaining, "0".into()),
                (reset, value.to_string()),
            ],
        )
        .await;
        let what = format!("{reset}: {value}");
        assert_until(cooling(&a), epoch(now) + 30, now, wall(), &what);
        assert!(a.snapshot().closed.is_none());
    }
}
