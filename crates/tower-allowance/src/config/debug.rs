//! A readable `Debug` for the configuration: what was configured, without the parameters
//! derived from it for the stores ([`AllowanceConfig::params`]).

use std::fmt;

use super::AllowanceConfig;

/// `AllowanceConfig { limits: [Limit { rate: 2, period: 1s, .. }], max_waiters: 1024, .. }`.
impl fmt::Debug for AllowanceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("AllowanceConfig");
        d.field("limits", &self.limits)
            .field("max_waiters", &self.max_waiters)
            .field("retry_budget", &self.retry_budget)
            .field("max_cooldown", &self.max_cooldown)
            .field("outage", &self.outage);
        #[cfg(any(test, feature = "adaptive"))]
        d.field("adaptive", &self.adaptive);
        d.field("dialect", &self.dialect)
            .field("classifier", &self.classifier)
            .field("retry", &self.retry)
            .field("max_date_skew", &self.max_date_skew)
            .finish_non_exhaustive()
    }
}
