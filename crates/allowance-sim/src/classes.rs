//! Classes of callers on one allowance (`--class NAME:WEIGHT[:high][:jobs=N][:every=DURATION]`,
//! tower-allowance's feature `shares`): each class's share of the admissions over time, and
//! each job's wait, from its arrival to its request leaving.
//!
//! Workers are split among the classes by their jobs (at least one each), and across
//! `--processes` evenly (a class's worker `w` runs in process `w % processes`). Job `k` of a
//! class with `every` arrives `k * every` after the run's start, whichever process runs it;
//! without, every job is there from the start. The processes agree on the start through a
//! wall-clock instant the parent passes them (`--class-epoch-ms`).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use bytes::Bytes;
use clap::Args;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tower::{util::BoxCloneService, ServiceBuilder, ServiceExt};
use tower_allowance::{
    lease::LeaseStore,
    retry::RetryConfig,
    shares::{Class, Share},
    store::MemoryStore,
    Allowance, AllowanceConfig, BoxError,
};
use tower_allowance_redis::RedisStoreOptions;

use allowance_testkit::{
    fake::{FakeUpstream, VIRTUAL_MAX_DATE_SKEW},
    report::min_makespan_ms,
    scenario::Scenario,
    upstream::WORKER_HEADER,
};

use crate::live::{connect_redis, HttpsClient, StoreChoice, Target};

/// One `--class` argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassSpec {
    /// The class's name.
    pub name: String,
    /// Its weight.
    pub weight: u32,
    /// Strict priority.
    pub high: bool,
    /// Its jobs (default: an even part of `--jobs`).
    pub jobs: Option<usize>,
    /// Job `k` arrives `k * every` after the start (default: all at the start).
    pub every: Option<Duration>,
}

/// Parses `NAME:WEIGHT[:high][:jobs=N][:every=DURATION]`.
///
/// # Errors
///
/// Anything else.
pub fn parse_class(s: &str) -> Result<ClassSpec, String> {
    let bad = |why: &str| {
        format!("invalid --class {s:?}: {why} (NAME:WEIGHT[:high][:jobs=N][:every=DURATION])")
    };
    let mut parts = s.split(':');
    let name = parts
        .next()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("no name"))?;
    let weight = parts
        .next()
        .and_then(|w| w.parse().ok())
        .filter(|w| (1..=1000).contains(w))
        .ok_or_else(|| bad("a weight of 1 to 1000"))?;
    let mut spec = ClassSpec {
        name: name.to_owned(),
        weight,
        high: false,
        jobs: None,
        every: None,
    };
    for part in parts {
        if part == "high" {
            spec.high = true;
        } else if let Some(n) = part.strip_prefix("jobs=") {
            spec.jobs = Some(n.parse().map_err(|_| bad("jobs=N"))?);
        } else if let Some(d) = part.strip_prefix("every=") {
            spec.every = Some(parse_duration(d).map_err(|e| bad(&e))?);
        } else {
            return Err(bad(&format!("unknown part {part:?}")));
        }
    }
    Ok(spec)
}

/// Parses `500ms`, `10s`, `1.5s` or a bare number of seconds (every duration the CLI takes).
///
/// # Errors
///
/// Anything else.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?}: use e.g. 500ms, 2s or 1.5");
    if let Some(ms) = s.strip_suffix("ms") {
        return ms
            .trim()
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| bad());
    }
    let secs: f64 = s
        .strip_suffix('s')
        .unwrap_or(s)
        .trim()
        .parse()
        .map_err(|_| bad())?;
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// The classes' arguments of `http` and `run`.
#[derive(Clone, Debug, Default, Args)]
pub struct ClassArgs {
    /// A class of callers sharing the allowance: `NAME:WEIGHT[:high][:jobs=N][:every=DURATION]`
    /// (repeatable). Workers are split among the classes by their jobs; `every`: job k arrives
    /// k x DURATION after the start. The report gives each class's admissions per --window.
    /// `run --class` runs in real time on loopback; with --virtual, on a paused clock against
    /// the in-process upstream (one process).
    #[arg(long = "class", value_parser = parse_class, value_name = "NAME:WEIGHT[:...]")]
    pub classes: Vec<ClassSpec>,
    /// The windows each class's admissions are counted in (default 10s).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub window: Option<Duration>,
    /// (A worker process of a class run: its part, `P/N`.)
    #[arg(long, hide = true)]
    pub class_part: Option<String>,
    /// (A worker process of a class run: the start, in Unix milliseconds.)
    #[arg(long, hide = true)]
    pub class_epoch_ms: Option<u64>,
    /// (A worker process of a class run: the allowance's name in Redis.)
    #[arg(long, hide = true)]
    pub class_store_name: Option<String>,
}

