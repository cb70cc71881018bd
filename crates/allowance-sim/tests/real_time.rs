//! Real-time runs whose verdicts count 429s, compare rates or match a real-time run's
//! figures: moved here from `adaptive`, `multi_process`, `quota`, `cli` and `serve`, whose
//! deterministic tests stay in the default suite (tests/README.md, "where each test went").
//! Each module keeps its original test's content (the helpers and settings it shares with
//! its deterministic half are in `common`, the arguments of `adaptive`'s run are
//! `allowance_sim::adaptive::REAL`); where the test has the upstream's log,
//! every 429 it did not expect is printed with its cause (`allowance_testkit::scale::stray_429s`:
//! delivery jitter, named and not a failure, or sent early, which fails); where the upstream
//! runs inside the binary (`cli`, `serve`), every 429 fails the test and the run's report is
//! printed.
//!
//! A real-time experiment (`--features experiments`): `cargo test -p allowance-sim
//! --features experiments --test real_time -- --test-threads=1`.

mod common;

/// From `adaptive.rs`: four processes on one adaptive controller in Redis, against one each.
mod adaptive {
    use std::{path::Path, process::Command};

    use allowance_sim::adaptive::REAL;
    use serde_json::Value;
    use tower_allowance_redis::test_util::TestRedis;

    use crate::common::{exe, num};

    /// The real-time run: `--processes 4` with and without a Redis allowance, as a child
    /// (`allowance-sim adaptive`'s real-time experiments, `REAL`).
    fn real_run(bin: &Path, redis: Option<&str>) -> Value {
        let mut cmd = Command::new(bin);
        cmd.arg("run").args(REAL).arg("--json");
        if let Some(url) = redis {
            cmd.args(["--redis", url]);
        }
        let out = cmd.output().expect("runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn four_processes_on_redis_find_one_rate_and_split_controllers_throttle_more() {
        let redis = TestRedis::start().await;
        let bin = exe();
        let url = redis.url().to_owned();
        let shared = tokio::task::spawn_blocking({
            let bin = bin.to_owned();
            move || real_run(&bin, Some(&url))
        })
        .await
        .expect("joined");
        let split = tokio::task::spawn_blocking({
            let bin = bin.to_owned();
            move || real_run(&bin, None)
        })
        .await
        .expect("joined");

        let rates = |v: &Value| -> Vec<f64> {
            v["controller_rates"]
                .as_array()
                .expect("controller rates")
                .iter()
                .filter_map(Value::as_f64)
                .collect()
        };
        eprintln!("| controllers | attempts | 429s | completed | achieved | final rate | each process's controller at the end | makespan |");
        eprintln!("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |");
        for (name, v) in [
            ("one in Redis", &shared),
            ("one per process, in memory", &split),
        ] {
            eprintln!(
                "| {name} | {} | {} | {} | {}/s | {}/s | {:?} | {} ms |",
                v["attempts"],
                v["rejected"],
                v["completed"],
                v["achieved_rate"],
                v["final_rate"],
                rates(v),
                v["makespan_ms"]
            );
        }
        assert_eq!(shared["completed"], 200, "{shared}");
        assert_eq!(split["completed"], 200, "{split}");
        let (attempts, rejected) = (num(&shared, "attempts"), num(&shared, "rejected"));
        assert!(
            rejected <= 0.05 * attempts,
            "Redis: {rejected} 429s of {attempts}"
        );
        // One rate: four readings of one controller, taken as each process ended.
        let one = rates(&shared);
        assert_eq!(one.len(), 4);
        let mean = one.iter().sum::<f64>() / 4.0;
        assert!(
            one.iter().all(|r| (r - mean).abs() <= 0.05 * mean),
            "one rate in Redis: {one:?}"
        );
        assert!(
            (10.0..=24.0).contains(&num(&shared, "final_rate")),
            "{shared}"
        );
        // Four controllers, each seeing only its own process's 429s: more of them.
        assert!(
            num(&split, "rejected") > rejected,
            "split {} vs Redis {rejected}",
            split["rejected"]
        );
    }
}

/// From `multi_process.rs`: four OS processes x eight workers against one upstream whose
/// bucket matches the allowance: with one Redis allowance the server sees no 429 that
/// delivery jitter does not explain, with four in-memory allowances many; and the store
/// calls Redis counted.
mod multi_process {
    use allowance_sim::live::StoreChoice;
    use allowance_testkit::{
        scale::{print_strays, stray_429s},
        upstream::{Upstream, UpstreamConfig},
    };
    use tower_allowance_redis::test_util::TestRedis;

