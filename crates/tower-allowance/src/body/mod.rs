//! Request bodies a retry can send again, without `B: Clone`.
//!
//! A retry needs the request body a second time. [`Replayable`] is implemented for the
//! body types a client stack declares (`Full<Bytes>`, `BoxBody`, axum's and tonic's `Body`,
//! hyper's `Incoming`, ...) and gives back a body of the *same* type for each attempt, so
//! the inner service never sees a new body type. Bodies that cannot simply be cloned go
//! through a [`ReplayBody`]: the first attempt streams while a copy of up to a cap
//! (64 KiB by default, [`RetryConfig::replay_cap`](crate::retry::RetryConfig::replay_cap)) is kept, and a retry replays the copy byte for byte.
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{combinators::BoxBody, BodyExt, Full};
//! use tower_allowance::{body::Replayable, BoxError};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let body: BoxBody<Bytes, BoxError> =
//!     Full::new(Bytes::from_static(b"{\"order\":42}")).map_err(Into::into).boxed();
//!
//! // Once per request: the body for the first attempt, and a handle for the retries.
//! let (first, replay) = body.prepare(64 * 1024);
//! let replay = replay.ok_or("not replayable")?;
//! assert_eq!(first.collect().await?.to_bytes(), "{\"order\":42}");
//!
//! // A retry: the same type, the same bytes.
//! let second: BoxBody<Bytes, BoxError> = replay.body().ok_or("capped")?;
//! assert_eq!(second.collect().await?.to_bytes(), "{\"order\":42}");
//! # Ok(())
//! # }
//! ```
//!
//! # Why a copy with a cap, and not `B: Clone`
//!
//! Most request bodies are not `Clone`: a hyper `Incoming`, an axum or tonic `Body`, a
//! `BoxBody` are streams that can be read once. Requiring `Clone` rejects them at compile
//! time; buffering them whole before the first attempt would delay every request and hold
//! unbounded memory. Keeping a copy *while* the first attempt streams costs nothing in
//! latency, and the cap bounds the memory: a body larger than the cap is simply sent once,
//! and the response to that attempt is the answer. A server that answers 429 before reading
//! the whole body is handled too: the replay sends the copy, then takes over the part of
//! the original body that was never read (the design of linkerd2-proxy's `ReplayBody`).

mod error;
// `Replayable` for the frameworks' bodies, each behind its feature.
#[cfg(feature = "axum")]
mod impl_axum;
#[cfg(feature = "hyper")]
mod impl_hyper;
#[cfg(feature = "tonic")]
pub(crate) mod impl_tonic;
mod replay;
mod replayable;

pub(crate) use self::replay::DEFAULT_REPLAY_CAP;
pub use self::{
    error::{ReplayError, ReplayRefused},
    replay::ReplayBody,
    replayable::{Replay, Replayable},
};

#[cfg(test)]
mod tests;
