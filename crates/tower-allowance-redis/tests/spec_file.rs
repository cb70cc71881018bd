//! `StoreSpec`, the store part of a `tower_allowance::AllowanceSpec` (feature `serde`): read
//! from TOML, it opens the store the file names, under the allowance's name, in one call.

use std::time::Duration;

use tower_allowance::{AllowanceSpec, RetryBudgetConfig};
use tower_allowance_redis::{
    error::ConnectErrorKind,
    test_util::{unique_name, TestRedis},
    RedisStoreOptions, StoreSpec,
};

fn parse(text: &str) -> Result<AllowanceSpec<StoreSpec>, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

#[test]
fn the_store_part_reads_as_people_write_it() {
    let spec = parse(
        r#"
        rate = 10
        burst = 10
        [store.redis]
        url_env = "REDIS_URL"
        options = { timeout = "100ms" }
        "#,
    )
    .expect("valid");
    let StoreSpec::Redis(redis) = spec.store() else {
        panic!("in Redis: {:?}", spec.store());
    };
    assert_eq!(
        redis.options(),
        &RedisStoreOptions::new().timeout(Duration::from_millis(100))
    );
    // Memory, by name or by default.
    let memory = parse("rate = 10\nburst = 10\nstore = \"memory\"").expect("valid");
    assert_eq!(memory.store(), &StoreSpec::Memory);
    assert_eq!(
        parse("rate = 10\nburst = 10").expect("valid").store(),
        &StoreSpec::Memory
    );
    // A URL in the file is never printed: it may carry a password.
    let spec = parse(
        "rate = 1\nburst = 1\nstore = { redis = { url = \"redis://user:secret@db:6379/\" } }",
    )
    .expect("valid");
    assert!(!format!("{spec:?}").contains("secret"), "{spec:?}");
    // Mistakes name their field.
    for (text, expected) in [
        (
            "rate = 1\nburst = 1\nstore = { redis = { uri = \"redis://db/\" } }",
            "unknown field `uri`",
        ),
        (
            "rate = 1\nburst = 1\nstore = { redis = { url = \"redis://db/\", options = { timeout = \"0s\" } } }",
            "timeout",
        ),
        ("rate = 1\nburst = 1\nstore = \"etcd\"", "unknown variant `etcd`"),
    ] {
        let err = parse(text).expect_err(text);
        assert!(err.contains(expected), "{text}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_opens_redis_under_the_allowances_name_in_one_call() {
    let redis = TestRedis::start().await;
    let name = unique_name("spec");
    let spec = parse(&format!(
        r#"
        rate = 10
        burst = 10
        retry_budget = {{ kind = "fixed", retries = 3 }}
        store = {{ redis = {{ url = "{}", options = {{ timeout = "2s" }} }} }}
        "#,
        redis.url()
    ))
    .expect("valid");
    let one = spec.build(&name).await.expect("connects");
    assert_eq!(one.name(), name);
    assert_eq!(one.config().retry_budget(), &RetryBudgetConfig::fixed(3));

    // A second allowance from the same spec and name shares the state in Redis. (Real time:
    // read milliseconds after a 30 s cooldown was raised; 20 s is a margin of thousands.)
    let other = spec.build(&name).await.expect("connects");
    other
        .extend_cooldown(Duration::from_secs(30))
        .await
        .expect("raised");
    let seen = one.refresh().await.expect("read");
    assert!(
        seen.cooling_for
            .is_some_and(|d| d > Duration::from_secs(20)),
        "{seen:?}"
    );
    assert_eq!(seen.retries_remaining, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_that_cannot_be_had_is_a_typed_error() {
    let unset = format!("TOWER_ALLOWANCE_SPEC_TEST_UNSET_{}", std::process::id());
    let cases = [
        format!("rate = 1\nburst = 1\nstore = {{ redis = {{ url_env = \"{unset}\" }} }}"),
        // Neither, or both.
        "rate = 1\nburst = 1\nstore = { redis = {} }".to_owned(),
        format!(
            "rate = 1\nburst = 1\nstore = {{ redis = {{ url = \"redis://db/\", url_env = \"{unset}\" }} }}"
        ),
    ];
    for text in cases {
        let spec = parse(&text).expect("reads");
        let err = spec.build("spec").await.expect_err(&text);
        assert_eq!(err.kind(), ConnectErrorKind::InvalidUrl, "{text}");
        let why = std::error::Error::source(&err).map(ToString::to_string);
        assert!(
            why.as_deref().is_some_and(|w| w.contains("url")),
            "{text}: {why:?}"
        );
    }
}
