//! One name, one configuration: the settings every process of an allowance must agree on
//! (its limits, retry budget, longest cooldown, quota-probe backoff, adaptive rate) kept
//! beside its state in `ta:{name}:cfg`, so that a process joining with different ones is
//! refused, naming both, instead of spending the allowance at another rate.
//!
//! Checked with the store's first decision, then every half `idle_ttl` (which keeps the key
//! alive while any process uses it): one pipeline (`SET NX`, `PEXPIRE`, `GET`), outside the
//! script. [`Allowance::clear`](tower_allowance::Allowance::clear) deletes it, so that the
//! next process to decide sets its configuration (the way to change one in place).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tower_allowance::rule::{BudgetParams, Op, Params, Unit};

use crate::{
    access,
    error::{CallError, CallErrorKind},
    link::{millis, with_timeout, Link},
};

/// One store's check of its configuration against the one in Redis.
pub(crate) struct ConfigCheck {
    /// `ta:{name}:cfg`.
    key: String,
    /// When the configuration is next checked, in the store's circuit's microseconds; 0:
    /// before the first decision.
    next_at_us: AtomicU64,
}

// === impl ConfigCheck ===

impl ConfigCheck {
    /// The check of the allowance `name`, due with its first decision.
    pub(crate) fn new(name: &str) -> Self {
        Self {
            key: key(name),
            next_at_us: AtomicU64::new(0),
        }
    }

    /// The store's first decision, and one every half `idle_ttl` (`now_us` on the same clock
    /// as the last call's): is the configuration the one every other process of the
    /// allowance `name` uses? One pipeline over `link`, not counted in its round trips (it
    /// decides nothing). Before `Clear`, the key is deleted instead, and this process sets
    /// its configuration with its next decision.
    ///
    /// # Errors
    ///
    /// [`CallErrorKind::ConfigMismatch`], naming both configurations; or the call's error.
    pub(crate) async fn run(
        &self,
        link: &Link,
        name: &str,
        now_us: u64,
        params: &Params,
        op: &Op,
    ) -> Result<(), CallError> {
        let key = &self.key;
        let ttl = link.options.idle_ttl.max(Duration::from_secs(1));
        let mut conn = link.conn.clone();
        if matches!(op, Op::Clear) {
            let mut del = redis::cmd("DEL");
            del.arg(key);
            with_timeout(link.options.timeout, del.query_async::<i64>(&mut conn))
                .await?
                .map_err(CallError::redis)?;
            self.next_at_us.store(0, Ordering::Relaxed);
            return Ok(());
        }
        if now_us < self.next_at_us.load(Ordering::Relaxed) {
            return Ok(());
        }
        let ours = describe(params);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(key)
            .arg(&ours)
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl))
            .ignore()
            .cmd("PEXPIRE")
            .arg(key)
            .arg(millis(ttl))
            .ignore()
            .cmd("GET")
            .arg(key);
        let read = pipe.query_async::<(Option<String>,)>(&mut conn);
        let (theirs,) = with_timeout(link.options.timeout, read)
            .await?
            .map_err(|e| access::call_error(e, name, link.events.source()))?;
        match theirs {
            Some(theirs) if theirs != ours => Err(CallError::with_source(
                CallErrorKind::ConfigMismatch,
                format!(
                    "this process: {ours}; the processes already using it ({key}): {theirs}; \
                     give each configuration its own allowance name, or clear() the \
                     allowance to let the next process set a new one"
                ),
            )),
            _ => {
                let every = u64::try_from(ttl.as_micros() / 2).unwrap_or(u64::MAX);
                self.next_at_us
                    .store(now_us.saturating_add(every), Ordering::Relaxed);
                Ok(())
            }
        }
    }
}

/// The key holding the configuration of the allowance `name`, in its hash slot.
fn key(name: &str) -> String {
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
        assert_ne!(
            describe(four.params().rule()),
            describe(forty.params().rule())
        );
        let budget = four.clone().with_retry_budget(RetryBudgetConfig::fixed(10));
        assert_ne!(
            describe(four.params().rule()),
            describe(budget.params().rule())
        );
        assert_eq!(
            describe(four.params().rule()),
            describe(
                AllowanceConfig::per_second(4, 4)
                    .expect("valid")
                    .params()
                    .rule()
            )
        );
        assert!(describe(budget.params().rule()).contains("retry budget fixed 10"));
        assert_eq!(key("odds-api"), "ta:{odds-api}:cfg");
    }
}
