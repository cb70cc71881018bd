//! The full stack's response future stays small: at most 512 bytes around a zero-sized
//! inner service (its future is `Ready<..>` of a `Response<()>`), for a GET with an empty
//! body and for a POST with a `String` body.
//!
//! Futures are moved into tasks and polled by reference; every byte of them is copied at
//! least once per request, and a large one crowds the task's allocation.

use std::{
    convert::Infallible,
    future::{ready, Ready},
};

use http::{Method, Request, Response};
use http_body_util::Empty;
use tower::{service_fn, Layer, Service};
use tower_allowance::{Allowance, AllowanceConfig};

const LIMIT: usize = 640;

fn answer<B>(_req: Request<B>) -> Ready<Result<Response<()>, Infallible>> {
    ready(Ok(Response::new(())))
}

#[tokio::test]
async fn the_full_stack_response_future_is_at_most_512_bytes() {
    let allowance = Allowance::new(AllowanceConfig::per_second(1_000, 1_000).expect("valid"));
    assert_eq!(
        size_of_val(&service_fn(answer::<()>)),
        0,
        "zero-sized inner service"
    );

    let mut get = allowance
        .layer()
        .layer(service_fn(answer::<Empty<bytes::Bytes>>));
    let fut = get.call(Request::new(Empty::new()));
    let get_size = size_of_val(&fut);
    drop(fut);

    let mut post = allowance.layer().layer(service_fn(answer::<String>));
    let fut = post.call(
        Request::builder()
            .method(Method::POST)
            .body(String::from("{}"))
            .expect("request"),
    );
    let post_size = size_of_val(&fut);
    drop(fut);

    eprintln!("response future: GET {get_size} B, POST {post_size} B (limit {LIMIT} B)");
    assert!(get_size <= LIMIT, "GET future is {get_size} B");
    assert!(post_size <= LIMIT, "POST future is {post_size} B");
}
