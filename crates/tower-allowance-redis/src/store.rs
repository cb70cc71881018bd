//! The Redis store: one script call per decision, with the circuit breaker, the
//! subscription gate, the configuration check and the failure policy around it.
//!
//! A decision goes `decide` → the circuit (`circuit`: skip Redis while it fails) → the gate
//! (`gate`: the first one waits for the event subscription) → the configuration check
//! (`config_check`) → `eval` (one `FCALL` or `EVALSHA`) → `settle` (the answer, or the
//! failure policy's: the local fallback, `fallback`). The constructors are in `connect`.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use redis::{ErrorKind, ServerErrorKind};
#[cfg(feature = "test-util")]
use tokio::time::Instant;
use tower_allowance::{
    rule::{Event, Op, Params, Reply},
    store::{self, Store, StoreError, StoreErrorKind, StoreFuture, Watcher},
};

use crate::{
    access,
    circuit::{Check, Circuit},
    config_check::{self, ConfigCheck},
    error::{CallError, CallErrorKind, ConnectError, ConnectErrorKind, InvalidName, RedisCause},
    events::Listener,
    fallback::Fallback,
    gate::Gate,
    link::{self, millis, with_timeout, Conn, Link},
    scripts::{self, ApplyScript, BadReply},
    validity::ServerClock,
};

#[cfg(feature = "test-util")]
mod test_clock;

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
/// `tower_allowance::rule` transcribed (`src/lua/`, one file per rule file): the same
/// decisions as the [`MemoryStore`](tower_allowance::store::MemoryStore), checked by the same
/// conformance suite (`tower-allowance-conformance`). In the steady state an admission
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