/// One job as it went.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobRecord {
    class: String,
    job: usize,
    arrived_ms: u64,
    /// When its first attempt left (`None`: never sent).
    sent_ms: Option<u64>,
    done_ms: u64,
    ok: bool,
}

/// One class in the report.
#[derive(Clone, Debug, Serialize)]
pub struct ClassReport {
    weight: u32,
    high: bool,
    jobs: usize,
    completed: usize,
    windows: Vec<usize>,
    max_wait_ms: u64,
    p99_wait_ms: u64,
}

/// A class run's report.
#[derive(Clone, Debug, Serialize)]
pub struct ClassRunReport {
    jobs: usize,
    completed: usize,
    makespan_ms: u64,
    min_makespan_ms: u64,
    processes: usize,
    window_ms: u64,
    classes: BTreeMap<String, ClassReport>,
    /// With `--lease --virtual`: the lease calls made (each one store call).
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_calls: Option<u64>,
}

/// Each class's jobs and workers.
fn plan(args: &ClassArgs, jobs: usize, workers: usize) -> Vec<(ClassSpec, usize, usize)> {
    let given: usize = args.classes.iter().filter_map(|c| c.jobs).sum();
    let open = args.classes.iter().filter(|c| c.jobs.is_none()).count();
    let rest = jobs.saturating_sub(given);
    let jobs_of: Vec<usize> = (args.classes.iter().enumerate())
        .map(|(i, c)| {
            c.jobs.unwrap_or_else(|| {
                let k = args.classes[..i]
                    .iter()
                    .filter(|c| c.jobs.is_none())
                    .count();
                rest / open.max(1) + usize::from(k < rest % open.max(1))
            })
        })
        .collect();
    let total: usize = jobs_of.iter().sum::<usize>().max(1);
    (args.classes.iter().zip(&jobs_of))
        .map(|(c, j)| (c.clone(), *j, (workers * j / total).max(1)))
        .collect()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// When the request left, set by the client service the first time.
#[derive(Clone, Default)]
struct SentAt(Arc<AtomicU64>);

type Svc = BoxCloneService<Request<Empty<Bytes>>, Response<Bytes>, BoxError>;

fn client_service(client: HttpsClient, start: Instant) -> Svc {
    stamped(
        tower::service_fn(move |req: Request<Empty<Bytes>>| {
            let client = client.clone();
            async move {
                let res = client.request(req).await?;
                let (parts, body) = res.into_parts();
                let body = body.collect().await?.to_bytes();
                Ok::<_, BoxError>(Response::from_parts(parts, body))
            }
        }),
        start,
    )
}

/// `inner`, noting when a request first leaves ([`SentAt`]).
fn stamped<S>(inner: S, start: Instant) -> Svc
where
    S: tower::Service<Request<Empty<Bytes>>, Response = Response<Bytes>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    Svc::new(tower::service_fn(move |req: Request<Empty<Bytes>>| {
        if let Some(sent) = req.extensions().get::<SentAt>() {
            let at = ms(start.elapsed()) + 1;
            let _ = sent
                .0
                .compare_exchange(0, at, Ordering::AcqRel, Ordering::Acquire);
        }
        inner.clone().oneshot(req)
    }))
}

/// Runs this process's part (`part` of `parts`) from `start`: the job records.
///
/// # Errors
///
/// A bad URL, a Redis that cannot be reached, a class the allowance refuses.
pub async fn run_part(
    s: &Scenario,
    args: &ClassArgs,
    target: &Target,
    store: &StoreChoice,
    (part, parts): (usize, usize),
    start: Instant,
) -> Result<Vec<JobRecord>, BoxError> {
    let builder = Allowance::builder(class_config(s, args)?).name("sim");
    // `--lease`: the classes share the leased tokens (the lease's own figures go unreported).
    let allowance = match (store, crate::live::lease()) {
        (StoreChoice::Memory, None) => builder.build(),
        (StoreChoice::Memory, Some(lease)) => builder
            .store(LeaseStore::new(MemoryStore::new(), lease))
            .build(),
        (StoreChoice::Redis { url, name }, lease) => {
            let redis = connect_redis(url, name, RedisStoreOptions::new()).await?;
            match lease {
                Some(lease) => builder.store(LeaseStore::new(redis, lease)).build(),
                None => builder.store(redis).build(),
            }
        }
    };
    let client = client_service(target.client()?, start);
    let target = target.clone();
    let request = move |job, worker| target.request(job, worker);
    run_jobs(s, args, &allowance, (part, parts), start, client, request).await
}

