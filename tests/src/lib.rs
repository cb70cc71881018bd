//! Shared helpers for the integration tests of `tower-allowance`.
//!
//! ```
//! let svc = integration_tests::throttling(Some("1"));
//! # let _ = svc;
//! ```

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use http::{Request, Response, StatusCode};
use tower::{service_fn, util::BoxCloneService, ServiceExt};

/// A service that always answers 429, with `Retry-After: value` when given, and counts
/// the calls it receives.
pub fn throttling(retry_after: Option<&'static str>) -> CountedService {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let svc = service_fn(move |_req: Request<String>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut res = Response::new(r#"{"detail":"Synthetic throttle"}"#.to_owned());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            if let Some(v) = retry_after {
                res.headers_mut()
                    .insert(http::header::RETRY_AFTER, http::HeaderValue::from_static(v));
            }
            Ok::<_, Infallible>(res)
        }
    });
    CountedService {
        service: BoxCloneService::new(svc.map_err(|e: Infallible| match e {})),
        calls,
    }
}

/// A service plus a counter of the calls it received.
#[derive(Clone, Debug)]
pub struct CountedService {
    /// The service.
    pub service: BoxCloneService<Request<String>, Response<String>, Infallible>,
    /// Calls received.
    pub calls: Arc<AtomicUsize>,
}

impl CountedService {
    /// Calls received so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// The README's examples, compiled and run as doctests (here, where every crate they use is
/// a dependency).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The tour's examples, likewise.
#[cfg(doctest)]
#[doc = include_str!("../../docs/tour.md")]
pub struct TourDoctests;

/// The settle guide's example, likewise (`docs/settle.md`, feature `settle`).
#[cfg(doctest)]
#[doc = include_str!("../../docs/settle.md")]
pub struct SettleDoctests;
