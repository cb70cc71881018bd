//! The recorder behind the `metrics` feature: one handle per metric and label set.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use crate::{
    error::AbandonReason,
    rule::{ClosedBy, StoreState},
    store::StoreErrorKind,
};

/// The allowance's metric handles.
pub(crate) struct Metrics {
    name: Arc<str>,
    admitted_now: Counter,
    admitted_waited: Counter,
    retries: Counter,
    abandoned: Vec<Counter>,
    cooldowns: Counter,
    /// Closures, by reason: server delay, quota.
    closures: [Counter; 2],
    store_errors: [Counter; 3],
    wait: Histogram,
    store_call: Histogram,
    cooldown_remaining: Gauge,
    budget_remaining: Gauge,
    waiting: Gauge,
    rate: Gauge,
    throttled: Mutex<Vec<(u16, Counter)>>,
}

impl Metrics {
    pub(crate) fn new(name: Arc<str>) -> Self {
        let n = || name.to_string();
        Self {
            admitted_now: counter!("tower_allowance_admissions_total", "allowance" => n(), "waited" => "false"),
            admitted_waited: counter!("tower_allowance_admissions_total", "allowance" => n(), "waited" => "true"),
            retries: counter!("tower_allowance_retries_total", "allowance" => n()),
            abandoned: AbandonReason::each()
                .map(|r| {
                    counter!("tower_allowance_abandoned_total", "allowance" => n(), "reason" => r.as_str())
                })
                .collect(),
            cooldowns: counter!("tower_allowance_cooldowns_total", "allowance" => n()),
            closures: [ClosedBy::ServerDelay, ClosedBy::Quota].map(|by| {
                let reason = AbandonReason::closed_by(by).as_str();
                counter!("tower_allowance_closures_total", "allowance" => n(), "reason" => reason)
            }),
            store_errors: ["unavailable", "rejected", "protocol"].map(|k| {
                counter!("tower_allowance_store_errors_total", "allowance" => n(), "kind" => k)
            }),
            wait: histogram!("tower_allowance_wait_seconds", "allowance" => n()),
            store_call: histogram!("tower_allowance_store_call_duration_seconds", "allowance" => n()),
            cooldown_remaining: gauge!("tower_allowance_cooldown_remaining_seconds", "allowance" => n()),
            budget_remaining: gauge!("tower_allowance_retry_budget_remaining", "allowance" => n()),
            waiting: gauge!("tower_allowance_waiting", "allowance" => n()),
            rate: gauge!("tower_allowance_rate_per_second", "allowance" => n()),
            throttled: Mutex::new(Vec::new()),
            name,
        }
    }

    pub(crate) fn admitted(&self, waited: Option<Duration>, retry: bool) {
        match waited {
            Some(d) => {
                self.admitted_waited.increment(1);
                self.wait.record(d.as_secs_f64());
            }
            None => self.admitted_now.increment(1),
        }
        if retry {
            self.retries.increment(1);
        }
    }

    pub(crate) fn abandoned(&self, reason: AbandonReason) {
        if let Some(c) = self.abandoned.get(reason.index()) {
            c.increment(1);
        }
    }

    pub(crate) fn cooldown(&self, remaining: Duration) {
        self.cooldowns.increment(1);
        self.cooldown_remaining.set(remaining.as_secs_f64());
    }

    pub(crate) fn closed(&self, by: ClosedBy) {
        self.closures[usize::from(by == ClosedBy::Quota)].increment(1);
    }

    pub(crate) fn throttled(&self, status: u16) {
        let mut by_status = self
            .throttled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, c)) = by_status.iter().find(|(s, _)| *s == status) {
            c.increment(1);
            return;
        }
        let c = counter!(
            "tower_allowance_throttled_responses_total",
            "allowance" => self.name.to_string(),
            "status" => status.to_string()
        );
        c.increment(1);
        by_status.push((status, c));
    }

    pub(crate) fn store_call(&self, took: Duration, error: Option<StoreErrorKind>) {
        self.store_call.record(took.as_secs_f64());
        let i = match error {
            None => return,
            Some(StoreErrorKind::Unavailable) => 0,
            Some(StoreErrorKind::Rejected) => 1,
            Some(_) => 2,
        };
        self.store_errors[i].increment(1);
    }

    pub(crate) fn state(&self, state: &StoreState, waiting: usize) {
        self.cooldown_remaining.set(state.blocked_for.as_secs_f64());
        if let Some(left) = state.retries_remaining {
            self.budget_remaining.set(left as f64);
        }
        self.waiting.set(waiting as f64);
        if state.rate_milli > 0 {
            self.rate.set(state.rate_milli as f64 / 1000.0);
        }
    }
}
