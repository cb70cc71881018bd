//! Each layer of the stack alone and each pair, in paused time, against one scenario; and
//! [`AllowanceLayer`] against the same composition built by hand.
//!
//! The scenario, on one allowance that paces nobody (1,000 a second, bursts of 10,000):
//! request `a` at 0 s is answered 429 with `Retry-After: 5`, request `b` at 1 s 429 with
//! `Retry-After: 1`, request `c` at 1.5 s 200; every retry is answered 200. What each
//! stack makes of it shows what each layer adds: the admission gates first attempts, the
//! cooldown shares a server's delay, the retry policy retries (spending the budget).

use std::{
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use tokio::time::Instant;
use tower::{
    retry::{Retry, RetryLayer},
    service_fn,
    util::BoxCloneService,
    Layer, ServiceBuilder, ServiceExt,
};

use tower_allowance::{
    admission::{Admission, AdmissionLayer},
    body::Replayable,
    cooldown::{Cooldown, CooldownLayer},
    error::AbandonReason,
    retry::{Prepare, RetryConfig, RetryPolicy},
    Allowance, AllowanceConfig, Attempt, BoxError, Outcome, RetryBudgetConfig,
};

type Svc<B> = BoxCloneService<Request<B>, Response<String>, BoxError>;

/// One attempt as the upstream saw it: ms since the start, the request's name, its attempt
/// number (1 for a first attempt) and the body it read.
type Seen = (u64, &'static str, u32, Bytes);

fn allowance(budget: u64) -> Allowance {
    Allowance::new(
        AllowanceConfig::per_second(1_000, 10_000)
            .expect("valid")
            .with_retry_budget(RetryBudgetConfig::fixed(budget)),
    )
}

fn retry_config() -> RetryConfig {
    RetryConfig::default()
        .with_max_attempts(3)
        .expect("valid")
        .with_jitter_seed(1)
}

/// Answers a first attempt carrying `x-retry-after` with a 429 and that `Retry-After` (or
/// every attempt, with `always`), anything else with a 200; reads each body whole and logs
/// the attempt.
#[derive(Clone)]
struct Upstream {
    start: Instant,
    log: Arc<Mutex<Vec<Seen>>>,
    always: bool,
}

impl Upstream {
    fn new(start: Instant) -> Self {
        Self {
            start,
            log: Arc::default(),
            always: false,
        }
    }

    fn always_429(start: Instant) -> Self {
        Self {
            always: true,
            ..Self::new(start)
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn service<B>(&self) -> Svc<B>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let this = self.clone();
        Svc::new(service_fn(move |req: Request<B>| this.clone().serve(req)))
    }

    async fn serve<B>(self, req: Request<B>) -> Result<Response<String>, BoxError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let name = match req.headers().get("x-name").map(HeaderValue::as_bytes) {
            Some(b"a") => "a",
            Some(b"b") => "b",
            Some(b"c") => "c",
            _ => "?",
        };
        let attempt = req.extensions().get::<Attempt>().map_or(1, Attempt::number);
        let delay = req.headers().get("x-retry-after").cloned();
        let body = req
            .into_body()
            .collect()
            .await
            .map_err(Into::into)?
            .to_bytes();
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((ms, name, attempt, body));
        let mut res = Response::new(String::new());
        match delay {
            Some(delay) if attempt == 1 || self.always => {
                *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                res.headers_mut().insert("retry-after", delay);
            }
            _ => *res.body_mut() = "ok".to_owned(),
        }
        Ok(res)
    }
}

/// A PUT (replayable) named `name`, asking the upstream for `retry_after` if any.
fn put<B>(name: &'static str, retry_after: Option<&'static str>, body: B) -> Request<B> {
    let mut req = Request::new(body);
    *req.method_mut() = Method::PUT;
    req.headers_mut()
        .insert("x-name", HeaderValue::from_static(name));
    if let Some(delay) = retry_after {
        req.headers_mut()
            .insert("x-retry-after", HeaderValue::from_static(delay));
    }
    req
}

/// A streamed body of unknown length (not `Clone`: only a `Replay` can send it again).
fn streamed(text: &'static str) -> BoxBody<Bytes, BoxError> {
    let (head, tail) = text.split_at(text.len() / 2);
    let frames = [head, tail].map(|c| Ok::<_, BoxError>(Frame::data(Bytes::from(c))));
    let body = StreamBody::new(futures_util::stream::iter(frames));
    assert_eq!(body.size_hint().upper(), None, "unknown length");
    body.boxed()
}

/// What the scenario produced: every attempt the upstream saw, in order, and each
/// request's (status, outcome), in the order a, b, c.
#[derive(Debug, PartialEq)]
struct Run {
    seen: Vec<Seen>,
    results: Vec<(Option<StatusCode>, Outcome)>,
    retries_spent: u64,
    blocked_at_end: Duration,
}

/// Runs the scenario through `stack` (built over the upstream's service), with bodies made
/// by `body`.
async fn scenario<B>(
    allowance: &Allowance,
    body: fn(&'static str) -> B,
    stack: impl FnOnce(Svc<B>) -> Svc<B>,
) -> Run
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let start = Instant::now();
    let upstream = Upstream::new(start);
    let service = stack(upstream.service());
    let plan: [(u64, &'static str, Option<&'static str>); 3] = [
        (0, "a", Some("5")),
        (1_000, "b", Some("1")),
        (1_500, "c", None),
    ];
    let tasks: Vec<_> = plan
        .into_iter()
        .map(|(at, name, delay)| {
            let service = service.clone();
            let req = put(name, delay, body(name));
            tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_millis(at)).await;
                let result = service.oneshot(req).await;
                (
                    result.as_ref().ok().map(Response::status),
                    Outcome::of(&result),
                )
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("no panic"));
    }
    Run {
        seen: upstream.seen(),
        results,
        retries_spent: allowance.snapshot().retries_spent,
        blocked_at_end: allowance
            .store_state()
            .await
            .expect("memory store")
            .blocked_for,
    }
}

fn full(text: &'static str) -> Full<Bytes> {
    Full::new(Bytes::from_static(text.as_bytes()))
}

fn b(text: &'static str) -> Bytes {
    Bytes::from_static(text.as_bytes())
}

const OK: Option<StatusCode> = Some(StatusCode::OK);
const THROTTLED: Option<StatusCode> = Some(StatusCode::TOO_MANY_REQUESTS);

// === each layer alone ===

#[tokio::test(start_paused = true)]
async fn the_retry_policy_alone_under_tower_retry_layer_is_bounded_by_the_cap_only() {
    // Three attempts, each after the server's Retry-After, whatever the budget: with no
    // admission layer under the `Retry`, nothing spends it (the retry module's docs).
    for budget in [100, 1] {
        let allowance = allowance(budget);
        let start = Instant::now();
        let upstream = Upstream::always_429(start);
        let service = ServiceBuilder::new()
            .layer(RetryLayer::new(
                RetryPolicy::new(allowance.clone()).with_config(retry_config()),
            ))
            .service(upstream.service::<Full<Bytes>>());
        let result = service.oneshot(put("a", Some("1"), full("a"))).await;
        let reason = AbandonReason::MaxAttempts;
        assert_eq!(Outcome::of(&result), Outcome::Abandoned(reason), "{budget}");
        assert_eq!(
            result.as_ref().ok().map(Response::status),
            THROTTLED,
            "{budget}: the last 429 is kept"
        );
        let seen = upstream.seen();
        let expected: Vec<Seen> = [1, 2, 3]
            .iter()
            .map(|&n| (u64::from(n - 1) * 1_000, "a", n, b("a")))
            .collect();
        assert_eq!(seen, expected, "{budget}");
        assert_eq!(allowance.snapshot().retries_spent, 0, "{budget}");
        // Nothing raised a shared cooldown: there is no cooldown layer.
        let state = allowance.store_state().await.expect("memory store");
        assert_eq!(state.blocked_for, Duration::ZERO, "{budget}");
        assert_eq!(state.retries_remaining, Some(budget), "{budget}: untouched");
    }
}

#[tokio::test(start_paused = true)]
async fn the_scenario_through_the_retry_layer_alone() {
    let allowance = allowance(10);
    let policy = RetryPolicy::new(allowance.clone()).with_config(retry_config());
    let run = scenario(&allowance, full, |up| Svc::new(Retry::new(policy, up))).await;
    // Each request honours its own Retry-After; nothing is shared, nothing gated.
    assert_eq!(
        run.seen,
        vec![
            (0, "a", 1, b("a")),
            (1_000, "b", 1, b("b")),
            (1_500, "c", 1, b("c")),
            (2_000, "b", 2, b("b")),
            (5_000, "a", 2, b("a")),
        ]
    );
    assert_eq!(run.results, vec![(OK, Outcome::Completed); 3]);
    assert_eq!((run.retries_spent, run.blocked_at_end), (0, Duration::ZERO));
}

// === each pair ===

#[tokio::test(start_paused = true)]
async fn retry_over_cooldown_without_admission_raises_the_cooldown_and_gates_nothing() {
    let allowance = allowance(10);
    let policy = RetryPolicy::new(allowance.clone()).with_config(retry_config());
    let run = scenario(&allowance, full, |up| {
        Svc::new(Retry::new(
            policy,
            CooldownLayer::new(allowance.clone()).layer(up),
        ))
    })
    .await;
    // The cooldown a's 429 raised (until 5 s) is recorded, but nothing gates: first attempts
    // pass inside it (b at 1 s, c at 1.5 s), and each retry honours its own Retry-After
    // (b's 1 s): the policy decides when, and only an admission layer holds anyone to the
    // shared cooldown. No admission layer, no budget spent.
    assert_eq!(
        run.seen,
        vec![
            (0, "a", 1, b("a")),
            (1_000, "b", 1, b("b")),
            (1_500, "c", 1, b("c")),
            (2_000, "b", 2, b("b")),
            (5_000, "a", 2, b("a")),
        ]
    );
    assert_eq!(run.results, vec![(OK, Outcome::Completed); 3]);
    assert_eq!((run.retries_spent, run.blocked_at_end), (0, Duration::ZERO));
}

#[tokio::test(start_paused = true)]
async fn cooldown_over_admission_without_retry_gates_first_attempts_and_retries_nothing() {
    let allowance = allowance(10);
    let run = scenario(&allowance, full, |up| {
        Svc::new(
            CooldownLayer::new(allowance.clone())
                .layer(AdmissionLayer::new(allowance.clone()).layer(up)),
        )
    })
    .await;
    // a's 429 closes the gate until 5 s: b and c wait in admission, in order; b's 429 at
    // 5 s closes it again for a second, which moves c's reserved slot (1 ms behind b's) to
    // 6 s. b's own 429 is its answer (no retry layer).
    let at = |seen: &[Seen]| seen.iter().map(|s| (s.0, s.1, s.2)).collect::<Vec<_>>();
    assert_eq!(
        at(&run.seen),
        vec![(0, "a", 1), (5_000, "b", 1), (6_000, "c", 1)]
    );
    assert_eq!(run.results[2], (OK, Outcome::Completed));
    for result in &run.results[..2] {
        assert_eq!(result.0, THROTTLED);
    }
    assert_eq!(run.retries_spent, 0);
    // Over by the end (6 s).
    assert_eq!(run.blocked_at_end, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn retry_over_admission_without_cooldown_admits_each_retry_once() {
    let allowance = allowance(10);
    let policy = RetryPolicy::new(allowance.clone()).with_config(retry_config());
    let run = scenario(&allowance, full, |up| {
        Svc::new(Retry::new(
            policy,
            AdmissionLayer::new(allowance.clone()).layer(up),
        ))
    })
    .await;
    // No shared cooldown: b retries after its own second and c is admitted at once; each
    // retry was admitted by the admission layer, which spent the budget for it.
    assert_eq!(
        run.seen,
        vec![
            (0, "a", 1, b("a")),
            (1_000, "b", 1, b("b")),
            (1_500, "c", 1, b("c")),
            (2_000, "b", 2, b("b")),
            (5_000, "a", 2, b("a")),
        ]
    );
    assert_eq!(run.results, vec![(OK, Outcome::Completed); 3]);
    let snapshot = allowance.snapshot();
    assert_eq!((snapshot.admitted, snapshot.retries_spent), (5, 2));
}

// === the whole stack, and the same built by hand ===

/// The full stack's run of the scenario, which both builds must produce.
fn full_stack_run(seen: Vec<Seen>) {
    assert_eq!(
        seen,
        vec![
            (0, "a", 1, b("a")),
            // a's retry, reserved at 0 s for 5 s, goes first; b and c waited out a's
            // cooldown in admission, behind it.
            (5_000, "a", 2, b("a")),
            (5_000, "b", 1, b("b")),
            // b's 429 at 5 s closes the gate for a second: b's retry and c's moved slot.
            (6_000, "b", 2, b("b")),
            (6_000, "c", 1, b("c")),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_allowance_layer_is_the_hand_built_composition_with_a_streamed_body() {
    let mut runs = Vec::new();
    for by_hand in [false, true] {
        let allowance = allowance(10);
        let run = scenario(&allowance, streamed, |up| {
            if by_hand {
                let policy = RetryPolicy::new(allowance.clone())
                    .with_config(retry_config())
                    .over_admission();
                let stack = Cooldown::new(
                    Admission::new(up, allowance.clone()),
                    allowance.clone(),
                    tower_allowance::classify::StatusClassifier::default(),
                );
                Svc::new(Prepare::new(Retry::new(policy.clone(), stack), &policy))
            } else {
                Svc::new(allowance.layer().with_retry(retry_config()).layer(up))
            }
        })
        .await;
        // The streamed bodies were sent again whole: Prepare kept their copies.
        full_stack_run(run.seen.clone());
        assert_eq!(run.results, vec![(OK, Outcome::Completed); 3], "{by_hand}");
        assert_eq!(run.retries_spent, 2, "{by_hand}");
        runs.push(run);
    }
    assert_eq!(runs[0], runs[1], "same attempts, same times, same outcomes");
}

#[tokio::test(start_paused = true)]
async fn without_prepare_a_streamed_body_is_sent_once() {
    // What Prepare is for: tower's Retry keeps its copy before the first attempt, and a
    // stream has none unless prepared.
    let allowance = allowance(10);
    let policy = RetryPolicy::new(allowance.clone()).with_config(retry_config());
    let start = Instant::now();
    let upstream = Upstream::new(start);
    let service = Retry::new(policy, upstream.service::<BoxBody<Bytes, BoxError>>());
    let result = service.oneshot(put("a", Some("1"), streamed("a"))).await;
    assert_eq!(result.as_ref().ok().map(Response::status), THROTTLED);
    assert_eq!(upstream.seen(), vec![(0, "a", 1, b("a"))]);
    assert_eq!(allowance.snapshot().retries_spent, 0);
}

#[test]
fn the_layer_builds_exactly_the_composition() {
    fn same<T>(_: &T, _: &T) {}
    let allowance = allowance(1);
    let inner = service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let policy = RetryPolicy::new(allowance.clone());
    let by_hand: Prepare<Retry<RetryPolicy, Cooldown<Admission<_>, _>>> = Prepare::new(
        Retry::new(
            policy.clone(),
            Cooldown::new(
                Admission::new(inner, allowance.clone()),
                allowance.clone(),
                tower_allowance::classify::StatusClassifier::default(),
            ),
        ),
        &policy,
    );
    let layered = allowance.layer().layer(inner);
    same(&by_hand, &layered);
    // The innermost service is reachable through the parts' accessors.
    let _: &Admission<_> = layered.get_ref().get_ref().get_ref();
    fn replayable<B: Replayable>() {}
    replayable::<String>();
}
