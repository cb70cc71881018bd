//! One allowance as a file describes it (feature `serde`): its limits, budget, dialect,
//! classifier, retry rules and store, built in one call.

use std::{convert::Infallible, future::Future, sync::Arc};

use crate::{
    config::de::{split, RawAllowanceConfig},
    error::ConfigError,
    store::{MemoryStore, Store},
    Allowance, AllowanceConfig, Limit,
};

/// An allowance's whole description, read from a file (feature `serde`): everything an
/// [`AllowanceConfig`] reads (the limits, the retry budget, the `dialect`, the `classifier`,
/// the `retry` rules...) and where the state is kept (`store`), so that one call builds the
/// allowance every layer and client then inherits from.
///
/// `S` is the store part: [`MemorySpec`] (`store = "memory"`, the default) in this crate;
/// a shared store's crate supplies its own (`tower-allowance-redis`'s `StoreSpec`, feature
/// `serde`, reads `store = { redis = { url_env = "REDIS_URL" } }`), so this crate never
/// depends on one. The table is the one an [`AllowanceConfig`] reads, with `store` added:
/// unknown fields are refused and every error names its field.
///
/// ```
/// use tower_allowance::{classify::StatusClassifier, AllowanceConfig, AllowanceLayer, AllowanceSpec};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// // In TOML: rate = 5, burst = 5, classifier = { throttled = [403, 429] }, store = "memory"
/// let spec: AllowanceSpec = serde_json::from_str(
///     r#"{ "rate": 5, "burst": 5, "classifier": { "throttled": [403, 429] }, "store": "memory" }"#,
/// )?;
/// let allowance = spec.build("odds-api").await?;
/// assert_eq!(allowance.name(), "odds-api");
/// assert_eq!(
///     allowance.config().classifier(),
///     StatusClassifier::default().throttled([403, 429])
/// );
/// // Every layer on it classifies and retries as the file says.
/// let _layer = allowance.layer();
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(
    try_from = "RawAllowanceConfig<S>",
    bound(deserialize = "S: serde::Deserialize<'de> + Default")
)]
pub struct AllowanceSpec<S = MemorySpec> {
    config: AllowanceConfig,
    store: S,
    /// `lease = "auto"` (feature `lease`): the store wrapped in a `LeaseStore`.
    #[cfg(feature = "lease")]
    lease: Option<crate::lease::Lease>,
}

impl<S: Default> TryFrom<RawAllowanceConfig<S>> for AllowanceSpec<S> {
    type Error = ConfigError;

    fn try_from(raw: RawAllowanceConfig<S>) -> Result<Self, ConfigError> {
        #[cfg(feature = "lease")]
        let lease = raw.lease;
        let (config, store) = split(raw)?;
        #[cfg(feature = "lease")]
        return Ok(Self::new(config, store.unwrap_or_default()).with_lease(lease));
        #[cfg(not(feature = "lease"))]
        Ok(Self::new(config, store.unwrap_or_default()))
    }
}

impl<S> AllowanceSpec<S> {
    /// The spec a file would give: `config`, kept in `store`.
    pub fn new(config: AllowanceConfig, store: S) -> Self {
        Self {
            config,
            store,
            #[cfg(feature = "lease")]
            lease: None,
        }
    }

    /// Admits from leases of the store (feature `lease`; a file's `lease = "auto"`).
    #[cfg(feature = "lease")]
    pub fn with_lease(mut self, lease: Option<crate::lease::Lease>) -> Self {
        self.lease = lease;
        self
    }

    /// The lease, if any (feature `lease`).
    #[cfg(feature = "lease")]
    pub fn lease(&self) -> Option<crate::lease::Lease> {
        self.lease
    }

    /// The allowance's configuration (limits, budget, dialect, classifier, retry rules).
    pub fn config(&self) -> &AllowanceConfig {
        &self.config
    }

    /// Where the state is kept.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The spec with its configuration adjusted in code: a file gives the limits, the code
    /// adds what a file cannot say (a classifier closure, a headroom chosen at run time).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_allowance::AllowanceSpec;
    ///
    /// let spec: AllowanceSpec = serde_json::from_str(r#"{ "rate": 5, "burst": 5 }"#)?;
    /// let spec = spec.map_config(|c| c.with_max_waiters(100));
    /// let spec = spec.try_map_config(|c| c.with_max_cooldown(Duration::from_secs(86_400)))?;
    /// assert_eq!(spec.config().max_cooldown(), Duration::from_secs(86_400));
    /// # Ok::<(), tower_allowance::BoxError>(())
    /// ```
    pub fn map_config(self, f: impl FnOnce(AllowanceConfig) -> AllowanceConfig) -> Self {
        Self {
            config: f(self.config),
            ..self
        }
    }

    /// [`map_config`](Self::map_config) with a step that may fail (most of
    /// [`AllowanceConfig`]'s `with_` methods check what they are given).
    ///
    /// # Errors
    ///
    /// `f`'s.
    pub fn try_map_config<E>(
        self,
        f: impl FnOnce(AllowanceConfig) -> Result<AllowanceConfig, E>,
    ) -> Result<Self, E> {
        Ok(Self {
            config: f(self.config)?,
            ..self
        })
    }

