//! Four OS processes, eight tasks each, spend one allowance on a Redis Cluster of three
//! primaries: together they keep to its rate, as they would on one server (each alone would
//! finish four times sooner). The test binary starts itself as the worker processes, so it
//! has its own `main` (`harness = false`).

mod support;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::{Allowance, AllowanceConfig, BoxError};
use tower_allowance_redis::{
    test_util::{unique_name, TestCluster},
    RedisStore, RedisStoreOptions,
};

const PROCESSES: usize = 4;
const TASKS: usize = 8;
const PER_TASK: usize = 3;
const RATE: u32 = 40;
const BURST: u32 = 4;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// One worker process: `TASKS` tasks, each admitted `PER_TASK` times.
async fn worker(name: &str, urls: &str) -> Result<(), BoxError> {
    let store =
        RedisStore::connect_cluster(urls.split(','), name, RedisStoreOptions::new()).await?;
    let allowance = Allowance::with_store(AllowanceConfig::per_second(RATE, BURST)?, store);
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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, name, urls] = &args[..] {
        if flag == "--worker" {
            if let Err(e) = runtime().block_on(worker(name, urls)) {
                eprintln!("worker failed: {e}");
                std::process::exit(1);
            }
            return;
        }
    }
    print!("test four_processes_share_one_allowance_on_a_cluster ... ");
    runtime().block_on(async {
        let cluster = TestCluster::start().await;
        let name = unique_name("processes");
        let urls = cluster.urls().join(",");
        let exe = std::env::current_exe().expect("the test binary");
        let started = Instant::now();
        let children: Vec<_> = (0..PROCESSES)
            .map(|_| {
                Command::new(&exe)
                    .args(["--worker", &name, &urls])
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("a worker process")
            })
            .collect();
        let statuses = tokio::task::spawn_blocking(move || {
            children
                .into_iter()
                .map(|mut c| c.wait().expect("worker exit status"))
                .collect::<Vec<_>>()
        })
        .await
        .expect("waited");
        let took = started.elapsed();
        assert!(
            statuses.iter().all(|s| s.success()),
            "a worker failed: {statuses:?}"
        );
        let n = PROCESSES * TASKS * PER_TASK;
        // The first BURST at once, then one per 1/RATE s.
        let minimum = Duration::from_secs_f64(f64::from(n as u32 - BURST) / f64::from(RATE));
        eprintln!(
            "{PROCESSES} processes x {TASKS} tasks: {n} admissions in {took:.2?} on the cluster (minimum {minimum:.2?} at {RATE}/s, burst {BURST})"
        );
        assert!(
            took >= minimum,
            "{took:?}: faster than the shared allowance allows ({minimum:?})"
        );
        // At most 1.5 s slower in the real-time runner; 5 s more in the default suite,
        // where four processes may be scheduled late (`support::slack`). The lower bound is
        // the coordination's and load cannot break it.
        assert!(
            took <= minimum + support::slack(Duration::from_millis(1_500)),
            "{took:?}: far slower than the allowance ({minimum:?})"
        );
    });
    println!("ok");
}
