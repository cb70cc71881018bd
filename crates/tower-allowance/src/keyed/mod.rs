//! One allowance per key: a layer that picks each request's allowance from its API key, tenant
//! or host, out of a bounded registry that evicts idle allowances only when it is safe.
//!
//! A proxy or a multi-tenant backend holds one allowance per upstream credential. [`Keyed`]
//! creates each key's [`Allowance`](crate::Allowance) on first use (from a default
//! [`AllowanceConfig`](crate::AllowanceConfig) or a per-key override), keeps at most
//! `capacity` of them, and evicts those that have been idle. [`KeyedLayer`] reads each
//! request's key with a [`KeyFn`](key::KeyFn) (a header such as `X-API-Key` or
//! `Authorization`, the host, or a function) and sends the request through that key's stack
//! (Retry → Cooldown → Admission, as [`AllowanceLayer`](crate::AllowanceLayer)).
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{keyed::{key, Keyed, KeyedConfig, KeyedLayer}, AllowanceConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let keyed = Keyed::new(KeyedConfig::new(AllowanceConfig::per_second(10, 10)?));
//! let client = ServiceBuilder::new()
//!     .layer(KeyedLayer::new(keyed.clone(), key::api_key()))
//!     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new("ok")) });
//!
//! for tenant in ["key-a", "key-b", "key-a"] {
//!     let request = Request::builder().header("x-api-key", tenant).body(String::new())?;
//!     client.clone().oneshot(request).await?;
//! }
//! assert_eq!(keyed.get("key-a")?.allowance().snapshot().admitted, 2);
//! assert_eq!(keyed.len(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! # Names, stores and secrets
//!
//! Each key's allowance is named by a keyed hash of the key under a [`KeySecret`]
//! (`{prefix}:{32 hex digits}`, BLAKE3 in keyed mode, 128 bits kept): the name is what the
//! store sees (a Redis key `ta:{name}:s`, its event channel) and what logs print, so an API key
//! never reaches Redis, a log line or a `Debug` output. Stores come from a [`StoreFactory`]:
//! [`MemoryStores`] by default, or any `Fn(&str) -> Result<impl Store, E>`, such as
//! `RedisStore::for_allowance` over one connection, wrapped in [`SharedStores`]. Processes that
//! share per-key allowances in Redis must use the same secret.
//!
//! # Eviction
//!
//! Evicting an allowance must never let more through than keeping it would have: the next
//! request for that key gets a new allowance, and a new allowance is fresh (full buckets, no
//! cooldown, a whole retry budget). So an allowance is evicted only when
//!
//! 1. **nothing in this process holds it**: no request is in flight through it (none waits for
//!    a reserved slot, none is between a 429 and its retry), no [`KeyedAllowance`] handle is
//!    held, and no clone of its [`Allowance`](crate::Allowance) lives (one taken from a handle
//!    into a plain layer, say). A caller waiting for a slot holds a reservation that only this
//!    allowance knows of: evicting it would let a new allowance hand the same slot out again;
//!    and a clone still admits and raises cooldowns on it, which a new allowance would not
//!    see; and
//! 2. **its state is settled, as good as fresh**, unless the store keeps it for the next handle
//!    ([`StoreFactory::state_outlives_store`], true for [`SharedStores`]: Redis keeps the
//!    buckets, the cooldown and the budget under the same name, so condition 1 suffices):
//!    - **no cooldown, not closed**, however it was raised (a 429's `Retry-After`, a success
//!      saying the quota is spent until a reset, a wait beyond `max_cooldown`, `extend_cooldown()`): a
//!      fresh allowance would send at once;
//!    - **every bucket full again, no reservation pending**: with a per-day limit, up to a
//!      day after its latest admission (a fresh bucket would hand out the day's allowance
//!      again);
//!    - **a fixed retry budget never spent from**: a fresh one would have every retry back, so
//!      an allowance that spent from one is kept for good (or until it is safe in a shared
//!      store); a replenishing budget, until its window no longer counts a retry;
//!    - **an adaptive rate grown back to its ceiling**, and capped by no rate a server
//!      advertised.
//!
//! The store answers this from the state itself, by the rule
//! ([`rule::is_settled`](crate::rule::is_settled), through
//! [`Store::is_settled`](crate::store::Store::is_settled)): nothing is inferred from the
//! operations that went through it, so every way of raising a cooldown is covered. A store that
//! cannot tell without I/O says no: its allowances are evicted only if its factory says their
//! state outlives the store. An idle timeout
//! ([`KeyedConfig::with_idle_timeout`]) keeps allowances in active use from being churned;
//! when the registry is full, a new key evicts any allowance that is safe to evict, and
//! when none is, it fails at once with [`RegistryFull`] rather than exceed the bound or
//! evict unsafely.
//!
//! # Recipes
//!
//! **An LLM API**: requests per minute *and* tokens per minute, each request charged the
//! tokens it declares (a `cost::CostLayer`, feature `cost`, above the keyed layer), one
//! allowance per API key:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{HeaderName, Request, Response};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{
//!     cost::CostLayer,
//!     keyed::{key, Keyed, KeyedConfig, KeyedLayer},
//!     AllowanceConfig, Limit,
//! };
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! // Tier 1: 500 RPM and 30,000 TPM; a bigger tier for one key.
//! let tier = |rpm, tpm| -> Result<AllowanceConfig, tower_allowance::ConfigError> {
//!     AllowanceConfig::per_minute(rpm, rpm)?.with_limit(Limit::per_minute(tpm, tpm)?.counting_cost())
//! };
//! let keyed = Keyed::new(
//!     KeyedConfig::new(tier(500, 30_000)?).with_override("sk-tier-4", tier(10_000, 2_000_000)?),
//! );
//! let client = ServiceBuilder::new()
//!     .layer(CostLayer::from_header(HeaderName::from_static("x-token-estimate")))
//!     .layer(KeyedLayer::new(keyed, key::authorization()))
//!     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new("ok")) });
//!
//! let request = Request::builder()
//!     .header("authorization", "Bearer sk-tier-1")
//!     .header("x-token-estimate", "2400")
//!     .body(String::new())?;
//! client.oneshot(request).await?;
//! # Ok(())
//! # }
//! ```
//!
//! **A per-second plus a per-day limit** (the Odds API's shape: a request rate and a daily
//! or monthly credit count): both in one allowance, admitted all-or-nothing. Once the day's
//! credits are spent, the next slot is hours away; give requests a
//! [`Deadline`](crate::Deadline) so they fail at once (with
//! [`AbandonReason::Deadline`](crate::error::AbandonReason::Deadline)) rather than wait:
//!
//! ```
//! use std::time::Duration;
//! use tower_allowance::{error::AbandonReason, AcquireOptions, Allowance, AllowanceConfig, Limit};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let config = AllowanceConfig::per_second(10, 10)?.with_limit(Limit::per_day(20, 20)?)?;
//! let allowance = Allowance::new(config);
//! let patient = || AcquireOptions::new().deadline(tokio::time::Instant::now() + Duration::from_secs(30));
//! for _ in 0..20 {
//!     allowance.acquire_with(patient()).await?; // 10 at once, 10 more within a second
//! }
//! let refused = allowance.acquire_with(patient()).await;
//! assert_eq!(refused.err().and_then(|e| e.abandon_reason()), Some(AbandonReason::Deadline));
//! # Ok(())
//! # }
//! ```
//!
//! **A per-tenant proxy**: each tenant's inbound key maps to its own upstream credential and
//! allowance; a tenant flooding its key waits in its own queue and never delays another's
//! (see `examples/keyed_proxy.rs` for the axum version):
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{keyed::{key, Keyed, KeyedConfig, KeyedLayer}, AllowanceConfig};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let keyed = Keyed::new(KeyedConfig::new(AllowanceConfig::per_second(2, 2)?).with_capacity(1_000)?);
//! let upstream = ServiceBuilder::new()
//!     .layer(KeyedLayer::new(keyed, key::header(http::HeaderName::from_static("x-tenant"))))
//!     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new("ok")) });
//!
//! let start = tokio::time::Instant::now();
//! let request = |tenant: &str| Request::builder().header("x-tenant", tenant).body(String::new());
//! // "noisy" sends 10 at once: its own queue takes 4.01 s to drain (one at once, the
//! // burst's second 10 ms later as headroom, see `Limit`, the rest 500 ms apart).
//! let mut noisy = Vec::new();
//! for _ in 0..10 {
//!     noisy.push(tokio::spawn(upstream.clone().oneshot(request("noisy")?)));
//! }
//! tokio::task::yield_now().await;
//! // "quiet" is served at once all the same.
//! upstream.clone().oneshot(request("quiet")?).await?;
//! assert_eq!(start.elapsed(), std::time::Duration::ZERO);
//! for n in noisy { n.await??; }
//! assert_eq!(start.elapsed(), std::time::Duration::from_millis(4_010));
//! # Ok(())
//! # }
//! ```

mod error;
pub mod future;
pub mod key;
mod layer;
mod name;
mod registry;
mod service;
mod store;

pub use self::{
    error::{KeyedError, RegistryFull},
    layer::KeyedLayer,
    name::{KeySecret, MAX_PREFIX_LEN},
    registry::{
        Keyed, KeyedAllowance, KeyedBuilder, KeyedConfig, KeyedStats, DEFAULT_CAPACITY,
        DEFAULT_IDLE_TIMEOUT,
    },
    service::KeyedService,
    store::{MemoryStores, SharedStores, StoreFactory},
};
