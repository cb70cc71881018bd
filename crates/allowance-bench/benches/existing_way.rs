//! (e) "The existing way": the seed's eight-worker scenario with tower's own pieces, next to
//! tower-allowance, in virtual time (paused Tokio clock), against the same fake upstream.
//!
//! `cargo bench -p allowance-bench --bench existing_way`
//!
//! Setting (the seed's): 8 workers, one job each, upstream bucket burst 2 refilling 2/s,
//! 429 with `Retry-After: 1`, at most 10 attempts per job; the client's limit as the upstream's
//! (the seed), and again set twice too high (4/s, burst 4).
//!
//! - tower, shared: one `tower::limit::RateLimit` (N per 1 s, a fixed window) shared by all workers through
//!   `tower::buffer::Buffer`, under tower's `Retry` with a hand-written policy that sleeps
//!   for `Retry-After` on a 429;
//! - tower, per worker: the same, but each worker builds its own `RateLimit` (its state is
//!   per instance, so nothing is shared: the usual mistake);
//! - ours: `allowance_testkit::scenario::run` in `Mode::Shared` (one `Allowance`, N/s burst N,
//!   through `AllowanceLayer`), and `Mode::Naive` (retries honouring `Retry-After`, no
//!   limiter) for reference.

use std::time::Duration;

use allowance_testkit::{
    fake::{FakeConfig, FakeUpstream},
    scenario::{run, Mode, Scenario},
    upstream::WORKER_HEADER,
};
use http::{header::RETRY_AFTER, Request, Response, StatusCode};
use tokio::time::{sleep, Instant, Sleep};
use tower::{
    buffer::Buffer,
    limit::{rate::Rate, RateLimit},
    retry::{Policy, Retry},
    BoxError, Service, ServiceExt,
};

const WORKERS: u32 = 8;
const MAX_ATTEMPTS: u32 = 10;

/// Retries a 429 after its `Retry-After` (whole seconds), up to `MAX_ATTEMPTS` attempts.
#[derive(Clone, Debug, Default)]
struct HonourRetryAfter {
    attempts: u32,
}

impl Policy<Request<String>, Response<String>, BoxError> for HonourRetryAfter {
    type Future = Sleep;

    fn retry(
        &mut self,
        _req: &mut Request<String>,
        result: &mut Result<Response<String>, BoxError>,
    ) -> Option<Sleep> {
        self.attempts += 1;
        let res = result.as_ref().ok()?;
        if res.status() != StatusCode::TOO_MANY_REQUESTS || self.attempts >= MAX_ATTEMPTS {
            return None;
        }
        let secs: u64 = res
            .headers()
            .get(RETRY_AFTER)?
            .to_str()
            .ok()?
            .parse()
            .ok()?;
        Some(sleep(Duration::from_secs(secs)))
    }

    fn clone_request(&mut self, req: &Request<String>) -> Option<Request<String>> {
        Some(req.clone())
    }
}

/// One row of the table.
#[derive(Debug)]
struct Row {
    name: String,
    attempts: usize,
    rejected: usize,
    completed: usize,
    makespan_ms: u64,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs the eight workers, each through the service `make(worker)` returns.
async fn run_tower<S, F>(name: String, upstream: FakeUpstream, make: F) -> Row
where
    F: Fn() -> S,
    S: Service<Request<String>, Response = Response<String>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let start = Instant::now();
    let tasks: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let service = Retry::new(HonourRetryAfter::default(), make());
            tokio::spawn(async move {
                let mut req = Request::new(String::new());
                req.headers_mut().insert(WORKER_HEADER, worker.into());
                let result = service.oneshot(req).await;
                let ok = result.is_ok_and(|r| r.status().is_success());
                (ok, Instant::now())
            })
        })
        .collect();
    let mut completed = 0;
    let mut finished = start;
    for task in tasks {
        let (ok, at) = task.await.expect("worker");
        completed += usize::from(ok);
        finished = finished.max(at);
    }
    let log = upstream.log();
    Row {
        name,
        attempts: log.len(),
        rejected: log.iter().filter(|s| s.status == 429).count(),
        completed,
        makespan_ms: ms(finished - start),
    }
}

async fn table() -> Vec<Row> {
    let mut rows = Vec::new();
    // As configured in the seed (the client's limit matches the upstream's), then a limit set
    // twice too high (4/s, burst 4), where only a cooldown shared after the first 429 helps.
    for (limit, tag) in [(2, "limit = upstream"), (4, "limit 2x upstream")] {
        let rate = || Rate::new(limit, Duration::from_secs(1));

        let upstream = FakeUpstream::new(FakeConfig::seed());
        let shared = Buffer::new(RateLimit::new(upstream.clone(), rate()), 64);
        let name = format!("{tag}: tower RateLimit({limit} per 1 s) shared via Buffer + Retry");
        rows.push(run_tower(name, upstream, || shared.clone()).await);

        let upstream = FakeUpstream::new(FakeConfig::seed());
        let each = upstream.clone();
        let name = format!("{tag}: tower RateLimit({limit} per 1 s) per worker + Retry");
        // Same shape as the shared row (Buffer), but one RateLimit per worker.
        let per_worker = || Buffer::new(RateLimit::new(each.clone(), rate()), 64);
        rows.push(run_tower(name, upstream, per_worker).await);

        let scenario = Scenario {
            burst: u32::try_from(limit).expect("small"),
            rate_per_sec: u32::try_from(limit).expect("small"),
            ..Scenario::seed(Mode::Shared)
        };
        let report = run(&scenario).await.expect("valid scenario");
        rows.push(Row {
            name: format!(
                "{tag}: ours, one Allowance ({limit}/s, burst {limit}) via AllowanceLayer"
            ),
            attempts: report.attempts,
            rejected: report.rejected,
            completed: report.completed,
            makespan_ms: report.makespan_ms,
        });
    }
    let report = run(&Scenario::seed(Mode::Naive))
        .await
        .expect("valid scenario");
    rows.push(Row {
        name: "no limiter: each worker honours Retry-After alone (allowance-sim naive)".to_owned(),
        attempts: report.attempts,
        rejected: report.rejected,
        completed: report.completed,
        makespan_ms: report.makespan_ms,
    });
    rows
}

fn main() {
    let rows = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
        .block_on(table());
    println!("| setup (8 workers, 8 jobs, upstream burst 2 at 2/s, Retry-After: 1) | attempts | 429s | completed | makespan (virtual ms) |");
    println!("|---|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {}/{} | {} |",
            r.name, r.attempts, r.rejected, r.completed, WORKERS, r.makespan_ms
        );
    }
}
