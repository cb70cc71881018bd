//! Runs spread over several OS processes: the tool spawns itself.
//!
//! `--processes N` splits the workers over `N` child processes (`allowance-sim worker ...`),
//! each with its own stack. With `--redis URL` they all use one allowance kept in Redis (one
//! authority for the key); without it each process has its own in-memory allowance, which is
//! what several processes with local gates amount to: independent allowances on one key.
//!
//! # Secrets
//!
//! A child's command line is visible to every user of the machine (`ps`, `/proc/PID/cmdline`),
//! so nothing secret goes there: the request headers (an `X-API-Key`) and the Redis URL (a
//! password) reach the child on its standard input, as one JSON object ([`ChildSecrets`])
//! that the parent writes and closes right after starting it. Not in its environment either:
//! `/proc/PID/environ` is readable by the same user and often ends up in crash reports.
//!
//! The children report their jobs and attempts as JSON on stdout; the parent merges them
//! and, for `run --real`, counts attempts and 429s from its upstream's own log. A child's
//! times are shifted onto the parent's clock by when the child's clock started, read on the
//! wall clock both processes share (they run on one machine): exact to the millisecond, so
//! jobs of different processes can be put in order of arrival ([`allowance_testkit::scale`]).
//!
//! Asked for progress (`worker --progress`), a child also prints `progress N` lines on stderr
//! as its jobs end, which the parent adds up.
//!
//! The workers are split as evenly as possible over the processes, or as
//! [`Spawn::workers_per_process`] says (`run --workers-per-process 1,31`).

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader},
    time::Instant,
};
use tower_allowance::{error::AbandonReason, BoxError, Outcome};

use allowance_testkit::{
    figures::Releases,
    job::{Failure, JobEnd, Mark, CANCELLED},
    report::{RunReport, Timeline},
    scenario::{Mode, Scenario},
};

use crate::live::{self, wall_clock_us, Share, StoreChoice, Target};

/// One child's findings, as printed by `allowance-sim worker`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChildReport {
    /// Attempts as the child's client saw them, ms from the child's start.
    pub attempts: Vec<Mark>,
    /// Jobs, ms from the child's start.
    pub ends: Vec<ChildEnd>,
    /// The child's first failed job's error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Admissions the child's allowances made, if it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admissions: Option<u64>,
    /// Calls the child's Redis stores made (without the script load at connect), with Redis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_calls: Option<u64>,
    /// Adaptive runs: each of the child's allowances' rate at its end, requests per second,
    /// in the order of their names (the same in every child).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_rates: Option<Vec<f64>>,
    /// Releases of reserved slots its allowances made, and how many the store took back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub releases: Option<Releases>,
    /// When the child's clock (its times' zero) started, µs since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_unix_us: Option<u64>,
}

/// What a child must know but must not show on its command line: the request headers and
/// the Redis URL. Written by the parent on the child's standard input (one JSON object).
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChildSecrets {
    /// The Redis URL (it may carry a password).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    /// Request headers as `Name: value` (they may carry keys).
    #[serde(default)]
    pub headers: Vec<String>,
}

impl std::fmt::Debug for ChildSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildSecrets")
            .field("redis_url", &self.redis_url.as_ref().map(|_| "***"))
            .field("headers", &self.headers.len())
            .finish()
    }
}

impl ChildSecrets {
    /// Reads them from `input` (a child's standard input) to its end.
    ///
    /// # Errors
    ///
    /// Input that cannot be read or is not the JSON object.
    pub fn read(mut input: impl std::io::Read) -> Result<Self, BoxError> {
        let mut text = String::new();
        input.read_to_string(&mut text)?;
        serde_json::from_str(&text)
            .map_err(|e| format!("the secrets on standard input do not parse: {e}").into())
    }
}

