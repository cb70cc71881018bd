//! Shared cooldown: a throttling response's wait pauses everyone.
//!
//! The layer observes every response, reading it once: its classification (429 and 503 are
//! throttling by default, see [`Classify`](crate::classify::Classify)) and its rate-limit
//! headers, in the allowance's dialect (`signals`, feature `dialects`) (`Retry-After` and
//! `retry-after-ms` by default). On a throttling response with a valid wait, it raises the
//! allowance's "blocked until" deadline, with max semantics: a later, shorter delay never
//! moves it earlier, and responses to requests already in flight extend it rather than
//! reset it. A success saying `remaining: 0` until a reset does the same. When the cooldown
//! ends, admission still meters the restart: the queue is not released in one burst.
//!
//! The response is passed through untouched and its body stays readable. Rate-limit
//! headers are recorded in the allowance's [`Snapshot`](crate::Snapshot) as observations.
//! A wait longer than the allowance's `max_cooldown`, or too long to represent, closes the
//! allowance instead, for `max_cooldown` (every waiting and new call fails with
//! [`Exhausted`](crate::error::Exhausted), visibly, and a warning names the value) rather
//! than wait less or park everyone for years; it then reopens by itself, metered, and
//! [`Allowance::clear`](crate::Allowance::clear) reopens it sooner.
//!
//! ```
//! use std::{convert::Infallible, time::Duration};
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{cooldown::CooldownLayer, Allowance, AllowanceConfig};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let allowance = Allowance::new(AllowanceConfig::per_second(2, 2)?);
//! let service = ServiceBuilder::new()
//!     .layer(CooldownLayer::new(allowance.clone()))
//!     .service_fn(|_req: Request<()>| async {
//!         let mut res = Response::new("slow down");
//!         *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
//!         res.headers_mut().insert("retry-after", http::HeaderValue::from_static("30"));
//!         Ok::<_, Infallible>(res)
//!     });
//!
//! let res = service.oneshot(Request::new(())).await?;
//! assert_eq!(*res.body(), "slow down"); // untouched
//! assert_eq!(allowance.snapshot().cooling_for, Some(Duration::from_secs(30)));
//! # Ok(())
//! # }
//! ```
//!
//! # Why a shared cooldown and not per-request backoff
//!
//! A `Retry-After` describes the credential, not the request that happened to receive it.
//! If each worker honours it alone, the others keep spending the same exhausted allowance,
//! and the waiting workers wake together and collide again. Recording it once, for everyone
//! who shares the allowance, is what stops the group.

#[cfg(feature = "grpc")]
mod detached;
mod future;
mod layer;
pub(crate) mod service;

#[cfg(feature = "grpc")]
pub(crate) use self::detached::raise_detached;
pub use self::{future::ResponseFuture, layer::CooldownLayer, service::Cooldown};
