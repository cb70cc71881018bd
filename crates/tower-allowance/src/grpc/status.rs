//! What a response's head or trailers say about a gRPC call: its status
//! ([`GrpcStatus`], [`GrpcResponse`]) and the server's pushback ([`Pushback`]).

use std::time::Duration;

use http::{header::CONTENT_TYPE, HeaderMap, HeaderValue, StatusCode};

use super::{codes::Code, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS};
use crate::{
    classify::{Classification, ServerDelay},
    MAX_DELAY,
};

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
    /// absent. See the [module docs](super) for the parsing rules.
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
    pub(super) code: Code,
    pub(super) pushback: Option<Pushback>,
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
    /// to wait, so the wait is shared (see the [module docs](super#unavailable-and-its-pushback)).
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
    /// them with [`WatchTrailers`](super::WatchTrailers).
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