    use crate::common::{
        multi_process::{scenario, BURST, PROCESSES, RATE},
        redis_store, run_against, script_calls,
    };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_redis_allowance_for_four_processes_vs_one_allowance_each() {
        let redis = TestRedis::start().await;
        let s = scenario(32, 96);

        let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
            .await
            .expect("upstream");
        let (shared, seen) = run_against(upstream, &s, &redis_store(&redis), PROCESSES).await;
        let rejected = seen.iter().filter(|r| r.status == 429).count();
        eprintln!(
            "one Redis allowance, {PROCESSES} processes x 8 workers: {} attempts, {rejected} 429s, {} completed, {} ms",
            seen.len(),
            shared.completed,
            shared.makespan_ms
        );

        let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
            .await
            .expect("upstream");
        let (split, split_seen) = run_against(upstream, &s, &StoreChoice::Memory, PROCESSES).await;
        let split_rejected = split_seen.iter().filter(|r| r.status == 429).count();
        eprintln!(
            "one in-memory allowance per process: {} attempts, {split_rejected} 429s, {} completed, {} ms",
            split_seen.len(),
            split.completed,
            split.makespan_ms
        );

        // Every 429 of the shared run with its cause: delivery jitter (named, not a failure:
        // the upstream's bucket fed the send times admits it); any other fails.
        let early = print_strays(
            "one Redis allowance",
            &stray_429s(&seen, &shared.timeline, BURST, RATE, None),
        );
        assert_eq!(shared.completed, 96, "every job completes");
        assert_eq!(early, 0, "429s not explained by delivery jitter (above)");
        // Each process's allowance admits its own burst at once: 4 x 3 against a bucket of 4.
        assert!(
            split_rejected >= 5 && split_rejected > 5 * rejected,
            "separate allowances must overrun the upstream: {split_rejected} 429s"
        );
    }

    /// `store_calls` (issue 15, point 2) is what the Redis server counted: the scripts the run's
    /// stores called, summed over the processes (the connect-time script load left out), and
    /// about one per admission.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn store_calls_are_what_redis_counted() {
        let redis = TestRedis::start_private().await;
        let upstream = Upstream::start(UpstreamConfig::new(BURST, RATE))
            .await
            .expect("upstream");
        let store = redis_store(&redis);
        assert_eq!(redis.command(&["CONFIG", "RESETSTAT"]).await, "+OK");
        let (report, seen) = run_against(upstream, &scenario(32, 120), &store, PROCESSES).await;
        // Each 429 (with its retry) costs store calls beyond one per admission: printed with
        // its cause.
        print_strays(
            "store calls",
            &stray_429s(&seen, &report.timeline, BURST, RATE, None),
        );
        let counted = script_calls(&redis.command(&["INFO", "commandstats"]).await);
        let (calls, admissions) = (
            report.store_calls.expect("store_calls with Redis"),
            report.admissions.expect("admissions"),
        );
        eprintln!("{PROCESSES} processes: {calls} store calls, Redis counted {counted} script calls, {admissions} admissions");
        assert_eq!(calls, counted);
        assert!(admissions >= 120, "{admissions}");
        assert!(
            calls * 10 <= admissions * 13,
            "{calls} calls for {admissions} admissions"
        );
    }
}

/// From `quota.rs`: a spent monthly quota across processes, over real HTTP: 64 jobs against
/// an upstream with 20 credits; in one Redis shared by 4 processes, in Redis for 1 process,
/// or in memory, exactly 20 jobs complete, the other 44 are abandoned (`quota_exhausted`), the
/// upstream serves exactly ONE `/v1/usage` request for the group and exactly one 429, and
/// after that probe not one snapshot request reaches it.
mod quota {
    use allowance_sim::{
        live::{self, StoreChoice, Target},
        multi::{run_name, run_processes_with, Spawn},
    };
    use allowance_testkit::{
        report::RunReport,
        scale::{print_strays, stray_429s},
        scenario::{Mode, Scenario},
        upstream::{SeenRequest, Upstream, UpstreamConfig, DEFAULT_KEY, USAGE_PATH},
    };
    use tower_allowance_redis::test_util::TestRedis;

