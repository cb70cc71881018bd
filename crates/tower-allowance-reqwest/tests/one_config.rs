//! One configuration: the middleware and the tower layer on one allowance read a 403 with
//! rate-limit headers the same way, by the allowance's classifier, and an override stays with
//! the middleware that sets it.

use std::{
    io::{Read, Write},
    net::TcpListener,
};

use http::{HeaderValue, Request, Response, StatusCode};
use reqwest_middleware::ClientBuilder;
use tower::{service_fn, Layer, ServiceExt};
use tower_allowance::{
    classify::{Classification, Classified, StatusClassifier},
    retry::RetryConfig,
    Allowance, AllowanceConfig, BoxError, Outcome,
};
use tower_allowance_reqwest::{outcome, AllowanceMiddleware};

/// GitHub's secondary limit, as the tower layer's service answers it and as the server's
/// bytes say it.
const HEADERS: [(&str, &str); 2] = [("retry-after", "1"), ("x-ratelimit-remaining", "0")];

fn forbidden() -> Response<()> {
    let mut res = Response::new(());
    *res.status_mut() = StatusCode::FORBIDDEN;
    for (name, value) in HEADERS {
        res.headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    res
}

/// A server on loopback answering every request with that 403 (one request a connection).
fn serve_forbidden() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
    let addr = listener.local_addr().expect("bound");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let headers: String = HEADERS
                .iter()
                .map(|(n, v)| format!("{n}: {v}\r\n"))
                .collect();
            let _ = write!(
                stream,
                "HTTP/1.1 403 Forbidden\r\n{headers}content-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    format!("http://{addr}/")
}

fn class(extensions: &http::Extensions) -> Option<Classification> {
    extensions.get::<Classified>().map(|c| c.class)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_middleware_and_the_layer_on_one_allowance_read_a_403_alike() {
    // Set once: a 403 is throttling, one attempt a request.
    let config = AllowanceConfig::per_second(10, 10)
        .expect("valid")
        .with_classifier(StatusClassifier::default().throttled([403, 429]))
        .with_retry(RetryConfig::default().with_max_attempts(1).expect("valid"));
    let allowance = Allowance::new(config);

    // The tower layer, over a service answering the 403.
    let result = allowance
        .layer()
        .layer(service_fn(|_req: Request<()>| async {
            Ok::<_, BoxError>(forbidden())
        }))
        .oneshot(Request::new(()))
        .await;
    let by_layer = (
        Outcome::of(&result),
        result.ok().and_then(|r| class(r.extensions())),
    );
    assert_eq!(by_layer.1, Some(Classification::Throttled));
    assert_eq!(
        allowance.snapshot().deferred,
        1,
        "the 403 raised the cooldown"
    );

    // The middleware on the same allowance, against a server sending the same 403: it
    // waits out the layer's cooldown, then reads the answer the same way.
    let url = serve_forbidden();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(AllowanceMiddleware::new(allowance.clone()))
        .build();
    let result = client.get(&url).send().await;
    let by_middleware = (
        outcome(&result),
        result.ok().and_then(|r| class(r.extensions())),
    );
    assert_eq!(by_middleware, by_layer);
    assert!(matches!(by_layer.0, Outcome::Abandoned(_)), "{by_layer:?}");
    assert_eq!(
        allowance.snapshot().deferred,
        2,
        "the middleware's 403 raised the shared cooldown too"
    );

    // An override stays with its middleware: a plain failure there, no cooldown raised.
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            AllowanceMiddleware::new(allowance.clone())
                .with_classifier(StatusClassifier::default()),
        )
        .build();
    let result = client.get(&url).send().await;
    assert_eq!(
        outcome(&result),
        Outcome::Unsuccessful(StatusCode::FORBIDDEN)
    );
    assert_eq!(
        result.ok().and_then(|r| class(r.extensions())),
        Some(Classification::Failure)
    );
    assert_eq!(allowance.snapshot().deferred, 2);
}