/// One job's end, as a child reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChildEnd {
    /// Global worker number.
    pub worker: u32,
    /// Started, ms.
    pub started_ms: u64,
    /// Ended, ms.
    pub at_ms: u64,
    /// `completed`, `failed` or an abandonment reason.
    pub outcome: String,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The job's number, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<usize>,
    /// When its first attempt was sent, ms, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_attempt_ms: Option<u64>,
}

impl ChildReport {
    /// The child's part of a run, from its report.
    pub fn from_report(report: &RunReport) -> Self {
        Self {
            attempts: report.timeline.attempts.clone(),
            ends: report
                .timeline
                .ends
                .iter()
                .map(|e| ChildEnd {
                    worker: e.worker,
                    started_ms: e.started_ms,
                    at_ms: e.at_ms,
                    outcome: e.outcome.to_owned(),
                    failure: e.failure,
                    job: e.job,
                    first_attempt_ms: e.first_attempt_ms,
                })
                .collect(),
            first_error: report.first_error.clone(),
            admissions: report.admissions,
            store_calls: report.store_calls,
            controller_rates: report.controller_rates.clone(),
            releases: report.scale.releases,
            started_unix_us: report.scale.started_unix_us,
        }
    }
}

/// The workers of each process: `explicit` when given, else `workers` split as evenly as
/// possible over `processes` (the first ones get one more).
///
/// ```
/// use allowance_sim::multi::split_workers;
///
/// assert_eq!(split_workers(10, 4, None), vec![3, 3, 2, 2]);
/// assert_eq!(split_workers(32, 2, Some(&[1, 31])), vec![1, 31]);
/// ```
pub fn split_workers(workers: usize, processes: usize, explicit: Option<&[usize]>) -> Vec<usize> {
    if let Some(split) = explicit {
        return split.to_vec();
    }
    let processes = processes.clamp(1, workers.max(1));
    let (base, extra) = (workers / processes, workers % processes);
    (0..processes)
        .map(|index| base + usize::from(index < extra))
        .collect()
}

fn outcome_of(s: &str) -> Outcome {
    match s {
        "completed" => Outcome::Completed,
        "failed" => Outcome::Failed,
        reason => reason
            .parse::<AbandonReason>()
            .map_or(Outcome::Failed, Outcome::Abandoned),
    }
}

/// A fresh allowance name for one run, so concurrent runs never share state by accident.
pub fn run_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded randomly per process (and per call after the first).
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("sim-{}-{random:016x}", std::process::id())
}

/// What the children need beyond the scenario, the target and the store.
#[derive(Clone, Debug, Default)]
pub struct Spawn {
    /// A PEM file of CA certificates every child trusts for `https://` targets, besides the
    /// system's roots (`--ca-cert`).
    pub ca_cert: Option<PathBuf>,
    /// Incremented as the children's jobs end (they then print `progress N` on stderr).
    pub progress: Option<Arc<AtomicUsize>>,
    /// The usage endpoint the children's allowances probe when the quota may be spent (see
    /// [`Target::usage_probe`]).
    pub usage_url: Option<String>,
    /// The workers of each process, when not split evenly; sums to the scenario's workers.
    pub workers_per_process: Option<Vec<usize>>,
}