/// The scenario's allowance with the classes.
fn class_config(s: &Scenario, args: &ClassArgs) -> Result<AllowanceConfig, BoxError> {
    let mut config = allowance_testkit::scenario::allowance_config(s)?;
    for c in &args.classes {
        let share = Share::weight(c.weight)?;
        config = config.with_class(&c.name, if c.high { share.high() } else { share })?;
    }
    Ok(config)
}

/// Runs this process's jobs (`part` of `parts`) from `start`, through `allowance` to `client`
/// (a [`stamped`] service), each job's request made by `request(job, worker)`.
async fn run_jobs<F>(
    s: &Scenario,
    args: &ClassArgs,
    allowance: &Allowance,
    (part, parts): (usize, usize),
    start: Instant,
    client: Svc,
    request: F,
) -> Result<Vec<JobRecord>, BoxError>
where
    F: Fn(usize, u32) -> Result<Request<Empty<Bytes>>, BoxError> + Clone + Send + 'static,
{
    let retry = RetryConfig::default()
        .with_max_attempts(s.max_attempts)?
        .with_jitter_seed(1);
    let service = Svc::new(
        ServiceBuilder::new()
            .layer(allowance.layer().with_retry(retry))
            .service(client),
    );
    let records = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut first_job = 0;
    for (spec, jobs, workers) in plan(args, s.jobs, s.workers) {
        for w in (part..workers).step_by(parts.max(1)) {
            let (spec, service, request, records) = (
                spec.clone(),
                service.clone(),
                request.clone(),
                records.clone(),
            );
            let offset = first_job;
            tasks.push(tokio::spawn(async move {
                let class = Class::new(spec.name.clone());
                for k in (w..jobs).step_by(workers) {
                    let arrival = start + spec.every.map_or(Duration::ZERO, |e| e * k as u32);
                    tokio::time::sleep_until(arrival).await;
                    let arrived_ms = ms(arrival.saturating_duration_since(start));
                    let mut req = request(offset + k, u32::try_from(w).unwrap_or(u32::MAX))
                        .map_err(|e| e.to_string())?;
                    let sent = SentAt::default();
                    req.extensions_mut().insert(class.clone());
                    req.extensions_mut().insert(sent.clone());
                    let result = service.clone().oneshot(req).await;
                    let ok = result.is_ok_and(|r| r.status().is_success());
                    let sent_ms = match sent.0.load(Ordering::Acquire) {
                        0 => None,
                        at => Some(at - 1),
                    };
                    let record = JobRecord {
                        class: spec.name.clone(),
                        job: k,
                        arrived_ms,
                        sent_ms,
                        done_ms: ms(start.elapsed()),
                        ok,
                    };
                    records
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(record);
                }
                Ok::<_, String>(())
            }));
        }
        first_job += jobs;
    }
    for t in tasks {
        t.await?.map_err(BoxError::from)?;
    }
    let records = std::mem::take(&mut *records.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(records)
}

/// The report of a run from its job records.
pub fn report(
    s: &Scenario,
    args: &ClassArgs,
    processes: usize,
    records: &[JobRecord],
) -> ClassRunReport {
    let window_ms = ms(args.window.unwrap_or(Duration::from_secs(10))).max(1);
    let makespan_ms = records.iter().map(|r| r.done_ms).max().unwrap_or(0);
    let planned = plan(args, s.jobs, s.workers);
    let all_jobs: usize = planned.iter().map(|(_, j, _)| j).sum();
    let mut classes = BTreeMap::new();
    for (spec, jobs, _) in planned {
        let mine: Vec<&JobRecord> = records.iter().filter(|r| r.class == spec.name).collect();
        let mut windows = vec![0; usize::try_from(makespan_ms / window_ms).unwrap_or(0) + 1];
        let mut waits = Vec::new();
        for r in &mine {
            if let Some(sent) = r.sent_ms {
                let i = usize::try_from(sent / window_ms).unwrap_or(0);
                if let Some(n) = windows.get_mut(i) {
                    *n += 1;
                }
                waits.push(sent.saturating_sub(r.arrived_ms));
            }
        }
        waits.sort_unstable();
        let p99 = waits
            .get((waits.len() * 99).div_ceil(100).saturating_sub(1))
            .copied()
            .unwrap_or(0);
        classes.insert(
            spec.name.clone(),
            ClassReport {
                weight: spec.weight,
                high: spec.high,
                jobs,
                completed: mine.iter().filter(|r| r.ok).count(),
                windows,
                max_wait_ms: waits.last().copied().unwrap_or(0),
                p99_wait_ms: p99,
            },
        );
    }
    ClassRunReport {
        jobs: all_jobs,
        completed: records.iter().filter(|r| r.ok).count(),
        makespan_ms,
        min_makespan_ms: min_makespan_ms(all_jobs, s.burst, s.rate_per_sec),
        processes,
        window_ms,
        classes,
        lease_calls: None,
    }
}

/// The report as a table.
pub fn table(r: &ClassRunReport) -> String {
    let mut out = format!(
        "{} of {} jobs completed in {} ms (minimum {} ms), {} process(es)\n\
         class        weight high   jobs  done  max wait ms  p99 wait ms  admissions per {} ms window\n",
        r.completed, r.jobs, r.makespan_ms, r.min_makespan_ms, r.processes, r.window_ms
    );
    for (name, c) in &r.classes {
        let _ = writeln!(
            out,
            "{name:<12} {:>6} {:<5} {:>5} {:>5} {:>12} {:>12}  {:?}",
            c.weight, c.high, c.jobs, c.completed, c.max_wait_ms, c.p99_wait_ms, c.windows
        );
    }
    if let Some(calls) = r.lease_calls {
        let _ = writeln!(out, "lease calls: {calls} (one store call each)");
    }
    out
}

/// The report as JSON.
///
/// # Errors
///
/// Never in practice (serde_json on plain data).
pub fn json(r: &ClassRunReport) -> Result<String, BoxError> {
    Ok(serde_json::to_string(r)?)
}

/// The shares over time as an SVG chart: per window, each class's part of the admissions.
///
/// # Errors
///
/// The chart could not be drawn.
pub fn svg(r: &ClassRunReport) -> Result<String, BoxError> {
    use plotters::prelude::*;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (800, 400)).into_drawing_area();
        root.fill(&WHITE)?;
        let windows = r
            .classes
            .values()
            .map(|c| c.windows.len())
            .max()
            .unwrap_or(1);
        let totals: Vec<usize> = (0..windows)
            .map(|i| {
                r.classes
                    .values()
                    .map(|c| c.windows.get(i).copied().unwrap_or(0))
                    .sum()
            })
            .collect();
        let secs = r.window_ms as f64 / 1000.0;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "each class's share of the admissions, per window",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..(windows as f64 * secs), 0f64..1f64)?;
        chart
            .configure_mesh()
            .x_desc("seconds from the start")
            .y_desc("share")
            .draw()?;
        let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
        for (k, (name, c)) in r.classes.iter().enumerate() {
            let color = colors[k % colors.len()];
            let points: Vec<(f64, f64)> = (0..windows)
                .filter(|i| totals[*i] > 0)
                .map(|i| {
                    let share = c.windows.get(i).copied().unwrap_or(0) as f64 / totals[i] as f64;
                    ((i as f64 + 0.5) * secs, share)
                })
                .collect();
            chart
                .draw_series(std::iter::once(PathElement::new(
                    points,
                    color.stroke_width(2),
                )))?
                .label(format!(
                    "{name} (weight {}{})",
                    c.weight,
                    if c.high { ", high" } else { "" }
                ))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(out)
}

