//! `config_file`: the shipped `allowances.toml` parses into what it says, builds, and runs;
//! and each mistake the file documents is refused, naming the field. The example is compiled
//! in as a module: what is tested is what a reader runs.

#[path = "../config_file.rs"]
#[allow(dead_code)]
mod config_file;

use std::{num::NonZeroU32, time::Duration};

use config_file::{parse, Args};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower_allowance::{
    classify::StatusClassifier, retry::RetryConfig, signals::Dialect, OutagePolicy,
    RetryBudgetConfig,
};
use tower_allowance_redis::{FailurePolicy, StoreSpec};

fn shipped() -> String {
    std::fs::read_to_string(config_file::SHIPPED).expect("the shipped file")
}

#[test]
fn the_shipped_file_says_what_its_comments_say() {
    let file = parse(&shipped()).expect("the shipped file parses");
    let names: Vec<&str> = file.apis.keys().map(String::as_str).collect();
    assert_eq!(names, ["github", "llm", "odds"]);

    let odds = &file.apis["odds"];
    assert!(matches!(odds.store(), StoreSpec::Memory));
    let config = odds.config();
    assert_eq!((config.rate(), config.burst()), (5, 3));
    assert_eq!(config.period(), Duration::from_secs(1));
    let monthly = config.limits()[1];
    assert_eq!(
        (monthly.rate(), monthly.period()),
        (20_000, Duration::from_secs(30 * 86_400))
    );
    assert_eq!(config.dialect(), Dialect::x_ratelimit());
    assert_eq!(config.max_cooldown(), Duration::from_secs(900));
    assert_eq!(
        config.classifier(),
        StatusClassifier::default()
            .throttled([429])
            .transient([502, 503, 504])
    );
    assert_eq!(
        config.retry(),
        &RetryConfig::default()
            .with_max_attempts(3)
            .and_then(|r| r.with_backoff(Duration::from_millis(100), Duration::from_secs(5)))
            .expect("valid")
    );

    let llm = &file.apis["llm"];
    assert_eq!(llm.config().dialect(), Dialect::openai());
    let tokens = llm.config().limits()[1];
    assert!(tokens.counts_cost());
    assert_eq!((tokens.rate(), tokens.burst()), (60_000, 4_000));
    let StoreSpec::Redis(redis) = llm.store() else {
        panic!("llm is kept in Redis: {:?}", llm.store());
    };
    assert_eq!(redis.options().get_timeout(), Duration::from_millis(100));
    assert_eq!(
        redis.options().get_failure_policy(),
        FailurePolicy::LocalFallback {
            expected_processes: NonZeroU32::new(4).expect("non-zero")
        }
    );
    // The URL is not in the file (it may carry a password), nor in what it prints.
    assert!(
        format!("{redis:?}").contains("ALLOWANCE_REDIS_URL"),
        "{redis:?}"
    );
    assert_eq!(llm.config().retry().max_attempts(), 4);

    let github = &file.apis["github"];
    let config = github.config();
    assert_eq!(config.dialect(), Dialect::github());
    assert_eq!(config.retry_budget(), &RetryBudgetConfig::fixed(50));
    assert_eq!(
        config.outage_policy(),
        OutagePolicy::Wait {
            max: Duration::from_secs(30)
        }
    );
    let StoreSpec::Redis(redis) = github.store() else {
        panic!("github is kept in Redis: {:?}", github.store());
    };
    assert_eq!(redis.options().get_failure_policy(), FailurePolicy::Report);
    assert_eq!(
        config.classifier(),
        StatusClassifier::default()
            .throttled([403, 429])
            .transient([502, 504])
    );
}

/// `text` with `from` replaced by `to` in the table `table` (the first occurrence after its
/// header), so that each mistake lands where a person would make it.
fn with_mistake(text: &str, table: &str, from: &str, to: &str) -> String {
    let header = format!("[{table}]\n");
    let start = text.find(&header).expect("the table") + header.len();
    let at = start + text[start..].find(from).expect("the line");
    format!("{}{to}{}", &text[..at], &text[at + from.len()..])
}

