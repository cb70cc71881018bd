//! `inbound::Unavailable` (feature `axum`): an abandonment answered `503` with the
//! allowance's `Retry-After`, in virtual time.

use std::{convert::Infallible, time::Duration};

use axum_core::response::IntoResponse;
use http::{Request, Response, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_allowance::{
    error::{AbandonReason, Abandoned},
    inbound::Unavailable,
    retry::RetryConfig,
    Allowance, AllowanceConfig, BoxError, Deadline,
};

fn throttled(retry_after: &'static str) -> Response<String> {
    let mut res = Response::new(String::new());
    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    res.headers_mut()
        .insert("retry-after", retry_after.parse().expect("ascii"));
    res
}

// The retry layer's abandoned throttling response (`Outcome::of` says `Abandoned`): the 503
// says the upstream's wait, not the allowance's interval.
#[tokio::test(start_paused = true)]
async fn an_abandoned_throttling_response_is_a_503_with_the_servers_wait() {
    let allowance = Allowance::new(AllowanceConfig::per_second(4, 4).expect("valid"));
    let stack = ServiceBuilder::new()
        .layer(allowance.layer().with_retry(RetryConfig::default()))
        .service_fn(|_r: Request<String>| async { Ok::<_, Infallible>(throttled("7")) });
    let mut request = Request::new(String::new());
    request
        .extensions_mut()
        .insert(Deadline::after(Duration::from_secs(2)));
    let result = stack.oneshot(request).await;
    tokio::time::advance(Duration::from_millis(1_500)).await;
    let unavailable = Unavailable::of(&result, &allowance).expect("abandoned");
    assert_eq!(unavailable.reason(), AbandonReason::Deadline);
    assert_eq!(unavailable.retry_after(), Duration::from_millis(5_500));
    let response = unavailable.into_response();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "6");
    assert_eq!(response.headers()["x-allowance-abandoned"], "deadline");
}

// Nothing known of when to come back (a budget spent): what the allowance knows now, the
// shared cooldown still to run.
#[tokio::test(start_paused = true)]
async fn without_the_abandonments_own_figure_the_shared_cooldown_answers() {
    let allowance = Allowance::new(AllowanceConfig::per_second(4, 4).expect("valid"));
    allowance
        .extend_cooldown(Duration::from_secs(30))
        .await
        .expect("recorded");
    let e: BoxError = Abandoned::new(AbandonReason::BudgetExhausted).into();
    let unavailable = Unavailable::of_error(&*e, &allowance).expect("abandoned");
    assert_eq!(unavailable.retry_after(), Duration::from_secs(30));
    assert_eq!(unavailable.retry_after_secs(), 30);
    // Another error, or a response to pass on, is not an abandonment.
    let other: BoxError = "connection reset".into();
    assert!(Unavailable::of_error(&*other, &allowance).is_none());
    let ok: Result<Response<()>, BoxError> = Ok(Response::new(()));
    assert!(Unavailable::of(&ok, &allowance).is_none());
}
