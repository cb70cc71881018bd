//! The tonic setup of the repository's `docs/clients.md`, as written there, and built with
//! exactly the features the guide lists (`features = ["grpc", "tonic"]`, the default ones
//! kept): `grpc` for `GrpcLayer`, `tonic` for a `Channel`'s request body.
//!
//! ```text
//! cargo run -p tower-allowance --example tonic_channel --features grpc,tonic
//! ```
//!
//! It connects to a gRPC server on `[::1]:50051` and waits until the stack is ready; the
//! runnable demonstration against a throttling server is the repository's
//! `examples/tonic_grpc.rs`.

use http::Method;
use tonic::{body::Body, client::GrpcService, transport::Channel};
use tower::ServiceBuilder;
use tower_allowance::{grpc::GrpcLayer, retry::RetryConfig, Allowance, AllowanceConfig, BoxError};

/// What `tonic-build` generates for `service Quotes`, down to what this example calls.
struct QuotesClient<T> {
    inner: tonic::client::Grpc<T>,
}

impl<T: GrpcService<Body>> QuotesClient<T> {
    fn new(inner: T) -> Self {
        Self {
            inner: tonic::client::Grpc::new(inner),
        }
    }

    async fn ready(&mut self) -> Result<(), BoxError>
    where
        T::Error: Into<BoxError>,
    {
        self.inner.ready().await.map_err(Into::into)
    }
}

/// The guide's snippet, then the client made ready.
async fn connect() -> Result<(), BoxError> {
    // From docs/clients.md, "tonic":
    let allowance = Allowance::new(AllowanceConfig::per_second(2, 2)?);
    let retry = RetryConfig::default().with_replayable_methods([Method::POST]);
    let channel = Channel::from_static("http://[::1]:50051").connect().await?;
    let channel = ServiceBuilder::new()
        .layer(GrpcLayer::new(allowance).with_retry(retry))
        .service(channel);
    // Generated clients take it as their transport:
    let mut client = QuotesClient::new(channel);

    client.ready().await
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    match connect().await {
        Ok(()) => println!("connected: calls to [::1]:50051 share one allowance"),
        Err(e) => {
            eprintln!("no gRPC server on [::1]:50051 ({e}): the stack is built as the guide shows")
        }
    }
}