struct Inner {
    name: String,
    key: String,
    channel: String,
    /// The connection, shared with the stores made by [`RedisStore::for_allowance`].
    link: Arc<Link>,
    script: ApplyScript,
    /// Whether calls are `FCALL`s (the library is loaded) rather than `EVALSHA`s; shared by
    /// the stores over one connection.
    functions: Arc<AtomicBool>,
    circuit: Circuit,
    /// The local allowance used under [`FailurePolicy::LocalFallback`](crate::FailurePolicy::LocalFallback).
    fallback: Option<Fallback>,
    watchers: Mutex<Vec<Watcher>>,
    /// Whether the store has registered with the event subscription.
    subscribed: AtomicBool,
    /// Whether operations go ahead: open once the channel is first subscribed (or waiting for
    /// that timed out). Until then an operation waits, so that nothing it reserves can miss
    /// an event.
    gate: Gate,
    /// Whether the configuration is the one every process of the allowance uses.
    config_check: ConfigCheck,
    /// The server's clock as replies bound it: every call's valid-until (`validity`).
    clock: ServerClock,
    /// Test support: the clock the script decides on when it follows tokio's.
    #[cfg(feature = "test-util")]
    test: test_clock::TestClock,
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
            .field("degraded", &inner.circuit.is_degraded())
            .finish_non_exhaustive()
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// The store for `name` over `link`, once the script is loaded (or, under the local
    /// fallback, once Redis failed to answer).
    pub(crate) async fn start(link: Link, name: &str) -> Result<Self, ConnectError> {
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
            Err(e) if e.store_kind() == StoreErrorKind::Rejected => {
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
        Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                key: state_key(name),
                channel: event_channel(name),
                circuit: Circuit::new(options.probe_interval),
                script: ApplyScript::new(),
                functions,
                fallback: Fallback::new(options.failure_policy),
                watchers: Mutex::new(Vec::new()),
                subscribed: AtomicBool::new(false),
                gate: Gate::new(),
                config_check: ConfigCheck::new(options.pin_config),
                clock: ServerClock::new(),
                #[cfg(feature = "test-util")]
                test: test_clock::TestClock::default(),
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
        self.inner.circuit.is_degraded()
    }

    /// Runs one operation: Redis when it is expected to answer, else the failure policy.
    fn decide(&self, params: &Params, op: Op) -> StoreFuture<store::Reply> {
        self.ensure_subscribed();
        if let Some(fallback) = &self.inner.fallback {
            // The local fallback hears of every cooldown, closure and clearing too, so that
            // it honours the ones raised before an outage.
            fallback.hear(params, &op);
        }
        let inner = self.inner.clone();
        let params = *params;
        Box::pin(async move {
            let result = match inner.circuit.check() {
                Check::Closed | Check::Probe => {
                    inner.until_listening().await;
                    let version = inner.config_check.version(|| inner.server_time()).await;
                    match version {
                        Ok(v) => inner.eval(&params, &op, Some(v)).await,
                        Err(e) => Err(e),
                    }
                }
                Check::Open => Err(inner.circuit.open_error()),
            };
            inner.settle(&params, &op, result).map(store::Reply::from)
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
        crate::reauth::start(&self.inner.link, &handle);
    }
}

impl Store for RedisStore {
    fn apply(&self, params: &store::Params, op: store::Op) -> StoreFuture<store::Reply> {
        self.decide(params.rule(), op.into())
    }

    #[cfg(feature = "test-util")]
    fn try_apply(
        &self,
        _now: Instant,
        params: &store::Params,
        op: &store::Op,
    ) -> Option<Result<store::Reply, StoreError>> {
        // Following tokio's clock (tests): a blocking call, so that a paused runtime cannot
        // auto-advance while it is in flight.
        let (params, op) = (params.rule(), op.rule());
        let result = self.inner.test.eval_blocking(&self.inner, params, op)?;
        Some(
            self.inner
                .settle(params, op, result)
                .map(store::Reply::from),
        )
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

// === impl Inner ===

impl Inner {
    /// The script's clock argument: none (the server's `TIME`) unless following tokio's clock.
    fn script_clock(&self) -> Option<u64> {
        #[cfg(feature = "test-util")]
        {
            self.test.now_us()
        }
        #[cfg(not(feature = "test-util"))]
        {
            None
        }
    }

    /// Waits, before the store's first operation, until its channel is subscribed, for at
    /// most the connect timeout: whatever that operation reserves then hears every event
    /// published after its reply, and no catch-up read is needed. A store that hears no
    /// events (none were asked for, or it follows tokio's clock) never waits.
    async fn until_listening(&self) {
        if self.gate.is_open()
            || !self.subscribed.load(Ordering::Acquire)
            || !self.link.events.enabled()
        {
            return;
        }
        let timeout = self.link.options.connect_timeout;
        self.gate.wait(timeout, &self.name).await;
    }

    /// The server's `TIME`, asked at the store's first decision for its configuration version
    /// (`config_check`), of the node its script runs on; not counted in the round trips (it
    /// decides nothing). It teaches the store the server's clock too, so that its first
    /// script call already carries a valid-until (`validity`): one held past its timeout after
    /// that `TIME` (a failover's write pause holds scripts, not `TIME`; a partition) reserves
    /// nothing for a caller who has gone.
    /// Not when the script decides on tokio's clock (test support): `TIME` is not that clock.
    async fn server_time(&self) -> Result<u64, CallError> {
        let sent = self.clock.local_us();
        let server = with_timeout(self.link.options.timeout, self.link.time(&self.key))
            .await?
            .map_err(|e| self.call_error(e))?;
        if self.script_clock().is_none() {
            self.clock.learn(sent, server, false);
        }
        Ok(server)
    }

    /// A decision's Redis error; a `NOPERM` names the permission and the fix.
    fn call_error(&self, e: redis::RedisError) -> CallError {
        access::call_error(e, &self.name, self.link.events.source())
    }

    /// One operation, one round trip: `FCALL` of the library's function, or `EVALSHA` of the
    /// script where the server has no Functions. When the function is missing (`FUNCTION
    /// FLUSH`, a restarted or failed-over server without it) the library is loaded again and
    /// the call retried (should it vanish again in between, the script settles the call);
    /// when the server refuses the library or the call (an ACL), calls turn to the script for
    /// good. When the script is missing (`SCRIPT FLUSH`, ...) `redis`
    /// loads it and retries; should it vanish again in between, `EVAL` with the source settles
    /// it. All within one timeout.
    async fn eval(
        &self,
        params: &Params,
        op: &Op,
        version: Option<u64>,
    ) -> Result<Reply, CallError> {
        let mut argv = scripts::argv(
            op,
            params,
            millis(self.link.options.idle_ttl),
            &self.channel,
            self.script_clock(),
        );
        if let (Some(v), Some(scripts::Arg::Params(text))) = (version, argv.get_mut(2)) {
            self.config_check.append(text, v);
        }
        let mut conn = self.link.connection();
        let timeout = self.link.options.timeout;
        // Given up on at `deadline` (local): valid until then on the server's clock (`validity`).
        let first = self.clock.local_us();
        let deadline = first.saturating_add(u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX));
        let call = async {
            let mut again = false;
            loop {
                let sent = self.clock.local_us();
                scripts::stamp(&mut argv, self.clock.stamp(sent, deadline));
                let reply = self.invoke(&mut conn, &argv).await?;
                let Ok((server, answer)) = scripts::split(&reply) else {
                    return Ok(Err(CallError::new(CallErrorKind::UnexpectedReply)));
                };
                // Refused as late while this caller still waits: the server's clock is ahead
                // of the bound (a step). Learnt afresh, sent once more.
                self.clock.learn(sent, server, answer.is_none());
                match answer {
                    Some(answer) => return Ok(Ok(answer.to_vec())),
                    None if !again => again = true,
                    None => return Ok(Err(CallError::timeout(timeout))),
                }
            }
        };
        let reply = with_timeout(timeout, call).await?.map_err(|e| {
            config_check::mismatch(&e, params, &self.name).unwrap_or_else(|| self.call_error(e))
        })??;
        scripts::decode(op, &reply)
            .map_err(|BadReply| CallError::new(CallErrorKind::UnexpectedReply))
    }

    /// One `FCALL`, or `EVALSHA` (then `EVAL` should the script be missing again).
    async fn invoke(
        &self,
        conn: &mut link::CountingConnection<'_>,
        argv: &[scripts::Arg<'_>],
    ) -> redis::RedisResult<Vec<i64>> {
        if let Some(reply) = self.call_function(conn, argv).await {
            return reply;
        }
        let mut invocation = self.script.script().prepare_invoke();
        invocation.key(&self.key);
        invocation.arg(argv);
        match invocation.invoke_async::<Vec<i64>>(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                redis::cmd("EVAL")
                    .arg(self.script.source())
                    .arg(1)
                    .arg(&self.key)
                    .arg(argv)
                    .query_async::<Vec<i64>>(conn)
                    .await
            }
            other => other,
        }
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
    /// locally under [`FailurePolicy::LocalFallback`](crate::FailurePolicy::LocalFallback), else reported as unavailable.
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
                if e.store_kind() != StoreErrorKind::Unavailable {
                    return Err(e.into_store_error());
                }
                let decided = self.fallback.as_ref().and_then(|f| f.decide(params, op));
                decided.unwrap_or_else(|| Err(e.into_store_error()))
            }
        }
    }

    /// Loads the function library (one round trip), or, where the server refuses it (no
    /// Functions before Redis 7, an ACL), the script (a second).
    async fn preload(&self, timeout: Duration) -> Result<(), CallError> {
        let mut conn = self.link.connection();
        // An authenticated cheap command first, uncounted: a server that wants a password
        // the URL does not give answers NOAUTH here, a refusal, rather than dropping the
        // connection on the library's ~17 KB (which would read as an outage, and be masked
        // by the local fallback).
        let mut raw = self.link.conn.clone();
        let ping = redis::cmd("PING");
        with_timeout(timeout, ping.query_async::<String>(&mut raw))
            .await?
            .map_err(CallError::redis)?;
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

impl Listener for Inner {
    fn channel(&self) -> &str {
        &self.channel
    }

    /// The subscription confirmed this store's channel: operations go ahead. Returns whether
    /// they went ahead before (a subscription that came back, or one that was slower than the
    /// connect timeout): then events may have been missed, and the caller makes the store
    /// catch up.
    fn listening(&self) -> bool {
        self.gate.open()
    }

    fn configured(&self, config: &str) {
        self.config_check.heard(&self.name, config);
    }

    /// Delivers an event to every watcher; forgets watchers whose allowance is gone.
    fn deliver(&self, event: Option<Event>) {
        let mut watchers = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        watchers.retain(|w| match event {
            Some(e) => w.notify(e.into()),
            None => w.resync(),
        });
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

    /// A call refused as late while its caller still waits (the server's clock stepped
    /// forward past the bound learnt) is sent once more, bounded afresh, and applied.
    #[cfg(feature = "test-util")]
    #[tokio::test]
    async fn a_call_refused_as_late_while_its_caller_waits_is_sent_again() {
        use tower_allowance::rule::{Admission, AdmitRequest};

        let redis = crate::test_util::TestRedis::start().await;
        let name = crate::test_util::unique_name("step");
        let store = RedisStore::connect(redis.url(), &name, crate::RedisStoreOptions::new())
            .await
            .expect("connect");
        let config = tower_allowance::AllowanceConfig::per_second(10, 5).expect("valid");
        let params = config.params().rule();
        let admit = Op::Admit(AdmitRequest::first());
        assert!(matches!(
            store.inner.eval(params, &admit, None).await.expect("up"),
            Reply::Admit(Admission::Admitted)
        ));
        // As if the server's clock had jumped ahead since the last reply: the bound learnt
        // is decades behind it, and the call's valid-until long past when it arrives.
        let local = store.inner.clock.local_us();
        store.inner.clock.learn(local, 1, true);
        let before = store.round_trips();
        assert!(matches!(
            store
                .inner
                .eval(params, &admit, None)
                .await
                .expect("sent again"),
            Reply::Admit(Admission::Admitted)
        ));
        assert_eq!(
            store.round_trips(),
            before + 2,
            "refused once, then applied"
        );
        store.inner.eval(params, &admit, None).await.expect("up");
        assert_eq!(store.round_trips(), before + 3, "learnt afresh");
    }
}
