//! gRPC throttling signals (gRFC A6): `grpc-status` and `grpc-retry-pushback-ms`, read from
//! a response's headers or trailers.
//!
//! A gRPC server throttles on an HTTP 200: `grpc-status: 8` (RESOURCE_EXHAUSTED), either
//! in the headers of a *trailers-only* response or in the trailers after the messages,
//! with its requested delay in `grpc-retry-pushback-ms`. The HTTP status classifier
//! cannot see either. [`GrpcResponse::from_head`] reads the headers: a finished call's
//! status, a call whose status is still to come in the trailers, or `None` for a response
//! that is not gRPC (left to the HTTP status classifier). [`WatchTrailers`] shows the
//! trailers to a closure as they pass, without holding the body back.
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderMap, HeaderValue, StatusCode};
//! use tower_allowance::{classify::Classification, grpc::{Code, GrpcResponse, Pushback}};
//!
//! // A trailers-only RESOURCE_EXHAUSTED asking for 1.5 s.
//! let mut headers = HeaderMap::new();
//! headers.insert("content-type", HeaderValue::from_static("application/grpc"));
//! headers.insert("grpc-status", HeaderValue::from_static("8"));
//! headers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("1500"));
//!
//! let Some(GrpcResponse::TrailersOnly(status)) = GrpcResponse::from_head(StatusCode::OK, &headers)
//! else { unreachable!("a trailers-only response") };
//! assert_eq!(status.code(), Code::RESOURCE_EXHAUSTED);
//! assert_eq!(status.classification(), Classification::Throttled);
//! assert_eq!(status.pushback(), Some(Pushback::Delay(Duration::from_millis(1500))));
//!
//! // Not gRPC: for the HTTP status classifier.
//! assert_eq!(GrpcResponse::from_head(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new()), None);
//! ```
//!
//! # In the stack
//!
//! [`GrpcClassifier`] classifies each response by its gRPC status where it has one
//! (RESOURCE_EXHAUSTED is throttling, and so is UNAVAILABLE with a pushback; UNAVAILABLE
//! without one is transient, every other code final) and reads `grpc-retry-pushback-ms` as
//! the server's delay, fed to the same shared cooldown as `Retry-After`. A status that comes
//! in the trailers is read by [`TrailersLayer`] as the trailers pass, without holding the
//! body back: a RESOURCE_EXHAUSTED there cools the allowance down for everyone (the call
//! itself is over by then, so it is not retried). [`GrpcLayer`] stacks both, under a
//! [`GrpcCall`] that makes `grpc-timeout` the call's deadline and tells a tonic caller what
//! the stack did: the whole allowance stack for a tonic `Channel`.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Method, Request, Response};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{grpc::GrpcLayer, retry::RetryConfig, Allowance, AllowanceConfig, Outcome};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let allowance = Allowance::new(AllowanceConfig::per_second(5, 5)?);
//! // gRPC calls are POSTs: say which ones may be retried (here, all of them).
//! let retry = RetryConfig::default().with_replayable_methods([Method::POST]);
//! let channel = tower::service_fn(|_req: Request<String>| async {
//!     // A trailers-only RESOURCE_EXHAUSTED asking for 2 s, as a tonic server sends it.
//!     let res = Response::builder()
//!         .header("content-type", "application/grpc")
//!         .header("grpc-status", "8")
//!         .header("grpc-retry-pushback-ms", "2000")
//!         .body(String::new())
//!         .map_err(tower_allowance::BoxError::from)?;
//!     Ok::<_, tower_allowance::BoxError>(res)
//! });
//! let client = ServiceBuilder::new()
//!     .layer(GrpcLayer::new(allowance.clone()).with_retry(retry))
//!     .service(channel);
//!
//! let result = client.oneshot(Request::post("/pkg.Svc/Get").body(String::new())?).await;
//! // Three attempts, each after the pushback, then the attempts ran out: not a success.
//! assert!(matches!(Outcome::of(&result), Outcome::Abandoned(_)));
//! assert_eq!(allowance.snapshot().admitted, 3);
//! # Ok(())
//! # }
//! ```
//!
//! # Deadlines, and what a tonic caller sees
//!
//! - **`grpc-timeout` is the call's deadline across every attempt** (gRFC A6), so tonic's
//!   `Request::set_timeout` is too: [`GrpcCall`] turns it into the call's
//!   [`Deadline`] (the earlier one if the request carries a `Deadline` already), and each
//!   attempt says the time left in `grpc-timeout` when it is sent, in the most precise unit
//!   that fits, rounded down. A retry whose wait (the pushback, the backoff, its admission)
//!   would pass the deadline is not made: the call ends at once with the last answer, marked
//!   abandoned (`deadline`). A call whose deadline passes while it waits behind admission or a
//!   cooldown fails at once, not after the wait, with DEADLINE_EXCEEDED. A value that is not
//!   1 to 8 digits and a unit is passed on unchanged and sets no deadline.
//! - **A call whose deadline passes while an attempt is in flight ends there**, with
//!   DEADLINE_EXCEEDED marked `deadline` (and counted as abandoned), like a call whose
//!   deadline passes in the queue: [`GrpcCall`]'s response future holds the deadline's timer
//!   and polls it before the attempt, which is dropped with the future (until the answer's
//!   head comes: the messages of a streamed answer are not timed, by tonic either). Left to
//!   them, tonic's `Channel` (and the server) would end the call on their own timers, set
//!   from the `grpc-timeout` the attempt was sent with, as `CANCELLED "Timeout expired"`,
//!   with nothing to say that the deadline did it. The timers cannot disagree, whichever
//!   fires first:
//!   - the stack's timer is due no later than theirs. An attempt's `grpc-timeout` is rounded
//!     down by less than one unit of it, and that unit is at most the unit of the call's
//!     whole timeout; the timer is set that much (less a nanosecond) before the deadline: at
//!     the deadline below 100 ms, under a microsecond before it below 100 s, under a
//!     millisecond below 27 hours;
//!   - an error from the attempt once that instant has passed (their timer seen first, for
//!     whatever reason) is the deadline's verdict too. An error before it (a refused
//!     connection) is passed on as it is.
//! - **An abandoned call says why**: its answer carries `x-allowance-abandoned: <reason>`
//!   ([`X_ALLOWANCE_ABANDONED`], an [`AbandonReason::as_str`]) in its headers, which tonic
//!   hands on in `Status::metadata` (a trailers-only answer: every throttled one) or
//!   `Response::metadata`; [`Outcome::of_error`](crate::Outcome::of_error) reads it from a
//!   `tonic::Status` (feature `tonic`). A status tonic infers from a proxy's HTTP answer (a
//!   429 without `grpc-status`) has no metadata.
//! - **The stack's own refusals are gRPC answers** (trailers-only: HTTP 200, the status in
//!   the headers, an empty body), never `Code::Unknown`, each with a `grpc-message` and, but
//!   for a store failure, `x-allowance-abandoned`:
//!
//! | refusal | status | `grpc-retry-pushback-ms` |
//! |---------|--------|--------------------------|
//! | a deadline ([`AbandonReason::Deadline`]) | DEADLINE_EXCEEDED | none |
//! | the allowance closed ([`Exhausted`]: quota spent, a wait beyond `max_cooldown`) | RESOURCE_EXHAUSTED | the time until it reopens, or `-1` (do not retry) when only clearing reopens it |
//! | the wait queue full ([`Overloaded`]) | UNAVAILABLE | [`Overloaded::wait`](crate::error::Overloaded#structfield.wait): until the allowance could admit a call |
//! | the retry budget spent, a cost that never fits, ... (another [`AbandonReason`]) | RESOURCE_EXHAUSTED | `-1`: retrying cannot help |
//! | the store failed ([`StoreUnavailable`]) | UNAVAILABLE | none |
//!
//! A closure is RESOURCE_EXHAUSTED because it is a quota (the provider's, or a server's
//! order to stay away), to be waited out, not hammered; a full queue is UNAVAILABLE, the
//! code for "transient, retry with backoff" that client retry policies list, since nothing
//! was sent and the queue drains; both carry the wait left, which a gRFC A6 client honours.
//!
//! # A status in the trailers
//!
//! A RESOURCE_EXHAUSTED (or an UNAVAILABLE with a pushback) that comes in the trailers,
//! after the headers and maybe messages, is **not retried**: by then the response head, and
//! any message, have reached the caller, and a retry would answer a call that is over (a
//! stream's caller would see messages twice). It does raise the shared cooldown as it
//! passes ([`TrailersLayer`]), so the calls that follow wait, and the caller gets the
//! server's status unchanged.
//!
//! # UNAVAILABLE and its pushback
//!
//! UNAVAILABLE with a `grpc-retry-pushback-ms` delay is **throttling**, as an HTTP 503 with
//! `Retry-After` is by default: the server asked for a wait, and the wait is shared, so the
//! calls that follow wait with the one that heard it. Without a pushback, UNAVAILABLE is
//! transient: only that call backs off. Measured against a real tonic server (virtual
//! time, `tests/tests/grpc_tonic.rs`,
//! `unavailable_with_a_pushback_cools_every_call_down`): ten calls arriving 100 ms apart
//! while the server sheds load for a second (UNAVAILABLE, pushback 1,000 ms) make 11
//! attempts and are all done at 1,000 ms with the wait shared, against 20 attempts and
//! 1,900 ms when each call honours its own pushback (each of the ten is refused, then waits
//! its own second). The price: an UNAVAILABLE with a pushback from one bad backend holds
//! every call sharing the allowance for that long; a server that means only "this call"
//! sends no pushback, or a classifier can say otherwise.
//!
//! # What is read, and how strictly
//!
//! - `grpc-status` is `1*DIGIT` (the gRPC over HTTP/2 grammar). A value that is not, or
//!   does not fit in a `u32`, or a field sent more than once, is malformed: [`Code::from_bytes`]
//!   returns `None`, and a response carrying it reads as [`Code::UNKNOWN`], as tonic does
//!   (a final failure: never a reason to retry).
//! - `grpc-retry-pushback-ms` as gRFC A6 says: a non-negative integer is the delay the
//!   server asks for; a negative or unparsable value means *do not retry*. A field sent more
//!   than once also means *do not retry*, as grpc-go decides: the server's intent cannot
//!   be known, and retrying is the one choice that can make throttling worse. The integer
//!   is parsed as grpc-go and grpc-java do (a 64-bit integer, an optional sign), so an
//!   out-of-range value is unparsable too.
//!
//! # Files
//!
//! In the order they build on each other (each file's code names only the files before it,
//! and the header names defined here): `codes.rs` ([`Code`]); `status.rs` (what a
//! response's head or trailers say: [`GrpcStatus`], [`GrpcResponse`], [`Pushback`]);
//! `classify.rs` ([`GrpcClassifier`]); `body.rs` ([`WatchTrailers`], [`OnTrailers`]);
//! `deadline.rs` (`grpc-timeout` read and written, and the instant the call's deadline is
//! due); `trailers.rs` ([`TrailersLayer`], [`FeedAllowance`]); `call.rs` ([`GrpcCall`]: the
//! call's deadline, the stack's refusals as gRPC answers); `layer.rs` ([`GrpcLayer`]);
//! `tests.rs` (unit tests of the private parts; the public API's are in the repository's
//! `tests/tests/grpc.rs` and `grpc_tonic.rs`).
//!
//! [`AbandonReason`]: crate::error::AbandonReason
//! [`AbandonReason::Deadline`]: crate::error::AbandonReason::Deadline
//! [`AbandonReason::as_str`]: crate::error::AbandonReason::as_str
//! [`Deadline`]: crate::Deadline
//! [`Exhausted`]: crate::error::Exhausted
//! [`Overloaded`]: crate::error::Overloaded
//! [`StoreUnavailable`]: crate::error::StoreUnavailable

