//! The file form of the configuration: durations as human-readable strings ("500ms",
//! "2s", "1h"), unknown fields rejected, every validation error naming its field.
//!
//! ```toml
//! rate = 10
//! period = "1s"
//! burst = 10
//! max_cooldown = "15m"
//! dialect = "github"    # "standard"; "github", "openai", "anthropic", "ietf", "x-ratelimit", "generic" with `dialects`
//! limits = [{ rate = 5000, period = "1h", burst = 5000 }]
//! retry_budget = { kind = "replenishing", window = "10s", min_per_sec = 1, ratio = 0.2 }
//! outage = { wait = "30s" }
//! adaptive = { initial = 2.0, floor = 0.5, ceiling = 50.0, adopt_advertised = true }
//! classifier = { throttled = [429], transient = [502, 504] }
//! retry = { max_attempts = 4, backoff_base = "250ms" }
//! ```
//!
//! An [`AllowanceSpec`](crate::AllowanceSpec) reads the same table, plus `store`; a plain `AllowanceConfig`
//! refuses `store`, naming the type that takes it.
use super::*;
use crate::signals::Dialect;

fn no_store<S>() -> Option<S> {
    None
}

/// The `store` of a plain `AllowanceConfig`: refused, whatever it says.
pub(crate) enum NoStore {}

impl<'de> serde::Deserialize<'de> for NoStore {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(serde::de::Error::custom(
            "`store` belongs to an `AllowanceSpec`, not to an `AllowanceConfig`",
        ))
    }
}

impl ConfigError {
    /// The same error, for the configuration field `field` (as a file names it; feature
    /// `serde`).
    pub const fn at(mut self, field: &'static str) -> Self {
        if self.field.is_none() {
            self.field = Some(field);
        }
        self
    }
}

fn one_second() -> Duration {
    Duration::from_secs(1)
}