/// The arguments of the `worker` child for process `index` of `processes`, and what goes
/// on its standard input. Nothing secret is an argument (see the module docs).
fn child_args(
    s: &Scenario,
    target_url: &str,
    headers: &[String],
    store: &StoreChoice,
    spawn: &Spawn,
    (index, processes): (usize, usize),
) -> (Vec<String>, usize, ChildSecrets) {
    let split = split_workers(s.workers, processes, spawn.workers_per_process.as_deref());
    let workers = split.get(index).copied().unwrap_or(0);
    let offset: usize = split.iter().take(index).sum();
    let mut args = vec![
        "worker".to_owned(),
        "--secrets-on-stdin".to_owned(),
        "--url".to_owned(),
        target_url.to_owned(),
        "--mode".to_owned(),
        s.mode.to_string(),
        "--workers".to_owned(),
        workers.to_string(),
        "--worker-offset".to_owned(),
        offset.to_string(),
        "--total-workers".to_owned(),
        s.workers.to_string(),
        "--jobs".to_owned(),
        s.jobs.to_string(),
        "--burst".to_owned(),
        s.burst.to_string(),
        "--rate".to_owned(),
        s.rate_per_sec.to_string(),
        "--max-attempts".to_owned(),
        s.max_attempts.to_string(),
    ];
    if let Some(k) = s.retry_budget {
        args.extend(["--retry-budget".to_owned(), k.to_string()]);
    }
    if let Some(d) = s.deadline {
        args.extend(["--deadline".to_owned(), format!("{}ms", d.as_millis())]);
    }
    if let Some(f) = s.cancel {
        args.extend(["--cancel-fraction".to_owned(), f.to_string()]);
    }
    if let Some(url) = &spawn.usage_url {
        args.extend(["--usage-url".to_owned(), url.clone()]);
    }
    if let Some(dialect) = s.dialect {
        args.extend(["--dialect".to_owned(), dialect.to_string()]);
    }
    if s.exact {
        args.push("--exact".to_owned());
    }
    if let Some(lease) = live::lease() {
        args.extend(["--lease".to_owned(), lease.to_string()]);
    }
    if let Some(a) = &s.adaptive {
        args.extend([
            "--adaptive".to_owned(),
            "--initial-rate".to_owned(),
            a.initial.to_string(),
            "--rate-floor".to_owned(),
            a.floor.to_string(),
            "--rate-ceiling".to_owned(),
            a.ceiling.to_string(),
        ]);
        if a.adopt {
            args.push("--adopt".to_owned());
        }
    }
    let mut secrets = ChildSecrets {
        redis_url: None,
        headers: headers.to_vec(),
    };
    if let Some(path) = &spawn.ca_cert {
        args.extend(["--ca-cert".to_owned(), path.display().to_string()]);
    }
    if spawn.progress.is_some() {
        args.push("--progress".to_owned());
    }
    let redis = live::redis_connect();
    if let Some(path) = &redis.ca_cert_path {
        args.extend(["--redis-ca-cert".to_owned(), path.display().to_string()]);
    }
    if redis.cluster {
        args.push("--redis-cluster".to_owned());
    }
    if let StoreChoice::Redis { url, name } = store {
        secrets.redis_url = Some(url.clone());
        args.extend([
            "--name".to_owned(),
            name.clone(),
            "--on-store-outage".to_owned(),
            s.on_store_outage.to_string(),
            // The run's processes: the local fallback divides the rate by them.
            "--processes".to_owned(),
            processes.to_string(),
        ]);
    }
    (args, workers, secrets)
}

/// Runs `s` in `processes` child processes of `exe` against `target_url`, and merges what
/// they report into one report counted by the clients (`counted_by: "client"`).
///
/// # Errors
///
/// A child that cannot be started, fails, or prints something that is not its report.
pub async fn run_processes(
    exe: &Path,
    s: &Scenario,
    target_url: &str,
    headers: &[String],
    store: &StoreChoice,
    processes: usize,
) -> Result<RunReport, BoxError> {
    let spawn = Spawn::default();
    run_processes_with(exe, s, target_url, headers, store, processes, &spawn).await
}

