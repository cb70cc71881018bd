//! Request and response extensions the layers read and write.

use std::time::Duration;

use http::Extensions;
use tokio::time::Instant;

use crate::error::AbandonReason;

/// A per-request deadline, read from the request's extensions.
///
/// The admission layer fails at once (with [`AbandonReason::Deadline`](crate::error::AbandonReason::Deadline))
/// when the earliest possible admission is later than the deadline, and promptly when a
/// cooldown arriving later pushes a waiting request past it. The retry policy stops
/// instead of waiting past it.
///
/// ```
/// use std::time::Duration;
/// use tower_allowance::Deadline;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Deadline::after(Duration::from_secs(10)));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(pub Instant);

impl Deadline {
    /// A deadline `timeout` from now (saturating far in the future on overflow).
    pub fn after(timeout: Duration) -> Self {
        let now = Instant::now();
        Self(now.checked_add(timeout).unwrap_or_else(|| far_future(now)))
    }

    /// The instant.
    pub fn instant(&self) -> Instant {
        self.0
    }
}

fn far_future(now: Instant) -> Instant {
    // About 30 years: tokio's own "far future".
    now + Duration::from_secs(86_400 * 365 * 30)
}

/// The record of one attempt: the only thing the layers tell each other, and where.
///
/// It travels in the request's extensions from the layers above admission to those below,
/// and back up in the response's: the admission layer puts the record of the attempt that
/// produced a response (with when it was sent) in that response's extensions. A layer used
/// alone finds no record and behaves as its docs say; nothing is allocated for a request
/// that needs none (a first attempt, on the fast path).
///
/// | field | written by | read by |
/// | --- | --- | --- |
/// | [`number`](Self::number) | [`RetryPolicy`](crate::retry::RetryPolicy), on each retry (2, 3, ...) | the admission layer (a retry spends a unit of the shared retry budget with its token), the cooldown layer (the attempt's span), the caller |
/// | not before | `RetryPolicy`, when an admission layer under it waits out the server's delay for a retry (the slot's floor) | the admission layer (it reserves the retry's slot no earlier) |
/// | last | [`Prepare`](crate::retry::Prepare), for a request no retry will follow, and why; `RetryPolicy` clears it on a retry | the cooldown layer, from the request (a throttling answer to it is marked abandoned, with that reason, not passed off as final) |
/// | sent | the admission layer, in the response's record; `RetryPolicy` clears it on a retry | the cooldown layer, from the response (an adaptive rate cuts once per round of sends) |
/// | [`queued`](Self::queued) | the admission layer (adding each attempt's wait for its slot), `RetryPolicy` (carrying it to the retry) | the caller, from the response: why the answer waited; the gRPC layer (feature `grpc`: `x-allowance-waited`) |
/// | [`cooled`](Self::cooled), [`cooldowns`](Self::cooldowns) | the admission layer (the part of each attempt's wait a cooldown held it, and whether one did), `RetryPolicy` (carrying them) | the caller: which waits were the server's; the gRPC layer reads `cooled` (`x-allowance-cooled`) |
/// | [`request`](Self::request) | the admission layer (the number its debug events first gave the request), `RetryPolicy` (on a retry, from the response's record or a new number) | the admission layer and `RetryPolicy` (their debug events name the request by it), the caller |
///
/// The admission layer puts a record in the response when the request carries one, waited
/// for its slot, or the rate is adaptive. ARCHITECTURE.md keeps the same table.
///
/// Three more extensions pass between the layers. The request's body for a retry travels
/// apart (a [`Replay`](crate::body::Replay), typed by the body: `Prepare` writes it,
/// `RetryPolicy` reads it), and so does how a response was read (a
/// [`Classified`](crate::classify::Classified) in the response's extensions: the cooldown
/// layer writes it, `RetryPolicy` and [`Outcome::of`](crate::Outcome::of) read it). With the
/// feature `shares`, the request's class travels apart too: the request's `shares::Class`,
/// which the class layer (`AllowanceLayer::class`) writes and also puts in the answer's
/// extensions, beside this record; the admission layer (and, with `settle`, the settle
/// layer) reads it.
///
/// ```
/// use tower_allowance::Attempt;
///
/// // A response the stack produced on a retry carries the attempt's record.
/// let response = http::Response::new(());
/// let attempt = response.extensions().get::<Attempt>().copied().unwrap_or_default();
/// assert_eq!(attempt.number(), 1); // none: the first attempt
/// assert!(!attempt.is_retry());
/// ```
/// `Attempt::default()` is a first attempt's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attempt {
    /// Attempts made before this one (0: a first attempt).
    pub(crate) retries: u32,
    pub(crate) not_before: Option<Instant>,
    pub(crate) last: Option<AbandonReason>,
    pub(crate) sent: Option<Instant>,
    pub(crate) queued: Duration,
    pub(crate) cooled: Duration,
    pub(crate) cooldowns: u32,
    pub(crate) request: Option<std::num::NonZeroU64>,
}

