//! Errors the layers add to a service's own.
//!
//! The layers return [`BoxError`]; downcast to these types to tell them apart, or use
//! [`Outcome::of`](crate::Outcome::of), which does it for you (through wrappers such as
//! `Buffer` or `MapErr` too: it walks the `source()` chain).
//!
//! Every error's `Display` says what happened in this layer only; the cause, when there is
//! one, is its `source()`, so a chain printer prints each once.
//!
//! ```
//! use tower_allowance::error::{AbandonReason, Abandoned};
//!
//! let err: tower_allowance::BoxError = Abandoned::new(AbandonReason::Deadline).into();
//! let abandoned = err.downcast_ref::<Abandoned>().expect("typed");
//! assert_eq!(abandoned.reason(), AbandonReason::Deadline);
//! assert_eq!(err.to_string(), "request abandoned: its deadline would pass before it could be sent");
//! ```

use std::{fmt, time::Duration};

use tokio::time::Instant;
use tower::load_shed::error::Overloaded as ShedOverloaded;

use crate::{rule::ClosedBy, store::StoreError, BoxError};

/// A configuration value was out of range.
///
/// The reason is a static description of the rule that was broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    reason: &'static str,
    pub(crate) field: Option<&'static str>,
}

impl ConfigError {
    pub(crate) const fn new(reason: &'static str) -> Self {
        Self {
            reason,
            field: None,
        }
    }

    /// The rule that was broken.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// The field it concerns, when known (deserialized configurations name it).
    pub fn field(&self) -> Option<&'static str> {
        self.field
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid allowance configuration: ")?;
        if let Some(field) = self.field {
            write!(f, "`{field}`: ")?;
        }
        f.write_str(self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Why a request was given up on rather than completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
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
    /// `Idempotency-Key`, or its body could not be kept for a replay).
    NotReplayable,
    /// The wait queue was full.
    Overloaded,
    /// The allowance is closed because the provider's quota is spent (a quota probe found
    /// it; see [`Exhausted`]). Waiting cannot help.
    QuotaExhausted,
    /// The allowance is closed because a server asked for a wait beyond `max_cooldown`, or
    /// too long to represent (see [`Exhausted`]).
    CooldownTooLong,
    /// The request costs more than a limit's burst: it can never be admitted.
    TooCostly,
}

impl AbandonReason {
    /// What a caller refused by an allowance closed `by` this is told.
    pub(crate) fn closed_by(by: ClosedBy) -> Self {
        match by {
            ClosedBy::Quota => Self::QuotaExhausted,
            ClosedBy::ServerDelay => Self::CooldownTooLong,
        }
    }

    /// Every reason in declaration (and counter) order, with its name and what it says.
    #[rustfmt::skip]
    const TABLE: [(Self, &'static str, &'static str); 8] = [
        (Self::MaxAttempts, "max_attempts", "it reached its maximum number of attempts"),
        (Self::BudgetExhausted, "budget_exhausted", "the shared retry budget is spent"),
        (Self::Deadline, "deadline", "its deadline would pass before it could be sent"),
        (Self::NotReplayable, "not_replayable", "it is not safe to replay"),
        (Self::Overloaded, "overloaded", "too many callers are already waiting for admission"),
        (Self::QuotaExhausted, "quota_exhausted", "the provider's quota is spent"),
        (Self::CooldownTooLong, "cooldown_too_long", "a server asked for a wait beyond max_cooldown"),
        (Self::TooCostly, "too_costly", "its cost exceeds what the allowance can ever admit at once"),
    ];

    /// How many reasons there are (for counters).
    pub(crate) const COUNT: usize = Self::TABLE.len();

    /// A short stable name (`"max_attempts"`, `"budget_exhausted"`, ...).
    pub fn as_str(self) -> &'static str {
        Self::TABLE[self as usize].1
    }

    /// Every reason, in counter order.
    pub(crate) fn each() -> impl Iterator<Item = Self> {
        Self::TABLE.into_iter().map(|(reason, ..)| reason)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    fn describe(self) -> &'static str {
        Self::TABLE[self as usize].2
    }
}

/// The reason named by [`AbandonReason::as_str`]; any other string is a
/// [`ConfigError`] (a reason read from a file or a flag).
impl std::str::FromStr for AbandonReason {
    type Err = crate::ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let reason = Self::each().find(|r| r.as_str() == s);
        reason.ok_or(crate::ConfigError::new("names no abandonment reason"))
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
/// It carries what the allowance knew when it gave up: when a caller may come back
/// ([`retry_after`](Self::retry_after)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abandoned {
    reason: AbandonReason,
    until: Option<Instant>,
}

