//! The store part of a `tower_allowance::AllowanceSpec` (feature `serde`): memory, or Redis
//! at a URL with its options.

use std::{fmt, future::Future, sync::Arc};

use tower_allowance::{store::Store, OpenStore};

use crate::{
    error::{ConnectError, ConnectErrorKind},
    RedisStore, RedisStoreOptions,
};

/// Where an allowance read from a file keeps its state (feature `serde`): the `store` of a
/// [`tower_allowance::AllowanceSpec`], so that one file describes allowances in memory and
/// in Redis alike, and one call builds each.
///
/// ```toml
/// store = "memory"                                   # this process (the default)
///
/// [store.redis]                                      # Redis, shared by every process
/// url_env = "ALLOWANCE_REDIS_URL"                    # or `url = "redis://host:6379/"`
/// options = { timeout = "100ms", failure_policy = "report" }   # RedisStoreOptions
/// ```
///
/// A URL may carry a password: `url_env` names the environment variable that holds it,
/// read when the store is opened, so the file need not. The store's name is the
/// allowance's (`AllowanceSpec::build(name)`): its Redis key and its metrics label.
///
/// ```no_run
/// use tower_allowance::{AllowanceLayer, AllowanceSpec};
/// use tower_allowance_redis::StoreSpec;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// let spec: AllowanceSpec<StoreSpec> = toml::from_str(
///     r#"
///     rate = 300
///     period = "1m"
///     burst = 5
///     classifier = { throttled = [429], transient = [502, 503] }
///     retry = { max_attempts = 4 }
///     store = { redis = { url = "redis://127.0.0.1:6379/", options = { timeout = "100ms" } } }
///     "#,
/// )?;
/// let allowance = spec.build("llm").await?; // connected, named, configured
/// let _layer = allowance.layer();
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
#[allow(
    clippy::large_enum_variant,
    reason = "read once from a file; boxing would change the public variant (with `tls` the options are ~220 bytes)"
)]
pub enum StoreSpec {
    /// This process's memory (`store = "memory"`).
    #[default]
    Memory,
    /// Redis (`store = { redis = { ... } }`).
    Redis(RedisSpec),
}

/// Redis at a URL, with its options (feature `serde`): see [`StoreSpec`].
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSpec {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    url_env: Option<String>,
    #[serde(default)]
    options: RedisStoreOptions,
}

impl RedisSpec {
    /// Redis at `url` (which may carry a password: it is never printed), with the default
    /// options: what `{ url = "..." }` says in a file.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_allowance::{AllowanceConfig, AllowanceSpec};
    /// use tower_allowance_redis::{RedisSpec, RedisStoreOptions, StoreSpec};
    ///
    /// let redis = RedisSpec::url("redis://127.0.0.1:6379/")
    ///     .with_options(RedisStoreOptions::new().timeout(Duration::from_millis(100)));
    /// let spec = AllowanceSpec::new(AllowanceConfig::per_second(5, 5)?, StoreSpec::Redis(redis));
    /// assert!(!format!("{spec:?}").contains("6379"));
    /// # Ok::<(), tower_allowance::BoxError>(())
    /// ```
    pub fn url(url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            url_env: None,
            options: RedisStoreOptions::new(),
        }
    }

    /// Redis at the URL the environment variable `var` holds when the store is opened:
    /// what `{ url_env = "..." }` says in a file.
    ///
    /// ```
    /// use tower_allowance_redis::RedisSpec;
    ///
    /// let redis = RedisSpec::url_env("ALLOWANCE_REDIS_URL");
    /// assert!(format!("{redis:?}").contains("ALLOWANCE_REDIS_URL"));
    /// ```
    pub fn url_env(var: impl Into<String>) -> Self {
        Self {
            url: None,
            url_env: Some(var.into()),
            options: RedisStoreOptions::new(),
        }
    }

    /// The same Redis, opened with `options`.
    pub fn with_options(self, options: RedisStoreOptions) -> Self {
        Self { options, ..self }
    }

    /// The options the store is opened with.
    pub fn options(&self) -> &RedisStoreOptions {
        &self.options
    }

    /// The URL: `url`, or the value of the variable `url_env` names.
    fn resolve_url(&self) -> Result<String, ConnectError> {
        let invalid = |why: String| ConnectError::new(ConnectErrorKind::InvalidUrl, why);
        match (&self.url, &self.url_env) {
            (Some(url), None) => Ok(url.clone()),
            (None, Some(var)) => {
                std::env::var(var).map_err(|e| invalid(format!("`url_env`: ${var}: {e}")))
            }
            _ => Err(invalid(
                "a redis store needs exactly one of `url` and `url_env`".to_owned(),
            )),
        }
    }
}

impl fmt::Debug for RedisSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A URL may carry a password: never printed.
        f.debug_struct("RedisSpec")
            .field("url", &self.url.as_ref().map(|_| "<redacted>"))
            .field("url_env", &self.url_env)
            .field("options", &self.options)
            .finish()
    }
}

impl OpenStore for StoreSpec {
    type Error = ConnectError;

    fn open(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Arc<dyn Store>, ConnectError>> + Send {
        let name = name.to_owned();
        let this = self.clone();
        async move {
            match this {
                StoreSpec::Memory => {
                    Ok(Arc::new(tower_allowance::store::MemoryStore::new()) as Arc<dyn Store>)
                }
                StoreSpec::Redis(redis) => {
                    let url = redis.resolve_url()?;
                    let store = RedisStore::connect(&url, &name, redis.options).await?;
                    Ok(Arc::new(store) as Arc<dyn Store>)
                }
            }
        }
    }
}