    /// The spec with `limits` in place of the file's `rate`, `period`, `burst` and `limits`:
    /// the first is the main limit, the others are added as
    /// [`AllowanceConfig::with_limit`] adds them. Everything else the file says is kept.
    ///
    /// What a spec read from a file can be adjusted with, field by field: the limits here;
    /// every other configuration field through [`map_config`](Self::map_config) and
    /// [`AllowanceConfig`]'s `with_` methods (`max_waiters`, `retry_budget`, `max_cooldown`,
    /// `outage`, `max_date_skew`, `classifier`, `retry`, and with their features `dialect`,
    /// `adaptive`, `classes`); the `store` with [`with_store`](Self::with_store); `lease`
    /// with `with_lease` (feature `lease`). A spec written in code starts from
    /// [`new`](Self::new).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_allowance::{AllowanceSpec, Limit};
    ///
    /// let spec: AllowanceSpec = serde_json::from_str(r#"{ "rate": 4, "burst": 4, "max_waiters": 10 }"#)?;
    /// // The provider raised the tier: 8/s, and at most 400 a minute.
    /// let spec = spec.with_limits([Limit::per_second(8, 8)?, Limit::per_minute(400, 400)?])?;
    /// assert_eq!((spec.config().rate(), spec.config().limits().len()), (8, 2));
    /// assert_eq!(spec.config().max_waiters(), 10);
    /// # Ok::<(), tower_allowance::BoxError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// No limit, or more than an allowance holds (4).
    pub fn with_limits(self, limits: impl IntoIterator<Item = Limit>) -> Result<Self, ConfigError> {
        self.try_map_config(|c| c.replace_limits(limits))
    }

    /// The same configuration, kept in another store (one built in code, say).
    ///
    /// ```
    /// use tower_allowance::{AllowanceConfig, AllowanceSpec, MemorySpec};
    ///
    /// let spec = AllowanceSpec::new(AllowanceConfig::per_second(5, 5)?, ());
    /// let spec: AllowanceSpec<MemorySpec> = spec.with_store(MemorySpec::default());
    /// assert_eq!(spec.config().limits().len(), 1);
    /// # Ok::<(), tower_allowance::BoxError>(())
    /// ```
    pub fn with_store<T>(self, store: T) -> AllowanceSpec<T> {
        AllowanceSpec {
            config: self.config,
            store,
            #[cfg(feature = "lease")]
            lease: self.lease,
        }
    }
}

impl<S: OpenStore> AllowanceSpec<S> {
    /// Opens the store and builds the allowance called `name` (its name in logs and metrics,
    /// and the store's name for its state): what
    /// `Allowance::builder(config).name(name).store(store).build()` does by hand.
    ///
    /// # Errors
    ///
    /// The store part's, when it cannot open the store (never for [`MemorySpec`]).
    pub async fn build(&self, name: &str) -> Result<Allowance, S::Error> {
        let store = self.store.open(name).await?;
        #[cfg(feature = "lease")]
        let store: Arc<dyn Store> = match self.lease {
            Some(lease) => Arc::new(crate::lease::LeaseStore::new(store, lease)),
            None => store,
        };
        Ok(Allowance::builder(self.config.clone())
            .name(name)
            .store(store)
            .build())
    }
}

/// The store part of an [`AllowanceSpec`] (feature `serde`): what opens the store an
/// allowance called `name` keeps its state in.
///
/// ```
/// use std::{convert::Infallible, future::Future, sync::Arc};
/// use tower_allowance::{store::{MemoryStore, Store}, AllowanceSpec, OpenStore};
///
/// /// Every allowance in one memory store per name, for a test.
/// #[derive(Debug, Default, serde::Deserialize)]
/// struct Scratch {}
///
/// impl OpenStore for Scratch {
///     type Error = Infallible;
///     fn open(&self, _name: &str) -> impl Future<Output = Result<Arc<dyn Store>, Infallible>> + Send {
///         std::future::ready(Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// let spec: AllowanceSpec<Scratch> = serde_json::from_str(r#"{ "rate": 1, "burst": 1, "store": {} }"#)?;
/// spec.build("scratch").await?.acquire().await?;
/// # Ok(())
/// # }
/// ```
pub trait OpenStore {
    /// Why the store could not be opened.
    type Error;

    /// Opens (connects to) the store for the allowance called `name`.
    fn open(&self, name: &str) -> impl Future<Output = Result<Arc<dyn Store>, Self::Error>> + Send;
}

/// `store = "memory"`: this process's memory, shared by its tasks only (feature `serde`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MemorySpec {
    /// A new [`MemoryStore`].
    #[default]
    Memory,
}

impl OpenStore for MemorySpec {
    type Error = Infallible;

    fn open(&self, _name: &str) -> impl Future<Output = Result<Arc<dyn Store>, Infallible>> + Send {
        std::future::ready(Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>))
    }
}

#[cfg(test)]
mod tests;