impl Abandoned {
    /// An abandonment for `reason`, with nothing known of when to come back.
    pub const fn new(reason: AbandonReason) -> Self {
        Self::until(reason, None)
    }

    /// An abandonment for `reason` that knew the allowance could not serve it before `until`.
    pub(crate) const fn until(reason: AbandonReason, until: Option<Instant>) -> Self {
        Self { reason, until }
    }

    /// Why.
    pub fn reason(&self) -> AbandonReason {
        self.reason
    }

    /// How long from now until the allowance could serve the request, as it knew when it
    /// gave up: the end of the cooldown that held it (as this process knows it), else the
    /// slot the store offered past the request's deadline; the wait the server asked for;
    /// the reopening of a closed allowance; room in a full queue. `None` when nothing was
    /// known (a budget spent, a request that cannot be replayed). It never lags the store as
    /// [`Allowance::snapshot`] can (this process learns of a cooldown when the call that
    /// raised it returns): a `503`'s `Retry-After` should come from here first.
    ///
    /// [`Allowance::snapshot`]: crate::Allowance::snapshot
    ///
    /// ```
    /// use tower_allowance::error::{AbandonReason, Abandoned};
    ///
    /// assert_eq!(Abandoned::new(AbandonReason::BudgetExhausted).retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        (self.until).map(|u| u.saturating_duration_since(Instant::now()))
    }

    /// The abandonment an error reports, through wrappers too (the `source()` chain is
    /// searched): an [`Abandoned`], or a full queue ([`Overloaded`], or tower's `LoadShed`
    /// refusal) or a closed allowance ([`Exhausted`]) as one, with when to come back.
    ///
    /// ```
    /// use tower_allowance::{error::{AbandonReason, Abandoned}, BoxError};
    ///
    /// let err: BoxError = Abandoned::new(AbandonReason::Deadline).into();
    /// let abandoned = Abandoned::of_error(&*err).expect("an abandonment");
    /// assert_eq!(abandoned.reason(), AbandonReason::Deadline);
    /// assert_eq!(Abandoned::of_error(&std::fmt::Error), None);
    /// ```
    pub fn of_error(e: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let full = |wait| Self::until(AbandonReason::Overloaded, Instant::now().checked_add(wait));
        (find::<Abandoned>(e).copied())
            .or_else(|| find::<Overloaded>(e).map(|o| full(o.wait)))
            .or_else(|| find::<ShedOverloaded>(e).map(|_| Self::new(AbandonReason::Overloaded)))
            .or_else(|| find::<Exhausted>(e).map(|x| Self::until(x.reason(), x.until)))
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
#[non_exhaustive]
pub struct Overloaded {
    /// How long until the allowance could admit a call, as the store said when it refused
    /// this one (after every slot already reserved): when to try again.
    pub wait: std::time::Duration,
}

impl fmt::Display for Overloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("allowance wait queue is full")
    }
}

impl std::error::Error for Overloaded {}

/// A delay too long to represent (beyond [`MAX_DELAY`](crate::MAX_DELAY)) was given to
/// [`Allowance::extend_cooldown`](crate::Allowance::extend_cooldown); nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnrepresentableDelay {
    value: String,
}

impl UnrepresentableDelay {
    pub(crate) fn new(value: String) -> Self {
        Self { value }
    }

    /// The offending value, as received.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for UnrepresentableDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = &self.value;
        write!(f, "requested delay {value:?} is too long to represent")
    }
}

impl std::error::Error for UnrepresentableDelay {}

/// The allowance is closed: every waiting and new call fails at once until `until` (or until
/// an operator clears it with [`Allowance::clear`](crate::Allowance::clear)).
///
/// It closes when a quota probe finds the provider's quota spent (until its reset, or until
/// cleared when none is known), or when a server asks for a wait longer than
/// [`max_cooldown`](crate::AllowanceConfig::with_max_cooldown) or too long to represent (for
/// `max_cooldown`): waiting that long silently would park every worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exhausted {
    until: Option<Instant>,
    by: ClosedBy,
}

impl Exhausted {
    pub(crate) fn new(until: Option<Instant>, by: ClosedBy) -> Self {
        Self { until, by }
    }

