//! The registry: one allowance per key, created on first use, evicted when it is safe.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        atomic::{fence, AtomicU64, Ordering},
        Arc, PoisonError, RwLock,
    },
    time::Duration,
};

use tokio::time::Instant;

use super::{
    error::{KeyedError, RegistryFull},
    name::{KeySecret, Namer},
    store::{Erased, ErasedFactory, MemoryStores, StoreFactory},
};
use crate::{retry::RetryConfig, Allowance, AllowanceConfig, AllowanceLayer, ConfigError};

/// Default bound on live keys.
pub const DEFAULT_CAPACITY: usize = 10_000;

/// Default idle time before an allowance that is safe to evict is evicted.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// After a sweep under pressure freed nothing, new keys are refused without another sweep
/// for this long (a full registry of busy keys costs one scan per interval, not per request).
const FULL_BACKOFF_US: u64 = 100_000;

/// What a [`Keyed`] registry holds: a default allowance configuration, per-key overrides,
/// the retry configuration of the stacks it builds, a bound and an idle time.
///
/// ```
/// use std::time::Duration;
/// use tower_allowance::{keyed::KeyedConfig, AllowanceConfig};
///
/// let config = KeyedConfig::new(AllowanceConfig::per_second(10, 10)?)
///     // One tenant pays for more.
///     .with_override("key-of-the-big-tenant", AllowanceConfig::per_second(100, 50)?)
///     .with_capacity(50_000)?
///     .with_idle_timeout(Duration::from_secs(300));
/// assert_eq!(config.capacity(), 50_000);
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
///
/// `Debug` shows how many overrides there are, never their keys.
#[derive(Clone)]
pub struct KeyedConfig {
    default: AllowanceConfig,
    overrides: HashMap<Box<[u8]>, AllowanceConfig>,
    retry: RetryConfig,
    capacity: usize,
    idle_timeout: Duration,
}

impl fmt::Debug for KeyedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConfig")
            .field("default", &self.default)
            .field("overrides", &self.overrides.len())
            .field("retry", &self.retry)
            .field("capacity", &self.capacity)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

impl KeyedConfig {
    /// Every key gets `default` unless overridden; retries as [`RetryConfig::default`];
    /// [`DEFAULT_CAPACITY`] keys; [`DEFAULT_IDLE_TIMEOUT`].
    pub fn new(default: AllowanceConfig) -> Self {
        Self {
            default,
            overrides: HashMap::new(),
            retry: RetryConfig::default(),
            capacity: DEFAULT_CAPACITY,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }

    /// `key` gets `config` instead of the default.
    pub fn with_override(mut self, key: impl AsRef<[u8]>, config: AllowanceConfig) -> Self {
        self.overrides.insert(key.as_ref().into(), config);
        self
    }

    /// The retry configuration of the stacks a [`KeyedLayer`](super::KeyedLayer) runs.
    pub fn with_retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
    }

    /// At most `capacity` live keys. A new key beyond it evicts what can safely be evicted,
    /// or fails with [`RegistryFull`].
    ///
    /// # Errors
    ///
    /// A zero capacity.
    pub fn with_capacity(mut self, capacity: usize) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new(
                "a keyed registry needs a capacity of at least 1",
            ));
        }
        self.capacity = capacity;
        Ok(self)
    }

    /// Evict a key's allowance once it has not been used for `idle` (checked by sweeps at
    /// most every `idle`, so after between `idle` and twice that), when it is safe.
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// The configuration of keys without an override.
    pub fn default_config(&self) -> &AllowanceConfig {
        &self.default
    }

    /// The configuration `key` gets.
    pub fn config_for(&self, key: &[u8]) -> &AllowanceConfig {
        self.overrides.get(key).unwrap_or(&self.default)
    }

    /// The bound on live keys.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The idle time before eviction.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// The retry configuration.
    pub fn retry(&self) -> &RetryConfig {
        &self.retry
    }
}

/// Builds a [`Keyed`] registry: stores, secret, name prefix.
#[derive(Debug)]
pub struct KeyedBuilder {
    config: KeyedConfig,
    factory: Option<Box<dyn ErasedFactory>>,
    secret: Option<KeySecret>,
    prefix: Box<str>,
}

impl fmt::Debug for dyn ErasedFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.type_name())
    }
}

