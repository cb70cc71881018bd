//! Deciding what a response means: success, throttling, a transient failure, or a failure.
//!
//! Both the [`CooldownLayer`](crate::cooldown::CooldownLayer) (which honours `Retry-After`
//! only on throttling responses) and the [`RetryPolicy`](crate::retry::RetryPolicy) (which
//! retries throttling and transient responses) ask a [`Classify`] implementation: the
//! allowance's [`StatusClassifier`] unless the layer is given another
//! ([`AllowanceConfig::with_classifier`](crate::AllowanceConfig::with_classifier) sets it once
//! for every layer on the allowance).
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

use std::{fmt, time::Duration};

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

/// How the allowance stack read one response, attached to it as an extension by the
/// [`CooldownLayer`](crate::cooldown::CooldownLayer): the response is classified (and its
/// delay parsed) once, and the [`RetryPolicy`](crate::retry::RetryPolicy) and
/// [`Outcome::of`](crate::Outcome::of) read the result instead of classifying again.
///
/// ```
/// use tower_allowance::classify::{Classification, Classified};
///
/// let response = http::Response::new(());
/// assert_eq!(response.extensions().get::<Classified>(), None); // not through the stack
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Classified {
    /// What the response means.
    pub class: Classification,
    /// The wait the server asked for, if it asked.
    pub delay: Option<ServerDelay>,
}

impl Classified {
    /// A classification with the server's delay.
    pub fn new(class: Classification, delay: Option<ServerDelay>) -> Self {
        Self { class, delay }
    }
}

/// A wait a server asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerDelay {
    /// Wait this long (possibly zero).
    After(Duration),
    /// A wait too long to represent: the allowance closes rather than shorten it.
    TooLong,
    /// The server asked not to be retried (gRPC's negative or malformed
    /// `grpc-retry-pushback-ms`, gRFC A6): the response is the answer, and no cooldown is
    /// invented for it.
    DoNotRetry,
}

/// Classifies responses from their status and headers.
///
/// Implement it for provider-specific rules, such as a 503 carrying a header that marks
/// throttling.
pub trait Classify: Clone + Send + Sync + 'static {
    /// Classifies one response.
    fn classify(&self, status: StatusCode, headers: &HeaderMap) -> Classification;

    /// Classifies one response and reads the wait it asks for, once for the whole stack.
    ///
    /// The default calls [`classify`](Self::classify) and reads no wait: the allowance's
    /// dialect reads the waits servers state in headers (`Retry-After`, `retry-after-ms`,
    /// a provider's reset times; see `signals`, feature `dialects`), once, and the longest of
    /// the classifier's and the dialect's wins. Override it when the server states its wait
    /// where no dialect looks, as `grpc::GrpcClassifier` (feature `grpc`) does with
    /// `grpc-retry-pushback-ms`.
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Classified {
        Classified::new(self.classify(status, headers), None)
    }
}

/// The default classifier: 429 and 503 are throttling, 2xx and 3xx success, everything
/// else a failure, unless listed as transient.
///
/// The allowance's dialect may add to it: with `Dialect::github()` (feature `dialects`), the
/// cooldown layer classifies a 403 that this calls a failure as throttling when it carries
/// GitHub's rate-limit signals (see `signals`, "GitHub's 403").
///
/// # Configuration files
///
/// With the `serde` feature it deserializes from the table a file writes; both lists are
/// optional (`throttled` defaults to 429 and 503, `transient` to none), unknown fields are
/// refused, and so are status codes outside 100..=999 and a status listed in both, with an
/// error naming the field:
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use http::{HeaderMap, StatusCode};
/// use tower_allowance::classify::{Classification, Classify, StatusClassifier};
///
/// // In TOML: `classifier = { throttled = [429, 503], transient = [502, 504] }`
/// let classifier: StatusClassifier =
///     serde_json::from_str(r#"{ "throttled": [429, 503], "transient": [502, 504] }"#)?;
/// assert_eq!(classifier, StatusClassifier::default().transient([502, 504]));
/// let headers = HeaderMap::new();
/// assert_eq!(classifier.classify(StatusCode::GATEWAY_TIMEOUT, &headers), Classification::Transient);
///
/// let err = serde_json::from_str::<StatusClassifier>(r#"{ "transient": [502, 5040] }"#)
///     .unwrap_err();
/// assert!(err.to_string().contains("`transient`: status codes must be from 100 to 999"), "{err}");
/// # }
/// # Ok::<(), serde_json::Error>(())
/// ```
///
/// # Clone
///
/// `Copy`: the status lists are bitsets over 100..=999 held inline, so the copies tower
/// makes per request (the retry policy, the cooldown future) never allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "de::RawStatusClassifier"))]
pub struct StatusClassifier {
    throttled: StatusSet,
    transient: StatusSet,
}

