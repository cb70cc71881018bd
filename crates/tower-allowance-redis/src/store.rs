//! The Redis store: one script call per decision, a timeout and a failure policy around it.

use std::{
    fmt,
    future::Future,
    num::NonZeroU32,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use redis::{
    aio::{ConnectionManager, ConnectionManagerConfig},
    ErrorKind, ServerErrorKind,
};
use tokio::{sync::Notify, time::Instant};
use tower_allowance::{
    rule::{Event, Op, Params, Reply},
    store::{MemoryStore, Store, StoreError, StoreFuture, Watcher},
    AllowanceConfig, ConfigError, Limit, ReplenishingBudget, RetryBudgetConfig, MAX_DELAY,
};

use crate::{
    access, config_check,
    error::{CallError, CallErrorKind, ConnectError, ConnectErrorKind, InvalidName, RedisCause},
    events::{Events, Listener},
    link::{self, Conn, Link},
    scripts::{self, ApplyScript, BadReply},
    FailurePolicy, RedisStoreOptions,
};

/// Longest allowance name.
const MAX_NAME_LEN: usize = 64;

/// Checks an allowance name: 1 to 64 characters from `A-Z a-z 0-9 _ . : -`.
///
/// Anything else (braces, spaces, control characters, other Unicode) could break the key's
/// `{name}` hash tag or collide with another allowance's keys, so it is refused rather
/// than escaped.
///
/// ```
/// use tower_allowance_redis::validate_name;
///
/// assert!(validate_name("billing-api:eu.1").is_ok());
/// for bad in ["", "a}b", "a b", "{x}", "tab\there"] {
///     assert!(validate_name(bad).is_err(), "{bad:?}");
/// }
/// ```
///
/// # Errors
///
/// [`InvalidName`] with the rule broken.
pub fn validate_name(name: &str) -> Result<(), InvalidName> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(InvalidName::new("length must be 1 to 64 characters"));
    }
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-');
    if name.bytes().all(allowed) {
        Ok(())
    } else {
        Err(InvalidName::new(
            "only A-Z, a-z, 0-9 and _ . : - are allowed",
        ))
    }
}

/// The key of an allowance's state: one HASH, in the `{name}` hash slot.
fn state_key(name: &str) -> String {
    format!("ta:{{{name}}}:s")
}

/// The channel an allowance's events are published on.
fn event_channel(name: &str) -> String {
    format!("ta:{{{name}}}:ev")
}