fn default_max_waiters() -> usize {
    DEFAULT_MAX_WAITERS
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAllowanceConfig<S = NoStore> {
    rate: u32,
    #[serde(default = "one_second", with = "humantime_serde")]
    period: Duration,
    burst: u32,
    #[serde(default)]
    limits: Vec<RawLimit>,
    #[serde(default = "default_max_waiters")]
    max_waiters: usize,
    #[serde(default)]
    retry_budget: RetryBudgetConfig,
    #[serde(default, with = "humantime_serde")]
    max_cooldown: Option<Duration>,
    #[serde(default)]
    outage: Option<RawOutage>,
    #[serde(default)]
    dialect: Option<RawDialect>,
    #[serde(default, with = "humantime_serde")]
    max_date_skew: Option<Duration>,
    #[serde(default)]
    adaptive: Option<RawAdaptive>,
    #[serde(default)]
    classifier: Option<StatusClassifier>,
    #[serde(default)]
    retry: Option<RetryConfig>,
    #[serde(default = "no_store")]
    store: Option<S>,
    #[cfg(feature = "shares")]
    #[serde(default)]
    classes: std::collections::BTreeMap<String, super::classes::Share>,
    /// `lease = "auto"` or `"20:200ms"` (feature `lease`): an `AllowanceSpec`'s store is
    /// wrapped in a `LeaseStore`.
    #[cfg(feature = "lease")]
    #[serde(default)]
    pub(crate) lease: Option<crate::lease::Lease>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    rate: u32,
    #[serde(default = "one_second", with = "humantime_serde")]
    period: Duration,
    burst: u32,
    #[serde(default)]
    unit: RawUnit,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
enum RawUnit {
    #[default]
    Requests,
    Cost,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
enum RawOutage {
    /// `{ wait = "30s" }`
    Wait(#[serde(with = "humantime_serde")] Duration),
    /// `"fail-fast"`
    FailFast,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawDialect {
    Standard,
    // The providers' dialects: without the `dialects` feature, naming one is an
    // unknown variant (refused, like any unknown value).
    #[cfg(feature = "dialects")]
    Github,
    #[cfg(feature = "dialects")]
    Openai,
    #[cfg(feature = "dialects")]
    Anthropic,
    #[cfg(feature = "dialects")]
    Ietf,
    #[cfg(feature = "dialects")]
    Generic,
    // `x-ratelimit`; `odds`, its first name, still read.
    #[cfg(feature = "dialects")]
    #[serde(rename = "x-ratelimit", alias = "odds")]
    XRateLimit,
}

// Without `adaptive` it is read only to be refused, naming the feature.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(not(feature = "adaptive"), allow(dead_code))]
struct RawAdaptive {
    initial: f64,
    floor: f64,
    ceiling: f64,
    #[serde(default)]
    adopt_advertised: bool,
}

/// The field a refused limit is the fault of: the one out of range by itself, or all
/// three when only their combination is (a rate too high for its period, a burst too
/// long at that rate).
fn limit_field(rate: u32, period: Duration, burst: u32) -> &'static str {
    if rate == 0 {
        "rate"
    } else if burst == 0 {
        "burst"
    } else if period.is_zero() || period > rule::MAX_DELAY {
        "period"
    } else {
        "rate/period/burst"
    }
}

impl TryFrom<RawAllowanceConfig> for AllowanceConfig {
    type Error = ConfigError;

    fn try_from(raw: RawAllowanceConfig) -> Result<Self, ConfigError> {
        // A `store` never gets this far: `NoStore` refuses it as it is read.
        #[cfg(feature = "lease")]
        if raw.lease.is_some() {
            return Err(
                ConfigError::new("a lease needs a store: read an AllowanceSpec").at("lease"),
            );
        }
        split(raw).map(|(config, _)| config)
    }
}

/// The configuration a table describes, and its `store` (an `AllowanceSpec`'s, which
/// `allowance/spec.rs` builds from it).
impl AllowanceConfig {
    /// The same configuration with `limits` in place of its own, the first the main one (what
    /// a file's `rate`, `period`, `burst` and `limits` say; `AllowanceSpec::with_limits`).
    pub(crate) fn replace_limits(
        mut self,
        limits: impl IntoIterator<Item = Limit>,
    ) -> Result<Self, ConfigError> {
        let limits: Vec<Limit> = limits.into_iter().collect();
        let Some(main) = limits.first().filter(|_| limits.len() <= MAX_LIMITS) else {
            return Err(ConfigError::new("an allowance holds one to 4 limits").at("limits"));
        };
        // As `new` fills them: the slots past the limits in use are the main limit's.
        self.params.0.limits = [main.params; MAX_LIMITS];
        self.limits = limits;
        self.derive();
        Ok(self)
    }
}

pub(crate) fn split<S>(
    raw: RawAllowanceConfig<S>,
) -> Result<(AllowanceConfig, Option<S>), ConfigError> {
    let mut config = AllowanceConfig::new(raw.rate, raw.period, raw.burst)
        .map_err(|e| e.at(limit_field(raw.rate, raw.period, raw.burst)))?
        .with_max_waiters(raw.max_waiters)
        .with_retry_budget(raw.retry_budget);
    for limit in raw.limits {
        let mut l =
            Limit::new(limit.rate, limit.period, limit.burst).map_err(|e| e.at("limits"))?;
        if matches!(limit.unit, RawUnit::Cost) {
            l = l.counting_cost();
        }
        config = config.with_limit(l).map_err(|e| e.at("limits"))?;
    }
    if let Some(max) = raw.max_cooldown {
        config = config
            .with_max_cooldown(max)
            .map_err(|e| e.at("max_cooldown"))?;
    }
    if let Some(outage) = raw.outage {
        config = config.with_outage_policy(match outage {
            RawOutage::Wait(max) => OutagePolicy::Wait { max },
            RawOutage::FailFast => OutagePolicy::FailFast,
        });
    }
    if let Some(dialect) = raw.dialect {
        // The field itself: `with_dialect` is public with `dialects` only, and `standard`
        // is a file's one choice without it.
        config.dialect = match dialect {
            RawDialect::Standard => Dialect::standard(),
            #[cfg(feature = "dialects")]
            RawDialect::Github => Dialect::github(),
            #[cfg(feature = "dialects")]
            RawDialect::Openai => Dialect::openai(),
            #[cfg(feature = "dialects")]
            RawDialect::Anthropic => Dialect::anthropic(),
            #[cfg(feature = "dialects")]
            RawDialect::Ietf => Dialect::ietf(),
            #[cfg(feature = "dialects")]
            RawDialect::Generic => Dialect::generic(),
            #[cfg(feature = "dialects")]
            RawDialect::XRateLimit => Dialect::x_ratelimit(),
        };
    }
    if let Some(skew) = raw.max_date_skew {
        config = config.with_max_date_skew(skew);
    }
    if let Some(a) = raw.adaptive {
        #[cfg(feature = "adaptive")]
        {
            let adaptive = adaptive::AdaptiveRate::new(a.initial, a.floor, a.ceiling)
                .map_err(|e| e.at("adaptive"))?
                .adopt_advertised(a.adopt_advertised);
            config = config.with_adaptive_rate(adaptive);
        }
        #[cfg(not(feature = "adaptive"))]
        {
            let _ = a;
            return Err(ConfigError::new(
                "an adaptive rate needs tower-allowance's `adaptive` feature",
            )
            .at("adaptive"));
        }
    }
    if let Some(classifier) = raw.classifier {
        config = config.with_classifier(classifier);
    }
    if let Some(retry) = raw.retry {
        config = config.with_retry(retry);
    }
    #[cfg(feature = "shares")]
    let config = super::classes::with_classes(config, raw.classes)?;
    Ok((config, raw.store))
}

#[derive(serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum RawRetryBudget {
    Unlimited,
    Fixed {
        retries: u64,
    },
    Replenishing {
        #[serde(with = "humantime_serde")]
        window: Duration,
        min_per_sec: u32,
        ratio: f64,
    },
}

impl TryFrom<RawRetryBudget> for RetryBudgetConfig {
    type Error = ConfigError;

    fn try_from(raw: RawRetryBudget) -> Result<Self, ConfigError> {
        Ok(match raw {
            RawRetryBudget::Unlimited => RetryBudgetConfig::Unlimited,
            RawRetryBudget::Fixed { retries } => RetryBudgetConfig::Fixed { retries },
            RawRetryBudget::Replenishing {
                window,
                min_per_sec,
                ratio,
            } => RetryBudgetConfig::Replenishing(
                ReplenishingBudget::new(window, min_per_sec, ratio)
                    .map_err(|e| e.at("retry_budget"))?,
            ),
        })
    }
}

#[cfg(test)]
mod file_form {
    use super::*;

    #[test]
    fn a_refused_limit_names_its_field() {
        let cases = [
            (r#"{"rate": 0, "burst": 1}"#, "rate"),
            (r#"{"rate": 1, "burst": 0}"#, "burst"),
            (r#"{"rate": 1, "burst": 1, "period": "0s"}"#, "period"),
            (r#"{"rate": 1, "burst": 1, "period": "300years"}"#, "period"),
            // Only the combination is wrong: more than one token per microsecond.
            (
                r#"{"rate": 2000, "burst": 1, "period": "1ms"}"#,
                "rate/period/burst",
            ),
            (
                r#"{"rate": 1, "burst": 1, "limits": [{"rate": 0, "burst": 1}]}"#,
                "limits",
            ),
        ];
        for (json, field) in cases {
            let err = serde_json::from_str::<AllowanceConfig>(json).expect_err(json);
            assert!(
                err.to_string().contains(&format!("`{field}`:")),
                "{json}: {err}"
            );
        }
    }

    #[test]
    fn dialects_by_name() {
        let dialect = |name: &str| {
            let json = format!(r#"{{"rate": 1, "burst": 1, "dialect": "{name}"}}"#);
            serde_json::from_str::<AllowanceConfig>(&json).map(|c| c.reading().readers)
        };
        assert_eq!(dialect("standard").ok(), Some(Dialect::standard()));
        #[cfg(feature = "dialects")]
        {
            assert_eq!(dialect("x-ratelimit").ok(), Some(Dialect::x_ratelimit()));
            // Its first name.
            assert_eq!(dialect("odds").ok(), Some(Dialect::x_ratelimit()));
            assert_eq!(dialect("github").ok(), Some(Dialect::github()));
        }
        // Without the feature, a provider's dialect is refused, never read as another.
        #[cfg(not(feature = "dialects"))]
        assert!(dialect("github").is_err());
        assert!(dialect("aws").is_err());
    }
}
