//! The `serde` form of a snapshot's abandonment counts: only the reasons that happened, by
//! their stable names.

use super::AbandonedCounts;

impl serde::Serialize for AbandonedCounts {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for (reason, n) in self.iter() {
            map.serialize_entry(reason.as_str(), &n)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use crate::{
        error::AbandonReason, AcquireOptions, Allowance, AllowanceConfig, RetryBudgetConfig,
    };

    /// What a dashboard or a status endpoint gets: the snapshot and the store's state as
    /// JSON, every field named.
    #[tokio::test(start_paused = true)]
    async fn snapshot_and_store_state_serialize() {
        let allowance = Allowance::builder(
            AllowanceConfig::per_second(1, 1)
                .expect("valid")
                .with_retry_budget(RetryBudgetConfig::fixed(3))
                .with_max_cooldown(Duration::from_secs(60))
                .expect("valid"),
        )
        .name("odds")
        .build();
        allowance.acquire().await.expect("the burst");
        let late = tokio::time::Instant::now() + Duration::from_millis(10);
        let refused = allowance
            .acquire_with(AcquireOptions::new().deadline(late))
            .await;
        assert!(refused.is_err());
        allowance
            .extend_cooldown(Duration::from_secs(30))
            .await
            .expect("defers");

        let snapshot = serde_json::to_value(allowance.snapshot()).expect("serializes");
        assert_eq!(snapshot["name"], "odds");
        assert_eq!(snapshot["admitted"], 1);
        assert_eq!(snapshot["waited"], 0);
        assert_eq!(snapshot["deferred"], 1);
        assert_eq!(snapshot["retries_spent"], 0);
        // Only the reasons that happened, by their stable names.
        assert_eq!(snapshot["abandoned"], json!({ "deadline": 1 }));
        assert_eq!(snapshot["waiting"], 0);
        assert_eq!(snapshot["cooling_for"], json!("30s"));
        assert_eq!(snapshot["closed"], json!(null));
        assert_eq!(snapshot["rate_limit"], json!(null));
        // Only the store knows these: asked by `refresh`, not by `snapshot`.
        assert_eq!(snapshot["retries_remaining"], json!(null));

        let state = serde_json::to_value(allowance.store_state().await.expect("reads"))
            .expect("serializes");
        assert_eq!(state["blocked_for"], json!("30s"));
        assert_eq!(state["closed"], json!(null));
        assert_eq!(state["retries_remaining"], 3);
        for field in ["probes", "epoch", "generation", "rate_milli"] {
            assert!(state[field].is_u64(), "{field}: {state}");
        }

        // Closed (until the server's time, 2 min): a server asked for longer than
        // max_cooldown.
        allowance
            .extend_cooldown(Duration::from_secs(120))
            .await
            .expect("closes");
        let snapshot = serde_json::to_value(allowance.snapshot()).expect("serializes");
        assert_eq!(
            snapshot["closed"],
            json!({ "reopens_in": "2m", "reason": "cooldown_too_long" })
        );
        // The store's view: the same shape, with what only the store knows.
        let refreshed =
            serde_json::to_value(allowance.refresh().await.expect("reads")).expect("serializes");
        assert_eq!(
            refreshed["closed"],
            json!({ "reopens_in": "2m", "reason": "cooldown_too_long" })
        );
        assert_eq!(refreshed["retries_remaining"], 3);
        assert_eq!(refreshed["adaptive_rate"], json!(null));
        let state = serde_json::to_value(allowance.store_state().await.expect("reads"))
            .expect("serializes");
        assert_eq!(state["closed"], json!({ "for": "2m" }));
        // Closed until cleared is not "open".
        let until_cleared = crate::rule::StoreState {
            closed: Some(None),
            ..Default::default()
        };
        let state = serde_json::to_value(until_cleared).expect("serializes");
        assert_eq!(state["closed"], json!({ "for": null }));
        assert_eq!(
            AbandonReason::CooldownTooLong.as_str(),
            serde_json::to_value(AbandonReason::CooldownTooLong).expect("serializes")
        );
    }
}
