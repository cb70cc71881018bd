//! What a keyed layer adds to a service's errors.

use std::fmt;

use crate::BoxError;

/// Why a [`Keyed`](super::Keyed) registry could not give a request its allowance.
///
/// `Display` says which; a factory's error is the [`source()`](std::error::Error::source).
#[derive(Debug)]
#[non_exhaustive]
pub enum KeyedError {
    /// The request carries no key (for instance no `X-API-Key` header).
    NoKey,
    /// Every allowance in the registry is in use or not yet safe to evict.
    Full(RegistryFull),
    /// The store factory failed for this key.
    Store(BoxError),
}

impl KeyedError {
    pub(crate) fn store(e: BoxError) -> Self {
        Self::Store(e)
    }
}

impl fmt::Display for KeyedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoKey => f.write_str("request carries no allowance key"),
            Self::Full(full) => full.fmt(f),
            Self::Store(_) => f.write_str("could not make the store of a key's allowance"),
        }
    }
}

impl std::error::Error for KeyedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Store(e) => Some(&**e),
            _ => None,
        }
    }
}

/// The registry holds `capacity` allowances, none of which can be evicted without letting more
/// through than keeping it would (requests in flight, a cooldown, buckets not yet refilled, a
/// spent fixed retry budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistryFull {
    capacity: usize,
}

impl RegistryFull {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { capacity }
    }

    /// The registry's capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl fmt::Display for RegistryFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "keyed allowance registry full: {} allowances, none safe to evict",
            self.capacity
        )
    }
}

impl std::error::Error for RegistryFull {}