/// [`run_processes`] with the extra settings of `spawn` (a CA file, a progress counter).
///
/// # Errors
///
/// As [`run_processes`].
pub async fn run_processes_with(
    exe: &Path,
    s: &Scenario,
    target_url: &str,
    headers: &[String],
    store: &StoreChoice,
    processes: usize,
    spawn: &Spawn,
) -> Result<RunReport, BoxError> {
    let processes = split_workers(s.workers, processes, spawn.workers_per_process.as_deref()).len();
    let start = Instant::now();
    let start_unix_us = wall_clock_us();
    let mut children = Vec::with_capacity(processes);
    for index in 0..processes {
        let (args, _, secrets) =
            child_args(s, target_url, headers, store, spawn, (index, processes));
        let started = start.elapsed();
        let mut child = tokio::process::Command::new(exe)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", exe.display()))?;
        // The secrets, then end of input: the child reads to the end.
        if let Some(mut stdin) = child.stdin.take() {
            let json = serde_json::to_vec(&secrets)?;
            stdin.write_all(&json).await?;
            stdin.shutdown().await?;
        }
        // Read stderr as it comes: progress lines feed the counter, the rest (the child's
        // log) is forwarded to ours and kept for an error message.
        let stderr = child
            .stderr
            .take()
            .map(|err| tokio::spawn(read_stderr(err, spawn.progress.clone(), Some(index))));
        children.push((started, child, stderr));
    }
    let mut parts = Vec::with_capacity(children.len());
    for (started, child, stderr) in children {
        let output = tokio::time::timeout(child_timeout(s), child.wait_with_output())
            .await
            .map_err(|_| "a worker process did not finish in time")??;
        let stderr = match stderr {
            Some(reader) => reader.await?,
            None => String::new(),
        };
        if !output.status.success() {
            return Err(format!(
                "a worker process failed ({}): {}",
                output.status,
                stderr.trim()
            )
            .into());
        }
        let part: ChildReport = serde_json::from_slice(&output.stdout)
            .map_err(|e| format!("a worker process printed no report: {e}"))?;
        parts.push((started, part));
    }
    let ended = start.elapsed();
    // The run's clock starts when the first process's workers are ready (its clock's zero,
    // after its client and its allowances are made), as an in-process run's does: starting
    // the processes (each one's exec, its HTTP client, its connection to Redis) is not part
    // of the run. Without the children's starts (older children), from this process's start.
    let origin_us = match (
        start_unix_us,
        parts
            .iter()
            .map(|(_, part)| part.started_unix_us)
            .collect::<Option<Vec<u64>>>(),
    ) {
        (Some(parent), Some(children)) => children.into_iter().min().map(|c| c.max(parent)),
        _ => None,
    };
    let makespan = match (origin_us, start_unix_us) {
        (Some(origin), Some(parent)) => {
            ended.saturating_sub(Duration::from_micros(origin - parent))
        }
        _ => ended,
    };
    let mut attempts = Vec::new();
    let mut ends = Vec::new();
    let mut first_error = None;
    let (mut admissions, mut store_calls) = (None::<u64>, None::<u64>);
    let mut controller_rates: Vec<Vec<f64>> = Vec::new();
    let mut releases = None::<Releases>;
    for (started, part) in parts {
        first_error = first_error.or(part.first_error);
        let add = |total: Option<u64>, part: Option<u64>| match (total, part) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        admissions = add(admissions, part.admissions);
        store_calls = add(store_calls, part.store_calls);
        controller_rates.extend(part.controller_rates);
        if let Some(part) = part.releases {
            releases = Some(releases.unwrap_or_default() + part);
        }
        // Onto the run's clock: by the child's own start on the shared wall clock, else
        // (an older child) by when it was spawned.
        let shift = match (part.started_unix_us, origin_us) {
            (Some(child), Some(origin)) => (child.saturating_sub(origin) + 500) / 1000,
            _ => u64::try_from(started.as_millis()).unwrap_or(0),
        };
        attempts.extend(part.attempts.into_iter().map(|mut m| {
            m.at_ms += shift;
            m
        }));
        ends.extend(part.ends.into_iter().map(|e| {
            let (started_ms, at_ms) = (e.started_ms + shift, e.at_ms + shift);
            let end = if e.outcome == CANCELLED {
                JobEnd::cancelled(e.worker, started_ms, at_ms)
            } else {
                JobEnd::new(e.worker, started_ms, at_ms, outcome_of(&e.outcome))
                    .failed_by(e.failure)
            };
            match e.job {
                Some(job) => end.timed(job, e.first_attempt_ms.map(|ms| ms + shift)),
                None => end,
            }
        }));
    }
    attempts.sort_by_key(|m| m.at_ms);
    let timeline = Timeline::new(s.mode, s.workers, attempts, ends);
    let mut report = RunReport::new(s, "real", "client", timeline, makespan);
    report.scenario = format!("{} x{processes} {}", report.scenario, store.describe());
    report.first_error = first_error;
    report.admissions = admissions;
    report.store_calls = store_calls;
    if !controller_rates.is_empty() {
        let group = group_rate(
            &controller_rates,
            matches!(store, StoreChoice::Redis { .. }),
        );
        report = report.with_final_rates(controller_rates.concat(), group);
    }
    report.scale.releases = releases;
    Ok(report)
}

