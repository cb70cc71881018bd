//! The multi-process story in one command: four OS processes, eight tasks each, spend one
//! allowance of 20 admissions per second. On one Redis allowance the group keeps to 20/s;
//! with an in-memory allowance per process it runs four times over.
//!
//! ```text
//! cargo run -p tower-allowance-redis --features test-util --example store_across_processes [REDIS_URL]
//! ```
//!
//! Without a URL it starts a private `redis-server`. The example spawns itself as the
//! worker processes.

use std::process::{Command, Stdio};

use tokio::time::Instant;
use tower_allowance::{Allowance, AllowanceConfig, BoxError};
use tower_allowance_redis::{
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

const PROCESSES: usize = 4;
const TASKS: usize = 8;
const PER_TASK: usize = 5;
const RATE: u32 = 20;
const BURST: u32 = 4;

/// One worker process: `TASKS` tasks, each admitted `PER_TASK` times.
async fn worker(store: &str, name: &str) -> Result<(), BoxError> {
    let config = AllowanceConfig::per_second(RATE, BURST)?;
    let allowance = if store == "memory" {
        Allowance::new(config)
    } else {
        Allowance::with_store(
            config,
            RedisStore::connect(store, name, RedisStoreOptions::new()).await?,
        )
    };
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
    Ok(())
}

/// Runs the worker processes on `store` and reports the group's admission rate.
async fn group(store: &str, name: &str) -> Result<(), BoxError> {
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let mut children = vec![];
    for _ in 0..PROCESSES {
        children.push(
            Command::new(&exe)
                .args(["--worker", store, name])
                .stdout(Stdio::null())
                .spawn()?,
        );
    }
    let children = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|mut c| c.wait())
            .collect::<Result<Vec<_>, _>>()
    })
    .await??;
    if children.iter().any(|s| !s.success()) {
        return Err("a worker process failed".into());
    }
    let took = started.elapsed();
    let n = PROCESSES * TASKS * PER_TASK;
    let label = if store == "memory" {
        "an in-memory allowance per process"
    } else {
        "one Redis allowance"
    };
    println!(
        "{PROCESSES} processes x {TASKS} tasks on {label}: {n} admissions in {took:.2?} = {:.1}/s (allowance: {RATE}/s, burst {BURST})",
        n as f64 / took.as_secs_f64()
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, store, name] = &args[..] {
        if flag == "--worker" {
            return worker(store, name).await;
        }
    }
    let redis = match args.first() {
        Some(_) => None,
        None => Some(TestRedis::start().await),
    };
    let url = match (&redis, args.first()) {
        (Some(redis), _) => redis.url().to_owned(),
        (None, Some(url)) => url.clone(),
        (None, None) => return Err("no redis".into()),
    };
    group(&url, &unique_name("multi-process")).await?;
    group("memory", "unused").await?;
    Ok(())
}