    /// When the allowance reopens by itself; `None`: only when cleared.
    pub fn until(&self) -> Option<Instant> {
        self.until
    }

    /// Why it closed: [`AbandonReason::QuotaExhausted`] (a quota probe found the quota
    /// spent) or [`AbandonReason::CooldownTooLong`] (a server asked for a wait beyond
    /// `max_cooldown`, or too long to represent).
    pub fn reason(&self) -> AbandonReason {
        AbandonReason::closed_by(self.by)
    }
}

impl fmt::Display for Exhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = self.reason().describe();
        let now = Instant::now();
        let left = self.until.map(|u| u.saturating_duration_since(now));
        match left {
            Some(left) => write!(f, "allowance exhausted ({why}); reopens in {left:?}"),
            None => write!(f, "allowance exhausted ({why}) until cleared"),
        }
    }
}

impl std::error::Error for Exhausted {}

/// The allowance's store could not decide; the request was not sent.
///
/// The store's error (and through it, the cause) is the `source()`; its
/// [`kind`](StoreError::kind) tells an outage from a refusal such as a wrong password.
#[derive(Debug)]
pub struct StoreUnavailable {
    source: StoreError,
}

impl StoreUnavailable {
    pub(crate) fn new(source: StoreError) -> Self {
        Self { source }
    }

    /// The store's error.
    pub fn store_error(&self) -> &StoreError {
        &self.source
    }
}

impl fmt::Display for StoreUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("admission failed: the allowance store could not decide")
    }
}

impl std::error::Error for StoreUnavailable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Why an admission failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum AcquireError {
    /// Given up: deadline, budget, cost.
    Abandoned(Abandoned),
    /// The wait queue is full.
    Overloaded(Overloaded),
    /// The allowance is closed.
    Exhausted(Exhausted),
    /// The store failed.
    Store(StoreUnavailable),
}

impl AcquireError {
    pub(crate) fn abandoned(reason: AbandonReason, until: Option<Instant>) -> Self {
        Self::Abandoned(Abandoned::until(reason, until))
    }

    /// The abandonment reason, if this is one (a full queue counts as `Overloaded`, a closed
    /// allowance as `Exhausted`).
    pub fn abandon_reason(&self) -> Option<AbandonReason> {
        match self {
            Self::Abandoned(a) => Some(a.reason()),
            Self::Overloaded(_) => Some(AbandonReason::Overloaded),
            Self::Exhausted(e) => Some(e.reason()),
            Self::Store(_) => None,
        }
    }

    /// Converts into the boxed leaf error the layers return.
    pub fn into_box(self) -> BoxError {
        match self {
            Self::Abandoned(e) => e.into(),
            Self::Overloaded(e) => e.into(),
            Self::Exhausted(e) => e.into(),
            Self::Store(e) => e.into(),
        }
    }
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Transparent: the leaf says it all (and is not repeated as a source).
        match self {
            Self::Abandoned(e) => e.fmt(f),
            Self::Overloaded(e) => e.fmt(f),
            Self::Exhausted(e) => e.fmt(f),
            Self::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for AcquireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Store(e) => e.source(),
            _ => None,
        }
    }
}

/// Why [`Allowance::extend_cooldown`](crate::Allowance::extend_cooldown) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum CooldownError {
    /// The delay is longer than [`MAX_DELAY`](crate::MAX_DELAY).
    Unrepresentable(UnrepresentableDelay),
    /// The store failed.
    Store(StoreError),
}

impl fmt::Display for CooldownError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unrepresentable(e) => e.fmt(f),
            Self::Store(_) => f.write_str("could not record the cooldown in the allowance store"),
        }
    }
}

impl std::error::Error for CooldownError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unrepresentable(_) => None,
            Self::Store(e) => Some(e),
        }
    }
}

/// Finds the first error of type `E` in `err`'s `source()` chain, `err` included.
pub(crate) fn find<'a, E: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    std::iter::successors(Some(err), |e| e.source()).find_map(|e| e.downcast_ref::<E>())
}

#[cfg(test)]
mod tests {
    use super::AbandonReason;

    #[test]
    fn the_reasons_table_is_in_declaration_order() {
        for (i, (reason, name, _)) in AbandonReason::TABLE.into_iter().enumerate() {
            assert_eq!((reason as usize, reason.as_str()), (i, name));
            assert_eq!(name.parse(), Ok(reason));
        }
    }
}