/// The rate a group of processes' adaptive controllers allows, from each process's rates (one
/// per allowance, in the same order everywhere): on a shared store, allowance `i` is one
/// controller every process reads (their mean, read at slightly different ends); in memory,
/// every process's allowances are controllers of their own (the sum of all).
///
/// ```
/// use allowance_sim::multi::group_rate;
///
/// let read = [vec![19.0, 5.0], vec![21.0, 5.0]];
/// assert_eq!(group_rate(&read, true), 25.0);
/// assert_eq!(group_rate(&read, false), 50.0);
/// ```
pub fn group_rate(per_process: &[Vec<f64>], shared_store: bool) -> f64 {
    if !shared_store {
        return per_process.iter().flatten().sum();
    }
    let n = per_process.len().max(1) as f64;
    let allowances = per_process.iter().map(Vec::len).max().unwrap_or(0);
    (0..allowances)
        .map(|i| per_process.iter().filter_map(|r| r.get(i)).sum::<f64>() / n)
        .sum()
}

/// A child's stderr: each `progress N` line (N jobs ended so far) adds what is new to
/// `progress`; every other line (its log: a Redis outage, say) is returned, and with
/// `forward` also printed on this process's stderr at once, as `worker INDEX: line`.
async fn read_stderr(
    stderr: impl AsyncRead + Unpin,
    progress: Option<Arc<AtomicUsize>>,
    forward: Option<usize>,
) -> String {
    let mut lines = BufReader::new(stderr).lines();
    let (mut seen, mut rest) = (0, String::new());
    while let Ok(Some(line)) = lines.next_line().await {
        match line.strip_prefix(PROGRESS_PREFIX).map(str::parse::<usize>) {
            Some(Ok(n)) => {
                if let Some(p) = &progress {
                    p.fetch_add(n.saturating_sub(seen), Ordering::Relaxed);
                }
                seen = seen.max(n);
            }
            _ => {
                if let Some(index) = forward {
                    // A closed stderr is no reason to stop reading the child.
                    let _ = writeln!(std::io::stderr(), "worker {index}: {line}");
                }
                rest.push_str(&line);
                rest.push('\n');
            }
        }
    }
    rest
}

/// How a child's progress lines start (then the number of its jobs that have ended).
pub const PROGRESS_PREFIX: &str = "progress ";

/// The child's side of progress: prints `progress N` on stderr whenever `done` has moved,
/// every 100 ms, until dropped (then once more, so the last count is never lost).
#[derive(Debug)]
pub struct ProgressLines {
    done: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl ProgressLines {
    /// Starts printing on the current runtime.
    pub fn start(done: Arc<AtomicUsize>) -> Self {
        let counter = done.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut shown = 0;
            loop {
                tick.tick().await;
                let n = counter.load(Ordering::Relaxed);
                if n != shown {
                    // A parent that stopped reading is no reason to fail the run.
                    let _ = writeln!(std::io::stderr(), "{PROGRESS_PREFIX}{n}");
                    shown = n;
                }
            }
        });
        Self { done, task }
    }
}

