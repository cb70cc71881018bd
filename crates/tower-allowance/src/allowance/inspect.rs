//! The store's state read through an allowance: the rule's own value (feature `rule`, the
//! conformance suite, tests) and whether it is settled (the keyed registry).

#[cfg(feature = "keyed")]
use tokio::time::Instant;

#[cfg(any(test, feature = "rule"))]
use crate::{rule::StoreState, store::StoreError};

use super::Allowance;

impl Allowance {
    /// Whether its store says the state is settled at `now`, as good as a fresh one
    /// ([`Store::is_settled`](crate::store::Store::is_settled)). For the keyed registry.
    #[cfg(feature = "keyed")]
    pub(crate) fn is_settled(&self, now: Instant) -> bool {
        self.shared
            .store()
            .is_settled(now, self.shared.config().params())
    }

    /// How many handles share its state now: every clone, and every layer, service and
    /// future built from one (an `Arc`'s strong count). For the keyed registry: whether a
    /// clone of an allowance it handed out is still alive.
    #[cfg(feature = "keyed")]
    pub(crate) fn sharers(&self) -> usize {
        std::sync::Arc::strong_count(&self.shared)
    }

    /// Reads the store's shared state: the rule's own value (feature `rule`, outside semver;
    /// [`Allowance::refresh`] is the stable view).
    ///
    /// # Errors
    ///
    /// The store's error.
    #[cfg(any(test, feature = "rule"))]
    pub async fn store_state(&self) -> Result<StoreState, StoreError> {
        self.read_store().await
    }
}
