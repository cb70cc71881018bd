//! The file form: `{ throttled = [429, 503], transient = [502, 504] }`.
//!
//! The builder methods ignore invalid codes (they take whatever an iterator yields); a
//! file is checked instead, since a typo there (`5003`) is a mistake to report, not to
//! drop.

use super::*;
use crate::ConfigError;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStatusClassifier {
    // Wider than `u16`, so that `70000` or `-1` gets the same message as `1000`.
    #[serde(default)]
    throttled: Option<Vec<i64>>,
    #[serde(default)]
    transient: Option<Vec<i64>>,
}

/// The codes, each within 100..=999.
fn statuses(codes: &[i64], field: &'static str) -> Result<Vec<u16>, ConfigError> {
    codes
        .iter()
        .map(|&code| {
            u16::try_from(code)
                .ok()
                .filter(|code| (100..=999).contains(code))
                .ok_or(ConfigError::new("status codes must be from 100 to 999").at(field))
        })
        .collect()
}

impl TryFrom<RawStatusClassifier> for StatusClassifier {
    type Error = ConfigError;

    fn try_from(raw: RawStatusClassifier) -> Result<Self, ConfigError> {
        let mut classifier = StatusClassifier::default();
        if let Some(codes) = raw.throttled {
            classifier = classifier.throttled(statuses(&codes, "throttled")?);
        }
        if let Some(codes) = raw.transient {
            let codes = statuses(&codes, "transient")?;
            // Throttling wins when a status is in both lists: say so rather than let
            // one line of the file silently mean nothing.
            if codes
                .iter()
                .filter_map(|&c| StatusCode::from_u16(c).ok())
                .any(|status| classifier.throttled.contains(status))
            {
                return Err(
                    ConfigError::new("a status cannot be both throttled and transient")
                        .at("transient"),
                );
            }
            classifier = classifier.transient(codes);
        }
        Ok(classifier)
    }
}

#[cfg(test)]
mod file_form {
    use super::*;

    fn parse(json: &str) -> Result<StatusClassifier, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn lists_read_and_default() {
        assert_eq!(parse("{}").expect("valid"), StatusClassifier::default());
        assert_eq!(
            parse(r#"{"throttled": [429], "transient": [502, 503, 504]}"#).expect("valid"),
            StatusClassifier::default()
                .throttled([429])
                .transient([502, 503, 504])
        );
        // Nothing cools the allowance down: a legitimate choice.
        let c = parse(r#"{"throttled": []}"#).expect("valid");
        let h = HeaderMap::new();
        assert_eq!(
            c.classify(StatusCode::TOO_MANY_REQUESTS, &h),
            Classification::Failure
        );
        assert_eq!(
            parse(r#"{"throttled": [100, 999]}"#).expect("bounds included"),
            StatusClassifier::default().throttled([100, 999])
        );
    }

    #[test]
    fn mistakes_are_refused_naming_the_field() {
        let cases = [
            (r#"{"throttled": [429, 99]}"#, "`throttled`: status codes"),
            (r#"{"throttled": [1000]}"#, "`throttled`: status codes"),
            (r#"{"transient": [-502]}"#, "`transient`: status codes"),
            (r#"{"transient": [70000]}"#, "`transient`: status codes"),
            (
                r#"{"transient": [502, 503]}"#,
                "`transient`: a status cannot be both",
            ),
            (
                r#"{"throttled": [429], "transient": [429]}"#,
                "`transient`: a status cannot be both",
            ),
            (r#"{"throttle": [429]}"#, "unknown field `throttle`"),
            (r#"{"throttled": "429"}"#, "invalid type"),
        ];
        for (json, expected) in cases {
            let err = parse(json).expect_err(json);
            assert!(err.contains(expected), "{json}: {err}");
        }
    }
}
