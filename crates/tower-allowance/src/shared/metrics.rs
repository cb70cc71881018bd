//! Metrics through the `metrics` facade (feature `metrics`): handles registered once per
//! allowance, labelled with its name, so that recording allocates nothing.
//!
//! | metric | kind | labels |
//! | --- | --- | --- |
//! | `tower_allowance_admissions_total` | counter | `allowance`, `waited` (`true`/`false`) |
//! | `tower_allowance_retries_total` | counter | `allowance` |
//! | `tower_allowance_abandoned_total` | counter | `allowance`, `reason` |
//! | `tower_allowance_cooldowns_total` | counter | `allowance` |
//! | `tower_allowance_closures_total` | counter | `allowance`, `reason` (`cooldown_too_long`, `quota_exhausted`) |
//! | `tower_allowance_throttled_responses_total` | counter | `allowance`, `status` |
//! | `tower_allowance_store_errors_total` | counter | `allowance`, `kind` |
//! | `tower_allowance_wait_seconds` | histogram | `allowance` |
//! | `tower_allowance_store_call_duration_seconds` | histogram | `allowance` |
//! | `tower_allowance_cooldown_remaining_seconds` | gauge | `allowance` |
//! | `tower_allowance_retry_budget_remaining` | gauge | `allowance` |
//! | `tower_allowance_waiting` | gauge | `allowance` |
//! | `tower_allowance_rate_per_second` | gauge | `allowance` (adaptive rates) |

#[cfg(feature = "metrics")]
pub(crate) use enabled::Metrics;

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::Metrics;

#[cfg(feature = "metrics")]
mod enabled;

#[cfg(not(feature = "metrics"))]
mod disabled {
    use std::{sync::Arc, time::Duration};

    use crate::{error::AbandonReason, rule::StoreState};

    /// Without the `metrics` feature: nothing recorded, nothing stored.
    pub(crate) struct Metrics;

    impl Metrics {
        pub(crate) fn new(_name: Arc<str>) -> Self {
            Self
        }

        pub(crate) fn admitted(&self, _waited: Option<Duration>, _retry: bool) {}

        pub(crate) fn abandoned(&self, _reason: AbandonReason) {}

        pub(crate) fn cooldown(&self, _remaining: Duration) {}

        pub(crate) fn closed(&self, _by: crate::rule::ClosedBy) {}

        pub(crate) fn throttled(&self, _status: u16) {}

        pub(crate) fn state(&self, _state: &StoreState, _waiting: usize) {}
    }
}
