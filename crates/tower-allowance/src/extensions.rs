//! Request and response extensions the layers read and write.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use tokio::time::Instant;

/// When an attempt was actually sent (admitted and handed to the inner service), for an
/// adaptive rate's "one cut per round": the cooldown layer, above the admission layer,
/// cannot see the end of the queue wait. Set once by the admission layer; only requests to
/// an adaptive allowance carry it.
#[derive(Clone, Debug, Default)]
pub(crate) struct SentAt(pub(crate) Arc<OnceLock<Instant>>);

impl SentAt {
    /// Records the send instant (the first one wins).
    pub(crate) fn mark(&self, now: Instant) {
        let _ = self.0.set(now);
    }
}

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

/// Which attempt of a request this is (1 for the first), set by the
/// [`RetryPolicy`](crate::retry::RetryPolicy) on each retry.
///
/// The admission layer spends one unit of the shared retry budget for every attempt
/// numbered 2 or higher, atomically with taking its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attempt(pub(crate) u32);

impl Attempt {
    /// The attempt number, starting at 1.
    pub fn number(&self) -> u32 {
        self.0
    }

    /// Whether this attempt is a retry.
    pub fn is_retry(&self) -> bool {
        self.0 > 1
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
    pub(crate) retry: bool,
    pub(crate) cost: Option<u32>,
    pub(crate) not_before: Option<Duration>,
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
