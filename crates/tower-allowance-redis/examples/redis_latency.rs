//! Measures admission latency against a local Redis next to a plain `PING` in the same run,
//! and admissions per second from one process with 64 concurrent tasks next to a trivial
//! `EVALSHA` (`return 1`) at the same concurrency. Prints the two ratios the issue targets:
//! admission p50 / PING p50 (<= 2) and admissions/s / trivial EVALSHA/s (>= 0.5).
//!
//! ```text
//! cargo run --release -p tower-allowance-redis --features test-util --example redis_latency
//! ```
//!
//! Starts a private `redis-server` (or uses `$ALLOWANCE_REDIS_URL`).

use std::time::Duration;

use tokio::time::Instant;
use tower_allowance::{
    rule::AdmitRequest,
    rule::{Admission, Op, Reply},
    store::Store,
    Allowance, AllowanceConfig, BoxError,
};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

const N: usize = 5_000;
const TASKS: usize = 64;
const PER_TASK: usize = 200;

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let redis = TestRedis::start().await;
    // Never limited by tokens: this measures the store, not the rate.
    let config = AllowanceConfig::per_second(1_000_000, 1_000_000)?;
    let store =
        RedisStore::connect(redis.url(), &unique_name("bench"), RedisStoreOptions::new()).await?;
    let mut ping = redis::Client::open(redis.url())?
        .get_multiplexed_async_connection()
        .await?;

    // Warm up both paths.
    for _ in 0..500 {
        redis::cmd("PING").query_async::<String>(&mut ping).await?;
        store
            .apply(config.params(), Op::Admit(AdmitRequest::first()).into())
            .await?;
    }
    // Interleaved, so both see the same machine load.
    let (mut pings, mut admits) = (Vec::with_capacity(N), Vec::with_capacity(N));
    let rt_before = store.round_trips();
    for _ in 0..N {
        let t = Instant::now();
        redis::cmd("PING").query_async::<String>(&mut ping).await?;
        pings.push(t.elapsed());
        let t = Instant::now();
        let decision = store
            .apply(config.params(), Op::Admit(AdmitRequest::first()).into())
            .await?;
        admits.push(t.elapsed());
        assert!(matches!(decision.into(), Reply::Admit(Admission::Admitted)));
    }
    let rt = store.round_trips() - rt_before;
    let (ping_p50, p99) = percentiles(pings);
    println!("interleaved: PING         p50 {ping_p50:>10.1?}  p99 {p99:>10.1?}  (n={N})");
    let (admit_p50, p99) = percentiles(admits);
    println!(
        "interleaved: admit        p50 {admit_p50:>10.1?}  p99 {p99:>10.1?}  (n={N}, {rt} round trips)"
    );
    println!(
        "ratio: admit p50 / PING p50 = {:.2} (target <= 2)",
        admit_p50.as_secs_f64() / ping_p50.as_secs_f64()
    );

    // Back-to-back blocks (no interleaving): PING, admit, acquire through an Allowance (as
    // the layers use it), PING again.
    let allowance = Allowance::with_store(config.clone(), store.clone());
    for round in ["PING", "admit", "acquire", "PING"] {
        let mut samples = Vec::with_capacity(N);
        for _ in 0..N {
            let t = Instant::now();
            match round {
                "PING" => drop(redis::cmd("PING").query_async::<String>(&mut ping).await?),
                "admit" => drop(
                    store
                        .apply(config.params(), Op::Admit(AdmitRequest::first()).into())
                        .await?,
                ),
                _ => allowance.acquire().await?,
            }
            samples.push(t.elapsed());
        }
        let (p50, p99) = percentiles(samples);
        println!("block: {round:<8}                p50 {p50:>10.1?}  p99 {p99:>10.1?}  (n={N})");
    }

    // 64 concurrent tasks through one Allowance (its FIFO queue lets one head ask at a time).
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let allowance = allowance.clone();
        tasks.spawn(async move {
            for _ in 0..PER_TASK {
                allowance.acquire().await?;
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let took = started.elapsed();
    let total = (TASKS * PER_TASK) as f64;
    let via_allowance = total / took.as_secs_f64();
    println!("{TASKS} tasks x {PER_TASK} via Allowance::acquire: {via_allowance:.0} admissions/s ({took:.2?})");

    // 64 concurrent tasks on the store directly (pipelined on one multiplexed connection).
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (store, config) = (store.clone(), config.clone());
        tasks.spawn(async move {
            for _ in 0..PER_TASK {
                store
                    .apply(config.params(), Op::Admit(AdmitRequest::first()).into())
                    .await?;
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let took = started.elapsed();
    println!(
        "{TASKS} tasks x {PER_TASK} via RedisStore::apply(Admit): {:.0} admissions/s ({took:.2?})",
        total / took.as_secs_f64()
    );

    // The reference: a trivial script at the same concurrency, on one multiplexed connection.
    let trivial = redis::Script::new("return 1");
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(redis.url())?).await?;
    let _: i64 = trivial.invoke_async(&mut conn.clone()).await?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (trivial, mut conn) = (trivial.clone(), conn.clone());
        tasks.spawn(async move {
            for _ in 0..PER_TASK {
                let _: i64 = trivial.invoke_async(&mut conn).await?;
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let took = started.elapsed();
    let evalsha = total / took.as_secs_f64();
    println!("{TASKS} tasks x {PER_TASK} trivial EVALSHA: {evalsha:.0} calls/s ({took:.2?})");
    println!(
        "ratio: Allowance admissions/s / trivial EVALSHA/s = {:.2} (target >= 0.5)",
        via_allowance / evalsha
    );
    Ok(())
}
