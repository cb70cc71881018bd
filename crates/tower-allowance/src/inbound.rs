//! Inbound use with axum: a request the allowance gave up on, answered `503 Service
//! Unavailable` with the allowance's `Retry-After` (feature `axum`).
//!
//! Two places an abandonment reaches an axum app, and one answer for both, [`Unavailable`]:
//!
//! - **A handler fetching from an upstream** through the outbound stack
//!   ([`AllowanceLayer`](crate::AllowanceLayer)): [`Unavailable::of`] the stack's result is
//!   `Some` when [`Outcome::of`](crate::Outcome::of) says `Abandoned` (an error, or the last
//!   throttling response the retry policy gave up on), and the handler returns it.
//! - **A route limited by an allowance** (`Router::route_layer` over an
//!   [`AdmissionLayer`](crate::admission::AdmissionLayer)): the layer fails a request it
//!   cannot admit in time (its [`Deadline`](crate::Deadline)) or whose queue is full, and axum's
//!   `HandleErrorLayer` turns the error into a response with [`Unavailable::of_error`].
//!
//! The answer says when to come back: what the abandonment knew
//! ([`Abandoned::retry_after`]: the end of the cooldown that held it, the slot the store
//! offered, the server's wait, a reopening), else what the allowance knows now (the shared
//! cooldown still to run, the time until a closed allowance reopens), else one token interval
//! (the earliest a new slot can come). `Retry-After` is that in whole seconds, rounded up (at
//! least 1); `x-allowance-abandoned` names the [`AbandonReason`], as gRPC answers do.
//!
//! ```
//! use std::time::Duration;
//!
//! use axum::{error_handling::HandleErrorLayer, response::IntoResponse, routing::get, Router};
//! use http::{Request, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{
//!     admission::AdmissionLayer, inbound::Unavailable, Allowance, AllowanceConfig, BoxError,
//!     Deadline,
//! };
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // One call per second into `/report`; a caller waits at most 100 ms for its turn.
//! let allowance = Allowance::new(AllowanceConfig::per_second(1, 1)?.exact());
//! let on_error = {
//!     let allowance = allowance.clone();
//!     move |e: BoxError| {
//!         let answer = Unavailable::of_error(&*e, &allowance).map(IntoResponse::into_response);
//!         async move { answer.unwrap_or_else(|| StatusCode::INTERNAL_SERVER_ERROR.into_response()) }
//!     }
//! };
//! let app = Router::new().route("/report", get(|| async { "done" })).route_layer(
//!     ServiceBuilder::new()
//!         .layer(HandleErrorLayer::new(on_error))
//!         .map_request(|mut req: Request<axum::body::Body>| {
//!             req.extensions_mut().insert(Deadline::after(Duration::from_millis(100)));
//!             req
//!         })
//!         .layer(AdmissionLayer::new(allowance)),
//! );
//! let get = || Request::get("/report").body(axum::body::Body::empty());
//! assert_eq!(app.clone().oneshot(get()?).await?.status(), StatusCode::OK);
//! let turned_away = app.oneshot(get()?).await?;
//! assert_eq!(turned_away.status(), StatusCode::SERVICE_UNAVAILABLE);
//! assert_eq!(turned_away.headers()["retry-after"], "1");
//! assert_eq!(turned_away.headers()["x-allowance-abandoned"], "deadline");
//! # Ok(())
//! # }
//! ```

use std::{fmt, time::Duration};

use axum_core::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};

use crate::{
    error::{AbandonReason, Abandoned},
    Allowance, BoxError,
};

/// A request the allowance gave up on, as an axum answer: `503 Service Unavailable` with
/// `Retry-After` and `x-allowance-abandoned` (see the [module docs](self)).
///
/// ```
/// use axum::response::IntoResponse;
/// use http::Response;
/// use tower_allowance::{
///     error::{AbandonReason, Abandoned}, inbound::Unavailable, Allowance, AllowanceConfig, BoxError,
/// };
///
/// let allowance = Allowance::new(AllowanceConfig::per_second(4, 4).expect("valid"));
/// let result: Result<Response<()>, BoxError> = Err(Abandoned::new(AbandonReason::BudgetExhausted).into());
/// let unavailable = Unavailable::of(&result, &allowance).expect("abandoned");
/// // Nothing known of when to come back: one token interval (250 ms), one second at least.
/// let response = unavailable.into_response();
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["retry-after"], "1");
/// assert_eq!(response.headers()["x-allowance-abandoned"], "budget_exhausted");
///
/// let ok: Result<Response<()>, BoxError> = Ok(Response::new(()));
/// assert!(Unavailable::of(&ok, &allowance).is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unavailable {
    reason: AbandonReason,
    retry_after: Duration,
}

impl Unavailable {
    /// The answer for a stack's result, when the request was given up on: an abandonment
    /// error (through wrappers too), or a response the stack marked abandoned (the last
    /// throttling response, kept). `None` for anything else: a response to pass on, or
    /// another error.
    pub fn of<B>(
        result: &Result<http::Response<B>, BoxError>,
        allowance: &Allowance,
    ) -> Option<Self> {
        let abandoned = match result {
            Ok(response) => response.extensions().get::<Abandoned>().copied(),
            Err(e) => Abandoned::of_error(&**e),
        };
        abandoned.map(|a| Self::new(a, allowance))
    }

    /// The answer for an error alone (what axum's `HandleErrorLayer` hands its function):
    /// `None` unless it is an abandonment ([`Abandoned::of_error`]).
    pub fn of_error(e: &(dyn std::error::Error + 'static), allowance: &Allowance) -> Option<Self> {
        Abandoned::of_error(e).map(|a| Self::new(a, allowance))
    }

    fn new(abandoned: Abandoned, allowance: &Allowance) -> Self {
        let retry_after = abandoned.retry_after().unwrap_or_else(|| {
            let snapshot = allowance.snapshot();
            (snapshot.closed.and_then(|c| c.reopens_in))
                .or(snapshot.cooling_for)
                .unwrap_or_else(|| allowance.config().interval())
        });
        Self {
            reason: abandoned.reason(),
            retry_after,
        }
    }

    /// Why the request was given up on.
    pub fn reason(&self) -> AbandonReason {
        self.reason
    }

    /// When to come back, from when this answer was made.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// `Retry-After` in whole seconds: [`retry_after`](Self::retry_after) rounded up, at
    /// least 1 (a client told 0 comes back at once).
    pub fn retry_after_secs(&self) -> u64 {
        let d = self.retry_after;
        (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request abandoned by the allowance ({})", self.reason)
    }
}

impl IntoResponse for Unavailable {
    fn into_response(self) -> Response {
        let mut response = (StatusCode::SERVICE_UNAVAILABLE, self.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(self.retry_after_secs()),
        );
        let reason = HeaderValue::from_static(self.reason.as_str());
        headers.insert("x-allowance-abandoned", reason);
        response
    }
}
