//! Shares of one allowance (feature `shares`): classes of callers on one key, each with a
//! weight and optionally a strict priority.
//!
//! A request names its class with the [`Class`] extension (or a layer sets it:
//! [`AllowanceLayer::class`]); a request without one belongs to the [`Class::DEFAULT`] class
//! (weight 1 unless configured). The allowance knows the classes from its configuration
//! ([`AllowanceConfig::with_class`], or `classes` in a config file). While several classes
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
    sync::Arc,
    task::{Context, Poll},
};

use http::Request;
use tower_layer::Layer;
use tower_service::Service;

pub use crate::shared::classes::ClassSnapshot;
use crate::{
    allowance::AllowanceBuilder, rule::MAX_CLASSES, AllowanceConfig, AllowanceLayer, ConfigError,
};

/// The class a request belongs to: a request extension.
///
/// ```
/// use tower_allowance::shares::Class;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(Class::new("bulk"));
/// assert_eq!(Class::of(req.extensions()).map(Class::name), Some("bulk"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Class(Arc<str>);

impl Class {
    /// The class of a request that names none.
    pub const DEFAULT: &'static str = "default";

    /// The class named `name`.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Its key: a hash of the name (copied into an admission's options).
    pub(crate) fn key(&self) -> ClassKey {
        ClassKey::of(&self.0)
    }

    /// The class a request's extensions name, if any.
    pub fn of(extensions: &http::Extensions) -> Option<&Self> {
        extensions.get::<Self>()
    }
}

/// A class's name as a 64-bit FNV-1a hash: what an admission's options carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClassKey(u64);

impl ClassKey {
    fn of(name: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Self(h)
    }
}

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

/// How a class shares the allowance: its weight and whether it has strict priority.
///
/// In a config file: `classes = { live = { weight = 1, high = true }, bulk = { weight = 3 } }`.
///
/// ```
/// use tower_allowance::shares::Share;
///
/// let live = Share::weight(2)?.high();
/// assert_eq!((live.weight_of(), live.is_high()), (2, true));
/// assert!(Share::weight(0).is_err());
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "RawShare"))]
pub struct Share {
    weight: u32,
    high: bool,
}

/// The most a weight can be.
const MAX_WEIGHT: u32 = 1_000;

impl Share {
    /// A class of weight `weight` (1 to 1000).
    ///
    /// # Errors
    ///
    /// A weight of zero or above 1000.
    pub fn weight(weight: u32) -> Result<Self, ConfigError> {
        if weight == 0 || weight > MAX_WEIGHT {
            return Err(ConfigError::new("a class's weight must be 1 to 1000"));
        }
        Ok(Self {
            weight,
            high: false,
        })
    }

    /// With strict priority: admitted ahead of every waiting lower-priority caller, within its
    /// lead.
    pub fn high(mut self) -> Self {
        self.high = true;
        self
    }

    /// The weight.
    pub fn weight_of(&self) -> u32 {
        self.weight
    }

    /// Whether it has strict priority.
    pub fn is_high(&self) -> bool {
        self.high
    }
}

impl Default for Share {
    fn default() -> Self {
        Self {
            weight: 1,
            high: false,
        }
    }
}

#[cfg(feature = "serde")]
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShare {
    weight: u32,
    #[serde(default)]
    high: bool,
}

#[cfg(feature = "serde")]
impl TryFrom<RawShare> for Share {
    type Error = ConfigError;

    fn try_from(raw: RawShare) -> Result<Self, ConfigError> {
        let share = Self::weight(raw.weight)?;
        Ok(if raw.high { share.high() } else { share })
    }
}

/// An allowance's classes, sorted by name, so every process numbers them alike; the
/// default class is among them once any class is configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Classes(Vec<(Arc<str>, Share)>);

impl Classes {
    pub(crate) fn with(mut self, name: &str, share: Share) -> Result<Self, ConfigError> {
        if self.0.is_empty() {
            self.0.push((Arc::from(Class::DEFAULT), Share::default()));
        }
        match self.0.binary_search_by(|(n, _)| (**n).cmp(name)) {
            Ok(i) => self.0[i].1 = share,
            Err(_) if self.0.len() >= MAX_CLASSES => {
                return Err(ConfigError::new(
                    "at most 8 classes, the default one included",
                ))
            }
            Err(i) => self.0.insert(i, (Arc::from(name), share)),
        }
        Ok(self)
    }

    /// Whether any class is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A request's class: its index, name and share (an unknown name: the default class).
    pub(crate) fn find(&self, class: Option<ClassKey>) -> Option<(u8, &Arc<str>, Share)> {
        let key = class.unwrap_or_else(|| ClassKey::of(Class::DEFAULT));
        let i = (self.0.iter().position(|(n, _)| ClassKey::of(n) == key))
            .or_else(|| self.0.iter().position(|(n, _)| &**n == Class::DEFAULT))?;
        let (name, share) = self.0.get(i)?;
        Some((u8::try_from(i).ok()?, name, *share))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Arc<str>, Share)> {
        self.0.iter().map(|(n, s)| (n, *s))
    }
}

impl AllowanceConfig {
    /// Adds class `name` (or changes it) with its share of the allowance (feature `shares`).
    ///
    /// ```
    /// use tower_allowance::{shares::Share, AllowanceConfig};
    ///
    /// let config = AllowanceConfig::per_second(20, 4)?.with_class("bulk", Share::weight(1)?)?;
    /// # Ok::<(), tower_allowance::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// More than 8 classes, the default one included.
    pub fn with_class(mut self, name: &str, share: Share) -> Result<Self, ConfigError> {
        self.classes = std::mem::take(&mut self.classes).with(name, share)?;
        Ok(self)
    }
}

impl AllowanceBuilder {
    /// [`AllowanceConfig::with_class`] on the builder's configuration.
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
    /// As [`AllowanceConfig::with_class`].
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

impl<S: Service<Request<B>>, B> Service<Request<B>> for SetClass<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if req.extensions().get::<Class>().is_none() {
            req.extensions_mut().insert(self.class.clone());
        }
        self.inner.call(req)
    }
}
