//! Reserve, then settle through reqwest (feature `settle`): each attempt's response is settled
//! to the usage its body reports, read as the caller reads the body (never taken from it).

use std::{convert::Infallible, future::Future, pin::Pin, sync::Arc};

use http::Extensions;
use reqwest::ResponseBuilderExt as _;
use tower::{Layer, ServiceExt};
use tower_allowance::{
    classify::Classify,
    cost::settle::{SettleLayer, UsageReader},
    Allowance,
};

use crate::AllowanceMiddleware;

/// Wraps one attempt's response so that it settles (object-safe over the reader's type).
pub(crate) trait Settler: Send + Sync {
    fn settle(
        &self,
        attempt: &Extensions,
        response: reqwest::Response,
    ) -> Pin<Box<dyn Future<Output = reqwest::Response> + Send>>;
}

impl<R: UsageReader> Settler for SettleLayer<R> {
    fn settle(
        &self,
        attempt: &Extensions,
        response: reqwest::Response,
    ) -> Pin<Box<dyn Future<Output = reqwest::Response> + Send>> {
        // The attempt's reservation: its `Cost`, as the admission charged it.
        let mut request = http::Request::new(());
        if let Some(cost) = attempt.get::<tower_allowance::Cost>() {
            request.extensions_mut().insert(*cost);
        }
        let url = response.url().clone();
        let answer: http::Response<reqwest::Body> = response.into();
        // Called once (`oneshot`); a second call would get an empty answer.
        let mut answer = Some(answer);
        let svc = self.layer(tower::service_fn(move |_: http::Request<()>| {
            let once = answer
                .take()
                .unwrap_or_else(|| http::Response::new(reqwest::Body::from(Vec::new())));
            std::future::ready(Ok::<_, Infallible>(once))
        }));
        Box::pin(async move {
            let Ok(settling) = svc.oneshot(request).await;
            let (parts, body) = settling.into_parts();
            // Back to a reqwest response, with its URL (the conversion alone would lose it).
            let mut response = http::Response::builder()
                .url(url)
                .body(reqwest::Body::wrap(body))
                .unwrap_or_default();
            *response.status_mut() = parts.status;
            *response.version_mut() = parts.version;
            *response.headers_mut() = parts.headers;
            response.extensions_mut().extend(parts.extensions);
            reqwest::Response::from(response)
        })
    }
}

impl<C: Classify> AllowanceMiddleware<C> {
    /// Settles every attempt to the usage its answer reports, read by `reader` from the body
    /// as the caller reads it ([`tower_allowance::cost::settle`]; the allowance needs
    /// `AllowanceConfig::with_settlement`). Each request's reservation is its
    /// [`Cost`](tower_allowance::Cost) (`RequestBuilder::with_extension`).
    ///
    /// ```no_run
    /// use reqwest_middleware::ClientBuilder;
    /// use tower_allowance::{cost::settle::{OpenAiUsage, Settlement}, Allowance, AllowanceConfig, Cost, Limit};
    /// use tower_allowance_reqwest::AllowanceMiddleware;
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let config = AllowanceConfig::per_minute(500, 500)?
    ///     .with_limit(Limit::per_minute(30_000, 30_000)?.exact().counting_cost())?
    ///     .with_settlement(Settlement::learned());
    /// let allowance = Allowance::new(config);
    /// let client = ClientBuilder::new(reqwest::Client::new())
    ///     .with(AllowanceMiddleware::new(allowance.clone()).with_settlement(&allowance, OpenAiUsage::new()))
    ///     .build();
    /// let answer = client
    ///     .post("http://127.0.0.1:8080/v1/chat/completions")
    ///     .body(r#"{"prompt_tokens": 200, "max_tokens": 1000}"#)
    ///     .with_extension(Cost(1_200))
    ///     .send()
    ///     .await?;
    /// // Reading the body to its end settles the reservation to the usage it reports.
    /// println!("{}", answer.text().await?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_settlement<R: UsageReader>(self, allowance: &Allowance, reader: R) -> Self {
        Self {
            settle: Some(Arc::new(SettleLayer::new(allowance, reader))),
            ..self
        }
    }
}