/// One allowance's state in Redis, shared by every process that connects with the same name.
///
/// Plug it into the layers with
/// [`Allowance::with_store`](tower_allowance::Allowance::with_store). Each operation is one
/// Lua script run atomically on the Redis server against its own clock (`TIME`), applying
/// `tower_allowance::rule` transcribed (`src/lua/`, one file per rule file): the same decisions as the
/// [`MemoryStore`], checked by the same conformance suite. In the steady state an admission
/// costs one round trip, whether it is admitted now or given a reserved slot: `FCALL` of a
/// function library loaded at connect (Redis 7 Functions), or `EVALSHA` where the server has
/// no Functions or refuses them (an older Redis, an ACL); after a `FUNCTION FLUSH`, a
/// `SCRIPT FLUSH` or a Redis restart the library or script is reloaded transparently.
///
/// Cooldowns and closures are published on the allowance's channel (`ta:{name}:ev`); every
/// store subscribes to it, so callers holding reserved slots in other processes move (or
/// fail) without asking.
///
/// ```no_run
/// use tower_allowance::{Allowance, AllowanceConfig, RetryBudgetConfig};
/// use tower_allowance_redis::{RedisStore, RedisStoreOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// let store =
///     RedisStore::connect("redis://127.0.0.1:6379/", "billing-api", RedisStoreOptions::new())
///         .await?;
/// let config = AllowanceConfig::per_second(10, 5)?.with_retry_budget(RetryBudgetConfig::fixed(20));
/// let allowance = Allowance::with_store(config, store.clone());
/// allowance.acquire().await?;
/// assert_eq!(store.round_trips(), 2); // connect: 1 (FUNCTION LOAD); admission: 1
/// # Ok(())
/// # }
/// ```
///
/// # Clone
///
/// Cloning is cheap and shares the connection, counters and fallback state. Separate
/// [`connect`](Self::connect) calls make separate connections (as separate processes would).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    name: String,
    key: String,
    pub(crate) channel: String,
    /// The connection, shared with the stores made by [`RedisStore::for_allowance`].
    link: Arc<Link>,
    script: ApplyScript,
    /// Whether calls are `FCALL`s (the library is loaded) rather than `EVALSHA`s; shared by
    /// the stores over one connection.
    functions: Arc<AtomicBool>,
    circuit: Circuit,
    /// The local allowance used under [`FailurePolicy::LocalFallback`].
    fallback: Option<(NonZeroU32, MemoryStore)>,
    watchers: Mutex<Vec<Watcher>>,
    /// Whether the store has registered with the event subscription.
    subscribed: AtomicBool,
    /// Whether operations go ahead: set once the channel is first subscribed (or waiting for
    /// that timed out). Until then an operation waits, so that nothing it reserves can miss
    /// an event.
    gate_open: AtomicBool,
    /// Wakes the operations waiting at the gate.
    gate_opened: Notify,
    /// When the configuration is next checked against the one in Redis (`config_check`), in
    /// the circuit's microseconds; 0: before the first decision.
    config_check_at: AtomicU64,
    #[cfg(feature = "test-util")]
    test: TestClock,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("RedisStore")
            .field("name", &inner.name)
            .field("key", &inner.key)
            .field("url", &inner.link.redacted)
            .field("cluster", &self.is_cluster())
            .field("options", &inner.link.options)
            .field("round_trips", &self.round_trips())
            .field("degraded", &inner.circuit.degraded.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// Connects to the Redis server at `url` for the allowance called `name`, and loads the
    /// script.
    ///
    /// `url` is `redis://[user][:password@]host[:port][/db]`, or `rediss://...` for TLS
    /// (feature `tls`; see `RedisStoreOptions::tls_ca_cert` for a private CA). The
    /// connection is a multiplexed [`ConnectionManager`] that reconnects by itself; this
    /// store never needs to be rebuilt after an outage. A second connection carries the
    /// event subscription.
    ///
    /// # Errors
    ///
    /// A [`ConnectError`]: `name` refused by [`validate_name`]; a URL that cannot be used
    /// ([`ConnectErrorKind::InvalidUrl`]) or TLS options that cannot
    /// ([`ConnectErrorKind::InvalidTls`]); Redis refusing us (a wrong password, a missing ACL
    /// permission, a bad database index, an untrusted certificate:
    /// [`ConnectErrorKind::Refused`], never masked by the local fallback); or, unless the
    /// policy is [`FailurePolicy::LocalFallback`], Redis not answering within the connect
    /// timeout ([`ConnectErrorKind::Unreachable`]).
    pub async fn connect(
        url: &str,
        name: &str,
        options: RedisStoreOptions,
    ) -> Result<Self, ConnectError> {
        validate_name(name).map_err(|e| ConnectError::new(ConnectErrorKind::InvalidName, e))?;
        let client = link::client(url, &options)?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout.max(options.connect_timeout)))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
            .map_err(|e| ConnectError::new(ConnectErrorKind::InvalidUrl, RedisCause(e)))?;
        let link = Link {
            conn: Conn::Single(conn),
            events: Events::new(vec![client.clone()], options.connect_timeout),
            redacted: link::redact(url),
            round_trips: AtomicU64::new(0),
            #[cfg(feature = "test-util")]
            blocking: Some(link::Blocking::Single(client)),
            options,
        };
        Self::start(link, name).await
    }

    /// Connects to a Redis Cluster through any of its nodes (`urls`: one or more seed
    /// nodes, `redis://` or `rediss://` alike), for the allowance called `name`, and loads
    /// the script on every primary.
    ///
    /// The allowance's keys share one hash slot (`ta:{name}:...`), so each script call goes
    /// to the primary that owns the slot, in one round trip; the connection follows slot
    /// migrations and failovers (`MOVED`, `ASK`) by itself. Events are published with plain
    /// `PUBLISH`, which the cluster bus forwards to every node: the subscription sits on the
    /// first seed node that answers.
    ///
    /// Unlike [`connect`](Self::connect), the cluster must answer here once (its slot map is
    /// read), whatever the failure policy; after that the failure policy applies as usual.
    ///
    /// ```no_run
    /// use tower_allowance::{Allowance, AllowanceConfig};
    /// use tower_allowance_redis::{RedisStore, RedisStoreOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/", "redis://10.0.0.3:7000/"];
    /// let store = RedisStore::connect_cluster(nodes, "billing-api", RedisStoreOptions::new()).await?;
    /// let allowance = Allowance::with_store(AllowanceConfig::per_second(10, 5)?, store);
    /// allowance.acquire().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect); [`ConnectErrorKind::InvalidUrl`] also for an empty
    /// list, or seed nodes with different passwords or TLS modes; and
    /// [`ConnectErrorKind::Unreachable`] when no seed node answers within the connect
    /// timeout, whatever the failure policy.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn connect_cluster<I, U>(
        urls: I,
        name: &str,
        options: RedisStoreOptions,
    ) -> Result<Self, ConnectError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        validate_name(name).map_err(|e| ConnectError::new(ConnectErrorKind::InvalidName, e))?;
        let urls: Vec<U> = urls.into_iter().collect();
        let nodes = urls
            .iter()
            .map(|url| link::client(url.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        let client = link::cluster_client(&nodes, &options)
            .map_err(|e| ConnectError::new(ConnectErrorKind::InvalidUrl, RedisCause(e)))?;
        let conn = with_timeout(options.connect_timeout, client.get_async_connection())
            .await
            .map_err(|e| ConnectError::new(ConnectErrorKind::Unreachable, e))?
            .map_err(|e| {
                let kind = if crate::error::is_outage(&e) {
                    ConnectErrorKind::Unreachable
                } else {
                    ConnectErrorKind::Refused
                };
                ConnectError::new(kind, RedisCause(e))
            })?;
        let redacted = urls
            .iter()
            .map(|u| link::redact(u.as_ref()))
            .collect::<Vec<_>>()
            .join(", ");
        let link = Link {
            conn: Conn::Cluster(conn),
            events: Events::new(nodes, options.connect_timeout),
            redacted,
            round_trips: AtomicU64::new(0),
            #[cfg(feature = "test-util")]
            blocking: Some(link::Blocking::Cluster(client)),
            options,
        };
        Self::start(link, name).await
    }

    /// A store over a connection the application already has: a [`ConnectionManager`] it
    /// built (with its own TLS, credentials, timeouts, RESP3...) and shares with the rest of
    /// the program. This store, and every one made from it by
    /// [`for_allowance`](Self::for_allowance), sends its script calls over that connection.
    ///
    /// `events` is the client to subscribe to the allowance's events with (a subscribed
    /// connection cannot send commands in RESP2, so it is a connection of its own, shared by
    /// every allowance made from this store). With `None`, this process hears no other
    /// process's cooldowns while it holds reserved slots: its holders still send at their
    /// slots, and the next admission after a cooldown sees it. Give one unless every
    /// process of the allowance is this one.
    ///
    /// ```no_run
    /// use redis::aio::ConnectionManager;
    /// use tower_allowance_redis::{RedisStore, RedisStoreOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let conn = ConnectionManager::new(client.clone()).await?;
    /// // The application keeps using `conn` for its own commands.
    /// let store =
    ///     RedisStore::from_connection(conn, Some(client), "billing-api", RedisStoreOptions::new())
    ///         .await?;
    /// let search = store.for_allowance("search-api")?; // same connection
    /// # drop(search);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// The options' timeouts, probe interval, TTL and failure policy apply; its TLS options
    /// do not (the connection is made already).
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect): an invalid name, Redis refusing the script load, or
    /// (unless the policy is [`FailurePolicy::LocalFallback`]) not answering within the
    /// connect timeout.
    pub async fn from_connection(
        conn: ConnectionManager,
        events: Option<redis::Client>,
        name: &str,
        options: RedisStoreOptions,
    ) -> Result<Self, ConnectError> {
        validate_name(name).map_err(|e| ConnectError::new(ConnectErrorKind::InvalidName, e))?;
        let redacted = events.as_ref().map_or_else(
            || "(connection brought by the caller)".to_owned(),
            |c| link::describe(c.get_connection_info()),
        );
        let link = Link {
            conn: Conn::Single(conn),
            #[cfg(feature = "test-util")]
            blocking: events.clone().map(link::Blocking::Single),
            events: Events::new(events.into_iter().collect(), options.connect_timeout),
            redacted,
            round_trips: AtomicU64::new(0),
            options,
        };
        Self::start(link, name).await
    }

    /// A store over a cluster connection the application already has, as
    /// [`from_connection`](Self::from_connection) for a single server. `events` is a client
    /// for any node of the cluster (plain `PUBLISH` reaches every node).
    ///
    /// ```no_run
    /// use redis::cluster::ClusterClient;
    /// use tower_allowance_redis::{RedisStore, RedisStoreOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"];
    /// let conn = ClusterClient::new(nodes)?.get_async_connection().await?;
    /// let events = redis::Client::open(nodes[0])?;
    /// let store =
    ///     RedisStore::from_cluster_connection(conn, Some(events), "billing-api", RedisStoreOptions::new())
    ///         .await?;
    /// # drop(store);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_connection`](Self::from_connection).
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn from_cluster_connection(
        conn: redis::cluster_async::ClusterConnection,
        events: Option<redis::Client>,
        name: &str,
        options: RedisStoreOptions,
    ) -> Result<Self, ConnectError> {
        validate_name(name).map_err(|e| ConnectError::new(ConnectErrorKind::InvalidName, e))?;
        let redacted = events.as_ref().map_or_else(
            || "(cluster connection brought by the caller)".to_owned(),
            |c| link::describe(c.get_connection_info()),
        );
        #[cfg(feature = "test-util")]
        let blocking = events
            .as_ref()
            .and_then(|c| link::cluster_client(std::slice::from_ref(c), &options).ok())
            .map(link::Blocking::Cluster);
        let link = Link {
            conn: Conn::Cluster(conn),
            #[cfg(feature = "test-util")]
            blocking,
            events: Events::new(events.into_iter().collect(), options.connect_timeout),
            redacted,
            round_trips: AtomicU64::new(0),
            options,
        };
        Self::start(link, name).await
    }

    /// The store for `name` over `link`, once the script is loaded (or, under the local
    /// fallback, once Redis failed to answer).
    async fn start(link: Link, name: &str) -> Result<Self, ConnectError> {
        let store = Self::over(Arc::new(link), name, Arc::new(AtomicBool::new(true)));
        let inner = &store.inner;
        let timeout = inner.link.options.connect_timeout;
        let tls = inner.link.redacted.starts_with("rediss://");
        match inner.preload(timeout).await {
            Ok(()) => {
                // Every other permission the store needs, tried once (see `access`).
                if let Some(client) = inner.link.events.source() {
                    access::check(client, &inner.channel, timeout).await?;
                }
                Ok(store)
            }
            Err(e) if e.store_kind() == tower_allowance::store::StoreErrorKind::Rejected => {
                let no_perm = std::error::Error::source(&e)
                    .and_then(|c| c.downcast_ref::<RedisCause>())
                    .filter(|c| access::is_no_perm(&c.0));
                Err(match no_perm {
                    Some(cause) => access::no_script_load(
                        &cause.0,
                        &access::user_of(inner.link.events.source()),
                    ),
                    None => ConnectError::new(ConnectErrorKind::Refused, access::hinted(e, tls)),
                })
            }
            Err(e) if inner.fallback.is_some() => {
                inner.circuit.failed(&e, &inner.name, inner.policy_name());
                Ok(store)
            }
            Err(e) => Err(ConnectError::new(
                ConnectErrorKind::Unreachable,
                access::hinted(e, tls),
            )),
        }
    }

    /// A store for `name` (already validated) over `link`.
    fn over(link: Arc<Link>, name: &str, functions: Arc<AtomicBool>) -> Self {
        let options = &link.options;
        let fallback = match options.failure_policy {
            FailurePolicy::Report => None,
            FailurePolicy::LocalFallback { expected_processes } => {
                Some((expected_processes, MemoryStore::new()))
            }
        };
        Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                key: state_key(name),
                channel: event_channel(name),
                circuit: Circuit::new(options.probe_interval),
                script: ApplyScript::new(),
                functions,
                fallback,
                watchers: Mutex::new(Vec::new()),
                subscribed: AtomicBool::new(false),
                gate_open: AtomicBool::new(false),
                gate_opened: Notify::new(),
                config_check_at: AtomicU64::new(0),
                #[cfg(feature = "test-util")]
                test: TestClock::default(),
                link,
            }),
        }
    }

    /// A store for another allowance over the same connection: many allowances (one per API
    /// key, say) share one command connection, one event subscription and the options.
    ///
    /// Nothing is sent to Redis here: the script is already loaded on that connection.
    ///
    /// # Errors
    ///
    /// [`InvalidName`] when `name` is refused by [`validate_name`].
    pub fn for_allowance(&self, name: &str) -> Result<Self, InvalidName> {
        validate_name(name)?;
        Ok(Self::over(
            self.inner.link.clone(),
            name,
            self.inner.functions.clone(),
        ))
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        match self.inner.link.conn {
            Conn::Single(_) => false,
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => true,
        }
    }

    /// The allowance's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The Redis key holding the allowance's state (one HASH, with a TTL).
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The channel the allowance's events are published on.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// The SHA1 of the script calls run as `EVALSHA` where the server has no Functions, as
    /// `SCRIPT LOAD` returns it: the same in every build, so `SCRIPT EXISTS <sha>` tells
    /// whether a server holds it.
    pub fn script_sha(&self) -> &str {
        self.inner.script.script().get_hash()
    }

    /// The function calls run as `FCALL` (`tower_allowance_` and 16 hex digits of the
    /// script's SHA1, which also names its library): one per version of the script, so that
    /// processes of different versions on one server each call their own.
    pub fn function_name(&self) -> &str {
        self.inner.script.function()
    }

    /// Whether calls are `FCALL`s of the function library (loaded at connect), rather than
    /// `EVALSHA`s of the script: `false` once the server refused the library (no Functions
    /// before Redis 7; an ACL without `FUNCTION` or `FCALL`). Shared by the stores over one
    /// connection.
    pub fn uses_functions(&self) -> bool {
        self.inner.functions.load(Ordering::Relaxed)
    }

    /// Round trips to Redis made over this store's connection so far (by this store, its
    /// clones and the stores made by [`for_allowance`](Self::for_allowance)): each command
    /// or pipeline sent counts once, including script reloads after `NOSCRIPT` (the event
    /// subscription, the permission check at connect and the configuration check of the
    /// first decision and every half `idle_ttl` are not counted: they decide nothing).
    pub fn round_trips(&self) -> u64 {
        self.inner.link.round_trips.load(Ordering::Relaxed)
    }

    /// Whether the last call failed (and calls are failing or falling back).
    pub fn is_degraded(&self) -> bool {
        self.inner.circuit.degraded.load(Ordering::Relaxed)
    }

    /// Test support: decide on tokio's clock instead of `TIME`, with a blocking connection
    /// that answers [`Store::try_apply`] synchronously. Under a paused tokio clock
    /// (`start_paused`) the store then decides exactly as a [`MemoryStore`] created at the
    /// same instant, and the runtime cannot auto-advance while a call is in flight; that is
    /// how the conformance suite runs the seed's scenarios through the real layers on Redis.
    ///
    /// The blocking connection is made like the store's own (TLS included; on a cluster, a
    /// blocking cluster connection). A store [`from_connection`](Self::from_connection)
    /// needs its `events` client for it.
    ///
    /// # Errors
    ///
    /// When the blocking connection cannot be made.
    #[cfg(feature = "test-util")]
    pub fn follow_tokio_clock(&self) -> Result<(), CallError> {
        let Some(blocking) = &self.inner.link.blocking else {
            let why: tower_allowance::BoxError =
                "no client to open a blocking connection with (from_connection without events)"
                    .into();
            return Err(CallError::with_source(CallErrorKind::Refused, why));
        };
        let conn = blocking.connect().map_err(CallError::redis)?;
        self.inner.test.follow(conn);
        Ok(())
    }

    /// Test support: moves the clock the scripts decide on back by `step` (a backward step of
    /// the Redis host's clock); only with [`RedisStore::follow_tokio_clock`].
    #[cfg(feature = "test-util")]
    pub fn step_clock_back(&self, step: Duration) {
        self.inner.test.step(step, false);
    }

    /// Test support: calls are `EVALSHA`s from now on, as against a server without Functions
    /// (for this store and every store over its connection), so that the conformance suite
    /// runs over both paths.
    #[cfg(feature = "test-util")]
    pub fn without_functions(&self) {
        self.inner.functions.store(false, Ordering::Relaxed);
    }

    /// Test support: moves the clock the scripts decide on forward by `step` (a forward step
    /// of the Redis host's clock, which this process's clock does not make); only with
    /// [`RedisStore::follow_tokio_clock`].
    #[cfg(feature = "test-util")]
    pub fn step_clock_forward(&self, step: Duration) {
        self.inner.test.step(step, true);
    }

    /// Runs one operation: Redis when it is expected to answer, else the failure policy.
    fn decide(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        self.ensure_subscribed();
        let cools = matches!(
            op,
            Op::Defer { .. } | Op::Throttle { .. } | Op::Close { .. } | Op::Clear
        );
        if let (true, Some((_, local))) = (cools, &self.inner.fallback) {
            // The local fallback hears of every cooldown, closure and clearing too (a
            // throttling response's cooldown comes as `Throttle`), so that it honours the
            // ones raised before an outage.
            if let Ok(local_params) = fallback_config(params, NonZeroU32::MIN) {
                let _ = local.try_apply(Instant::now(), local_params.params(), &op);
            }
        }
        let inner = self.inner.clone();
        let params = *params;
        Box::pin(async move {
            let result = match inner.circuit.check() {
                Check::Closed | Check::Probe => {
                    inner.until_listening().await;
                    match inner.check_config(&params, &op).await {
                        Ok(()) => inner.eval(&params, &op).await,
                        Err(e) => Err(e),
                    }
                }
                Check::Open => Err(inner.circuit.open_error()),
            };
            inner.settle(&params, &op, result)
        })
    }

    /// Starts the event subscription the first time the store is used from a runtime.
    fn ensure_subscribed(&self) {
        if self.inner.subscribed.load(Ordering::Relaxed) {
            return;
        }
        // Following tokio's clock (tests), the store answers synchronously and hears nothing
        // from other processes: a subscription would only add real I/O to a paused runtime.
        #[cfg(feature = "test-util")]
        if self.inner.test.following() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.subscribed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.link.events.register(&self.inner, &handle);
    }
}