/// The command line of the worker processes: this one's, with `--processes` dropped and the
/// part and the start added.
fn child_args(part: usize, parts: usize, epoch_ms: u64, name: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut skip = false;
    for a in std::env::args().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        if a == "--processes" || a == "--timeline" {
            skip = true;
            continue;
        }
        if a.starts_with("--processes=") || a.starts_with("--timeline=") {
            continue;
        }
        args.push(a);
    }
    args.extend([
        "--class-part".to_owned(),
        format!("{part}/{parts}"),
        "--class-epoch-ms".to_owned(),
        epoch_ms.to_string(),
        "--class-store-name".to_owned(),
        name.to_owned(),
    ]);
    if !args.iter().any(|a| a == "--json") {
        args.push("--json".to_owned());
    }
    args
}

fn unix_ms() -> u64 {
    crate::live::wall_clock_us().map_or(0, |us| us / 1_000)
}

/// The instant `epoch_ms` (Unix milliseconds) on tokio's clock.
fn instant_of(epoch_ms: u64) -> Instant {
    let now = Instant::now();
    let now_ms = unix_ms();
    if epoch_ms >= now_ms {
        now + Duration::from_millis(epoch_ms - now_ms)
    } else {
        now.checked_sub(Duration::from_millis(now_ms - epoch_ms))
            .unwrap_or(now)
    }
}

