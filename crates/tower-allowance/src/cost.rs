//! Charge each request what it costs: a layer that sets the [`Cost`] extension from the request.
//!
//! An allowance with a limit counted in cost ([`Limit::counting_cost`](crate::Limit::counting_cost),
//! such as an LLM API's tokens per minute) charges each request its [`Cost`] extension. Set it
//! by hand, or put a [`CostLayer`] above the [`AllowanceLayer`](crate::AllowanceLayer) (or a
//! `keyed::KeyedLayer` (feature `keyed`)) to compute it from every request: a header, the
//! body's length, or any function.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{cost::CostLayer, Allowance, AllowanceConfig, AllowanceLayer, Limit};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! // An LLM API's shape: 500 requests/min and 30,000 tokens/min, both at once.
//! let config = AllowanceConfig::per_minute(500, 500)?
//!     .with_limit(Limit::per_minute(30_000, 30_000)?.counting_cost())?;
//! let allowance = Allowance::new(config);
//! let client = ServiceBuilder::new()
//!     // The caller says how many tokens a request may use (prompt + max output).
//!     .layer(CostLayer::from_header(http::HeaderName::from_static("x-token-estimate")))
//!     .layer(allowance.layer())
//!     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new("ok")) });
//!
//! let request = Request::builder().header("x-token-estimate", "1200").body(String::new())?;
//! client.oneshot(request).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Where the cost is charged
//!
//! The cost travels with the request to the admission layer, which charges it to every limit
//! counted in cost, and one unit to every limit counted in requests, in one atomic step of the
//! store (one compare-and-swap or lock in memory, one script call in Redis): no limit is
//! charged when another cannot admit in time. A retry is charged its cost again. A cost that
//! exceeds some limit's burst can never fit and fails at once with
//! [`AbandonReason::TooCostly`](crate::error::AbandonReason::TooCostly), spending nothing.
//!
//! # FIFO with mixed costs
//!
//! Admission stays first come, first served whatever the costs: a request is given the earliest
//! slot at which every limit admits it *after the requests before it*, so a heavy request at
//! the head of the queue is never overtaken by light ones arriving after it, and nothing
//! starves (every request's slot is fixed when it arrives and only a server's cooldown moves
//! it). The price is head-of-line blocking: while a heavy request waits for enough tokens to
//! accrue, light ones that would fit in the tokens already there wait behind it. That is the
//! trade-off a strict limiter has to make (letting light requests pass can postpone a heavy
//! one indefinitely); keep costs honest (an estimate close to the real use) and bursts large
//! enough for the heaviest request to keep the wait short.

use std::{
    fmt,
    num::NonZeroU32,
    task::{Context, Poll},
};

use http::{HeaderName, Request};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use crate::Cost;

#[cfg(feature = "settle")]
pub mod settle;

/// How a [`CostLayer`] computes a request's cost.
///
/// Implemented for functions `Fn(&Request<B>) -> u32`, [`FromHeader`] and [`FromBodySize`].
/// `None` leaves the request's [`Cost`] as it was (1 unless something set it).
pub trait CostFn<B> {
    /// The request's cost, or `None` to leave it unchanged.
    fn cost(&self, request: &Request<B>) -> Option<u32>;
}

impl<B, F> CostFn<B> for F
where
    F: Fn(&Request<B>) -> u32,
{
    fn cost(&self, request: &Request<B>) -> Option<u32> {
        Some(self(request))
    }
}

/// The cost is a header's value, a decimal integer (see [`CostLayer::from_header`]).
///
/// A request without the header, or whose value is not a number that fits in a `u32`, keeps
/// its cost (1 unless set).
#[derive(Clone, Debug)]
pub struct FromHeader {
    name: HeaderName,
}

impl<B> CostFn<B> for FromHeader {
    fn cost(&self, request: &Request<B>) -> Option<u32> {
        let value = request.headers().get(&self.name)?;
        value.to_str().ok()?.trim().parse().ok()
    }
}

/// The cost is the body's length in units of `bytes_per_unit`, rounded up (see
/// [`CostLayer::from_body_size`]).
///
/// Read from the body's size hint: the exact length when known, else the upper bound; a body
/// of unknown length keeps its cost (1 unless set). Lengths beyond `u32::MAX` units cost
/// `u32::MAX`.
#[derive(Clone, Copy, Debug)]
pub struct FromBodySize {
    bytes_per_unit: NonZeroU32,
}

impl<B: Body> CostFn<B> for FromBodySize {
    fn cost(&self, request: &Request<B>) -> Option<u32> {
        let hint = request.body().size_hint();
        let len = hint.exact().or_else(|| hint.upper())?;
        let units = len.div_ceil(u64::from(self.bytes_per_unit.get()));
        Some(u32::try_from(units).unwrap_or(u32::MAX))
    }
}

/// Sets each request's [`Cost`] extension from the request, for the admission layer below
/// to charge (see the [module docs](self)).
///
/// # Clone
///
/// Cloning the layer clones the cost function (cheap for the provided ones); it holds no
/// allowance state.
#[derive(Clone)]
pub struct CostLayer<F> {
    cost: F,
}

impl<F> fmt::Debug for CostLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostLayer")
            .field("cost", &std::any::type_name::<F>())
            .finish()
    }
}

