//! The adaptive rate's setter and getter (feature `adaptive`; the setter in tests too).

use super::{AdaptiveRate, AllowanceConfig};

impl AllowanceConfig {
    /// Lets the main limit's rate adapt (see [`AdaptiveRate`]); its configured rate is then
    /// only the starting point's fallback, and its burst is kept.
    #[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
    pub fn with_adaptive_rate(mut self, adaptive: AdaptiveRate) -> Self {
        self.adaptive = Some(adaptive);
        self.derive();
        self
    }

    /// The adaptive rate, if any.
    #[cfg(feature = "adaptive")]
    #[cfg_attr(docsrs, doc(cfg(feature = "adaptive")))]
    pub fn adaptive_rate(&self) -> Option<AdaptiveRate> {
        self.adaptive
    }
}
