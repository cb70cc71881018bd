//! The spec from a TOML file (`allowance.toml`): it reads as the configuration written by
//! hand, and builds the allowance the hand-written way builds (equal `Debug`, and the same
//! attempts at the same instants in virtual time).

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use http::{HeaderValue, Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};

use super::{AllowanceSpec, MemorySpec};
use crate::{
    classify::StatusClassifier, retry::RetryConfig, Allowance, AllowanceConfig, BoxError, Limit,
    OutagePolicy, RetryBudgetConfig,
};

const FIXTURE: &str = include_str!("allowance.toml");

fn from_file() -> AllowanceSpec {
    toml::from_str(FIXTURE).expect("the fixture reads")
}

fn by_hand() -> AllowanceConfig {
    let retry = RetryConfig::default()
        .with_max_attempts(3)
        .and_then(|r| r.with_backoff(Duration::from_millis(100), Duration::from_secs(5)))
        .expect("valid")
        .with_jitter_seed(7);
    AllowanceConfig::per_second(5, 3)
        .and_then(|c| c.with_limit(Limit::per_day(20_000, 20_000)?))
        .and_then(|c| c.with_max_cooldown(Duration::from_secs(15 * 60)))
        .expect("valid")
        .with_max_waiters(100)
        .with_outage_policy(OutagePolicy::Wait {
            max: Duration::from_secs(30),
        })
        .with_retry_budget(RetryBudgetConfig::fixed(4))
        .with_classifier(
            StatusClassifier::default()
                .throttled([403, 429])
                .transient([502, 504]),
        )
        .with_retry(retry)
}

#[test]
fn the_file_reads_as_the_configuration_written_by_hand() {
    let spec = from_file();
    assert_eq!(spec, AllowanceSpec::new(by_hand(), MemorySpec::Memory));
    assert_eq!(spec.config().retry().max_attempts(), 3);
    // Without `store`, the spec keeps the allowance in memory.
    let without: AllowanceSpec =
        toml::from_str(&FIXTURE.replace("store = \"memory\"\n", "")).expect("reads");
    assert_eq!(without, spec);
}

#[test]
fn mistakes_are_refused_naming_the_field() {
    let cases = [
        // A store the core does not know.
        (
            "store = \"memory\"",
            "store = \"redis\"",
            "unknown variant `redis`",
        ),
        // An unknown field at the top, in the classifier and in the retry rules.
        ("burst = 3", "bursts = 3", "unknown field `bursts`"),
        (
            "throttled = [403, 429]",
            "throttle = [403]",
            "unknown field `throttle`",
        ),
        ("max_attempts = 3", "max_attempts = 0", "`max_attempts`"),
        (
            "transient = [502, 504]",
            "transient = [502, 5040]",
            "`transient`: status codes must be from 100 to 999",
        ),
    ];
    for (from, to, expected) in cases {
        let text = FIXTURE.replacen(from, to, 1);
        let err = toml::from_str::<AllowanceSpec>(&text).expect_err(to);
        assert!(err.to_string().contains(expected), "{to}:\n{err}");
    }
    // A plain configuration has no store: the error says which type takes one.
    let err = toml::from_str::<AllowanceConfig>(FIXTURE).expect_err("a store");
    assert!(
        err.to_string()
            .contains("`store` belongs to an `AllowanceSpec`"),
        "{err}"
    );
    let plain = FIXTURE.replace("store = \"memory\"\n", "");
    assert_eq!(
        toml::from_str::<AllowanceConfig>(&plain).ok(),
        Some(by_hand())
    );
}

/// When each attempt reached the upstream, from the start.
type Seen = Arc<Mutex<Vec<Duration>>>;

/// Eight requests at once through `allowance`'s stack; the upstream answers the second
/// attempt it sees with a 403 carrying `Retry-After: 1` (throttling, by the file's
/// classifier), everything else with a 200.
async fn eight_requests(allowance: Allowance) -> Vec<Duration> {
    let start = Instant::now();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let upstream = service_fn(move |_req: Request<()>| {
        let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
        log.push(start.elapsed());
        let mut res = Response::new(());
        if log.len() == 2 {
            *res.status_mut() = StatusCode::FORBIDDEN;
            res.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
        }
        async move { Ok::<_, BoxError>(res) }
    });
    let stack = allowance.layer().layer(upstream);
    let calls: Vec<_> = (0..8)
        .map(|_| tokio::spawn(stack.clone().oneshot(Request::new(()))))
        .collect();
    for call in calls {
        let res = call.await.expect("joined").expect("answered");
        assert_eq!(res.status(), StatusCode::OK, "the 403 was retried");
    }
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    seen
}

#[tokio::test(start_paused = true)]
async fn the_spec_builds_the_allowance_the_hand_written_way_builds() {
    let built = match from_file().build("odds").await {
        Ok(allowance) => allowance,
        Err(never) => match never {},
    };
    let written = Allowance::builder(by_hand()).name("odds").build();
    assert_eq!(format!("{built:?}"), format!("{written:?}"));

    let (a, b) = (eight_requests(built).await, eight_requests(written).await);
    assert_eq!(a, b);
    // Nine attempts: the 403 retried once, after its 1 s cooldown, metered at 5/s.
    assert_eq!(a.len(), 9);
    assert!(a[8] >= Duration::from_secs(1), "{a:?}");
}

// A spec read from a file, adjusted in code field by field, is the configuration written by
// hand with the same changes: the limits (which no setter could replace before), every other
// field through `map_config`, the store.
#[test]
fn a_spec_from_a_file_is_adjusted_in_code_field_by_field() {
    let limits =
        || Ok::<_, crate::ConfigError>([Limit::per_second(8, 8)?, Limit::per_day(40_000, 40_000)?]);
    let adjusted = from_file()
        .with_limits(limits().expect("valid"))
        .expect("two limits")
        .map_config(|c| c.with_max_waiters(10));
    let mut by_hand = AllowanceConfig::per_second(8, 8)
        .and_then(|c| c.with_limit(Limit::per_day(40_000, 40_000)?))
        .and_then(|c| c.with_max_cooldown(Duration::from_secs(15 * 60)))
        .expect("valid")
        .with_outage_policy(OutagePolicy::Wait {
            max: Duration::from_secs(30),
        })
        .with_retry_budget(RetryBudgetConfig::fixed(4))
        .with_max_waiters(10);
    by_hand = by_hand
        .with_classifier(from_file().config().classifier())
        .with_retry(from_file().config().retry().clone());
    assert_eq!(adjusted, AllowanceSpec::new(by_hand, MemorySpec::Memory));
    // No limit, or more than four: refused, naming the field.
    let none = from_file().with_limits([]).expect_err("no limit");
    assert_eq!(none.field(), Some("limits"));
    let five = [Limit::per_second(8, 8).expect("valid"); 5];
    assert!(from_file().with_limits(five).is_err());
}
