//! Secrets stay secret: API keys and bearer tokens on requests never reach `Debug` output,
//! tracing events or error messages of the layers.

use std::{
    convert::Infallible,
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{Method, Request, Response, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_allowance::{Allowance, AllowanceConfig, Deadline, RetryBudgetConfig};

const KEY: &str = "sk-live-SECRET-4242";
const TOKEN: &str = "Bearer tok-SECRET-9999";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn request(method: Method) -> Request<String> {
    let mut req = Request::builder()
        .method(method)
        .uri("https://api.example/v1/events/1/odds/snapshot")
        .header("x-api-key", KEY)
        .header("authorization", TOKEN)
        .body(String::from("{}"))
        .expect("request");
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(5)));
    req
}

#[tokio::test(start_paused = true)]
async fn no_secret_in_tracing_debug_or_errors() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let allowance = Allowance::new(
        AllowanceConfig::per_second(2, 1)
            .expect("valid")
            .with_retry_budget(RetryBudgetConfig::fixed(1))
            .with_max_waiters(1),
    );
    let svc = ServiceBuilder::new().layer(allowance.layer()).service_fn(
        |req: Request<String>| async move {
            let mut res = Response::new(String::new());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            // Throttle with several kinds of delay, including absurd ones.
            let ra = match req.method().as_str() {
                "GET" => "2",
                "PUT" => "999999999999999999999",
                _ => "later",
            };
            res.headers_mut()
                .insert("retry-after", ra.parse().expect("header"));
            Ok::<_, Infallible>(res)
        },
    );

    let mut texts = vec![format!("{svc:?}"), format!("{allowance:?}")];
    let calls = [
        Method::GET,
        Method::PUT,
        Method::POST,
        Method::GET,
        Method::DELETE,
    ];
    let futures: Vec<_> = calls
        .into_iter()
        .map(|m| svc.clone().oneshot(request(m)))
        .collect();
    for result in futures::future::join_all(futures).await {
        match result {
            Ok(res) => texts.push(format!("{res:?}")),
            Err(e) => {
                texts.push(e.to_string());
                texts.push(format!("{e:?}"));
            }
        }
    }
    texts.push(format!("{:?}", allowance.snapshot()));
    let log = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
    assert!(
        log.contains("abandoned") || log.contains("cooldown"),
        "tracing was captured: {log}"
    );
    texts.push(log);
    for text in &texts {
        assert!(!text.contains("SECRET"), "a secret leaked: {text}");
    }
}
