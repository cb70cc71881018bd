//! Admission under concurrency: FIFO, wakeups, cancellation, deadlines, queue bound,
//! readiness probing. Virtual time unless stated.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_allowance::{
    admission::AdmissionLayer,
    error::{AbandonReason, Abandoned, Overloaded},
    AcquireOptions, Allowance, AllowanceConfig, Deadline, RetryBudgetConfig,
};
use tower_test::mock;

// The admission layer's mechanics (order, slots, cancellation) on the limit as configured:
// `exact`, without the headroom kept by default (tested in the conformance suite).
fn allowance(per_sec: u32, burst: u32) -> Allowance {
    Allowance::new(
        AllowanceConfig::per_second(per_sec, burst)
            .expect("valid")
            .exact(),
    )
}

fn ms_since(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

/// Counts how often the wrapped future is polled.
struct Counted<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn fifo_and_one_wakeup_per_admission_with_1000_waiters() {
    const N: usize = 1000;
    // 100/s, burst 1: one token at a time, the rest queue.
    let allowance = Allowance::new(
        AllowanceConfig::per_second(100, 1)
            .expect("valid")
            .exact()
            .with_max_waiters(N),
    );
    let polls = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(Mutex::new(Vec::with_capacity(N)));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..N {
        let fut = Counted {
            inner: Box::pin(allowance.acquire_owned(AcquireOptions::new())),
            polls: polls.clone(),
        };
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            fut.await.expect("admitted");
            order.lock().expect("lock").push(i);
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let order = order.lock().expect("lock").clone();
    assert_eq!(
        order,
        (0..N).collect::<Vec<_>>(),
        "admitted in arrival order"
    );
    // Every future is polled once to start; every later poll is a wakeup.
    let wakeups = polls.load(Ordering::Relaxed) - N;
    let admissions = N - 1; // the first one never waited
    eprintln!("{N} waiters: {wakeups} wakeups for {admissions} queued admissions");
    assert!(
        wakeups <= admissions + 4,
        "{wakeups} wakeups for {admissions} admissions: a herd"
    );
    // 999 tokens at 10 ms each.
    assert_eq!(ms_since(start), 9_990);
    let snap = allowance.snapshot();
    assert_eq!(snap.admitted, N as u64);
    assert_eq!(snap.waited, (N - 1) as u64);
}

#[tokio::test(start_paused = true)]
async fn restart_after_cooldown_is_metered() {
    let allowance = allowance(2, 2);
    allowance
        .extend_cooldown(Duration::from_secs(2))
        .await
        .expect("defer");
    let start = Instant::now();
    let times = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (a, times) = (allowance.clone(), times.clone());
        tasks.push(tokio::spawn(async move {
            a.acquire().await.expect("admitted");
            times.lock().expect("lock").push(ms_since(start));
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let times = times.lock().expect("lock").clone();
    assert_eq!(times, [2000, 2000, 2500, 3000, 3500, 4000, 4500, 5000]);
}

/// A waiter cancelled in the middle of the schedule hands its slot down: the waiter behind
/// it moves up, the tail goes back to the schedule; never a stall, never an extra admission.
#[tokio::test(start_paused = true)]
async fn cancelled_waiter_in_the_middle_hands_its_slot_down() {
    let allowance = allowance(2, 1); // one token per 500 ms
    allowance.acquire().await.expect("first"); // spend the burst
    let start = Instant::now();
    let first = tokio::spawn({
        let a = allowance.clone();
        async move {
            a.acquire().await.expect("a");
            ms_since(start)
        }
    });
    let cancelled = tokio::spawn({
        let a = allowance.clone();
        async move { a.acquire().await }
    });
    let third = tokio::spawn({
        let a = allowance.clone();
        async move {
            a.acquire().await.expect("c");
            ms_since(start)
        }
    });
    tokio::task::yield_now().await;
    assert_eq!(allowance.snapshot().waiting, 3);
    cancelled.abort();
    assert!(cancelled.await.expect_err("aborted").is_cancelled());
    assert_eq!(allowance.snapshot().waiting, 2);
    // The third takes the cancelled slot (1000 ms); its own (1500 ms) goes to the next caller.
    assert_eq!(first.await.expect("a"), 500);
    assert_eq!(third.await.expect("c"), 1000);
    allowance.acquire().await.expect("next");
    assert_eq!(ms_since(start), 1500);
    assert_eq!(allowance.snapshot().admitted, 4);
}

/// A waiter dropped exactly at its admission instant (a `select!` whose other branch fires at
/// that same instant, as a timeout does) hands its slot down: the next waiter goes then, not
/// one interval later (issue 28, bug 4).
#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_at_its_slot_hands_it_to_the_next() {
    let allowance = allowance(1, 1); // one token per second
    allowance.acquire().await.expect("first"); // spend the burst
    let start = Instant::now();
    let slot = start + Duration::from_secs(1);
    let dropped = async {
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(slot) => "dropped at its slot",
            _ = allowance.acquire() => "admitted",
        }
    };
    let next = async {
        allowance.acquire().await.expect("next");
        ms_since(start)
    };
    // `join!` polls `dropped` first: it reserves 1 s, `next` 2 s.
    let (dropped, next) = tokio::join!(dropped, next);
    assert_eq!(dropped, "dropped at its slot");
    assert_eq!(next, 1_000, "the next waiter takes the dropped slot");
    // Its own slot went back to the store: the one after it is at 2 s, no later.
    allowance.acquire().await.expect("after");
    assert_eq!(ms_since(start), 2_000);
    assert_eq!(allowance.snapshot().admitted, 3);
}

/// The latest waiter, cancelled, gives its slot back: the next caller gets it.
#[tokio::test(start_paused = true)]
async fn cancelled_last_waiter_gives_its_slot_back() {
    let allowance = allowance(2, 1);
    allowance.acquire().await.expect("burst");
    let start = Instant::now();
    let first = tokio::spawn(allowance.acquire_owned(AcquireOptions::new()));
    let last = tokio::spawn(allowance.acquire_owned(AcquireOptions::new()));
    tokio::task::yield_now().await;
    last.abort();
    assert!(last.await.expect_err("aborted").is_cancelled());
    allowance.acquire().await.expect("next");
    assert_eq!(
        ms_since(start),
        1000,
        "the released slot, not the one after it"
    );
    first.await.expect("task").expect("first");
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_head_does_not_stall_the_queue() {
    let allowance = allowance(1, 1);
    allowance.acquire().await.expect("burst");
    let start = Instant::now();
    let head = tokio::spawn({
        let a = allowance.clone();
        async move { a.acquire().await }
    });
    let next = tokio::spawn({
        let a = allowance.clone();
        async move {
            a.acquire().await.expect("next");
            ms_since(start)
        }
    });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(300)).await;
    head.abort();
    let _ = head.await;
    assert_eq!(
        next.await.expect("next"),
        1000,
        "the next waiter takes the head's slot"
    );
}

#[tokio::test(start_paused = true)]
async fn full_queue_fails_at_once_with_overloaded() {
    let allowance = Allowance::new(
        AllowanceConfig::per_second(1, 1)
            .expect("valid")
            .with_max_waiters(2),
    );
    allowance.acquire().await.expect("burst");
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let a = allowance.clone();
            tokio::spawn(async move { a.acquire().await })
        })
        .collect();
    tokio::task::yield_now().await;
    let start = Instant::now();
    let err = allowance.acquire().await.expect_err("queue is full");
    assert_eq!(ms_since(start), 0, "fails at once");
    assert!(matches!(
        err,
        tower_allowance::error::AcquireError::Overloaded(_)
    ));
    assert!(err.into_box().is::<Overloaded>());
    for w in waiters {
        w.await
            .expect("task")
            .expect("queued waiters are still admitted");
    }
    assert_eq!(
        allowance
            .snapshot()
            .abandoned
            .get(AbandonReason::Overloaded),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn deadline_before_cooldown_end_fails_at_once() {
    let allowance = allowance(2, 2);
    allowance
        .extend_cooldown(Duration::from_secs(30))
        .await
        .expect("defer");
    let start = Instant::now();
    let deadline = start + Duration::from_secs(10);
    let err = allowance
        .acquire_with(AcquireOptions::new().deadline(deadline))
        .await
        .expect_err("cannot make it");
    assert_eq!(err.abandon_reason(), Some(AbandonReason::Deadline));
    assert_eq!(ms_since(start), 0, "no waiting before failing");
}

#[tokio::test(start_paused = true)]
async fn deadline_before_next_token_fails_at_once() {
    let allowance = allowance(1, 1);
    allowance.acquire().await.expect("burst");
    let start = Instant::now();
    let err = allowance
        .acquire_with(AcquireOptions::new().deadline(start + Duration::from_millis(999)))
        .await
        .expect_err("next token at 1000 ms");
    assert_eq!(err.abandon_reason(), Some(AbandonReason::Deadline));
    assert_eq!(ms_since(start), 0);
    // Just enough time: admitted exactly when the token comes.
    allowance
        .acquire_with(AcquireOptions::new().deadline(start + Duration::from_millis(1000)))
        .await
        .expect("made it");
    assert_eq!(ms_since(start), 1000);
}

#[tokio::test(start_paused = true)]
async fn later_cooldown_fails_doomed_waiters_promptly() {
    let allowance = allowance(1, 1);
    allowance.acquire().await.expect("burst");
    let start = Instant::now();
    // Head (no deadline) and two queued waiters with deadlines at 5 s and 60 s.
    let spawn = |deadline: Option<u64>| {
        let a = allowance.clone();
        tokio::spawn(async move {
            let mut o = AcquireOptions::new();
            if let Some(s) = deadline {
                o = o.deadline(start + Duration::from_secs(s));
            }
            let r = a.acquire_with(o).await;
            (r.map_err(|e| e.abandon_reason()), ms_since(start))
        })
    };
    let head = spawn(None);
    let doomed = spawn(Some(5));
    let patient = spawn(Some(60));
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(200)).await;
    // A 429 elsewhere: cooldown for 30 s.
    allowance
        .extend_cooldown(Duration::from_secs(30))
        .await
        .expect("defer");
    let (r, at) = doomed.await.expect("task");
    assert_eq!(r, Err(Some(AbandonReason::Deadline)));
    assert_eq!(
        at, 200,
        "failed when the cooldown arrived, not at its deadline"
    );
    // Pending slots (1 s, 2 s, 3 s) move back by the cooldown that was added (30 s from
    // 200 ms): order and spacing kept; the doomed waiter's slot goes to the patient one.
    assert_eq!(head.await.expect("task"), (Ok(()), 31_000));
    assert_eq!(patient.await.expect("task"), (Ok(()), 32_000));
}

#[tokio::test(start_paused = true)]
async fn readiness_probing_spends_no_tokens() {
    let allowance = allowance(1, 1);
    let (service, mut handle) = mock::pair::<Request<()>, Response<()>>();
    let mut service = ServiceBuilder::new()
        .layer(AdmissionLayer::new(allowance.clone()))
        .service(service);
    // A balancer probes readiness many times without calling.
    for _ in 0..10 {
        handle.allow(1);
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .expect("ready");
    }
    assert_eq!(allowance.snapshot().admitted, 0);
    // The one token is still there: this call goes straight through.
    let start = Instant::now();
    let fut = tokio::spawn(service.call(Request::new(())));
    let (_req, send) = handle
        .next_request()
        .await
        .expect("request reached the inner service");
    send.send_response(Response::new(()));
    fut.await.expect("task").expect("response");
    assert_eq!(ms_since(start), 0);
    assert_eq!(allowance.snapshot().admitted, 1);
}

/// A call's future asks for admission when first polled: one dropped unpolled (a caller
/// that gave up before awaiting, a `select!` that picked another branch) takes no token and
/// reserves no slot, and the inner service never sees its request.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_unpolled_takes_no_token() {
    let allowance = allowance(1, 2);
    let (service, mut handle) = mock::pair::<Request<()>, Response<()>>();
    let mut service = ServiceBuilder::new()
        .layer(AdmissionLayer::new(allowance.clone()))
        .service(service);
    handle.allow(10);
    for _ in 0..5 {
        service.ready().await.expect("ready");
        drop(service.call(Request::new(())));
    }
    assert_eq!(allowance.snapshot().admitted, 0);
    // The whole burst is still there: two calls go at once, the third a second later.
    let start = Instant::now();
    let calls: Vec<_> = (0..3)
        .map(|_| tokio::spawn(service.call(Request::new(()))))
        .collect();
    for _ in 0..3 {
        let (_r, send) = handle.next_request().await.expect("request");
        assert!(ms_since(start) <= 1000);
        send.send_response(Response::new(()));
    }
    let mut at = vec![];
    for c in calls {
        c.await.expect("task").expect("response");
        at.push(ms_since(start));
    }
    assert_eq!(at.iter().max(), Some(&1000));
    assert_eq!(allowance.snapshot().admitted, 3);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_call_readies_the_inner_service_once_admitted() {
    // The layer is ready at once; the first call readies the mock and sends, the second
    // readies a clone of it at its slot (each readiness takes one of the two allowed).
    let allowance = allowance(1, 1);
    let (service, mut handle) = mock::pair::<Request<()>, Response<()>>();
    let mut service = ServiceBuilder::new()
        .layer(AdmissionLayer::new(allowance.clone()))
        .service(service);
    handle.allow(2);
    let start = Instant::now();
    service.ready().await.expect("ready");
    let first = service.call(Request::new(()));
    service.ready().await.expect("ready");
    let second = service.call(Request::new(()));
    let responder = tokio::spawn(async move {
        for _ in 0..2 {
            let (_r, send) = handle.next_request().await.expect("request");
            send.send_response(Response::new(()));
        }
    });
    first.await.expect("first");
    second
        .await
        .expect("second waits for its token, then is sent");
    responder.await.expect("responder");
    assert_eq!(ms_since(start), 1000);
}

#[tokio::test(start_paused = true)]
async fn request_deadline_extension_is_honoured_by_the_layer() {
    let allowance = allowance(1, 1);
    allowance
        .extend_cooldown(Duration::from_secs(30))
        .await
        .expect("defer");
    let svc = ServiceBuilder::new()
        .layer(AdmissionLayer::new(allowance.clone()))
        .service_fn(|_r: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(()))
        });
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(10)));
    let err = svc.oneshot(req).await.expect_err("deadline");
    let abandoned = err.downcast_ref::<Abandoned>().expect("typed");
    assert_eq!(abandoned.reason(), AbandonReason::Deadline);
}

