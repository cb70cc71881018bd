//! Classes of callers (feature `shares`): a request's [`Class`], a class's [`Share`], and an
//! allowance's classes; re-exported by `tower_allowance::shares`.

use std::sync::Arc;

use crate::{
    rule::{ClassKey, MAX_CLASSES},
    AllowanceConfig, ConfigError,
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

    /// The key of the class a request's extensions name, if any.
    pub(crate) fn key_of(extensions: &http::Extensions) -> Option<ClassKey> {
        extensions.get::<Self>().map(Self::key)
    }

    /// The class a request's extensions name, if any.
    pub fn of(extensions: &http::Extensions) -> Option<&Self> {
        extensions.get::<Self>()
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

/// A config file's `classes` table, added to `config`.
#[cfg(feature = "serde")]
pub(crate) fn with_classes(
    mut config: AllowanceConfig,
    classes: std::collections::BTreeMap<String, Share>,
) -> Result<AllowanceConfig, ConfigError> {
    for (name, share) in classes {
        config = config
            .with_class(&name, share)
            .map_err(|e| e.at("classes"))?;
    }
    Ok(config)
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