impl Attempt {
    /// The attempt number, starting at 1.
    pub fn number(&self) -> u32 {
        self.retries.saturating_add(1)
    }

    /// Whether this attempt is a retry.
    pub fn is_retry(&self) -> bool {
        self.retries > 0
    }

    /// Why the answer waited: how long the request queued for admission, over all its
    /// attempts so far. A response carries the record when its request waited for a slot
    /// (a cooldown or the rate held it), was retried, or the rate is adaptive; none (the
    /// default, zero) when every attempt went at once.
    pub fn queued(&self) -> Duration {
        self.queued
    }

    /// Of the time [`queued`](Self::queued), how long a cooldown held the request: the part
    /// of each attempt's wait before the end of a cooldown this process knew of when the
    /// slot was reserved, and each time a cooldown moved the slot later. The rest is the
    /// rate (other callers' turns).
    pub fn cooled(&self) -> Duration {
        self.cooled
    }

    /// How many of its attempts a cooldown held (a cooldown raised by a `429` holds the retry
    /// that follows it, say).
    pub fn cooldowns(&self) -> u32 {
        self.cooldowns
    }

    /// The number the allowance's debug events name this request by (`request = N`), when
    /// one named it: unique per allowance, the same over all its attempts.
    pub fn request(&self) -> Option<u64> {
        self.request.map(std::num::NonZeroU64::get)
    }

    /// The record a request carries, if any.
    pub(crate) fn of(extensions: &Extensions) -> Option<Self> {
        extensions.get::<Self>().copied()
    }
}

/// What a request costs against limits that count cost (for example the tokens an LLM
/// request carries; see [`Limit::counting_cost`](crate::Limit::counting_cost)). Requests
/// without it cost 1.
///
/// A cost above such a limit's burst can never be admitted: the call fails at once with
/// [`AbandonReason::TooCostly`](crate::error::AbandonReason::TooCostly).
///
/// ```
/// use tower_allowance::Cost;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Cost(1_200));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cost(pub u32);

/// Options for one admission; see [`Allowance::acquire_with`](crate::Allowance::acquire_with).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    pub(crate) deadline: Option<Instant>,
    /// The request's number in debug events, when its record has one.
    pub(crate) request: Option<std::num::NonZeroU64>,
    pub(crate) retry: bool,
    pub(crate) cost: Option<u32>,
    pub(crate) not_before: Option<Duration>,
    #[cfg(feature = "shares")]
    pub(crate) class: Option<crate::rule::ClassKey>,
}

impl AcquireOptions {
    /// A first attempt of cost 1, without a deadline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fail with [`AbandonReason::Deadline`](crate::error::AbandonReason::Deadline) rather than be admitted after `deadline`; nothing
    /// is reserved when the slot would be later.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// This attempt is a retry: spend one unit of the shared retry budget in the same step.
    pub fn retry(mut self, retry: bool) -> Self {
        self.retry = retry;
        self
    }

    /// The attempt's cost, charged to limits that count cost (default 1).
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = Some(cost);
        self
    }

    /// Not before `delay` from now (a server's `Retry-After`, a backoff).
    pub fn not_before(mut self, delay: Duration) -> Self {
        self.not_before = Some(delay);
        self
    }
}