/// Real threads: many concurrent spenders never overdraw a fixed budget.
#[test]
fn fixed_budget_is_never_overdrawn_by_many_threads() {
    const BUDGET: u64 = 1_000;
    let allowance = Allowance::new(
        AllowanceConfig::per_second(1_000_000, 1_000_000)
            .expect("valid")
            .with_retry_budget(RetryBudgetConfig::fixed(BUDGET)),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .expect("runtime");
    let admitted = Arc::new(AtomicUsize::new(0));
    let exhausted = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (a, admitted, exhausted) = (allowance.clone(), admitted.clone(), exhausted.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..500 {
                    match a.acquire_with(AcquireOptions::new().retry(true)).await {
                        Ok(()) => admitted.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            assert_eq!(e.abandon_reason(), Some(AbandonReason::BudgetExhausted));
                            exhausted.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
    });
    assert_eq!(admitted.load(Ordering::Relaxed) as u64, BUDGET);
    assert_eq!(exhausted.load(Ordering::Relaxed) as u64, 4_000 - BUDGET);
    assert_eq!(allowance.snapshot().retries_spent, BUDGET);
}

/// OS threads spending a replenishing budget never exceed floor + ratio * deposits.
#[test]
fn replenishing_budget_is_never_overdrawn_by_many_threads() {
    let budget =
        tower_allowance::ReplenishingBudget::new(Duration::from_secs(10), 10, 0.0).expect("valid");
    let allowance = Allowance::new(
        AllowanceConfig::per_second(1_000_000, 1_000_000)
            .expect("valid")
            .with_retry_budget(RetryBudgetConfig::Replenishing(budget)),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .expect("runtime");
    let admitted = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (a, admitted) = (allowance.clone(), admitted.clone());
                tokio::spawn(async move {
                    for _ in 0..100 {
                        if a.acquire_with(AcquireOptions::new().retry(true))
                            .await
                            .is_ok()
                        {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
    });
    // Floor: 10 per second over a 10 s window = 100 retries, and no successes deposited.
    assert_eq!(admitted.load(Ordering::Relaxed), 100);
}

#[tokio::test(start_paused = true)]
async fn deadline_before_the_heads_next_token_fails_at_once_behind_a_queue() {
    let allowance = allowance(1, 1);
    allowance.acquire().await.expect("burst");
    let start = Instant::now();
    let head = tokio::spawn({
        let a = allowance.clone();
        async move {
            a.acquire().await.expect("head");
            ms_since(start)
        }
    });
    tokio::task::yield_now().await;
    // The head waits for the token at 1000 ms: nobody can be admitted before then.
    let err = allowance
        .acquire_with(AcquireOptions::new().deadline(start + Duration::from_millis(500)))
        .await
        .expect_err("cannot make it");
    assert_eq!(err.abandon_reason(), Some(AbandonReason::Deadline));
    assert_eq!(ms_since(start), 0, "failed at once");
    assert_eq!(head.await.expect("head"), 1000);
}
