//! The Redis store: one script call per decision, a timeout and a failure policy around it.

use std::{
    fmt,
    future::Future,
    num::NonZeroU32,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use redis::{
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    Cmd, ErrorKind, RedisFuture, ServerErrorKind, Value,
};
use tokio::time::Instant;
use tower_allowance::{
    store::{Admit, Decision, Deferred, MemoryStore, Store, StoreError, StoreFuture, StoreState},
    AllowanceConfig, ConfigError, ReplenishingBudget, RetryBudgetConfig, MAX_DELAY,
};

use crate::{
    error::{CallError, CallErrorKind, ConnectError, ConnectErrorKind, InvalidName, RedisCause},
    scripts::{self, BadReply, Op, Params, Scripts},
    FailurePolicy, RedisStoreOptions,
};

/// `Inner::test_clock_us` when no test clock is set.
const NO_TEST_CLOCK: u64 = u64::MAX;

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

/// A connection URL with any password (userinfo or query string) replaced by `***`.
fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, _)) => (before, "?***"),
        None => (rest, ""),
    };
    let authority_end = before_query.find('/').unwrap_or(before_query.len());
    let (authority, path) = before_query.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_owned(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{authority}{path}{query}"),
        None => format!("{authority}{path}{query}"),
    }
}

/// One allowance's state in Redis, shared by every process that connects with the same name.
///
/// Plug it into the layers with
/// [`Allowance::with_store`](tower_allowance::Allowance::with_store). Each decision is one
/// Lua script run atomically on the Redis server against its own clock (`TIME`), applying the
/// same rules as [`MemoryStore`]: admission (budget, then cooldown, then GCRA) in one step,
/// a cooldown that only moves later, an exact retry budget. In the steady state an admission
/// costs one round trip (`EVALSHA`); after a `SCRIPT FLUSH` or a Redis restart the script
/// is reloaded transparently.
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
/// assert_eq!(store.round_trips(), 2); // connect: 1 (script preload); admission: 1
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
    redacted_url: String,
    options: RedisStoreOptions,
    conn: ConnectionManager,
    scripts: Scripts,
    round_trips: Arc<AtomicU64>,
    /// A clock for the scripts instead of `TIME` (tests only); `NO_TEST_CLOCK` when unset.
    test_clock_us: AtomicU64,
    circuit: Circuit,
    /// The local allowance used under [`FailurePolicy::LocalFallback`].
    fallback: Option<(NonZeroU32, MemoryStore)>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("RedisStore")
            .field("name", &inner.name)
            .field("key", &inner.key)
            .field("url", &inner.redacted_url)
            .field("options", &inner.options)
            .field("round_trips", &self.round_trips())
            .field("degraded", &inner.circuit.degraded.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// Connects to Redis at `url` for the allowance called `name`, and loads the scripts.
    ///
    /// The connection is a multiplexed [`ConnectionManager`] that reconnects by itself; this
    /// store never needs to be rebuilt after an outage.
    ///
    /// # Errors
    ///
    /// A [`ConnectError`] when `name` is refused by [`validate_name`], the URL cannot be used,
    /// or (under [`FailurePolicy::FailClosed`]) Redis does not answer within the connect
    /// timeout. Under [`FailurePolicy::LocalFallback`] an unreachable Redis is not an error:
    /// the store starts on its fallback and switches to Redis when it answers.
    pub async fn connect(
        url: &str,
        name: &str,
        options: RedisStoreOptions,
    ) -> Result<Self, ConnectError> {
        validate_name(name).map_err(|e| ConnectError::new(ConnectErrorKind::InvalidName, e))?;
        let client = redis::Client::open(url)
            .map_err(|e| ConnectError::new(ConnectErrorKind::InvalidUrl, RedisCause(e)))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout.max(options.connect_timeout)))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, manager_config)
            .map_err(|e| ConnectError::new(ConnectErrorKind::InvalidUrl, RedisCause(e)))?;
        let fallback = match options.failure_policy {
            FailurePolicy::FailClosed => None,
            FailurePolicy::LocalFallback { expected_processes } => {
                Some((expected_processes, MemoryStore::new()))
            }
        };
        let store = Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                key: state_key(name),
                redacted_url: redact(url),
                circuit: Circuit::new(options.probe_interval),
                options,
                conn,
                scripts: Scripts::new(),
                round_trips: Arc::new(AtomicU64::new(0)),
                test_clock_us: AtomicU64::new(NO_TEST_CLOCK),
                fallback,
            }),
        };
        match store
            .inner
            .preload(store.inner.options.connect_timeout)
            .await
        {
            Ok(()) => Ok(store),
            Err(e) if store.inner.fallback.is_some() => {
                store.inner.circuit.failed(&e, store.inner.policy_name());
                Ok(store)
            }
            Err(e) => Err(ConnectError::new(ConnectErrorKind::Unreachable, e)),
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

    /// Round trips to Redis made by this store (and its clones) so far: each command or
    /// pipeline sent counts once, including script reloads after `NOSCRIPT`.
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    /// Whether the last call failed (and calls are failing or falling back).
    pub fn is_degraded(&self) -> bool {
        self.inner.circuit.degraded.load(Ordering::Relaxed)
    }

    /// Test support: the scripts decide as if the Redis server's clock read `now`
    /// (microseconds since any epoch) instead of reading `TIME`; `None` restores `TIME`.
    ///
    /// With it, a test replays one sequence of decisions at exact instants against this
    /// store and a [`MemoryStore`] on a paused clock, and compares every answer.
    #[cfg(feature = "test-util")]
    pub fn set_test_clock(&self, now: Option<Duration>) {
        let us = now.map_or(NO_TEST_CLOCK, |d| {
            u64::try_from(d.as_micros()).unwrap_or(NO_TEST_CLOCK - 1)
        });
        self.inner.test_clock_us.store(us, Ordering::Relaxed);
    }

    /// Runs one decision: Redis when it is expected to answer, else the failure policy.
    fn decide<T, F>(
        &self,
        config: &AllowanceConfig,
        op: Op,
        op_arg: u64,
        decode: fn(&[i64]) -> Result<T, BadReply>,
        local: F,
    ) -> StoreFuture<T>
    where
        T: Send + 'static,
        F: FnOnce(&MemoryStore, &AllowanceConfig) -> StoreFuture<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        let params = Params::new(config, inner.options.idle_ttl);
        // Only the fallback needs the configuration itself.
        let config = inner.fallback.as_ref().map(|_| config.clone());
        Box::pin(async move {
            let result = match inner.circuit.check() {
                Check::Closed => inner.eval(op, &params, op_arg, decode).await,
                Check::Probe => {
                    // Probe in the background: this caller does not wait on a Redis that
                    // was failing a moment ago.
                    tokio::spawn(Inner::probe(inner.clone()));
                    Err(CallError::new(CallErrorKind::Unavailable))
                }
                Check::Open => Err(CallError::new(CallErrorKind::Unavailable)),
            };
            match result {
                Ok(value) => {
                    inner.circuit.succeeded();
                    Ok(value)
                }
                Err(e) => {
                    inner.circuit.failed(&e, inner.policy_name());
                    let (Some((processes, local_store)), Some(config)) = (&inner.fallback, &config)
                    else {
                        return Err(StoreError::new(e));
                    };
                    let local_config = fallback_config(config, *processes).map_err(|c| {
                        StoreError::new(CallError::with_source(CallErrorKind::Fallback, c))
                    })?;
                    local(local_store, &local_config).await
                }
            }
        })
    }
}

