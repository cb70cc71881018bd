//! A provider-specific rule: a user-defined `Classify`.
//!
//! This provider answers 503 for two different reasons: with `X-Throttled: true` when the
//! caller is over its limit (with a `Retry-After`), and without it during maintenance. The
//! default classifier treats every 503 as throttling: it retries maintenance errors and
//! cools the whole allowance down. The custom rule below retries (and cools down) only on
//! the marked 503, and returns the maintenance 503 at once.
//!
//! The provider is an in-process service and the clock is paused, so this runs instantly:
//!
//! ```text
//! cargo run --example custom_classifier
//! ```

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc, Mutex,
};

use http::{HeaderMap, Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{util::BoxCloneService, ServiceBuilder, ServiceExt};
use tower_allowance::{
    classify::{Classification, Classify, StatusClassifier},
    retry::RetryConfig,
    Allowance, AllowanceConfig, BoxError, Outcome,
};

/// 503 + `X-Throttled: true` is throttling; any other 5xx is a final failure.
#[derive(Clone, Debug, Default)]
pub(crate) struct ThrottleHeader;

impl Classify for ThrottleHeader {
    fn classify(&self, status: StatusCode, headers: &HeaderMap) -> Classification {
        let marked = headers
            .get("x-throttled")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        match status {
            StatusCode::TOO_MANY_REQUESTS => Classification::Throttled,
            StatusCode::SERVICE_UNAVAILABLE if marked => Classification::Throttled,
            s if s.is_success() || s.is_redirection() => Classification::Success,
            _ => Classification::Failure,
        }
    }
}

/// What the provider saw and what the callers got.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Calls the provider saw for `/throttled` and `/maintenance`.
    pub(crate) provider_calls: (usize, usize),
    /// How the `/throttled` request ended, its final status, and when (ms).
    pub(crate) throttled: (Outcome, u16, u64),
    /// How the `/maintenance` request ended, and its final status.
    pub(crate) maintenance: (Outcome, u16),
}

type Svc = BoxCloneService<Request<String>, Response<String>, BoxError>;

/// A provider: `/throttled` answers a marked 503 (`Retry-After: 2`) once, then 200;
/// `/maintenance` always answers an unmarked 503.
fn provider(calls: Arc<Mutex<(usize, usize)>>) -> Svc {
    let throttled_seen = Arc::new(AtomicUsize::new(0));
    Svc::new(tower::service_fn(move |req: Request<String>| {
        let calls = calls.clone();
        let throttled_seen = throttled_seen.clone();
        async move {
            let mut res = Response::new(String::new());
            if req.uri().path() == "/maintenance" {
                calls.lock().map_err(|_| "poisoned")?.1 += 1;
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            } else {
                calls.lock().map_err(|_| "poisoned")?.0 += 1;
                if throttled_seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    res.headers_mut().insert("x-throttled", "true".parse()?);
                    res.headers_mut().insert("retry-after", "2".parse()?);
                }
            }
            Ok::<_, BoxError>(res)
        }
    }))
}

/// Runs both requests through one allowance with `classifier`. Call it on a paused clock.
pub(crate) async fn demo<C: Classify>(classifier: C) -> Result<Summary, BoxError> {
    let calls = Arc::new(Mutex::new((0, 0)));
    let allowance = Allowance::new(AllowanceConfig::per_second(10, 10)?);
    let stack = ServiceBuilder::new()
        .layer(
            allowance
                .layer()
                .with_retry(RetryConfig::default().with_max_attempts(3)?)
                .with_classifier(classifier),
        )
        .service(provider(calls.clone()));
    let start = Instant::now();
    let throttled = stack
        .clone()
        .oneshot(Request::get("/throttled").body(String::new())?)
        .await;
    let throttled_at = u64::try_from(start.elapsed().as_millis())?;
    let maintenance = stack
        .oneshot(Request::get("/maintenance").body(String::new())?)
        .await;
    let status =
        |r: &Result<Response<String>, BoxError>| r.as_ref().map_or(0, |r| r.status().as_u16());
    let provider_calls = *calls.lock().map_err(|_| "poisoned")?;
    Ok(Summary {
        provider_calls,
        throttled: (Outcome::of(&throttled), status(&throttled), throttled_at),
        maintenance: (Outcome::of(&maintenance), status(&maintenance)),
    })
}

/// What happened, in words: a 503 is never called completed.
pub(crate) fn describe(outcome: Outcome) -> String {
    match outcome {
        Outcome::Completed => "completed".to_owned(),
        Outcome::Unsuccessful(status) => format!("ended unsuccessfully ({status})"),
        Outcome::Abandoned(reason) => format!("abandoned ({reason})"),
        other => format!("{other:?}"),
    }
}

fn main() -> Result<(), BoxError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    for (name, summary) in [
        (
            "default (every 503 is throttling)",
            rt.block_on(demo(StatusClassifier::default()))?,
        ),
        (
            "custom (only a 503 with X-Throttled)",
            rt.block_on(demo(ThrottleHeader))?,
        ),
    ] {
        println!("{name}:");
        println!(
            "  /throttled   -> {}, status {}, done at {} ms (waited for Retry-After: 2)",
            describe(summary.throttled.0),
            summary.throttled.1,
            summary.throttled.2
        );
        println!(
            "  /maintenance -> {}, status {}",
            describe(summary.maintenance.0),
            summary.maintenance.1
        );
        println!(
            "  the provider saw {} /throttled and {} /maintenance calls\n",
            summary.provider_calls.0, summary.provider_calls.1
        );
    }
    Ok(())
}
