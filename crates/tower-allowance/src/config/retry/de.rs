//! The file form: every field optional (the defaults of [`RetryConfig::default`]),
//! durations as human-readable strings, unknown fields refused, and every validation
//! error naming its field.
//!
//! There is no `backoff_base_ms`/`backoff_max_ms` alias: as with the allowance's
//! `period`, a duration has one name and one form, and the old names are refused as
//! unknown fields (the error lists the current ones), so a file cannot give both.

use super::*;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetryConfig {
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    retry_transport_errors: bool,
    #[serde(default)]
    replayable_methods: Option<Vec<String>>,
    #[serde(default)]
    idempotency_key: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    backoff_base: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    backoff_max: Option<Duration>,
    #[serde(default)]
    jitter_seed: Option<u64>,
    #[serde(default)]
    replay_cap_bytes: Option<usize>,
}

impl TryFrom<RawRetryConfig> for RetryConfig {
    type Error = ConfigError;

    fn try_from(raw: RawRetryConfig) -> Result<Self, ConfigError> {
        let mut config = RetryConfig::default().with_transport_errors(raw.retry_transport_errors);
        if let Some(n) = raw.max_attempts {
            config = config
                .with_max_attempts(n)
                .map_err(|e| e.at("max_attempts"))?;
        }
        if let Some(methods) = raw.replayable_methods {
            let methods = methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.as_bytes()).map_err(|_| {
                        ConfigError::new("not an HTTP method").at("replayable_methods")
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            config = config.with_replayable_methods(methods);
        }
        if let Some(honour) = raw.idempotency_key {
            config = config.with_idempotency_key(honour);
        }
        let base = raw.backoff_base.unwrap_or(config.backoff_base);
        let max = raw.backoff_max.unwrap_or(config.backoff_max);
        // A zero base is the base's fault; any other broken rule (a max below the base
        // or beyond MAX_DELAY) is the max's, unless the file left the max at its default
        // and raised the base past it.
        let at = if base.is_zero() || (raw.backoff_max.is_none() && base > max) {
            "backoff_base"
        } else {
            "backoff_max"
        };
        config = config.with_backoff(base, max).map_err(|e| e.at(at))?;
        if let Some(seed) = raw.jitter_seed {
            config = config.with_jitter_seed(seed);
        }
        if let Some(cap) = raw.replay_cap_bytes {
            config = config.with_replay_cap(cap);
        }
        Ok(config)
    }
}

#[cfg(test)]
mod file_form {
    use super::*;

    fn parse(json: &str) -> Result<RetryConfig, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn durations_read_as_people_write_them() {
        let c = parse(
            r#"{"max_attempts": 4, "backoff_base": "250ms", "backoff_max": "1m 30s",
                "retry_transport_errors": true, "replayable_methods": ["GET", "POST"],
                "idempotency_key": false, "jitter_seed": 7, "replay_cap_bytes": 1024}"#,
        )
        .expect("valid");
        let built = RetryConfig::default()
            .with_max_attempts(4)
            .and_then(|c| c.with_backoff(Duration::from_millis(250), Duration::from_secs(90)))
            .expect("valid")
            .with_transport_errors(true)
            .with_replayable_methods([Method::GET, Method::POST])
            .with_idempotency_key(false)
            .with_jitter_seed(7)
            .with_replay_cap(1024);
        assert_eq!(c, built);
        assert_eq!(parse("{}").expect("all optional"), RetryConfig::default());
    }

    #[test]
    fn mistakes_are_refused_naming_the_field() {
        let cases = [
            (r#"{"max_attempts": 0}"#, "`max_attempts`"),
            (r#"{"backoff_base": "0s"}"#, "`backoff_base`"),
            // Above the default max (10 s) with no max given: the base is what is wrong.
            (r#"{"backoff_base": "20s"}"#, "`backoff_base`"),
            (
                r#"{"backoff_base": "2s", "backoff_max": "1s"}"#,
                "`backoff_max`",
            ),
            (r#"{"backoff_max": "300years"}"#, "`backoff_max`"),
            (
                r#"{"replayable_methods": ["GET", "BAD METHOD"]}"#,
                "`replayable_methods`",
            ),
            (r#"{"max_attempt": 3}"#, "unknown field `max_attempt`"),
            // The old integer names are gone; the error lists the current ones.
            (
                r#"{"backoff_base_ms": 100}"#,
                "unknown field `backoff_base_ms`",
            ),
            (r#"{"backoff_max_ms": 100}"#, "`backoff_max`"),
            (r#"{"backoff_base": "soon"}"#, "soon"),
            (r#"{"backoff_base": 100}"#, "invalid type"),
        ];
        for (json, expected) in cases {
            let err = parse(json).expect_err(json);
            assert!(err.contains(expected), "{json}: {err}");
        }
    }
}