impl Inner {
    fn connection(&self) -> CountingConnection {
        CountingConnection {
            conn: self.conn.clone(),
            round_trips: self.round_trips.clone(),
        }
    }

    /// One decision: `EVALSHA` (one round trip). When the script is missing (`SCRIPT FLUSH`,
    /// a restarted or failed-over server) `redis` loads it and retries; should it vanish
    /// again in between, `EVAL` with the source settles it. All within one timeout.
    async fn eval<T>(
        &self,
        op: Op,
        params: &Params,
        op_arg: u64,
        decode: fn(&[i64]) -> Result<T, BadReply>,
    ) -> Result<T, CallError> {
        let (script, source) = self.scripts.get(op);
        let test_clock = self.test_clock_us.load(Ordering::Relaxed);
        let (args, count) =
            params.argv(op_arg, (test_clock != NO_TEST_CLOCK).then_some(test_clock));
        let argv = &args[..count];
        let mut invocation = script.prepare_invoke();
        invocation.key(&self.key);
        invocation.arg(argv);
        let mut conn = self.connection();
        let call = async {
            match invocation.invoke_async::<Vec<i64>>(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    redis::cmd("EVAL")
                        .arg(source)
                        .arg(1)
                        .arg(&self.key)
                        .arg(argv)
                        .query_async::<Vec<i64>>(&mut conn)
                        .await
                }
                other => other,
            }
        };
        let reply = with_timeout(self.options.timeout, call)
            .await?
            .map_err(|e| CallError::with_source(CallErrorKind::Redis, RedisCause(e)))?;
        decode(&reply).map_err(|_| CallError::new(CallErrorKind::UnexpectedReply))
    }

    /// Checks whether Redis answers again, and closes the circuit if it does. The probe
    /// loads the scripts, so that the first decisions after an outage (or a restart that
    /// lost them) are one round trip each.
    async fn probe(self: Arc<Self>) {
        match self.preload(self.options.timeout).await {
            Ok(()) => self.circuit.succeeded(),
            Err(e) => self.circuit.failed(&e, self.policy_name()),
        }
    }

    /// Loads the four scripts in one pipelined round trip.
    async fn preload(&self, timeout: Duration) -> Result<(), CallError> {
        let mut pipe = redis::pipe();
        for source in self.scripts.sources() {
            pipe.cmd("SCRIPT").arg("LOAD").arg(source);
        }
        let mut conn = self.connection();
        with_timeout(timeout, pipe.query_async::<Vec<String>>(&mut conn))
            .await?
            .map(drop)
            .map_err(|e| CallError::with_source(CallErrorKind::Redis, RedisCause(e)))
    }

    fn policy_name(&self) -> &'static str {
        match self.fallback {
            Some(_) => "local fallback",
            None => "fail closed",
        }
    }
}