    use crate::common::{exe, key_header};

    const QUOTA: u64 = 20;
    const JOBS: usize = 64;
    /// Bursts of 2 at 10/s (the seed's burst, five times its rate: the same story in 2 s).
    const BURST: u32 = 2;
    const RATE: u32 = 10;

    fn scenario() -> Scenario {
        Scenario {
            workers: 32,
            jobs: JOBS,
            burst: BURST,
            rate_per_sec: RATE,
            ..Scenario::seed(Mode::Shared)
        }
    }

    fn upstream_config() -> UpstreamConfig {
        UpstreamConfig::new(BURST, RATE).with_quota(QUOTA)
    }

    /// Checks the run and the upstream's log; returns a line for the test's output.
    fn check(what: &str, report: &RunReport, log: &[SeenRequest]) {
        let usage: Vec<&SeenRequest> = log.iter().filter(|r| r.path == USAGE_PATH).collect();
        let snapshots: Vec<&SeenRequest> = log.iter().filter(|r| r.path != USAGE_PATH).collect();
        let ok = snapshots.iter().filter(|r| r.status == 200).count();
        let rejected = snapshots.iter().filter(|r| r.status == 429).count();
        eprintln!(
            "{what}: completed {} abandoned {:?} failed {}; upstream: {} snapshots ({ok} 200, {rejected} 429), usage at {:?} ms",
            report.completed,
            report.abandoned_by_reason,
            report.failed,
            snapshots.len(),
            usage.iter().map(|r| r.at_ms).collect::<Vec<_>>()
        );
        // Every 429 with its cause: the first after the credits ran out is the quota's (the
        // one the test expects); any before it is a throttling 429 (delivery jitter or sent
        // early, from the upstream's bucket fed the send times); any later one reached the
        // upstream after the verdict.
        let spent_at = snapshots
            .iter()
            .filter(|r| r.status == 200)
            .nth(QUOTA as usize - 1)
            .map_or(u64::MAX, |r| r.at_ms);
        let throttling: Vec<SeenRequest> = log
            .iter()
            .filter(|r| r.at_ms <= spent_at)
            .cloned()
            .collect();
        print_strays(
            &format!("{what}: throttling 429s before the quota ran out"),
            &stray_429s(&throttling, &report.timeline, BURST, RATE, None),
        );
        for (n, r) in snapshots
            .iter()
            .filter(|r| r.status == 429 && r.at_ms > spent_at)
            .enumerate()
        {
            let why = if n == 0 {
                "the quota's 429 (expected)"
            } else {
                "a quota 429 after the first: a snapshot sent before the verdict came back"
            };
            eprintln!("{what}: 429 at {} ms ({}): {why}", r.at_ms, r.path);
        }
        assert_eq!(report.completed, QUOTA as usize, "{what}: {report:?}");
        assert_eq!(report.abandoned, JOBS - QUOTA as usize, "{what}");
        assert_eq!(
            report.abandoned_by_reason.get("quota_exhausted").copied(),
            Some(JOBS - QUOTA as usize),
            "{what}: every abandoned job says why"
        );
        assert_eq!(report.failed, 0, "{what}: {:?}", report.first_error);
        assert_eq!(
            usage.len(),
            1,
            "{what}: one usage probe for the whole group"
        );
        assert_eq!(ok, QUOTA as usize, "{what}");
        // The first quota 429 (no Retry-After) triggers the probe; admissions are 100 ms apart,
        // so nothing else is in flight by then.
        assert_eq!(rejected, 1, "{what}: one 429 before the verdict");
        let verdict_asked_at = usage[0].at_ms;
        let after: Vec<&&SeenRequest> = snapshots
            .iter()
            .filter(|r| r.at_ms > verdict_asked_at)
            .collect();
        assert!(
            after.is_empty(),
            "{what}: snapshot requests reached the upstream after the probe: {after:?}"
        );
    }

