//! Shares of one allowance (feature `shares`): classes of callers on one key, each with a
//! weight and optionally a strict priority.
//!
//! A request names its class with the [`Class`] extension (or a layer sets it:
//! [`AllowanceLayer::class`]); a request without one belongs to the [`Class::DEFAULT`] class
//! (weight 1 unless configured). The allowance knows the classes from its configuration
//! ([`AllowanceConfig::with_class`](crate::AllowanceConfig::with_class), or `classes` in a config file). While several classes
//! wait, admissions go to them in proportion to their weights (weighted fair queueing by
//! virtual finish times kept next to the bucket, in the same store call); a class with nothing
//! waiting lends its share at once and gets it back at its next request; inside a class,
//! first come first served. A **high** class's request waits at most about one interval (the
//! slot being served) whatever the backlog, while the class stays within its lead
//! (8 admissions ahead of its weighted share: the bound on the
//! others' starvation). The share decides who gets the next slot, never how many slots there
//! are. See the guide's "one key, several kinds of traffic".
//!
//! ```
//! use tower_allowance::{shares::{Class, Share}, Allowance, AllowanceConfig};
//!
//! let config = AllowanceConfig::per_second(20, 4)?
//!     .with_class("live", Share::weight(1)?.high())?
//!     .with_class("prematch", Share::weight(3)?)?;
//! let allowance = Allowance::new(config);
//! // Every request through this layer is "prematch" unless it names its class.
//! let _layer = allowance.layer().class("prematch");
//! let mut req = http::Request::new(());
//! req.extensions_mut().insert(Class::new("live"));
//! # Ok::<(), tower_allowance::ConfigError>(())
//! ```

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

pub use crate::config::classes::{Class, Share};
pub use crate::shared::classes::ClassSnapshot;
use crate::{allowance::AllowanceBuilder, AllowanceLayer, ConfigError};

impl crate::AcquireOptions {
    /// This admission belongs to `class` (feature `shares`; default: the default class).
    ///
    /// ```
    /// use tower_allowance::{shares::Class, AcquireOptions};
    ///
    /// let options = AcquireOptions::new().class(&Class::new("bulk"));
    /// ```
    pub fn class(mut self, class: &Class) -> Self {
        self.class = Some(class.key());
        self
    }
}

impl AllowanceBuilder {
    /// [`AllowanceConfig::with_class`](crate::AllowanceConfig::with_class) on the builder's configuration.
    ///
    /// ```
    /// use tower_allowance::{shares::Share, Allowance, AllowanceConfig};
    ///
    /// let allowance = Allowance::builder(AllowanceConfig::per_second(20, 4)?)
    ///     .with_class("live", Share::weight(1)?.high())?
    ///     .build();
    /// # Ok::<(), tower_allowance::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`AllowanceConfig::with_class`](crate::AllowanceConfig::with_class).
    pub fn with_class(mut self, name: &str, share: Share) -> Result<Self, ConfigError> {
        self.config = self.config.with_class(name, share)?;
        Ok(self)
    }
}

impl<C> AllowanceLayer<C> {
    /// Puts every request that names no [`Class`] in class `name`.
    ///
    /// ```
    /// use tower_allowance::{Allowance, AllowanceConfig};
    ///
    /// let layer = Allowance::new(AllowanceConfig::per_second(5, 1)?).layer().class("bulk");
    /// # Ok::<(), tower_allowance::ConfigError>(())
    /// ```
    pub fn class(self, name: impl Into<Arc<str>>) -> ClassLayer<Self> {
        ClassLayer::new(name, self)
    }
}

/// A layer that puts requests naming no [`Class`] in one class, around an inner layer
/// ([`AllowanceLayer::class`]), or alone (`ClassLayer::new(name, tower::layer::util::Identity::new())`).
#[derive(Clone)]
pub struct ClassLayer<L> {
    class: Class,
    inner: L,
}

impl<L> ClassLayer<L> {
    /// Class `name` for requests naming none, then `inner`.
    pub fn new(name: impl Into<Arc<str>>, inner: L) -> Self {
        Self {
            class: Class::new(name),
            inner,
        }
    }
}

impl<L> fmt::Debug for ClassLayer<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassLayer")
            .field("class", &self.class)
            .finish_non_exhaustive()
    }
}

impl<S, L: Layer<S>> Layer<S> for ClassLayer<L> {
    type Service = SetClass<L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        SetClass {
            class: self.class.clone(),
            inner: self.inner.layer(inner),
        }
    }
}

/// The service of [`ClassLayer`]: inserts its class into requests that name none.
#[derive(Clone)]
pub struct SetClass<S> {
    class: Class,
    inner: S,
}

impl<S> fmt::Debug for SetClass<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetClass")
            .field("class", &self.class)
            .finish_non_exhaustive()
    }
}

impl<S, B, R> Service<Request<B>> for SetClass<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Classed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let class = match req.extensions().get::<Class>() {
            Some(class) => class.clone(),
            None => {
                req.extensions_mut().insert(self.class.clone());
                self.class.clone()
            }
        };
        Classed {
            future: self.inner.call(req),
            class: Some(class),
        }
    }
}

pin_project! {
    /// The future of [`SetClass`]: the answer names the request's class (a [`Class`] in the
    /// response's extensions, beside its [`Attempt`](crate::Attempt) record).
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use tower_allowance::shares::{Class, ClassLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = ClassLayer::new("bulk", tower::layer::util::Identity::new());
    /// let service = layer.layer(service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(()))
    /// }));
    /// let response = service.oneshot(http::Request::new(())).await.expect("the inner service never fails");
    /// assert_eq!(response.extensions().get::<Class>(), Some(&Class::new("bulk")));
    /// # }
    /// ```
    pub struct Classed<F> {
        #[pin]
        future: F,
        class: Option<Class>,
    }
}

impl<F> fmt::Debug for Classed<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classed")
            .field("class", &self.class)
            .finish_non_exhaustive()
    }
}

impl<F, R, E> Future for Classed<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut result = ready!(this.future.poll(cx));
        if let (Ok(response), Some(class)) = (&mut result, this.class.take()) {
            response.extensions_mut().insert(class);
        }
        Poll::Ready(result)
    }
}
