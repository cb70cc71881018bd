//! Shared admission: every attempt, first try or retry, waits for the allowance.
//!
//! An attempt waits first until the shared cooldown has passed, then for a token, in
//! arrival order of the first polls. The token is taken when the response future is first
//! polled, never in `poll_ready` or `call`: a balancer probing readiness spends nothing, and
//! a future dropped unpolled (a caller that gave up before awaiting it, a `select!` that
//! picked another branch) takes no token. A caller that must wait has its slot reserved
//! when it asks; if it gives up while it waits (its future dropped), the slot goes to the
//! next waiter in the process, or back to the store when it is the latest one reserved
//! (docs/scale-out.md, "Cancelled waiters", says what remains lost and why).
//!
//! Requests may carry a [`Deadline`](crate::Deadline): if admission cannot happen by then,
//! the call fails at once with [`Abandoned`](crate::error::Abandoned) (reason `Deadline`).
//! A full wait queue fails at once with [`Overloaded`](crate::error::Overloaded).
//!
//! # Readiness
//!
//! [`Admission`] is always ready: the admission is not a scarce resource (a full queue is a
//! verdict of the future's first poll), and it never reserves the inner service's readiness
//! (a `ConcurrencyLimit` permit, a `Buffer` slot, a connection) through a wait: `call` only
//! moves the request and a clone of the inner service (`S: Clone`; a clone is not ready)
//! into the response future, and that clone is polled ready and called only once the
//! request is admitted (a request admitted at its first poll is sent then if the clone is
//! ready). So a request in a cooldown never holds what another allowance's (or key's)
//! requests need, and one whose inner service is still not ready at its `Deadline` fails
//! then with the deadline verdict.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{admission::AdmissionLayer, Allowance, AllowanceConfig};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let allowance = Allowance::new(AllowanceConfig::per_second(3, 3)?);
//! let service = ServiceBuilder::new()
//!     .layer(AdmissionLayer::new(allowance.clone()))
//!     .service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(())) });
//!
//! let start = tokio::time::Instant::now();
//! for _ in 0..3 {
//!     service.clone().oneshot(Request::new(())).await?;
//! }
//! // Two at once, the third (the burst's last) 10 ms later: the headroom kept for delivery
//! // jitter (see `Limit`).
//! assert_eq!(start.elapsed().as_millis(), 10);
//! # Ok(())
//! # }
//! ```

mod future;
mod layer;
mod service;

pub use self::{future::ResponseFuture, layer::AdmissionLayer, service::Admission};