async fn with_timeout<T>(timeout: Duration, fut: impl Future<Output = T>) -> Result<T, CallError> {
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| CallError::timeout(timeout))
}

/// The conservative local allowance: rate and burst divided by the expected processes.
fn fallback_config(
    config: &AllowanceConfig,
    processes: NonZeroU32,
) -> Result<AllowanceConfig, ConfigError> {
    let n = processes.get();
    let period = config
        .period()
        .checked_mul(n)
        .filter(|p| *p <= MAX_DELAY)
        .unwrap_or(MAX_DELAY);
    let budget = match config.retry_budget() {
        RetryBudgetConfig::Unlimited => RetryBudgetConfig::Unlimited,
        // What the other processes spent is unknown: spending any would risk overdrawing.
        RetryBudgetConfig::Fixed { .. } => RetryBudgetConfig::fixed(0),
        RetryBudgetConfig::Replenishing(r) => RetryBudgetConfig::Replenishing(
            ReplenishingBudget::new(r.window(), r.min_per_sec() / n, r.ratio())?,
        ),
    };
    Ok(
        AllowanceConfig::new(config.rate(), period, (config.burst() / n).max(1))?
            .with_max_waiters(config.max_waiters())
            .with_retry_budget(budget),
    )
}

impl Store for RedisStore {
    fn admit(&self, config: &AllowanceConfig, ask: Admit) -> StoreFuture<Decision> {
        self.decide(
            config,
            Op::Admit,
            u64::from(ask.spend_retry),
            scripts::decode_admit,
            move |local, config| local.admit(config, ask),
        )
    }

    fn defer(&self, config: &AllowanceConfig, delay: Duration) -> StoreFuture<Deferred> {
        let Some(delay_us) = micros_ceil(delay) else {
            return Box::pin(std::future::ready(Err(StoreError::new(CallError::new(
                CallErrorKind::UnrepresentableDelay,
            )))));
        };
        // The local fallback hears of every cooldown too, so that it honours the ones raised
        // before an outage.
        let local_first = self
            .inner
            .fallback
            .as_ref()
            .map(|(_, local)| local.defer(config, delay));
        let shared = self.decide(
            config,
            Op::Defer,
            delay_us,
            scripts::decode_defer,
            move |local, config| local.defer(config, delay),
        );
        Box::pin(async move {
            if let Some(local) = local_first {
                // Cannot fail: the delay was checked above.
                local.await?;
            }
            shared.await
        })
    }

    fn deposit(&self, config: &AllowanceConfig) -> StoreFuture<()> {
        // Only a replenishing budget counts successes: no round trip for the others.
        if !matches!(config.retry_budget(), RetryBudgetConfig::Replenishing(_)) {
            return Box::pin(std::future::ready(Ok(())));
        }
        self.decide(
            config,
            Op::Deposit,
            0,
            scripts::decode_deposit,
            |local, config| local.deposit(config),
        )
    }

    fn state(&self, config: &AllowanceConfig) -> StoreFuture<StoreState> {
        self.decide(
            config,
            Op::State,
            0,
            scripts::decode_state,
            |local, config| local.state(config),
        )
    }
}

