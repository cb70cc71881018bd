//! A budgeted [`tower::retry::Policy`].
//!
//! [`RetryPolicy`] retries throttling and transient responses, but only:
//!
//! - up to `max_attempts` per request (counting the first);
//! - while the allowance's shared retry budget has something left: every extra attempt,
//!   whichever worker makes it, spends from the same budget, atomically with its admission;
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
//! # Budget and stack order
//!
//! A retry's admission is one decision, made by the policy's wait ([`RetryWait`]) on the
//! policy's allowance, whatever sits under the `Retry`: it spends one unit of the shared
//! retry budget, checks the cooldown and reserves the retry's slot in one atomic step (one
//! round trip with a shared store). The budget is spent exactly once per retry. What the
//! stack decides is who holds a retry to a refusal:
//!
//! - **An [`AdmissionLayer`](crate::admission::AdmissionLayer) on the same allowance under
//!   the `Retry`**, as in [`AllowanceLayer`](crate::AllowanceLayer) (Retry → Cooldown →
//!   Admission → inner): the layer sends an admitted retry without asking again and fails a
//!   refused one, and the request ends with the response that prompted the retry, marked
//!   abandoned (for example [`AbandonReason::BudgetExhausted`](crate::error::AbandonReason::BudgetExhausted)).
//! - **The retry layer alone** (`tower::retry::RetryLayer` with this policy right over the
//!   client): nothing gates first attempts and nothing shares a cooldown; the allowance
//!   meters the retries only (its budget, and a slot in its schedule for each retry: an
//!   allowance whose rate is far above the upstream's holds just the budget). Each request
//!   honours its own `Retry-After`, caps its attempts and keeps its deadline. When nothing
//!   is slept before asking (a throttling answer with a delay, such as `Retry-After: 1`), the
//!   policy asks when it decides to retry; a store that answers at once (the in-memory
//!   store) refuses there, and the request ends as above with nothing sent. A retry that
//!   sleeps a backoff first (a transient error, a throttling answer without a delay), or a
//!   store that answers later (Redis), gets its verdict once tower's `Retry` is committed to
//!   sending it, and is sent: put an admission layer under the `Retry` to hold those to the
//!   budget.
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
