//! Versioned configurations: the newest configuration on a name decides for every process on
//! it, so that a rolling deploy changes a limit without refusing anyone.
//!
//! Each store learns its version once, with its first decision: the Redis server's `TIME`
//! (one command, single-flight: however many callers decide at once, one asks; on a cluster,
//! the key's primary's, from which the store learns the server's clock too: `validity`).
//! Every call then carries the configuration block `;VERSION,PINNED` at the end of its
//! parameters text; the script (`lua/config.lua`) keeps the configuration in force in the
//! state hash (field `k`, `VERSION;TEXT`) and decides with the newest: a newer caller's is
//! stored (and its takeover published on the channel, `k:VERSION;TEXT`, which every process
//! logs once at INFO); an older caller decides with the stored one, in the same atomic call.
//! A process with [`RedisStoreOptions::pin_config`](crate::RedisStoreOptions::pin_config) is
//! refused instead ([`CallErrorKind::ConfigMismatch`], naming both in the units configured).
//!
//! [`Allowance::clear`](tower_allowance::Allowance::clear) resets the state and keeps the
//! configuration in force: there is nothing to wait for, every decision reads it.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, PoisonError,
    },
};

use tokio::sync::OnceCell;
use tower_allowance::rule::{BudgetParams, Params, Unit};

use crate::error::{CallError, CallErrorKind};

/// One store's configuration version, and what it heard of others'.
pub(crate) struct ConfigCheck {
    /// The server's time (microseconds) when the version was first asked for.
    version: OnceCell<u64>,
    /// Whether this process refuses to decide with another configuration.
    pinned: bool,
    /// The last takeover logged (its version), so that each is logged once.
    heard: AtomicU64,
    /// This process's own parameters text, once it decided (to tell a takeover by another
    /// configuration from one by the same configuration).
    own: Mutex<Option<String>>,
}

// === impl ConfigCheck ===

impl ConfigCheck {
    pub(crate) fn new(pinned: bool) -> Self {
        Self {
            version: OnceCell::new(),
            pinned,
            heard: AtomicU64::new(0),
            own: Mutex::new(None),
        }
    }

    /// This store's version: the server's `TIME` at its first decision (`ask`), asked once
    /// however many callers decide at once (the others wait for that answer). A failure is
    /// the call's, and the next decision asks again.
    pub(crate) async fn version<F, Fut>(&self, ask: F) -> Result<u64, CallError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<u64, CallError>>,
    {
        self.version.get_or_try_init(ask).await.copied()
    }

    /// Appends the configuration block (`;VERSION,PINNED`) to a call's parameters text, and
    /// remembers the text as this process's own.
    pub(crate) fn append(&self, text: &mut String, version: u64) {
        {
            let mut own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
            if own.as_deref() != Some(text.as_str()) {
                *own = Some(text.clone());
            }
        }
        text.push_str(&format!(";{version},{}", u8::from(self.pinned)));
    }

    /// A takeover heard on the channel (`VERSION;TEXT`): logged once at INFO by the
    /// processes whose configuration it replaces.
    pub(crate) fn heard(&self, name: &str, config: &str) {
        let Some((version, text)) = config.split_once(';') else {
            return;
        };
        let Ok(version) = version.parse::<u64>() else {
            return;
        };
        let own = self
            .own
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(own) = own else { return };
        if own == text || self.heard.swap(version, Ordering::Relaxed) == version {
            return;
        }
        if self.pinned {
            tracing::warn!(
                allowance = name,
                theirs = %describe_text(text),
                ours = %describe_text(&own),
                "a newer configuration took over the allowance; this process pins its own and \
                 is refused until it is restarted with the new one"
            );
        } else {
            tracing::info!(
                allowance = name,
                now = %describe_text(text),
                was = %describe_text(&own),
                "a newer configuration took over the allowance: this process decides with it \
                 from now on"
            );
        }
    }
}

/// The refusal of a pinned process (`TACONFIG VERSION;TEXT` from the script), naming both
/// configurations in the units configured; `None` for any other error.
pub(crate) fn mismatch(e: &redis::RedisError, params: &Params, name: &str) -> Option<CallError> {
    if e.code() != Some("TACONFIG") {
        return None;
    }
    let theirs = e
        .detail()
        .and_then(|d| d.split_once(';'))
        .map_or_else(|| "unreadable".to_owned(), |(_, t)| describe_text(t));
    Some(CallError::with_source(
        CallErrorKind::ConfigMismatch,
        format!(
            "allowance {name}: this process pins its configuration ({}), and a newer one \
             decides for the name ({theirs}); restart it with the new configuration, or \
             leave pin_config off to adopt the newest",
            describe(params)
        ),
    ))
}