impl Default for StatusClassifier {
    fn default() -> Self {
        Self {
            throttled: StatusSet::from_codes([429, 503]),
            transient: StatusSet::EMPTY,
        }
    }
}

impl StatusClassifier {
    /// Replaces the throttling statuses (default 429 and 503). Invalid codes are ignored.
    pub fn throttled(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.throttled = StatusSet::from_codes(statuses);
        self
    }

    /// Sets statuses to retry without cooling the allowance down (such as 502, 504).
    /// Invalid codes are ignored.
    pub fn transient(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.transient = StatusSet::from_codes(statuses);
        self
    }
}

/// A set of status codes: one bit for each valid code, 100..=999.
#[derive(Clone, Copy, PartialEq, Eq)]
struct StatusSet([u64; StatusSet::WORDS]);

impl StatusSet {
    const FIRST: u16 = 100;
    const WORDS: usize = (999 - Self::FIRST as usize) / 64 + 1;
    const EMPTY: Self = Self([0; Self::WORDS]);

    /// The valid codes among `codes` (what `StatusCode::from_u16` accepts).
    fn from_codes(codes: impl IntoIterator<Item = u16>) -> Self {
        let mut set = Self::EMPTY;
        for code in codes {
            if let Ok(status) = StatusCode::from_u16(code) {
                let bit = usize::from(status.as_u16() - Self::FIRST);
                set.0[bit / 64] |= 1 << (bit % 64);
            }
        }
        set
    }

    #[inline]
    fn contains(&self, status: StatusCode) -> bool {
        // Every `StatusCode` is within 100..=999.
        let bit = usize::from(status.as_u16().wrapping_sub(Self::FIRST));
        let word = self.0.get(bit / 64);
        word.is_some_and(|word| word & (1 << (bit % 64)) != 0)
    }

    fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (Self::FIRST..=999)
            .filter(|&code| StatusCode::from_u16(code).is_ok_and(|s| self.contains(s)))
    }
}

impl fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Classify for StatusClassifier {
    fn classify(&self, status: StatusCode, _headers: &HeaderMap) -> Classification {
        if self.throttled.contains(status) {
            Classification::Throttled
        } else if self.transient.contains(status) {
            Classification::Transient
        } else if status.is_success() || status.is_redirection() || status.is_informational() {
            Classification::Success
        } else {
            Classification::Failure
        }
    }
}

#[cfg(feature = "serde")]
mod de;
mod read;

pub(crate) use self::read::{plainly_successful, read, ReadWith};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_valid_code_round_trips_and_invalid_ones_are_ignored() {
        let h = HeaderMap::new();
        for code in 100..=999u16 {
            let status = StatusCode::from_u16(code).expect("valid");
            let c = StatusClassifier::default().throttled([]).transient([code]);
            assert_eq!(c.classify(status, &h), Classification::Transient, "{code}");
            let c = StatusClassifier::default()
                .throttled([code])
                .transient([code]);
            assert_eq!(c.classify(status, &h), Classification::Throttled, "{code}");
        }
        let c = StatusClassifier::default().transient([0, 99, 1000, u16::MAX, 502]);
        assert_eq!(c.transient.iter().collect::<Vec<_>>(), [502]);
        assert_eq!(
            format!("{:?}", StatusClassifier::default()),
            "StatusClassifier { throttled: [429, 503], transient: [] }"
        );
    }
}
