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
//! | the wait queue full ([`Overloaded`]) | UNAVAILABLE | [`Overloaded::wait`](Overloaded#structfield.wait): until the allowance could admit a call |
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

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
    time::Duration,
};

use http::{header::CONTENT_TYPE, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tower::retry::Retry;
use tower_layer::Layer;
use tower_service::Service;

use tokio::time::Instant;

use crate::{
    admission::Admission,
    classify::{Classification, Classified, Classify, ServerDelay, StatusClassifier},
    cooldown::{raise_detached, Cooldown},
    error::{find, AbandonReason, Abandoned, Exhausted, Overloaded, StoreUnavailable},
    retry::{Prepare, RetryConfig, RetryPolicy},
    rule, Allowance, AllowanceLayer, BoxError, Deadline, MAX_DELAY,
};

const GRPC_STATUS: &str = "grpc-status";
const GRPC_MESSAGE: &str = "grpc-message";
const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";
const GRPC_TIMEOUT: &str = "grpc-timeout";
/// The metadata key (a response header, which tonic hands on in `Status::metadata` or
/// `Response::metadata`) naming why the stack gave up on a call: an
/// [`AbandonReason::as_str`], such as `deadline` or `budget_exhausted`.
pub const X_ALLOWANCE_ABANDONED: &str = "x-allowance-abandoned";

/// A gRPC status code, as carried by `grpc-status`.
///
/// Any `u32` is kept as is: a code this crate has no name for is still a final failure.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Code(u32);

impl Code {
    /// The call succeeded.
    pub const OK: Code = Code(0);
    /// The call was cancelled, typically by the caller.
    pub const CANCELLED: Code = Code(1);
    /// Unknown error; also what a malformed `grpc-status` reads as.
    pub const UNKNOWN: Code = Code(2);
    /// The client specified an invalid argument.
    pub const INVALID_ARGUMENT: Code = Code(3);
    /// The deadline expired before the operation could complete.
    pub const DEADLINE_EXCEEDED: Code = Code(4);
    /// Some requested entity was not found.
    pub const NOT_FOUND: Code = Code(5);
    /// The entity a client attempted to create already exists.
    pub const ALREADY_EXISTS: Code = Code(6);
    /// The caller does not have permission.
    pub const PERMISSION_DENIED: Code = Code(7);
    /// Some resource has been exhausted: a rate limit or a quota. Throttling.
    pub const RESOURCE_EXHAUSTED: Code = Code(8);
    /// The system is not in a state required for the operation.
    pub const FAILED_PRECONDITION: Code = Code(9);
    /// The operation was aborted, typically by a concurrency conflict.
    pub const ABORTED: Code = Code(10);
    /// The operation was attempted past the valid range.
    pub const OUT_OF_RANGE: Code = Code(11);
    /// The operation is not implemented or supported.
    pub const UNIMPLEMENTED: Code = Code(12);
    /// An internal error.
    pub const INTERNAL: Code = Code(13);
    /// The service is currently unavailable: transient.
    pub const UNAVAILABLE: Code = Code(14);
    /// Unrecoverable data loss or corruption.
    pub const DATA_LOSS: Code = Code(15);
    /// The request lacks valid authentication credentials.
    pub const UNAUTHENTICATED: Code = Code(16);

    const NAMES: [&'static str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];

    /// The code with this number.
    pub const fn new(code: u32) -> Self {
        Self(code)
    }

    /// The code's number.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// Parses a `grpc-status` value: ASCII digits only, fitting in a `u32`; `None` for
    /// anything else.
    ///
    /// ```
    /// use tower_allowance::grpc::Code;
    ///
    /// assert_eq!(Code::from_bytes(b"14"), Some(Code::UNAVAILABLE));
    /// assert_eq!(Code::from_bytes(b"+8"), None);
    /// assert_eq!(Code::from_bytes(b""), None);
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(bytes).ok()?.parse().ok().map(Self)
    }

    /// The canonical name (`"RESOURCE_EXHAUSTED"`), for the codes 0 to 16.
    pub fn name(self) -> Option<&'static str> {
        usize::try_from(self.0)
            .ok()
            .and_then(|i| Self::NAMES.get(i).copied())
    }

    /// What this code means to the allowance: OK is a success, RESOURCE_EXHAUSTED
    /// throttling, UNAVAILABLE a transient failure, and every other code a final failure.
    pub fn classification(self) -> Classification {
        match self {
            Self::OK => Classification::Success,
            Self::RESOURCE_EXHAUSTED => Classification::Throttled,
            Self::UNAVAILABLE => Classification::Transient,
            _ => Classification::Failure,
        }
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "Code::{name}"),
            None => write!(f, "Code({})", self.0),
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "code {}", self.0),
        }
    }
}

/// What a server's `grpc-retry-pushback-ms` asks of a retry (gRFC A6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pushback {
    /// Wait this long before the next attempt (`0` is allowed: retry at once).
    Delay(Duration),
    /// Do not retry: the value was negative, unparsable, or sent more than once.
    DoNotRetry,
}

impl Pushback {
    /// Reads `grpc-retry-pushback-ms` from response headers or trailers; `None` when
    /// absent. See the [module docs](self) for the parsing rules.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::{HeaderMap, HeaderValue};
    /// use tower_allowance::grpc::Pushback;
    ///
    /// let mut trailers = HeaderMap::new();
    /// assert_eq!(Pushback::from_header_map(&trailers), None);
    /// trailers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("250"));
    /// assert_eq!(Pushback::from_header_map(&trailers), Some(Pushback::Delay(Duration::from_millis(250))));
    /// trailers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("-1"));
    /// assert_eq!(Pushback::from_header_map(&trailers), Some(Pushback::DoNotRetry));
    /// ```
    pub fn from_header_map(map: &HeaderMap) -> Option<Self> {
        let value = single(map, GRPC_RETRY_PUSHBACK_MS)?;
        let ms = value
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<i64>().ok())
            .and_then(|ms| u64::try_from(ms).ok());
        Some(match ms {
            Some(ms) => Self::Delay(Duration::from_millis(ms)),
            None => Self::DoNotRetry,
        })
    }
}

impl Pushback {
    /// The pushback as the stack's [`ServerDelay`]: a delay beyond
    /// [`MAX_DELAY`] is [`TooLong`](ServerDelay::TooLong) (the allowance
    /// closes rather than wait less), "do not retry" is
    /// [`DoNotRetry`](ServerDelay::DoNotRetry).
    pub fn server_delay(self) -> ServerDelay {
        match self {
            Self::Delay(d) if d > MAX_DELAY => ServerDelay::TooLong,
            Self::Delay(d) => ServerDelay::After(d),
            Self::DoNotRetry => ServerDelay::DoNotRetry,
        }
    }
}

/// The status of a finished gRPC call: its code and the server's pushback, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrpcStatus {
    code: Code,
    pushback: Option<Pushback>,
}

impl GrpcStatus {
    /// Reads a call's status from trailers (or from the headers of a trailers-only
    /// response); `None` without a `grpc-status` field. A malformed `grpc-status` reads as
    /// [`Code::UNKNOWN`].
    pub fn from_header_map(map: &HeaderMap) -> Option<Self> {
        let code = single(map, GRPC_STATUS)?
            .and_then(|value| Code::from_bytes(value.as_bytes()))
            .unwrap_or(Code::UNKNOWN);
        Some(Self {
            code,
            pushback: Pushback::from_header_map(map),
        })
    }

    /// The status code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The server's `grpc-retry-pushback-ms`, if it sent one.
    pub fn pushback(&self) -> Option<Pushback> {
        self.pushback
    }