// === impl CostLayer ===

impl<F> CostLayer<F> {
    /// Costs computed by `cost`: a function `Fn(&Request<B>) -> u32`, or any [`CostFn`].
    ///
    /// ```
    /// use http::Request;
    /// use tower_allowance::cost::CostLayer;
    ///
    /// // GETs cost 1, everything else 10.
    /// let layer = CostLayer::new(|req: &Request<String>| if req.method() == http::Method::GET { 1 } else { 10 });
    /// # let _ = layer;
    /// ```
    pub fn new(cost: F) -> Self {
        Self { cost }
    }
}

impl CostLayer<FromHeader> {
    /// The cost is the value of the header `name` (a decimal integer); see [`FromHeader`].
    pub fn from_header(name: HeaderName) -> Self {
        Self::new(FromHeader { name })
    }
}

impl CostLayer<FromBodySize> {
    /// The cost is the body's length divided by `bytes_per_unit`, rounded up (for instance
    /// about 4 bytes per token for English text); see [`FromBodySize`].
    pub fn from_body_size(bytes_per_unit: NonZeroU32) -> Self {
        Self::new(FromBodySize { bytes_per_unit })
    }
}

impl<S, F: Clone> Layer<S> for CostLayer<F> {
    type Service = CostService<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        CostService {
            inner,
            cost: self.cost.clone(),
        }
    }
}

/// The service [`CostLayer`] builds: sets [`Cost`], then calls the inner service.
///
/// # Clone
///
/// Clones the inner service and the cost function.
#[derive(Clone)]
pub struct CostService<S, F> {
    inner: S,
    cost: F,
}

impl<S: fmt::Debug, F> fmt::Debug for CostService<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostService")
            .field("inner", &self.inner)
            .field("cost", &std::any::type_name::<F>())
            .finish()
    }
}

// === impl CostService ===

impl<S, F> CostService<S, F> {
    /// Wraps `inner`, costing requests with `cost`.
    pub fn new(inner: S, cost: F) -> Self {
        Self { inner, cost }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, F, B> Service<Request<B>> for CostService<S, F>
where
    S: Service<Request<B>>,
    F: CostFn<B>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(cost) = self.cost.cost(&req) {
            req.extensions_mut().insert(Cost(cost));
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http::Response;
    use http_body_util::{Empty, Full};
    use tower::{service_fn, ServiceExt};

    use super::*;

    /// The cost the inner service saw (0 when none was set).
    async fn seen<B, F>(layer: CostLayer<F>, req: Request<B>) -> u32
    where
        F: CostFn<B> + Clone,
    {
        let svc = layer.layer(service_fn(|req: Request<B>| async move {
            let cost = req.extensions().get::<Cost>().map_or(0, |c| c.0);
            Ok::<_, Infallible>(Response::new(cost))
        }));
        match svc.oneshot(req).await {
            Ok(res) => res.into_body(),
            Err(e) => match e {},
        }
    }

    fn with_header(value: &str) -> Request<()> {
        let mut req = Request::new(());
        if let Ok(v) = http::HeaderValue::from_str(value) {
            req.headers_mut().insert("x-cost", v);
        }
        req
    }

    #[tokio::test]
    async fn header_sets_the_cost_and_bad_values_leave_it() {
        let layer = || CostLayer::from_header(HeaderName::from_static("x-cost"));
        assert_eq!(seen(layer(), with_header("1200")).await, 1_200);
        assert_eq!(seen(layer(), with_header(" 7 ")).await, 7);
        assert_eq!(seen(layer(), with_header("-3")).await, 0);
        assert_eq!(seen(layer(), with_header("99999999999")).await, 0);
        assert_eq!(seen(layer(), Request::new(())).await, 0);
        // A cost set by hand stays when the header is missing.
        let mut req = Request::new(());
        req.extensions_mut().insert(Cost(5));
        assert_eq!(seen(layer(), req).await, 5);
    }

    #[tokio::test]
    async fn body_size_rounds_up_and_unknown_lengths_keep_the_cost() {
        let per4 = || CostLayer::from_body_size(NonZeroU32::MIN.saturating_add(3));
        let body = Full::new(Bytes::from_static(b"0123456789"));
        assert_eq!(seen(per4(), Request::new(body)).await, 3);
        fn preset<B>(body: B) -> Request<B> {
            let mut req = Request::new(body);
            req.extensions_mut().insert(Cost(5));
            req
        }
        assert_eq!(seen(per4(), preset(Empty::<Bytes>::new())).await, 0);
        let stream = http_body_util::StreamBody::new(futures_util::stream::iter(Vec::<
            Result<http_body::Frame<Bytes>, Infallible>,
        >::new()));
        assert_eq!(seen(per4(), preset(stream)).await, 5, "unknown length");
    }

    #[tokio::test]
    async fn a_function_sets_the_cost() {
        let layer = CostLayer::new(|req: &Request<()>| req.uri().path().len() as u32);
        let req = Request::get("/abcd").body(()).expect("request");
        assert_eq!(seen(layer.clone(), req).await, 5);
        assert!(format!("{layer:?}").contains("CostLayer"));
    }
}