/// A configuration as the processes compare it, in the units people configure: rates per
/// second and bursts, the budget, the longest cooldown.
pub(crate) fn describe(params: &Params) -> String {
    let limits: Vec<(u64, u64, bool)> = params
        .limits()
        .iter()
        .map(|l| (l.interval_us(), l.tolerance_us(), l.unit() == Unit::Cost))
        .collect();
    let budget = match params.budget() {
        BudgetParams::Unlimited => "unlimited".to_owned(),
        BudgetParams::Fixed { retries } => format!("fixed {retries}"),
        BudgetParams::Replenishing {
            slot_us,
            reserve,
            per_mille,
        } => format!(
            "{reserve} + {per_mille}/1000 of requests, {} slots",
            seconds(slot_us)
        ),
    };
    words(&limits, &budget, params.max_cooldown_us())
}

/// [`describe`] of a parameters text (the script's form, `scripts::params_text`); the text
/// itself when it cannot be read.
pub(crate) fn describe_text(text: &str) -> String {
    let v: Option<Vec<u64>> = text.split(',').map(|n| n.parse().ok()).collect();
    let Some(v) = v.filter(|v| v.len() >= 21) else {
        return text.to_owned();
    };
    let n = usize::try_from(v[0]).unwrap_or(0).min(4);
    let limits: Vec<(u64, u64, bool)> = (0..n)
        .map(|l| (v[1 + 3 * l], v[2 + 3 * l], v[3 + 3 * l] == 1))
        .collect();
    let budget = match v[13] {
        0 => "unlimited".to_owned(),
        1 => format!("fixed {}", v[14]),
        _ => format!(
            "{} + {}/1000 of requests, {} slots",
            v[15],
            v[16],
            seconds(v[14])
        ),
    };
    words(&limits, &budget, v[17])
}

fn words(limits: &[(u64, u64, bool)], budget: &str, max_cooldown_us: u64) -> String {
    let limits: Vec<String> = limits
        .iter()
        .map(|&(interval, tolerance, cost)| {
            let burst = tolerance.div_ceil(interval.max(1));
            let unit = if cost { " cost units" } else { "" };
            format!("{}{unit}, burst {burst}", rate(interval))
        })
        .collect();
    format!(
        "{}; retry budget {budget}; longest cooldown {}",
        limits.join(" and "),
        seconds(max_cooldown_us)
    )
}

/// One token every `interval_us`, as a rate: `4/s`, `0.5/s`, `1/min`.
fn rate(interval_us: u64) -> String {
    let per_s = 1e6 / interval_us.max(1) as f64;
    if per_s >= 0.1 {
        format!("{}/s", trim(per_s))
    } else {
        format!("{}/min", trim(per_s * 60.0))
    }
}

/// Microseconds as seconds: `2.5s`, `3600s`.
fn seconds(us: u64) -> String {
    format!("{}s", trim(us as f64 / 1e6))
}

fn trim(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use tower_allowance::{AllowanceConfig, RetryBudgetConfig};

    use super::*;

    #[test]
    fn configurations_are_described_in_the_units_configured() {
        let four = AllowanceConfig::per_second(4, 4).expect("valid").exact();
        let text = describe(four.params().rule());
        assert!(text.starts_with("4/s, burst 4;"), "{text}");
        assert!(!text.contains("us"), "no internal units: {text}");
        let budget = four.clone().with_retry_budget(RetryBudgetConfig::fixed(10));
        assert!(describe(budget.params().rule()).contains("retry budget fixed 10"));
        // The text form (what the script stores) reads the same.
        let t = crate::scripts::params_text_for_tests(four.params().rule());
        assert_eq!(describe_text(&t), text);
        assert_eq!(describe_text("junk"), "junk");
        assert_eq!(rate(60_000_000), "1/min");
        assert_eq!(seconds(250_000), "0.25s");
    }

    #[test]
    fn the_block_is_appended_last() {
        let check = ConfigCheck::new(true);
        let mut text = "1,2,3".to_owned();
        check.append(&mut text, 42);
        assert_eq!(text, "1,2,3;42,1");
        assert_eq!(
            check.own.lock().expect("unpoisoned").as_deref(),
            Some("1,2,3")
        );
    }
}
