//! Errors the layers add to a service's own.
//!
//! The layers return [`BoxError`]; downcast to these types to tell them
//! apart, or use [`Outcome::of`](crate::Outcome::of), which does it for you.
//!
//! ```
//! use tower_allowance::error::{AbandonReason, Abandoned};
//!
//! let err: tower_allowance::BoxError = Abandoned::new(AbandonReason::Deadline).into();
//! let abandoned = err.downcast_ref::<Abandoned>().expect("typed");
//! assert_eq!(abandoned.reason(), AbandonReason::Deadline);
//! assert_eq!(err.to_string(), "request abandoned: its deadline would pass before it could be sent");
//! ```

use std::fmt;

use crate::BoxError;

/// Why a request was given up on rather than completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AbandonReason {
    /// The request reached its per-request `max_attempts`.
    MaxAttempts,
    /// The shared retry budget had nothing left for another attempt.
    BudgetExhausted,
    /// Waiting as long as required (for admission or for the server's `Retry-After`)
    /// would pass the request's [`Deadline`](crate::Deadline).
    Deadline,
    /// The request may not be replayed (its method is not idempotent and it carries no
    /// `Idempotency-Key`).
    NotReplayable,
    /// The wait queue was full.
    Overloaded,
    /// The server asked for a delay too long to represent.
    UnrepresentableDelay,
    /// The provider's quota is spent (see [`quota`](crate::quota)); waiting cannot help.
    QuotaExhausted,
}

impl AbandonReason {
    /// Every reason, for iterating over counters.
    pub const ALL: [AbandonReason; 7] = [
        Self::MaxAttempts,
        Self::BudgetExhausted,
        Self::Deadline,
        Self::NotReplayable,
        Self::Overloaded,
        Self::UnrepresentableDelay,
        Self::QuotaExhausted,
    ];

    /// A short stable name (`"max_attempts"`, `"budget_exhausted"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxAttempts => "max_attempts",
            Self::BudgetExhausted => "budget_exhausted",
            Self::Deadline => "deadline",
            Self::NotReplayable => "not_replayable",
            Self::Overloaded => "overloaded",
            Self::UnrepresentableDelay => "unrepresentable_delay",
            Self::QuotaExhausted => "quota_exhausted",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    fn describe(self) -> &'static str {
        match self {
            Self::MaxAttempts => "it reached its maximum number of attempts",
            Self::BudgetExhausted => "the shared retry budget is spent",
            Self::Deadline => "its deadline would pass before it could be sent",
            Self::NotReplayable => "it is not safe to replay",
            Self::Overloaded => "too many callers are already waiting for admission",
            Self::UnrepresentableDelay => "the server asked for a delay too long to represent",
            Self::QuotaExhausted => "the provider's quota is spent",
        }
    }
}

impl fmt::Display for AbandonReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request was given up on; nothing was sent for the attempt that failed this way.
///
/// Returned as an error by the admission layer (deadline, budget) and attached as a
/// response extension by the retry policy when it stops retrying a throttled response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abandoned {
    reason: AbandonReason,
}

impl Abandoned {
    /// An abandonment for `reason`.
    pub const fn new(reason: AbandonReason) -> Self {
        Self { reason }
    }

    /// Why.
    pub fn reason(&self) -> AbandonReason {
        self.reason
    }
}

impl fmt::Display for Abandoned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request abandoned: {}", self.reason.describe())
    }
}

impl std::error::Error for Abandoned {}

/// The wait queue already held `max_waiters` callers; the call failed at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overloaded {
    _priv: (),
}

impl Overloaded {
    pub(crate) const fn new() -> Self {
        Self { _priv: () }
    }
}

impl fmt::Display for Overloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("allowance wait queue is full")
    }
}

impl std::error::Error for Overloaded {}

/// A server asked for a delay (`Retry-After`) too long to represent.
///
/// The call fails rather than wait a shorter time than the server asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnrepresentableDelay {
    value: String,
}

impl UnrepresentableDelay {
    pub(crate) fn new(value: String) -> Self {
        Self { value }
    }

    /// The offending value, as received (lossily decoded).
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for UnrepresentableDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "requested delay {:?} is too long to represent",
            self.value
        )
    }
}

impl std::error::Error for UnrepresentableDelay {}

/// The provider's quota is spent; calls fail at once until `until` (or a reset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaExhausted {
    until: tokio::time::Instant,
}

impl QuotaExhausted {
    pub(crate) fn new(until: tokio::time::Instant) -> Self {
        Self { until }
    }

    /// When the allowance reopens by itself.
    pub fn until(&self) -> tokio::time::Instant {
        self.until
    }
}

impl fmt::Display for QuotaExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let left = self
            .until
            .saturating_duration_since(tokio::time::Instant::now());
        write!(f, "quota exhausted; reopens in {left:?}")
    }
}

impl std::error::Error for QuotaExhausted {}

/// The allowance's store could not decide; the request was not sent.
#[derive(Debug)]
pub struct StoreUnavailable {
    source: crate::store::StoreError,
}

impl StoreUnavailable {
    pub(crate) fn new(source: crate::store::StoreError) -> Self {
        Self { source }
    }
}

impl fmt::Display for StoreUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("allowance store unavailable")
    }
}

impl std::error::Error for StoreUnavailable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Why an admission failed.
#[derive(Debug)]
pub enum AcquireError {
    /// Given up: deadline, budget or a full queue.
    Abandoned(Abandoned),
    /// The wait queue is full.
    Overloaded(Overloaded),
    /// The store failed.
    Store(StoreUnavailable),
    /// The quota is spent.
    Quota(QuotaExhausted),
}

impl AcquireError {
    pub(crate) fn abandoned(reason: AbandonReason) -> Self {
        Self::Abandoned(Abandoned::new(reason))
    }

    /// The abandonment reason, if this is one (a full queue counts as `Overloaded`).
    pub fn abandon_reason(&self) -> Option<AbandonReason> {
        match self {
            Self::Abandoned(a) => Some(a.reason()),
            Self::Overloaded(_) => Some(AbandonReason::Overloaded),
            Self::Store(_) => None,
            Self::Quota(_) => Some(AbandonReason::QuotaExhausted),
        }
    }

    /// Converts into the boxed leaf error the layers return.
    pub fn into_box(self) -> BoxError {
        match self {
            Self::Abandoned(e) => e.into(),
            Self::Overloaded(e) => e.into(),
            Self::Store(e) => e.into(),
            Self::Quota(e) => e.into(),
        }
    }
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Abandoned(e) => e.fmt(f),
            Self::Overloaded(e) => e.fmt(f),
            Self::Store(e) => e.fmt(f),
            Self::Quota(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for AcquireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Abandoned(e) => Some(e),
            Self::Overloaded(e) => Some(e),
            Self::Store(e) => Some(e),
            Self::Quota(e) => Some(e),
        }
    }
}
