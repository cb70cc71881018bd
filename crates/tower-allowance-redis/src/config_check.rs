//! One name, one configuration: the settings every process of an allowance must agree on
//! (its limits, retry budget, longest cooldown, quota-probe backoff, adaptive rate) kept
//! beside its state in `ta:{name}:cfg`, so that a process joining with different ones is
//! refused, naming both, instead of spending the allowance at another rate.
//!
//! Checked with the store's first decision, then every half `idle_ttl` (which keeps the key
//! alive while any process uses it): one pipeline (`SET NX`, `PEXPIRE`, `GET`), outside the
//! script. [`Allowance::clear`](tower_allowance::Allowance::clear) deletes it, so that the
//! next process to decide sets its configuration (the way to change one in place).

use tower_allowance::rule::{BudgetParams, Params, Unit};

/// The key holding the configuration of the allowance `name`, in its hash slot.
pub(crate) fn key(name: &str) -> String {
    format!("ta:{{{name}}}:cfg")
}

/// The configuration as the processes compare it: the numbers the rule decides with, named.
pub(crate) fn describe(params: &Params) -> String {
    let limits: Vec<String> = params
        .limits()
        .iter()
        .map(|l| {
            let unit = match l.unit() {
                Unit::Requests => "",
                Unit::Cost => " cost",
            };
            format!(
                "every {}us, {}us ahead{unit}",
                l.interval_us(),
                l.tolerance_us()
            )
        })
        .collect();
    let budget = match params.budget() {
        BudgetParams::Unlimited => "unlimited".to_owned(),
        BudgetParams::Fixed { retries } => format!("fixed {retries}"),
        BudgetParams::Replenishing {
            slot_us,
            reserve,
            per_mille,
        } => format!("replenishing {reserve} per {slot_us}us slot, {per_mille} per mille"),
    };
    let adaptive = params.adaptive().map_or_else(
        || "fixed".to_owned(),
        |a| {
            format!(
                "adaptive from {} within {}..={} milli/s, burst {}{}",
                a.initial_milli(),
                a.floor_milli(),
                a.ceiling_milli(),
                a.burst(),
                if a.adopts() { ", adopting" } else { "" }
            )
        },
    );
    format!(
        "limits [{}]; retry budget {budget}; max cooldown {}us; probe backoff {}..{}us; rate {adaptive}",
        limits.join("; "),
        params.max_cooldown_us(),
        params.probe_backoff_min_us(),
        params.probe_backoff_max_us(),
    )
}

#[cfg(test)]
mod tests {
    use tower_allowance::{AllowanceConfig, RetryBudgetConfig};

    use super::*;

    #[test]
    fn configurations_that_differ_are_described_apart() {
        let four = AllowanceConfig::per_second(4, 4).expect("valid");
        let forty = AllowanceConfig::per_second(40, 4).expect("valid");
        assert_ne!(describe(four.params()), describe(forty.params()));
        let budget = four.clone().with_retry_budget(RetryBudgetConfig::fixed(10));
        assert_ne!(describe(four.params()), describe(budget.params()));
        assert_eq!(
            describe(four.params()),
            describe(AllowanceConfig::per_second(4, 4).expect("valid").params())
        );
        assert!(describe(budget.params()).contains("retry budget fixed 10"));
        assert_eq!(key("odds-api"), "ta:{odds-api}:cfg");
    }
}