impl Inner {
    /// The script's clock argument: none (the server's `TIME`) unless following tokio's clock.
    fn test_clock(&self) -> Option<u64> {
        #[cfg(feature = "test-util")]
        {
            self.test.now_us()
        }
        #[cfg(not(feature = "test-util"))]
        {
            None
        }
    }

    /// The store's first decision, and one every half `idle_ttl`: is the configuration the
    /// one every other process of the allowance uses (`config_check`)? One pipeline, not
    /// counted in [`RedisStore::round_trips`] (it decides nothing). After `Clear`, the key
    /// is deleted instead, and this process sets its configuration with its next decision.
    async fn check_config(&self, params: &Params, op: &Op) -> Result<(), CallError> {
        let now = self.circuit.now_us();
        let key = config_check::key(&self.name);
        let ttl = self.link.options.idle_ttl.max(Duration::from_secs(1));
        let mut conn = self.link.conn.clone();
        if matches!(op, Op::Clear) {
            let mut del = redis::cmd("DEL");
            del.arg(&key);
            with_timeout(self.link.options.timeout, del.query_async::<i64>(&mut conn))
                .await?
                .map_err(CallError::redis)?;
            self.config_check_at.store(0, Ordering::Relaxed);
            return Ok(());
        }
        if now < self.config_check_at.load(Ordering::Relaxed) {
            return Ok(());
        }
        let ours = config_check::describe(params);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&key)
            .arg(&ours)
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl))
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(millis(ttl))
            .ignore()
            .cmd("GET")
            .arg(&key);
        let read = pipe.query_async::<(Option<String>,)>(&mut conn);
        let (theirs,) = with_timeout(self.link.options.timeout, read)
            .await?
            .map_err(|e| self.call_error(e))?;
        match theirs {
            Some(theirs) if theirs != ours => Err(CallError::with_source(
                CallErrorKind::ConfigMismatch,
                format!(
                    "this process: {ours}; the processes already using it ({key}): {theirs}; \
                     give each configuration its own allowance name, or clear() the \
                     allowance to let the next process set a new one"
                ),
            )),
            _ => {
                let every = u64::try_from(ttl.as_micros() / 2).unwrap_or(u64::MAX);
                self.config_check_at
                    .store(now.saturating_add(every), Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// A decision's Redis error; a `NOPERM` names the permission and the fix.
    fn call_error(&self, e: redis::RedisError) -> CallError {
        let user = access::user_of(self.link.events.source());
        match access::no_evalsha(&e, &self.name, &user) {
            Some(missing) => CallError::with_source(CallErrorKind::Refused, missing),
            None => CallError::redis(e),
        }
    }

    /// One operation, one round trip: `FCALL` of the library's function, or `EVALSHA` of the
    /// script where the server has no Functions. When the function is missing (`FUNCTION
    /// FLUSH`, a restarted or failed-over server without it) the library is loaded again and
    /// the call retried (should it vanish again in between, the script settles the call);
    /// when the server refuses the library or the call (an ACL), calls turn to the script for
    /// good. When the script is missing (`SCRIPT FLUSH`, ...) `redis`
    /// loads it and retries; should it vanish again in between, `EVAL` with the source settles
    /// it. All within one timeout.
    async fn eval(&self, params: &Params, op: &Op) -> Result<Reply, CallError> {
        let argv = scripts::argv(
            op,
            params,
            millis(self.link.options.idle_ttl),
            &self.channel,
            self.test_clock(),
        );
        let mut conn = self.link.connection();
        let call = async {
            if let Some(reply) = self.call_function(&mut conn, &argv).await {
                return reply;
            }
            let mut invocation = self.script.script().prepare_invoke();
            invocation.key(&self.key);
            invocation.arg(&argv[..]);
            match invocation.invoke_async::<Vec<i64>>(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    redis::cmd("EVAL")
                        .arg(self.script.source())
                        .arg(1)
                        .arg(&self.key)
                        .arg(&argv[..])
                        .query_async::<Vec<i64>>(&mut conn)
                        .await
                }
                other => other,
            }
        };
        let reply = with_timeout(self.link.options.timeout, call)
            .await?
            .map_err(|e| self.call_error(e))?;
        scripts::decode(op, &reply)
            .map_err(|BadReply| CallError::new(CallErrorKind::UnexpectedReply))
    }

    /// `FCALL` of the library's function, loaded again if it is missing; `None` when the
    /// script is to settle the call: the server refuses Functions (then for good), or the
    /// library vanished again right after it was loaded.
    async fn call_function(
        &self,
        conn: &mut link::CountingConnection<'_>,
        argv: &[scripts::Arg<'_>],
    ) -> Option<redis::RedisResult<Vec<i64>>> {
        if !self.functions.load(Ordering::Relaxed) {
            return None;
        }
        let mut fcall = redis::cmd("FCALL");
        fcall
            .arg(self.script.function())
            .arg(1)
            .arg(&self.key)
            .arg(argv);
        match fcall.query_async::<Vec<i64>>(conn).await {
            Err(e) if missing_function(&e) => {}
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) => {
                self.functions.store(false, Ordering::Relaxed);
                return None;
            }
            other => return Some(other),
        }
        match self.script.load_library().query_async::<String>(conn).await {
            Ok(_) => {}
            Err(e) if refused(&e) => {
                self.functions.store(false, Ordering::Relaxed);
                return None;
            }
            Err(e) => return Some(Err(e)),
        }
        match fcall.query_async::<Vec<i64>>(conn).await {
            Err(e) if missing_function(&e) => None,
            other => Some(other),
        }
    }

    /// The answer, or the failure policy's: a refusal is never masked; an outage is decided
    /// locally under [`FailurePolicy::LocalFallback`], else reported as unavailable.
    fn settle(
        &self,
        params: &Params,
        op: &Op,
        result: Result<Reply, CallError>,
    ) -> Result<Reply, StoreError> {
        match result {
            Ok(reply) => {
                self.circuit.succeeded(&self.name);
                Ok(reply)
            }
            Err(e) => {
                self.circuit.failed(&e, &self.name, self.policy_name());
                if e.store_kind() != tower_allowance::store::StoreErrorKind::Unavailable {
                    return Err(e.into_store_error());
                }
                let Some((processes, local)) = &self.fallback else {
                    return Err(e.into_store_error());
                };
                let local_params = fallback_config(params, *processes).map_err(|c| {
                    StoreError::rejected(CallError::with_source(CallErrorKind::Fallback, c))
                })?;
                match local.try_apply(Instant::now(), local_params.params(), op) {
                    // The fallback's events are its own: other processes cannot hear them.
                    Some(reply) => reply.map(strip_event),
                    None => Err(e.into_store_error()),
                }
            }
        }
    }

    /// Loads the function library (one round trip), or, where the server refuses it (no
    /// Functions before Redis 7, an ACL), the script (a second).
    async fn preload(&self, timeout: Duration) -> Result<(), CallError> {
        let mut conn = self.link.connection();
        let load = async {
            match self
                .script
                .load_library()
                .query_async::<String>(&mut conn)
                .await
            {
                Ok(_) => {
                    self.functions.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if refused(&e) => self.functions.store(false, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(self.script.source());
            cmd.query_async::<String>(&mut conn).await.map(drop)
        };
        with_timeout(timeout, load).await?.map_err(CallError::redis)
    }

    fn policy_name(&self) -> &'static str {
        match self.fallback {
            Some(_) => "decide locally at a divided rate",
            None => "report the outage (the allowance waits for redis)",
        }
    }
}

/// `FCALL` of a function the server does not hold (its libraries were flushed, or it
/// restarted or failed over without them).
fn missing_function(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// The server answered with an error (an unknown command, `NOPERM`, ...), not a lost
/// connection: Functions are not to be had there.
fn refused(e: &redis::RedisError) -> bool {
    e.code().is_some()
}

/// A reply without the event it carried (decided by the local fallback).
fn strip_event(reply: Reply) -> Reply {
    match reply {
        Reply::Defer(mut d) => {
            d.event = None;
            Reply::Defer(d)
        }
        Reply::ProbeFinished(_) => Reply::ProbeFinished(None),
        other => other,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn with_timeout<T>(timeout: Duration, fut: impl Future<Output = T>) -> Result<T, CallError> {
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| CallError::timeout(timeout))
}

/// The conservative local allowance: every limit's rate and burst divided by the expected
/// processes; no retries from a fixed budget (what the others spent is unknown).
fn fallback_config(params: &Params, processes: NonZeroU32) -> Result<AllowanceConfig, ConfigError> {
    let n = u64::from(processes.get());
    let limit = |interval_us: u64, tolerance_us: u64| {
        // `interval * n` per unit; a burst of `burst / n`, at least one. Exact: the params
        // carry the headroom already.
        let burst = (tolerance_us / interval_us.max(1)).max(1);
        let per = Duration::from_micros(interval_us.saturating_mul(n)).min(MAX_DELAY);
        Limit::new(
            1,
            per,
            u32::try_from((burst / n).max(1)).unwrap_or(u32::MAX),
        )
        .map(Limit::exact)
    };
    let Some((main, extra_limits)) = params.limits().split_first() else {
        // A validated configuration always has its main limit; nothing is admitted without.
        return AllowanceConfig::new(1, MAX_DELAY, 1);
    };
    let first = limit(main.interval_us(), main.tolerance_us())?;
    let mut config = AllowanceConfig::new(first.rate(), first.period(), first.burst())?.exact();
    for extra in extra_limits {
        let mut l = limit(extra.interval_us(), extra.tolerance_us())?;
        if extra.unit() == tower_allowance::rule::Unit::Cost {
            l = l.counting_cost();
        }
        config = config.with_limit(l)?;
    }
    let budget = match params.budget() {
        tower_allowance::rule::BudgetParams::Unlimited => RetryBudgetConfig::Unlimited,
        tower_allowance::rule::BudgetParams::Fixed { .. } => RetryBudgetConfig::fixed(0),
        tower_allowance::rule::BudgetParams::Replenishing {
            slot_us,
            reserve,
            per_mille,
        } => {
            let window = Duration::from_micros(slot_us.saturating_mul(10));
            let per_sec = reserve.saturating_mul(1_000_000) / window.as_micros().max(1) as u64 / n;
            RetryBudgetConfig::Replenishing(ReplenishingBudget::new(
                window,
                u32::try_from(per_sec).unwrap_or(u32::MAX),
                per_mille as f64 / 1000.0,
            )?)
        }
    };
    config
        .with_retry_budget(budget)
        .with_max_cooldown(Duration::from_micros(params.max_cooldown_us().max(1)))
}

impl Store for RedisStore {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        self.decide(params, op)
    }

    #[cfg(feature = "test-util")]
    fn try_apply(
        &self,
        _now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        // Following tokio's clock (tests): a blocking call, so that a paused runtime cannot
        // auto-advance while it is in flight.
        let result = self.inner.test.eval_blocking(&self.inner, params, op)?;
        Some(self.inner.settle(params, op, result))
    }

    /// The allowance's name: `Allowance::with_store(config, store)` logs and counts under it.
    fn name(&self) -> Option<&str> {
        Some(&self.inner.name)
    }

    fn watch(&self, watcher: Watcher) {
        self.inner
            .watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(watcher);
        self.ensure_subscribed();
    }
}

impl Inner {
    /// Waits, before the store's first operation, until its channel is subscribed, for at
    /// most the connect timeout: whatever that operation reserves then hears every event
    /// published after its reply, and no catch-up read is needed. A store that hears no
    /// events (none were asked for, or it follows tokio's clock) never waits.
    async fn until_listening(&self) {
        if self.gate_open.load(Ordering::Acquire)
            || !self.subscribed.load(Ordering::Acquire)
            || !self.link.events.enabled()
        {
            return;
        }
        let timeout = self.link.options.connect_timeout;
        let opened = async {
            loop {
                let notified = self.gate_opened.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                if self.gate_open.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(timeout, opened).await.is_err()
            && !self.gate_open.swap(true, Ordering::AcqRel)
        {
            self.gate_opened.notify_waiters();
            tracing::warn!(
                allowance = %self.name,
                ?timeout,
                "the event subscription is not up: deciding without it; other processes' \
                 cooldowns reach callers already waiting here only once it is"
            );
        }
    }
}

impl Listener for Inner {
    fn channel(&self) -> &str {
        &self.channel
    }

    /// The subscription confirmed this store's channel: operations go ahead. Returns whether
    /// they went ahead before (a subscription that came back, or one that was slower than the
    /// connect timeout): then events may have been missed, and the caller makes the store
    /// catch up.
    fn listening(&self) -> bool {
        let was_open = self.gate_open.swap(true, Ordering::AcqRel);
        if !was_open {
            self.gate_opened.notify_waiters();
        }
        was_open
    }

    /// Delivers an event to every watcher; forgets watchers whose allowance is gone.
    fn deliver(&self, event: Option<Event>) {
        let mut watchers = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        watchers.retain(|w| match event {
            Some(e) => w.notify(e),
            None => w.resync(),
        });
    }
}

/// What a call does about Redis.
enum Check {
    /// Healthy: ask Redis.
    Closed,
    /// Failing, and a probe is due: this call asks Redis.
    Probe,
    /// Failing: answer "unavailable" at once.
    Open,
}

/// Skips Redis for a while after a failure, so that calls never queue up behind an outage;
/// one caller per probe interval asks it again.
struct Circuit {
    epoch: Instant,
    probe_us: u64,
    /// Microseconds since `epoch` before which Redis is not tried; 0 when healthy.
    closed_until_us: AtomicU64,
    degraded: AtomicBool,
    /// The last refusal (a changed password, a revoked permission), until a call succeeds:
    /// calls skipped meanwhile fail with it at once, not as an outage to wait out.
    refusal: Mutex<Option<String>>,
}

impl Circuit {
    fn new(probe_interval: Duration) -> Self {
        Self {
            epoch: Instant::now(),
            probe_us: u64::try_from(probe_interval.as_micros()).unwrap_or(u64::MAX),
            closed_until_us: AtomicU64::new(0),
            degraded: AtomicBool::new(false),
            refusal: Mutex::new(None),
        }
    }

    /// What a call skipped while the circuit is open fails with: the refusal that opened it,
    /// else "unavailable".
    fn open_error(&self) -> CallError {
        let refusal = self
            .refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match refusal {
            Some(why) => CallError::with_source(CallErrorKind::Refused, why),
            None => CallError::new(CallErrorKind::Unavailable),
        }
    }

    fn now_us(&self) -> u64 {
        // +1 so that "now" is never the "healthy" marker 0.
        u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    fn check(&self) -> Check {
        let until = self.closed_until_us.load(Ordering::Acquire);
        if until == 0 {
            return Check::Closed;
        }
        let now = self.now_us();
        let won = now >= until
            && self
                .closed_until_us
                .compare_exchange(
                    until,
                    now.saturating_add(self.probe_us),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok();
        if won {
            Check::Probe
        } else {
            Check::Open
        }
    }

    fn succeeded(&self, name: &str) {
        if self.closed_until_us.load(Ordering::Acquire) != 0 {
            self.closed_until_us.store(0, Ordering::Release);
            *self.refusal.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        if self.degraded.load(Ordering::Acquire) && self.degraded.swap(false, Ordering::AcqRel) {
            tracing::info!(
                allowance = name,
                "redis answers again; allowance decisions are shared again"
            );
        }
    }

    fn failed(&self, error: &CallError, name: &str, policy: &'static str) {
        if error.kind() == CallErrorKind::Unavailable {
            return;
        }
        let next = self.now_us().saturating_add(self.probe_us);
        if error.store_kind() == tower_allowance::store::StoreErrorKind::Unavailable {
            self.closed_until_us.store(next, Ordering::Release);
        } else if error.kind() == CallErrorKind::Refused {
            // A refusal (a password changed under us, a permission revoked) fails every
            // caller at once with its cause, until a probe finds it lifted: not an outage
            // that callers wait out one probe at a time.
            let why = std::error::Error::source(error)
                .map_or_else(|| error.to_string(), ToString::to_string);
            let first = self
                .refusal
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .replace(why.clone())
                .is_none();
            self.closed_until_us.store(next, Ordering::Release);
            if first {
                tracing::error!(
                    allowance = name,
                    error = %why,
                    "redis refused the allowance's call (a changed password or a missing \
                     permission): every call fails with it until redis accepts one again"
                );
            }
        }
        if !self.degraded.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                allowance = name,
                error = %error,
                cause = ?std::error::Error::source(error).map(ToString::to_string),
                policy,
                "redis failed for the allowance"
            );
        }
    }
}

/// Test support: the clock the script decides on when it follows tokio's, and the blocking
/// connection that answers synchronously then.
#[cfg(feature = "test-util")]
#[derive(Default)]
struct TestClock {
    follow: Mutex<Option<(Instant, Box<dyn redis::ConnectionLike + Send>)>>,
    step_back_us: AtomicU64,
    step_forward_us: AtomicU64,
}

#[cfg(feature = "test-util")]
impl TestClock {
    fn follow(&self, conn: Box<dyn redis::ConnectionLike + Send>) {
        *self.follow.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), conn));
    }

    fn step(&self, step: Duration, forward: bool) {
        let total = if forward {
            &self.step_forward_us
        } else {
            &self.step_back_us
        };
        total.fetch_add(
            u64::try_from(step.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Microseconds on tokio's clock since following began, plus the steps forward, minus
    /// the steps back.
    fn now_us(&self) -> Option<u64> {
        let guard = self.follow.lock().unwrap_or_else(PoisonError::into_inner);
        let (epoch, _) = guard.as_ref()?;
        Some(self.clock_at(*epoch))
    }

    /// Microseconds since following began, as a [`MemoryStore`] created then counts them.
    fn clock_at(&self, epoch: Instant) -> u64 {
        let since = u64::try_from(Instant::now().saturating_duration_since(epoch).as_micros())
            .unwrap_or(u64::MAX);
        since
            .saturating_add(self.step_forward_us.load(Ordering::Relaxed))
            .saturating_sub(self.step_back_us.load(Ordering::Relaxed))
    }

    fn following(&self) -> bool {
        self.follow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    fn eval_blocking(
        &self,
        inner: &Inner,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, CallError>> {
        let mut guard = self.follow.lock().unwrap_or_else(PoisonError::into_inner);
        let (epoch, conn) = guard.as_mut()?;
        let now = self.clock_at(*epoch);
        let argv = scripts::argv(
            op,
            params,
            millis(inner.link.options.idle_ttl),
            &inner.channel,
            Some(now),
        );
        inner.link.round_trips.fetch_add(1, Ordering::Relaxed);
        let conn = &mut **conn;
        let reply = if inner.functions.load(Ordering::Relaxed) {
            // As `Inner::eval`: the function, loaded again if it is missing.
            let mut fcall = redis::cmd("FCALL");
            fcall
                .arg(inner.script.function())
                .arg(1)
                .arg(&inner.key)
                .arg(&argv[..]);
            match fcall.query::<Vec<i64>>(conn) {
                Err(e) if missing_function(&e) => inner
                    .script
                    .load_library()
                    .query::<String>(conn)
                    .and_then(|_| fcall.query::<Vec<i64>>(conn)),
                other => other,
            }
        } else {
            inner
                .script
                .script()
                .key(&inner.key)
                .arg(&argv[..])
                .invoke::<Vec<i64>>(conn)
        }
        .map_err(CallError::redis);
        Some(reply.and_then(|r| {
            scripts::decode(op, &r)
                .map_err(|BadReply| CallError::new(CallErrorKind::UnexpectedReply))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["a", "A-z_0.9:x", &"x".repeat(64)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        let too_long = "x".repeat(65);
        for bad in [
            "", "a}b", "a b", "{x}", "a{b", "a\nb", "a\0b", "é", "a/b", &too_long,
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(state_key("api"), "ta:{api}:s");
    }

    #[test]
    fn fallback_divides_the_rate() {
        let n = NonZeroU32::new(4).expect("non-zero");
        let config = AllowanceConfig::per_second(10, 6)
            .expect("valid")
            .with_retry_budget(RetryBudgetConfig::fixed(9));
        let local = fallback_config(config.params(), n).expect("valid");
        assert_eq!(local.interval(), Duration::from_millis(400));
        assert_eq!(local.burst(), 1);
        assert_eq!(local.retry_budget(), &RetryBudgetConfig::fixed(0));

        let budget = ReplenishingBudget::new(Duration::from_secs(10), 8, 0.2).expect("valid");
        let config = config.with_retry_budget(RetryBudgetConfig::Replenishing(budget));
        let local = fallback_config(config.params(), n).expect("valid");
        let RetryBudgetConfig::Replenishing(r) = local.retry_budget() else {
            panic!("still replenishing");
        };
        assert_eq!((r.min_per_sec(), r.ratio()), (2, 0.2));
    }
}
