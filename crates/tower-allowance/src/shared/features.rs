//! The accessors of [`Shared`] and [`Stats`] only a feature's code calls: `keyed` (the
//! registry asks the store directly) and `dialects` (the provider's view a response stated).

#[cfg(feature = "dialects")]
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::Shared;
#[cfg(feature = "dialects")]
use {super::Stats, crate::signals::RateLimitObservation};

#[cfg(feature = "keyed")]
impl Shared {
    /// The store, for what only asks it (the keyed registry's `is_settled`).
    pub(crate) fn store(&self) -> &dyn crate::store::Store {
        &*self.store
    }
}

#[cfg(feature = "dialects")]
impl Shared {
    /// Keeps the provider's view of the allowance, as a response stated it.
    pub(crate) fn observe(&self, seen: RateLimitObservation) {
        self.stats.observe(seen);
    }
}

#[cfg(feature = "dialects")]
impl Stats {
    /// The provider's own view last seen, for a [`Snapshot`](crate::Snapshot).
    pub(crate) fn last_observation(&self) -> Option<RateLimitObservation> {
        lock(&self.rate_limit).clone()
    }

    /// Keeps `seen` as the provider's view last seen.
    pub(crate) fn observe(&self, seen: RateLimitObservation) {
        *lock(&self.rate_limit) = Some(seen);
    }
}

#[cfg(feature = "dialects")]
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