impl KeyedBuilder {
    /// Makes each key's store with `factory` (default: [`MemoryStores`]).
    pub fn stores(mut self, factory: impl StoreFactory) -> Self {
        self.factory = Some(Box::new(Erased(factory)));
        self
    }

    /// Derives names under `secret` (default: [`KeySecret::per_process`]; required when the
    /// stores' state outlives them, since every process must derive the same names).
    pub fn secret(mut self, secret: KeySecret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Names start with `prefix` (default `"key"`): 1 to 24 characters from
    /// `A-Z a-z 0-9 _ . -`.
    pub fn name_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The registry.
    ///
    /// # Errors
    ///
    /// An invalid name prefix, or a factory whose state outlives its stores (such as
    /// [`SharedStores`](super::SharedStores)) without a [`secret`](Self::secret).
    pub fn build(self) -> Result<Keyed, ConfigError> {
        let factory = self
            .factory
            .unwrap_or_else(|| Box::new(Erased(MemoryStores)));
        let secret = match self.secret {
            Some(s) => s,
            None if factory.outlives() => {
                return Err(ConfigError::new(
                    "stores shared across processes need a KeySecret: every process must derive the same names",
                ))
            }
            None => KeySecret::per_process(),
        };
        let namer = Namer::new(secret, &self.prefix)?;
        Ok(Keyed::from_parts(self.config, factory, namer))
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One allowance per key: created on first use with the key's configuration, kept in a bounded
/// map, evicted when idle and safe (see [`keyed`](super#eviction)).
///
/// # Clone
///
/// Cloning is cheap (an `Arc`) and shares the registry: every clone, and every
/// [`KeyedLayer`](super::KeyedLayer) built from one, sees the same allowances.
///
/// ```
/// use tower_allowance::{keyed::{Keyed, KeyedConfig}, AllowanceConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// let keyed = Keyed::new(KeyedConfig::new(AllowanceConfig::per_second(2, 2)?));
/// let alice = keyed.get("alice-key")?;
/// alice.allowance().acquire().await?;
/// assert_eq!(keyed.get("alice-key")?.allowance().snapshot().admitted, 1);
/// assert_eq!(keyed.get("bob-key")?.allowance().snapshot().admitted, 0);
/// assert_eq!(keyed.len(), 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Keyed {
    pub(crate) inner: Arc<Registry>,
}

pub(crate) struct Registry {
    config: KeyedConfig,
    factory: Box<dyn ErasedFactory>,
    outlives: bool,
    namer: Namer,
    epoch: Instant,
    map: RwLock<HashMap<Box<[u8]>, Arc<Entry>>>,
    /// How many handles to an allowance's state an entry holds itself (see [`own_sharers`]).
    own_sharers: usize,
    /// Bumped by every idle sweep; an entry remembers the generation it was last used in.
    generation: AtomicU64,
    next_sweep: AtomicU64,
    full_until: AtomicU64,
    created: AtomicU64,
    evicted: AtomicU64,
    refused: AtomicU64,
}

/// One key's allowance and the stack built from it.
pub(crate) struct Entry {
    pub(crate) layer: AllowanceLayer,
    allowance: Allowance,
    used: AtomicU64,
}

impl fmt::Debug for Keyed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.inner;
        f.debug_struct("Keyed")
            .field("live", &self.len())
            .field("capacity", &r.config.capacity)
            .field("stores", &r.factory)
            .field("namer", &r.namer)
            .finish_non_exhaustive()
    }
}

/// Counters of a [`Keyed`] registry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyedStats {
    /// Allowances live now.
    pub live: usize,
    /// Allowances created so far.
    pub created: u64,
    /// Allowances evicted so far.
    pub evicted: u64,
    /// New keys refused because the registry was full of allowances it could not evict.
    pub refused: u64,
}

// === impl Keyed ===

impl Keyed {
    /// A registry keeping each key's allowance in memory.
    pub fn new(config: KeyedConfig) -> Self {
        Self::from_parts(config, Box::new(Erased(MemoryStores)), Namer::per_process())
    }