    /// What the call's code means to the allowance (see [`Code::classification`]), except
    /// that an UNAVAILABLE with a pushback delay is throttling: the server asked every call
    /// to wait, so the wait is shared (see the [module docs](self#unavailable-and-its-pushback)).
    /// A [`Pushback::DoNotRetry`] does not change it: a throttled call stays throttled (it
    /// still cools the allowance down), it is just not retried.
    pub fn classification(&self) -> Classification {
        match (self.code, self.pushback) {
            (Code::UNAVAILABLE, Some(Pushback::Delay(_))) => Classification::Throttled,
            (code, _) => code.classification(),
        }
    }
}

/// What a response's head says about a gRPC call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrpcResponse {
    /// A trailers-only response: the call is over and its status is in the headers.
    TrailersOnly(GrpcStatus),
    /// A gRPC response whose status will come in the trailers, after the messages: watch
    /// them with [`WatchTrailers`].
    StatusInTrailers,
}

impl GrpcResponse {
    /// Reads a response's status line and headers.
    ///
    /// - a `grpc-status` field: [`TrailersOnly`](Self::TrailersOnly), whatever the HTTP
    ///   status (the gRPC status is the more precise of the two);
    /// - otherwise, a `content-type` of `application/grpc` (or `application/grpc+proto`,
    ///   `application/grpc;...`) on an HTTP 200: [`StatusInTrailers`](Self::StatusInTrailers);
    /// - otherwise `None`: not a gRPC response, or an HTTP-level answer from an
    ///   intermediary (a proxy's 429 or 503): the HTTP status classifier's to judge.
    pub fn from_head(status: StatusCode, headers: &HeaderMap) -> Option<Self> {
        if let Some(status) = GrpcStatus::from_header_map(headers) {
            return Some(Self::TrailersOnly(status));
        }
        (status == StatusCode::OK && is_grpc(headers)).then_some(Self::StatusInTrailers)
    }
}

/// Classifies gRPC responses by their status (gRFC A6), and any other response by its HTTP
/// status.
///
/// | response | classification | delay |
/// |----------|----------------|-------|
/// | `grpc-status` in the headers (trailers-only) | by [`GrpcStatus::classification`] (the code's, but UNAVAILABLE with a pushback delay is throttling) | `grpc-retry-pushback-ms` (see [`Pushback::server_delay`]) |
/// | a gRPC 200 whose status comes in the trailers | success, as far as the head goes (see [`TrailersLayer`]) | none |
/// | anything else (a proxy's 429 or 503) | by the HTTP classifier, [`StatusClassifier`] by default | `Retry-After` |
///
/// ```
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tower_allowance::{classify::{Classification, Classify, ServerDelay}, grpc::GrpcClassifier};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("grpc-status", HeaderValue::from_static("8"));
/// headers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("-1"));
/// let classified = GrpcClassifier::new().classify_response(StatusCode::OK, &headers);
/// assert_eq!(classified.class, Classification::Throttled);
/// assert_eq!(classified.delay, Some(ServerDelay::DoNotRetry));
/// ```
///
/// # Clone
///
/// `Copy`: no state of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrpcClassifier {
    http: StatusClassifier,
}

// === impl GrpcClassifier ===

impl GrpcClassifier {
    /// gRPC statuses, and the default HTTP classifier for responses without one.
    pub fn new() -> Self {
        Self::default()
    }

    /// Classifies responses that carry no gRPC status (an HTTP-level answer from a proxy or
    /// a load balancer) with `http` instead of the default [`StatusClassifier`].
    pub fn with_http(self, http: StatusClassifier) -> Self {
        Self { http }
    }
}

impl Classify for GrpcClassifier {
    fn classify(&self, status: StatusCode, headers: &HeaderMap) -> Classification {
        self.classify_response(status, headers).class
    }

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Classified {
        match GrpcResponse::from_head(status, headers) {
            Some(GrpcResponse::TrailersOnly(status)) => {
                let class = status.classification();
                let delay = match class {
                    Classification::Throttled | Classification::Transient => {
                        status.pushback().map(Pushback::server_delay)
                    }
                    _ => None,
                };
                Classified::new(class, delay)
            }
            Some(GrpcResponse::StatusInTrailers) => Classified::new(Classification::Success, None),
            None => self.http.classify_response(status, headers),
        }
    }
}

/// What runs when a [`WatchTrailers`] body's trailers pass: any `FnOnce(&HeaderMap)`, or a
/// named type such as [`FeedAllowance`] (so that a service's response type can be named).
pub trait OnTrailers {
    /// Called once, with the trailers, just before they are passed on.
    fn on_trailers(self, trailers: &HeaderMap);
}

impl<F: FnOnce(&HeaderMap)> OnTrailers for F {
    fn on_trailers(self, trailers: &HeaderMap) {
        self(trailers)
    }
}

/// Feeds the allowance from a gRPC status in trailers: a RESOURCE_EXHAUSTED raises the
/// shared cooldown by its `grpc-retry-pushback-ms` (as a throttling response's delay does
/// in the [`CooldownLayer`](crate::cooldown::CooldownLayer)); any other status changes
/// nothing.
#[derive(Clone, Debug)]
pub struct FeedAllowance {
    allowance: Allowance,
}

impl FeedAllowance {
    /// Feeds `allowance`.
    pub fn new(allowance: Allowance) -> Self {
        Self { allowance }
    }
}

impl OnTrailers for FeedAllowance {
    fn on_trailers(self, trailers: &HeaderMap) {
        let Some(status) = GrpcStatus::from_header_map(trailers) else {
            return;
        };
        if status.classification() != Classification::Throttled {
            return;
        }
        match status.pushback().map(Pushback::server_delay) {
            Some(ServerDelay::After(d)) => {
                self.allowance.on_throttled(true);
                let max = self.allowance.config().max_cooldown();
                raise_detached(
                    &self.allowance,
                    rule::micros_ceil(d),
                    (d > max).then(|| format!("{d:?}")),
                );
            }
            // Beyond what can be represented: the allowance closes rather than wait less.
            Some(ServerDelay::TooLong) => {
                let asked = trailers
                    .get(GRPC_RETRY_PUSHBACK_MS)
                    .and_then(|v| v.to_str().ok());
                raise_detached(&self.allowance, None, asked.map(str::to_owned));
            }
            // No delay, or "do not retry": no cooldown is invented.
            _ => self.allowance.on_throttled(false),
        }
    }
}

/// Reads the gRPC status in each response's trailers as they pass, and feeds it to the
/// allowance ([`FeedAllowance`]). Responses keep streaming as they come.
///
/// # Clone
///
/// Cloning this layer does not create a new allowance: every service it builds feeds the
/// same one.
#[derive(Clone, Debug)]
pub struct TrailersLayer {
    allowance: Allowance,
}

impl TrailersLayer {
    /// Feeds `allowance` from trailers.
    pub fn new(allowance: Allowance) -> Self {
        Self { allowance }
    }
}

impl<S> Layer<S> for TrailersLayer {
    type Service = Trailers<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Trailers {
            inner,
            allowance: self.allowance.clone(),
        }
    }
}

/// The service of [`TrailersLayer`]: each response body is a [`WatchTrailers`] that feeds
/// the allowance from a gRPC response's trailers.
///
/// # Clone
///
/// Clones share the allowance; only `S` is cloned.
#[derive(Clone, Debug)]
pub struct Trailers<S> {
    inner: S,
    allowance: Allowance,
}