/// `run --class --virtual`: one process on a paused clock against the in-process throttling
/// upstream (as `run --virtual`): the report and the 429s the upstream answered.
///
/// # Errors
///
/// A class or configuration the allowance refuses.
pub fn execute_virtual(
    s: &Scenario,
    args: &ClassArgs,
) -> Result<(ClassRunReport, usize), BoxError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    rt.block_on(async {
        let upstream = FakeUpstream::new(s.upstream.clone());
        let start = Instant::now();
        let config = class_config(s, args)?.with_max_date_skew(VIRTUAL_MAX_DATE_SKEW);
        let builder = Allowance::builder(config).name("sim");
        let leased = crate::live::lease().map(|l| LeaseStore::new(MemoryStore::new(), l));
        let allowance = match &leased {
            Some(store) => builder.store(store.clone()).build(),
            None => builder.build(),
        };
        let fake = upstream.clone();
        let client = stamped(
            tower::service_fn(move |req: Request<Empty<Bytes>>| {
                let res = fake.clone().oneshot(req);
                async move {
                    let res = res.await?;
                    Ok::<_, BoxError>(res.map(Bytes::from))
                }
            }),
            start,
        );
        let request = |job: usize, worker: u32| {
            Ok(Request::get(format!("/e{job}"))
                .header(WORKER_HEADER, worker)
                .body(Empty::new())?)
        };
        let records = run_jobs(s, args, &allowance, (0, 1), start, client, request).await?;
        let rejected = upstream.log().iter().filter(|r| r.status == 429).count();
        let mut report = report(s, args, 1, &records);
        report.lease_calls = leased.map(|l| l.lease_calls());
        Ok((report, rejected))
    })
}

/// `http` (or `run`) with `--class`: runs the classes (in `processes` processes, sharing the
/// allowance through Redis) and reports them.
///
/// # Errors
///
/// As [`run_part`]; a worker process that fails.
pub fn execute(
    s: &Scenario,
    args: &ClassArgs,
    target: &Target,
    store: &StoreChoice,
    processes: usize,
) -> Result<ClassOutcome, BoxError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let store = &match (store, &args.class_store_name) {
        (StoreChoice::Redis { url, .. }, Some(name)) => StoreChoice::Redis {
            url: url.clone(),
            name: name.clone(),
        },
        _ => store.clone(),
    };
    if let (Some(part), Some(epoch)) = (&args.class_part, args.class_epoch_ms) {
        let (p, n) = part
            .split_once('/')
            .and_then(|(p, n)| Some((p.parse().ok()?, n.parse().ok()?)))
            .ok_or("invalid --class-part")?;
        let records = rt.block_on(async {
            run_part(s, args, target, store, (p, n), instant_of(epoch)).await
        })?;
        return Ok(ClassOutcome::Part(serde_json::to_string(&records)?));
    }
    if processes <= 1 {
        let records =
            rt.block_on(async { run_part(s, args, target, store, (0, 1), Instant::now()).await })?;
        return Ok(ClassOutcome::Report(report(s, args, 1, &records)));
    }
    let StoreChoice::Redis { name, .. } = store else {
        return Err(
            "--class with --processes needs --redis: the processes share the allowance there"
                .into(),
        );
    };
    // Every process starts at the same wall-clock instant, once all have connected.
    let epoch = unix_ms() + 1_500;
    let exe = std::env::current_exe()?;
    let children: Vec<_> = (0..processes)
        .map(|p| {
            std::process::Command::new(&exe)
                .args(child_args(p, processes, epoch, name))
                .stdout(std::process::Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut records = Vec::new();
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(format!("a worker process failed ({})", out.status).into());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().unwrap_or("[]");
        let part: Vec<JobRecord> = serde_json::from_str(line)?;
        records.extend(part);
    }
    Ok(ClassOutcome::Report(report(s, args, processes, &records)))
}

/// What a class run prints.
#[derive(Debug)]
pub enum ClassOutcome {
    /// A worker process's job records, as one JSON line.
    Part(String),
    /// The whole run's report.
    Report(ClassRunReport),
}