    fn from_parts(config: KeyedConfig, factory: Box<dyn ErasedFactory>, namer: Namer) -> Self {
        let idle_us = micros(config.idle_timeout);
        Keyed {
            inner: Arc::new(Registry {
                own_sharers: own_sharers(&config),
                config,
                outlives: factory.outlives(),
                factory,
                namer,
                epoch: Instant::now(),
                map: RwLock::new(HashMap::new()),
                generation: AtomicU64::new(1),
                next_sweep: AtomicU64::new(idle_us),
                full_until: AtomicU64::new(0),
                created: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// A builder, to choose the stores, the secret and the name prefix.
    pub fn builder(config: KeyedConfig) -> KeyedBuilder {
        KeyedBuilder {
            config,
            factory: None,
            secret: None,
            prefix: "key".into(),
        }
    }

    /// The registry's configuration.
    pub fn config(&self) -> &KeyedConfig {
        &self.inner.config
    }

    /// `key`'s allowance, created with its configuration if it is not live.
    ///
    /// The handle keeps the allowance from being evicted while it is held, and so does any
    /// clone of its [`Allowance`] (in a plain layer, say): while one lives, the key's requests
    /// through the registry go through that same allowance.
    ///
    /// # Errors
    ///
    /// [`KeyedError::Full`] when the registry holds `capacity` allowances none of which can
    /// be evicted safely; [`KeyedError::Store`] when the factory fails.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<KeyedAllowance, KeyedError> {
        self.inner
            .lookup(key.as_ref())
            .map(|entry| KeyedAllowance { entry })
    }

    /// The name `key`'s allowance has (or would have) in its store and logs: a keyed hash.
    pub fn name_of(&self, key: impl AsRef<[u8]>) -> String {
        self.inner.namer.name(key.as_ref())
    }

    /// Live allowances.
    pub fn len(&self) -> usize {
        self.inner.read().len()
    }

    /// Whether no allowance is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters.
    pub fn stats(&self) -> KeyedStats {
        let r = &self.inner;
        KeyedStats {
            live: self.len(),
            created: r.created.load(Ordering::Relaxed),
            evicted: r.evicted.load(Ordering::Relaxed),
            refused: r.refused.load(Ordering::Relaxed),
        }
    }

    /// Sweeps now: evicts every allowance unused since the previous sweep that is safe to
    /// evict. Returns how many were evicted. (Sweeps also run by themselves when new keys
    /// arrive, at most every idle timeout; call this from a timer to free memory without them.)
    pub fn evict_idle(&self) -> usize {
        self.inner.sweep(Instant::now(), Sweep::Idle)
    }
}

/// How many handles to an allowance's state a registry entry holds itself: the allowance,
/// and those inside the layer built from it. Any handle beyond these is someone else's: a
/// request in flight, a response body, or a clone of the allowance taken from a
/// [`KeyedAllowance`] (into a plain layer, say), none of which the entry's own count sees.
///
/// Counted once, on an allowance no one else can reach (its own memory store: no event and
/// no task can hold a handle while it is counted), built as [`Registry::make_entry`] builds
/// an entry's; what the layer holds depends on the code, not on the configuration.
fn own_sharers(config: &KeyedConfig) -> usize {
    let allowance = Allowance::new(config.default.clone());
    let _layer = allowance.layer().with_retry(config.retry.clone());
    allowance.sharers()
}

/// What a sweep evicts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sweep {
    /// Safe and unused since the previous sweep; starts a new generation.
    Idle,
    /// Safe (to make room for a new key).
    Pressure,
}

// === impl Registry ===

impl Registry {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Box<[u8]>, Arc<Entry>>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// `now` in microseconds since the registry's epoch.
    fn micros(&self, now: Instant) -> u64 {
        micros(now.saturating_duration_since(self.epoch))
    }

    /// The entry for `key`, created if missing.
    #[inline]
    pub(crate) fn lookup(&self, key: &[u8]) -> Result<Arc<Entry>, KeyedError> {
        {
            let map = self.read();
            if let Some(entry) = map.get(key) {
                let generation = self.generation.load(Ordering::Relaxed);
                if entry.used.load(Ordering::Relaxed) != generation {
                    entry.used.store(generation, Ordering::Relaxed);
                }
                return Ok(entry.clone());
            }
        }
        self.insert(key)
    }

    #[cold]
    fn insert(&self, key: &[u8]) -> Result<Arc<Entry>, KeyedError> {
        let instant = Instant::now();
        let now = self.micros(instant);
        if now >= self.next_sweep.load(Ordering::Relaxed) {
            self.next_sweep.store(
                now.saturating_add(micros(self.config.idle_timeout)),
                Ordering::Relaxed,
            );
            self.sweep(instant, Sweep::Idle);
        }
        let mut evicted = Vec::new();
        let result = {
            let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = map.get(key) {
                return Ok(entry.clone());
            }
            if map.len() >= self.config.capacity {
                if now >= self.full_until.load(Ordering::Relaxed) {
                    self.evict(&mut map, instant, Sweep::Pressure, &mut evicted);
                }
                if map.len() >= self.config.capacity {
                    self.full_until
                        .store(now.saturating_add(FULL_BACKOFF_US), Ordering::Relaxed);
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return Err(KeyedError::Full(RegistryFull::new(self.config.capacity)));
                }
            }
            self.make_entry(key).map(|entry| {
                let entry = Arc::new(entry);
                map.insert(key.into(), entry.clone());
                self.created.fetch_add(1, Ordering::Relaxed);
                entry
            })
        };
        // Allowances are dropped outside the lock.
        drop(evicted);
        result
    }

    fn make_entry(&self, key: &[u8]) -> Result<Entry, KeyedError> {
        let config = self.config.config_for(key).clone();
        let name = self.namer.name(key);
        let allowance = self
            .factory
            .allowance(name, config)
            .map_err(KeyedError::store)?;
        let entry = Entry {
            layer: allowance.layer().with_retry(self.config.retry.clone()),
            allowance,
            used: AtomicU64::new(self.generation.load(Ordering::Relaxed)),
        };
        // More only while an event from another handle on the same state is being delivered.
        debug_assert!(entry.allowance.sharers() >= self.own_sharers);
        Ok(entry)
    }

    /// Runs a sweep; returns how many allowances it evicted.
    fn sweep(&self, now: Instant, kind: Sweep) -> usize {
        let mut evicted = Vec::new();
        {
            let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
            self.evict(&mut map, now, kind, &mut evicted);
        }
        evicted.len()
    }

    fn evict(
        &self,
        map: &mut HashMap<Box<[u8]>, Arc<Entry>>,
        now: Instant,
        kind: Sweep,
        evicted: &mut Vec<Arc<Entry>>,
    ) {
        let generation = self.generation.load(Ordering::Relaxed);
        let before = evicted.len();
        map.retain(|_, entry| {
            let idle = kind == Sweep::Pressure || entry.used.load(Ordering::Relaxed) < generation;
            if idle && self.evictable(entry, now) {
                evicted.push(entry.clone());
                false
            } else {
                true
            }
        });
        if kind == Sweep::Idle {
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
        let n = evicted.len() - before;
        if n > 0 {
            self.evicted.fetch_add(n as u64, Ordering::Relaxed);
            tracing::debug!(evicted = n, live = map.len(), "keyed allowances evicted");
        }
    }

    /// Whether evicting `entry` now can never let more through than keeping it would:
    /// nothing in this process holds it (no request in flight: no caller waiting for a slot,
    /// no retry pending; no handle, no clone of its allowance), and its state survives in a
    /// shared store or its store says it is settled, as good as a fresh one (see the module
    /// docs).
    fn evictable(&self, entry: &Arc<Entry>, now: Instant) -> bool {
        // Only the map holds the entry, and only the entry holds the allowance. Neither count
        // can rise while we hold the write lock: a new handle to the entry comes from the map
        // (cloned under the read lock), a new handle to the allowance from an existing one.
        let alone = Arc::strong_count(entry) == 1 && entry.allowance.sharers() == self.own_sharers;
        if !alone {
            return false;
        }
        // The last other holder let go (a release decrement): see what it did before that.
        fence(Ordering::Acquire);
        self.outlives || entry.allowance.is_settled(now)
    }
}

/// A handle to one key's allowance from a [`Keyed`] registry.
///
/// While a handle, or a clone of its [`allowance`](Self::allowance), is held, the allowance
/// is not evicted: it stays the key's allowance for every request through the registry.
///
/// # Clone
///
/// Cloning is cheap and shares the allowance.
#[derive(Clone)]
pub struct KeyedAllowance {
    entry: Arc<Entry>,
}

impl KeyedAllowance {
    /// The allowance.
    pub fn allowance(&self) -> &Allowance {
        &self.entry.allowance
    }

    /// Its name (a keyed hash of the key).
    pub fn name(&self) -> &str {
        self.entry.allowance.name()
    }
}

impl fmt::Debug for KeyedAllowance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedAllowance")
            .field("allowance", &self.entry.allowance)
            .finish()
    }
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("allowance", &self.allowance)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
