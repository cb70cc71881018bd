//! Deciding what a response means: success, throttling, a transient failure, or a failure.
//!
//! Both the [`CooldownLayer`](crate::cooldown::CooldownLayer) (which honours `Retry-After`
//! only on throttling responses) and the [`RetryPolicy`](crate::retry::RetryPolicy) (which
//! retries throttling and transient responses) ask a [`Classify`] implementation.
//!
//! ```
//! use http::{HeaderMap, StatusCode};
//! use tower_allowance::classify::{Classification, Classify, StatusClassifier};
//!
//! let classifier = StatusClassifier::default().transient([502, 504]);
//! let headers = HeaderMap::new();
//! assert_eq!(classifier.classify(StatusCode::TOO_MANY_REQUESTS, &headers), Classification::Throttled);
//! assert_eq!(classifier.classify(StatusCode::BAD_GATEWAY, &headers), Classification::Transient);
//! assert_eq!(classifier.classify(StatusCode::NOT_FOUND, &headers), Classification::Failure);
//! assert_eq!(classifier.classify(StatusCode::OK, &headers), Classification::Success);
//! ```

use http::{HeaderMap, StatusCode};

/// What a response means to the allowance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Classification {
    /// A 2xx/3xx response: done. Deposits into a replenishing retry budget.
    Success,
    /// The provider is throttling: its `Retry-After` becomes the shared cooldown, and the
    /// request is retried.
    Throttled,
    /// A transient failure: retried with backoff (and `Retry-After` if present), but it does
    /// not cool the whole allowance down.
    Transient,
    /// A final failure: returned as is.
    Failure,
}

/// Classifies responses from their status and headers.
///
/// Implement it for provider-specific rules, such as a 503 carrying a header that marks
/// throttling.
pub trait Classify: Clone + Send + Sync + 'static {
    /// Classifies one response.
    fn classify(&self, status: StatusCode, headers: &HeaderMap) -> Classification;
}

/// The default classifier: 429 and 503 are throttling, 2xx and 3xx success, everything
/// else a failure, unless listed as transient.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusClassifier {
    throttled: Vec<StatusCode>,
    transient: Vec<StatusCode>,
}

impl Default for StatusClassifier {
    fn default() -> Self {
        Self {
            throttled: vec![
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE,
            ],
            transient: Vec::new(),
        }
    }
}

impl StatusClassifier {
    /// Replaces the throttling statuses (default 429 and 503). Invalid codes are ignored.
    pub fn throttled(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.throttled = statuses
            .into_iter()
            .filter_map(|s| StatusCode::from_u16(s).ok())
            .collect();
        self
    }

    /// Sets statuses to retry without cooling the allowance down (such as 502, 504).
    /// Invalid codes are ignored.
    pub fn transient(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.transient = statuses
            .into_iter()
            .filter_map(|s| StatusCode::from_u16(s).ok())
            .collect();
        self
    }
}

impl Classify for StatusClassifier {
    fn classify(&self, status: StatusCode, _headers: &HeaderMap) -> Classification {
        if self.throttled.contains(&status) {
            Classification::Throttled
        } else if self.transient.contains(&status) {
            Classification::Transient
        } else if status.is_success() || status.is_redirection() || status.is_informational() {
            Classification::Success
        } else {
            Classification::Failure
        }
    }
}