    async fn over_redis(processes: usize) {
        let redis = TestRedis::start().await;
        let upstream = Upstream::start(upstream_config()).await.expect("upstream");
        let store = StoreChoice::Redis {
            url: redis.url().to_owned(),
            name: run_name(),
        };
        let spawn = Spawn {
            usage_url: Some(upstream.usage_url()),
            ..Spawn::default()
        };
        let report = run_processes_with(
            exe(),
            &scenario(),
            &upstream.snapshot_url("e{job}"),
            &key_header(),
            &store,
            processes,
            &spawn,
        )
        .await
        .expect("runs");
        let log = upstream.log();
        upstream.shutdown().await;
        check(&format!("{processes} process(es) on Redis"), &report, &log);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn four_processes_on_one_redis_allowance_probe_once() {
        over_redis(4).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_process_on_redis_probes_once() {
        over_redis(1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_process_in_memory_probes_once() {
        let upstream = Upstream::start(upstream_config()).await.expect("upstream");
        let target = Target::upstream(&upstream, DEFAULT_KEY)
            .expect("target")
            .usage_probe(upstream.usage_url());
        let report = live::run_http(&scenario(), &target, None)
            .await
            .expect("runs");
        let log = upstream.log();
        upstream.shutdown().await;
        check("in memory", &report, &log);
    }
}

/// From `cli.rs`: `http` against `serve` agreeing with `run --real`, with no 429 in either.
mod cli {
    use std::{
        io::{BufRead, BufReader},
        process::{Command, Stdio},
    };

    use serde_json::Value;

    use crate::common::{exe, figures, run};

    /// `serve` in a child process, then `http` against it and `run --real`, both with the same
    /// settings: the same counts.
    #[test]
    fn http_against_serve_matches_run_real() {
        let bin = exe();
        let mut server = Command::new(bin)
            .args(["serve", "--burst", "2", "--rate", "10"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let mut line = String::new();
        // Keep reading the rest of its output (so it never writes to a closed pipe).
        let mut server_out = BufReader::new(server.stdout.take().expect("stdout"));
        server_out.read_line(&mut line).expect("prints its URL");
        let drain =
            std::thread::spawn(move || std::io::copy(&mut server_out, &mut std::io::sink()));
        let url = format!("{}/v1/events/e{{job}}/odds/snapshot", line.trim());

        let settings = ["--mode", "shared", "--burst", "2", "--rate", "10", "--json"];
        let http = Command::new(bin)
            .args(["http", "--url", &url, "--header", "X-API-Key: sim-key"])
            .args(settings)
            .output()
            .expect("http runs");
        server.kill().expect("serve stops");
        server.wait().expect("reaped");
        drain.join().expect("drained").expect("read");
        assert!(http.status.success(), "{http:?}");
        let http: Value = serde_json::from_slice(&http.stdout).expect("JSON");

        let mut real_args = vec!["run", "--real"];
        real_args.extend(settings);
        let real: Value = serde_json::from_str(&run(&real_args)).expect("JSON");

        assert_eq!(http["counted_by"], "client");
        assert_eq!(real["counted_by"], "server");
        eprintln!("http against serve: {http}\nrun --real: {real}");
        assert_eq!(figures(&http), figures(&real));
        assert_eq!(figures(&http), (8, 0, 8, 0));
    }
}

/// From `serve.rs`: a client reading GitHub's headers from a GitHub-shaped `serve` at 1/s
/// waits for each reset it is told of and sees no 429 (the other half, the same client
/// reading OpenAI's headers running into 429s, stays in `serve.rs`).
mod serve {
    use crate::common::http_against_github_serve;

    /// `http --dialect github`: against a GitHub-shaped upstream at 1/s, a client reading
    /// GitHub's headers waits for each reset it is told of (`remaining: 0`) and sees no 429,
    /// although its own allowance is set far too fast (20/s).
    #[test]
    fn http_reads_the_github_dialect_and_sees_no_429() {
        assert_eq!(http_against_github_serve("github"), 0);
    }
}