/// Microseconds, rounded up so a cooldown is never shortened; `None` past `MAX_DELAY`.
fn micros_ceil(d: Duration) -> Option<u64> {
    let us = d.as_micros() + u128::from(!d.subsec_nanos().is_multiple_of(1_000));
    u64::try_from(us)
        .ok()
        .filter(|us| u128::from(*us) <= MAX_DELAY.as_micros())
}

/// A connection that counts what it sends.
struct CountingConnection {
    conn: ConnectionManager,
    round_trips: Arc<AtomicU64>,
}

impl ConnectionLike for CountingConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// What a call does about Redis.
enum Check {
    /// Healthy: ask Redis.
    Closed,
    /// Failing, and a probe is due: start one, and apply the policy to this call.
    Probe,
    /// Failing: apply the policy at once.
    Open,
}

/// Skips Redis for a while after a failure, so that calls never queue up behind an outage;
/// one caller at a time probes it again.
struct Circuit {
    epoch: Instant,
    probe_us: u64,
    /// Microseconds since `epoch` before which Redis is not tried; 0 when healthy.
    closed_until_us: AtomicU64,
    degraded: AtomicBool,
}

impl Circuit {
    fn new(probe_interval: Duration) -> Self {
        Self {
            epoch: Instant::now(),
            probe_us: u64::try_from(probe_interval.as_micros()).unwrap_or(u64::MAX),
            closed_until_us: AtomicU64::new(0),
            degraded: AtomicBool::new(false),
        }
    }

    fn now_us(&self) -> u64 {
        // +1 so that "now" is never the "healthy" marker 0.
        u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// Whether this call should ask Redis; after a failure, once per probe interval one
    /// caller starts a probe.
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

    fn succeeded(&self) {
        if self.closed_until_us.load(Ordering::Acquire) != 0 {
            self.closed_until_us.store(0, Ordering::Release);
        }
        if self.degraded.load(Ordering::Acquire) && self.degraded.swap(false, Ordering::AcqRel) {
            tracing::info!("redis answers again; allowance decisions are shared again");
        }
    }

    fn failed(&self, error: &CallError, policy: &'static str) {
        if error.kind() != CallErrorKind::Unavailable {
            let next = self.now_us().saturating_add(self.probe_us);
            self.closed_until_us.store(next, Ordering::Release);
        }
        if !self.degraded.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                error = %error,
                cause = ?std::error::Error::source(error).map(ToString::to_string),
                policy,
                "redis unavailable for the allowance; switching to the failure policy"
            );
        }
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
    fn urls_are_redacted() {
        let cases = [
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("redis://:hunter2@h:1/", "redis://:***@h:1/"),
            ("redis://user:hunter2@h:1/2", "redis://user:***@h:1/2"),
            ("rediss://hunter2@h", "rediss://***@h"),
            (
                "redis+unix:///tmp/r.sock?pass=hunter2",
                "redis+unix:///tmp/r.sock?***",
            ),
            ("redis://u:p@ss:w@rd@h/", "redis://u:***@h/"),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want);
        }
    }

    #[test]
    fn fallback_divides_the_rate() {
        let n = NonZeroU32::new(4).expect("non-zero");
        let config = AllowanceConfig::per_second(10, 6)
            .expect("valid")
            .with_retry_budget(RetryBudgetConfig::fixed(9));
        let local = fallback_config(&config, n).expect("valid");
        assert_eq!(local.interval(), Duration::from_millis(400));
        assert_eq!(local.burst(), 1);
        assert_eq!(local.retry_budget(), &RetryBudgetConfig::fixed(0));

        let budget = ReplenishingBudget::new(Duration::from_secs(10), 8, 0.2).expect("valid");
        let config = config.with_retry_budget(RetryBudgetConfig::Replenishing(budget));
        let local = fallback_config(&config, n).expect("valid");
        let RetryBudgetConfig::Replenishing(r) = local.retry_budget() else {
            panic!("still replenishing");
        };
        assert_eq!((r.min_per_sec(), r.ratio()), (2, 0.2));
    }

    #[test]
    fn delays_round_up() {
        assert_eq!(micros_ceil(Duration::from_nanos(1)), Some(1));
        assert_eq!(micros_ceil(MAX_DELAY), Some(1 << 53));
        assert_eq!(micros_ceil(MAX_DELAY + Duration::from_micros(1)), None);
    }
}
