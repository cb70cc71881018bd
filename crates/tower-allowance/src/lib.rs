//! Share one API allowance among many concurrent workers without fighting over it.
//!
//! Eight workers share one API key. Each honours `Retry-After` on its own, and the group
//! still keeps exceeding the limit: one worker waiting does not make the other seven wait,
//! and workers given the same delay wake up together and collide again. The fix is three
//! decisions made once, for everyone who shares the allowance:
//!
//! 1. **Admission** ([`admission`]): every attempt, first tries and retries alike, passes
//!    one shared token bucket, in arrival order.
//! 2. **Cooldown** ([`cooldown`]): a throttling response's `Retry-After` sets a shared
//!    "blocked until" that later responses can extend but never shorten; afterwards,
//!    admission still meters the restart.
//! 3. **Retry** ([`retry`]): a `tower::retry::Policy` whose extra attempts draw on a shared
//!    budget, capped per request, only for replayable requests, and that abandons (visibly,
//!    never as success) rather than shorten a server's requested wait.
//!
//! All three hang off one [`Allowance`], a cheap-to-clone handle; [`AllowanceLayer`] stacks
//! them in the right order around any `Service<http::Request<B>>`.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{Allowance, AllowanceConfig, AllowanceLayer, Outcome, RetryBudgetConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! // One allowance per API key: 2 requests/s, bursts of 2, 4 retries for the whole batch.
//! let allowance = Allowance::new(
//!     AllowanceConfig::per_second(2, 2)?.with_retry_budget(RetryBudgetConfig::fixed(4)),
//! );
//! let client = ServiceBuilder::new()
//!     .layer(allowance.layer())
//!     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new("odds")) });
//!
//! let result = client.oneshot(Request::new(String::new())).await;
//! assert!(Outcome::of(&result).is_completed());
//! # Ok(())
//! # }
//! ```
//!
//! The [`guide`] says in a few pages what the allowance promises (admission, reservations,
//! cooldown, retry, deadlines, cancellation), what it does when its store or the provider
//! fails, and which settings to tune.
//!
//! # Time
//!
//! Every wait uses `tokio::time`, so `#[tokio::test(start_paused = true)]` drives the whole
//! stack exactly. The only wall-clock read (one `SystemTime::now()` per response that has
//! headers) is for absolute times in those headers: HTTP-dates and epoch resets are measured
//! against the response's `Date` when it is within `max_date_skew` of this clock, else
//! against this clock.
//!
//! # Feature flags
//!
//! | feature | default | what it enables | what it pulls in |
//! | --- | --- | --- | --- |
//! | `hyper` | yes | [`Replayable`](body::Replayable) for hyper's `Incoming`, so a proxy can forward a hyper server's request body: sent once, never retried (it cannot be rebuilt) | `hyper` without features (the types only) |
//! | `axum` | | [`Replayable`](body::Replayable) for axum's `Body`; `inbound`: an abandonment answered `503` with the allowance's `Retry-After` (`HandleErrorLayer`, a handler) | `axum-core` (not the router) |
//! | `tonic` | | [`Replayable`](body::Replayable) for tonic's `Body`, the request body of a `Channel` (`GrpcLayer` over a `Channel` needs `grpc` too); `Outcome::of_error` reads a `tonic::Status` | `tonic` without default features (no transport, codegen or router) |
//! | `serde` | | `Deserialize` for [`AllowanceConfig`], [`RetryBudgetConfig`], [`RetryConfig`](retry::RetryConfig) and [`StatusClassifier`](classify::StatusClassifier) (durations as `"500ms"`, unknown fields refused, errors naming the field); `Serialize` for [`Snapshot`] and the store's [`State`](store::State) | `serde`, `humantime-serde` |
//! | `metrics` | | counters, histograms and gauges labelled by allowance name (listed in the [guide](guide#observing-it)) | `metrics` (the facade only; bring your own exporter) |
//! | `grpc` | | `grpc`: gRPC status and `grpc-retry-pushback-ms` classification, trailers watching, `GrpcLayer` for a tonic `Channel` | nothing (works on `http`/`http-body` types; a tonic `Channel` needs `tonic` too, for its body) |
//! | `keyed` | | `keyed`: one allowance per key (API key, tenant), created on first use, evicted when settled, store names derived from the key under a secret | `blake3` |
//! | `dialects` | | providers' rate-limit headers beyond `Retry-After`/`retry-after-ms` in `signals`: the IETF `RateLimit` fields, GitHub, OpenAI, Anthropic, and the odds seed's `X-RateLimit-*`; they also fill `Snapshot::rate_limit` and the advertised policy an adaptive rate follows | `sfv` (RFC 9651 structured fields) |
//! | `cost` | | `cost`: `CostLayer`, which sets each request's [`Cost`] from a header, the body size or a function (without it, insert [`Cost`] yourself) | nothing |
//! | `rule` | | `rule`: the rule's internals (every op, reply, parameter, constant and step function), for stores that re-implement it rather than call [`State::apply`](store::State::apply) (the Redis crate's Lua); outside semver | nothing |
//! | `adaptive` | | `AdaptiveRate` and `AllowanceConfig::with_adaptive_rate`: a rate found and followed when nobody states the limit (without it the rule's `adaptive.rs` is a fixed-rate twin; the Redis crate builds with it) | nothing |
//! | `quota` | | `quota`: the quota-exhaustion probe (`AllowanceBuilder::quota_probe`), one lease per group through the store | nothing |
//!
//! The default build is the core: admission, cooldown, retry, the stores' rule and the
//! memory store, and `Retry-After` and `retry-after-ms` ([`retry_after`] is the one
//! `Retry-After` parser).
//!
//! The Redis store is a separate crate, `tower-allowance-redis`; the conformance suite every
//! [`Store`](store::Store) must pass is another, `tower-allowance-conformance` (a
//! dev-dependency for store authors).

