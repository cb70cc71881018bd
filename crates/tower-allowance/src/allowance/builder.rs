use std::sync::Arc;

use crate::{
    shared::Shared,
    store::{MemoryStore, Store},
    Allowance, AllowanceConfig,
};

/// Builds an [`Allowance`]: a name, a shared store, a quota probe (feature `quota`).
///
/// ```
/// use tower_allowance::{store::MemoryStore, Allowance, AllowanceConfig};
///
/// let allowance = Allowance::builder(AllowanceConfig::per_second(5, 1)?)
///     .name("odds-api")
///     .store(MemoryStore::new())
///     .build();
/// assert_eq!(allowance.name(), "odds-api");
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct AllowanceBuilder {
    pub(crate) config: AllowanceConfig,
    name: Option<Arc<str>>,
    store: Option<Box<dyn Store>>,
    #[cfg(feature = "quota")]
    pub(super) quota: Option<crate::quota::QuotaGuard>,
}

impl AllowanceBuilder {
    pub(crate) fn new(config: AllowanceConfig) -> Self {
        Self {
            config,
            name: None,
            store: None,
            #[cfg(feature = "quota")]
            quota: None,
        }
    }

    /// Names the allowance in logs, events and metrics (default: the store's name, such as
    /// a Redis store's allowance name, else `"default"`).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Keeps the state in `store` instead of a new [`MemoryStore`].
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Box::new(store));
        self
    }

    /// Builds the allowance, and starts hearing the store's events.
    pub fn build(self) -> Allowance {
        let store = self.store.unwrap_or_else(|| Box::new(MemoryStore::new()));
        let name = self.name.or_else(|| store.name().map(Arc::from));
        let name = name.unwrap_or_else(|| Arc::from("default"));
        #[cfg(feature = "quota")]
        let shared = Shared::new(name, self.config, store, self.quota);
        #[cfg(not(feature = "quota"))]
        let shared = Shared::new(name, self.config, store);
        Allowance { shared }
    }
}
