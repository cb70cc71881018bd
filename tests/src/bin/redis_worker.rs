//! One OS process of a multi-process run: `W` workers, each sending its share of jobs through
//! the full [`AllowanceLayer`] stack to an HTTP upstream, over an allowance kept in Redis
//! (shared with the other processes) or in this process's memory (the seed's lesson).
//!
//! ```text
//! redis_worker --url TEMPLATE --store redis://127.0.0.1:6379/|memory --name NAME \
//!     --workers 8 --jobs 40 --first-job 0 --rate 40 --burst 4 [--budget K] [--attempts 3]
//! ```
//!
//! `TEMPLATE` is the URL of one job with `{job}` in place of its number. The process prints
//! one line, `completed=C abandoned=A failed=F`, and exits 0 when it could run at all.

use std::{collections::HashMap, process::ExitCode};

use allowance_sim::{live::http_client, upstream::API_KEY_HEADER, upstream::DEFAULT_KEY};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use tower::{util::BoxCloneService, ServiceBuilder, ServiceExt};
use tower_allowance::{
    retry::RetryConfig, Allowance, AllowanceConfig, AllowanceLayer, BoxError, Outcome,
    RetryBudgetConfig,
};
use tower_allowance_redis::{RedisStore, RedisStoreOptions};

type Svc = BoxCloneService<Request<Empty<Bytes>>, Response<Bytes>, BoxError>;

struct Args(HashMap<String, String>);

impl Args {
    fn parse() -> Result<Self, BoxError> {
        let mut map = HashMap::new();
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let name = flag
                .strip_prefix("--")
                .ok_or_else(|| format!("expected --flag, got {flag:?}"))?;
            let value = args
                .next()
                .ok_or_else(|| format!("--{name} needs a value"))?;
            map.insert(name.to_owned(), value);
        }
        Ok(Self(map))
    }

    fn str(&self, name: &str) -> Result<&str, BoxError> {
        self.0
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("--{name} is required").into())
    }

    fn num<T: std::str::FromStr>(&self, name: &str, default: Option<T>) -> Result<T, BoxError> {
        match (self.0.get(name), default) {
            (Some(v), _) => v
                .parse()
                .map_err(|_| format!("--{name}: bad number {v:?}").into()),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(format!("--{name} is required").into()),
        }
    }
}

async fn run() -> Result<String, BoxError> {
    let args = Args::parse()?;
    let template = args.str("url")?.to_owned();
    let workers: usize = args.num("workers", None)?;
    let jobs: usize = args.num("jobs", None)?;
    let first_job: usize = args.num("first-job", Some(0))?;
    let budget = match args.num::<u64>("budget", Some(u64::MAX))? {
        u64::MAX => RetryBudgetConfig::Unlimited,
        k => RetryBudgetConfig::fixed(k),
    };
    let config = AllowanceConfig::per_second(args.num("rate", None)?, args.num("burst", None)?)?
        .with_retry_budget(budget)
        .with_max_waiters(workers.max(1));
    let allowance = match args.str("store")? {
        "memory" => Allowance::new(config),
        url => {
            let store =
                RedisStore::connect(url, args.str("name")?, RedisStoreOptions::new()).await?;
            Allowance::with_store(config, store)
        }
    };
    let retry = RetryConfig::default()
        .with_max_attempts(args.num("attempts", Some(3))?)?
        .with_jitter_seed(u64::try_from(first_job).unwrap_or(0));

    let client = http_client();
    let inner = Svc::new(tower::service_fn(move |req: Request<Empty<Bytes>>| {
        let client = client.clone();
        async move {
            let (parts, body) = client.request(req).await?.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, BoxError>(Response::from_parts(parts, body))
        }
    }));
    let service = Svc::new(
        ServiceBuilder::new()
            .layer(AllowanceLayer::new(allowance, retry))
            .service(inner),
    );

    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let (service, template) = (service.clone(), template.clone());
        tasks.spawn(async move {
            let mut outcomes = vec![];
            for job in (worker..jobs).step_by(workers) {
                let url = template.replace("{job}", &(first_job + job).to_string());
                let req = Request::get(url)
                    .header(API_KEY_HEADER, DEFAULT_KEY)
                    .body(Empty::new())?;
                outcomes.push(Outcome::of(&service.clone().oneshot(req).await));
            }
            Ok::<_, BoxError>(outcomes)
        });
    }
    let (mut completed, mut abandoned, mut failed) = (0, 0, 0);
    while let Some(result) = tasks.join_next().await {
        for outcome in result?? {
            match outcome {
                Outcome::Completed => completed += 1,
                Outcome::Abandoned(_) => abandoned += 1,
                Outcome::Failed => failed += 1,
            }
        }
    }
    Ok(format!(
        "completed={completed} abandoned={abandoned} failed={failed}"
    ))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("redis_worker: {e}");
            ExitCode::FAILURE
        }
    }
}