#![cfg_attr(docsrs, feature(doc_cfg))]

// A middleware's accessors of its inner service (`get_ref`, `get_mut`, `into_inner`), as
// tower's own middleware have them; expanded in each middleware's `impl` block.
macro_rules! inner_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// Unwraps the inner service.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}

mod acquire;
mod allowance;
mod config;
mod extensions;
mod layer;
mod outcome;
mod shared;

pub mod admission;
pub mod body;
pub mod classify;
pub mod cooldown;
#[cfg(feature = "cost")]
pub mod cost;
pub mod error;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod guide;
#[cfg(feature = "axum")]
pub mod inbound;
#[cfg(feature = "keyed")]
pub mod keyed;
#[cfg(feature = "lease")]
pub mod lease;
#[cfg(feature = "quota")]
pub mod quota;
pub mod retry;
#[cfg(feature = "rule")]
pub mod rule;
#[cfg(not(feature = "rule"))]
mod rule;
#[cfg(feature = "shares")]
pub mod shares;
// The header readers: public with `dialects` (the providers' readers, `Dialect`, `Reading`);
// without it the cooldown reads `Retry-After` and `retry-after-ms` through them, and
// `retry_after` is the one public piece.
#[cfg(feature = "dialects")]
pub mod signals;
#[cfg(not(feature = "dialects"))]
mod signals;
pub mod store;

#[cfg(feature = "dialects")]
pub use crate::allowance::RateLimitObservation;
#[cfg(feature = "serde")]
pub use crate::allowance::{AllowanceSpec, MemorySpec, OpenStore};
#[cfg(feature = "adaptive")]
pub use crate::config::adaptive::AdaptiveRate;
pub use crate::{
    acquire::Acquire,
    allowance::{AbandonedCounts, Allowance, AllowanceBuilder, ClosedState, Snapshot},
    config::{AllowanceConfig, Limit, OutagePolicy, ReplenishingBudget, RetryBudgetConfig},
    error::ConfigError,
    extensions::{AcquireOptions, Attempt, Cost, Deadline},
    layer::AllowanceLayer,
    outcome::Outcome,
    rule::MAX_DELAY,
    signals::retry_after,
};

/// The boxed error type the layers return, as in tower.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
