//! The `metrics` feature: counters, histograms and gauges labelled by allowance name, checked
//! against what a throttling service saw (virtual time, memory store).

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::{ServiceBuilder, ServiceExt};
use tower_allowance::{retry::RetryConfig, Allowance, AllowanceConfig};

#[test]
fn counters_match_what_the_upstream_saw() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let seen = Arc::new(AtomicU64::new(0));
    let throttled = Arc::new(AtomicU64::new(0));
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let allowance = Allowance::builder(AllowanceConfig::per_second(2, 2).expect("valid"))
                .name("odds")
                .build();
            let (s, t) = (seen.clone(), throttled.clone());
            let svc = ServiceBuilder::new()
                .layer(
                    allowance
                        .layer()
                        .with_retry(RetryConfig::default().with_max_attempts(2).expect("valid")),
                )
                .service_fn(move |_r: Request<String>| {
                    // Every third request is throttled with Retry-After: 1.
                    let n = s.fetch_add(1, Ordering::SeqCst);
                    let throttle = n % 3 == 2;
                    if throttle {
                        t.fetch_add(1, Ordering::SeqCst);
                    }
                    async move {
                        let mut res = Response::new(String::new());
                        if throttle {
                            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                            res.headers_mut()
                                .insert("retry-after", http::HeaderValue::from_static("1"));
                        }
                        Ok::<_, Infallible>(res)
                    }
                });
            let jobs: Vec<_> = (0..9)
                .map(|_| {
                    let svc = svc.clone();
                    tokio::spawn(async move { svc.oneshot(Request::new(String::new())).await })
                })
                .collect();
            for j in jobs {
                let _ = j.await.expect("job");
            }
            let _ = allowance.store_state().await.expect("state");
            tokio::time::advance(Duration::from_secs(1)).await;
        });
    });
    let metrics = snapshotter.snapshot().into_vec();
    let value = |name: &str, label: Option<(&str, &str)>| -> u64 {
        metrics
            .iter()
            .filter(|(key, _, _, _)| {
                key.key().name() == name
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "allowance" && l.value() == "odds")
                    && label.is_none_or(|(k, v)| {
                        key.key().labels().any(|l| l.key() == k && l.value() == v)
                    })
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(c) => *c,
                DebugValue::Histogram(h) => h.len() as u64,
                DebugValue::Gauge(g) => g.into_inner() as u64,
            })
            .sum()
    };
    let sent = seen.load(Ordering::SeqCst);
    let admitted = value("tower_allowance_admissions_total", None);
    eprintln!("upstream saw {sent}, admissions {admitted}");
    assert_eq!(
        admitted, sent,
        "every request the upstream saw was admitted once"
    );
    assert_eq!(
        value(
            "tower_allowance_throttled_responses_total",
            Some(("status", "429"))
        ),
        throttled.load(Ordering::SeqCst)
    );
    assert_eq!(
        value("tower_allowance_wait_seconds", None),
        value("tower_allowance_admissions_total", Some(("waited", "true"))),
        "one wait recorded per waiting admission"
    );
    assert!(value("tower_allowance_cooldowns_total", None) >= 1);
    assert!(value("tower_allowance_retries_total", None) >= 1);
}

#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A wait beyond `max_cooldown` closes the allowance for `max_cooldown`, each time with a
/// WARN (the allowance, the value, the reopening time) and a count by reason.
#[test]
fn every_closure_is_counted_and_warned() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let max = Duration::from_secs(60);
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let config = AllowanceConfig::per_second(2, 2)
                .expect("valid")
                .with_max_cooldown(max)
                .expect("valid");
            let allowance = Allowance::builder(config).name("odds").build();
            let svc = ServiceBuilder::new()
                .layer(tower_allowance::cooldown::CooldownLayer::new(
                    allowance.clone(),
                ))
                .service_fn(|_r: Request<String>| async {
                    let mut res = Response::new(String::new());
                    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    res.headers_mut().insert(
                        "retry-after",
                        http::HeaderValue::from_static("99999999999999999999"),
                    );
                    Ok::<_, Infallible>(res)
                });
            for _ in 0..2 {
                svc.clone()
                    .oneshot(Request::new(String::new()))
                    .await
                    .expect("passed");
                let state = allowance.store_state().await.expect("state");
                assert_eq!(state.closed, Some(Some(max)));
                tokio::time::advance(max).await;
                let state = allowance.store_state().await.expect("state");
                assert_eq!(state.closed, None, "reopened by itself");
            }
        });
    });
    let closures: u64 = snapshotter
        .snapshot()
        .into_vec()
        .iter()
        .filter(|(key, _, _, _)| {
            key.key().name() == "tower_allowance_closures_total"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "reason" && l.value() == "cooldown_too_long")
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum();
    assert_eq!(closures, 2, "counted each time");
    let log = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
    let warnings: Vec<_> = log
        .lines()
        .filter(|l| l.contains("allowance closed"))
        .collect();
    assert_eq!(warnings.len(), 2, "{log}");
    for w in warnings {
        assert!(w.contains("WARN") && w.contains("odds"), "{w}");
        assert!(w.contains("99999999999999999999"), "the value: {w}");
        assert!(
            w.contains("reopens_in=Some(60s)") && w.contains("reopens_at="),
            "{w}"
        );
    }
}

