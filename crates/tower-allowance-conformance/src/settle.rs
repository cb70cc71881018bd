//! Reserve, then settle (feature `settle`): a settlement gives the unused part back through
//! the store, moves the callers waiting on reserved slots earlier, and a 429 gives the whole
//! reservation back; a classed settlement moves its class's virtual finish time (feature
//! `shares`) in the same store call.

use std::{convert::Infallible, time::Duration};

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{service_fn, ServiceExt};
use tower_allowance::{
    cost::settle::{OpenAiUsage, SettleLayer, Settlement},
    retry::RetryConfig,
    rule::{settle::Settle, Admission, AdmitRequest, Op, Reply, ShareRequest, SHARE_SCALE},
    store::Store,
    AcquireOptions, AllowanceConfig, Cost, Limit,
};

use crate::harness::{acquire_at, allowance, per_second, LayerService, MS};

/// 10 requests/s and 1,000 tokens/s with bursts of 1,000, exact, settling as told.
fn tokens(settlement: Settlement) -> AllowanceConfig {
    let limit = match Limit::per_second(1_000, 1_000) {
        Ok(l) => l.exact().counting_cost(),
        Err(e) => panic!("valid limit: {e}"),
    };
    let once = match RetryConfig::default().with_max_attempts(1) {
        Ok(r) => r,
        Err(e) => panic!("valid retry: {e}"),
    };
    match per_second(10, 10).with_limit(limit) {
        Ok(c) => c.with_settlement(settlement).with_retry(once),
        Err(e) => panic!("valid config: {e}"),
    }
}

/// 900 reserved and 100 used: 800 come back, and the caller waiting 800 ms for its 900 goes
/// at once (the settlement's event moves it; delivered as another process's would be).
pub(crate) async fn a_settlement_moves_waiting_callers_earlier<S: Store>(store: S) {
    let (a, direct) = allowance(tokens(Settlement::all()), store);
    assert_eq!(
        direct.admit(AdmitRequest::first().cost(900)).await,
        Admission::Admitted
    );
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { acquire_at(&a, AcquireOptions::new().cost(900)).await }
    });
    tokio::time::advance(10 * MS).await;
    let Ok(Reply::Settled(settled)) = direct.apply(Op::Settle(Settle::used(900, 100))).await else {
        panic!("a settlement's reply");
    };
    assert_eq!(settled.moved, 800, "the unused part came back");
    direct.deliver(settled.event.expect("a holder to move"));
    let waited = waiter.await.expect("joined").expect("admitted");
    assert!(waited <= 12 * MS, "moved up to now: waited {waited:?}");
}

/// Through the layers: a 429 gives the whole reservation back (the next 1,000 go at once), an
/// answer's usage gives the unused part back (the next wait is for the 900 used alone).
pub(crate) async fn the_layer_settles_429s_and_usage<S: Store>(store: S) {
    let (a, _direct) = allowance(tokens(Settlement::all()), store);
    let answers = service_fn(|req: Request<String>| async move {
        let mut res = Response::new(String::new());
        if req.uri().path() == "/throttled" {
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        } else {
            *res.body_mut() = r#"{"usage":{"total_tokens":900}}"#.to_owned();
        }
        Ok::<_, Infallible>(res)
    });
    let svc = SettleLayer::new(&a, OpenAiUsage::new()).layer_service(answers);
    let svc = a.layer().layer_service(svc);
    let send = |path: &'static str| {
        let svc = svc.clone();
        async move {
            let mut req = Request::builder()
                .uri(path)
                .body(String::new())
                .expect("request");
            req.extensions_mut().insert(Cost(1_000));
            let start = tokio::time::Instant::now();
            let res = svc.oneshot(req).await.expect("answered");
            let status = res.status();
            res.into_body().collect().await.expect("the body, whole");
            (status, start.elapsed())
        }
    };
    // The 429 is not retried here (one attempt): its 1,000 come back.
    let (status, waited) = send("/throttled").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(waited, Duration::ZERO);
    let (status, waited) = send("/ok").await;
    assert_eq!(
        (status, waited),
        (StatusCode::OK, Duration::ZERO),
        "the burst is back"
    );
    // 900 used: 100 came back, so the next 1,000 wait 900 ms, not a second.
    let (status, waited) = send("/ok").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(waited, 900 * MS);
}

/// A class's 900 reserved and 100 used: the 800 given back move its virtual finish time back
/// by 800 units at its weight (2), in the store, as the next class admission's reply shows.
pub(crate) async fn a_settlement_moves_its_class_share<S: Store>(store: S) {
    let (_a, direct) = allowance(tokens(Settlement::all()), store);
    let share = |cost| Op::Share(ShareRequest::new(AdmitRequest::first().cost(cost), 1, 2));
    let Ok(Reply::Share(first)) = direct.apply(share(900)).await else {
        panic!("a share's reply");
    };
    assert_eq!(first.admission, Admission::Admitted);
    assert_eq!(first.classes.finish(1), 450 * SHARE_SCALE);
    let settle = Settle::used(900, 100).class(1, 2);
    let Ok(Reply::Settled(settled)) = direct.apply(Op::Settle(settle)).await else {
        panic!("a settlement's reply");
    };
    assert_eq!(settled.moved, 800);
    // The class starts its next admission where its first finishes at what it used: 50.
    let Ok(Reply::Share(next)) = direct.apply(share(100)).await else {
        panic!("a share's reply");
    };
    assert_eq!(next.classes.finish(1), 100 * SHARE_SCALE);
}
