//! A Redis-backed [`Store`](tower_allowance::store::Store) for `tower-allowance`: one
//! allowance shared by every process that uses the same API key.
//!
//! An `Allowance` in memory coordinates only the tasks of one process; two processes with
//! their own allowances spend the key twice over. [`RedisStore`] keeps the allowance's state
//! in Redis and decides each admission, cooldown, budget deposit and state read with one
//! atomic Lua call on the Redis server's clock (`FCALL` of a Redis 7 function library loaded
//! at connect; `EVALSHA` of the same code where the server has no Functions or refuses them),
//! applying exactly the rules of the in-memory store. It plugs into the same layers, unchanged, through
//! [`Allowance::with_store`](tower_allowance::Allowance::with_store).
//!
//! ```no_run
//! use std::{num::NonZeroU32, time::Duration};
//! use tower_allowance::{Allowance, AllowanceConfig, AllowanceLayer};
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
//! let _layer = allowance.layer();
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `tls` | `rediss://` URLs through rustls (ring provider), a private CA and a client certificate in [`RedisStoreOptions`] |
//! | `cluster` | Redis Cluster: `RedisStore::connect_cluster`, `RedisStore::from_cluster_connection` |
//! | `test-util` | `test_util`: private `redis-server`s (plain, TLS, a 3-node cluster) and a test clock |
//!
//! # TLS
//!
//! With the `tls` feature, a `rediss://` URL connects over TLS 1.2 or 1.3 through rustls,
//! verifying the server's certificate against the operating system's roots (managed Redis
//! services), or against a CA of your own with `RedisStoreOptions::tls_ca_cert` (a Redis
//! you run, with `tls-port`). `RedisStoreOptions::tls_client_cert` presents a client
//! certificate to a server that requires one (`tls-auth-clients yes`). The event subscription
//! and the test clock's blocking connection use the same TLS settings.
//!
//! ```no_run
//! # #[cfg(feature = "tls")]
//! # async fn tls() -> Result<(), tower_allowance::BoxError> {
//! use tower_allowance_redis::{RedisStore, RedisStoreOptions};
//!
//! let options = RedisStoreOptions::new().tls_ca_cert(std::fs::read("/etc/redis/ca.crt")?);
//! let store = RedisStore::connect("rediss://:secret@redis.internal:6380/", "billing-api", options)
//!     .await?;
//! # drop(store);
//! # Ok(())
//! # }
//! ```
//!
//! A certificate that the trusted roots do not vouch for, or a client certificate the server
//! refuses, is [`ConnectErrorKind::Refused`](error::ConnectErrorKind::Refused) (and
//! [`CallErrorKind::Refused`](error::CallErrorKind::Refused) on a call): a configuration error,
//! never an outage, never masked by the local fallback. A PEM that cannot be parsed, or TLS
//! options with a `redis://` URL, is
//! [`ConnectErrorKind::InvalidTls`](error::ConnectErrorKind::InvalidTls). Unless the
//! application installed a rustls crypto provider, ring is installed as the process default
//! on the first connection.
//!
//! # Redis Cluster
//!
//! With the `cluster` feature, `RedisStore::connect_cluster` takes the seed nodes' URLs.
//! Every key of an allowance is in its name's hash slot (`ta:{name}:s`), so each call runs
//! (`FCALL`; the library is loaded on every primary) on the primary owning that slot, in one
//! round trip, and the cluster
//! connection follows `MOVED`/`ASK` and failovers by itself. Events use plain `PUBLISH`, which
//! the cluster bus delivers to subscribers on every node: the subscription sits on the first
//! seed node that answers. Allowances spread over the nodes by name, all over one cluster
//! connection. It is the same [`RedisStore`] type: nothing above the store knows.
//!
//! ```no_run
//! # #[cfg(feature = "cluster")]
//! # async fn cluster() -> Result<(), tower_allowance::BoxError> {
//! use tower_allowance_redis::{RedisStore, RedisStoreOptions};
//!
//! let seeds = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/", "redis://10.0.0.3:7000/"];
//! let billing = RedisStore::connect_cluster(seeds, "billing-api", RedisStoreOptions::new()).await?;
//! let search = billing.for_allowance("search-api")?; // another slot, the same connection
//! # drop(search);
//! # Ok(())
//! # }
//! ```
//!
//! # Connections
//!
//! Each constructor call makes (or takes) one command connection, multiplexed, and one
//! subscription connection for events. [`RedisStore::for_allowance`] makes the store of
//! another allowance over both: a hundred allowances (one per API key, say) are still two
//! connections at the server. An application that already has a connection passes it in:
//! [`RedisStore::from_connection`] takes a [`redis::aio::ConnectionManager`],
//! `RedisStore::from_cluster_connection` a cluster connection, each with the
//! [`redis::Client`] to subscribe with (`None`: this process does not hear other processes'
//! cooldowns while it holds reserved slots; the next admission still sees them).
//! These two take `redis` types, so this crate's `redis` version is part of its API.
//!
//! ```no_run
//! # async fn byo() -> Result<(), tower_allowance::BoxError> {
//! use tower_allowance_redis::{RedisStore, RedisStoreOptions};
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let conn = redis::aio::ConnectionManager::new(client.clone()).await?;
//! let store = RedisStore::from_connection(conn, Some(client), "billing-api", RedisStoreOptions::new())
//!     .await?;
//! # drop(store);
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! One HASH per allowance, `ta:{name}:s`, holding the token bucket's theoretical arrival
//! time, the cooldown deadline and the retry budget, packed in four fields (`b`, `u`, `q`,
//! `a`: each a group of little-endian doubles, exact integers below 2^53), so that an
//! admission reads one field and writes one; and `k`, the configuration in force on the
//! name (its limits, retry budget, longest cooldown, adaptive rate) with its version (the
//! server's time when the process that brought it first decided). **The newest
//! configuration decides for every process on the name**: a process started later with other
//! limits (a rolling deploy, a provider's new tier, a downgrade too) takes the name over in
//! the atomic call of its first decision; the processes started before decide with it from
//! their next call on, in the same call, and log it once at INFO. Nobody is refused, and no
//! two limits are spent at once. A process that must not follow another configuration sets
//! [`RedisStoreOptions::pin_config`] and is refused instead
//! ([`CallErrorKind::ConfigMismatch`](error::CallErrorKind::ConfigMismatch), naming both in
//! the units configured). `Allowance::clear()` resets the state and keeps the configuration in
//! force. A process restarted with an old configuration is the newest too: roll back by
//! deploying the old configuration, not by keeping old processes running.
//!
//! A retry budget lives in the hash as long as the key: a **fixed budget** (one batch's
//! retries) is spent across every run that uses the name until the key expires, `idle_ttl`
//! (default one hour) after its last write. Start each batch with `Allowance::clear()` (which
//! gives the budget back), or give each batch its own name, or a short
//! [`RedisStoreOptions::idle_ttl`].
//!
//! # Permissions
//!
//! An ACL user needs `FUNCTION LOAD` and `FCALL` (or, where Functions are refused, `SCRIPT
//! LOAD` and `EVALSHA`) and the keys `ta:{name}:*`, and `PUBLISH` and `SUBSCRIBE` on the
//! channel `ta:{name}:ev` (Redis 7 gives new users no channel: grant `&ta:{name}:ev` or
//! `&ta:*`): `ACL SETUSER app on >secret +function|load +fcall +publish +subscribe ~ta:*
//! &ta:*`. [`RedisStore::connect`] tries loading the library (then the script), `PUBLISH`
//! and `SUBSCRIBE` and fails with
//! [`ConnectErrorKind::MissingPermission`](error::ConnectErrorKind::MissingPermission)
//! naming the missing one and that fix; the first decision tries `FCALL` (or `EVALSHA`) and the keys. A
//! password changed under a running store fails every caller at once with the refusal, until
//! Redis accepts a call again. A server that wants a password the URL does not give is
//! refused at connect (an authenticated `PING` goes first), never taken for an outage. A
//! password rotated on the server while the connection lives is a WARN within
//! [`RedisStoreOptions::reauth_interval`] (a fresh connection authenticates every minute), not
//! an outage at the next reconnect. The `{name}` hash tag keeps every key of
//! an allowance in one Redis Cluster slot; names are restricted by [`validate_name`] so that
//! no name can break out of its tag. Every write sets a TTL covering what the key must
//! remember plus an idle margin ([`RedisStoreOptions::idle_ttl`]); nothing grows per client.
//!
//! # Time
//!
//! The clock is the Redis server's `TIME`, read inside each script, in microseconds. Deadlines
//! stay in server time and travel to clients only as durations to wait, so no decision
//! compares two machines' clocks (only a call's validity is bounded on the server's clock:
//! see below). Run it on real time: under a paused tokio clock
//! (`start_paused`), the runtime auto-advances to the per-call timeout as soon as it idles
//! waiting on the socket, and every call would time out.
//!
//! # Clock steps
//!
//! `TIME` is a wall clock: NTP or an operator can step it. When a call finds it earlier than
//! the last time the allowance's key saw, the script moves every stored instant back by the
//! difference before deciding (`rule::rebase`), so a step back of an hour does not add an
//! hour to any wait, cooldown or reserved slot; reservations made before the step are
//! translated when they are released. The time between the key's last call before the step
//! and its first call after it cannot be seen and counts as none: a wait grows by that gap,
//! which is at most about one interval for an allowance in use, and for a key idle before the
//! step at most the wait it had at its last call (that wait starts over). A step forward
//! looks like time passing: cooldowns end early by the step and the bucket refills, so up to
//! one burst goes out at once; reserved slots already handed out are kept by their holders
//! on their own clocks. Keep Redis hosts on a slewing NTP client (chrony, ntpd) to avoid
//! steps altogether.
//!
//! # Calls that arrive late
//!
//! A call that times out here ([`RedisStoreOptions::timeout`]) may still reach Redis and run
//! later: a partition that delays packets, a paused or overloaded server. So every call
//! carries when it was sent and until when it is valid (the timeout after it was sent), on the
//! server's clock, and the script decides what a late call may still do:
//!
//! - **refused, unapplied**, when it takes from the bucket or reserves for its caller (an
//!   admission, first attempt or retry, a class's admission, a lease grant, the quota probe's
//!   lease, a read with deposits, `clear`, an advertised rate): its caller has gone, so it
//!   reserves nothing for nobody. The caller saw a timeout ([`error::CallErrorKind::Timeout`],
//!   the store unavailable), never a success;
//! - **applied late, counted from when it was sent**, when it raises a cooldown or a closure
//!   (`Defer`, a 429's `Throttle`, `Close`, a quota probe's `retry_in`): extend-only, so one
//!   whose end has passed changes nothing, and one still running reaches every process and
//!   ends when it would have. Refusing it would leave the other processes sending into a
//!   `Retry-After` that still runs;
//! - **applied as it is**, when it gives back (a release, a settlement): refusing it would
//!   leave its reservation behind.
//!
//! The server's clock is learnt without a round trip of its own: every reply ends with it,
//! and a store reads `TIME` once at its first decision, before any script call (for the
//! configuration version; on a cluster, from the key's primary). A reply read at `server` to
//! a call sent at local `t` gives `server - t`, at least the clocks' offset; the least of the
//! last two 10 s windows, plus 2 ms for drift, bounds the offset from above. The
//! bound is conservative: when the client gives up on a call, the server's clock reads at most
//! its valid-until, so a call the client still waits for is never refused because of the
//! estimate. Should one be (the server's clock stepped forward), its reply carries the
//! server's clock: the store learns it afresh and sends the call once more, within the same
//! timeout. What remains is a window of about one one-way latency (the best sample's, plus
//! the 2 ms): a call may still run that long after its caller gave up, its store's first
//! calls included.
//!
//! # When Redis fails
//!
//! Every call has a short timeout ([`RedisStoreOptions::timeout`]); after a failure, calls
//! skip Redis until the next probe is due, so nothing queues behind an outage. Then the
//! [`FailurePolicy`] decides: fail closed (the layers return
//! [`StoreUnavailable`](tower_allowance::error::StoreUnavailable)) or fall back to a
//! conservative in-process allowance. The connection reconnects by itself, and a
//! `FUNCTION FLUSH`, a `SCRIPT FLUSH` or a Redis restart only costs a transparent reload. A restart of a
//! Redis without persistence (or an eviction of the key) forgets the state: no cooldown, a
//! full retry budget, and a new generation that the processes holding the old state hear of;
//! their holders ask again and their bucket starts empty (only a process that knew no state
//! finds it full), so the group does not send a burst on top of the lost slots.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod access;
mod circuit;
mod config_check;
mod connect;
mod events;
mod fallback;
mod gate;
mod link;
mod options;
mod reauth;
mod scripts;
#[cfg(feature = "serde")]
mod spec;
mod store;
mod validity;

pub mod error;
#[cfg(feature = "test-util")]
pub mod test_util;

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use crate::spec::{RedisSpec, StoreSpec};
pub use crate::{
    options::{FailurePolicy, RedisStoreOptions, DEFAULT_TIMEOUT},
    store::{validate_name, RedisStore},
};
