//! A budgeted [`tower::retry::Policy`]: it decides whether and when; admission admits.
//!
//! [`RetryPolicy`] retries throttling and transient responses, but only:
//!
//! - up to `max_attempts` per request (counting the first);
//! - while the allowance's shared retry budget has something left: every extra attempt,
//!   whichever worker makes it, spends from the same budget, atomically with its admission
//!   by the admission layer under the `Retry` (see "Budget and stack order");
//! - for replayable requests (GET, HEAD, OPTIONS, PUT, DELETE, or any request carrying
//!   `Idempotency-Key`; configurable). A POST that gets a 429 is returned as is;
//! - after the server's `Retry-After` when present, never shortened by a local cap;
//!   otherwise after bounded exponential backoff with full jitter;
//! - when waiting would not pass the request's [`Deadline`](crate::Deadline): then it
//!   stops now rather than retry at the deadline.
//!
//! Giving up is never reported as success: the final response carries an
//! [`Abandoned`](crate::error::Abandoned) extension, and [`Outcome::of`](crate::Outcome::of)
//! tells completed from abandoned, and why, in one check.
//!
//! # Request bodies
//!
//! Retrying needs the request body a second time, without `B: Clone`: any body that
//! implements [`Replayable`](crate::body::Replayable) will do (`Full<Bytes>`, `String`,
//! `BoxBody`, hyper's `Incoming`, axum's and tonic's `Body`). A body that is cheap to copy
//! is cloned; a stream keeps a copy of up to [`RetryConfig::replay_cap`] bytes (64 KiB by
//! default) while the first attempt sends it, and a retry replays that copy. A body longer
//! than the cap is sent once: a throttling answer to it is returned, marked abandoned with
//! [`AbandonReason::NotReplayable`](crate::error::AbandonReason::NotReplayable).
//! [`AllowanceLayer`](crate::AllowanceLayer) does all of this with a [`Prepare`] over
//! tower's `Retry`; put a [`Prepare`] over your own `Retry` (or pass each request through
//! [`RetryPolicy::prepare`] first).
//!
//! # Budget and stack order: the policy decides, admission admits
//!
//! The policy decides **whether** to retry and **when** (a delay whose floor is the server's
//! wait), and marks the retry's [`Attempt`](crate::Attempt) record; it never admits. Every
//! attempt, first tries and retries alike, is admitted by the
//! [`AdmissionLayer`](crate::admission::AdmissionLayer) under the `Retry`: for a retry it
//! spends one unit of the shared retry budget, checks the cooldown and reserves the retry's
//! slot, no earlier than the server's wait, in one atomic step (one round trip with a shared
//! store). The budget is spent exactly once per retry, by the layer that admits it.
//!
//! - **An admission layer on the same allowance under the `Retry`**, as in
//!   [`AllowanceLayer`](crate::AllowanceLayer) (Retry → Cooldown → Admission → inner): a retry
//!   the store refuses (the budget spent, its deadline, a closure) is not sent, and the
//!   request ends with the response that prompted the retry, marked abandoned (for example
//!   [`AbandonReason::BudgetExhausted`](crate::error::AbandonReason::BudgetExhausted)). Tell
//!   the policy the layer is there ([`RetryPolicy::over_admission`]; `AllowanceLayer` does)
//!   and a retry's slot is reserved as soon as it is decided, the server's wait spent in the
//!   admission queue ahead of the callers who arrive during the cooldown; otherwise the policy
//!   sleeps the wait first and the retry then queues like a new arrival.
//! - **The retry layer alone** (`tower::retry::RetryLayer` with this policy right over the
//!   client): a product decision, not an accident. Nothing admits, so nothing spends the
//!   budget: attempts are bounded by `max_attempts` only. Each retry still honours its own
//!   server's wait (the policy sleeps it) and keeps its request's deadline; nothing shares a
//!   cooldown. Put an admission layer under the `Retry` to hold retries to the budget.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{Allowance, AllowanceConfig, AllowanceLayer, Outcome, RetryBudgetConfig};
//! use tower_allowance::error::AbandonReason;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let allowance = Allowance::new(
//!     AllowanceConfig::per_second(2, 2)?.with_retry_budget(RetryBudgetConfig::fixed(1)),
//! );
//! let service = ServiceBuilder::new()
//!     .layer(allowance.layer())
//!     .service_fn(|_req: Request<String>| async {
//!         let mut res = Response::new(String::new());
//!         *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
//!         res.headers_mut().insert("retry-after", http::HeaderValue::from_static("1"));
//!         Ok::<_, Infallible>(res)
//!     });
//!
//! let result = service.oneshot(Request::new(String::new())).await;
//! // One retry (the whole budget), then the budget stopped it: abandoned, not success.
//! assert_eq!(Outcome::of(&result), Outcome::Abandoned(AbandonReason::BudgetExhausted));
//! assert_eq!(allowance.snapshot().admitted, 2);
//! # Ok(())
//! # }
//! ```

mod policy;
mod prepare;

// The per-request rules are plain data, kept with the rest of the configuration (which an
// allowance carries): `crate::config`, a lower module.
pub use self::{
    policy::{RetryPolicy, RetryWait},
    prepare::Prepare,
};
pub use crate::config::retry::RetryConfig;
