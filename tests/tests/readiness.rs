//! Readiness: the stack readies the inner service only once a request is admitted, so no
//! permit, buffer slot or connection of the inner service is held through an admission wait
//! or a cooldown. Virtual time: every instant below is exact.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{Request, Response};
use tokio::time::Instant;
use tower::{buffer::Buffer, service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_allowance::{
    error::AbandonReason,
    keyed::{key, Keyed, KeyedConfig, KeyedLayer},
    Allowance, AllowanceConfig, Deadline, Outcome,
};

const COOLDOWN: Duration = Duration::from_secs(5);

fn allowance(name: &str) -> Allowance {
    Allowance::builder(AllowanceConfig::per_second(10, 10).expect("valid"))
        .name(name)
        .build()
}

fn ms_since(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

/// Answers at once (after `delay` for a request marked `slow`), and logs who was served when.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(String, u64)>>>);

impl Log {
    fn service(
        &self,
        start: Instant,
    ) -> impl Service<
        Request<String>,
        Response = Response<()>,
        Error = Infallible,
        Future = impl std::future::Future<Output = Result<Response<()>, Infallible>> + Send,
    > + Clone
           + Send
           + Clone {
        let log = self.clone();
        service_fn(move |req: Request<String>| {
            let log = log.clone();
            async move {
                if let Some(hold) = req.extensions().get::<Hold>() {
                    tokio::time::sleep(hold.0).await;
                }
                log.0
                    .lock()
                    .expect("log")
                    .push((req.into_body(), ms_since(start)));
                Ok::<_, Infallible>(Response::new(()))
            }
        })
    }

    fn served(&self) -> Vec<(String, u64)> {
        self.0.lock().expect("log").clone()
    }
}

/// The inner service takes this long to answer the request (a permit held meanwhile).
#[derive(Clone, Copy)]
struct Hold(Duration);

fn request(body: &str) -> Request<String> {
    Request::new(body.to_owned())
}

/// Sends `req` through `service` in a task; returns its outcome and when it ended.
fn spawn<S>(
    service: S,
    req: Request<String>,
    start: Instant,
) -> tokio::task::JoinHandle<(Outcome, u64)>
where
    S: Service<Request<String>, Response = Response<()>, Error = BoxError> + Send + 'static,
    S::Future: Send,
{
    tokio::spawn(async move {
        let result = service.oneshot(req).await;
        (Outcome::of(&result), ms_since(start))
    })
}

/// Lets the spawned tasks run up to their first wait (no virtual time passes).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_concurrency_limit_shared_by_two_allowances_is_not_held_through_a_cooldown() {
    let start = Instant::now();
    let log = Log::default();
    // One permit, shared by every clone of this `ConcurrencyLimit`.
    let limit = ServiceBuilder::new()
        .concurrency_limit(1)
        .service(log.service(start));
    let (a, b) = (allowance("a"), allowance("b"));
    a.extend_cooldown(COOLDOWN).await.expect("cooldown");
    let stack_a = a.layer().layer(limit.clone());
    let mut stack_b = b.layer().layer(limit);

    let waiting = spawn(stack_a, request("a"), start);
    settle().await;
    assert_eq!(a.snapshot().waiting, 1, "a waits out its cooldown");
    // `b`'s stack is ready at once, and so is the permit `a` does not hold.
    stack_b.ready().await.expect("ready");
    assert_eq!(ms_since(start), 0);
    let b_done = stack_b.call(request("b")).await;
    assert_eq!(
        (Outcome::of(&b_done), ms_since(start)),
        (Outcome::Completed, 0)
    );

    assert_eq!(waiting.await.expect("task"), (Outcome::Completed, 5_000));
    assert_eq!(log.served(), [("b".into(), 0), ("a".into(), 5_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_key_cooling_down_does_not_starve_another_key() {
    let start = Instant::now();
    let log = Log::default();
    let limit = ServiceBuilder::new()
        .concurrency_limit(1)
        .service(log.service(start));
    let keyed = Keyed::new(KeyedConfig::new(
        AllowanceConfig::per_second(10, 10).expect("valid"),
    ));
    let client = KeyedLayer::new(keyed.clone(), key::api_key()).layer(limit);
    let keyed_request = |tenant: &str| {
        Request::builder()
            .header("x-api-key", tenant)
            .body(tenant.to_owned())
            .expect("request")
    };
    let key_a = keyed.get("key-a").expect("key a");
    key_a
        .allowance()
        .extend_cooldown(COOLDOWN)
        .await
        .expect("cooldown");

    let waiting = spawn(client.clone(), keyed_request("key-a"), start);
    settle().await;
    assert_eq!(
        key_a.allowance().snapshot().waiting,
        1,
        "key a waits out its cooldown"
    );
    let b = spawn(client, keyed_request("key-b"), start);
    assert_eq!(b.await.expect("task"), (Outcome::Completed, 0));

    assert_eq!(waiting.await.expect("task"), (Outcome::Completed, 5_000));
    assert_eq!(log.served(), [("key-b".into(), 0), ("key-a".into(), 5_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_buffer_slot_is_not_held_through_a_cooldown() {
    let start = Instant::now();
    let log = Log::default();
    // One slot in the buffer's queue, shared by every clone of the `Buffer`.
    let buffer = Buffer::new(log.service(start), 1);
    let (a, b) = (allowance("a"), allowance("b"));
    a.extend_cooldown(COOLDOWN).await.expect("cooldown");
    let stack_a = a.layer().layer(buffer.clone());
    let stack_b = b.layer().layer(buffer);

    let waiting = spawn(stack_a, request("a"), start);
    settle().await;
    assert_eq!(a.snapshot().waiting, 1, "a waits out its cooldown");
    let b = spawn(stack_b, request("b"), start);
    assert_eq!(b.await.expect("task"), (Outcome::Completed, 0));

    assert_eq!(waiting.await.expect("task"), (Outcome::Completed, 5_000));
    assert_eq!(log.served(), [("b".into(), 0), ("a".into(), 5_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_behind_a_cooldown_is_abandoned_at_once() {
    let start = Instant::now();
    let log = Log::default();
    let limit = ServiceBuilder::new()
        .concurrency_limit(1)
        .service(log.service(start));
    let a = allowance("a");
    a.extend_cooldown(COOLDOWN).await.expect("cooldown");
    let stack = a.layer().layer(limit);

    let patient = spawn(stack.clone(), request("patient"), start);
    settle().await;
    // Its admission certainly comes after its deadline (the cooldown ends at 5 s).
    let mut hurried = request("hurried");
    hurried
        .extensions_mut()
        .insert(Deadline::after(Duration::from_secs(1)));
    let hurried = spawn(stack, hurried, start);
    assert_eq!(
        hurried.await.expect("task"),
        (Outcome::Abandoned(AbandonReason::Deadline), 0)
    );

    assert_eq!(patient.await.expect("task"), (Outcome::Completed, 5_000));
    assert_eq!(log.served(), [("patient".into(), 5_000)]);
    assert_eq!(a.snapshot().abandoned.get(AbandonReason::Deadline), 1);
}

#[tokio::test(start_paused = true)]
async fn an_admitted_request_waits_for_the_inner_service_by_its_deadline() {
    let start = Instant::now();
    let log = Log::default();
    let limit = ServiceBuilder::new()
        .concurrency_limit(1)
        .service(log.service(start));
    let (a, b) = (allowance("a"), allowance("b"));
    let stack_a = a.layer().layer(limit.clone());
    let stack_b = b.layer().layer(limit);

    // `a`'s request holds the one permit for 3 s, in the inner service.
    let mut slow = request("slow");
    slow.extensions_mut().insert(Hold(Duration::from_secs(3)));
    let slow = spawn(stack_a, slow, start);
    settle().await;
    // Admitted at once by `b`, but the inner service is busy: one gives up at its deadline,
    // the other is sent when the permit comes back.
    let mut hurried = request("hurried");
    hurried
        .extensions_mut()
        .insert(Deadline::after(Duration::from_secs(1)));
    let hurried = spawn(stack_b.clone(), hurried, start);
    let patient = spawn(stack_b, request("patient"), start);

    assert_eq!(
        hurried.await.expect("task"),
        (Outcome::Abandoned(AbandonReason::Deadline), 1_000)
    );
    assert_eq!(slow.await.expect("task"), (Outcome::Completed, 3_000));
    assert_eq!(patient.await.expect("task"), (Outcome::Completed, 3_000));
    assert_eq!(
        log.served(),
        [("slow".into(), 3_000), ("patient".into(), 3_000)]
    );
}

/// tower's `LoadShed` refuses a call whose service is not ready with its own `Overloaded`:
/// nothing was sent, so `Outcome` says abandoned (`overloaded`), not failed, alone and under
/// the allowance's stack (which does not retry it: the stack's own kind of refusal), as it
/// says of the allowance's own full queue (issue 28, bug 3).
#[tokio::test(start_paused = true)]
async fn a_load_shed_refusal_is_abandoned_overloaded() {
    // An inner service that is never ready.
    let (never, mut handle) = tower_test::mock::pair::<Request<String>, Response<String>>();
    handle.allow(0);
    let shed = ServiceBuilder::new().load_shed().service(never);
    let result = shed.clone().oneshot(Request::new(String::new())).await;
    assert!(result.is_err());
    let overloaded = Outcome::Abandoned(AbandonReason::Overloaded);
    assert_eq!(Outcome::of(&result), overloaded);

    let allowance = allowance("shed");
    let stack = allowance.layer().layer(shed);
    let result = stack.oneshot(Request::new(String::new())).await;
    assert_eq!(Outcome::of(&result), overloaded);
    assert_eq!(allowance.snapshot().admitted, 1, "one attempt, not retried");
}