impl<S> Trailers<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, RB> Service<Request<B>> for Trailers<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<WatchTrailers<RB, FeedAllowance>>;
    type Error = S::Error;
    type Future = TrailersFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    /// Sends the attempt; a call with a `grpc-timeout` (read by [`GrpcLayer`]) says the time
    /// left before its deadline, now that it is sent.
    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(GrpcDeadline(at)) = req.extensions().get::<GrpcDeadline>() {
            let left = at.saturating_duration_since(Instant::now());
            req.headers_mut().insert(GRPC_TIMEOUT, format_timeout(left));
        }
        TrailersFuture {
            inner: self.inner.call(req),
            allowance: Some(self.allowance.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`Trailers`].
    pub struct TrailersFuture<F> {
        #[pin]
        inner: F,
        allowance: Option<Allowance>,
    }
}

impl<F> fmt::Debug for TrailersFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrailersFuture").finish_non_exhaustive()
    }
}

impl<F, RB, E> Future for TrailersFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<WatchTrailers<RB, FeedAllowance>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let allowance = this
            .allowance
            .take()
            .expect("TrailersFuture polled after completion");
        // Only a call whose status is still to come has trailers worth reading: a
        // trailers-only answer was classified from its headers already.
        let watch = GrpcResponse::from_head(response.status(), response.headers())
            == Some(GrpcResponse::StatusInTrailers);
        Poll::Ready(Ok(response.map(|inner| WatchTrailers {
            inner: Some(inner),
            on_trailers: watch.then(|| FeedAllowance::new(allowance)),
        })))
    }
}

/// The whole allowance stack for gRPC: a [`GrpcCall`] (deadlines in, outcomes out) over
/// [`AllowanceLayer`] with a [`GrpcClassifier`], over a [`TrailersLayer`] feeding the same
/// allowance. For a tonic `Channel`.
///
/// gRPC calls are POSTs: a call is retried only if its method is listed in the
/// [`RetryConfig`] (`with_replayable_methods([Method::POST])` when every call is
/// idempotent) or it carries `Idempotency-Key`; otherwise a RESOURCE_EXHAUSTED is returned
/// as is, marked abandoned ([`AbandonReason::NotReplayable`]).
/// The [module docs](self#deadlines-and-what-a-tonic-caller-sees) say what a call's
/// `grpc-timeout` does and what a tonic caller is told.
///
/// # Clone
///
/// Cloning this layer does not create a new bucket, cooldown or budget.
#[derive(Clone, Debug)]
pub struct GrpcLayer {
    allowance: AllowanceLayer<GrpcClassifier>,
    trailers: TrailersLayer,
}

impl GrpcLayer {
    /// The gRPC stack over `allowance`, retrying by the allowance's retry rules and
    /// classifying answers without a gRPC status by the allowance's classifier.
    pub fn new(allowance: Allowance) -> Self {
        let http = allowance.config().classifier();
        Self {
            trailers: TrailersLayer::new(allowance.clone()),
            allowance: allowance
                .layer()
                .with_classifier(GrpcClassifier::new().with_http(http)),
        }
    }

    /// Retries by `retry` instead of the allowance's retry rules (this layer alone).
    pub fn with_retry(mut self, retry: RetryConfig) -> Self {
        self.allowance = self.allowance.with_retry(retry);
        self
    }
}

impl<S> Layer<S> for GrpcLayer {
    type Service = GrpcCall<
        Prepare<
            Retry<RetryPolicy<GrpcClassifier>, Cooldown<Admission<Trailers<S>>, GrpcClassifier>>,
        >,
    >;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcCall {
            inner: self.allowance.layer(self.trailers.layer(inner)),
        }
    }
}

/// The call's deadline from its `grpc-timeout`, carried by every attempt, so that the
/// attempt says the time left when it is sent ([`Trailers`]).
#[derive(Clone, Copy, Debug)]
struct GrpcDeadline(Instant);

/// The outermost service of [`GrpcLayer`]: a call's `grpc-timeout` becomes its
/// [`Deadline`] across every attempt, an abandoned answer says why in
/// `x-allowance-abandoned`, and the stack's own refusals become trailers-only gRPC
/// answers (see the [module docs](self#deadlines-and-what-a-tonic-caller-sees)).
///
/// ```
/// use http::{Request, Response};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_allowance::{grpc::GrpcLayer, retry::RetryConfig, Allowance, AllowanceConfig, BoxError};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let allowance = Allowance::new(AllowanceConfig::per_second(1, 1)?);
/// let channel = tower::service_fn(|_req: Request<String>| async {
///     Ok::<_, BoxError>(Response::builder().header("grpc-status", "0").body(String::new())?)
/// });
/// let client = ServiceBuilder::new()
///     .layer(GrpcLayer::new(allowance))
///     .service(channel);
/// client.clone().oneshot(Request::post("/pkg.Svc/Get").body(String::new())?).await?;
///
/// // The next slot is a second away: a call with 300 ms left is refused at once.
/// let call = Request::post("/pkg.Svc/Get").header("grpc-timeout", "300m").body(String::new())?;
/// let answer = client.oneshot(call).await?;
/// assert_eq!(answer.headers()["grpc-status"], "4"); // DEADLINE_EXCEEDED
/// assert_eq!(answer.headers()["x-allowance-abandoned"], "deadline");
/// # Ok(())
/// # }
/// ```
///
/// # Clone
///
/// Only `S` is cloned.
#[derive(Clone, Debug)]
pub struct GrpcCall<S> {
    inner: S,
}

impl<S> GrpcCall<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, RB> Service<Request<B>> for GrpcCall<S>
where
    S: Service<Request<B>, Response = Response<WatchTrailers<RB, FeedAllowance>>, Error = BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = GrpcCallFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(timeout) = req.headers().get(GRPC_TIMEOUT).and_then(parse_timeout) {
            let Deadline(at) = Deadline::after(timeout);
            let extensions = req.extensions_mut();
            extensions.insert(GrpcDeadline(at));
            let earliest = extensions.get::<Deadline>().map_or(at, |d| d.0.min(at));
            extensions.insert(Deadline(earliest));
        }
        GrpcCallFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`GrpcCall`].
    pub struct GrpcCallFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F> fmt::Debug for GrpcCallFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcCallFuture").finish_non_exhaustive()
    }
}

impl<F, RB> Future for GrpcCallFuture<F>
where
    F: Future<Output = Result<Response<WatchTrailers<RB, FeedAllowance>>, BoxError>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.project().inner.poll(cx)) {
            Ok(mut response) => {
                if let Some(abandoned) = response.extensions().get::<Abandoned>() {
                    let reason = HeaderValue::from_static(abandoned.reason().as_str());
                    response.headers_mut().insert(X_ALLOWANCE_ABANDONED, reason);
                }
                Ok(response)
            }
            Err(e) => match refusal(&*e) {
                Some(refusal) => Ok(refusal.into_response(&*e)),
                None => Err(e),
            },
        })
    }
}

/// What the stack answers a tonic caller for one of its own refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Refusal {
    code: Code,
    /// `grpc-retry-pushback-ms`: milliseconds, or `-1` for "do not retry".
    pushback: Option<i64>,
    /// `None` for a store failure: nothing was given up on, the store could not decide.
    reason: Option<AbandonReason>,
}

