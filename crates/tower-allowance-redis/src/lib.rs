//! A Redis-backed [`Store`](tower_allowance::store::Store) for `tower-allowance`: one
//! allowance shared by every process that uses the same API key.
//!
//! An `Allowance` in memory coordinates only the tasks of one process; two processes with
//! their own allowances spend the key twice over. [`RedisStore`] keeps the allowance's state
//! in Redis and decides each admission, cooldown, budget deposit and state read with one
//! atomic Lua script on the Redis server's clock, applying exactly the rules of the
//! in-memory store. It plugs into the same layers, unchanged, through
//! [`Allowance::with_store`](tower_allowance::Allowance::with_store).
//!
//! ```no_run
//! use std::{num::NonZeroU32, time::Duration};
//! use tower_allowance::{retry::RetryConfig, Allowance, AllowanceConfig, AllowanceLayer};
//! use tower_allowance_redis::{FailurePolicy, RedisStore, RedisStoreOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let options = RedisStoreOptions::new()
//!     .timeout(Duration::from_millis(250))
//!     .failure_policy(FailurePolicy::LocalFallback {
//!         expected_processes: NonZeroU32::new(4).expect("non-zero"),
//!     });
//! let store = RedisStore::connect("redis://127.0.0.1:6379/", "billing-api", options).await?;
//! let allowance = Allowance::with_store(AllowanceConfig::per_second(10, 5)?, store);
//! let _layer = AllowanceLayer::new(allowance, RetryConfig::default());
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! One HASH per allowance, `ta:{name}:s`, holding the token bucket's theoretical arrival
//! time, the cooldown deadline and the retry budget. The `{name}` hash tag keeps every key of
//! an allowance in one Redis Cluster slot; names are restricted by [`validate_name`] so that
//! no name can break out of its tag. Every write sets a TTL covering what the key must
//! remember plus an idle margin ([`RedisStoreOptions::idle_ttl`]); nothing grows per client.
//!
//! # Time
//!
//! The clock is the Redis server's `TIME`, read inside each script, in microseconds. Deadlines
//! stay in server time and travel to clients only as durations to wait, so no two machines'
//! clocks are ever compared. Run it on real time: under a paused tokio clock
//! (`start_paused`), the runtime auto-advances to the per-call timeout as soon as it idles
//! waiting on the socket, and every call would time out.
//!
//! # When Redis fails
//!
//! Every call has a short timeout ([`RedisStoreOptions::timeout`]); after a failure, calls
//! skip Redis until the next probe is due, so nothing queues behind an outage. Then the
//! [`FailurePolicy`] decides: fail closed (the layers return
//! [`StoreUnavailable`](tower_allowance::error::StoreUnavailable)) or fall back to a
//! conservative in-process allowance. The connection reconnects by itself, and a
//! `SCRIPT FLUSH` or a Redis restart only costs a transparent script reload. A restart of a
//! Redis without persistence (or an eviction of the key) forgets the state: the next
//! admissions see a full bucket, no cooldown and a full retry budget.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod events;
mod link;
mod options;
mod scripts;
mod store;

pub mod error;
#[cfg(feature = "test-util")]
pub mod test_util;

pub use crate::{
    options::{FailurePolicy, RedisStoreOptions, DEFAULT_TIMEOUT},
    store::{validate_name, RedisStore},
};
