//! `AllowanceConfig::with_settlement` (feature `settle`): how unused reservations come back.
//! A child of `config` (it sets the rule's parameters); the layer is `cost::settle`.

use crate::{rule::settle::SettleParams, AllowanceConfig};

/// How unused reservations come back (see the [module docs](crate::cost::settle)).
///
/// ```
/// use tower_allowance::{cost::settle::Settlement, AllowanceConfig, Limit};
///
/// let config = AllowanceConfig::per_minute(500, 500)?
///     .with_limit(Limit::per_minute(30_000, 30_000)?.counting_cost())?
///     .with_settlement(Settlement::share(0.5));
/// assert_eq!(config.settlement(), Some(Settlement::share(0.5)));
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settlement {
    share_milli: u64,
    learn: bool,
}

impl Settlement {
    /// Learned from the provider's remaining tokens, starting from "nothing comes back".
    pub const fn learned() -> Self {
        Self {
            share_milli: 0,
            learn: true,
        }
    }

    /// The whole unused part comes back.
    pub const fn all() -> Self {
        Self {
            share_milli: 1000,
            learn: false,
        }
    }

    /// Nothing comes back (an under-estimate is still debited).
    pub const fn none() -> Self {
        Self {
            share_milli: 0,
            learn: false,
        }
    }

    /// This share (0 to 1, to a thousandth) of the unused part comes back.
    pub fn share(share: f64) -> Self {
        let share = if share.is_nan() {
            0.0
        } else {
            share.clamp(0.0, 1.0)
        };
        Self {
            // In 0..=1000 after the clamp.
            share_milli: (share * 1000.0).floor() as u64,
            learn: false,
        }
    }

    /// Learn, starting from this share instead of none.
    pub fn learning(mut self) -> Self {
        self.learn = true;
        self
    }

    /// The share, in thousandths (the starting point when learned).
    pub fn share_milli(&self) -> u64 {
        self.share_milli
    }

    /// Whether the share is learned from the provider's readings.
    pub fn is_learned(&self) -> bool {
        self.learn
    }
}

impl AllowanceConfig {
    /// Settles every admitted attempt to what its answer used (feature `settle`; see
    /// [`cost::settle`](crate::cost::settle)). Every admission must then be settled: put a
    /// [`SettleLayer`](crate::cost::settle::SettleLayer) under the allowance's layer.
    pub fn with_settlement(mut self, settlement: Settlement) -> Self {
        self.params.0.settle = Some(SettleParams {
            share_milli: settlement.share_milli,
            learn: settlement.learn,
        });
        self
    }

    /// The settlement configured, if any.
    pub fn settlement(&self) -> Option<Settlement> {
        self.rule_params().settle.map(|p| Settlement {
            share_milli: p.share_milli,
            learn: p.learn,
        })
    }
}