/// The gRPC status for the stack's own errors; `None` for any other (a transport error is
/// tonic's to map).
fn refusal(e: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    // Milliseconds, rounded up (never early); `None`: -1, do not retry.
    let ms = |left: Option<Duration>| {
        left.map_or(-1, |d| {
            i64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
        })
    };
    let (code, pushback, reason) = if let Some(x) = find::<Exhausted>(e) {
        let left = x
            .until()
            .map(|at| at.saturating_duration_since(Instant::now()));
        (Code::RESOURCE_EXHAUSTED, Some(ms(left)), Some(x.reason()))
    } else if let Some(o) = find::<Overloaded>(e) {
        let reason = Some(AbandonReason::Overloaded);
        (Code::UNAVAILABLE, Some(ms(Some(o.wait))), reason)
    } else if let Some(a) = find::<Abandoned>(e) {
        match a.reason() {
            AbandonReason::Deadline => (Code::DEADLINE_EXCEEDED, None, Some(a.reason())),
            // Retrying cannot help: the budget is the batch's, the cost never fits.
            reason => (Code::RESOURCE_EXHAUSTED, Some(-1), Some(reason)),
        }
    } else if find::<StoreUnavailable>(e).is_some() {
        (Code::UNAVAILABLE, None, None)
    } else {
        return None;
    };
    Some(Refusal {
        code,
        pushback,
        reason,
    })
}

impl Refusal {
    /// A trailers-only answer: HTTP 200, `content-type: application/grpc`, the status in
    /// the headers, an empty body.
    fn into_response<RB, F>(
        self,
        e: &(dyn std::error::Error + 'static),
    ) -> Response<WatchTrailers<RB, F>> {
        let mut response = Response::new(WatchTrailers::empty());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(GRPC_STATUS, HeaderValue::from(self.code.get()));
        if let Ok(message) = HeaderValue::try_from(percent_encode(&e.to_string())) {
            headers.insert(GRPC_MESSAGE, message);
        }
        if let Some(ms) = self.pushback {
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
        }
        if let Some(reason) = self.reason {
            let reason = HeaderValue::from_static(reason.as_str());
            headers.insert(X_ALLOWANCE_ABANDONED, reason);
        }
        // For `Outcome::of`: abandoned with its reason, or (a store failure) not a success.
        let extensions = response.extensions_mut();
        extensions.insert(Classified::new(self.code.classification(), None));
        if let Some(reason) = self.reason {
            extensions.insert(Abandoned::new(reason));
        }
        response
    }
}

/// `grpc-message`: percent-encoded outside printable ASCII, and `%` itself (gRPC over HTTP/2).
fn percent_encode(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Reads `grpc-timeout`: 1 to 8 ASCII digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`);
/// `None` for anything else (then the call has no deadline from it, and the header is
/// passed on unchanged).
fn parse_timeout(value: &HeaderValue) -> Option<Duration> {
    let (unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `grpc-timeout` for `left`: the most precise unit whose value fits in 8 digits, rounded
/// down (the server gives up no later than the caller), as tonic and grpc-go write it.
fn format_timeout(left: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    let nanos = left.as_nanos();
    let (value, unit) = units
        .iter()
        .map(|(per, unit)| (nanos / per, *unit))
        .find(|(value, _)| *value <= MAX)
        .unwrap_or((MAX, 'H'));
    HeaderValue::try_from(format!("{value}{unit}")).unwrap_or(HeaderValue::from_static("0n"))
}

/// The field's only value: `None` when absent, `Some(None)` when sent more than once.
fn single<'a>(map: &'a HeaderMap, name: &str) -> Option<Option<&'a HeaderValue>> {
    let mut values = map.get_all(name).iter();
    let first = values.next()?;
    Some(values.next().is_none().then_some(first))
}

/// Whether `content-type` is `application/grpc`, alone or followed by `+` or `;`.
fn is_grpc(headers: &HeaderMap) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    headers.get(CONTENT_TYPE).is_some_and(|value| {
        let value = value.as_bytes();
        value.len() >= GRPC.len()
            && value[..GRPC.len()].eq_ignore_ascii_case(GRPC)
            && matches!(value.get(GRPC.len()), None | Some(b'+' | b';'))
    })
}

pin_project_lite::pin_project! {
    /// A response body that shows its trailers to `F` as they pass, once.
    ///
    /// Frames are forwarded unchanged and at once: nothing is consumed, copied or
    /// delayed, and `F` sees the trailers (by reference) just before the caller does.
    /// A body that ends without trailers never calls `F`.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use bytes::Bytes;
    /// use http::{HeaderMap, HeaderValue};
    /// use http_body_util::{BodyExt, Full};
    /// use tower_allowance::grpc::{Code, GrpcStatus, WatchTrailers};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// let mut trailers = HeaderMap::new();
    /// trailers.insert("grpc-status", HeaderValue::from_static("8"));
    /// let body = Full::new(Bytes::from_static(b"\0\0\0\0\0")).with_trailers(async { Some(Ok(trailers)) });
    ///
    /// let seen = Arc::new(Mutex::new(None));
    /// let slot = Arc::clone(&seen);
    /// let body = WatchTrailers::new(body, move |trailers: &HeaderMap| {
    ///     *slot.lock().unwrap_or_else(|e| e.into_inner()) = GrpcStatus::from_header_map(trailers);
    /// });
    /// let collected = body.collect().await?;
    /// assert!(collected.trailers().is_some(), "the trailers still reach the caller");
    /// let status = seen.lock().unwrap_or_else(|e| e.into_inner()).map(|s| s.code());
    /// assert_eq!(status, Some(Code::RESOURCE_EXHAUSTED));
    /// # Ok(())
    /// # }
    /// ```
    pub struct WatchTrailers<B, F> {
        // `None`: the stack's own trailers-only answer, an empty body.
        #[pin]
        inner: Option<B>,
        on_trailers: Option<F>,
    }
}

// === impl WatchTrailers ===

impl<B, F> WatchTrailers<B, F> {
    /// Wraps `body`; `on_trailers` runs when its trailers pass, if they do.
    pub fn new(body: B, on_trailers: F) -> Self {
        Self {
            inner: Some(body),
            on_trailers: Some(on_trailers),
        }
    }

    /// An empty body, with nothing to watch: the body of the trailers-only answers
    /// [`GrpcLayer`] makes of the stack's own refusals.
    pub fn empty() -> Self {
        Self {
            inner: None,
            on_trailers: None,
        }
    }

    /// The wrapped body; `None` for an [`empty`](Self::empty) one.
    pub fn get_ref(&self) -> Option<&B> {
        self.inner.as_ref()
    }

    /// The wrapped body, mutably.
    pub fn get_mut(&mut self) -> Option<&mut B> {
        self.inner.as_mut()
    }

    /// The wrapped body, unwrapped (`F` is dropped without being called).
    pub fn into_inner(self) -> Option<B> {
        self.inner
    }
}

impl<B: fmt::Debug, F> fmt::Debug for WatchTrailers<B, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchTrailers")
            .field("inner", &self.inner)
            .field("watching", &self.on_trailers.is_some())
            .finish()
    }
}