#[test]
fn each_documented_mistake_is_refused_naming_the_field() {
    let text = shipped();
    // (table, what is written, the mistake, what the error must say)
    let cases = [
        // An unknown field, in each kind of table.
        (
            "apis.odds",
            "burst = 3",
            "bursts = 3",
            "unknown field `bursts`",
        ),
        (
            "apis.llm.store.redis.options",
            "timeout = \"100ms\"",
            "timeout_ms = 100",
            "unknown field `timeout_ms`",
        ),
        (
            "apis.odds.classifier",
            "throttled = [429]",
            "throttle = [429]",
            "unknown field `throttle`",
        ),
        (
            "apis.odds.retry",
            "backoff_base = \"100ms\"",
            "backoff_base_ms = 100",
            "unknown field `backoff_base_ms`",
        ),
        // A zero rate, in the main limit and in another.
        (
            "apis.odds",
            "rate = 5",
            "rate = 0",
            "`rate`: rate must be at least 1",
        ),
        (
            "apis.odds",
            "rate = 20000",
            "rate = 0",
            "`limits`: rate must be at least 1",
        ),
        // A bad status, in either list.
        (
            "apis.odds.classifier",
            "throttled = [429]",
            "throttled = [429, 4290]",
            "`throttled`: status codes must be from 100 to 999",
        ),
        (
            "apis.github.classifier",
            "transient = [502, 504]",
            "transient = [502, 54]",
            "`transient`: status codes must be from 100 to 999",
        ),
        // Values that are durations but break a rule.
        (
            "apis.odds.retry",
            "backoff_max = \"5s\"",
            "backoff_max = \"50ms\"",
            "`backoff_max`: backoff max must be at least the base",
        ),
        (
            "apis.llm.store.redis.options",
            "timeout = \"100ms\"",
            "timeout = \"0s\"",
            "timeout: must be longer than zero",
        ),
    ];
    for (table, from, to, expected) in cases {
        let bad = with_mistake(&text, table, from, to);
        let err = parse(&bad).expect_err(to).to_string();
        assert!(err.contains(expected), "{table}: {to}:\n{err}");
    }
}

/// A duration that is not one is refused where it is written: the error points at the line,
/// which names the field, and says what is wrong with the value.
#[test]
fn a_bad_duration_is_refused_at_its_line() {
    let text = shipped();
    let cases = [
        ("apis.odds", "period = \"1s\"", "period = \"1 fortnight\""),
        (
            "apis.odds.retry",
            "backoff_base = \"100ms\"",
            "backoff_base = \"100 parsecs\"",
        ),
        (
            "apis.llm.store.redis.options",
            "idle_ttl = \"1h\"",
            "idle_ttl = \"an hour\"",
        ),
    ];
    for (table, from, to) in cases {
        let bad = with_mistake(&text, table, from, to);
        let err = parse(&bad).expect_err(to);
        let span = err.span().expect("located");
        let line_start = bad[..span.start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = bad[span.start..]
            .find('\n')
            .map_or(bad.len(), |i| span.start + i);
        assert_eq!(&bad[line_start..line_end], to, "{err}");
        let field = to.split(' ').next().expect("a key");
        assert!(err.to_string().contains(to), "{field}: {err}");
    }
}

#[test]
fn arguments() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(config_file::parse_args(&args(&["--help"])), Ok(Args::Help));
    assert_eq!(
        config_file::parse_args(&args(&[])),
        Ok(Args::Run {
            config: config_file::SHIPPED.to_owned(),
        })
    );
    assert_eq!(
        config_file::parse_args(&args(&["--config", "x.toml"])),
        Ok(Args::Run {
            config: "x.toml".into(),
        })
    );
    assert!(config_file::parse_args(&args(&["--config"])).is_err());
    assert!(config_file::parse_args(&args(&["--verbose"])).is_err());
    assert!(config_file::parse_args(&args(&["redis://a/"])).is_err());
}

/// Without a Redis URL, the file's Redis-kept allowances are kept in memory, and the run says
/// so; each is built as its spec says (named, configured); every call through every stack
/// completes, and no stand-in upstream throttles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_every_stack_is_built_in_memory_and_says_so() {
    let file = parse(&shipped()).expect("parses");
    let client = Client::builder(TokioExecutor::new()).build_http();
    for (name, spec) in &file.apis {
        let built = config_file::build(name, spec, false, client.clone())
            .await
            .expect("builds");
        assert_eq!(built.allowance.name(), name);
        assert_eq!(built.allowance.config(), spec.config());
        let summary = config_file::summary(&built);
        match spec.store() {
            StoreSpec::Redis(_) => assert!(
                summary.contains("the file says Redis, but $ALLOWANCE_REDIS_URL is not set"),
                "{summary}"
            ),
            _ => assert!(
                summary.contains("kept in: memory (this process)"),
                "{summary}"
            ),
        }
        let calls = config_file::call(&built).await.expect("calls");
        assert_eq!(calls.completed, 6, "{name}: {calls:?}");
        assert!(calls.other.is_empty(), "{name}: {calls:?}");
        assert_eq!(calls.upstream_throttled, 0, "{name}: {calls:?}");
        assert_eq!(calls.upstream_attempts, 6, "{name}: {calls:?}");
        // Every API's burst is below six calls: some waited for their slot.
        assert!(calls.waited > 0, "{name}: {calls:?}");
    }
}
