//! The ceiling: how many admissions per second one Redis sustains, for one allowance and for
//! 100 allowances at once.
//!
//! For each case, 64 tasks (spread evenly over the allowances) call `Allowance::acquire` in
//! a loop for a few seconds on an allowance that never runs out of tokens, so every call is
//! one admission and one script run. A third case paces one allowance at 1,000/s with bursts
//! of 1, so that every admission reserves a slot (the path of callers that wait): the rate,
//! not Redis, sets the admissions per second, and the server's cost per script run on that
//! path gives its ceiling. (Reserved slots fall on whole milliseconds, `rule::schedule`: a
//! faster allowance would be held to 1,000 reservations per second by the grid, not Redis.)
//! Reported, per case:
//! - admissions per second this client achieved (client and server share the machine);
//! - the server's own cost per admission, from `INFO commandstats` (`usec_per_call` of
//!   `fcall`, or `evalsha` without Functions, over the run), and the ceiling it implies for Redis's one command thread:
//!   `1e6 / usec_per_call` admissions per second;
//! - the script runs per admission (1.00 when the fast path holds).
//!
//! ```text
//! cargo run --release -p tower-allowance-redis --features test-util --example redis_ceiling
//! ```
//!
//! Starts a private `redis-server` (or uses `$ALLOWANCE_REDIS_URL`; its other clients then
//! count in the figures).

use std::time::Duration;

use tokio::time::Instant;
use tower_allowance::{Allowance, AllowanceConfig, BoxError};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

const TASKS: usize = 64;
const RUN: Duration = Duration::from_secs(3);

/// `(calls, usec)` of the script commands, from `INFO commandstats`.
async fn script_stats(redis: &TestRedis) -> (u64, u64) {
    let info = redis.command(&["INFO", "commandstats"]).await;
    let mut total = (0, 0);
    for line in info.lines() {
        let Some(rest) = line
            .strip_prefix("cmdstat_fcall:")
            .or_else(|| line.strip_prefix("cmdstat_evalsha:"))
            .or_else(|| line.strip_prefix("cmdstat_eval:"))
        else {
            continue;
        };
        for field in rest.split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => total.0 += v.parse::<u64>().unwrap_or(0),
                Some(("usec", v)) => total.1 += v.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

async fn case(
    redis: &TestRedis,
    allowances: usize,
    config: AllowanceConfig,
) -> Result<(), BoxError> {
    let first = RedisStore::connect(
        redis.url(),
        &unique_name("ceiling"),
        RedisStoreOptions::new(),
    )
    .await?;
    let mut handles = vec![Allowance::with_store(config.clone(), first.clone())];
    for i in 1..allowances {
        let store = first.for_allowance(&unique_name(&format!("ceiling{i}")))?;
        handles.push(Allowance::with_store(config.clone(), store));
    }
    // Warm up: scripts loaded, connections open, every allowance's key created.
    for a in &handles {
        a.acquire().await?;
    }
    let before = script_stats(redis).await;
    let started = Instant::now();
    let stop = started + RUN;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let allowance = handles[t % handles.len()].clone();
        tasks.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                allowance.acquire().await?;
                n += 1;
            }
            Ok::<_, BoxError>(n)
        });
    }
    let mut admissions = 0;
    while let Some(r) = tasks.join_next().await {
        admissions += r??;
    }
    let took = started.elapsed().as_secs_f64();
    let after = script_stats(redis).await;
    let (calls, usec) = (after.0 - before.0, after.1 - before.1);
    let per_call = usec as f64 / calls.max(1) as f64;
    let waited: u64 = handles.iter().map(|a| a.snapshot().waited).sum();
    println!(
        "{allowances:>3} allowance(s), {TASKS} tasks: {:>7.0} admissions/s achieved ({:.0}% reserved a slot); \
         server {per_call:.1} µs per script run => ceiling {:>7.0}/s; \
         {:.2} script runs per admission",
        admissions as f64 / took,
        waited as f64 * 100.0 / admissions.max(1) as f64,
        1e6 / per_call,
        calls as f64 / admissions.max(1) as f64,
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let redis = TestRedis::start().await;
    // Never limited by tokens: this measures the store, not the rate.
    let unlimited = AllowanceConfig::per_second(1_000_000, 1_000_000)?;
    for allowances in [1, 100] {
        case(&redis, allowances, unlimited.clone()).await?;
    }
    // Every admission a reservation: the rate, below what Redis sustains, sets the pace.
    case(&redis, 1, AllowanceConfig::per_second(1_000, 1)?).await?;
    Ok(())
}