impl<B, F> Body for WatchTrailers<B, F>
where
    B: Body,
    F: OnTrailers,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(None);
        };
        let polled = inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(trailers) = frame.trailers_ref() {
                if let Some(on_trailers) = this.on_trailers.take() {
                    on_trailers.on_trailers(trailers);
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(B::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), B::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        cell::Cell,
        task::{Context, Waker},
    };

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};
    use proptest::prelude::*;

    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    fn status(code: Code, pushback: Option<Pushback>) -> GrpcStatus {
        GrpcStatus { code, pushback }
    }

    fn ms(ms: u64) -> Option<Pushback> {
        Some(Pushback::Delay(Duration::from_millis(ms)))
    }

    /// Response heads as servers and proxies send them.
    #[test]
    fn fixtures_of_real_responses() {
        use GrpcResponse::*;
        let grpc = ("content-type", "application/grpc");
        let cases: &[(&str, StatusCode, HeaderMap, Option<GrpcResponse>)] = &[
            (
                "trailers-only RESOURCE_EXHAUSTED with pushback (a throttling server)",
                StatusCode::OK,
                map(&[
                    grpc,
                    ("grpc-status", "8"),
                    ("grpc-message", "quota exceeded for key"),
                    ("grpc-retry-pushback-ms", "1500"),
                ]),
                Some(TrailersOnly(status(Code::RESOURCE_EXHAUSTED, ms(1500)))),
            ),
            (
                "trailers-only UNAVAILABLE (an envoy with no healthy upstream)",
                StatusCode::OK,
                map(&[
                    grpc,
                    ("grpc-status", "14"),
                    ("grpc-message", "no healthy upstream"),
                ]),
                Some(TrailersOnly(status(Code::UNAVAILABLE, None))),
            ),
            (
                "a streaming OK: status in the trailers",
                StatusCode::OK,
                map(&[
                    ("content-type", "application/grpc+proto"),
                    ("grpc-encoding", "identity"),
                ]),
                Some(StatusInTrailers),
            ),
            (
                "content-type with parameters, any case",
                StatusCode::OK,
                map(&[("content-type", "Application/GRPC; charset=utf-8")]),
                Some(StatusInTrailers),
            ),
            (
                "pushback negative: do not retry",
                StatusCode::OK,
                map(&[grpc, ("grpc-status", "8"), ("grpc-retry-pushback-ms", "-1")]),
                Some(TrailersOnly(status(
                    Code::RESOURCE_EXHAUSTED,
                    Some(Pushback::DoNotRetry),
                ))),
            ),
            (
                "pushback malformed: do not retry",
                StatusCode::OK,
                map(&[
                    grpc,
                    ("grpc-status", "8"),
                    ("grpc-retry-pushback-ms", "1.5s"),
                ]),
                Some(TrailersOnly(status(
                    Code::RESOURCE_EXHAUSTED,
                    Some(Pushback::DoNotRetry),
                ))),
            ),
            (
                "pushback twice, even equal: do not retry (grpc-go)",
                StatusCode::OK,
                map(&[
                    grpc,
                    ("grpc-status", "8"),
                    ("grpc-retry-pushback-ms", "100"),
                    ("grpc-retry-pushback-ms", "100"),
                ]),
                Some(TrailersOnly(status(
                    Code::RESOURCE_EXHAUSTED,
                    Some(Pushback::DoNotRetry),
                ))),
            ),
            (
                "grpc-status malformed: UNKNOWN, a final failure",
                StatusCode::OK,
                map(&[grpc, ("grpc-status", "eight")]),
                Some(TrailersOnly(status(Code::UNKNOWN, None))),
            ),
            (
                "grpc-status twice: malformed",
                StatusCode::OK,
                map(&[grpc, ("grpc-status", "0"), ("grpc-status", "8")]),
                Some(TrailersOnly(status(Code::UNKNOWN, None))),
            ),
            (
                "grpc-status wins over the HTTP status",
                StatusCode::SERVICE_UNAVAILABLE,
                map(&[grpc, ("grpc-status", "8")]),
                Some(TrailersOnly(status(Code::RESOURCE_EXHAUSTED, None))),
            ),
            (
                "a non-gRPC 429: left to the HTTP status classifier",
                StatusCode::TOO_MANY_REQUESTS,
                map(&[("content-type", "application/json"), ("retry-after", "1")]),
                None,
            ),
            (
                "a proxy's 429 on a gRPC call, no grpc-status: the HTTP classifier's too",
                StatusCode::TOO_MANY_REQUESTS,
                map(&[grpc]),
                None,
            ),
            (
                "grpc-web is not gRPC over HTTP/2: its trailers are in the body",
                StatusCode::OK,
                map(&[("content-type", "application/grpc-web+proto")]),
                None,
            ),
            ("no headers at all", StatusCode::OK, HeaderMap::new(), None),
        ];
        for (name, http_status, headers, expected) in cases {
            assert_eq!(
                GrpcResponse::from_head(*http_status, headers),
                *expected,
                "{name}"
            );
        }
    }

    #[test]
    fn classification_of_every_code() {
        for code in 0..=20 {
            let expected = match code {
                0 => Classification::Success,
                8 => Classification::Throttled,
                14 => Classification::Transient,
                _ => Classification::Failure,
            };
            assert_eq!(Code::new(code).classification(), expected, "{code}");
        }
        assert_eq!(
            status(Code::RESOURCE_EXHAUSTED, Some(Pushback::DoNotRetry)).classification(),
            Classification::Throttled
        );
        assert_eq!(Code::RESOURCE_EXHAUSTED.to_string(), "RESOURCE_EXHAUSTED");
        assert_eq!(format!("{:?}", Code::OK), "Code::OK");
        assert_eq!(Code::new(17).to_string(), "code 17");
        assert_eq!(Code::new(u32::MAX).name(), None);
    }

    #[test]
    fn parsing_rules_at_the_edges() {
        for (value, expected) in [
            ("0", ms(0)),
            ("+5", ms(5)),
            ("-0", ms(0)),
            ("9223372036854775807", ms(i64::MAX as u64)),
            ("9223372036854775808", Some(Pushback::DoNotRetry)),
            ("", Some(Pushback::DoNotRetry)),
            (" 5", Some(Pushback::DoNotRetry)),
            ("5ms", Some(Pushback::DoNotRetry)),
        ] {
            let trailers = map(&[("grpc-retry-pushback-ms", value)]);
            assert_eq!(Pushback::from_header_map(&trailers), expected, "{value:?}");
        }
        for (value, expected) in [
            (&b"0"[..], Some(Code::OK)),
            (b"08", Some(Code::RESOURCE_EXHAUSTED)),
            (b"4294967295", Some(Code::new(u32::MAX))),
            (b"4294967296", None),
            (b"-1", None),
            (b"1 ", None),
            (b"\xff", None),
        ] {
            assert_eq!(Code::from_bytes(value), expected, "{value:?}");
        }
        // Trailers of a streamed call: status and pushback.
        let trailers = map(&[("grpc-status", "0"), ("grpc-message", "")]);
        assert_eq!(
            GrpcStatus::from_header_map(&trailers),
            Some(status(Code::OK, None))
        );
        assert_eq!(GrpcStatus::from_header_map(&HeaderMap::new()), None);
    }

    // === WatchTrailers ===

    type Item = Result<Frame<Bytes>, std::convert::Infallible>;

    fn stream(
        items: Vec<Item>,
    ) -> StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Item>>> {
        StreamBody::new(futures_util::stream::iter(items))
    }

    /// Every frame, polled with a no-op waker (the test bodies are always ready).
    fn frames<B: Body + Unpin>(mut body: B) -> Vec<Frame<B::Data>>
    where
        B::Error: fmt::Debug,
    {
        let mut frames = Vec::new();
        let mut cx = Context::from_waker(Waker::noop());
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            frames.push(frame.expect("infallible"));
        }
        frames
    }

    #[test]
    fn watch_trailers_sees_trailers_once_and_forwards_every_frame_unchanged() {
        let trailers = map(&[("grpc-status", "8"), ("grpc-retry-pushback-ms", "200")]);
        let calls = Cell::new(0);
        let seen = Cell::new(None);
        let body = stream(vec![
            Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\x02hi"))),
            Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\0"))),
            Ok(Frame::trailers(trailers.clone())),
        ]);
        let watched = WatchTrailers::new(body, |t: &HeaderMap| {
            calls.set(calls.get() + 1);
            seen.set(GrpcStatus::from_header_map(t));
        });
        let frames = frames(watched);
        assert_eq!(frames.len(), 3);
        assert_eq!(
            frames[0].data_ref().map(|d| &d[..]),
            Some(&b"\0\0\0\0\x02hi"[..])
        );
        assert_eq!(
            frames[1].data_ref().map(|d| &d[..]),
            Some(&b"\0\0\0\0\0"[..])
        );
        assert_eq!(frames[2].trailers_ref(), Some(&trailers));
        assert_eq!(calls.get(), 1);
        assert_eq!(seen.get(), Some(status(Code::RESOURCE_EXHAUSTED, ms(200))));
    }

    #[test]
    fn watch_trailers_without_trailers_never_calls_and_keeps_hints() {
        let called = Cell::new(false);
        let watched =
            WatchTrailers::new(Full::new(Bytes::from_static(b"plain")), |_: &HeaderMap| {
                called.set(true)
            });
        assert_eq!(watched.size_hint().exact(), Some(5));
        assert!(!watched.is_end_stream());
        assert_eq!(
            watched.get_ref().map(|b| b.size_hint().exact()),
            Some(Some(5))
        );
        let frames = frames(watched);
        assert_eq!(frames.len(), 1);
        assert!(!called.get());
    }

    #[tokio::test]
    async fn watch_trailers_collects_like_the_inner_body() -> Result<(), std::convert::Infallible> {
        let trailers = map(&[("grpc-status", "0")]);
        let body = Full::new(Bytes::from_static(b"ok")).with_trailers({
            let trailers = trailers.clone();
            async move { Some(Ok(trailers)) }
        });
        let seen = Cell::new(None);
        let collected = WatchTrailers::new(body, |t: &HeaderMap| {
            seen.set(GrpcStatus::from_header_map(t))
        })
        .collect()
        .await?;
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), "ok");
        assert_eq!(seen.get().map(|s| s.code()), Some(Code::OK));
        Ok(())
    }

    // === GrpcClassifier ===

    #[test]
    fn the_classifier_reads_grpc_statuses_and_leaves_the_rest_to_http() {
        use crate::classify::{Classify, ServerDelay};
        let grpc = ("content-type", "application/grpc");
        let c = GrpcClassifier::new();
        let cases: &[(
            &str,
            StatusCode,
            HeaderMap,
            Classification,
            Option<ServerDelay>,
        )] = &[
            (
                "RESOURCE_EXHAUSTED with pushback",
                StatusCode::OK,
                map(&[
                    grpc,
                    ("grpc-status", "8"),
                    ("grpc-retry-pushback-ms", "1500"),
                ]),
                Classification::Throttled,
                Some(ServerDelay::After(Duration::from_millis(1500))),
            ),
            (
                "RESOURCE_EXHAUSTED, negative pushback: do not retry",
                StatusCode::OK,
                map(&[grpc, ("grpc-status", "8"), ("grpc-retry-pushback-ms", "-5")]),
                Classification::Throttled,
                Some(ServerDelay::DoNotRetry),
            ),
            (
                "RESOURCE_EXHAUSTED, pushback beyond MAX_DELAY",
                StatusCode::OK,
                map(&[
                    grpc,
                    ("grpc-status", "8"),
                    ("grpc-retry-pushback-ms", "9223372036854775807"),
                ]),
                Classification::Throttled,
                Some(ServerDelay::TooLong),
            ),
            (
                "UNAVAILABLE with a pushback: throttling, the wait is shared",
                StatusCode::OK,
                map(&[
                    grpc,
                    ("grpc-status", "14"),
                    ("grpc-retry-pushback-ms", "250"),
                ]),
                Classification::Throttled,
                Some(ServerDelay::After(Duration::from_millis(250))),
            ),
            (
                "UNAVAILABLE: transient",
                StatusCode::OK,
                map(&[grpc, ("grpc-status", "14")]),
                Classification::Transient,
                None,
            ),
            (
                "INVALID_ARGUMENT with a pushback: final, the pushback is not read",
                StatusCode::OK,
                map(&[grpc, ("grpc-status", "3"), ("grpc-retry-pushback-ms", "10")]),
                Classification::Failure,
                None,
            ),
            (
                "OK in the headers",
                StatusCode::OK,
                map(&[grpc, ("grpc-status", "0")]),
                Classification::Success,
                None,
            ),
            (
                "status in the trailers: the head is fine",
                StatusCode::OK,
                map(&[grpc]),
                Classification::Success,
                None,
            ),
            (
                "a proxy's 429 with Retry-After: the wait is the dialect's to read, in the stack",
                StatusCode::TOO_MANY_REQUESTS,
                map(&[grpc, ("retry-after", "2")]),
                Classification::Throttled,
                None,
            ),
            (
                "a proxy's 404",
                StatusCode::NOT_FOUND,
                HeaderMap::new(),
                Classification::Failure,
                None,
            ),
        ];
        for (name, status, headers, class, delay) in cases {
            let classified = c.classify_response(*status, headers);
            assert_eq!(
                (classified.class, classified.delay),
                (*class, *delay),
                "{name}"
            );
            assert_eq!(c.classify(*status, headers), *class, "{name}");
        }
    }

    // === in the stack ===

    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    use http::Method;
    use tower::{ServiceBuilder, ServiceExt};

    use crate::{AllowanceConfig, BoxError, Outcome};

    fn grpc_allowance() -> Allowance {
        Allowance::new(AllowanceConfig::per_second(10, 10).expect("valid"))
    }

    fn retry_posts() -> RetryConfig {
        RetryConfig::default().with_replayable_methods([Method::POST])
    }

    fn call() -> Request<String> {
        let mut req = Request::new(String::new());
        *req.method_mut() = Method::POST;
        req
    }

    /// A channel answering `first` (trailers-only headers) to the first call, then OK.
    fn channel(
        first: &'static [(&'static str, &'static str)],
        calls: Arc<AtomicUsize>,
    ) -> impl tower_service::Service<
        Request<String>,
        Response = Response<String>,
        Error = BoxError,
        Future = impl Send,
    > + Clone {
        tower::service_fn(move |_req: Request<String>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut res = Response::new(String::new());
                res.headers_mut()
                    .insert("content-type", HeaderValue::from_static("application/grpc"));
                let fields: &[(&str, &str)] = if n == 0 {
                    first
                } else {
                    &[("grpc-status", "0")]
                };
                for (name, value) in fields {
                    res.headers_mut()
                        .append(*name, HeaderValue::from_static(value));
                }
                Ok::<_, BoxError>(res)
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn resource_exhausted_is_retried_after_its_pushback_and_cools_everyone() {
        let allowance = grpc_allowance();
        let calls = Arc::new(AtomicUsize::new(0));
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
            .service(channel(
                &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "1500")],
                calls.clone(),
            ));
        let start = tokio::time::Instant::now();
        let result = stack.oneshot(call()).await;
        assert_eq!(Outcome::of(&result), Outcome::Completed);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(
            start.elapsed() >= Duration::from_millis(1500),
            "{:?}",
            start.elapsed()
        );
        let snapshot = allowance.snapshot();
        assert_eq!((snapshot.deferred, snapshot.retries_spent), (1, 1));
    }

    /// gRPC retries draw on the allowance's shared budget like HTTP's: four calls against a
    /// channel that always answers RESOURCE_EXHAUSTED, with a budget of two retries for the
    /// whole allowance, make exactly six attempts (the first call spends both retries and
    /// ends at its cap of three; the others are refused a retry), and none ends as a success.
    #[tokio::test(start_paused = true)]
    async fn grpc_retries_draw_on_the_shared_budget() {
        let allowance = Allowance::new(
            AllowanceConfig::per_second(10, 10)
                .expect("valid")
                .with_retry_budget(crate::RetryBudgetConfig::fixed(2)),
        );
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let always_exhausted = tower::service_fn(move |_req: Request<String>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut res = Response::new(String::new());
                let h = res.headers_mut();
                h.insert("content-type", HeaderValue::from_static("application/grpc"));
                h.insert("grpc-status", HeaderValue::from_static("8"));
                h.insert("grpc-retry-pushback-ms", HeaderValue::from_static("100"));
                Ok::<_, BoxError>(res)
            }
        });
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
            .service(always_exhausted);
        let first = stack.clone().oneshot(call()).await;
        assert_eq!(
            Outcome::of(&first),
            Outcome::Abandoned(crate::error::AbandonReason::MaxAttempts)
        );
        for _ in 0..3 {
            let result = stack.clone().oneshot(call()).await;
            assert_eq!(
                Outcome::of(&result),
                Outcome::Abandoned(crate::error::AbandonReason::BudgetExhausted)
            );
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            6,
            "four first attempts, two retries"
        );
        assert_eq!(allowance.snapshot().retries_spent, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_negative_pushback_is_not_retried_and_invents_no_cooldown() {
        let allowance = grpc_allowance();
        let calls = Arc::new(AtomicUsize::new(0));
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
            .service(channel(
                &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "-1")],
                calls.clone(),
            ));
        let result = stack.oneshot(call()).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // The server's answer is final: a failure on an HTTP 200, never a success.
        assert_eq!(Outcome::of(&result), Outcome::Unsuccessful(StatusCode::OK));
        let snapshot = allowance.snapshot();
        assert_eq!((snapshot.deferred, snapshot.cooling_for), (0, None));
        assert_eq!(snapshot.abandoned.total(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_post_not_marked_replayable_is_answered_once_and_marked_abandoned() {
        let allowance = grpc_allowance();
        let calls = Arc::new(AtomicUsize::new(0));
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()))
            .service(channel(
                &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "700")],
                calls.clone(),
            ));
        let result = stack.oneshot(call()).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            Outcome::of(&result),
            Outcome::Abandoned(crate::error::AbandonReason::NotReplayable)
        );
        // Still fed to the shared cooldown.
        assert_eq!(
            allowance.store_state().await.expect("memory").blocked_for,
            Duration::from_millis(700)
        );
    }

    /// A streamed call whose RESOURCE_EXHAUSTED comes in the trailers, after a message.
    fn streamed_call(
        status: &'static str,
    ) -> impl tower_service::Service<
        Request<String>,
        Response = Response<StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Item>>>>,
        Error = BoxError,
        Future = impl Send,
    > + Clone {
        tower::service_fn(move |_req: Request<String>| async move {
            let trailers = map(&[("grpc-status", status), ("grpc-retry-pushback-ms", "3000")]);
            let mut res = Response::new(stream(vec![
                Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\x02hi"))),
                Ok(Frame::trailers(trailers)),
            ]));
            res.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/grpc"));
            Ok::<_, BoxError>(res)
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_in_the_trailers_feeds_the_cooldown_as_it_passes() -> Result<(), BoxError> {
        let allowance = grpc_allowance();
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
            .service(streamed_call("8"));
        let response = stack.oneshot(call()).await?;
        // The head is handed on at once; nothing is known yet.
        assert_eq!(allowance.store_state().await?.blocked_for, Duration::ZERO);
        let collected = response.into_body().collect().await?;
        // Every frame reached the caller, trailers included...
        assert_eq!(
            collected.trailers().and_then(|t| t.get("grpc-status")),
            Some(&HeaderValue::from_static("8"))
        );
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"\0\0\0\0\x02hi"));
        // ...and the pushback now holds everyone sharing the allowance.
        assert_eq!(
            allowance.store_state().await?.blocked_for,
            Duration::from_secs(3)
        );
        assert_eq!(allowance.snapshot().deferred, 1);

        // An OK in the trailers changes nothing.
        let allowance = grpc_allowance();
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
            .service(streamed_call("0"));
        let response = stack.oneshot(call()).await?;
        response.into_body().collect().await?;
        assert_eq!(allowance.store_state().await?.blocked_for, Duration::ZERO);
        Ok(())
    }

    // === deadlines, outcomes and the stack's own answers ===

    #[test]
    fn grpc_timeout_is_read_and_written_as_grpc_does() {
        let d = Duration::from_millis;
        for (value, expected) in [
            ("1500000u", Some(d(1500))),
            ("300m", Some(d(300))),
            ("1H", Some(Duration::from_secs(3600))),
            ("2M", Some(Duration::from_secs(120))),
            ("3S", Some(Duration::from_secs(3))),
            ("7n", Some(Duration::from_nanos(7))),
            ("99999999m", Some(d(99_999_999))),
            ("123456789m", None),
            ("m", None),
            ("5", None),
            ("-5m", None),
            ("5x", None),
            (" 5m", None),
        ] {
            let value = HeaderValue::from_static(value);
            assert_eq!(parse_timeout(&value), expected, "{value:?}");
        }
        for (left, written) in [
            (Duration::ZERO, "0n"),
            (Duration::from_nanos(99_999_999), "99999999n"),
            (d(100), "100000u"),
            (d(1500), "1500000u"),
            (Duration::from_micros(500_000_999), "500000m"),
            (Duration::from_secs(200_000), "200000S"),
            (Duration::from_secs(86_400 * 365 * 30), "15768000M"),
            (Duration::MAX, "99999999H"),
        ] {
            assert_eq!(format_timeout(left), written, "{left:?}");
            if written != "99999999H" {
                let back = parse_timeout(&format_timeout(left)).expect("valid");
                assert!(back <= left, "{left:?}: rounded down");
            }
        }
    }

    /// A channel that records each attempt's `grpc-timeout` and answers `answer(n)` to the
    /// `n`th attempt (trailers-only fields).
    fn recording(
        answer: fn(usize) -> &'static [(&'static str, &'static str)],
        seen: Arc<std::sync::Mutex<Vec<String>>>,
    ) -> impl tower_service::Service<
        Request<String>,
        Response = Response<String>,
        Error = BoxError,
        Future = impl Send,
    > + Clone {
        tower::service_fn(move |req: Request<String>| {
            let timeout = req.headers().get("grpc-timeout");
            let timeout = timeout.and_then(|t| t.to_str().ok()).unwrap_or("none");
            let mut seen = seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            seen.push(timeout.to_owned());
            let fields = answer(seen.len() - 1);
            async move {
                let mut res = Response::new(String::new());
                res.headers_mut()
                    .insert("content-type", HeaderValue::from_static("application/grpc"));
                for (name, value) in fields {
                    res.headers_mut()
                        .append(*name, HeaderValue::from_static(value));
                }
                Ok::<_, BoxError>(res)
            }
        })
    }

    const EXHAUSTED_1S: &[(&str, &str)] =
        &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "1000")];
    const OK: &[(&str, &str)] = &[("grpc-status", "0")];

    fn timed_call(timeout: &'static str) -> Request<String> {
        let mut req = call();
        req.headers_mut()
            .insert("grpc-timeout", HeaderValue::from_static(timeout));
        req
    }

    #[tokio::test(start_paused = true)]
    async fn each_attempt_sends_the_time_left_in_grpc_timeout() -> Result<(), BoxError> {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let first_refused = |n| if n == 0 { EXHAUSTED_1S } else { OK };
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(grpc_allowance()).with_retry(retry_posts()))
            .service(recording(first_refused, seen.clone()));
        let start = tokio::time::Instant::now();
        let result = stack.oneshot(timed_call("1500000u")).await;
        assert_eq!(Outcome::of(&result), Outcome::Completed);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(*seen.lock().expect("not poisoned"), ["1500000u", "500000u"]);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_that_would_pass_the_deadline_ends_the_call_marked() -> Result<(), BoxError> {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let allowance = grpc_allowance();
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
            .service(recording(|_| EXHAUSTED_1S, seen.clone()));
        let start = tokio::time::Instant::now();
        let result = stack.oneshot(timed_call("1500m")).await;
        // Attempts at 0 and 1,000 ms; one at 2,000 ms would pass the deadline: not made.
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        // Each attempt says the time left, the first one too (in the most precise unit).
        assert_eq!(*seen.lock().expect("not poisoned"), ["1500000u", "500000u"]);
        assert_eq!(
            Outcome::of(&result),
            Outcome::Abandoned(AbandonReason::Deadline)
        );
        let answer = result?;
        assert_eq!(
            answer.headers()["grpc-status"],
            "8",
            "the server's own status"
        );
        assert_eq!(answer.headers()[X_ALLOWANCE_ABANDONED], "deadline");
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_deadline_passes_in_the_queue_is_refused_at_once() -> Result<(), BoxError>
    {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let allowance = grpc_allowance();
        allowance.extend_cooldown(Duration::from_secs(3)).await?;
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
            .service(recording(|_| OK, seen.clone()));
        let start = tokio::time::Instant::now();
        let result = stack.oneshot(timed_call("300m")).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(
            seen.lock().expect("not poisoned").is_empty(),
            "nothing sent"
        );
        assert_eq!(
            Outcome::of(&result),
            Outcome::Abandoned(AbandonReason::Deadline)
        );
        let answer = result?;
        let headers = answer.headers();
        assert_eq!(headers["grpc-status"], "4", "DEADLINE_EXCEEDED");
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers[X_ALLOWANCE_ABANDONED], "deadline");
        assert!(headers.get("grpc-retry-pushback-ms").is_none());
        assert!(answer.body().is_end_stream(), "trailers-only");
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_and_a_closure_answer_with_the_wait_left() -> Result<(), BoxError> {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let config = AllowanceConfig::per_second(1, 1)?
            .exact()
            .with_max_waiters(0);
        let allowance = Allowance::new(config.with_max_cooldown(Duration::from_secs(10))?);
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new(allowance.clone()).with_retry(retry_posts()))
            .service(recording(|_| OK, seen.clone()));
        stack.clone().oneshot(call()).await?;
        // The burst is spent and nobody may wait: UNAVAILABLE, come back in a second.
        let full = stack.clone().oneshot(call()).await?;
        let headers = full.headers();
        assert_eq!(headers["grpc-status"], "14");
        assert_eq!(headers["grpc-retry-pushback-ms"], "1000");
        assert_eq!(headers[X_ALLOWANCE_ABANDONED], "overloaded");
        assert_eq!(
            headers["grpc-message"], "allowance wait queue is full",
            "{headers:?}"
        );

        // A wait beyond max_cooldown closes the allowance (for max_cooldown, 10 s):
        // RESOURCE_EXHAUSTED, with the time until it reopens.
        allowance.extend_cooldown(Duration::from_secs(60)).await?;
        tokio::time::advance(Duration::from_millis(250)).await;
        let closed = stack.oneshot(call()).await?;
        let headers = closed.headers();
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(headers["grpc-retry-pushback-ms"], "9750");
        assert_eq!(headers[X_ALLOWANCE_ABANDONED], "cooldown_too_long");
        assert_eq!(seen.lock().expect("not poisoned").len(), 1, "one call sent");
        Ok(())
    }

    #[test]
    fn refusals_map_to_codes_a_client_can_act_on() {
        let store = crate::store::StoreError::unavailable("connection refused");
        let cases: [(BoxError, Code, Option<i64>); 6] = [
            (
                Abandoned::new(AbandonReason::Deadline).into(),
                Code::DEADLINE_EXCEEDED,
                None,
            ),
            (
                Overloaded {
                    wait: Duration::from_micros(1_500),
                }
                .into(),
                Code::UNAVAILABLE,
                Some(2),
            ),
            (StoreUnavailable::new(store).into(), Code::UNAVAILABLE, None),
            (
                Abandoned::new(AbandonReason::BudgetExhausted).into(),
                Code::RESOURCE_EXHAUSTED,
                Some(-1),
            ),
            (
                Exhausted::new(None, crate::rule::ClosedBy::Quota).into(),
                Code::RESOURCE_EXHAUSTED,
                Some(-1),
            ),
            ("a transport error".into(), Code::UNKNOWN, None),
        ];
        for (e, code, pushback) in cases {
            match refusal(&*e) {
                Some(r) => assert_eq!((r.code, r.pushback), (code, pushback), "{e}"),
                None => assert_eq!(code, Code::UNKNOWN, "{e}: left to tonic"),
            }
        }
        let message = percent_encode("100% sure: \u{e9}t\u{e9}\n");
        assert_eq!(message, "100%25 sure: %C3%A9t%C3%A9%0A");
    }

    // === properties ===

    proptest! {
        /// Arbitrary bytes in every field this module reads: never a panic, and the
        /// documented rules hold.
        #[test]
        fn arbitrary_bytes_never_panic(
            status_bytes in prop::collection::vec(any::<u8>(), 0..24),
            pushback_bytes in prop::collection::vec(any::<u8>(), 0..24),
            content_type in prop::collection::vec(any::<u8>(), 0..32),
            http_status in 100u16..=999,
        ) {
            let mut headers = HeaderMap::new();
            for (name, bytes) in [
                (GRPC_STATUS, &status_bytes),
                (GRPC_RETRY_PUSHBACK_MS, &pushback_bytes),
                ("content-type", &content_type),
            ] {
                if let Ok(value) = HeaderValue::from_bytes(bytes) {
                    headers.insert(name, value);
                }
            }
            let http_status = StatusCode::from_u16(http_status).expect("100..=999");
            let head = GrpcResponse::from_head(http_status, &headers);
            if headers.contains_key(GRPC_STATUS) {
                prop_assert!(matches!(head, Some(GrpcResponse::TrailersOnly(_))));
            }
            let _ = Code::from_bytes(&status_bytes);
            if let Some(status) = GrpcStatus::from_header_map(&headers) {
                let _ = status.classification();
                prop_assert_eq!(status.pushback(), Pushback::from_header_map(&headers));
            }
            if let Some(code) = Code::from_bytes(&status_bytes) {
                prop_assert_eq!(code.get().to_string().parse::<u32>().ok(), Some(code.get()));
            }
        }

        /// Every integer pushback: non-negative is a delay, negative is "do not retry".
        #[test]
        fn pushback_integers(ms in any::<i64>()) {
            let value = HeaderValue::from_str(&ms.to_string()).expect("digits");
            let mut trailers = HeaderMap::new();
            trailers.insert(GRPC_RETRY_PUSHBACK_MS, value);
            let expected = u64::try_from(ms)
                .map(|ms| Pushback::Delay(Duration::from_millis(ms)))
                .unwrap_or(Pushback::DoNotRetry);
            prop_assert_eq!(Pushback::from_header_map(&trailers), Some(expected));
        }
    }
}