mod body;
mod call;
mod classify;
mod codes;
mod deadline;
mod layer;
mod status;
mod trailers;

#[cfg(test)]
mod tests;

pub use body::{OnTrailers, WatchTrailers};
pub use call::{GrpcCall, GrpcCallFuture};
pub use classify::GrpcClassifier;
pub use codes::Code;
pub use layer::GrpcLayer;
pub use status::{GrpcResponse, GrpcStatus, Pushback};
pub use trailers::{FeedAllowance, Trailers, TrailersFuture, TrailersLayer};

const GRPC_STATUS: &str = "grpc-status";
const GRPC_MESSAGE: &str = "grpc-message";
const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// The metadata key (a response header, which tonic hands on in `Status::metadata` or
/// `Response::metadata`) naming why the stack gave up on a call: an
/// [`AbandonReason::as_str`](crate::error::AbandonReason::as_str), such as `deadline` or
/// `budget_exhausted`.
pub const X_ALLOWANCE_ABANDONED: &str = "x-allowance-abandoned";

/// The metadata key (a response header) saying why an answer waited: the milliseconds the
/// call queued for admission over all its attempts
/// ([`Attempt::queued`](crate::Attempt::queued)); absent when every attempt went at once.
pub const X_ALLOWANCE_WAITED: &str = "x-allowance-waited";

/// The metadata key (a response header) saying how much of that wait a cooldown held the
/// call (the server's wait rather than the rate's): milliseconds
/// ([`Attempt::cooled`](crate::Attempt::cooled)); absent when no cooldown held it.
pub const X_ALLOWANCE_COOLED: &str = "x-allowance-cooled";
