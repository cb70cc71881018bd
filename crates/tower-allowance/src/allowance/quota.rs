//! The quota probe's side of the handle and the builder (feature `quota`).

use std::sync::Arc;

use super::{Allowance, AllowanceBuilder};
use crate::quota::{QuotaGuard, QuotaProbe, QuotaTrigger};

impl Allowance {
    /// How many quota probes this process has run.
    #[cfg_attr(docsrs, doc(cfg(feature = "quota")))]
    pub fn quota_probes(&self) -> u64 {
        self.shared.quota().as_ref().map_or(0, |q| q.probes())
    }

    /// A throttling response arrived; `with_delay` when it carried a usable delay.
    pub(crate) fn on_throttled(&self, with_delay: bool) {
        let Some(q) = &self.shared.quota() else {
            return;
        };
        if with_delay {
            q.clear_streak();
            return;
        }
        if !q.throttled_without_delay() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(crate::shared::probe::run_probe(self.shared.clone()));
            }
            Err(_) => q.clear_streak(),
        }
    }
}

impl AllowanceBuilder {
    /// Adds the quota-exhaustion terminal path (see [`quota`](crate::quota)).
    #[cfg_attr(docsrs, doc(cfg(feature = "quota")))]
    pub fn quota_probe(mut self, probe: impl QuotaProbe, trigger: QuotaTrigger) -> Self {
        self.quota = Some(QuotaGuard::new(Arc::new(probe), trigger));
        self
    }
}
