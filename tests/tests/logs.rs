//! Logs and output people read: state changes at INFO (a cooldown raised and ended, a closure
//! at WARN), each queued wait and retry decision at DEBUG; `Display` for `Snapshot`,
//! `AbandonedCounts` named by reason, a readable `Debug` of the config.

use std::{
    io::Write,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use http::{HeaderValue, Request, Response, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_allowance::{
    error::AbandonReason, retry::RetryConfig, Allowance, AllowanceConfig, RetryBudgetConfig,
};

/// The name of the allowance whose logs are read.
const NAME: &str = "odds-api-logs";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The captured lines of the allowance [`NAME`] at `level` (`"INFO"`, `"DEBUG"`...), each
    /// without its level.
    fn at(&self, level: &str) -> Vec<String> {
        let bytes = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix(level))
            .map(|rest| rest.trim().to_owned())
            .filter(|line| line.contains(NAME))
            .collect()
    }
}

/// Answers 429 with `Retry-After: 1` to the first call, then 200.
fn first_throttled() -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    let calls = Arc::new(AtomicUsize::new(0));
    tower::service_fn(move |_req: Request<String>| {
        let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            let mut res = Response::new(String::new());
            if first {
                *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                res.headers_mut()
                    .insert("retry-after", HeaderValue::from_static("1"));
            }
            Ok(res)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn state_changes_at_info_waits_and_retries_at_debug() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .without_time()
        .with_target(false)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The process's default: a thread's own (`set_default`) can miss events when another
    // test's thread registers the same callsites first (tracing caches their interest). The
    // other test logs too; only this allowance's lines are read (`Captured::at`).
    tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");

    let config = AllowanceConfig::per_second(2, 2).expect("valid").exact();
    let allowance = Allowance::builder(config).name(NAME).build();
    let stack = ServiceBuilder::new()
        .layer(
            allowance
                .layer()
                .with_retry(RetryConfig::default().with_jitter_seed(1)),
        )
        .service(first_throttled());

    // One call: a 429 (a cooldown of 1 s, a retry), then a success.
    let res = stack.clone().oneshot(Request::new(String::new())).await;
    assert_eq!(res.map(|r| r.status()).ok(), Some(StatusCode::OK));
    // Let the cooldown's end pass (it ended when the retry went out, at 1 s).
    tokio::time::sleep(Duration::from_millis(1)).await;
    let info = captured.at("INFO");
    assert_eq!(info.len(), 2, "{info:#?}");
    assert!(
        info[0].contains("allowance cooling down allowance=\"odds-api-logs\" blocked_for=1s"),
        "{info:#?}"
    );
    assert!(
        info[1].contains("allowance cooldown ended allowance=\"odds-api-logs\""),
        "{info:#?}"
    );
    let debug = captured.at("DEBUG");
    assert_eq!(debug.len(), 2, "{debug:#?}");
    assert!(
        debug[0].contains(
            "retrying allowance=\"odds-api-logs\" request=1 attempt=2 delay=1s reason=Throttled"
        ),
        "{debug:#?}"
    );
    // The retry's slot, reserved when it was decided, a second away.
    assert!(
        // The same request: one number over its attempts.
        debug[1].contains("waiting for a slot allowance=\"odds-api-logs\" wait=1s request=1"),
        "{debug:#?}"
    );

    // Three calls at once on a full bucket of 2 at 2/s: the third waits 500 ms for its slot.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = (0..3).map(|_| stack.clone().oneshot(Request::new(String::new())));
    futures::future::join_all(calls).await;
    let debug = captured.at("DEBUG");
    assert_eq!(debug.len(), 3, "{debug:#?}");
    assert!(
        // Another request, another number (the two that went at once were named by none).
        debug[2].contains("waiting for a slot allowance=\"odds-api-logs\" wait=500ms request=2"),
        "{debug:#?}"
    );
    // Nothing else changed state: still the two INFO lines.
    assert_eq!(captured.at("INFO").len(), 2);

    // A wait beyond max_cooldown closes the allowance: a WARN.
    allowance
        .extend_cooldown(Duration::from_secs(7200))
        .await
        .expect("memory store");
    let warn = captured.at("WARN");
    assert_eq!(warn.len(), 1, "{warn:#?}");
    assert!(warn[0].contains("allowance closed"), "{warn:#?}");
}

#[tokio::test(start_paused = true)]
async fn snapshots_and_configs_read_as_they_mean() {
    let config = AllowanceConfig::per_second(2, 2)
        .expect("valid")
        .with_retry_budget(RetryBudgetConfig::fixed(1));
    let debug = format!("{config:?}");
    assert!(
        debug.starts_with("AllowanceConfig { limits: [Limit { rate: 2, period: 1s, burst: 2"),
        "{debug}"
    );
    assert!(
        debug.contains("retry_budget: Fixed { retries: 1 }"),
        "{debug}"
    );
    assert!(
        !debug.contains("params: Params"),
        "the parameters derived for the stores are left out: {debug}"
    );

    let allowance = Allowance::builder(config).name("odds-api").build();
    let stack = ServiceBuilder::new()
        .layer(
            allowance
                .layer()
                .with_retry(RetryConfig::default().with_jitter_seed(1)),
        )
        .service_fn(|_req: Request<String>| async {
            let mut res = Response::new(String::new());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            Ok::<_, std::convert::Infallible>(res)
        });
    // Two calls against an upstream that always throttles, one retry in the budget: the
    // first call's 429 cools the allowance down for 1 s, which the second call's first
    // attempt waits out; one of them spends the budget's retry, and each is refused one.
    let calls = (0..2).map(|_| stack.clone().oneshot(Request::new(String::new())));
    futures::future::join_all(calls).await;
    let snapshot = allowance.snapshot();
    assert_eq!(
        snapshot.abandoned.get(AbandonReason::BudgetExhausted),
        2,
        "{snapshot:?}"
    );
    assert_eq!(
        format!("{:?}", snapshot.abandoned),
        "AbandonedCounts { max_attempts: 0, budget_exhausted: 2, deadline: 0, \
         not_replayable: 0, overloaded: 0, quota_exhausted: 0, cooldown_too_long: 0, \
         too_costly: 0 }"
    );
    assert_eq!(
        snapshot.abandoned.to_string(),
        "2 abandoned (budget_exhausted 2)"
    );
    let line = snapshot.to_string();
    assert!(
        line.starts_with(
            "odds-api: 3 admitted (2 waited, 1 retries), 3 cooldowns, 0 waiting, \
             2 abandoned (budget_exhausted 2), cooling down for 1s"
        ),
        "{line}"
    );
}