/// A store that answers only through I/O (no synchronous twin): each call takes `delay` of
/// tokio's clock, then applies the rule, or fails as `rejected` when `broken`.
#[derive(Debug)]
struct Remote {
    state: std::sync::Mutex<tower_allowance::store::State>,
    epoch: tokio::time::Instant,
    delay: Duration,
    broken: bool,
}

impl Remote {
    fn new(delay: Duration, broken: bool) -> Self {
        Self {
            state: Default::default(),
            epoch: tokio::time::Instant::now(),
            delay,
            broken,
        }
    }
}

impl tower_allowance::store::Store for Remote {
    fn apply(
        &self,
        params: &tower_allowance::store::Params,
        op: tower_allowance::store::Op,
    ) -> tower_allowance::store::StoreFuture<tower_allowance::store::Reply> {
        let now = self.epoch.elapsed().as_micros() as u64;
        let reply = match self.broken {
            true => Err(tower_allowance::store::StoreError::rejected(
                "no such script",
            )),
            false => Ok(self.state.lock().expect("lock").apply(now, params, &op)),
        };
        let delay = self.delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            reply
        })
    }
}

/// Every store call that goes to I/O is timed into
/// `tower_allowance_store_call_duration_seconds{allowance}`, a failing one too (and its
/// failure counted by kind); calls answered synchronously (the memory store's) are not.
#[test]
fn store_calls_that_go_to_io_are_timed_failures_too() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let config = || AllowanceConfig::per_second(100, 100).expect("valid");
            let remote = Allowance::builder(config())
                .name("remote")
                .store(Remote::new(Duration::from_millis(5), false))
                .build();
            let memory = Allowance::builder(config()).name("memory").build();
            for _ in 0..4 {
                remote.acquire().await.expect("admitted");
                memory.acquire().await.expect("admitted");
            }
            let broken = Allowance::builder(config())
                .name("broken")
                .store(Remote::new(Duration::from_millis(2), true))
                .build();
            let error = broken.acquire().await.expect_err("the store refused");
            assert!(error.to_string().contains("store"), "{error}");
        });
    });
    let metrics = snapshotter.snapshot().into_vec();
    let of = |name: &str, allowance: &str| -> Vec<&DebugValue> {
        metrics
            .iter()
            .filter(|(key, _, _, _)| {
                key.key().name() == name
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "allowance" && l.value() == allowance)
            })
            .map(|(_, _, _, v)| v)
            .collect()
    };
    let samples = |allowance: &str| -> Vec<f64> {
        of("tower_allowance_store_call_duration_seconds", allowance)
            .into_iter()
            .flat_map(|v| match v {
                DebugValue::Histogram(h) => h.iter().map(|s| s.into_inner()).collect::<Vec<_>>(),
                other => panic!("not a histogram: {other:?}"),
            })
            .collect()
    };
    // One timed call per admission, each as long as the store took (virtual time: exact).
    assert_eq!(samples("remote"), vec![0.005; 4]);
    assert!(
        samples("memory").is_empty(),
        "synchronous answers are not timed"
    );
    assert_eq!(
        samples("broken"),
        vec![0.002],
        "the failing call is timed too"
    );
    // Labelled by the allowance alone.
    for (key, _, _, _) in &metrics {
        if key.key().name() == "tower_allowance_store_call_duration_seconds" {
            let labels: Vec<_> = key.key().labels().map(|l| l.key()).collect();
            assert_eq!(labels, ["allowance"], "{key:?}");
        }
    }
    let errors = |allowance: &str, kind: &str| -> u64 {
        metrics
            .iter()
            .filter(|(key, _, _, _)| {
                let k = key.key();
                k.name() == "tower_allowance_store_errors_total"
                    && k.labels()
                        .any(|l| l.key() == "allowance" && l.value() == allowance)
                    && k.labels().any(|l| l.key() == "kind" && l.value() == kind)
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(c) => *c,
                _ => 0,
            })
            .sum()
    };
    assert_eq!(errors("broken", "rejected"), 1);
    assert_eq!(
        errors("remote", "rejected") + errors("remote", "unavailable"),
        0
    );
}
