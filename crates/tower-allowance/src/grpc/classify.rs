//! [`GrpcClassifier`]: a response classified by its gRPC status, or by its HTTP status when
//! it has none.

use http::{HeaderMap, StatusCode};

use super::status::{GrpcResponse, Pushback};
use crate::classify::{Classification, Classified, Classify, StatusClassifier};

/// Classifies gRPC responses by their status (gRFC A6), and any other response by its HTTP
/// status.
///
/// | response | classification | delay |
/// |----------|----------------|-------|
/// | `grpc-status` in the headers (trailers-only) | by [`GrpcStatus::classification`](super::GrpcStatus::classification) (the code's, but UNAVAILABLE with a pushback delay is throttling) | `grpc-retry-pushback-ms` (see [`Pushback::server_delay`]) |
/// | a gRPC 200 whose status comes in the trailers | success, as far as the head goes (see [`TrailersLayer`](super::TrailersLayer)) | none |
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