impl Drop for ProgressLines {
    fn drop(&mut self) {
        self.task.abort();
        let n = self.done.load(Ordering::Relaxed);
        let _ = writeln!(std::io::stderr(), "{PROGRESS_PREFIX}{n}");
    }
}

impl StoreChoice {
    fn describe(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redis { .. } => "redis",
        }
    }
}

/// The child's side: runs its share and returns the JSON report for stdout; `progress`, if
/// given, counts its jobs as they end.
///
/// # Errors
///
/// As [`live::run_http_with`].
pub async fn run_child(
    s: &Scenario,
    target: &Target,
    store: &StoreChoice,
    share: Share,
    progress: Option<Arc<AtomicUsize>>,
) -> Result<String, BoxError> {
    let report = live::run_http_with(s, target, progress, store, share).await?;
    Ok(serde_json::to_string(&ChildReport::from_report(&report))?)
}

/// Whether a mode coordinates through allowances that a store could hold.
pub fn uses_allowances(mode: Mode) -> bool {
    !matches!(mode, Mode::Naive)
}

/// How long to wait for a child at most: generous, so a hung child cannot hang the tool.
fn child_timeout(s: &Scenario) -> Duration {
    live::expected_duration(s).saturating_mul(4) + Duration::from_secs(60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_split_without_gaps_or_overlaps() {
        let s = Scenario {
            workers: 10,
            ..Scenario::seed(Mode::Shared)
        };
        let mut covered = Vec::new();
        for i in 0..4 {
            let spawn = Spawn::default();
            let (args, n, _) = child_args(
                &s,
                "http://x/{job}",
                &[],
                &StoreChoice::Memory,
                &spawn,
                (i, 4),
            );
            let at = args
                .iter()
                .position(|a| a == "--worker-offset")
                .expect("offset");
            let offset: usize = args[at + 1].parse().expect("number");
            covered.extend(offset..offset + n);
        }
        assert_eq!(covered, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn children_get_the_dialect_and_the_adaptive_rate() {
        use clap::Parser;

        use allowance_testkit::scenario::Adaptive;

        use crate::cli::{Cli, Command};
        let s = Scenario {
            adaptive: Some(Adaptive {
                adopt: true,
                ..Adaptive::starting_at(2.5)
            }),
            dialect: Some("ietf".parse().expect("a dialect")),
            ..Scenario::seed(Mode::Shared)
        };
        let (args, _, _) = child_args(
            &s,
            "http://x/{job}",
            &[],
            &StoreChoice::Memory,
            &Spawn::default(),
            (0, 2),
        );
        let cli = Cli::try_parse_from(std::iter::once("allowance-sim".to_owned()).chain(args))
            .expect("the child's arguments parse");
        let Command::Worker(worker) = cli.command else {
            panic!("not a worker");
        };
        assert_eq!(worker.workload.adaptive(), s.adaptive);
        assert_eq!(worker.workload.dialect, s.dialect);
    }

    #[tokio::test]
    async fn progress_lines_add_up_and_the_rest_is_kept() {
        let done = Arc::new(AtomicUsize::new(5)); // another child's jobs
        let stderr: &[u8] = b"progress 1\nprogress 3\nboom: no report\nprogress 3\nprogress x\n";
        let rest = read_stderr(stderr, Some(done.clone()), None).await;
        assert_eq!(done.load(Ordering::Relaxed), 5 + 3);
        assert_eq!(rest, "boom: no report\nprogress x\n");
    }

    #[test]
    fn outcomes_round_trip() {
        for reason in ["max_attempts", "deadline", "quota_exhausted"]
            .map(|r| r.parse::<AbandonReason>().expect("a reason"))
        {
            assert_eq!(outcome_of(reason.as_str()), Outcome::Abandoned(reason));
        }
        assert_eq!(outcome_of("completed"), Outcome::Completed);
    }
}
